#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A mutual-exclusion lock (`pthread_mutex_t`), in place of Foundation's `NSLock` and (with
/// `recursive`) `NSRecursiveLock`.
final class Lock: @unchecked Sendable {
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)

    /// A lock; a `recursive` one may be taken again by the thread that holds it.
    init(recursive: Bool = false) {
        mutex.initialize(to: pthread_mutex_t())
        var attributes = pthread_mutexattr_t()
        pthread_mutexattr_init(&attributes)
        defer { pthread_mutexattr_destroy(&attributes) }
        if recursive {
            pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_RECURSIVE))
        }
        let result = pthread_mutex_init(mutex, &attributes)
        precondition(result == 0, "pthread_mutex_init failed: \(result)")
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deinitialize(count: 1)
        mutex.deallocate()
    }

    func lock() {
        let result = pthread_mutex_lock(mutex)
        precondition(result == 0, "pthread_mutex_lock failed: \(result)")
    }

    func unlock() {
        let result = pthread_mutex_unlock(mutex)
        precondition(result == 0, "pthread_mutex_unlock failed: \(result)")
    }

    /// Runs `body` holding the lock.
    func withLock<Result, Failure: Error>(_ body: () throws(Failure) -> Result) throws(Failure) -> Result {
        lock()
        defer { unlock() }
        return try body()
    }
}

/// The directory part of `path`, as `NSString.deletingLastPathComponent` gives it: `/a/b` for
/// `/a/b/c` (and `/a/b/c/`), `/` for `/c`, and the empty string for a bare name.
package func directoryName(of path: String) -> String {
    var text = Substring(path)
    while text.count > 1, text.hasSuffix("/") { text = text.dropLast() }
    guard let slash = text.lastIndex(of: "/") else { return "" }
    if slash == text.startIndex { return "/" }
    var directory = text[..<slash]
    while directory.count > 1, directory.hasSuffix("/") { directory = directory.dropLast() }
    return String(directory)
}

/// The size of the file at `path` in bytes, or nil when it cannot be read (missing). In place of
/// `FileManager.attributesOfItem(atPath:)[.size]`, whose value is not an `Int` without Foundation.
func fileSize(atPath path: String) -> Int? {
    var status = stat()
    guard stat(path, &status) == 0 else { return nil }
    return Int(status.st_size)
}
