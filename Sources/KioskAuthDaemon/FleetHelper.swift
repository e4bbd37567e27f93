import CKioskAuthSystem
import FoundationEssentials
import KioskAuthFleet
import Logging
import NIOCore
import NIOPosix
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// How the fleet agent opens a connection to the directory. The agent and the sync service see
/// only `FleetDirectoryConnection`; which client stands behind it is chosen here.
struct FleetDirectoryConnector: Sendable {
    let connect: @Sendable (FleetEndpoint, String?, Logger) async throws(FleetError) -> any FleetDirectoryConnection

    /// Through the fleet helper, `kioskauth-fleet` (docs/fleet.md §9.11): the directory's client,
    /// postgres-nio with Foundation and ICU, runs in a process of its own, which never sees the
    /// store key.
    static func helper(_ helper: FleetHelper) -> FleetDirectoryConnector {
        FleetDirectoryConnector { endpoint, password, logger throws(FleetError) in
            try await helper.connect(to: endpoint, password: password, logger: logger)
        }
    }
}

/// Starts the fleet helper when the first directory connection is asked for, and again when a
/// connection is asked for after it stopped (it crashed, or was killed); every connection the
/// daemon holds goes through the one running helper. The helper ends when the daemon closes its
/// socket or dies, and is stopped once no connection has been open for `idleStop` (a terminal
/// outside a fleet that ran one admin command keeps no helper; a member always holds two).
actor FleetHelper {
    /// How long the helper is kept with no connection open.
    static let idleStop: Duration = .seconds(10)

    /// The daemon's event loops (the shared ones when nil: a test's authority).
    private let group: (any EventLoopGroup)?
    private let logger: Logger
    /// How long a request may go unanswered before the helper is taken for hung and replaced.
    let callDeadline: Duration
    private var running: FleetHelperProcess?
    private var starting: Task<FleetHelperProcess, any Error>?
    private var idleTimer: Task<Void, Never>?
    /// Every helper started and not yet stopped by `stop()`.
    private var started: [FleetHelperProcess] = []
    /// Set by `stop()`: no helper is started after it.
    private var isStopped = false

    /// `operationTimeout`: `[Fleet] OperationTimeoutSec`. A request the helper has not answered
    /// in twice that (at least 30 s: the directory's own connect timeout is 10 s) means a helper
    /// that stopped serving, not a slow directory, whose operations the agent gives up on first.
    init(group: (any EventLoopGroup)?, operationTimeout: Double = 20, logger: Logger) {
        self.group = group
        self.logger = logger
        var deadline = Duration.milliseconds(Int64(max(2 * operationTimeout, 30) * 1000))
        #if DEBUG
            if let seconds = testHookSeconds("KIOSKAUTH_TEST_FLEET_HELPER_DEADLINE") {
                deadline = .milliseconds(Int64(seconds * 1000))
            }
        #endif
        self.callDeadline = deadline
    }

    /// A new directory connection, made by the helper. A helper found dead on the way (its
    /// socket closed before the request could be sent) is replaced once.
    func connect(
        to endpoint: FleetEndpoint, password: String?, logger: Logger
    ) async throws(FleetError)
        -> any FleetDirectoryConnection
    {
        idleTimer?.cancel()
        idleTimer = nil
        var attempt = 0
        while true {
            attempt += 1
            let process = try await process()
            // Counted open from here, so the helper is not stopped under a connect in progress.
            let id = process.opened()
            let connection = FleetHelperConnection(process: process, id: id, logger: logger) { [weak self] in
                Task { await self?.released(process) }
            }
            do throws(FleetError) {
                let reply = try await process.call(
                    id, .connect(endpoint: endpoint, password: password), logger: logger)
                guard case .done = reply else { throw FleetHelperProcess.unexpected(reply, to: "connect") }
                return connection
            } catch {
                connection.closeWithoutWaiting()
                guard error.isClosedBeforeSending, attempt < 2 else { throw error }
                process.abandon()
            }
        }
    }

    /// A connection of `process` closed: with none left open, the helper is stopped after
    /// `idleStop` unless one is opened meanwhile.
    private func released(_ process: FleetHelperProcess) {
        guard process === running, process.openConnections == 0 else { return }
        idleTimer?.cancel()
        idleTimer = Task {
            try? await Task.sleep(for: Self.idleStop)
            guard !Task.isCancelled else { return }
            await stopIfIdle(process)
        }
    }

    private func stopIfIdle(_ process: FleetHelperProcess) async {
        guard process === running, process.openConnections == 0 else { return }
        running = nil
        logger.debug("fleet helper idle: stopping it", metadata: ["pid": "\(process.pid)"])
        await process.stop()
    }

    /// Stops every helper started (one that is starting too), fails the calls in flight, waits
    /// for them to exit, and starts none after (the daemon's stop). Called first when the stop
    /// begins, so that no service waits on a helper, and again once the services have ended.
    func stop() async {
        isStopped = true
        idleTimer?.cancel()
        if let starting, let process = try? await starting.value, !started.contains(where: { $0 === process }) {
            started.append(process)
        }
        for process in started { await process.stop() }
        started = []
        running = nil
    }

    /// The helper that runs, started if none does.
    private func process() async throws(FleetError) -> FleetHelperProcess {
        if let running, !running.hasEnded { return running }
        guard !isStopped else { throw FleetError(.directoryUnavailable("kioskauthd is stopping")) }
        let task: Task<FleetHelperProcess, any Error>
        if let starting {
            task = starting
        } else {
            task = Task { [group, logger, callDeadline] in
                try await FleetHelperProcess.start(
                    group: group ?? MultiThreadedEventLoopGroup.singleton, callDeadline: callDeadline, logger: logger)
            }
            starting = task
        }
        do {
            let process = try await task.value
            if starting == task {
                starting = nil
                running = process
                started.removeAll { $0.hasEnded }
                started.append(process)
            }
            if isStopped {
                await process.stop()
                throw FleetError(.directoryUnavailable("kioskauthd is stopping"))
            }
            return process
        } catch {
            if starting == task { starting = nil }
            throw error as? FleetError ?? FleetError(.directoryUnavailable("cannot start the fleet helper: \(error)"))
        }
    }

    /// Where the helper is installed: `../libexec/kioskauth/kioskauth-fleet` from the daemon's
    /// own directory (so `/usr/sbin/kioskauthd` runs `/usr/libexec/kioskauth/kioskauth-fleet`),
    /// else beside the daemon (a build directory).
    static func executablePath() -> String? {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let length = readlink("/proc/self/exe", &buffer, buffer.count - 1)
        guard length > 0 else { return nil }
        let executable = String(decoding: buffer[..<length].map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard let slash = executable.lastIndex(of: "/") else { return nil }
        let directory = String(executable[..<slash])
        for candidate in [directory + "/../libexec/kioskauth/kioskauth-fleet", directory + "/kioskauth-fleet"]
        where access(candidate, X_OK) == 0 {
            return candidate
        }
        return nil
    }
}

/// One running `kioskauth-fleet`, and the requests in flight to it.
final class FleetHelperProcess: Sendable {
    let pid: pid_t
    private let channel: any Channel
    /// How long a request may go unanswered before the helper is taken for hung (`FleetHelper`).
    private let callDeadline: Duration
    private let logger: Logger
    private let state = Mutex(State())

    private struct State {
        var nextRequest: UInt64 = 1
        var nextConnection: UInt64 = 1
        var pending: [UInt64: CheckedContinuation<Answer, Never>] = [:]
        /// The `callDeadline` watch of each pending request.
        var watchdogs: [UInt64: Task<Void, Never>] = [:]
        var listeners: [UInt64: AsyncThrowingStream<Void, any Error>.Continuation] = [:]
        var closed: Set<UInt64> = []
        /// Connections opened and not yet closed by the daemon.
        var open: Set<UInt64> = []
        /// Why the helper can no longer be asked anything, once it cannot.
        var ended: String?
        /// Set once the process has been waited for; `stop()` callers waiting for that.
        var exited = false
        var exitWaiters: [CheckedContinuation<Void, Never>] = []
    }

    /// How a request ended.
    private enum Answer {
        case reply(FleetWire.Reply, sent: Bool)
        /// Never reached the helper.
        case unsent(String)
        /// Reached it, but it stopped before answering: a statement may have been sent.
        case lost(String)
    }

    private init(pid: pid_t, channel: any Channel, callDeadline: Duration, logger: Logger) {
        self.pid = pid
        self.channel = channel
        self.callDeadline = callDeadline
        self.logger = logger
    }

    /// Starts the helper on a new socket pair.
    static func start(
        group: any EventLoopGroup, callDeadline: Duration, logger: Logger
    ) async throws(FleetError) -> FleetHelperProcess {
        guard let path = FleetHelper.executablePath() else {
            throw FleetError(
                .directoryUnavailable(
                    "the fleet helper kioskauth-fleet is not installed (looked in ../libexec/kioskauth and beside kioskauthd)"
                ))
        }
        let arguments = [path, "--wire", FleetWire.version, "--log-level", logger.logLevel.rawValue]
        var descriptor: Int32 = -1
        var pid: pid_t = 0
        var cArguments = arguments.map { strdup($0) }
        cArguments.append(nil)
        defer { for argument in cArguments { free(argument) } }
        let result = kioskauth_spawn_connected(path, cArguments, &descriptor, &pid)
        guard result == 0 else {
            throw FleetError(
                .directoryUnavailable("cannot start the fleet helper \(path): \(String(cString: strerror(result)))"))
        }
        let frames = FleetWire.frameStream()
        let stream = FleetWireFrameStream(frames.continuation)
        let channel: any Channel
        do {
            channel = try await ClientBootstrap(group: group)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FleetWireFrameDecoder()))
                        try channel.pipeline.syncOperations.addHandler(stream)
                    }
                }
                .withConnectedSocket(descriptor).get()
        } catch {
            // NIO closed the descriptor once its channel held it; closing it again here could
            // close another thread's new descriptor of the same number.
            kill(pid, SIGKILL)
            var status: Int32 = 0
            _ = waitpid(pid, &status, 0)
            throw FleetError(.directoryUnavailable("cannot talk to the fleet helper: \(error)"))
        }
        let process = FleetHelperProcess(pid: pid, channel: channel, callDeadline: callDeadline, logger: logger)
        logger.debug("fleet helper started", metadata: ["pid": "\(pid)"])
        Task { await process.receive(frames.stream, from: stream) }
        return process
    }

    var hasEnded: Bool { state.withLock { $0.ended != nil } }

    /// A new connection's number, counted open until `forget`.
    func opened() -> UInt64 {
        state.withLock { state in
            defer { state.nextConnection += 1 }
            state.open.insert(state.nextConnection)
            return state.nextConnection
        }
    }

    /// The connections opened and not yet closed.
    var openConnections: Int { state.withLock { $0.open.count } }

    /// Whether the helper reported `connection` closed, or has stopped.
    func isClosed(_ connection: UInt64) -> Bool {
        state.withLock { $0.ended != nil || $0.closed.contains(connection) }
    }

    /// Runs `call` on `connection` in the helper. Marks the caller's `FleetSendProbe` when a
    /// statement may have reached the directory: the helper says so in its answer, and a helper
    /// that stopped before answering may have sent one.
    func call(_ connection: UInt64, _ call: FleetWire.Call, logger: Logger) async throws(FleetError) -> FleetWire.Reply
    {
        let answer = await withCheckedContinuation { (continuation: CheckedContinuation<Answer, Never>) in
            let id = state.withLock { state -> UInt64? in
                guard state.ended == nil else { return nil }
                defer { state.nextRequest += 1 }
                state.pending[state.nextRequest] = continuation
                return state.nextRequest
            }
            guard let id else {
                continuation.resume(returning: .unsent(state.withLock { $0.ended } ?? "the fleet helper stopped"))
                return
            }
            let frame: ByteBuffer
            do {
                frame = try FleetWire.frame(
                    FleetWire.Request(id: id, connection: connection, call: call), allocator: channel.allocator)
            } catch {
                // Too large for the wire: a failure of this call, not a closed connection (which
                // the caller would retry on a new one, to the same end).
                let failure = FleetError(
                    .directoryUnavailable("cannot send \(call.name) to the fleet helper: \(error)"))
                resume(id, with: .reply(.failed(failure), sent: false))
                return
            }
            channel.writeAndFlush(frame).whenFailure { [self] error in
                // Not all of it was written, so the helper never read a whole request.
                resume(id, with: .unsent("cannot send \(call.name) to the fleet helper: \(error)"))
            }
            watch(id, call: call.name)
        }
        switch answer {
        case .reply(let reply, let sent):
            if sent { FleetSendProbe.current?.markSent() }
            if case .failed(let error) = reply { throw error }
            return reply
        case .unsent(let reason):
            logger.debug("fleet helper call not sent", metadata: ["call": "\(call.name)", "reason": "\(reason)"])
            throw FleetError(.connectionClosed)
        case .lost(let reason):
            FleetSendProbe.current?.markSent()
            throw FleetError(.directoryUnavailable(reason))
        }
    }

    /// Closes the helper's socket (ending it, and failing every call in flight) if request
    /// `id` is still unanswered after `callDeadline`.
    private func watch(_ id: UInt64, call: String) {
        let watchdog = Task { [self] in
            try? await Task.sleep(for: callDeadline)
            guard state.withLock({ $0.pending[id] != nil }) else { return }
            logger.error(
                "fleet helper did not answer: stopping it",
                metadata: ["call": "\(call)", "pid": "\(pid)", "after": "\(callDeadline)"])
            try? await channel.close()
        }
        // Ended by the answer (`resume`); kept only while the request is pending.
        let answered = state.withLock { state in
            guard state.pending[id] != nil else { return true }
            state.watchdogs[id] = watchdog
            return false
        }
        if answered { watchdog.cancel() }
    }

    /// Sends `call` without waiting for its answer (a connection dropped unclosed).
    func post(_ connection: UInt64, _ call: FleetWire.Call) {
        guard !hasEnded,
            let frame = try? FleetWire.frame(
                FleetWire.Request(id: FleetWire.unanswered, connection: connection, call: call),
                allocator: channel.allocator)
        else { return }
        channel.writeAndFlush(frame, promise: nil)
    }

    private func resume(_ id: UInt64, with answer: Answer) {
        let (waiting, watchdog) = state.withLock {
            ($0.pending.removeValue(forKey: id), $0.watchdogs.removeValue(forKey: id))
        }
        watchdog?.cancel()
        waiting?.resume(returning: answer)
    }

    /// Wake-ups for `connection`, from now on; `stopListening` ends them.
    func listen(_ connection: UInt64) -> AsyncThrowingStream<Void, any Error> {
        // A wake-up means "pull now": any number of them pending is one pull, so one is kept
        // (and a helper that floods them cannot grow the daemon's memory).
        let (stream, continuation) = AsyncThrowingStream<Void, any Error>.makeStream(
            bufferingPolicy: .bufferingNewest(1))
        let ended = state.withLock { state -> String? in
            if let ended = state.ended { return ended }
            state.listeners.updateValue(continuation, forKey: connection)?.finish()
            return nil
        }
        if let ended { continuation.finish(throwing: FleetError(.directoryUnavailable(ended))) }
        return stream
    }

    func stopListening(_ connection: UInt64) {
        state.withLock { $0.listeners.removeValue(forKey: connection) }?.finish()
    }

    /// `connection` is closed: no longer listened to or counted open.
    func forget(_ connection: UInt64) {
        stopListening(connection)
        state.withLock { state in
            state.closed.remove(connection)
            state.open.remove(connection)
        }
    }

    // MARK: What the helper sends

    private func receive(_ frames: AsyncStream<ByteBuffer>, from stream: FleetWireFrameStream) async {
        var reason = "the fleet helper stopped"
        for await frame in frames {
            stream.taken(frame)
            do {
                dispatch(try FleetWire.decode(FleetWire.Message.self, from: frame))
            } catch {
                reason = "the fleet helper sent a message that does not decode"
                logger.error("\(reason): stopping it", metadata: ["error": "\(error)"])
                try? await channel.close()
                break
            }
        }
        if stream.overflowed {
            reason =
                "the fleet helper ran \(FleetWire.maximumQueuedFrames) messages or one largest message ahead of the daemon"
            logger.error("\(reason): stopped it", metadata: ["pid": "\(pid)"])
        }
        end(reason)
    }

    private func dispatch(_ message: FleetWire.Message) {
        switch message {
        case .answer(let id, let reply, let sent):
            resume(id, with: .reply(reply, sent: sent))
        case .wake(let connection):
            _ = state.withLock { $0.listeners[connection] }?.yield(())
        case .listenEnded(let connection, let error):
            let listener = state.withLock { $0.listeners.removeValue(forKey: connection) }
            if let error { listener?.finish(throwing: error) } else { listener?.finish() }
        case .closed(let connection):
            // Only a connection the daemon holds: the helper cannot grow the set with others.
            state.withLock { state in
                if state.open.contains(connection) { state.closed.insert(connection) }
            }
        case .log(let level, let message, let metadata, _):
            let line = Self.helperLogLine(message: message, metadata: metadata, pid: pid)
            logger.log(level: Logger.Level(rawValue: level) ?? .info, "\(line.message)", metadata: line.metadata)
        }
    }

    /// A line the helper sent, as the daemon logs it. The helper is not trusted with the daemon's
    /// journal fields: each of its keys is logged under `helper_` (so it can never be a
    /// `MESSAGE_ID` or `KIOSKAUTH_*` field that admins and the audit catalog rely on), and the
    /// message, the keys and the values are cut to a bounded size.
    static func helperLogLine(
        message: String, metadata: [String: String], pid: pid_t
    ) -> (message: String, metadata: Logger.Metadata) {
        var fields: Logger.Metadata = ["helper_pid": "\(pid)"]
        for key in metadata.keys.sorted().prefix(16) {
            fields["helper_" + String(key.prefix(48))] = .string(String(metadata[key]!.prefix(1024)))
        }
        return ("fleet helper: " + String(message.prefix(2048)), fields)
    }

    /// The helper's socket closed: every call still waiting fails, every listener ends, and the
    /// process is waited for (killed if it does not exit).
    private func end(_ reason: String) {
        let (pending, listeners) = state.withLock { state in
            state.ended = state.ended ?? reason
            defer {
                state.pending = [:]
                state.listeners = [:]
                for watchdog in state.watchdogs.values { watchdog.cancel() }
                state.watchdogs = [:]
            }
            return (Array(state.pending.values), Array(state.listeners.values))
        }
        for waiting in pending {
            waiting.resume(returning: .lost("\(reason) before answering"))
        }
        for listener in listeners { listener.finish(throwing: FleetError(.directoryUnavailable(reason))) }
        channel.close(promise: nil)
        let pid = pid
        let logger = logger
        Task.detached { [self] in
            let status = await Self.reap(pid)
            let waiters = self.state.withLock { state in
                state.exited = true
                defer { state.exitWaiters = [] }
                return state.exitWaiters
            }
            for waiter in waiters { waiter.resume() }
            let exit =
                status.map { status in
                    (status & 0x7f) == 0 ? "exit status \((status >> 8) & 0xff)" : "signal \(status & 0x7f)"
                } ?? "unknown"
            if status == 0 {
                logger.debug("fleet helper exited", metadata: ["pid": "\(pid)"])
            } else {
                logger.warning("fleet helper ended", metadata: ["pid": "\(pid)", "how": "\(exit)"])
            }
        }
    }

    /// Takes the helper for dead at once (its socket refused a request): closes its socket, so
    /// that the next connection starts another; it is waited for as after any end.
    func abandon() {
        state.withLock { state in state.ended = state.ended ?? "the fleet helper's socket closed" }
        channel.close(promise: nil)
    }

    /// Closes the helper's socket, which ends it, and waits until it has been waited for.
    func stop() async {
        try? await channel.close()
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let exited = state.withLock { state in
                if !state.exited { state.exitWaiters.append(continuation) }
                return state.exited
            }
            if exited { continuation.resume() }
        }
    }

    /// Waits for `pid` to exit, for up to 2 s (a helper whose socket closed only closes its
    /// directory connections), then kills it.
    private static func reap(_ pid: pid_t) async -> Int32? {
        var status: Int32 = 0
        for _ in 0..<40 {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid { return status }
            if reaped < 0 { return nil }
            try? await Task.sleep(for: .milliseconds(50))
        }
        kill(pid, SIGKILL)
        return waitpid(pid, &status, 0) == pid ? status : nil
    }

    static func unexpected(_ reply: FleetWire.Reply, to call: String) -> FleetError {
        FleetError(.directoryUnavailable("the fleet helper answered \(call) with \(reply)"))
    }
}

/// A directory connection the helper holds for the daemon.
final class FleetHelperConnection: FleetDirectoryConnection {
    let process: FleetHelperProcess
    let id: UInt64
    private let logger: Logger
    private let closedHere = Mutex(false)
    /// Called once the connection is closed.
    private let released: @Sendable () -> Void

    init(process: FleetHelperProcess, id: UInt64, logger: Logger, released: @escaping @Sendable () -> Void) {
        self.process = process
        self.id = id
        self.logger = logger
        self.released = released
    }

    deinit {
        // Dropped without close(): the helper closes its connection anyway.
        closeWithoutWaiting()
    }

    var isClosed: Bool { closedHere.withLock { $0 } || process.isClosed(id) }

    func close() async {
        closeWithoutWaiting()
    }

    /// Asks the helper to close the connection without waiting for it to: a close must never
    /// wait on a helper that stopped answering (the daemon's stop closes connections too).
    func closeWithoutWaiting() {
        guard
            !closedHere.withLock({ was in
                defer { was = true }; return was
            })
        else { return }
        process.post(id, .close)
        process.forget(id)
        released()
    }

    private func ask<Value>(
        _ call: FleetWire.Call, _ extract: (FleetWire.Reply) -> Value?
    ) async throws(FleetError) -> Value {
        let reply = try await process.call(id, call, logger: logger)
        guard let value = extract(reply) else { throw FleetHelperProcess.unexpected(reply, to: call.name) }
        return value
    }

    private func perform(_ call: FleetWire.Call) async throws(FleetError) {
        try await ask(call) { if case .done = $0 { () } else { nil } }
    }

    @discardableResult
    func migrate() async throws(FleetError) -> Int32 {
        try await ask(.migrate) { if case .version(let version) = $0 { version } else { nil } }
    }

    func sessionRole() async throws(FleetError) -> FleetSessionRole {
        try await ask(.sessionRole) { if case .role(let role) = $0 { role } else { nil } }
    }

    func bootstrap(
        _ terminal: TerminalRegistration, dataKey: FleetDataKey, wrapped: WrappedDataKey
    ) async throws(FleetError) -> FleetAttemptOutcome {
        try await ask(.bootstrap(terminal: terminal, dataKey: FleetWire.DataKey(dataKey), wrapped: wrapped)) {
            if case .outcome(let outcome) = $0 { outcome } else { nil }
        }
    }

    func issueJoinToken(by issuer: UUID, lifetime: Duration) async throws(FleetError) -> JoinToken {
        try await ask(.issueJoinToken(issuer: issuer, lifetime: lifetime)) {
            if case .token(let token) = $0 { token } else { nil }
        }
    }

    @discardableResult
    func join(
        with token: JoinToken, as terminal: TerminalRegistration
    ) async throws(FleetError) -> (outcome: FleetAttemptOutcome, state: String) {
        try await ask(.join(token: token, terminal: terminal)) {
            if case .joined(let outcome, let state) = $0 { (outcome, state) } else { nil }
        }
    }

    func admit(joinedWith token: JoinToken, dataKeys: [FleetDataKey]) async throws(FleetError) -> UUID {
        try await ask(.admit(token: token, dataKeys: dataKeys.map(FleetWire.DataKey.init))) {
            if case .admitted(let id) = $0 { id } else { nil }
        }
    }

    func removeTerminal(_ id: UUID) async throws(FleetError) {
        try await perform(.removeTerminal(id))
    }

    func rotationDue() async throws(FleetError) -> (due: Bool, newest: Int32) {
        try await ask(.rotationDue) { if case .rotationDue(let due, let newest) = $0 { (due, newest) } else { nil } }
    }

    func rotateDataKeyIfDue(
        by member: UUID, publicKey: [UInt8], excluding removed: Set<UUID>
    ) async throws(FleetError) -> FleetRotation? {
        let call = FleetWire.Call.rotateDataKeyIfDue(
            member: member, publicKey: Data(publicKey), excluding: Array(removed))
        let reply = try await process.call(id, call, logger: logger)
        switch reply {
        case .noRotation: return nil
        case .rotation(let key, let unvouched): return FleetRotation(key: try key.dataKey(), unvouched: unvouched)
        default: throw FleetHelperProcess.unexpected(reply, to: call.name)
        }
    }

    func vouchForSelf(_ terminal: UUID, publicKey: [UInt8]) async throws(FleetError) -> Bool {
        try await ask(.vouchForSelf(terminal: terminal, publicKey: Data(publicKey))) {
            if case .vouched(let vouched) = $0 { vouched } else { nil }
        }
    }

    func keyDelivery(for terminal: UUID) async throws(FleetError) -> FleetKeyDelivery {
        try await ask(.keyDelivery(terminal: terminal)) {
            if case .keyDelivery(let delivery) = $0 { delivery.delivery } else { nil }
        }
    }

    func standing(of terminal: UUID) async throws(FleetError) -> (state: String?, rotationDue: Bool) {
        try await ask(.standing(terminal: terminal)) {
            if case .standing(let state, let due) = $0 { (state, due) } else { nil }
        }
    }

    func terminals() async throws(FleetError) -> [FleetTerminal] {
        try await ask(.terminals) { if case .terminals(let terminals) = $0 { terminals } else { nil } }
    }

    func push(_ batch: PushBatch) async throws(FleetError) -> PushOutcome {
        try await ask(.push(batch)) { if case .pushed(let outcome) = $0 { outcome } else { nil } }
    }

    func pull(after cursor: Int64, limit: Int) async throws(FleetError) -> [FleetChange] {
        try await ask(.pull(after: cursor, limit: limit)) {
            if case .changes(let changes) = $0 { changes } else { nil }
        }
    }

    func recordCursor(_ cursor: Int64, for terminal: UUID) async throws(FleetError) {
        try await perform(.recordCursor(cursor, terminal: terminal))
    }

    func feedPosition(for terminal: UUID) async throws(FleetError) -> (head: Int64, cursor: Int64) {
        try await ask(.feedPosition(terminal: terminal)) {
            if case .feedPosition(let head, let cursor) = $0 { (head, cursor) } else { nil }
        }
    }

    /// A connection that did not take the keyring is closed: its pulls would come back
    /// unverifiable, and the agent would refuse those rows and move its cursor past them, so the
    /// terminal would miss them for good (a suspension among them). Closed, the next use makes a
    /// new connection, which is handed the keyring again.
    func useKeyring(_ keyring: FleetKeyring) async {
        await handOver(.useKeyring(keyring.heldKeys.map(FleetWire.DataKey.init)), "the keyring")
    }

    /// One request for all of them: a store with many rows makes one round trip, not one each.
    /// A connection that did not take them is closed too: its pulls could not tell an old row
    /// written back from a new one.
    func rememberRowVersions(_ rows: [FleetRowVersion]) async {
        await handOver(.rememberRowVersions(rows), "the row versions")
    }

    /// Hands the helper what every pull on this connection depends on; failing that, closes the
    /// connection, so that the next use makes one that takes it again.
    private func handOver(_ call: FleetWire.Call, _ what: String) async {
        do { try await perform(call) } catch {
            logger.warning("fleet helper did not take \(what): reconnecting", metadata: ["error": "\(error)"])
            closeWithoutWaiting()
        }
    }

    func withChangeWakeups<Value: Sendable>(_ body: (FleetWakeups) async throws -> Value) async throws -> Value {
        // Registered before LISTEN is asked for, so no wake-up sent right after it is lost.
        let stream = process.listen(id)
        do { try await perform(.listen) } catch {
            process.stopListening(id)
            throw error
        }
        var iterator = stream.makeAsyncIterator()
        let result: Result<Value, any Error>
        do {
            result = .success(try await body(FleetWakeups { try await iterator.next() }))
        } catch {
            result = .failure(error)
        }
        // Not waited for either: the helper ends the LISTEN, and its wake-ups are no longer taken.
        process.post(id, .unlisten)
        process.stopListening(id)
        return try result.get()
    }
}
