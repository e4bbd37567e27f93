import Logging

/// kioskauthd's command line, parsed by hand: eight options do not need a parser library, and
/// swift-argument-parser's first parse cost about a tenth of the daemon's start-up CPU (it walks
/// the command type through Mirror; docs/footprint.md, "Start-up").
///
/// GNU style, as kioskauthd(8) documents: `--name VALUE` or `--name=VALUE` for options with a
/// value, `--name` for flags, `--` ends the options. The daemon takes no positional arguments.
/// Arguments are taken as Swift decodes them (invalid UTF-8 becomes U+FFFD), as before.
public struct DaemonCommandLine: Equatable, Sendable {
    public var config: String?
    public var stateDirectory: String?
    public var runtimeDirectory: String?
    public var socket: String?
    public var developmentKeyFile = false
    public var acceptStoreRollback = false
    public var logLevel: String?

    /// What the command line asks for.
    public enum Request: Equatable, Sendable {
        case run(DaemonCommandLine)
        case help
        case version
    }

    /// A command line that cannot be obeyed; `message` names the argument at fault.
    public struct UsageError: Error, Equatable, Sendable {
        public var message: String
    }

    public init() {}

    /// The log levels `--log-level` accepts: swift-log's, by name.
    public static var logLevels: [String] { Logger.Level.allCases.map(\.rawValue) }

    /// One option: its name, where its value goes (none for `--help` and `--version`, which
    /// `parse` answers itself), and its line in `--help`.
    private struct Option {
        enum Target {
            case value(WritableKeyPath<DaemonCommandLine, String?>, metavariable: String)
            case flag(WritableKeyPath<DaemonCommandLine, Bool>?)
        }
        var name: String
        var target: Target
        var help: String
    }

    /// Every option, once: the parser, the usage errors and `--help` read this table. (Computed:
    /// key paths are not Sendable, so it cannot be a stored static.)
    private static var options: [Option] {
        [
            Option(
                name: "config", target: .value(\.config, metavariable: "file"),
                help: "Configuration file; drop-ins are read from FILE.d/*.conf."),
            Option(
                name: "state-directory", target: .value(\.stateDirectory, metavariable: "directory"),
                help: "State directory (default: $STATE_DIRECTORY, else /var/lib/kioskauth)."),
            Option(
                name: "runtime-directory", target: .value(\.runtimeDirectory, metavariable: "directory"),
                help: "Runtime directory (default: $RUNTIME_DIRECTORY, else /run/kioskauth)."),
            Option(
                name: "socket", target: .value(\.socket, metavariable: "path"),
                help: "Socket path to bind when not socket-activated (default: RUNTIME_DIRECTORY/io.kioskauth)."),
            Option(
                name: "development-key-file", target: .flag(\.developmentKeyFile),
                help: "Development only: keep the store key in a file in the state directory, created if needed."),
            Option(
                name: "accept-store-rollback", target: .flag(\.acceptStoreRollback),
                help: "Start even though the store is missing, emptied or behind its audit head anchor (rolled "
                    + "back, or acknowledged writes lost); writes a fresh anchor and audits "
                    + "store.rollback.accepted with what was lost."),
            Option(
                name: "log-level", target: .value(\.logLevel, metavariable: "level"),
                help: "Least severe messages to log: \(logLevels.joined(separator: ", ")) (default: info)."),
            Option(name: "version", target: .flag(nil), help: "Print the version and exit."),
            Option(name: "help", target: .flag(nil), help: "Show this help and exit (also -h)."),
        ]
    }

    /// Parses the arguments after the program name. `--help` and `--version` win wherever they
    /// appear, as long as everything before them parsed.
    public static func parse(_ arguments: [String]) throws(UsageError) -> Request {
        var parsed = DaemonCommandLine()
        var given: Set<String> = []
        let table = options  // built once: `options` is computed
        var index = arguments.startIndex
        while index < arguments.endIndex {
            let argument = arguments[index]
            index += 1
            if argument == "--" {
                if index < arguments.endIndex {
                    throw UsageError(message: "unexpected argument '\(arguments[index])'")
                }
                break
            }
            if argument == "-h" || argument == "--help" { return .help }
            if argument == "--version" { return .version }
            guard argument.hasPrefix("--"), argument.count > 2 else {
                throw UsageError(message: "unexpected argument '\(argument)'")
            }
            // Split on the first '=' as a code point: a combining mark after it is the value's.
            let body = argument.unicodeScalars.dropFirst(2)
            let name: String
            var inline: String?
            if let equals = body.firstIndex(of: "=") {
                name = String(Substring(body[..<equals]))
                inline = String(Substring(body[body.index(after: equals)...]))
            } else {
                name = String(Substring(body))
            }
            guard let option = table.first(where: { $0.name == name }) else {
                throw UsageError(message: "unknown option '--\(name)'")
            }
            guard given.insert(name).inserted else {
                throw UsageError(message: "option '--\(name)' given more than once")
            }
            switch option.target {
            case .flag(let key):
                if inline != nil { throw UsageError(message: "option '--\(name)' takes no value") }
                if let key { parsed[keyPath: key] = true }
            case .value(let key, let metavariable):
                if inline == nil {
                    // A separate value never starts with '-' (`--socket=-odd` can say it).
                    guard index < arguments.endIndex, !arguments[index].hasPrefix("-") else {
                        throw UsageError(message: "missing value for '--\(name) <\(metavariable)>'")
                    }
                    inline = arguments[index]
                    index += 1
                }
                guard let value = inline, !value.isEmpty else {
                    throw UsageError(message: "empty value for '--\(name)'")
                }
                parsed[keyPath: key] = value
            }
        }
        if let level = parsed.logLevel, !logLevels.contains(level) {
            throw UsageError(message: "unknown log level \(level) (one of: \(logLevels.joined(separator: ", ")))")
        }
        return .run(parsed)
    }

    /// `--help`'s text, from the option table.
    public static var help: String {
        var text = """
            kioskauthd: fingerprint and passcode authentication for shared Linux terminals.

            Usage: kioskauthd [options]

            Runs in the foreground. Under systemd it takes its socket from LISTEN_FDS, its store key
            from $CREDENTIALS_DIRECTORY/kioskauth.store-key and reports readiness on NOTIFY_SOCKET.
            See kioskauthd(8) and kioskauthd.conf(5).

            Options:

            """
        for option in options {
            var form = "--\(option.name)"
            if case .value(_, let metavariable) = option.target { form += " <\(metavariable)>" }
            text += "  \(form)\n      \(option.help)\n"
        }
        return text
    }

    /// What a usage error prints before exiting with EX_USAGE.
    public static func usageMessage(_ error: UsageError) -> String {
        "kioskauthd: \(error.message)\nUsage: kioskauthd [options]; see kioskauthd --help\n"
    }
}
