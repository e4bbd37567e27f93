import FoundationEssentials
import KioskAuthFingerprint

/// Argon2id runs here: at most a fixed number of worker threads (by default one fewer than the
/// cores, at least one) and bounded queues. A passcode storm can then use at most those
/// workers, never every core: the event loop, the authority and fingerprint matching keep a
/// core, so status calls and fingerprint unlocks are not starved.
///
/// **Fair between callers.** Every hash belongs to a flow, the caller's uid. Each flow has its
/// own queue, and the workers take the next job from the flows in turn (round robin), so a
/// storm of hashes from one uid, over however many connections, costs any other caller at most
/// one of its hashes per worker before theirs: a job that joins the rotation waits behind at
/// most one job of each other flow with work queued, never behind a whole queue. Admission is
/// per flow too: a flow with `workers + queueLimit` hashes out is refused `Busy` at once, before
/// the attempt costs anything (a refused check is no failed attempt), while other flows are
/// still admitted. A connection has at most one call in progress, so what all flows together
/// queue is bounded by the socket's connection limits.
///
/// **Threads on demand.** No thread exists until the first hash; a worker is started when a job
/// finds none idle (up to `workers`), and one that has had nothing to do for `idleTimeout`
/// exits. An idle daemon holds no hashing thread.
///
/// A job whose caller went away before a worker took it is dropped, so a client that sends a
/// passcode and disconnects costs no hash.
public final class HashingPool: @unchecked Sendable {
    /// The caller's queue is full: the call is refused, not queued.
    struct Full: Error {
        /// The caller's hashes running and waiting when it was refused.
        var pending: Int
        /// A rough wait before retrying: one hash per worker ahead in the caller's queue.
        var retryAfter: Double
    }

    /// A place in the pool, taken before any state changes that only a hash would undo.
    final class Permit: @unchecked Sendable {
        fileprivate weak var pool: HashingPool?
        fileprivate let flow: Int
        fileprivate var used = false

        fileprivate init(pool: HashingPool, flow: Int) {
            self.pool = pool
            self.flow = flow
        }

        deinit {
            if !used { pool?.release(flow: flow) }
        }
    }

    private final class Job {
        let flow: Int
        let work: () -> Void
        let cancel: () -> Void
        var cancelled = false
        init(flow: Int, work: @escaping () -> Void, cancel: @escaping () -> Void) {
            self.flow = flow
            self.work = work
            self.cancel = cancel
        }
    }

    let workers: Int
    let queueLimit: Int
    /// How long a worker waits for work before its thread exits.
    let idleTimeout: Duration
    private let condition = ConditionLock()
    /// Permits out per flow (taken and not yet finished): running, queued, or about to be.
    private var pending: [Int: Int] = [:]
    /// Queued jobs per flow, oldest first.
    private var queues: [Int: [Job]] = [:]
    /// Flows with queued jobs, in the order the workers serve them.
    private var rotation: [Int] = []
    /// Jobs in all the queues.
    private var queued = 0
    private var stopped = false
    /// Worker threads alive, and how many of them wait for work.
    private var threadsAlive = 0
    private var threadsIdle = 0
    private var threadsStarted = 0
    /// Seconds one hash took most recently (a hint for `retryAfter`).
    private var lastDuration = 0.1
    /// What raises a worker's thread while it hashes.
    private let priority: HashingPriority?

    /// One fewer than the processors online (`activeProcessorCount`), at least one.
    static func defaultWorkers(processors: Int) -> Int { max(1, processors - 1) }

    init(workers: Int, queueLimit: Int, idleTimeout: Duration = .seconds(30), priority: HashingPriority? = nil) {
        self.workers = max(1, workers)
        self.queueLimit = max(0, queueLimit)
        self.idleTimeout = idleTimeout
        self.priority = priority
    }

    /// Worker threads alive now, and jobs waiting for one (for tests).
    var liveThreads: Int { condition.withLock { threadsAlive } }
    var queuedJobs: Int { condition.withLock { queued } }

    /// Takes a place for one hash of `flow` (the caller's uid), or throws `Full` when that flow
    /// has `workers + queueLimit` hashes out.
    func reserve(flow: Int) throws(Full) -> Permit {
        condition.lock()
        defer { condition.unlock() }
        let out = pending[flow, default: 0]
        guard !stopped, out < workers + queueLimit else {
            let ahead = max(0, out - workers + 1)
            throw Full(
                pending: out,
                retryAfter: (lastDuration * Double(ahead) / Double(workers) * 1000).rounded(.up) / 1000)
        }
        pending[flow] = out + 1
        return Permit(pool: self, flow: flow)
    }

    /// Runs `body` on a worker with a place taken by `reserve(flow:)`. `lanes`: the threads the
    /// hash runs on; only a hash on its worker's thread alone is raised (`HashingPriority`), so
    /// that raised threads never outnumber the workers.
    func run<T: Sendable>(
        _ permit: Permit, lanes: Int = 1, _ body: @escaping @Sendable () throws -> T
    )
        async throws -> T
    {
        permit.used = true
        let flow = permit.flow
        let box = JobBox()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                let job = Job(
                    flow: flow,
                    work: { [self] in
                        let previous = priority?.raise(lanes: lanes)
                        let started = ContinuousClock.now
                        let result = Result { try body() }
                        let elapsed = ContinuousClock.now - started
                        // Back before the caller resumes: a thread started from this one
                        // would inherit the raised value (HashingPriority).
                        if let previous { priority?.lower(to: previous) }
                        condition.lock()
                        lastDuration =
                            Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                        condition.unlock()
                        continuation.resume(with: result)
                    }, cancel: { continuation.resume(throwing: CancellationError()) })
                condition.lock()
                if stopped || Task.isCancelled {
                    decrement(flow)
                    condition.unlock()
                    continuation.resume(throwing: CancellationError())
                    return
                }
                if queues[flow, default: []].isEmpty { rotation.append(flow) }
                queues[flow, default: []].append(job)
                queued += 1
                box.job = job
                // A thread more when the idle ones cannot take every queued job.
                let spawn = queued > threadsIdle && threadsAlive < workers
                if spawn {
                    threadsAlive += 1
                    threadsStarted += 1
                }
                let index = threadsStarted - 1
                condition.signal()
                condition.unlock()
                if spawn { startWorker(index: index) }
            }
        } onCancel: {
            condition.lock()
            box.job?.cancelled = true
            condition.unlock()
        }
    }

    /// Reserves and runs: `Full` when the flow's queue is full.
    func run<T: Sendable>(flow: Int, _ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await run(try reserve(flow: flow), body)
    }

    /// Stops taking work; queued jobs are cancelled, running ones finish, idle threads exit.
    func shutdown() {
        condition.lock()
        stopped = true
        let dropped = rotation.flatMap { queues[$0] ?? [] }
        queues = [:]
        rotation = []
        queued = 0
        for job in dropped { decrement(job.flow) }
        condition.broadcast()
        condition.unlock()
        for job in dropped { job.cancel() }
    }

    fileprivate func release(flow: Int) {
        condition.lock()
        decrement(flow)
        condition.unlock()
    }

    /// With the condition's lock held.
    private func decrement(_ flow: Int) {
        let left = pending[flow, default: 1] - 1
        pending[flow] = left > 0 ? left : nil
    }

    private final class JobBox: @unchecked Sendable {
        var job: Job?
    }

    private func startWorker(index: Int) {
        // Named from inside the thread, so `/proc/PID/task/*/comm` shows it.
        startThread(name: "argon2-\(index)") { [self] in workerLoop() }
    }

    /// The next job in turn, with the condition's lock held: the first flow in the rotation
    /// gives its oldest job and goes to the back if it has more.
    private func takeNext() -> Job? {
        guard !rotation.isEmpty else { return nil }
        let flow = rotation.removeFirst()
        var queue = queues[flow] ?? []
        let job = queue.removeFirst()
        queued -= 1
        if queue.isEmpty {
            queues[flow] = nil
        } else {
            queues[flow] = queue
            rotation.append(flow)
        }
        return job
    }

    private func workerLoop() {
        let idleSeconds = Double(idleTimeout.components.seconds) + Double(idleTimeout.components.attoseconds) / 1e18
        condition.lock()
        while true {
            guard let job = takeNext() else {
                if stopped { break }
                threadsIdle += 1
                let woken = condition.wait(seconds: idleSeconds)
                threadsIdle -= 1
                if !woken && rotation.isEmpty { break }
                continue
            }
            let cancelled = job.cancelled
            condition.unlock()
            if cancelled {
                job.cancel()
            } else {
                job.work()
            }
            condition.lock()
            decrement(job.flow)
        }
        threadsAlive -= 1
        condition.unlock()
    }
}
