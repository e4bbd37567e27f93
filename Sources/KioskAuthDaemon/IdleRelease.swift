import CKioskAuthSystem
import Dispatch
import FoundationEssentials
import Glibc
import Logging
import ServiceLifecycle
import Synchronization

/// Hands back what an idle daemon holds only because it once ran: the pages of code and
/// constants that start-up, or the last burst of calls, mapped in, and the allocator's free
/// memory. Once start-up's own work is done (the store sweep) and a second has passed without a
/// call, as the kernel frees its init code after boot; again each time `quiet` has passed since
/// a call last began or ended or sent a progress reply; and when background work (a fleet poll,
/// a refresh) has mapped a megabyte or more back in and no call came within `quiet`.
///
/// A call that only waits (a subscription to events, a walk-up scan waiting for any touch,
/// which a greeter keeps open for good) does not hold a release off: holding off while any call
/// is open would mean never releasing on a walk-up kiosk. The touch that ends such a wait then
/// maps the matching code in again, about a millisecond (docs/footprint.md).
///
/// The pages are the read-only segments of the program's and its libraries' files, unmapped
/// with `kioskauth_release_idle_memory`, which leaves every page the process has a private copy
/// of. They stay in the page cache: the next call that runs one maps it again with a minor
/// fault while the cache holds it. What changes is what the process maps: its resident set
/// (VmRSS, PSS) is then what idling touches (the event loop, timers) and its own data, not
/// everything it ever ran. The system's memory is not freed by that alone: the pages are freed
/// when the kernel reclaims cache, where pages nothing maps go first. The cost is that after
/// such a reclaim, the first unlock reads its code from the disk again. docs/footprint.md
/// ("Idle release") measures both sides (`bench/idle_release.py`).
final class IdleRelease: Sendable {
    /// How long without a call before a release (nil: never, start-up's release included).
    let quiet: Duration?
    /// Calls begun or ended so far (immediate ones included).
    private let calls = Atomic<UInt64>(0)
    /// When the last call began or ended (nanoseconds of `DispatchTime`'s uptime clock).
    private let lastCall = Atomic<UInt64>(0)
    /// Set while the service waits for the next call; that call clears it and wakes the service.
    private let waiting = Atomic<Bool>(false)
    /// Whether a refused release was already said (once is enough).
    private let refusalSaid = Atomic<Bool>(false)
    /// File-backed resident KiB just after the last release and what it logged (-1: none yet).
    private let lastRelease = Atomic<Int>(-1)
    /// One release at a time (after calls, after background work).
    private let releasing = Mutex(())
    /// Growth of file-backed resident memory since the last release that background work must
    /// have caused for a release of its own.
    static let regrowthKiB = 1024
    /// How long, and within how much, background work's figure must hold still before it is
    /// released: a release under work still mapping code in is undone at once.
    static let stillFor: Duration = .milliseconds(100)
    static let stillKiB = 64
    private let wakeups: AsyncStream<Void>
    private let wake: AsyncStream<Void>.Continuation
    /// How long start-up's release waits without a call after the store sweep (less when
    /// `quiet` is shorter).
    static let settle: Duration = .seconds(1)

    init(quiet: Duration?) {
        self.quiet = quiet
        (wakeups, wake) = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    /// The configured wait: `[Daemon] IdleReleaseSec` (0: never). Debug builds take a shorter
    /// one from `KIOSKAUTH_TEST_IDLE_RELEASE_SECONDS`, for tests that need many releases.
    static func quiet(seconds: Double) -> Duration? {
        var seconds = seconds
        #if DEBUG
            if let override = testHookSeconds("KIOSKAUTH_TEST_IDLE_RELEASE_SECONDS") { seconds = override }
        #endif
        return seconds > 0 ? .nanoseconds(Int64(seconds * 1e9)) : nil
    }

    /// Counts a call beginning or ending; the first after a release wakes the service. Reads the
    /// clock and does three atomic operations.
    func callSeen() {
        lastCall.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)
        calls.add(1, ordering: .sequentiallyConsistent)
        if waiting.load(ordering: .sequentiallyConsistent),
            waiting.exchange(false, ordering: .sequentiallyConsistent)
        {
            wake.yield()
        }
    }

    /// Releases now (one at a time). Says what it handed back only at debug level: formatting the
    /// line would map in again much of what the release just handed back.
    func release(reason: String, logger: Logger) {
        let report = releasing.withLock { _ in
            var report = kioskauth_release_report()
            kioskauth_release_idle_memory(&report)
            return report
        }
        if report.error != 0, !refusalSaid.exchange(true, ordering: .relaxed) {
            logger.warning(
                "idle memory release incomplete (said once)",
                metadata: ["reason": "\(reason)", "error": "\(String(cString: strerror(report.error)))"])
        }
        logger.debug(
            "idle memory released",
            metadata: [
                "reason": "\(reason)", "file_kib": "\(report.file_kib_before)->\(report.file_kib_after)",
                "other_kib": "\(report.other_kib_before)->\(report.other_kib_after)",
                "unmapped_kib": "\(report.advised / 1024)", "elapsed_us": "\(report.elapsed_us)",
            ])
        // The baseline for background work's regrowth, read after the lines above: what writing
        // them mapped in must not look like background work (at debug level, a release each time).
        lastRelease.store(kioskauth_resident_file_kib(), ordering: .relaxed)
    }

    /// Releases once start-up has settled, then after each call (`afterCalls`), and after
    /// background work that mapped code in (`afterBackgroundWork`), until shutdown.
    func run(startupDone: AsyncStream<Void>, logger: Logger) async {
        guard let quiet else { return }
        for await _ in startupDone.cancelOnGracefulShutdown() {}
        lastCall.store(DispatchTime.now().uptimeNanoseconds, ordering: .relaxed)  // settles from here
        await withGracefulShutdownHandler {
            await withTaskGroup(of: Void.self) { group in
                group.addTask { await self.afterCalls(quiet: quiet, logger: logger) }
                group.addTask { await self.afterBackgroundWork(quiet: quiet, logger: logger) }
            }
        } onGracefulShutdown: {
            self.wake.finish()
        }
    }

    /// Start-up's release, then: waits for a call, then for `quiet` without one, and releases.
    /// Sleeps without a timer while no call comes.
    private func afterCalls(quiet: Duration, logger: Logger) async {
        // Start-up's release waits for the services' first steps too (the reader's first
        // events, the first timers), and for a moment without calls.
        guard await quietFor(min(quiet, Self.settle)) else { return }
        var released = calls.load(ordering: .sequentiallyConsistent)
        release(reason: "start-up", logger: logger)
        var next = wakeups.makeAsyncIterator()
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            // Armed before the count is read again: a call between the release and here is
            // seen by one or the other. If a call has disarmed it, its wake-up is on its way (or
            // here): taken now, so that it cannot end a later wait with no call behind it.
            waiting.store(true, ordering: .sequentiallyConsistent)
            if calls.load(ordering: .sequentiallyConsistent) == released
                || !waiting.exchange(false, ordering: .sequentiallyConsistent)
            {
                guard await next.next() != nil else { return }  // finished: shutting down
            }
            guard await quietFor(quiet) else { return }
            released = calls.load(ordering: .sequentiallyConsistent)
            release(reason: "idle", logger: logger)
        }
    }

    /// What no call wakes: a fleet poll, a token refresh or probe, the metrics file, a reader
    /// plugged in map code in too. Every `quiet`, once start-up's release is done: when the
    /// file-backed resident memory has grown by `Self.regrowth` since the last release and no
    /// call came within `quiet`, releases again. One wake-up per `quiet` (30 s).
    private func afterBackgroundWork(quiet: Duration, logger: Logger) async {
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: quiet) }
            } catch {
                return
            }
            let after = lastRelease.load(ordering: .relaxed)
            guard after >= 0, untilQuiet(nanoseconds(quiet)) == 0 else { continue }
            let grown = kioskauth_resident_file_kib()
            guard grown - after >= Self.regrowthKiB else { continue }
            // The work may still be running and mapping code in (the metrics file being
            // written): released under it, its pages fault straight back. Only once the figure
            // holds still for a moment; else the next round looks again.
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: Self.stillFor) }
            } catch {
                return
            }
            guard kioskauth_resident_file_kib() - grown < Self.stillKiB, untilQuiet(nanoseconds(quiet)) == 0 else {
                continue
            }
            release(reason: "background", logger: logger)
        }
    }

    /// Returns true once `duration` has passed since the last call began or ended, false when
    /// the daemon shuts down meanwhile.
    private func quietFor(_ duration: Duration) async -> Bool {
        let span = nanoseconds(duration)
        while true {
            let left = untilQuiet(span)
            if left == 0 { return true }
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: .nanoseconds(Int64(left))) }
            } catch {
                return false
            }
        }
    }

    /// Nanoseconds until `span` will have passed since the last call began or ended (0: it has).
    private func untilQuiet(_ span: UInt64) -> UInt64 {
        let due = lastCall.load(ordering: .relaxed) + span
        let now = DispatchTime.now().uptimeNanoseconds
        return now >= due ? 0 : due - now
    }

    private func nanoseconds(_ duration: Duration) -> UInt64 {
        UInt64(duration.components.seconds) * 1_000_000_000 + UInt64(duration.components.attoseconds / 1_000_000_000)
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
