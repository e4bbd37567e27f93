import CKioskAuthSystem
import Dispatch
import FoundationEssentials
import KioskAuthDaemon
import KioskAuthProtocol
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// kioskauthd: the fingerprint and passcode authentication daemon for shared terminals.
@main
enum KioskAuthD {
    /// Not `async`: an async `main` hands the main thread to `dispatch_main`, which ends it with
    /// `pthread_exit`, and that unwinds the main thread's stack through the unwind tables: a
    /// megabyte of `.eh_frame_hdr` and `.eh_frame` became resident for it, in every daemon, at
    /// every start. The main thread waits for the daemon here instead.
    static func main() {
        let options: DaemonCommandLine
        do {
            switch try DaemonCommandLine.parse(Array(CommandLine.arguments.dropFirst())) {
            case .help:
                print(DaemonCommandLine.help, terminator: "")
                return
            case .version:
                print(KioskAuthVersion.string)
                return
            case .run(let parsed):
                options = parsed
            }
        } catch {
            fail(DaemonCommandLine.usageMessage(error), status: 64)  // EX_USAGE
        }
        // Before any other thread runs: the part of .bss a start touches, resident in one call
        // instead of a page fault (often two) for each of its pages (docs/footprint.md).
        let hotBSS = kioskauth_populate_hot_bss()
        let finished = DispatchSemaphore(value: 0)
        Task.detached {
            await run(options, hotBSS: hotBSS)
            finished.signal()
        }
        finished.wait()
    }

    static func run(_ options: DaemonCommandLine, hotBSS: Int) async {
        // Everything the daemon creates (database, WAL, key file) is private to it.
        umask(0o077)
        let level = options.logLevel.flatMap(Logger.Level.init(rawValue:)) ?? .info
        let journal = JournalSocket.fromEnvironment()
        LoggingSystem.bootstrap { label in
            var handler = JournalLogHandler(label: label, native: journal)
            handler.logLevel = level
            return handler
        }
        var logger = Logger(label: "kioskauthd")
        logger.logLevel = level
        let paths = DaemonPaths(
            configuration: options.config, stateDirectory: options.stateDirectory,
            runtimeDirectory: options.runtimeDirectory, socket: options.socket)
        do {
            try await Daemon.run(
                paths: paths, developmentKeyFile: options.developmentKeyFile,
                acceptStoreRollback: options.acceptStoreRollback, hotBSS: hotBSS, logger: logger)
        } catch let error as StartupError {
            fail("kioskauthd: \(error.message)\n", status: error.exitCode)
        } catch {
            fail("kioskauthd: \(error)\n", status: 1)
        }
    }

    /// Writes `message` to standard error and exits with `status`.
    static func fail(_ message: String, status: Int32) -> Never {
        let bytes = Array(message.utf8)
        _ = bytes.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
        exit(status)
    }
}
