#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// Threads and a condition variable on pthreads, in place of Foundation's `Thread` and
// `NSCondition` (the daemon does not load Foundation; docs/footprint.md). One copy for the
// fingerprint engine and the daemon, which reaches it through `package` access.

/// What a new thread runs; owned by the thread once it starts.
private final class ThreadStart {
    let name: String
    let body: () -> Void

    init(name: String, body: @escaping () -> Void) {
        self.name = name
        self.body = body
    }
}

/// Starts a detached thread named `name` (the kernel keeps 15 bytes of it) that runs `body`.
package func startThread(name: String, _ body: @escaping @Sendable () -> Void) {
    let start = Unmanaged.passRetained(ThreadStart(name: name, body: body)).toOpaque()
    var attributes = pthread_attr_t()
    pthread_attr_init(&attributes)
    defer { pthread_attr_destroy(&attributes) }
    pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
    var thread = pthread_t()
    let result = pthread_create(
        &thread, &attributes,
        { argument in
            let start = Unmanaged<ThreadStart>.fromOpaque(argument!).takeRetainedValue()
            nameThisThread(start.name)
            start.body()
            return nil
        }, start)
    precondition(result == 0, "pthread_create failed: \(result)")
}

/// Names the calling thread as `ps` and `/proc/PID/task/TID/comm` show it (`pthread_setname_np`
/// is not visible to Swift without `_GNU_SOURCE`).
private func nameThisThread(_ name: String) {
    let descriptor = open("/proc/thread-self/comm", O_WRONLY | O_CLOEXEC)
    guard descriptor >= 0 else { return }
    defer { close(descriptor) }
    let bytes = Array(name.utf8.prefix(15))
    _ = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
}

/// A mutex with one condition variable, in place of Foundation's `NSCondition`.
package final class ConditionLock: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    package init() {
        mutex.initialize(to: pthread_mutex_t())
        condition.initialize(to: pthread_cond_t())
        precondition(pthread_mutex_init(mutex, nil) == 0 && pthread_cond_init(condition, nil) == 0)
    }

    deinit {
        pthread_cond_destroy(condition)
        pthread_mutex_destroy(mutex)
        condition.deallocate()
        mutex.deallocate()
    }

    package func lock() { precondition(pthread_mutex_lock(mutex) == 0) }
    package func withLock<T>(_ body: () throws -> T) rethrows -> T {
        lock()
        defer { unlock() }
        return try body()
    }
    package func unlock() { precondition(pthread_mutex_unlock(mutex) == 0) }
    /// Waits for a signal; the lock must be held, and is held again on return.
    package func wait() { precondition(pthread_cond_wait(condition, mutex) == 0) }
    /// Waits for a signal for at most `seconds`; false when the time ran out. The lock must be
    /// held, and is held again on return.
    package func wait(seconds: Double) -> Bool {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let whole = Int(seconds)
        var deadline = timespec(
            tv_sec: now.tv_sec + whole, tv_nsec: now.tv_nsec + Int((seconds - Double(whole)) * 1e9))
        if deadline.tv_nsec >= 1_000_000_000 {
            deadline.tv_sec += 1
            deadline.tv_nsec -= 1_000_000_000
        }
        let result = pthread_cond_timedwait(condition, mutex, &deadline)
        precondition(result == 0 || result == ETIMEDOUT)
        return result == 0
    }
    package func signal() { precondition(pthread_cond_signal(condition) == 0) }
    package func broadcast() { precondition(pthread_cond_broadcast(condition) == 0) }
}
