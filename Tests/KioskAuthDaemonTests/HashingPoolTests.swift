import CKioskAuthSystem
import Foundation
import Logging
import Synchronization
import Testing

@testable import KioskAuthDaemon

/// The Argon2id pool under concurrent callers: a storm from one uid cannot push another caller's
/// hash behind it, admission is per caller, and threads exist only while there is work.
@Suite("Hashing pool")
struct HashingPoolTests {
    static let stormUID = 1500
    static let pamUID = 0

    /// What the jobs did, in the order they did it.
    final class Recorder: Sendable {
        private let items = Mutex<[String]>([])
        func append(_ item: String) { items.withLock { $0.append(item) } }
        var all: [String] { items.withLock { $0 } }
    }

    /// Holds the pool's one worker until `open()`, so that everything submitted meanwhile queues.
    final class Gate: Sendable {
        let semaphore = DispatchSemaphore(value: 0)
        func open() { semaphore.signal() }
        func wait() { semaphore.wait() }
    }

    /// Waits until `count` jobs are queued: a guard against a hang, not a bound on speed.
    func waitUntilQueued(_ pool: HashingPool, _ count: Int) async throws {
        try await waitFor { pool.queuedJobs >= count }
    }

    /// Waits until the worker has taken the first job (a thread exists and nothing is queued).
    func waitUntilTaken(_ pool: HashingPool) async throws {
        try await waitFor { pool.liveThreads > 0 && pool.queuedJobs == 0 }
    }

    func waitFor(_ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(60)
        while !condition() {
            guard ContinuousClock.now < deadline else {
                Issue.record("the pool never got there")
                return
            }
            try await Task.sleep(for: .milliseconds(2))
        }
    }

    /// One worker busy, `storm` jobs queued from the storm's uid over as many concurrent callers,
    /// then one hash from another caller: it runs after at most one storm job (round robin over
    /// callers), where a first-come queue would run it after all of them.
    @Test func aStormFromOneUidCannotStarveAnotherCallersHash() async throws {
        let pool = HashingPool(workers: 1, queueLimit: 16)
        defer { pool.shutdown() }
        let order = Recorder()
        let gate = Gate()
        let storm = 12
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await pool.run(flow: Self.stormUID) {
                    gate.wait()
                    order.append("storm")
                }
            }
            try await waitUntilTaken(pool)
            for _ in 0..<storm {
                group.addTask { try await pool.run(flow: Self.stormUID) { order.append("storm") } }
            }
            try await waitUntilQueued(pool, storm)
            group.addTask { try await pool.run(flow: Self.pamUID) { order.append("pam") } }
            try await waitUntilQueued(pool, storm + 1)
            gate.open()
            try await group.waitForAll()
        }
        let finished = order.all
        #expect(finished.count == storm + 2)
        // The job that held the worker, at most one queued storm job, then the other caller's.
        let position = try #require(finished.firstIndex(of: "pam"))
        #expect(position <= 2, "the other caller's hash ran after \(position) storm hashes")
    }

    /// With several storming uids, a newcomer waits behind at most one job of each.
    @Test func aNewCallerWaitsBehindAtMostOneJobPerOtherCaller() async throws {
        let pool = HashingPool(workers: 1, queueLimit: 16)
        defer { pool.shutdown() }
        let order = Recorder()
        let gate = Gate()
        let stormers = [1500, 1501, 1502]
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await pool.run(flow: 1500) { gate.wait() } }
            try await waitUntilTaken(pool)
            let queued = stormers.count * 8
            for uid in stormers {
                for _ in 0..<8 {
                    group.addTask { try await pool.run(flow: uid) { order.append("storm") } }
                }
            }
            try await waitUntilQueued(pool, queued)
            group.addTask { try await pool.run(flow: Self.pamUID) { order.append("pam") } }
            try await waitUntilQueued(pool, queued + 1)
            gate.open()
            try await group.waitForAll()
        }
        let position = try #require(order.all.firstIndex(of: "pam"))
        #expect(position <= stormers.count, "ran after \(position) storm hashes")
    }

    /// A caller whose own queue is full is refused `Full` at once; another caller still gets in,
    /// and the refused one gets in again once a place is free.
    @Test func admissionIsPerCaller() throws {
        let pool = HashingPool(workers: 1, queueLimit: 2)
        defer { pool.shutdown() }
        var held = try (0..<3).map { _ in try pool.reserve(flow: Self.stormUID) }
        let refusal = #expect(throws: HashingPool.Full.self) { try pool.reserve(flow: Self.stormUID) }
        #expect(refusal?.pending == 3)
        let other = try pool.reserve(flow: Self.pamUID)
        held.removeLast()  // a permit given back without a hash frees its place
        let again = try pool.reserve(flow: Self.stormUID)
        withExtendedLifetime((held, other, again)) {}
    }

    /// No thread before the first hash; the worker that ran it exits once idle.
    @Test func threadsStartOnDemandAndIdleOnesExit() async throws {
        let pool = HashingPool(workers: 2, queueLimit: 4, idleTimeout: .milliseconds(50))
        defer { pool.shutdown() }
        #expect(pool.liveThreads == 0)
        let value = try await pool.run(flow: Self.pamUID) { 42 }
        #expect(value == 42)
        while pool.liveThreads > 0 {
            try await Task.sleep(for: .milliseconds(10))
        }
        // And a later hash starts one again.
        #expect(try await pool.run(flow: Self.pamUID) { 7 } == 7)
    }

    /// Shutting down cancels what is queued; every permit comes back.
    @Test func shutdownCancelsQueuedJobs() async throws {
        let pool = HashingPool(workers: 1, queueLimit: 8)
        let gate = Gate()
        let outcomes = Recorder()
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await pool.run(flow: 1) { gate.wait() } }
            try await waitUntilTaken(pool)
            for _ in 0..<3 {
                group.addTask {
                    do {
                        try await pool.run(flow: 2) {}
                        outcomes.append("ran")
                    } catch is CancellationError {
                        outcomes.append("cancelled")
                    }
                }
            }
            try await waitUntilQueued(pool, 3)
            pool.shutdown()
            gate.open()
            try await group.waitForAll()
        }
        #expect(outcomes.all == ["cancelled", "cancelled", "cancelled"])
        #expect(throws: HashingPool.Full.self) { try pool.reserve(flow: 2) }
    }

    /// A raised hash (root may raise): the worker's thread runs 10 steps below the daemon while it
    /// hashes and is back at its own value once the caller has its result, job after job; a hash
    /// on two lanes (its threads would inherit the value) and a pool with as many workers as
    /// processors are never raised.
    @Test func aHashIsRaisedWhileItRunsAndOnlyThen() async throws {
        guard geteuid() == 0 else { return }  // raising needs CAP_SYS_NICE (or RLIMIT_NICE)
        let logger = Logger(label: "test")
        let priority = try #require(HashingPriority(steps: 10, workers: 1, processors: 2, logger: logger))
        #expect(priority.raised == priority.base - 10)
        let pool = HashingPool(workers: 1, queueLimit: 16, priority: priority)
        for _ in 0..<50 {
            let (thread, during) = try await pool.run(flow: 0) {
                (kioskauth_thread_id(), kioskauth_thread_nice(kioskauth_thread_id()))
            }
            #expect(during == priority.raised)
            #expect(kioskauth_thread_nice(thread) != priority.raised)
        }
        let permit = try pool.reserve(flow: 0)
        let onTwoLanes = try await pool.run(permit, lanes: 2) { kioskauth_thread_nice(kioskauth_thread_id()) }
        #expect(onTwoLanes != priority.raised)
        pool.shutdown()
        #expect(HashingPriority(steps: 10, workers: 2, processors: 2, logger: logger) == nil)
        #expect(HashingPriority(steps: 0, workers: 1, processors: 2, logger: logger) == nil)
    }
}
