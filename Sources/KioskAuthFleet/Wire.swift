import Crypto
package import FoundationEssentials
package import NIOCore
import Synchronization

/// What the daemon and its fleet helper (`kioskauth-fleet`, docs/fleet.md §9.11) say to each other
/// over the socket pair between them: the daemon asks for `FleetDirectoryConnection` operations,
/// the helper runs them on its PostgreSQL connections and answers. Each message is one frame, a
/// 4-byte big-endian length and then that many bytes of JSON.
///
/// What crosses: the directory's address and password, the fleet's data keys (the helper seals
/// and MACs pushed rows and verifies pulled ones with them), and rows as the directory holds them.
/// What never does: the store key, the terminal's private key, anything unsealed from the store.
package enum FleetWire {
    /// The largest frame either side accepts: a pull of `FleetChange.maximumPerPull` changes
    /// fits while each is under 64 KB as JSON (a sealed template of an image reader is about
    /// 20 KB in hex). A larger length is a broken peer, and the connection between them is
    /// closed; so a subverted helper makes the daemon hold at most this much at a time.
    package static let maximumFrame = 64 << 20

    /// The most frames read and not yet decoded: far more than a conversation has in flight
    /// (a few answers, wake-ups and log lines). A peer that sends more is cut off.
    package static let maximumQueuedFrames = 4096
    /// The most bytes of frames read and not yet decoded: one largest frame. A peer that runs
    /// further ahead of its reader is cut off, so what it can make the reader hold is bounded.
    package static let maximumQueuedBytes = maximumFrame

    /// The stream `FleetWireFrameStream` feeds, bounded by `maximumQueuedFrames`.
    package static func frameStream() -> (
        stream: AsyncStream<ByteBuffer>, continuation: AsyncStream<ByteBuffer>.Continuation
    ) {
        AsyncStream<ByteBuffer>.makeStream(bufferingPolicy: .bufferingOldest(maximumQueuedFrames))
    }

    /// The version of these messages: the daemon starts the helper with it (`--wire`), and a
    /// helper of another version refuses to start. Raise it with any change to the messages.
    package static let version = "1"

    /// The id of a request sent without waiting for its answer (closing a connection, ending a
    /// LISTEN): the helper does not answer it.
    package static let unanswered: UInt64 = 0

    /// A request from the daemon: `call` on the directory connection `connection` (numbered by
    /// the daemon; `connect` makes it). `id` pairs the answer with it.
    package struct Request: Codable, Sendable {
        package var id: UInt64
        package var connection: UInt64
        package var call: Call

        package init(id: UInt64, connection: UInt64, call: Call) {
            self.id = id
            self.connection = connection
            self.call = call
        }
    }

    /// The operations of `FleetDirectoryConnection`, one case each, and connecting.
    package enum Call: Codable, Sendable {
        case connect(endpoint: FleetEndpoint, password: String?)
        case close
        case migrate
        case sessionRole
        case bootstrap(terminal: TerminalRegistration, dataKey: DataKey, wrapped: WrappedDataKey)
        case issueJoinToken(issuer: UUID, lifetime: Duration)
        case join(token: JoinToken, terminal: TerminalRegistration)
        case admit(token: JoinToken, dataKeys: [DataKey])
        case removeTerminal(UUID)
        case rotationDue
        case rotateDataKeyIfDue(member: UUID, publicKey: Data, excluding: [UUID])
        case vouchForSelf(terminal: UUID, publicKey: Data)
        case keyDelivery(terminal: UUID)
        case standing(terminal: UUID)
        case terminals
        case push(PushBatch)
        case pull(after: Int64, limit: Int)
        case recordCursor(Int64, terminal: UUID)
        case feedPosition(terminal: UUID)
        case useKeyring([DataKey])
        case rememberRowVersions([FleetRowVersion])
        /// Starts listening for the change feed: answered once the LISTEN is in force, then
        /// `Message.wake` per notification until `unlisten` (or `Message.listenEnded`).
        case listen
        case unlisten

        /// The name logs give the operation.
        package var name: String {
            switch self {
            case .connect: "connect"
            case .close: "close"
            case .migrate: "migrate"
            case .sessionRole: "sessionRole"
            case .bootstrap: "bootstrap"
            case .issueJoinToken: "issueJoinToken"
            case .join: "join"
            case .admit: "admit"
            case .removeTerminal: "removeTerminal"
            case .rotationDue: "rotationDue"
            case .rotateDataKeyIfDue: "rotateDataKeyIfDue"
            case .vouchForSelf: "vouchForSelf"
            case .keyDelivery: "keyDelivery"
            case .standing: "standing"
            case .terminals: "terminals"
            case .push: "push"
            case .pull: "pull"
            case .recordCursor: "recordCursor"
            case .feedPosition: "feedPosition"
            case .useKeyring: "useKeyring"
            case .rememberRowVersions: "rememberRowVersions"
            case .listen: "listen"
            case .unlisten: "unlisten"
            }
        }
    }

    /// What the helper sends.
    package enum Message: Codable, Sendable {
        /// The answer to request `id`. `sent`: whether any statement of it reached the directory
        /// (`FleetSendProbe`); a failure that sent nothing may be retried on a new connection.
        case answer(id: UInt64, reply: Reply, sent: Bool)
        /// A notification on the change feed of `connection`, which listens.
        case wake(connection: UInt64)
        /// `connection`'s listening ended by itself (its connection closed or failed).
        case listenEnded(connection: UInt64, error: FleetError?)
        /// `connection` closed (the server went away): it takes no more operations.
        case closed(connection: UInt64)
        /// A line the helper logs, for the daemon's log.
        case log(level: String, message: String, metadata: [String: String], source: String)
    }

    /// An operation's result.
    package enum Reply: Codable, Sendable {
        case done
        case failed(FleetError)
        case version(Int32)
        case role(FleetSessionRole)
        case outcome(FleetAttemptOutcome)
        case token(JoinToken)
        case joined(FleetAttemptOutcome, state: String)
        case admitted(UUID)
        case rotationDue(Bool, newest: Int32)
        case rotation(key: DataKey, unvouched: [UUID])
        case noRotation
        case vouched(Bool)
        case keyDelivery(KeyDelivery)
        case standing(state: String?, rotationDue: Bool)
        case terminals([FleetTerminal])
        case pushed(PushOutcome)
        case changes([FleetChange])
        case feedPosition(head: Int64, cursor: Int64)
    }

    /// A data-key generation as it crosses to the helper.
    package struct DataKey: Codable, Sendable {
        package var generation: Int32
        package var key: Data

        package init(_ dataKey: FleetDataKey) {
            generation = dataKey.generation
            key = dataKey.key.withUnsafeBytes { Data($0) }
        }

        /// The data keys `keys` carry; any key that is not 32 bytes is refused.
        package static func dataKeys(_ keys: [DataKey]) throws(FleetError) -> [FleetDataKey] {
            var found: [FleetDataKey] = []
            for key in keys { found.append(try key.dataKey()) }
            return found
        }

        /// The generation; a key that is not 32 bytes is refused.
        package func dataKey() throws(FleetError) -> FleetDataKey {
            guard key.count == 32 else {
                throw FleetError(.keyUnavailable("generation \(generation) crossed as \(key.count) bytes, not 32"))
            }
            return FleetDataKey(generation: generation, key: SymmetricKey(data: key))
        }
    }

    /// `FleetKeyDelivery` as it crosses.
    package struct KeyDelivery: Codable, Sendable {
        package var wrapped: [WrappedDataKey]
        package var chainMACs: [Int32: Data]
        package var admissionMAC: Data?
        package var admissionThrough: Int32?

        package init(_ delivery: FleetKeyDelivery) {
            wrapped = delivery.wrapped
            chainMACs = delivery.chainMACs
            admissionMAC = delivery.admission?.mac
            admissionThrough = delivery.admission?.through
        }

        package var delivery: FleetKeyDelivery {
            let admission = admissionMAC.flatMap { mac in admissionThrough.map { (mac: mac, through: $0) } }
            return FleetKeyDelivery(wrapped: wrapped, chainMACs: chainMACs, admission: admission)
        }
    }

    /// Errors of the wire itself.
    package struct FrameError: Error, CustomStringConvertible {
        package var description: String
    }

    /// `value` as one frame.
    package static func frame(_ value: some Encodable, allocator: ByteBufferAllocator) throws -> ByteBuffer {
        let encoder = JSONEncoder()
        // Base64 is full of slashes; escaped, each would cost a byte more.
        encoder.outputFormatting = .withoutEscapingSlashes
        let json = try encoder.encode(value)
        guard json.count <= maximumFrame else {
            throw FrameError(description: "a \(json.count)-byte message is larger than a frame may be")
        }
        var buffer = allocator.buffer(capacity: 4 + json.count)
        buffer.writeInteger(UInt32(json.count))
        buffer.writeBytes(json)
        return buffer
    }

    /// The value one frame's body holds.
    package static func decode<Value: Decodable>(_ type: Value.Type, from body: ByteBuffer) throws -> Value {
        try JSONDecoder().decode(type, from: Data(body.readableBytesView))
    }
}

/// Splits the byte stream between the daemon and its helper into frames' bodies.
package struct FleetWireFrameDecoder: ByteToMessageDecoder {
    package typealias InboundOut = ByteBuffer

    package init() {}

    package mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self) else { return .needMoreData }
        guard length <= FleetWire.maximumFrame else {
            throw FleetWire.FrameError(description: "a frame of \(length) bytes is larger than any message")
        }
        guard buffer.readableBytes >= 4 + Int(length) else { return .needMoreData }
        buffer.moveReaderIndex(forwardBy: 4)
        context.fireChannelRead(wrapInboundOut(buffer.readSlice(length: Int(length))!))
        return .continue
    }

    package mutating func decodeLast(
        context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool
    ) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        return .needMoreData
    }
}

/// Hands each frame's body to the stream its reader decodes from (off the event loop: a pull's
/// answer can be megabytes of JSON); ends the stream when the socket closes or fails.
package final class FleetWireFrameStream: ChannelInboundHandler, Sendable {
    package typealias InboundIn = ByteBuffer
    private let continuation: AsyncStream<ByteBuffer>.Continuation
    private let overflow = Mutex(false)
    private let queuedBytes = Mutex(0)

    package init(_ continuation: AsyncStream<ByteBuffer>.Continuation) { self.continuation = continuation }

    /// The reader took `frame` off the stream (it no longer counts as queued).
    package func taken(_ frame: ByteBuffer) {
        queuedBytes.withLock { $0 -= frame.readableBytes }
    }

    /// Whether the peer was cut off for running too far ahead of its reader.
    package var overflowed: Bool { overflow.withLock { $0 } }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // The stream holds at most `FleetWire.maximumQueuedFrames` (`frameStream()`): a peer that
        // runs that far ahead of its reader is broken, and is cut off rather than buffered.
        let frame = unwrapInboundIn(data)
        let queued = queuedBytes.withLock { queued in
            queued += frame.readableBytes
            return queued
        }
        let dropped: Bool
        if queued > FleetWire.maximumQueuedBytes, queued > frame.readableBytes {
            dropped = true
        } else if case .dropped = continuation.yield(frame) {
            dropped = true
        } else {
            dropped = false
        }
        if dropped {
            overflow.withLock { $0 = true }
            continuation.finish()
            context.close(promise: nil)
        }
    }

    package func channelInactive(context: ChannelHandlerContext) {
        continuation.finish()
        context.fireChannelInactive()
    }

    package func errorCaught(context: ChannelHandlerContext, error: any Error) {
        continuation.finish()
        context.close(promise: nil)
    }
}

// The few types that cross with a coding of their own.

extension SealedBlob: Codable {
    private enum CodingKeys: String, CodingKey { case generation, bytes }

    /// Sealed templates are large: their bytes cross as base64, not as a JSON array of numbers.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(generation, forKey: .generation)
        try container.encode(Data(bytes), forKey: .bytes)
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            generation: try container.decode(Int32.self, forKey: .generation),
            bytes: Array(try container.decode(Data.self, forKey: .bytes)))
    }
}

extension FleetError: Codable {
    private enum CodingKeys: String, CodingKey { case kind, file, line }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(kind, forKey: .kind)
        try container.encode(file, forKey: .file)
        try container.encode(line, forKey: .line)
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            try container.decode(Kind.self, forKey: .kind), file: try container.decode(String.self, forKey: .file),
            line: try container.decode(Int.self, forKey: .line))
    }
}
