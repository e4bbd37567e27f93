import ArgumentParser
import Foundation
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

/// Options every subcommand shares.
struct GlobalOptions: ParsableArguments {
    @Option(help: "The daemon's socket (default: $KIOSKAUTH_SOCKET, else /run/kioskauth/io.kioskauth).")
    var socket: String?

    @Flag(help: "Print the daemon's replies as JSON.")
    var json = false

    var socketPath: String { Self.socketPath(socket) }

    /// `given` (--socket), else $KIOSKAUTH_SOCKET, else the system socket.
    static func socketPath(_ given: String?) -> String {
        given ?? ProcessInfo.processInfo.environment["KIOSKAUTH_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
            ?? "/run/kioskauth/io.kioskauth"
    }

    func connect() throws -> VarlinkClient {
        try VarlinkClient(socketPath: socketPath)
    }

    /// Calls `method` and prints the reply as JSON when asked to.
    @discardableResult
    func call<Output: Decodable>(_ method: String, _ input: some Encodable, as output: Output.Type) throws -> Output {
        let client = try connect()
        let parameters = try VarlinkCoding.encode(input)
        let reply = try client.call("io.kioskauth." + method, parameters: parameters)
        if json { printJSON(reply) }
        return try VarlinkCoding.decode(output, from: reply)
    }
}

func printJSON(_ value: some Encodable) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    if let data = try? encoder.encode(value) {
        // The encoder escapes C0 controls; C1 controls and bidirectional overrides it leaves raw,
        // so they become JSON escapes here: the same JSON, nothing a terminal acts on.
        var text = ""
        for scalar in String(decoding: data, as: UTF8.self).unicodeScalars {
            if scalar.value >= 0x7F, SafeText.isForbidden(scalar) {
                text += String(format: "\\u%04x", scalar.value)
            } else {
                text.unicodeScalars.append(scalar)
            }
        }
        Swift.print(text)
    }
}

/// Stored text (names, display names, services, audit details) as it is safe to show on a
/// terminal: control and bidirectional-override characters escaped (`\x1B`, `\u{202E}`).
func safe(_ text: String) -> String { SafeText.escaped(text) }
func safe(_ text: String?) -> String? { text.map(SafeText.escaped) }

/// Every line this tool prints goes through here: whatever a stored string holds, no control or
/// bidirectional-override character reaches the terminal raw (tabs and line ends the tool
/// writes itself are kept; the fields that could hold them are escaped with `safe` first).
func print(_ items: Any..., separator: String = " ", terminator: String = "\n") {
    let text = items.map { "\($0)" }.joined(separator: separator)
    let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { line in
        line.split(separator: "\t", omittingEmptySubsequences: false).map { SafeText.escaped(String($0)) }
            .joined(separator: "\t")
    }
    Swift.print(lines.joined(separator: "\n"), terminator: terminator)
}

/// Reads one secret line: without echo from a terminal, else a plain line from stdin.
func readSecret(prompt: String) throws -> String {
    if isatty(STDIN_FILENO) != 0 {
        FileHandle.standardError.write(Data(prompt.utf8))
        var saved = termios()
        tcgetattr(STDIN_FILENO, &saved)
        var silent = saved
        silent.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &silent)
        defer {
            tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved)
            FileHandle.standardError.write(Data("\n".utf8))
        }
        guard let line = Swift.readLine(strippingNewline: true) else { throw CleanExit.message("no input") }
        return line
    }
    guard let line = Swift.readLine(strippingNewline: true) else {
        throw ValidationError("expected the passcode on standard input")
    }
    return line
}

func iso(_ text: String?) -> String { text ?? "-" }

@main
struct KioskAuthCtl: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kioskauthctl",
        abstract: "Manage kioskauth: people, passcodes, fingerprints and the audit trail.",
        discussion:
            "Speaks only kioskauthd's socket API; what you may do depends on who you are (root, kioskauth-admin, kioskauth).",
        version: KioskAuthVersion.string,
        subcommands: [
            Status.self, User.self, Passcode.self, FingerCommand.self, VerifyCommand.self, IdentifyCommand.self,
            ReaderCommand.self,
            Activation.self, Lockout.self, Audit.self, SessionCommand.self, Login.self,
        ])

    /// Runs the command; usage errors exit 2, failures print one line and exit 1.
    static func main() {
        do {
            var command = try parseAsRoot(globalOptionsLast(Array(CommandLine.arguments.dropFirst())))
            try command.run()
        } catch let error as VarlinkClientError {
            FileHandle.standardError.write(Data("kioskauthctl: \(safe(describe(error)))\n".utf8))
            Foundation.exit(1)
        } catch {
            let code = exitCode(for: error)
            if code == .validationFailure {
                FileHandle.standardError.write(Data((fullMessage(for: error) + "\n").utf8))
                Foundation.exit(2)
            }
            exit(withError: error)
        }
    }

    /// `--socket` and `--json` are global: accepted before the subcommand too
    /// (`kioskauthctl --socket PATH status`). Every subcommand declares them, so they move to the end.
    static func globalOptionsLast(_ arguments: [String]) -> [String] {
        var globals: [String] = []
        var rest: [String] = []
        var index = 0
        var beforeSubcommand = true
        while index < arguments.count {
            let argument = arguments[index]
            if beforeSubcommand, argument == "--socket", index + 1 < arguments.count {
                globals += [argument, arguments[index + 1]]
                index += 2
                continue
            }
            if beforeSubcommand, argument.hasPrefix("--socket=") || argument == "--json" {
                globals.append(argument)
            } else {
                if !argument.hasPrefix("-") { beforeSubcommand = false }
                rest.append(argument)
            }
            index += 1
        }
        return rest + globals
    }

    /// One plain line for a named error.
    static func describe(_ error: VarlinkClientError) -> String {
        let p = error.parameters
        func string(_ key: String) -> String? { p?[key]?.stringValue }
        func number(_ key: String) -> Int? {
            if case .number(let value)? = p?[key] { return Int(value) }
            return nil
        }
        switch error.shortName {
        case "Unreachable": return "cannot reach kioskauthd: \(p?.stringValue ?? "")"
        case "Disconnected": return "kioskauthd closed the connection: \(p?.stringValue ?? "")"
        case "NoSuchPerson": return "no person named \(string("name") ?? "that")"
        case "PersonExists": return "\(string("name") ?? "that person") already exists"
        case "PermissionDenied": return "permission denied: \(string("reason") ?? "")"
        case "BindingRefused": return "cannot bind \(string("name") ?? "the person"): \(string("reason") ?? "")"
        case "AccountNotAllowed": return "not allowed on this account: \(string("reason") ?? "")"
        case "InvalidInput": return "invalid \(string("field") ?? "input"): \(string("message") ?? "")"
        case "InvalidParameter": return "invalid parameter \(string("parameter") ?? "")"
        case "WeakPasscode": return string("message") ?? "passcode refused"
        case "WrongPasscode":
            let failures = number("failures") ?? 0
            let count = "\(failures) failed attempt\(failures == 1 ? "" : "s") in a row"
            if let seconds = number("retryAfterSeconds") {
                return "wrong passcode (\(count)); try again in \(seconds) s"
            }
            return "wrong passcode (\(count))"
        case "PasscodeLocked":
            if case .bool(true)? = p?["hardLocked"] {
                return
                    "passcode locked after too many failures: an admin must reset it (kioskauthctl lockout reset NAME), or sign in online; fingerprint unlock still works"
            }
            return
                "passcode locked for \(number("retryAfterSeconds") ?? 0) s after failed attempts; fingerprint unlock still works"
        case "NoPasscode": return "\(string("name") ?? "that person") has no passcode"
        case "PersonNotActive":
            return "\(string("name") ?? "that person") cannot unlock: \(string("state") ?? "not active")"
        case "PasscodeNotAllowed": return "passcode not allowed: \(string("reason") ?? "")"
        case "TicketInvalid": return "authenticate first: the ticket is missing, expired or from another connection"
        case "StoreIntegrity": return "store integrity failure: \(string("reason") ?? "")"
        case "TooManyConnections": return "kioskauthd is refusing connections: too many open"
        case "RateLimited":
            let retry: String
            if case .number(let seconds)? = p?["retryAfter"] {
                retry = String(format: "%.1f", seconds)
            } else {
                retry = "1"
            }
            return "too many calls from this user (at most \(number("limit") ?? 0) a second); try again in \(retry) s"
        case "Busy":
            return
                "kioskauthd is busy checking other passcodes (\(number("pending") ?? 0) in hand); try again in a moment"
        case "ActivationCodeWrong", "ActivationCodeExpired", "ActivationCodeUsed", "ActivationCodeRevoked",
            "ActivationPaused":
            return string("message") ?? error.description
        case "AlreadyActive": return "\(string("name") ?? "that person") is already active"
        case "NoReader": return "no fingerprint reader is present; use the passcode"
        case "FingerprintNotRecognized":
            if case .bool(true)? = p?["fallbackRequired"] {
                return
                    "finger not recognised (\(number("failures") ?? 0) in a row): use your \(string("fallback") == "idp" ? "email and password" : "passcode") now"
            }
            return "finger not recognised (\(number("failures") ?? 0) in a row)"
        case "FallbackRequired":
            return
                "too many unrecognised fingers: \(string("name") ?? "this person") must use the \(string("fallback") == "idp" ? "email and password login" : "passcode") first"
        case "NotIdentified":
            if case .bool(true)? = p?["askForName"] {
                return "finger not recognised among the most recent users: give your name and verify instead"
            }
            return "finger not recognised"
        case "FingerprintPaused":
            return
                "fingerprint matching is paused after unrecognised fingers; try again in \(number("retryAfterSeconds") ?? 0) s or use the passcode"
        case "IdentifyPaused":
            return
                "walk-up identify is paused after unknown fingers; try again in \(number("retryAfterSeconds") ?? 0) s or give your name"
        case "NoFingers": return "\(string("name") ?? "that person") has no enrolled finger"
        case "FingerAlreadyEnrolled":
            // The finger the touch matched, and whose it is when the daemon says.
            switch (string("name"), string("finger").flatMap { $0.isEmpty ? nil : $0 }) {
            case (let owner?, let finger?): return "that finger is already enrolled as \(owner)'s \(finger)"
            case (nil, let finger?): return "that finger is already enrolled (as \(finger))"
            default: return "that finger is already enrolled"
            }
        case "TooManyFingers": return "at most \(number("max") ?? 10) fingers per person"
        case "ScanRetry": return "the touch was not usable: \(string("hint") ?? "try again")"
        case "ScanTimeout": return "no finger was presented within \(number("seconds") ?? 0) s"
        case "ReaderRemoved": return "the reader was unplugged during the scan"
        case "ReaderUnavailable": return "the reader is unavailable: \(string("reason") ?? "")"
        case "ReaderFull": return "the reader's storage is full"
        case "ScanCancelled": return "the scan was cancelled"
        case "FingerprintNotAllowed": return "fingerprint not allowed: \(string("reason") ?? "")"
        case "IdentityProviderNotConfigured": return "no identity provider is configured on this terminal"
        case "WrongCredentials": return "wrong email or password"
        case "NotAdmitted": return "not admitted on this terminal: \(string("reason") ?? "")"
        case "UnknownRole": return "refused: \(string("reason") ?? "unknown role")"
        case "SubjectChanged": return "refused: \(string("reason") ?? "the account changed at the identity provider")"
        case "IdentityProviderUnavailable":
            return "\(string("reason") ?? "cannot reach the identity provider"); try again later"
        case "IdentityProviderRefused": return string("reason") ?? "the identity provider refused the request"
        case "DeviceLoginDenied": return "the device login was denied"
        case "DeviceLoginExpired": return "the device code expired; start again"
        case "OfflineWindowExpired", "OnlineLoginRequired": return string("message") ?? "Sign in online."
        case "NoSuchSession": return "no open session \(string("id") ?? "")"
        case "SessionEnded": return "the session has ended (\(string("reason") ?? "ended"))"
        case "SessionLocked": return "the session is locked: authenticate first"
        case "SessionNotAuthenticated":
            return "the session was not authenticated on this connection: authenticate the person here first"
        case "StaleAuthentication": return "that authentication began before the session was locked; authenticate again"
        case "NoAccessToken": return "no access token: \(string("reason") ?? "")"
        default: return error.description
        }
    }
}

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the daemon's status.")
    @OptionGroup var global: GlobalOptions

    func run() throws {
        let status = try global.call("GetStatus", Message.Empty(), as: Message.Status.self)
        guard !global.json else { return }
        print("kioskauthd \(status.version), store schema \(status.schemaVersion)")
        print("people:       \(status.people)")
        print("socket:       \(global.socketPath)\(status.socketActivated ? " (socket-activated)" : "")")
        print(
            "store key:    \(status.developmentKey ? "DEVELOPMENT KEY FILE (not for production)" : "systemd credential")"
        )
        print("uptime:       \(status.uptimeSeconds) s")
        print("audit:        \(status.auditEvents) events, head \(status.auditHead.prefix(16))…")
        if let delivery = status.auditDelivery { printAuditDelivery(delivery) }
        guard
            let connectivity = try? global.call(
                "GetConnectivity", Message.GetConnectivity(people: true), as: Message.Connectivity.self)
        else {
            return
        }
        guard connectivity.identityProvider else {
            print("identity provider: none configured (local people only)")
            return
        }
        var line = "identity provider: \(connectivity.state)"
        if let since = connectivity.since { line += " since \(since)" }
        if connectivity.circuit != "closed" { line += ", refresh paused (circuit \(connectivity.circuit))" }
        print(line)
        for person in connectivity.people {
            var window = "  \(person.name): offline window \(person.window)"
            if let left = person.windowSecondsLeft { window += ", \(left / 3600) h \(left % 3600 / 60) min left" }
            if let reason = person.suspendedReason { window += " (\(reason))" }
            print(window)
        }
        print(
            "revocation queue: \(connectivity.outboxPending) pending\(connectivity.lastDeliveryAt.map { ", last delivery \($0)" } ?? "")\(connectivity.lastDeliveryError.map { ", last error: \($0)" } ?? "")"
        )
    }
}

/// The audit-delivery lines of `status`; admins see the endpoint and the failure.
func printAuditDelivery(_ delivery: AuditDeliveryStatus) {
    guard delivery.configured else {
        print("audit delivery: off (no [AuditDelivery] Endpoint= configured)")
        return
    }
    var line = "audit delivery: \(delivery.state)"
    if let host = delivery.endpointHost { line += " to \(host)" }
    line += ", \(delivery.queued) event\(delivery.queued == 1 ? "" : "s") queued"
    line += ", last delivery \(delivery.lastDeliveryAt ?? "never")"
    print(line)
    if let error = delivery.lastError {
        var details: [String] = []
        if let at = delivery.lastErrorAt { details.append("at \(at)") }
        if let attempts = delivery.consecutiveFailures {
            details.append("\(attempts) failed attempt\(attempts == 1 ? "" : "s") in a row")
        }
        print("  last error: \(error)" + (details.isEmpty ? "" : " (\(details.joined(separator: ", ")))"))
        if let next = delivery.nextAttemptAt { print("  next attempt: \(next)") }
    }
}

struct User: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Add, list, show, change, export and remove people.",
        subcommands: [Add.self, List.self, Show.self, Set.self, Suspend.self, Resume.self, Export.self, Remove.self])

    struct Suspend: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Suspend a person: every authentication is refused and their sessions end; secrets are kept.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "Why (recorded in the audit trail).") var reason: String?

        func run() throws {
            try global.call(
                "SuspendPerson", Message.SuspendPerson(name: name, reason: reason), as: Message.PersonReply.self)
            if !global.json { print("\(name) is suspended") }
        }
    }

    struct Resume: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make a person an admin suspended active again (identity-provider people sign in online).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            try global.call("ResumePerson", Message.Name(name: name), as: Message.PersonReply.self)
            if !global.json { print("\(name) is active again") }
        }
    }

    struct Set: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Change a person's settings.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "Offer fingerprint enrolment after online logins: on, or off (as if declined).")
        var biometricOffer: String?
        @Option(help: "Bind the person (local or from the identity provider) to this Unix uid.") var uid: Int?
        @Flag(help: "Unbind the person from their Unix uid.") var unbind = false

        func validate() throws {
            guard biometricOffer != nil || uid != nil || unbind else {
                throw ValidationError("nothing to change: give --biometric-offer on|off, --uid UID or --unbind")
            }
            if let biometricOffer, !["on", "off"].contains(biometricOffer) {
                throw ValidationError("--biometric-offer takes on or off")
            }
            if uid != nil && unbind { throw ValidationError("--uid and --unbind exclude each other") }
        }

        func run() throws {
            if uid != nil || unbind {
                let reply = try global.call(
                    "BindAccount", Message.BindAccount(name: name, uid: uid), as: Message.PersonReply.self)
                if !global.json {
                    print(reply.person.uid.map { "\(name) is bound to uid \($0)" } ?? "\(name) is bound to no uid")
                }
            }
            if let biometricOffer {
                let enabled = biometricOffer == "on"
                try global.call(
                    "SetBiometricOffer", Message.SetBiometricOffer(name: name, enabled: enabled),
                    as: Message.PersonReply.self)
                if !global.json { print("fingerprint enrolment offer for \(name): \(enabled ? "on" : "off")") }
            }
        }
    }

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add a local person.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.") var name: String
        @Option(help: "Name shown to the person.") var displayName: String?
        @Option(help: "Role: caregiver, coordinator or family; repeat for several, the first is primary.")
        var role: [String] = []
        @Option(help: "Unix uid to bind the person to.") var uid: Int?

        func validate() throws {
            for role in role where !["caregiver", "coordinator", "family"].contains(role) {
                throw ValidationError("unknown role '\(role)': use caregiver, coordinator or family")
            }
        }

        func run() throws {
            let reply = try global.call(
                "AddPerson",
                Message.AddPerson(name: name, displayName: displayName, roles: role.isEmpty ? nil : role, uid: uid),
                as: Message.PersonAdded.self)
            guard !global.json else { return }
            print("added \(reply.person.name) (\(reply.person.roles.joined(separator: ", "))), pending activation")
            if let code = reply.activationCode {
                print("activation code: \(code)   (one use; expires \(reply.activationExpiresAt ?? "in 72 h"))")
                print("At the terminal \(reply.person.displayName) enters it, sets a passcode and enrols a finger.")
                print("Or activate now: kioskauthctl passcode set \(reply.person.name)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List everyone on this terminal.")
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let reply = try global.call("ListPeople", Message.Empty(), as: Message.People.self)
            guard !global.json else { return }
            let rows =
                [["NAME", "DISPLAY NAME", "ROLES", "ORIGIN", "STATE", "UID", "PASSCODE", "FINGERS"]]
                + reply.people.map { p in
                    [
                        safe(p.name), safe(p.displayName), safe(p.roles.joined(separator: ",")), safe(p.origin),
                        safe(p.state),
                        p.uid.map(String.init) ?? "-",
                        p.passcodeHardLocked ? "locked" : (p.hasPasscode ? "set" : "-"),
                        p.fingers.isEmpty
                            ? "-"
                            : safe(
                                p.fingers.map {
                                    (p.fingersMissingFromSensor ?? []).contains($0) ? $0 + "(missing)" : $0
                                }
                                .joined(separator: ",")),
                    ]
                }
            let widths = (0..<rows[0].count).map { column in rows.map { $0[column].count }.max() ?? 0 }
            for row in rows {
                print(
                    zip(row, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }.joined(
                        separator: "  "))
            }
        }
    }

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show one person.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let p = try global.call("GetPerson", Message.Name(name: name), as: Message.PersonReply.self).person
            guard !global.json else { return }
            print("name:          \(p.name)")
            print("display name:  \(p.displayName)")
            print("roles:         \(p.roles.joined(separator: ", ")) (primary: \(p.primaryRole))")
            print("origin:        \(p.origin)")
            print("state:         \(p.state)")
            print("uid:           \(p.uid.map(String.init) ?? "-")")
            print(
                "passcode:      \(p.hasPasscode ? "set" : "not set")\(p.passcodeHardLocked ? ", HARD-LOCKED" : "")\(p.passcodeLockedUntil.map { ", delayed until \($0)" } ?? "")"
            )
            print("failures:      passcode \(p.passcodeFailures), fingerprint \(p.fingerprintFailures)")
            print("fingers:       \(p.fingers.isEmpty ? "-" : p.fingers.joined(separator: ", "))")
            if let missing = p.fingersMissingFromSensor, !missing.isEmpty {
                print("missing:       \(missing.joined(separator: ", ")) (not on the sensor: cannot match)")
                print(missingAdvice(name: p.name, missing))
            }
            print("created:       \(p.createdAt)")
            print("last unlock:   \(iso(p.lastUnlockAt))")
            if p.origin == "idp" {
                print("email:         \(iso(p.email))")
                print("last online:   \(iso(p.lastOnlineContactAt))")
                if let reason = p.suspendedReason { print("suspended:     until an online login (\(reason))") }
            }
            if let offer = p.biometricOffer { print("finger offer:  \(offer ? "on" : "declined")") }
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print everything stored about a person except secrets, as JSON (e.g. before user remove).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.connect().call(
                "io.kioskauth.ExportPerson", parameters: try VarlinkCoding.encode(Message.Name(name: name)))
            printJSON(reply)
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a person and erase their passcode, fingerprints, tokens and sessions.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            try global.call("RemovePerson", Message.Name(name: name), as: Message.Empty.self)
            if !global.json { print("removed \(name); their secrets are erased") }
        }
    }
}

struct Passcode: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Set or check a passcode.", subcommands: [Set.self, Verify.self])

    struct Set: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Set a person's passcode: typed twice on a terminal, or two lines on standard input.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let first = try readSecret(prompt: "New passcode for \(name): ")
            let second = try readSecret(prompt: "Again: ")
            try global.call(
                "SetPasscode", Message.SetPasscode(name: name, passcode: first, confirmation: second),
                as: Message.PersonReply.self)
            if !global.json { print("passcode set for \(name)") }
        }
    }

    struct Verify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check a passcode (one line on standard input); exits 0 only when it matches.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let passcode = try readSecret(prompt: "Passcode for \(name): ")
            let reply = try global.call(
                "VerifyPasscode", Message.VerifyPasscode(name: name, passcode: passcode), as: Message.Verified.self)
            if !global.json { print("passcode accepted for \(reply.person.displayName)") }
        }
    }
}

struct Lockout: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Clear failure counts.", subcommands: [Reset.self])

    struct Reset: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Clear a person's passcode and fingerprint failure counts, including a hard lock.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            try global.call("ResetLockout", Message.Name(name: name), as: Message.PersonReply.self)
            if !global.json { print("lockout cleared for \(name)") }
        }
    }
}

struct Audit: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the audit trail, or verify its HMAC chain.", subcommands: [Show.self, Verify.self],
        defaultSubcommand: Show.self)

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "show", abstract: "Show audit events, oldest first.")
        @OptionGroup var global: GlobalOptions
        @Option(help: "Only events after this sequence number.") var after: Int?
        @Option(
            name: [.customShort("n"), .long], help: "Only the newest N events (like journalctl -n), still oldest first."
        )
        var limit: Int?

        func validate() throws {
            if let limit, limit < 1 { throw ValidationError("--limit takes a positive number") }
        }

        func run() throws {
            let reply = try global.call(
                "GetAudit", Message.GetAudit(after: after, limit: limit, newest: limit == nil ? nil : true),
                as: Message.AuditEvents.self)
            guard !global.json else { return }
            for e in reply.events {
                var line = "\(e.sequence)\t\(safe(e.time))\t\(safe(e.action))\t\(safe(e.result))"
                if let person = e.person { line += "\tperson=\(safe(person))" }
                if let method = e.method { line += "\tmethod=\(safe(method))" }
                if let uid = e.callerUid { line += "\tuid=\(uid)" }
                if let pid = e.callerPid { line += "\tpid=\(pid)" }
                if let service = e.service { line += "\tservice=\(safe(service))" }
                if let detail = e.detail { line += "\t\(safe(detail))" }
                print(line)
            }
        }
    }

    struct Verify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check the audit trail's HMAC chain; exits 1 when broken.")
        @OptionGroup var global: GlobalOptions
        @Option(
            name: .long, help: "A trusted head SEQ:MAC (e.g. the journal's audit_seq:audit_head) the chain must reach.")
        var head: String?

        func run() throws {
            let result = try global.call(
                "VerifyAudit", Message.VerifyAudit(head: head), as: Message.AuditVerification.self)
            if !global.json {
                if result.valid {
                    print("audit chain intact: \(result.events) events, head \(result.head)")
                } else {
                    print("AUDIT CHAIN BROKEN at event \(result.brokenAt ?? 0): \(result.reason ?? "")")
                }
            }
            if !result.valid { throw ExitCode(1) }
        }
    }
}

/// Streams a scanning call, showing progress on standard error; returns the final reply.
func scan(_ global: GlobalOptions, _ method: String, _ input: some Encodable) throws -> Message.ScanReply {
    let client = try global.connect()
    let parameters = try VarlinkCoding.encode(input)
    var final: Message.ScanReply?
    let interactive = isatty(STDERR_FILENO) != 0
    try client.callMore("io.kioskauth." + method, parameters: parameters) { reply in
        let decoded = try VarlinkCoding.decode(Message.ScanReply.self, from: reply)
        if global.json { printJSON(reply) }
        guard let progress = decoded.progress else {
            final = decoded
            return
        }
        guard !global.json else { return }
        var line: String
        if let stage = progress.stage, let stages = progress.stages, stages > 0, progress.state != "duplicate-check" {
            let width = 20
            let filled = min(width, stage * width / stages)
            line =
                "[" + String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
                + "] stage \(stage)/\(stages)"
            if let hint = progress.hint { line += ": \(hint)" }
        } else {
            line = progress.hint ?? progress.state
        }
        if interactive {
            FileHandle.standardError.write(Data(("\r\u{1B}[K" + line).utf8))
        } else {
            FileHandle.standardError.write(Data((line + "\n").utf8))
        }
    }
    if interactive { FileHandle.standardError.write(Data("\n".utf8)) }
    guard let final else { throw ValidationError("the daemon sent no result") }
    return final
}

let fingerNames = [
    "left-thumb", "left-index", "left-middle", "left-ring", "left-little",
    "right-thumb", "right-index", "right-middle", "right-ring", "right-little",
]

/// What to do about enrolled fingers the storage reader no longer holds.
func missingAdvice(name: String, _ missing: [String]) -> String {
    let finger = missing.count == 1 ? missing[0] : "FINGER"
    return "The reader lost \(missing.count == 1 ? "this print" : "these prints") (e.g. a virtual reader restarted): "
        + "kioskauthctl finger remove \(name) --finger \(finger), then enrol it again."
}

struct FingerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "finger", abstract: "Enrol, list and remove fingers.",
        subcommands: [Enroll.self, List.self, Remove.self])

    struct Enroll: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Enrol a finger, with live progress.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "Which finger: left-thumb ... right-little.", completion: .list(fingerNames))
        var finger = "right-index"
        @Option(help: "The reader to enrol on (an id from `kioskauthctl reader`); default the first.") var reader:
            String?

        func validate() throws {
            guard fingerNames.contains(finger) else {
                throw ValidationError("unknown finger '\(finger)': use \(fingerNames.joined(separator: ", "))")
            }
        }

        func run() throws {
            let reply = try scan(
                global, "EnrollFinger", Message.EnrollFinger(name: name, finger: finger, reader: reader))
            guard !global.json else { return }
            print("enrolled \(reply.finger ?? finger) for \(name)")
            if reply.duplicateChecked == false {
                print("note: duplicates were not checked (the reader cannot identify, or the check is off)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List a person's enrolled fingers.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call("ListFingers", Message.Name(name: name), as: Message.Fingers.self)
            guard !global.json else { return }
            let missing = reply.missingFromSensor ?? []
            for finger in reply.fingers {
                print(missing.contains(finger) ? "\(finger)\tmissing from the sensor" : finger)
            }
            if !missing.isEmpty { print(missingAdvice(name: name, missing)) }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove one finger, or all of a person's fingers (also from the sensor).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "The finger; all fingers when absent.", completion: .enrolledFingers) var finger: String?

        func validate() throws {
            if let finger, !fingerNames.contains(finger) { throw ValidationError("unknown finger '\(finger)'") }
        }

        func run() throws {
            let reply = try global.call(
                "RemoveFinger", Message.RemoveFinger(name: name, finger: finger), as: Message.Removed.self)
            if !global.json {
                print(reply.removed.isEmpty ? "nothing to remove" : "removed \(reply.removed.joined(separator: ", "))")
            }
        }
    }
}

struct VerifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "verify", abstract: "Scan a finger and match one person; exits 0 only on a match.")
    @OptionGroup var global: GlobalOptions
    @Argument(help: "Login name.", completion: .people) var name: String

    func run() throws {
        let reply = try scan(global, "VerifyFinger", Message.VerifyFinger(name: name))
        if !global.json { print("matched \(reply.person?.displayName ?? name)") }
    }
}

struct IdentifyCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "identify", abstract: "Scan a finger and say whose it is; exits 0 only when recognised.")
    @OptionGroup var global: GlobalOptions

    func run() throws {
        let reply = try scan(global, "Identify", Message.Identify())
        guard !global.json, let person = reply.person else { return }
        print("Welcome back, \(person.displayName) (\(person.name))")
    }
}

struct ReaderCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "reader", abstract: "Show the fingerprint readers present.")
    @OptionGroup var global: GlobalOptions

    func run() throws {
        let reply = try global.call("GetReaders", Message.Empty(), as: Message.Readers.self)
        guard !global.json else { return }
        if reply.readers.isEmpty { print("no fingerprint reader present (passcodes still work)") }
        for r in reply.readers {
            var features: [String] = [r.scanType]
            if r.canIdentify { features.append("identify") }
            if r.hasStorage { features.append("storage") }
            print(
                "\(r.id)\t\(r.name)\tdriver \(r.driver)\t\(r.enrollStages) enrol stages\t\(features.joined(separator: ", "))"
            )
        }
    }
}

struct SessionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "session", abstract: "List sessions, or end every session of a person.",
        subcommands: [List.self, End.self])

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List open sessions.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Only this person's.", completion: .people) var name: String?

        func run() throws {
            let reply = try global.call("ListSessions", Message.ListSessions(name: name), as: Message.Sessions.self)
            guard !global.json else { return }
            let rows =
                [["ID", "NAME", "STATE", "SERVICE", "OPENED", "LAST ACTIVITY", "CUT-OFF"]]
                + reply.sessions.map { s in
                    [
                        String(s.id.prefix(12)), s.name, s.state, s.service ?? "-", s.openedAt, s.lastActivityAt,
                        s.overnightCutoff ?? "-",
                    ]
                }
            let widths = (0..<rows[0].count).map { column in rows.map { $0[column].count }.max() ?? 0 }
            for row in rows {
                print(
                    zip(row, widths).map { $0.padding(toLength: $1, withPad: " ", startingAt: 0) }.joined(
                        separator: "  "))
            }
        }
    }

    struct End: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "End every session of a person (security logout).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call("EndSessions", Message.Name(name: name), as: Message.EndedSessions.self)
            if !global.json { print("ended \(reply.ended) session\(reply.ended == 1 ? "" : "s") of \(name)") }
        }
    }
}

struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Sign in online with the identity provider (the password is one line on standard input).")
    @OptionGroup var global: GlobalOptions
    @Argument(help: "Email address.") var email: String

    func run() throws {
        let password = try readSecret(prompt: "Password for \(email): ")
        let reply = try global.call(
            "LoginWithPassword", Message.LoginWithPassword(email: email, password: password),
            as: Message.OnlineLogin.self)
        guard !global.json, let person = reply.person else { return }
        print(
            "signed in as \(person.name) (\(person.roles.joined(separator: ", ")))\(reply.created == true ? ", new on this terminal" : "")"
        )
        if reply.offerFingerprint == true {
            print("fingerprint enrolment can be offered (kioskauthctl finger enroll \(person.name))")
        }
    }
}

struct Activation: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Issue or revoke one-time activation codes.", subcommands: [Issue.self, Revoke.self])

    struct Issue: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Issue a new code for a person pending activation; the old one dies.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call(
                "IssueActivationCode", Message.Name(name: name), as: Message.ActivationCodeIssued.self)
            if !global.json { print("activation code: \(reply.code)   (one use; expires \(reply.expiresAt))") }
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke a person's activation code.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call("RevokeActivationCode", Message.Name(name: name), as: Message.Revoked.self)
            if !global.json { print(reply.revoked ? "revoked" : "\(name) had no live activation code") }
            if !reply.revoked { throw ExitCode(1) }
        }
    }
}

// MARK: Shell completion

/// Completion of people's and fingers' names, asked of the daemon: the shell runs
/// `kioskauthctl ---completion SUBCOMMAND... -- ARGUMENT INDEX CURSOR WORD...` and offers the
/// lines printed. A caller the daemon does not let list them (or no daemon) gets no candidates,
/// never an error, so the shell simply offers nothing.
enum ShellCompletion {
    /// Options of any subcommand that take a value, so their values are not taken for the name.
    static let optionsWithValues: Swift.Set<String> = [
        "--socket", "--finger", "--display-name", "--role", "--uid", "--reason", "--biometric-offer",
        "--after", "--limit", "-n", "--head",
    ]

    /// The socket the command line names (`--socket PATH` or `--socket=PATH`), else the default.
    static func client(_ words: [String]) -> VarlinkClient? {
        var socket: String?
        for (index, word) in words.enumerated() {
            if word == "--socket", index + 1 < words.count { socket = words[index + 1] }
            if word.hasPrefix("--socket=") { socket = String(word.dropFirst("--socket=".count)) }
        }
        return try? VarlinkClient(socketPath: GlobalOptions.socketPath(socket))
    }

    /// The names of everyone on the terminal starting with `prefix` (admins only).
    static func people(_ words: [String], prefix: String) -> [String] {
        guard let client = client(words),
            let reply = try? client.call("io.kioskauth.ListPeople", Message.Empty(), as: Message.People.self)
        else { return [] }
        return reply.people.map(\.name).filter { $0.hasPrefix(prefix) && SafeText.escaped($0) == $0 }
    }

    /// The enrolled fingers of the person the command line names (admins, or that person).
    static func enrolledFingers(_ words: [String], prefix: String) -> [String] {
        // The person is the first word after the subcommands that is neither an option nor an
        // option's value: `finger remove NAME --finger <TAB>`.
        guard
            let start = words.indices.first(where: {
                words[$0] == "finger" && words.dropFirst($0 + 1).first == "remove"
            })
        else { return [] }
        var name: String?
        var index = start + 2
        while index < words.count {
            let word = words[index]
            if optionsWithValues.contains(word) {
                index += 2
                continue
            }
            if !word.hasPrefix("-") {
                name = word
                break
            }
            index += 1
        }
        guard let name, let client = client(words),
            let reply = try? client.call(
                "io.kioskauth.ListFingers", Message.Name(name: name), as: Message.Fingers.self)
        else { return [] }
        return reply.fingers.filter { $0.hasPrefix(prefix) && fingerNames.contains($0) }
    }
}

extension CompletionKind {
    /// People's login names, from the daemon.
    static var people: CompletionKind {
        .custom { words, _, prefix in ShellCompletion.people(words, prefix: prefix) }
    }

    /// The fingers enrolled for the person named on the command line, from the daemon.
    static var enrolledFingers: CompletionKind {
        .custom { words, _, prefix in ShellCompletion.enrolledFingers(words, prefix: prefix) }
    }
}
