import NIOCore

/// Splits the inbound byte stream into NUL-terminated varlink messages and refuses to buffer
/// more than the limit: a client that sends a huge message, or no NUL at all, costs at most
/// `maximumSize` bytes before it is told and disconnected.
struct NULFrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = ByteBuffer

    /// Raised when a message exceeds the limit.
    struct MessageTooLarge: Error {}

    let maximumSize: Int

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        guard let end = buffer.readableBytesView.firstIndex(of: 0) else {
            if buffer.readableBytes > maximumSize { throw MessageTooLarge() }
            return .needMoreData
        }
        let length = end - buffer.readerIndex
        if length > maximumSize { throw MessageTooLarge() }
        let frame = buffer.readSlice(length: length)!
        buffer.moveReaderIndex(forwardBy: 1)
        context.fireChannelRead(Self.wrapInboundOut(frame))
        return .continue
    }

    mutating func decodeLast(
        context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool
    ) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        // Trailing bytes without a NUL at EOF are an incomplete message; drop them.
        buffer.moveReaderIndex(to: buffer.writerIndex)
        return .needMoreData
    }
}

/// Tells the idle guard that a call finished (its last reply was written).
struct CallFinished: Sendable {}

/// Closes a connection that has no call in progress for longer than the idle timeout, after
/// telling the client why. A call in progress (an enrolment waiting for fingers) is never idle;
/// but a client that does not read its replies is: once the connection's queued output stays
/// over the high-water mark (the channel is not writable, so no further call is read) for
/// `writeTimeout`, it is closed, calls in progress or not.
final class IdleGuard: ChannelDuplexHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let timeout: TimeAmount
    private let timeoutReply: ByteBuffer
    private var callsInProgress = 0
    private let writeTimeout: TimeAmount
    private var timer: Scheduled<Void>?
    private var stallTimer: Scheduled<Void>?
    private var closeWhenIdle = false

    init(timeout: TimeAmount, writeTimeout: TimeAmount, timeoutReply: ByteBuffer) {
        self.timeout = timeout
        self.writeTimeout = writeTimeout
        self.timeoutReply = timeoutReply
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable {
            stallTimer?.cancel()
            stallTimer = nil
        } else if stallTimer == nil {
            let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
            stallTimer = context.eventLoop.scheduleTask(in: writeTimeout) {
                // Nothing more can be written to a client that does not read: just close.
                loopBound.value.close(promise: nil)
            }
        }
        context.fireChannelWritabilityChanged()
    }

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { arm(context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        arm(context)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        callsInProgress += 1
        timer?.cancel()
        timer = nil
        context.fireChannelRead(data)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        if event is CallFinished {
            callsInProgress = max(0, callsInProgress - 1)
            if callsInProgress == 0 {
                if closeWhenIdle {
                    context.close(promise: nil)
                } else {
                    arm(context)
                }
            }
            promise?.succeed()
        } else if event is DrainRequest {
            closeWhenIdle = true
            if callsInProgress == 0 { context.close(promise: nil) }
            promise?.succeed()
        } else {
            context.triggerUserOutboundEvent(event, promise: promise)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        timer?.cancel()
        timer = nil
        stallTimer?.cancel()
        stallTimer = nil
        context.fireChannelInactive()
    }

    private func arm(_ context: ChannelHandlerContext) {
        timer?.cancel()
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        let reply = timeoutReply
        timer = context.eventLoop.scheduleTask(in: timeout) {
            // The reply goes to the kernel at once if there is room; the close never waits for a
            // client that does not read.
            let context = loopBound.value
            context.writeAndFlush(NIOAny(reply), promise: nil)
            context.close(promise: nil)
        }
    }
}

/// Asks a connection to close as soon as it has no call in progress (graceful shutdown).
struct DrainRequest: Sendable {}

/// Answers calls that do no I/O (`GetStatus`, the `org.varlink.service` methods) on the
/// connection's event loop as they are read, without a hop to a task or the actor per call;
/// the replies of a burst of pipelined calls go out in one flush. Only while no earlier call of
/// the connection is still being served (counted until its `CallFinished`), so replies keep
/// the calls' order; and only while the client reads its replies (the channel is writable), so
/// a client that does not read gets the ordinary path's backpressure.
final class ImmediateCalls: ChannelDuplexHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// What to do with one call.
    enum Answer {
        /// Pass it on to the ordinary path.
        case forward
        /// Answered: write this frame.
        case reply([UInt8])
        /// Answered, and `oneway`: nothing to write.
        case noReply
    }

    private let answer: (ByteBuffer) -> Answer
    /// Calls passed on whose `CallFinished` has not come back yet.
    private var forwarded = 0
    private var unflushed = false

    init(answer: @escaping (ByteBuffer) -> Answer) {
        self.answer = answer
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if forwarded == 0, context.channel.isWritable {
            switch answer(unwrapInboundIn(data)) {
            case .forward:
                break
            case .reply(let bytes):
                context.write(wrapOutboundOut(ByteBuffer(bytes: bytes)), promise: nil)
                unflushed = true
                context.triggerUserOutboundEvent(CallFinished(), promise: nil)
                return
            case .noReply:
                context.triggerUserOutboundEvent(CallFinished(), promise: nil)
                return
            }
        }
        forwarded += 1
        context.fireChannelRead(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if unflushed {
            unflushed = false
            context.flush()
        }
        context.fireChannelReadComplete()
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        if event is CallFinished { forwarded = max(0, forwarded - 1) }
        context.triggerUserOutboundEvent(event, promise: promise)
    }
}
