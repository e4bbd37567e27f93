import CKioskAuthSystem
import Logging
import Synchronization

/// While Argon2id runs, the event loop's thread steps back: its nice value rises by
/// `[Store] PasscodeHashYield` steps (10 by default) as the first hash starts and returns as the
/// last one ends.
///
/// Why: on a terminal with few processors, a flood of socket calls (32 connections of GetStatus,
/// say) keeps the event loop and its clients busy on every processor, and a passcode unlock's
/// hash then gets a third of a processor instead of one, and takes two to three times as long.
/// Stepped back by 10, the event loop gets about a tenth of a processor it shares with a hash
/// (the kernel weighs nice 10 at 110 against nice 0 at 1024), so a hash runs at nearly its
/// unloaded speed, and the flood is served by the processors the pool leaves free (it runs at
/// most processors − 1 hashes). Nothing changes while no hash runs: the event loop is at the
/// daemon's own nice value then, so the replies of fingerprint unlocks and status calls are not
/// slowed by other programs, and the reply to the passcode call itself is written after the
/// hash, at full priority.
///
/// Only when the daemon can undo it: raising a nice value needs nothing, lowering it again needs
/// CAP_SYS_NICE or an RLIMIT_NICE that reaches the daemon's nice value (the unit sets
/// `LimitNICE=+0`). Without either, nothing is stepped back (a daemon stuck at nice 10 would be
/// worse than a slow hash under a flood), and a line says so at start.
final class HashingPriority: Sendable {
    private let thread: Int32
    private let base: Int32
    private let yielded: Int32
    private let logger: Logger
    /// Set after a `setpriority` failed: nothing is changed from then on.
    private let failed = Atomic<Bool>(false)

    private init(thread: Int32, base: Int32, yielded: Int32, logger: Logger) {
        self.thread = thread
        self.base = base
        self.yielded = yielded
        self.logger = logger
    }

    /// The priority control for event loop thread `thread`, or nil when `steps` is 0 or the
    /// daemon could not set the thread back to its nice value (logged).
    static func make(eventLoopThread thread: Int32, steps: Int, logger: Logger) -> HashingPriority? {
        guard steps > 0 else { return nil }
        let base = kioskauth_thread_nice(thread)
        guard base != Int32.min else { return nil }
        guard kioskauth_may_lower_nice_to(base) == 1 else {
            logger.info(
                "the event loop does not step back while passcodes are hashed: setting its nice value back needs CAP_SYS_NICE or LimitNICE=+\(base) ([Store] PasscodeHashYield)"
            )
            return nil
        }
        return HashingPriority(thread: thread, base: base, yielded: min(19, base + Int32(steps)), logger: logger)
    }

    /// The event loop's nice value now (for tests and the log).
    var current: Int32 { kioskauth_thread_nice(thread) }

    /// The first hash starts (`true`) or the last one ends (`false`). Called with the pool's
    /// lock held, so that the changes are made in the order of the transitions.
    func hashing(_ running: Bool) {
        guard !failed.load(ordering: .relaxed) else { return }
        let result = kioskauth_set_thread_nice(thread, running ? yielded : base)
        guard result != 0 else { return }
        failed.store(true, ordering: .relaxed)
        // Back to the daemon's own priority if it can be; from now on nothing is changed.
        let restored = running ? true : kioskauth_set_thread_nice(thread, base) == 0
        logger.warning(
            "the event loop no longer steps back while passcodes are hashed: setpriority failed",
            metadata: [
                "errno": "\(-result)", "nice": "\(kioskauth_thread_nice(thread))", "restored": "\(restored)",
            ])
    }
}
