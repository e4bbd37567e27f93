import Synchronization

/// The thread-safe view of which readers are usable, and the fan-out of hotplug events to every
/// subscriber. The loop thread writes; any task reads.
final class ReaderHub: Sendable {
    private struct State {
        var readers: [ReaderInfo] = []
        var subscribers: [UInt64: AsyncStream<ReaderEvent>.Continuation] = [:]
        var nextID: UInt64 = 0
        var isFinished = false
    }

    private let state = Mutex(State())

    /// The usable readers, in discovery order; operations that name no reader use the first.
    var readers: [ReaderInfo] { state.withLock { $0.readers } }

    /// A new stream that first replays `.added` for each present reader, then follows hotplug.
    func makeStream() -> AsyncStream<ReaderEvent> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: ReaderEvent.self, bufferingPolicy: .bufferingNewest(64))
        let id = state.withLock { state -> UInt64? in
            if state.isFinished { return nil }
            defer { state.nextID += 1 }
            for reader in state.readers { continuation.yield(.added(reader)) }
            state.subscribers[state.nextID] = continuation
            return state.nextID
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }

    func add(_ reader: ReaderInfo) {
        state.withLock { state in
            state.readers.append(reader)
            for subscriber in state.subscribers.values { subscriber.yield(.added(reader)) }
        }
    }

    func remove(id: String) {
        state.withLock { state in
            guard let index = state.readers.firstIndex(where: { $0.id == id }) else { return }
            state.readers.remove(at: index)
            for subscriber in state.subscribers.values { subscriber.yield(.removed(id: id)) }
        }
    }

    /// Ends every stream; later streams end at once.
    func finish() {
        let subscribers = state.withLock { state in
            state.isFinished = true
            state.readers = []
            defer { state.subscribers = [:] }
            return Array(state.subscribers.values)
        }
        subscribers.forEach { $0.finish() }
    }
}
