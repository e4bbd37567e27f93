public import FoundationEssentials
public import KioskAuthFingerprint

#if canImport(Glibc)
    import Glibc
#endif

/// The daemon's configuration: `kioskauthd.conf` plus drop-ins, systemd-style INI
/// (`[Section]`, `Key=value`, `#`/`;` comments). Every key has an embedded default, so the
/// daemon runs with no file at all. The README and kioskauthd.conf(5) list every key.
public struct DaemonConfiguration: Sendable {
    /// Limits of the socket API.
    public struct Socket: Sendable {
        /// Connections open at once, in total.
        public var maxConnections = 128
        /// Connections open at once from one uid (root is exempt).
        public var maxConnectionsPerUID = 16
        /// Of `maxConnections`, how many (at most half) only privileged callers (root, the admin and
        /// authenticator groups) may use: unprivileged callers together get the rest.
        public var reservedConnections = DaemonConfiguration.Socket.defaultReservedConnections
        /// The default of `reservedConnections`.
        public static let defaultReservedConnections = 32
        /// Calls per second one unprivileged uid may make, over all its connections (a token
        /// bucket holding one second's worth); privileged callers are exempt.
        public var requestsPerSecondPerUID = DaemonConfiguration.Socket.defaultRequestsPerSecondPerUID
        /// The default of `requestsPerSecondPerUID`.
        public static let defaultRequestsPerSecondPerUID = 20
        /// A connection whose replies have not been read (its output stays over the high-water
        /// mark) for this long, or for the idle timeout if that is shorter, is closed.
        public var writeTimeout: TimeInterval = 10
        /// Bytes of replies queued for a client that does not read, beyond what the kernel holds,
        /// before the connection stops reading further calls.
        public static let outputHighWaterMark = 64 * 1024
        /// Largest request in bytes.
        public var maxMessageSize = 64 * 1024
        /// A connection with no call in progress is closed after this long.
        public var idleTimeout: TimeInterval = 60
    }

    /// Who may ask what.
    public struct Access: Sendable {
        /// Members may call admin methods.
        public var adminGroup = "kioskauth-admin"
        /// Members may authenticate anyone and run walk-up identify.
        public var authenticatorGroup = "kioskauth"
        /// PAM services from which passcodes are accepted.
        public var passcodeServices: Set<String> = [
            "kioskauth", "gdm-password", "gdm-fingerprint", "lightdm", "lightdm-greeter", "sddm", "sddm-greeter",
            "greetd", "login", "xscreensaver", "gnome-screensaver", "kde", "kscreensaver", "swaylock", "i3lock",
            "xlock", "cinnamon-screensaver", "mate-screensaver", "xfce4-screensaver", "light-locker",
        ]
        /// PAM services that act for another user: passcodes only for the invoking user.
        public var switchUserServices: Set<String> = [
            "su", "su-l", "sudo", "sudo-i", "runuser", "runuser-l", "pkexec", "polkit-1", "doas", "passwd", "chpasswd",
        ]
        /// Lifetime of a self-service ticket.
        public var ticketLifetime: TimeInterval = 120
        /// Refusals of unprivileged callers (and their rate-limited calls) are audited as one
        /// summary entry per uid per interval of this length, with a count.
        public var refusalSummaryInterval: TimeInterval = 60
    }

    /// The sealed store.
    public struct Store: Sendable {
        /// Allow a key file in the state directory instead of a systemd credential.
        public var developmentKeyFile = false
        /// Argon2id memory in KiB for new passcodes.
        public var passcodeHashMemoryKiB = 64 * 1024
        /// Argon2id passes for new passcodes.
        public var passcodeHashIterations = 3
        /// Argon2id lanes for new passcodes.
        public var passcodeHashParallelism = 1
        /// Whether Argon2id's working memory asks for transparent huge pages.
        public var passcodeHashHugePages = true
        /// Seconds between full verifications of the audit chain while running (0: never). The
        /// check before serving covers only the entries after the sealed checkpoint (the anchored
        /// head); this one, like `audit verify`, recomputes the whole chain.
        public var auditVerifyInterval: TimeInterval = 86400
        /// Threads that run Argon2id (0: one fewer than the processors, at least one).
        public var passcodeHashWorkers = 0
        /// Hashes that may wait for a worker; beyond that a passcode call is refused (`Busy`).
        public var passcodeHashQueue = 16
        /// Nice steps a hash runs above the rest of the daemon (0: none), so that a flood of
        /// socket calls does not slow a passcode unlock down (`HashingPriority`).
        public var passcodeHashPriority = 10
    }

    /// Passcode rules and lockout.
    public struct Passcode: Sendable {
        public var minimumLength = 6
        public var maximumLength = 12
        /// Delay after the Nth consecutive failure, N = 1, 2, ...
        public var lockoutDelays: [TimeInterval] = [0, 0, 60, 300, 900, 1800, 1800, 1800, 1800]
        /// Consecutive failures that hard-lock the passcode.
        public var hardLockAfter = 10
    }

    /// Fingerprint policy.
    public struct Fingerprint: Sendable {
        /// Use fingerprint readers at all.
        public var enabled = true
        /// Consecutive failed matches before the fallback is required.
        public var failuresBeforeFallback = 3
        /// How long one touch may take.
        public var scanTimeout: TimeInterval = 30
        /// Walk-up identify tries at most this many fingers (most recent unlocks first).
        public var identifyRosterCap = 40
        /// How walk-up identify lays the roster out for the reader's match loop (image sensors).
        public var identifyLayout = IdentifyLayout.staged
        /// Unknown fingers in a row that pause walk-up identify.
        public var identifyPauseAfter = 5
        /// How long walk-up identify pauses.
        public var identifyPause: TimeInterval = 60
        /// Failed or unknown touches within `fingerFailureWindow` that pause matching even with
        /// matches between them.
        public var fingerFailuresInWindow = 10
        /// The sliding window for `fingerFailuresInWindow`.
        public var fingerFailureWindow: TimeInterval = 600
        /// People may enrol their own fingers (with a fresh authentication ticket).
        public var selfEnrollment = true
        /// Fingers one person may enrol.
        public var maxFingersPerPerson = 10
        /// Before enrolling, an identify touch over every enrolled print refuses a finger already
        /// enrolled to anyone (readers that can identify).
        public var duplicateCheck = true
    }

    /// Activation of pre-provisioned people.
    public struct Activation: Sendable {
        /// How long a code lives.
        public var codeLifetime: TimeInterval = 72 * 3600
        /// Wrong tries that kill one person's code.
        public var maxTries = 5
        /// Wrong codes on this terminal that pause activation ...
        public var terminalMaxFailures = 5
        /// ... within this window.
        public var terminalWindow: TimeInterval = 900
        /// What each role can do, shown when activation completes.
        public var roleDescriptions: [String: String] = [
            "caregiver": "You can unlock this terminal, see today's visits and record care notes.",
            "coordinator": "You can manage schedules, review care notes and help colleagues get set up.",
            "family": "You can see visit updates and messages about your family member.",
        ]
    }

    public var socket = Socket()
    public var activation = Activation()
    public var access = Access()
    public var store = Store()
    public var passcode = Passcode()
    public var fingerprint = Fingerprint()
    /// The identity provider (off unless `[IdentityProvider] Issuer` is set).
    public var identityProvider = IdentityProvider()
    /// Session rules.
    public var session = Session()
    /// Audit delivery (off unless `[AuditDelivery] Endpoint` is set).
    public var auditDelivery = AuditDelivery()
    /// The metrics textfile (off unless `[Metrics] TextfilePath` is set).
    public var metrics = Metrics()
    /// The fleet sync schedule (used only once the terminal is in a fleet).
    public var fleet = Fleet()
    /// Log level: trace, debug, info, notice, warning, error, critical.
    public var logLevel = "info"
    /// Seconds after a call last began or ended after which the daemon hands back the code pages
    /// and free memory it holds only because it once ran (once after start-up, too); 0: never,
    /// else at least 1 (`IdleRelease`).
    public var idleRelease: TimeInterval = 30

    public init() {}

    /// A configuration problem, with where it is.
    public struct ParseError: Error, CustomStringConvertible, Sendable {
        public var file: String
        public var line: Int
        public var message: String
        public var description: String { "\(file):\(line): \(message)" }
    }

    /// Loads `path` (absent is fine) and then `path.d/*.conf` in the byte order of their names
    /// (as systemd orders drop-ins; hidden names, starting with `.`, are skipped as systemd skips
    /// them); later files override earlier ones. Unknown keys are reported through `warn` and
    /// ignored. A main file or drop-in directory that exists but cannot be read or listed, a
    /// drop-in whose name is not UTF-8, and a file that is not UTF-8 (a leading byte-order mark
    /// is fine) are errors: a drop-in left out silently could be the one that narrows who may do
    /// what.
    ///
    /// Plain system calls, not `FileManager`: the file manager's first use (and the error it builds
    /// for a directory that is not there) cost about 0.4 ms of every start, before anything else.
    public static func load(path: String, warn: (String) -> Void) throws(ParseError) -> DaemonConfiguration {
        var configuration = DaemonConfiguration()
        var files: [String] = []
        if Glibc.access(path, F_OK) == 0 {
            files.append(path)
        } else if errno != ENOENT {
            throw ParseError(file: path, line: 0, message: "cannot read: \(String(cString: strerror(errno)))")
        }
        files += try dropIns(in: path + ".d")
        for file in files {
            let text: String
            do { text = try TextFile.read(file) } catch {
                throw ParseError(file: file, line: 0, message: error.message)
            }
            try configuration.apply(text, file: file, warn: warn)
        }
        return configuration
    }

    /// The paths of the `*.conf` entries of `directory`, in the byte order of their names; none
    /// when it does not exist.
    static func dropIns(in directory: String) throws(ParseError) -> [String] {
        guard let stream = opendir(directory) else {
            if errno == ENOENT { return [] }
            throw ParseError(file: directory, line: 0, message: "cannot list: \(String(cString: strerror(errno)))")
        }
        defer { closedir(stream) }
        var names: [[UInt8]] = []
        while true {
            errno = 0
            guard let entry = readdir(stream) else {
                guard errno == 0 else {
                    throw ParseError(
                        file: directory, line: 0, message: "cannot list: \(String(cString: strerror(errno)))")
                }
                break
            }
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                Array(raw.prefix(while: { $0 != 0 }))
            }
            guard name.first != UInt8(ascii: "."), name.count > 5, name.suffix(5).elementsEqual(".conf".utf8) else {
                continue
            }
            names.append(name)
        }
        return try names.sorted { $0.lexicographicallyPrecedes($1) }.map { (name) throws(ParseError) in
            guard let text = String(validating: name, as: UTF8.self) else {
                throw ParseError(
                    file: directory + "/" + String(decoding: name, as: UTF8.self), line: 0,
                    message: "cannot read: the name is not UTF-8")
            }
            return directory + "/" + text
        }
    }

    /// Applies one file's text.
    public mutating func apply(_ text: String, file: String, warn: (String) -> Void) throws(ParseError) {
        var section = ""
        for (index, rawLine) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = rawLine.trimmingWhitespace(newlines: false)
            let number = index + 1
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else {
                    throw ParseError(file: file, line: number, message: "bad section header")
                }
                section = String(line.dropFirst().dropLast())
                continue
            }
            guard let equals = line.firstIndex(of: "=") else {
                throw ParseError(file: file, line: number, message: "expected Key=value")
            }
            let key = line[..<equals].trimmingWhitespace(newlines: false)
            let value = line[line.index(after: equals)...].trimmingWhitespace(newlines: false)
            do {
                if try !set(section: section, key: key, value: value) {
                    warn("\(file):\(number): unknown key [\(section)] \(key), ignoring")
                }
            } catch let error as ValueError {
                throw ParseError(file: file, line: number, message: "[\(section)] \(key)=\(value): \(error.message)")
            } catch {
                throw ParseError(file: file, line: number, message: "\(error)")
            }
        }
    }

    struct ValueError: Error { var message: String }

    private func int(_ value: String, _ range: ClosedRange<Int>) throws -> Int {
        guard let number = Int(value), range.contains(number) else {
            throw ValueError(message: "expected a whole number in \(range.lowerBound)...\(range.upperBound)")
        }
        return number
    }

    /// The longest time any of the base sections' `…Sec` keys may name: a year. Unbounded, a
    /// value such as 1e16 passed the parser and trapped later, converted to milliseconds or an
    /// integer, at the first refused call or the first unlock.
    static let longestSeconds: TimeInterval = 366 * 86_400

    private func seconds(_ value: String) throws -> TimeInterval {
        guard let number = Double(value), number.isFinite, (0...Self.longestSeconds).contains(number) else {
            throw ValueError(message: "expected a number of seconds in 0...\(Int(Self.longestSeconds)) (a year)")
        }
        return number
    }

    private func bool(_ value: String) throws -> Bool {
        switch value.lowercased() {
        case "1", "yes", "true", "on": return true
        case "0", "no", "false", "off": return false
        default: throw ValueError(message: "expected yes or no")
        }
    }

    private func words(_ value: String) -> [String] {
        value.split(whereSeparator: { $0 == " " || $0 == "," || $0 == "\t" }).map(String.init)
    }

    /// Sets one key; returns false when the key is unknown.
    private mutating func set(section: String, key: String, value: String) throws -> Bool {
        switch (section, key) {
        case ("Daemon", "LogLevel"):
            let levels = ["trace", "debug", "info", "notice", "warning", "error", "critical"]
            guard levels.contains(value) else {
                throw ValueError(message: "expected one of \(levels.joined(separator: ", "))")
            }
            logLevel = value
        case ("Daemon", "IdleReleaseSec"):
            let seconds = try seconds(value)
            // Shorter waits would release in the middle of ordinary bursts of calls.
            guard seconds == 0 || seconds >= 1 else {
                throw ValueError(message: "expected 0 (never), or 1 or more seconds")
            }
            idleRelease = seconds
        case ("Socket", "MaxConnections"): socket.maxConnections = try int(value, 1...4096)
        case ("Socket", "MaxConnectionsPerUID"): socket.maxConnectionsPerUID = try int(value, 1...4096)
        case ("Socket", "MaxMessageSize"): socket.maxMessageSize = try int(value, 1024...(1024 * 1024))
        case ("Socket", "IdleTimeoutSec"): socket.idleTimeout = try seconds(value)
        case ("Socket", "ReservedConnections"): socket.reservedConnections = try int(value, 0...4095)
        case ("Socket", "RequestsPerSecondPerUID"): socket.requestsPerSecondPerUID = try int(value, 1...100_000)
        case ("Socket", "WriteTimeoutSec"): socket.writeTimeout = try seconds(value)
        case ("Access", "AdminGroup"): access.adminGroup = value
        case ("Access", "AuthenticatorGroup"): access.authenticatorGroup = value
        case ("Access", "PasscodeServices"): access.passcodeServices = Set(words(value))
        case ("Access", "SwitchUserServices"): access.switchUserServices = Set(words(value))
        case ("Access", "TicketLifetimeSec"): access.ticketLifetime = try seconds(value)
        case ("Access", "RefusalSummaryIntervalSec"): access.refusalSummaryInterval = try seconds(value)
        case ("Store", "DevelopmentKeyFile"): store.developmentKeyFile = try bool(value)
        case ("Store", "PasscodeHashMemoryKiB"): store.passcodeHashMemoryKiB = try int(value, 8...(4 * 1024 * 1024))
        case ("Store", "PasscodeHashIterations"): store.passcodeHashIterations = try int(value, 1...100)
        case ("Store", "PasscodeHashParallelism"): store.passcodeHashParallelism = try int(value, 1...16)
        case ("Store", "PasscodeHashHugePages"): store.passcodeHashHugePages = try bool(value)
        case ("Store", "AuditVerifyInterval"): store.auditVerifyInterval = try seconds(value)
        case ("Store", "PasscodeHashWorkers"): store.passcodeHashWorkers = try int(value, 0...64)
        case ("Store", "PasscodeHashQueue"): store.passcodeHashQueue = try int(value, 0...4096)
        case ("Store", "PasscodeHashPriority"): store.passcodeHashPriority = try int(value, 0...20)
        case ("Passcode", "MinimumLength"): passcode.minimumLength = try int(value, 4...64)
        case ("Passcode", "MaximumLength"): passcode.maximumLength = try int(value, 4...64)
        case ("Passcode", "LockoutDelaysSec"): passcode.lockoutDelays = try words(value).map(seconds)
        case ("Passcode", "HardLockAfter"): passcode.hardLockAfter = try int(value, 1...1000)
        case ("Fingerprint", "Enabled"): fingerprint.enabled = try bool(value)
        case ("Fingerprint", "FailuresBeforeFallback"): fingerprint.failuresBeforeFallback = try int(value, 1...100)
        case ("Fingerprint", "ScanTimeoutSec"): fingerprint.scanTimeout = try seconds(value)
        case ("Fingerprint", "IdentifyRosterCap"): fingerprint.identifyRosterCap = try int(value, 1...10_000)
        case ("Fingerprint", "IdentifyLayout"):
            guard let layout = IdentifyLayout(value) else {
                throw ValueError(message: "expected full, staged or compact-1 ... compact-9")
            }
            fingerprint.identifyLayout = layout
        case ("Fingerprint", "IdentifyPauseAfter"): fingerprint.identifyPauseAfter = try int(value, 1...1000)
        case ("Fingerprint", "IdentifyPauseSec"): fingerprint.identifyPause = try seconds(value)
        case ("Fingerprint", "FailuresInWindow"): fingerprint.fingerFailuresInWindow = try int(value, 1...10000)
        case ("Fingerprint", "FailureWindowSec"): fingerprint.fingerFailureWindow = try seconds(value)
        case ("Fingerprint", "SelfEnrollment"): fingerprint.selfEnrollment = try bool(value)
        case ("Fingerprint", "MaxFingersPerPerson"): fingerprint.maxFingersPerPerson = try int(value, 1...10)
        case ("Fingerprint", "DuplicateCheck"): fingerprint.duplicateCheck = try bool(value)
        case ("Activation", "CodeLifetimeSec"): activation.codeLifetime = try seconds(value)
        case ("Activation", "MaxTries"): activation.maxTries = try int(value, 1...100)
        case ("Activation", "TerminalMaxFailures"): activation.terminalMaxFailures = try int(value, 1...1000)
        case ("Activation", "TerminalWindowSec"): activation.terminalWindow = try seconds(value)
        case ("Roles", "Caregiver"): activation.roleDescriptions["caregiver"] = value
        case ("Roles", "Coordinator"): activation.roleDescriptions["coordinator"] = value
        case ("Roles", "Family"): activation.roleDescriptions["family"] = value
        case ("IdentityProvider", _), ("Session", _): return try setOnlineKey(section: section, key: key, value: value)
        case ("AuditDelivery", _): return try setAuditDeliveryKey(key: key, value: value)
        case ("Metrics", _): return try setMetricsKey(key: key, value: value)
        case ("Fleet", _): return try setFleetKey(key: key, value: value)
        default: return false
        }
        return true
    }
}
