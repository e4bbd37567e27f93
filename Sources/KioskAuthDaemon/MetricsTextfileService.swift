import FoundationEssentials
import KioskAuthStore
import Logging
import ServiceLifecycle

#if canImport(Glibc)
    import Glibc
#endif

/// Writes the metrics exposition to `[Metrics] TextfilePath=` every `TextfileIntervalSec=`, for
/// node_exporter's textfile collector, and once more at shutdown.
///
/// Atomically: a temporary file in the same directory, written in full, fsynced, made 0644
/// (the daemon's umask is 077; the collector runs as another user), then renamed over the
/// target, so the collector never reads half a file. A write that fails is logged and retried
/// at the next interval; it never stops the daemon.
struct MetricsTextfileService: Service {
    let authority: Authority
    let path: String
    let interval: Duration
    let logger: Logger
    let wakeup = Wakeup()

    func run() async throws {
        await withGracefulShutdownHandler {
            var failing = false
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                failing = await writeOnce(reportingRecovery: failing)
                await wakeup.wait(upTo: interval)
            }
        } onGracefulShutdown: {
            wakeup.signal()
        }
        _ = await writeOnce(reportingRecovery: false)
    }

    /// Writes the file; returns whether it failed (errors are logged once until it works again).
    private func writeOnce(reportingRecovery failing: Bool) async -> Bool {
        let text = await authority.metricsExposition()
        do {
            try Self.writeAtomically(Array(text.utf8), to: path)
            if failing { logger.notice("metrics textfile written again", metadata: ["path": "\(path)"]) }
            return false
        } catch {
            if !failing {
                logger.error("cannot write the metrics textfile", metadata: ["path": "\(path)", "error": "\(error)"])
            }
            return true
        }
    }

    struct WriteError: Error, CustomStringConvertible {
        var step: String
        var code: Int32
        var description: String { "\(step): \(String(cString: strerror(code)))" }
    }

    /// Replaces `path` with `bytes` (mode 0644) so that readers see the old or the new file.
    static func writeAtomically(_ bytes: [UInt8], to path: String) throws {
        let temporary = path + ".tmp-\(getpid())"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o644)
        guard fd >= 0 else { throw WriteError(step: "open \(temporary)", code: errno) }
        var done = false
        defer {
            if !done { unlink(temporary) }
        }
        do {
            defer { close(fd) }
            var offset = 0
            while offset < bytes.count {
                let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, bytes.count - offset) }
                if written < 0 {
                    if errno == EINTR { continue }
                    throw WriteError(step: "write", code: errno)
                }
                offset += written
            }
            guard fchmod(fd, 0o644) == 0 else { throw WriteError(step: "fchmod", code: errno) }
            guard fsync(fd) == 0 else { throw WriteError(step: "fsync", code: errno) }
        }
        guard rename(temporary, path) == 0 else { throw WriteError(step: "rename", code: errno) }
        done = true
        // The rename itself survives a crash once the directory is synced.
        let directory = open(directoryName(of: path), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directory >= 0 {
            _ = fsync(directory)
            close(directory)
        }
    }
}
