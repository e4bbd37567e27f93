import ArgumentParser
import FoundationEssentials
import KioskAuthDaemon
import KioskAuthProtocol
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// kioskauthd: the fingerprint and passcode authentication daemon for shared terminals.
@main
struct KioskAuthD: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kioskauthd",
        abstract: "Fingerprint and passcode authentication for shared Linux terminals.",
        discussion: """
            Runs in the foreground. Under systemd it takes its socket from LISTEN_FDS, its store key \
            from $CREDENTIALS_DIRECTORY/kioskauth.store-key and reports readiness on NOTIFY_SOCKET. \
            See kioskauthd(8) and kioskauthd.conf(5).
            """,
        version: KioskAuthVersion.string)

    @Option(help: "Configuration file; drop-ins are read from FILE.d/*.conf.")
    var config: String?

    @Option(help: "State directory (default: $STATE_DIRECTORY, else /var/lib/kioskauth).")
    var stateDirectory: String?

    @Option(help: "Runtime directory (default: $RUNTIME_DIRECTORY, else /run/kioskauth).")
    var runtimeDirectory: String?

    @Option(help: "Socket path to bind when not socket-activated (default: RUNTIME_DIRECTORY/io.kioskauth).")
    var socket: String?

    @Flag(help: "Development only: keep the store key in a file in the state directory, created if needed.")
    var developmentKeyFile = false

    @Flag(
        help:
            "Start even though the store is missing, emptied or behind its audit head anchor (rolled back, or acknowledged writes lost); writes a fresh anchor and audits store.rollback.accepted with what was lost."
    )
    var acceptStoreRollback = false

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: String?

    func validate() throws {
        if let logLevel, Logger.Level(rawValue: logLevel) == nil {
            throw ValidationError("unknown log level \(logLevel)")
        }
    }

    func run() async throws {
        // Everything the daemon creates (database, WAL, key file) is private to it.
        umask(0o077)
        let level = logLevel.flatMap(Logger.Level.init(rawValue:)) ?? .info
        let journal = JournalSocket.fromEnvironment()
        LoggingSystem.bootstrap { label in
            var handler = JournalLogHandler(label: label, native: journal)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: "kioskauthd")
        logger.logLevel = level
        let paths = DaemonPaths(
            configuration: config, stateDirectory: stateDirectory, runtimeDirectory: runtimeDirectory, socket: socket)
        do {
            try await Daemon.run(
                paths: paths, developmentKeyFile: developmentKeyFile, acceptStoreRollback: acceptStoreRollback,
                logger: logger)
        } catch let error as StartupError {
            let line = Array("kioskauthd: \(error.message)\n".utf8)
            _ = line.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
            throw ExitCode(error.exitCode)
        }
    }
}
