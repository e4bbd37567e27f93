import FoundationEssentials
import KioskAuthFleet
public import Logging
import NIOCore
import NIOPosix
import Synchronization

/// The fleet helper's side of `FleetWire` (`kioskauth-fleet`, docs/fleet.md §9.11): it serves
/// kioskauthd on the connected socket it was started with, running each request on its
/// `FleetDirectory` connections, until the daemon closes the socket (or goes away), and then
/// closes them and returns.
public enum FleetHelperServer {
    /// Serves the daemon on `descriptor` until it closes; logs go to the daemon as messages.
    /// `notice`, if any, is logged (as a warning) first.
    public static func serve(descriptor: Int32, logLevel: Logger.Level, notice: String? = nil) async throws {
        let frames = FleetWire.frameStream()
        let stream = FleetWireFrameStream(frames.continuation)
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FleetWireFrameDecoder()))
                    try channel.pipeline.syncOperations.addHandler(stream)
                }
            }
            .withConnectedSocket(descriptor).get()
        let server = Server(channel: channel, logLevel: logLevel)
        if let notice { server.logger.warning("\(notice)") }
        await withDiscardingTaskGroup { group in
            for await frame in frames.stream {
                stream.taken(frame)
                do {
                    let request = try FleetWire.decode(FleetWire.Request.self, from: frame)
                    group.addTask { await server.handle(request) }
                } catch {
                    // Not a message of this build's daemon: nothing more it sends can be trusted.
                    server.logger.error("a request that does not decode; stopping", metadata: ["error": "\(error)"])
                    try? await channel.close()
                    break
                }
            }
            // The daemon has gone: close the directory connections first, which ends any
            // statement in flight, so no request holds the helper (and its keys) up.
            await server.closeAll()
            group.cancelAll()
        }
        try? await channel.close()
    }

    /// The connections, and the socket to the daemon.
    final class Server: Sendable {
        let channel: any Channel
        let logger: Logger
        private let state = Mutex(State())

        struct State {
            var directories: [UInt64: FleetDirectory] = [:]
            var listeners: [UInt64: Task<Void, Never>] = [:]
        }

        init(channel: any Channel, logLevel: Logger.Level) {
            self.channel = channel
            var logger = Logger(label: "kioskauth-fleet") { _ in FleetWireLogHandler(channel: channel) }
            logger.logLevel = logLevel
            self.logger = logger
        }

        func send(_ message: FleetWire.Message) {
            Self.send(message, on: channel)
        }

        static func send(_ message: FleetWire.Message, on channel: any Channel) {
            do {
                channel.writeAndFlush(try FleetWire.frame(message, allocator: channel.allocator), promise: nil)
            } catch {
                // Only an answer can be too large (`answer` replaces it with a failure); anything
                // else this build cannot encode is a bug, said on standard error.
                let line = "kioskauth-fleet: cannot encode a message: \(error)\n"
                _ = line.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
            }
        }

        /// Sends the answer to `request`; one too large for the wire (a page of huge rows) is
        /// answered as a failure instead, so the daemon's call ends now rather than at its deadline.
        func answer(_ request: FleetWire.Request, _ reply: FleetWire.Reply, sent: Bool) {
            do {
                let frame = try FleetWire.frame(
                    FleetWire.Message.answer(id: request.id, reply: reply, sent: sent), allocator: channel.allocator)
                channel.writeAndFlush(frame, promise: nil)
            } catch {
                logger.error("an answer the wire cannot carry", metadata: ["call": "\(request.call.name)"])
                let failure = FleetError(
                    .directoryUnavailable("the fleet helper's answer to \(request.call.name) cannot be sent: \(error)"))
                send(.answer(id: request.id, reply: .failed(failure), sent: sent))
            }
        }

        func handle(_ request: FleetWire.Request) async {
            if case .listen = request.call {
                listen(request)
                return
            }
            let probe = FleetSendProbe()
            let reply = await FleetSendProbe.$current.withValue(probe) { () async -> FleetWire.Reply in
                do throws(FleetError) {
                    return try await perform(request.call, on: request.connection)
                } catch {
                    return .failed(error)
                }
            }
            if request.id != FleetWire.unanswered { answer(request, reply, sent: probe.anySent) }
        }

        private func directory(_ connection: UInt64) throws(FleetError) -> FleetDirectory {
            guard let directory = state.withLock({ $0.directories[connection] }) else {
                throw FleetError(.connectionClosed)
            }
            return directory
        }

        private func perform(_ call: FleetWire.Call, on connection: UInt64) async throws(FleetError) -> FleetWire.Reply
        {
            switch call {
            case .connect(let endpoint, let password):
                let directory = try await FleetDirectory.connect(to: endpoint, password: password, logger: logger)
                let replaced = state.withLock { $0.directories.updateValue(directory, forKey: connection) }
                await replaced?.close()
                directory.whenClosed { [channel] in Self.send(.closed(connection: connection), on: channel) }
                return .done
            case .close:
                let (directory, listener) = state.withLock {
                    ($0.directories.removeValue(forKey: connection), $0.listeners.removeValue(forKey: connection))
                }
                listener?.cancel()
                await directory?.close()
                return .done
            case .unlisten:
                let listener = state.withLock { $0.listeners.removeValue(forKey: connection) }
                listener?.cancel()
                await listener?.value
                return .done
            case .migrate:
                return .version(try await directory(connection).migrate())
            case .sessionRole:
                return .role(try await directory(connection).sessionRole())
            case .bootstrap(let terminal, let dataKey, let wrapped):
                return .outcome(
                    try await directory(connection).bootstrap(
                        terminal, dataKey: try dataKey.dataKey(), wrapped: wrapped))
            case .issueJoinToken(let issuer, let lifetime):
                return .token(try await directory(connection).issueJoinToken(by: issuer, lifetime: lifetime))
            case .join(let token, let terminal):
                let joined = try await directory(connection).join(with: token, as: terminal)
                return .joined(joined.outcome, state: joined.state)
            case .admit(let token, let dataKeys):
                let keys = try FleetWire.DataKey.dataKeys(dataKeys)
                return .admitted(try await directory(connection).admit(joinedWith: token, dataKeys: keys))
            case .removeTerminal(let id):
                try await directory(connection).removeTerminal(id)
                return .done
            case .rotationDue:
                let due = try await directory(connection).rotationDue()
                return .rotationDue(due.due, newest: due.newest)
            case .rotateDataKeyIfDue(let member, let publicKey, let excluding):
                guard
                    let rotation = try await directory(connection).rotateDataKeyIfDue(
                        by: member, publicKey: Array(publicKey), excluding: Set(excluding))
                else { return .noRotation }
                return .rotation(key: FleetWire.DataKey(rotation.key), unvouched: rotation.unvouched)
            case .vouchForSelf(let terminal, let publicKey):
                return .vouched(try await directory(connection).vouchForSelf(terminal, publicKey: Array(publicKey)))
            case .keyDelivery(let terminal):
                return .keyDelivery(FleetWire.KeyDelivery(try await directory(connection).keyDelivery(for: terminal)))
            case .standing(let terminal):
                let standing = try await directory(connection).standing(of: terminal)
                return .standing(state: standing.state, rotationDue: standing.rotationDue)
            case .terminals:
                return .terminals(try await directory(connection).terminals())
            case .push(let batch):
                return .pushed(try await directory(connection).push(batch))
            case .pull(let cursor, let limit):
                return .changes(try await directory(connection).pull(after: cursor, limit: limit))
            case .recordCursor(let cursor, let terminal):
                try await directory(connection).recordCursor(cursor, for: terminal)
                return .done
            case .feedPosition(let terminal):
                let position = try await directory(connection).feedPosition(for: terminal)
                return .feedPosition(head: position.head, cursor: position.cursor)
            case .useKeyring(let dataKeys):
                let keys = try FleetWire.DataKey.dataKeys(dataKeys)
                try await directory(connection).useKeyring(FleetKeyring(keys))
                return .done
            case .rememberRowVersions(let rows):
                try await directory(connection).rememberRowVersions(rows)
                return .done
            case .listen:
                preconditionFailure("listen is answered by its listener")
            }
        }

        /// Listens on `request.connection`: answers once the LISTEN is in force, then sends a
        /// wake-up per notification until `unlisten`, or `listenEnded` if the connection ends it.
        private func listen(_ request: FleetWire.Request) {
            let connection = request.connection
            let directory: FleetDirectory
            do { directory = try self.directory(connection) } catch {
                send(.answer(id: request.id, reply: .failed(error), sent: false))
                return
            }
            let answered = Mutex(false)
            // Answers the request the first time; false once it was answered.
            let answer: @Sendable (FleetWire.Reply) -> Bool = { [channel] reply in
                guard
                    answered.withLock({ was in
                        defer { was = true }; return !was
                    })
                else { return false }
                Self.send(.answer(id: request.id, reply: reply, sent: true), on: channel)
                return true
            }
            state.withLock { state in
                state.listeners.removeValue(forKey: connection)?.cancel()
                state.listeners[connection] = Task { [channel] in
                    var ended: FleetError?
                    do {
                        try await directory.withChangeWakeups { wakeups in
                            _ = answer(.done)
                            for try await _ in wakeups {
                                Self.send(.wake(connection: connection), on: channel)
                            }
                        }
                    } catch {
                        ended = error as? FleetError ?? FleetError(.directoryUnavailable(String(reflecting: error)))
                    }
                    let reason = ended ?? FleetError(.directoryUnavailable("the connection closed"))
                    if !answer(.failed(reason)), !Task.isCancelled {
                        Self.send(.listenEnded(connection: connection, error: ended), on: channel)
                    }
                }
            }
        }

        /// Ends every listener and closes every connection (the daemon has gone).
        func closeAll() async {
            let (directories, listeners) = state.withLock { state in
                defer { state = State() }
                return (Array(state.directories.values), Array(state.listeners.values))
            }
            for listener in listeners { listener.cancel() }
            for directory in directories { await directory.close() }
        }
    }
}

/// The helper's log lines, sent to the daemon, which logs them as its own (to the journal).
struct FleetWireLogHandler: LogHandler {
    let channel: any Channel
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .info

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var fields: [String: String] = [:]
        for (key, value) in metadata.merging(event.metadata ?? [:], uniquingKeysWith: { $1 }) {
            fields[key] = "\(value)"
        }
        FleetHelperServer.Server.send(
            .log(level: event.level.rawValue, message: "\(event.message)", metadata: fields, source: event.source),
            on: channel)
    }
}
