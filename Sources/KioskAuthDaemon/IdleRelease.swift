import CKioskAuthSystem
import Glibc
import Logging
import ServiceLifecycle
import Synchronization

/// Hands back what an idle daemon holds only because it once ran: the pages of code and
/// constants that start-up, or the last burst of calls, mapped in, and the allocator's free
/// memory. Once when start-up's own work is done (the store sweep), as the kernel frees its
/// init code after boot, and again each time the socket has had no call for `quiet`.
///
/// Code and constants are read-only pages of the program's and its libraries' files: unmapping
/// them (`kioskauth_release_mapped_code`) loses nothing, since each holds what its file holds,
/// and leaves them in the page cache, so the next call that runs one maps it again with a
/// minor fault, without reading the disk. What the process holds resident then is what
/// idling touches (the event loop, timers) plus its own data, not everything it ever ran; the
/// pages no process maps are the first the kernel reclaims when memory runs short.
/// docs/footprint.md measures both sides: the resident memory handed back, and what the first
/// unlock after a release costs.
final class IdleRelease: Sendable {
    /// Seconds without a call before a release (0: never, start-up's release included).
    let quiet: Duration?
    /// Calls seen so far (immediate ones included).
    private let calls = Atomic<UInt64>(0)
    /// Set while the service waits for the next call; that call clears it and wakes the service.
    private let waiting = Atomic<Bool>(false)
    private let wakeups: AsyncStream<Void>
    private let wake: AsyncStream<Void>.Continuation
    /// How long start-up's release waits without a call after the store sweep (less when
    /// `quiet` is shorter).
    static let settle: Duration = .seconds(1)

    init(quietSeconds: Double) {
        quiet = quietSeconds > 0 ? .milliseconds(Int64(quietSeconds * 1000)) : nil
        (wakeups, wake) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// Counts a call; the first after a release wakes the service. Two atomic operations.
    func callSeen() {
        calls.add(1, ordering: .sequentiallyConsistent)
        if waiting.load(ordering: .sequentiallyConsistent),
            waiting.exchange(false, ordering: .sequentiallyConsistent)
        {
            wake.yield()
        }
    }

    /// Releases now. Says what it handed back only at debug level: formatting the line would map
    /// in again much of what the release just handed back.
    func release(reason: String, logger: Logger) {
        var report = kioskauth_release_report()
        kioskauth_release_idle_memory(&report)
        if report.error != 0 {
            logger.warning(
                "idle memory release refused for part of the code",
                metadata: ["reason": "\(reason)", "error": "\(String(cString: strerror(report.error)))"])
        }
        logger.debug(
            "idle memory released",
            metadata: [
                "reason": "\(reason)", "file_kib": "\(report.file_kib_before)->\(report.file_kib_after)",
                "other_kib": "\(report.other_kib_before)->\(report.other_kib_after)",
                "unmapped_kib": "\(report.advised / 1024)",
            ])
    }

    /// Waits, after start-up's release, for a call, then for `quiet` without one, and releases;
    /// again and again until shutdown. Sleeps without a timer while no call comes.
    func run(startupDone: AsyncStream<Void>, logger: Logger) async {
        guard let quiet else { return }
        for await _ in startupDone.cancelOnGracefulShutdown() {}
        await withGracefulShutdownHandler {
            // Start-up's release waits for the services' first steps too (the reader's first
            // events, the first timers), and for a moment without calls.
            guard var released = await quietFor(min(quiet, Self.settle)) else { return }
            release(reason: "start-up", logger: logger)
            var next = wakeups.makeAsyncIterator()
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                // Armed before the count is read again: a call between the release and here is
                // seen by one or the other.
                waiting.store(true, ordering: .sequentiallyConsistent)
                if calls.load(ordering: .sequentiallyConsistent) == released {
                    guard await next.next() != nil else { return }  // finished: shutting down
                } else {
                    waiting.store(false, ordering: .sequentiallyConsistent)
                }
                guard let seen = await quietFor(quiet) else { return }
                release(reason: "idle", logger: logger)
                released = seen
            }
        } onGracefulShutdown: {
            self.wake.finish()
        }
    }

    /// Returns once no call has started for `duration` (the calls counted then), or nil when
    /// the daemon shuts down meanwhile.
    private func quietFor(_ duration: Duration) async -> UInt64? {
        var seen: UInt64
        repeat {
            seen = calls.load(ordering: .sequentiallyConsistent)
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: duration) }
            } catch {
                return nil
            }
        } while calls.load(ordering: .sequentiallyConsistent) != seen
        return seen
    }
}

/// Runs `IdleRelease` as a service of the daemon's group.
struct IdleReleaseService: Service {
    let release: IdleRelease
    /// Ends when start-up's own work (the store sweep) has ended.
    let startupDone: AsyncStream<Void>
    let logger: Logger

    func run() async throws {
        await release.run(startupDone: startupDone, logger: logger)
        // Stay until the group shuts down: a service that ends on its own while a shutdown is
        // under way is an error to the service group.
        try? await gracefulShutdown()
    }
}
