import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

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
            Activation.self, Lockout.self, Audit.self, SessionCommand.self, Login.self, MetricsCommand.self,
            FleetCommand.self,
        ])

    /// Runs the command; usage errors exit 2, failures print one line and exit 1.
    static func main() {
        do {
            var command = try parseAsRoot(globalOptionsLast(Array(CommandLine.arguments.dropFirst())))
            try command.run()
        } catch let error as VarlinkClientError {
            writeStandardError("kioskauthctl: \(safe(describe(error)))\n")
            Glibc.exit(1)
        } catch {
            let code = exitCode(for: error)
            if code == .validationFailure {
                writeStandardError(fullMessage(for: error) + "\n")
                Glibc.exit(2)
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
                retry = oneDecimal(seconds)
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
