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

    /// Every option, once, in `--help`'s order: its name, the metavariable of its value (nil for
    /// a flag) and its line in `--help`. The parser reads only the names and metavariables; the
    /// help lines are built only for `--help` (a parse on the way to READY=1 formats nothing).
    private static let options: [(name: String, metavariable: String?)] = [
        ("config", "file"), ("state-directory", "directory"), ("runtime-directory", "directory"),
        ("socket", "path"), ("development-key-file", nil), ("accept-store-rollback", nil), ("log-level", "level"),
        ("version", nil), ("help", nil),
    ]

    private static func helpLine(_ name: String) -> String {
        switch name {
        case "config": "Configuration file; drop-ins are read from FILE.d/*.conf."
        case "state-directory": "State directory (default: $STATE_DIRECTORY, else /var/lib/kioskauth)."
        case "runtime-directory": "Runtime directory (default: $RUNTIME_DIRECTORY, else /run/kioskauth)."
        case "socket": "Socket path to bind when not socket-activated (default: RUNTIME_DIRECTORY/io.kioskauth)."
        case "development-key-file":
            "Development only: keep the store key in a file in the state directory, created if needed."
        case "accept-store-rollback":
            "Start even though the store is missing, emptied or behind its audit head anchor (rolled "
                + "back, or acknowledged writes lost); writes a fresh anchor and audits "
                + "store.rollback.accepted with what was lost."
        case "log-level": "Least severe messages to log: \(logLevels.joined(separator: ", ")) (default: info)."
        case "version": "Print the version and exit."
        default: "Show this help and exit (also -h)."
        }
    }

    /// Stores the value (nil for a flag) of the option `name`, which `options` lists.
    private mutating func set(_ name: String, _ value: String?) {
        switch name {
        case "config": config = value
        case "state-directory": stateDirectory = value
        case "runtime-directory": runtimeDirectory = value
        case "socket": socket = value
        case "development-key-file": developmentKeyFile = true
        case "accept-store-rollback": acceptStoreRollback = true
        case "log-level": logLevel = value
        default: break  // --version and --help are answered before they get here
        }
    }

    /// Parses the arguments after the program name. `--help` and `--version` win wherever they
    /// appear, as long as everything before them parsed.
    public static func parse(_ arguments: [String]) throws(UsageError) -> Request {
        var parsed = DaemonCommandLine()
        var given: Set<String> = []
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
            guard let option = options.first(where: { $0.name == name }) else {
                throw UsageError(message: "unknown option '--\(name)'")
            }
            guard given.insert(name).inserted else {
                throw UsageError(message: "option '--\(name)' given more than once")
            }
            guard let metavariable = option.metavariable else {
                if inline != nil { throw UsageError(message: "option '--\(name)' takes no value") }
                parsed.set(name, nil)
                continue
            }
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
            parsed.set(name, value)
        }
        if let level = parsed.logLevel, Logger.Level(rawValue: level) == nil {
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
            if let metavariable = option.metavariable { form += " <\(metavariable)>" }
            text += "  \(form)\n      \(helpLine(option.name))\n"
        }
        return text
    }

    /// What a usage error prints before exiting with EX_USAGE.
    public static func usageMessage(_ error: UsageError) -> String {
        "kioskauthd: \(error.message)\nUsage: kioskauthd [options]; see kioskauthd --help\n"
    }
}
