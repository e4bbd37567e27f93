#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// Threads and a condition variable on pthreads, in place of Foundation's `Thread` and
// `NSCondition` (the daemon does not load Foundation; docs/footprint.md).

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
func startThread(name: String, _ body: @escaping @Sendable () -> Void) {
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
