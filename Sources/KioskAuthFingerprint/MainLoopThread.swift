import CFPrint
import FoundationEssentials
import Synchronization

/// The one thread that owns GLib's global default main context and runs its loop for as long
/// as the reader service lives. libfprint is driven only from closures this thread runs, so it is
/// responsive to hotplug and cancellation between operations as well as during them.
///
/// GLib's default context is process-wide, so only one instance may run at a time; `start()`
/// refuses a second one.
final class MainLoopThread: Sendable {
    private enum Phase {
        case idle
        case starting(CheckedContinuation<Void, any Error>)
        case running
        case stopping(CheckedContinuation<Void, Never>?)
        case stopped
    }

    /// Whether some instance in this process owns the default main context now.
    private static let contextClaimed = Mutex(false)

    private let phase = Mutex(Phase.idle)
    private let loopThreadID = Mutex<pthread_t?>(nil)
    /// The loop, made on the loop thread once libfprint (and GLib with it) is loaded; read only
    /// there (`g_main_loop_quit` runs from a closure that thread dispatches).
    private nonisolated(unsafe) var loop: OpaquePointer?

    /// Whether the caller runs on the loop thread.
    var isCurrent: Bool {
        loopThreadID.withLock { id in id.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }

    /// Starts the thread; returns once its loop is dispatching.
    func start() async throws {
        let claimed = Self.contextClaimed.withLock { claimed in
            if claimed { return false }
            claimed = true
            return true
        }
        guard claimed else {
            throw FingerprintError(
                .busy, "another FingerprintReader in this process owns GLib's default main context")
        }
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            phase.withLock { $0 = .starting(continuation) }
            startThread(name: "fprint-glib") { [self] in run() }
        }
    }

    /// Schedules `body` on the loop thread.
    func perform(_ body: @escaping @Sendable () -> Void) {
        scheduleOnDefaultContext(body)
    }

    /// Quits the loop and waits for the thread to release the context.
    func stop() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = phase.withLock { phase -> Bool in
                switch phase {
                case .running:
                    phase = .stopping(continuation)
                    return false
                case .idle, .stopped, .starting, .stopping:
                    return true
                }
            }
            if resumeNow {
                continuation.resume()
            } else {
                // Quit from inside the loop so that everything scheduled before stop() runs first.
                perform { [self] in lib.g_main_loop_quit(loop) }
            }
        }
    }

    private func run() {
        // libfprint is loaded here, on the thread that will drive it, while the daemon's start-up
        // goes on elsewhere (CFPrint.h); in a daemon nothing has loaded it before (a later call
        // returns the first one's result).
        func refuse(_ error: FingerprintError) {
            Self.contextClaimed.withLock { $0 = false }
            finishStart(with: error)
        }
        do { try loadLibfprint() } catch { return refuse(error) }
        let context = lib.g_main_context_default()
        guard lib.g_main_context_acquire(context) != 0 else {
            return refuse(FingerprintError(.deviceFailure, "GLib's default main context is owned by another thread"))
        }
        let loop = lib.g_main_loop_new(context, 0)
        self.loop = loop
        loopThreadID.withLock { $0 = pthread_self() }
        perform { [self] in finishStart(with: nil) }
        lib.g_main_loop_run(loop)
        // Dispatch what is already due (libfprint's idle clean-ups) while its objects still
        // exist, rather than in the next owner's loop.
        var budget = 1000
        while budget > 0, lib.g_main_context_iteration(context, 0) != 0 { budget -= 1 }
        loopThreadID.withLock { $0 = nil }
        self.loop = nil
        lib.g_main_loop_unref(loop)
        lib.g_main_context_release(context)
        Self.contextClaimed.withLock { $0 = false }
        let waiter = phase.withLock { phase -> CheckedContinuation<Void, Never>? in
            defer { phase = .stopped }
            if case .stopping(let continuation) = phase { return continuation }
            return nil
        }
        waiter?.resume()
    }

    private func finishStart(with error: FingerprintError?) {
        let continuation = phase.withLock { phase -> CheckedContinuation<Void, any Error>? in
            guard case .starting(let continuation) = phase else { return nil }
            phase = error == nil ? .running : .stopped
            return continuation
        }
        if let error { continuation?.resume(throwing: error) } else { continuation?.resume() }
    }
}
