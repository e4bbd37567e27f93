import CKioskAuthSystem
import Logging
import Synchronization

/// Argon2id runs above the rest of the daemon: while a worker hashes a passcode, its thread's
/// nice value is `[Store] PasscodeHashPriority` steps (10 by default) below the daemon's own, and
/// it is set back before the caller resumes.
///
/// Why: on a terminal with few processors, a flood of socket calls (32 connections of GetStatus,
/// say) keeps the event loop and its clients busy on every processor, and a passcode unlock's
/// hash then got a third to a half of a processor and took up to two or three times as long. At
/// nice −10 the kernel weighs the hash at 9548 against 1024 for each thread at nice 0, so it runs
/// at nearly its unloaded speed; the pool runs at most processors − 1 hashes, so a passcode storm
/// still leaves a processor to everything else.
///
/// Only the hash is raised. Threads inherit their creator's nice value, so nothing else may run
/// on the raised thread: a continuation resumed from it could start a thread of the cooperative
/// pool at −10 for good. The worker is set back to the daemon's value before it resumes the
/// caller, and raising a nice value needs no privilege, so that cannot fail. Lowering it does:
/// CAP_SYS_NICE, or an RLIMIT_NICE that reaches the value (the unit sets `LimitNICE=-10`).
/// Without either, hashes run at the daemon's own priority, as before, and a line says so once.
final class HashingPriority: Sendable {
    /// The daemon's nice value, and the one a hash runs at.
    let base: Int32
    let raised: Int32
    private let logger: Logger
    /// Set once raising was refused: hashes run at `base` from then on.
    private let refused = Atomic<Bool>(false)

    /// Raises hashes by `steps` from the calling thread's nice value; nil when `steps` is 0 or
    /// there is nothing below the calling thread's value.
    init?(steps: Int, logger: Logger) {
        let base = kioskauth_thread_nice(kioskauth_thread_id())
        guard steps > 0, base != Int32.min, base > -20 else { return nil }
        self.base = base
        self.raised = max(-20, base - Int32(steps))
        self.logger = logger
    }

    /// On a worker, before a hash: true when its thread now runs at `raised`.
    func raise() -> Bool {
        guard !refused.load(ordering: .relaxed) else { return false }
        let result = kioskauth_set_thread_nice(kioskauth_thread_id(), raised)
        if result == 0 { return true }
        if !refused.exchange(true, ordering: .relaxed) {
            logger.info(
                "passcode hashes run at the daemon's own priority: a nice value of \(raised) needs CAP_SYS_NICE or LimitNICE=\(raised < 0 ? "" : "+")\(raised) ([Store] PasscodeHashPriority)",
                metadata: ["errno": "\(-result)"])
        }
        return false
    }

    /// After a raised hash, before the caller resumes: back to the daemon's value.
    func lower() {
        let result = kioskauth_set_thread_nice(kioskauth_thread_id(), base)
        guard result != 0 else { return }
        refused.store(true, ordering: .relaxed)
        logger.warning(
            "a passcode hashing thread could not return to the daemon's priority",
            metadata: ["errno": "\(-result)", "nice": "\(kioskauth_thread_nice(kioskauth_thread_id()))"])
    }
}
