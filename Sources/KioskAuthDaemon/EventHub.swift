import FoundationEssentials
import KioskAuthProtocol
import Synchronization

/// Fans daemon events (session ended or locked, online/offline, reader added/removed) out to
/// `Subscribe` callers. Each subscriber has a bounded buffer: a subscriber that does not read
/// loses the oldest events rather than holding memory.
final class EventHub: Sendable {
    /// Events kept for a subscriber that is slow to read.
    static let bufferPerSubscriber = 256
    /// Subscribers at once; more are refused (the socket's own connection limits come first).
    static let maximumSubscribers = 64

    private struct State {
        var nextID: UInt64 = 1
        var subscribers: [UInt64: AsyncStream<EventRecord>.Continuation] = [:]
        var finished = false
    }
    private let state = Mutex(State())

    /// Registers a subscriber; nil when the daemon is shutting down or too many subscribe.
    func subscribe() -> (id: UInt64, events: AsyncStream<EventRecord>)? {
        let (stream, continuation) = AsyncStream.makeStream(
            of: EventRecord.self, bufferingPolicy: .bufferingNewest(Self.bufferPerSubscriber))
        let id = state.withLock { state -> UInt64? in
            guard !state.finished, state.subscribers.count < Self.maximumSubscribers else { return nil }
            let id = state.nextID
            state.nextID += 1
            state.subscribers[id] = continuation
            return id
        }
        guard let id else {
            continuation.finish()
            return nil
        }
        return (id, stream)
    }

    /// Forgets a subscriber (its call ended).
    func unsubscribe(_ id: UInt64) {
        state.withLock { $0.subscribers.removeValue(forKey: id) }?.finish()
    }

    /// Sends an event to every subscriber.
    func publish(_ event: EventRecord) {
        let subscribers = state.withLock { Array($0.subscribers.values) }
        for subscriber in subscribers { subscriber.yield(event) }
    }

    /// Ends every subscription (graceful shutdown): their calls return.
    func finishAll() {
        let subscribers = state.withLock { state -> [AsyncStream<EventRecord>.Continuation] in
            state.finished = true
            defer { state.subscribers.removeAll() }
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.finish() }
    }

    /// Subscribers right now.
    var count: Int { state.withLock { $0.subscribers.count } }
}

/// Wakes a service loop early: `wait(upTo:)` returns after the timeout or at the first
/// `signal()`, whichever comes first. A signal sent while nobody waits is kept for the next wait.
final class Wakeup: Sendable {
    private struct State {
        var pending = false
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())

    /// Wakes the waiter now, or the next one.
    func signal() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.pending = true
            return nil
        }
        waiter?.resume()
    }

    /// Returns after `timeout`, at a signal, or when the task is cancelled.
    func wait(upTo timeout: Duration) async {
        await withTaskCancellationHandler {
            await waitInGroup(upTo: timeout)
        } onCancel: {
            signal()
        }
    }

    private func waitInGroup(upTo timeout: Duration) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                if (try? await Task.sleep(for: timeout)) != nil { self.signal() }
            }
            group.addTask { await self.nextSignal() }
            // Either the sleeper finished (and its signal releases the waiter), or a signal
            // released the waiter and the sleeper is cancelled without signalling.
            await group.next()
            group.cancelAll()
        }
    }

    private func nextSignal() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let resumeNow = state.withLock { state -> Bool in
                if state.pending {
                    state.pending = false
                    return true
                }
                state.waiter = continuation
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }
}
