import CKioskAuthSystem
import Glibc
import Logging
import Synchronization

/// A passcode hash runs above the rest of the daemon: while a worker hashes, its thread's nice
/// value is `[Store] PasscodeHashPriority` steps (10 by default) below the daemon's own (its main
/// thread's, which the unit's `Nice=` sets), and it is set back to what it was before the caller
/// resumes.
///
/// Why: on a terminal with few processors, a flood of socket calls (32 connections of GetStatus,
/// say) keeps the event loop and its clients busy on every processor, and a passcode unlock's
/// hash then got a third to a half of a processor and took up to two or three times as long. At
/// nice −10 the kernel weighs the hash at 9548 against 1024 for each thread at nice 0 in the same
/// scheduling group. (Under systemd the daemon is a group of its own, a cgroup or an autogroup,
/// so there the hash is weighed against the daemon's own threads, not against other programs.)
///
/// Bounded: only a hash that runs on its worker's thread alone is raised (Argon2id's parallelism
/// 1, the default; a hash on more lanes would start threads that inherit the value), and only
/// when the pool has fewer workers than the processors, so raised threads never take every
/// processor.
///
/// Only the hash is raised. Threads inherit their creator's nice value, so nothing else may run
/// on the raised thread: a continuation resumed from it could start a thread at −10. The worker
/// is set back before it resumes the caller, and raising a nice value needs no privilege, so
/// that cannot fail short of a security module. Lowering it does: CAP_SYS_NICE, or an
/// RLIMIT_NICE that reaches the value (the unit sets `LimitNICE=-10`; a lower limit is used as
/// far as it goes). Without either, hashes run at the daemon's own priority, said once.
final class HashingPriority: Sendable {
    /// The daemon's nice value, and the one a hash asks for.
    let base: Int32
    let raised: Int32
    private let logger: Logger
    /// Set once raising was refused: hashes run unraised from then on.
    private let refused = Atomic<Bool>(false)

    /// Raises hashes by `steps` from the daemon's nice value; nil when `steps` is 0, when there
    /// is nothing below the daemon's value, or when `workers` would leave no processor of
    /// `processors` unraised (logged).
    init?(steps: Int, workers: Int, processors: Int, logger: Logger) {
        let base = kioskauth_thread_nice(getpid())
        guard steps > 0, base != Int32.min, base > -20 else { return nil }
        guard workers < processors else {
            logger.info(
                "passcode hashes run at the daemon's own priority: \(workers) hashing workers would leave no processor of \(processors) to the rest ([Store] PasscodeHashPriority, PasscodeHashWorkers)"
            )
            return nil
        }
        self.base = base
        self.raised = max(-20, base - Int32(steps))
        self.logger = logger
    }

    /// On a worker, before a hash on `lanes` threads: its thread's nice value before it was
    /// raised, or nil when it was not (a hash on more than one lane never is).
    func raise(lanes: Int) -> Int32? {
        guard lanes == 1, !refused.load(ordering: .relaxed) else { return nil }
        let thread = kioskauth_thread_id()
        let previous = kioskauth_thread_nice(thread)
        guard previous != Int32.min, previous > raised else { return nil }
        var result = kioskauth_set_thread_nice(thread, raised)
        if result == -EACCES {
            let floor = kioskauth_nice_floor()  // as far as RLIMIT_NICE goes
            if floor > raised, floor < previous { result = kioskauth_set_thread_nice(thread, floor) }
        }
        if result == 0 { return previous }
        if !refused.exchange(true, ordering: .relaxed) {
            let why =
                result == -EACCES
                ? "a nice value of \(raised) needs CAP_SYS_NICE or LimitNICE=\(raised < 0 ? "" : "+")\(raised)"
                : "setpriority was refused (a system-call filter or a security module)"
            logger.info(
                "passcode hashes run at the daemon's own priority: \(why) ([Store] PasscodeHashPriority)",
                metadata: ["errno": "\(-result)"])
        }
        return nil
    }

    /// After a raised hash, before the caller resumes: back to `previous`.
    func lower(to previous: Int32) {
        let thread = kioskauth_thread_id()
        let result = kioskauth_set_thread_nice(thread, previous)
        guard result != 0 else { return }
        refused.store(true, ordering: .relaxed)
        logger.warning(
            "a passcode hashing thread could not return to its priority",
            metadata: ["errno": "\(-result)", "nice": "\(kioskauth_thread_nice(thread))"])
    }
}
