import KioskAuthProtocol
import Synchronization

/// The reply frames of an immediate method's last few distinct answers. `GetStatus` answers
/// the same until the store changes, the uptime ticks over a second or a caller of the other
/// rank asks, so under load nearly every call's frame is one already encoded: a hit costs one
/// comparison of the answer instead of its encoding and serialisation.
///
/// Correctness rests on the answer's `==` covering everything the frame encodes, which a
/// synthesised `Equatable` does. Safe to use from every event loop at once.
final class ReplyFrameCache<Output: Encodable & Equatable & Sendable>: Sendable {
    /// Enough for the answers two ranks of caller see across an uptime tick.
    static var capacity: Int { 4 }

    private struct Entry {
        var output: Output
        var frame: [UInt8]
    }

    private let entries = Mutex<[Entry]>([])
    private let encodings = Atomic<Int>(0)

    /// How many answers were encoded, rather than found (for tests).
    var encodingCount: Int { encodings.load(ordering: .relaxed) }

    /// The reply frame carrying `output`; nil when it does not encode.
    func frame(for output: Output) -> [UInt8]? {
        if let frame = entries.withLock({ $0.first { $0.output == output }?.frame }) { return frame }
        guard let frame = try? VarlinkCoding.frame(VarlinkReply(parameters: try VarlinkCoding.encode(output))) else {
            return nil
        }
        encodings.add(1, ordering: .relaxed)
        entries.withLock { entries in
            // Another event loop may have encoded the same answer meanwhile.
            guard !entries.contains(where: { $0.output == output }) else { return }
            entries.insert(Entry(output: output, frame: frame), at: 0)
            if entries.count > Self.capacity { entries.removeLast() }
        }
        return frame
    }
}
