import FoundationEssentials

/// Argon2id runs here: a fixed number of worker threads (by default one fewer than the cores, at
/// least one) and a bounded queue. A passcode storm can then use at most those workers, never
/// every core: the event loop, the authority and fingerprint matching keep a core, so status
/// calls and fingerprint unlocks are not starved. When the workers are busy and the queue is full
/// a new hash is refused at once (`Busy`), before it costs anything (a refused check is no
/// failed attempt), instead of waiting behind work it cannot overtake.
///
/// A job whose caller went away before a worker took it is dropped, so a client that sends a
/// passcode and disconnects costs no hash.
public final class HashingPool: @unchecked Sendable {
    /// The queue is full: the call is refused, not queued.
    struct Full: Error {
        /// Hashes running and waiting when it was refused.
        var pending: Int
        /// A rough wait before retrying: one hash per worker ahead in the queue.
        var retryAfter: Double
    }

    /// A place in the pool, taken before any state changes that only a hash would undo.
    final class Permit: @unchecked Sendable {
        fileprivate weak var pool: HashingPool?
        fileprivate var used = false

        fileprivate init(pool: HashingPool) { self.pool = pool }

        deinit {
            if !used { pool?.release() }
        }
    }

    private final class Job {
        let work: () -> Void
        let cancel: () -> Void
        var cancelled = false
        init(work: @escaping () -> Void, cancel: @escaping () -> Void) {
            self.work = work
            self.cancel = cancel
        }
    }

    let workers: Int
    let queueLimit: Int
    private let condition = ConditionLock()
    /// Permits out (taken and not yet finished): running, queued, or about to be queued.
    private var pending = 0
    private var queue: [Job] = []
    private var head = 0
    private var stopped = false
    private var isStarted = false
    /// Seconds one hash took most recently (a hint for `retryAfter`).
    private var lastDuration = 0.1

    /// One fewer than the processors online, at least one.
    static var defaultWorkers: Int { max(1, ProcessInfo.processInfo.activeProcessorCount - 1) }

    public init(workers: Int, queueLimit: Int) {
        self.workers = max(1, workers)
        self.queueLimit = max(0, queueLimit)
    }

    func start() {
        condition.lock()
        defer { condition.unlock() }
        guard !isStarted else { return }
        isStarted = true
        for index in 0..<workers {
            startThread(name: "argon2-\(index)") { [self] in workerLoop() }
        }
    }

    /// Takes a place for one hash, or throws `Full` when `workers` hashes run and `queueLimit`
    /// wait.
    func reserve() throws(Full) -> Permit {
        condition.lock()
        defer { condition.unlock() }
        guard !stopped, pending < workers + queueLimit else {
            let ahead = max(0, pending - workers + 1)
            throw Full(
                pending: pending,
                retryAfter: (lastDuration * Double(ahead) / Double(workers) * 1000).rounded(.up) / 1000)
        }
        pending += 1
        return Permit(pool: self)
    }

    /// Runs `body` on a worker with a place taken by `reserve()`.
    func run<T: Sendable>(_ permit: Permit, _ body: @escaping @Sendable () throws -> T) async throws -> T {
        permit.used = true
        let box = JobBox()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                let job = Job(
                    work: { [self] in
                        let started = ContinuousClock.now
                        let result = Result { try body() }
                        let elapsed = ContinuousClock.now - started
                        condition.lock()
                        lastDuration =
                            Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                        condition.unlock()
                        continuation.resume(with: result)
                    }, cancel: { continuation.resume(throwing: CancellationError()) })
                condition.lock()
                if stopped || Task.isCancelled {
                    pending -= 1
                    condition.unlock()
                    continuation.resume(throwing: CancellationError())
                    return
                }
                queue.append(job)
                box.job = job
                condition.signal()
                condition.unlock()
            }
        } onCancel: {
            condition.lock()
            box.job?.cancelled = true
            condition.unlock()
        }
    }

    /// Reserves and runs: `Full` when the queue is full.
    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await run(try reserve(), body)
    }

    /// Stops taking work; queued jobs are cancelled, running ones finish.
    func shutdown() {
        condition.lock()
        stopped = true
        let dropped = queue[head...]
        queue = []
        head = 0
        pending -= dropped.count
        condition.broadcast()
        condition.unlock()
        for job in dropped { job.cancel() }
    }

    fileprivate func release() {
        condition.lock()
        pending -= 1
        condition.unlock()
    }

    private final class JobBox: @unchecked Sendable {
        var job: Job?
    }

    private func workerLoop() {
        while true {
            condition.lock()
            while head == queue.count && !stopped { condition.wait() }
            if head == queue.count {
                condition.unlock()
                return
            }
            let job = queue[head]
            head += 1
            if head > 64, head * 2 > queue.count {
                queue.removeFirst(head)
                head = 0
            }
            let cancelled = job.cancelled
            condition.unlock()
            if cancelled {
                job.cancel()
            } else {
                job.work()
            }
            release()
        }
    }
}
