import Synchronization

/// Lets one reader operation run at a time; later callers wait in arrival order.
///
/// Waiting rather than failing with `.busy` matters for the common race of a kiosk app that
/// cancels a finger scan (the passcode won) and immediately starts the next one: the cancelled
/// scan needs a few milliseconds to wind down in libfprint. A waiting caller can be cancelled
/// like any task; `close()` fails every waiter and every later caller.
final class OperationGate: Sendable {
    private struct Waiter {
        let id: UInt64
        let continuation: CheckedContinuation<Void, any Error>
    }

    private struct State {
        var isHeld = false
        var isClosed = false
        var nextID: UInt64 = 0
        var waiters: [Waiter] = []
        var cancelledBeforeWaiting: Set<UInt64> = []
        var drainWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = Mutex(State())

    /// Waits for the gate; throws `.cancelled` if the task is cancelled while waiting and
    /// `closedError` once the gate is closed.
    func acquire(closedError: @autoclosure () -> FingerprintError) async throws {
        let closed = closedError()
        let id = state.withLock { state -> UInt64 in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                enum Outcome { case granted, queued, closed, cancelled }
                let outcome = state.withLock { state -> Outcome in
                    if state.isClosed { return .closed }
                    if state.cancelledBeforeWaiting.remove(id) != nil { return .cancelled }
                    if !state.isHeld {
                        state.isHeld = true
                        return .granted
                    }
                    state.waiters.append(Waiter(id: id, continuation: continuation))
                    return .queued
                }
                switch outcome {
                case .granted: continuation.resume()
                case .queued: break
                case .closed: continuation.resume(throwing: closed)
                case .cancelled:
                    continuation.resume(
                        throwing: FingerprintError(.cancelled, "cancelled while waiting for the reader"))
                }
            }
        } onCancel: {
            let waiter = state.withLock { state -> Waiter? in
                if let index = state.waiters.firstIndex(where: { $0.id == id }) {
                    return state.waiters.remove(at: index)
                }
                state.cancelledBeforeWaiting.insert(id)
                return nil
            }
            waiter?.continuation.resume(
                throwing: FingerprintError(.cancelled, "cancelled while waiting for the reader"))
        }
        // A grant that raced with cancellation still holds the gate; the caller releases it.
        state.withLock { _ = $0.cancelledBeforeWaiting.remove(id) }
    }

    /// Takes the gate if nobody holds it or waits for it: true when taken (the caller releases
    /// it), false when the caller would have to wait; throws `closedError` once closed.
    func tryAcquire(closedError: @autoclosure () -> FingerprintError) throws -> Bool {
        let closed = closedError()
        let outcome = state.withLock { state -> Bool? in
            if state.isClosed { return nil }
            if state.isHeld || !state.waiters.isEmpty { return false }
            state.isHeld = true
            return true
        }
        guard let outcome else { throw closed }
        return outcome
    }

    /// Hands the gate to the next waiter, or frees it.
    func release() {
        let next = state.withLock { state -> Waiter? in
            if !state.waiters.isEmpty { return state.waiters.removeFirst() }
            state.isHeld = false
            return nil
        }
        if let next {
            next.continuation.resume()
        } else {
            let drained = state.withLock { state in
                defer { state.drainWaiters = [] }
                return state.drainWaiters
            }
            drained.forEach { $0.resume() }
        }
    }

    /// Refuses new callers, fails the waiting ones with `error`, and returns once the current
    /// holder (if any) has released the gate.
    func closeAndDrain(failingWaitersWith error: FingerprintError) async {
        let waiters = state.withLock { state in
            state.isClosed = true
            defer { state.waiters = [] }
            return state.waiters
        }
        waiters.forEach { $0.continuation.resume(throwing: error) }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let idle = state.withLock { state in
                if !state.isHeld { return true }
                state.drainWaiters.append(continuation)
                return false
            }
            if idle { continuation.resume() }
        }
    }
}
