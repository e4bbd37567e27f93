import CKioskAuthSystem
import Dispatch
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
public import Logging
import NIOCore
public import NIOPosix
public import ServiceLifecycle
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// Where the server listens.
public enum ListenTarget: Sendable {
    /// A socket passed by the service manager (`LISTEN_FDS`); never unlinked by us.
    case inherited(fd: Int32)
    /// A path we bind ourselves (mode 0666: every method authorises its caller), and unlink at
    /// exit, while holding its lock (`SocketPathLock`).
    case path(String, lock: SocketPathLock)
}

/// Counts open connections, in total, for unprivileged callers and per uid, and keeps them
/// reachable for draining. Unprivileged callers together may hold at most
/// `maxTotal - reserved` connections, so that however many uids fill their share, root and the
/// admin and authenticator groups (the greeter) still get in.
final class ConnectionRegistry: Sendable {
    private struct State {
        var total = 0
        var unprivileged = 0
        var perUID: [Int: Int] = [:]
        var channels: [UInt64: (channel: any Channel, privileged: Bool)] = [:]
        var nextID: UInt64 = 1
        var draining = false
    }
    private let state = Mutex(State())
    let maxTotal: Int
    let maxPerUID: Int
    /// Connections unprivileged callers may hold together.
    let maxUnprivileged: Int

    init(maxTotal: Int, maxPerUID: Int, reserved: Int) {
        self.maxTotal = maxTotal
        self.maxPerUID = maxPerUID
        // At most half is reserved, so a small MaxConnections never shuts unprivileged callers out.
        self.maxUnprivileged = maxTotal - min(reserved, maxTotal / 2)
    }

    enum Admission { case admitted(UInt64), rejected(limit: Int), draining }

    /// Admits a connection from `uid`, or says which limit it hit. Root is exempt from the
    /// per-uid limit, not from the total; only privileged callers may use the reserved share.
    func admit(uid: Int, privileged: Bool, channel: any Channel) -> Admission {
        state.withLock { state in
            if state.draining { return .draining }
            if state.total >= maxTotal { return .rejected(limit: maxTotal) }
            if !privileged, state.unprivileged >= maxUnprivileged { return .rejected(limit: maxUnprivileged) }
            if uid != 0, state.perUID[uid, default: 0] >= maxPerUID { return .rejected(limit: maxPerUID) }
            state.total += 1
            if !privileged { state.unprivileged += 1 }
            state.perUID[uid, default: 0] += 1
            let id = state.nextID
            state.nextID += 1
            state.channels[id] = (channel, privileged)
            return .admitted(id)
        }
    }

    func release(id: UInt64, uid: Int) {
        state.withLock { state in
            guard let entry = state.channels.removeValue(forKey: id) else { return }
            state.total -= 1
            if !entry.privileged { state.unprivileged -= 1 }
            state.perUID[uid, default: 1] -= 1
            if state.perUID[uid] == 0 { state.perUID[uid] = nil }
        }
    }

    /// Stops admitting and asks every open connection to close once its current call is done.
    func drain() {
        let channels = state.withLock { state -> [any Channel] in
            state.draining = true
            return state.channels.values.map(\.channel)
        }
        for channel in channels {
            channel.triggerUserOutboundEvent(DrainRequest(), promise: nil)
        }
    }

    var openConnections: Int { state.withLock { $0.total } }
}

/// The socket, bound and listening before the authority exists, so that start-up binds it (on the
/// event loop's thread) while the store is opened and checked, and served once a `VarlinkServer`
/// is attached. Until then nothing is accepted (the server channel does not read): a client
/// that connects waits in the kernel's backlog, as with socket activation, and holds no file
/// descriptor of ours, so connecting during start-up cannot exhaust the daemon's descriptors
/// before the connection limits apply. Start-up that fails after the bind calls `abandon`,
/// which closes the socket (the kernel resets what waits in the backlog) and unlinks a path it
/// bound.
public final class VarlinkListener: Sendable {
    let target: ListenTarget
    let channel: NIOAsyncChannel<VarlinkServer.Connection, Never>
    private let attached: EventLoopPromise<VarlinkServer>

    private init(
        target: ListenTarget, channel: NIOAsyncChannel<VarlinkServer.Connection, Never>,
        attached: EventLoopPromise<VarlinkServer>, bound: FileIdentity?
    ) {
        self.target = target
        self.channel = channel
        self.attached = attached
        self.bound = Mutex(bound)
    }

    /// Whether the socket was passed by the service manager.
    var isInherited: Bool {
        if case .inherited = target { true } else { false }
    }

    /// The server was not started: no connection was ever set up.
    struct NotServed: Error {}

    /// Binds `target` on `group` and listens.
    public static func bind(
        target: ListenTarget, group: MultiThreadedEventLoopGroup, logger: Logger
    ) async throws
        -> VarlinkListener
    {
        let attached = group.next().makePromise(of: VarlinkServer.self)
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.autoRead, value: false)  // accepting starts at `attach`
            .childChannelOption(.allowRemoteHalfClosure, value: false)
            .childChannelOption(
                .writeBufferWaterMark,
                value: .init(
                    low: DaemonConfiguration.Socket.outputHighWaterMark / 2,
                    high: DaemonConfiguration.Socket.outputHighWaterMark))
        // Runs only once accepting started, so after `attach`; failed (the child is closed) when
        // the socket is abandoned.
        let initializer: @Sendable (any Channel) -> EventLoopFuture<VarlinkServer.Connection> = { channel in
            attached.futureResult.hop(to: channel.eventLoop).flatMap { server in server.setUp(channel) }
        }
        let channel: NIOAsyncChannel<VarlinkServer.Connection, Never>
        var bound: FileIdentity?
        do {
            switch target {
            case .inherited(let fd):
                channel = try await bootstrap.bind(fd, childChannelInitializer: initializer)
                logger.info("listening on the socket passed by the service manager")
            case .path(let path, let lock):
                // Bound here, not by NIO: NIO unlinks the path of a Unix socket it bound when the
                // socket closes, whatever file is there by then (another daemon's, say).
                let (fd, identity) = try Self.listeningSocket(at: path, holding: lock)
                do {
                    channel = try await bootstrap.bind(fd, childChannelInitializer: initializer)
                } catch {
                    // NIO owns the descriptor once its channel exists and closes it on failure;
                    // closing it here too could close a descriptor opened since by another thread.
                    if Self.identity(of: path)?.sameFile(as: identity) == true { unlink(path) }
                    throw error
                }
                bound = identity
                logger.info("listening", metadata: ["socket": "\(path)"])
            }
        } catch {
            attached.fail(NotServed())
            throw error
        }
        return VarlinkListener(target: target, channel: channel, attached: attached, bound: bound)
    }

    /// A listening Unix socket at `path`, and its file's identity. `lock` must be the path's
    /// (`SocketPathLock.acquire(for:)`), held: of two daemons starting at the same moment only
    /// the one holding it looks at the path. Without it, both could find a stale file, and the
    /// later one's unlink would take away the socket the other had just bound (which then served
    /// nobody).
    ///
    /// The directory is one only its owner (the daemon's user or root) can change entries in, or
    /// sticky: the lock is taken only in such a one. A socket file another process still accepts
    /// on is refused (`AlreadyServed`), not replaced; a stale one (connecting is refused, as a
    /// crashed daemon leaves it) is removed first; anything else at the path is refused. The process's umask is
    /// left alone (the store's files are created on another thread meanwhile): the socket file
    /// starts as private as the umask (077) makes it and is then opened to everyone, since every
    /// method authorises its caller (`openToEveryone`).
    static func listeningSocket(at path: String, holding lock: SocketPathLock) throws -> (Int32, FileIdentity) {
        precondition(lock.socketPath == path, "the lock of another path")
        var status = stat()
        if lstat(path, &status) == 0 {
            guard status.st_mode & S_IFMT == S_IFSOCK else { throw ListenError("\(path) exists and is not a socket") }
            switch probe(path) {
            case .served: throw AlreadyServed(path: path)
            case .stale:
                #if DEBUG
                    // Test-only: holds here, between finding the file stale and removing it, so
                    // that a test can start a second daemon inside that window.
                    testHookPause("KIOSKAUTH_TEST_STALE_SOCKET_PAUSE")
                #endif
                unlink(path)
            case .unknown(let error):
                throw ListenError("\(path) exists and cannot be told stale: \(String(cString: strerror(error)))")
            }
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw ListenError("socket: \(String(cString: strerror(errno)))") }
        guard UnixSocketAddress.with(path, { Glibc.bind(fd, $0, $1) }) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw ListenError("bind \(path): \(reason)")
        }
        let made = identity(of: path)
        func fail(_ what: String) -> ListenError {
            let reason = String(cString: strerror(errno))
            close(fd)
            if let made, identity(of: path)?.sameFile(as: made) == true { unlink(path) }
            return ListenError("\(what): \(reason)")
        }
        guard listen(fd, 128) == 0 else { throw fail("listen \(path)") }
        guard let opened = openToEveryone(path) else {
            throw fail("cannot make \(path) mode 0666 without following a link (is /proc mounted?)")
        }
        guard opened.sameFile(as: made) else {
            errno = EPERM
            throw fail("\(path) was replaced while it was bound")
        }
        return (fd, opened)
    }

    /// Refuses a directory whose entries others could replace: one not owned by this user or
    /// root, or writable by its group or by everyone without the sticky bit.
    static func checkDirectory(of path: String) throws {
        let directory = parentDirectory(of: path)
        var status = stat()
        guard stat(directory, &status) == 0 else {
            throw ListenError("\(directory): \(String(cString: strerror(errno)))")
        }
        let writableByOthers = status.st_mode & (S_IWGRP | S_IWOTH) != 0 && status.st_mode & S_ISVTX == 0
        guard status.st_uid == geteuid() || status.st_uid == 0, !writableByOthers else {
            throw ListenError(
                "\(directory) is not a safe directory for the socket (it must belong to this user or root, "
                    + "and others must not be able to replace its entries)")
        }
    }

    /// The directory that holds `path`: everything before its last `/` (`/` itself for a file
    /// in the root, `.` for a bare name). Found by byte, not by splitting and joining the path,
    /// which cost a fifth of a millisecond of every start.
    static func parentDirectory(of path: String) -> String {
        guard let slash = path.utf8.lastIndex(of: UInt8(ascii: "/")) else { return "." }
        return slash == path.utf8.startIndex ? "/" : String(path[..<slash])
    }

    /// Makes the socket file at `path` mode 0666 and returns its identity, or nil (errno set)
    /// when what is there is not a socket file this process made: the file is opened
    /// `O_PATH | O_NOFOLLOW` (a symbolic link is opened as itself, and refused), must be a
    /// socket owned by this user with one link (a hard link to someone else's socket is
    /// refused), and is changed through the descriptor's /proc link, which reaches exactly this
    /// inode. (fchmod on an O_PATH descriptor is refused, and glibc's fchmodat cannot refuse
    /// links on this system; without /proc the socket is not opened to everyone, and start-up
    /// says so.)
    static func openToEveryone(_ path: String) -> FileIdentity? {
        let node = kioskauth_open_node(path)
        guard node >= 0 else { return nil }
        defer { close(node) }
        var status = stat()
        guard fstat(node, &status) == 0, status.st_mode & S_IFMT == S_IFSOCK, status.st_nlink == 1,
            status.st_uid == geteuid()
        else {
            errno = EPERM
            return nil
        }
        guard chmod("/proc/self/fd/\(node)", 0o666) == 0, fstat(node, &status) == 0 else { return nil }
        return FileIdentity(status)
    }

    struct ListenError: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    /// Another process accepts on the socket file at `path`.
    public struct AlreadyServed: Error, CustomStringConvertible {
        public var path: String
        /// Refused at the path's lock (`SocketPathLock`), before the socket file was looked at.
        public var lockHeld = false
        public var description: String {
            lockHeld
                ? "\(path) is served, or being set up, by another kioskauthd (it holds \(path).lock)"
                : "\(path) is served by another process (is kioskauthd already running?)"
        }
    }

    /// What connecting to the socket file at `path` says about it.
    enum Probe: Equatable {
        /// A process accepts on it (the connect succeeded, or its backlog is full).
        case served
        /// Nobody listens: a leftover (ECONNREFUSED).
        case stale
        /// Anything else (another kind of socket, no permission): not ours to remove.
        case unknown(Int32)
    }

    static func probe(_ path: String) -> Probe {
        let fd = socket(
            AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return .unknown(errno) }
        defer { close(fd) }
        if UnixSocketAddress.with(path, { connect(fd, $0, $1) }) == 0 { return .served }
        switch errno {
        case EAGAIN: return .served
        case ECONNREFUSED: return .stale
        case let error: return .unknown(error)
        }
    }

    /// What tells our socket file from one bound later at the same path: its device, inode and
    /// change time (an inode number freed by an unlink is often given to the next file made).
    struct FileIdentity: Equatable {
        var device: UInt64
        var inode: UInt64
        var changed: Int64
        var changedNanoseconds: Int64

        init(_ status: stat) {
            device = UInt64(status.st_dev)
            inode = UInt64(status.st_ino)
            changed = Int64(status.st_ctim.tv_sec)
            changedNanoseconds = Int64(status.st_ctim.tv_nsec)
        }

        /// The same file, whatever happened to its mode since.
        func sameFile(as other: FileIdentity?) -> Bool {
            other.map { device == $0.device && inode == $0.inode } ?? false
        }
    }

    static func identity(of path: String) -> FileIdentity? {
        var status = stat()
        guard lstat(path, &status) == 0 else { return nil }
        return FileIdentity(status)
    }

    /// The socket file this listener bound (as it was once opened to everyone), while it is there.
    private let bound: Mutex<FileIdentity?>

    /// Removes the socket file this listener bound, and only that one: never an inherited
    /// socket, nor a file another process bound at the same path since. Idempotent. The path's
    /// lock stays held: its holder lets go of it (the daemon, once its store is closed).
    func removePath() {
        guard case .path(let path, _) = target else { return }
        bound.withLock { bound in
            guard let ours = bound, let now = Self.identity(of: path), now == ours else { return }
            unlink(path)
            bound = nil
        }
    }

    /// Hands the socket to `server` and starts accepting, the connections waiting first.
    func attach(_ server: VarlinkServer) {
        served.withLock { $0 = true }
        attached.succeed(server)
        channel.channel.setOption(.autoRead, value: true).whenFailure { _ in }
    }

    /// Whether a server was attached; its `run` closes the socket and unlinks the path.
    private let served = Mutex(false)

    /// The socket was never served (start-up failed after the bind, or the services stopped
    /// before the server ran): closes it and the connections accepted so far, and unlinks the
    /// path bound (an inherited socket stays the service manager's). Does nothing once served.
    public func abandon() async {
        guard !served.withLock({ $0 }) else { return }
        attached.fail(NotServed())
        removePath()  // while the socket is still ours and open, so nobody can have replaced it
        try? await channel.channel.close()
    }
}

/// The varlink socket server: a `Service` that accepts until graceful shutdown, then lets calls
/// in progress finish and closes.
public final class VarlinkServer: Service, Sendable {
    private let listener: VarlinkListener
    private let dispatcher: Dispatcher
    private let authority: Authority
    private let configuration: DaemonConfiguration.Socket
    private let logger: Logger
    private let registry: ConnectionRegistry
    /// Calls per second per unprivileged uid.
    private let rateLimit: Mutex<RequestRateLimit>
    private let onListening: @Sendable () -> Void
    /// Returns the memory a burst of calls freed once the socket is quiet again.
    private let memory = MemoryBounds.ReleaseAfterBurst()
    /// Told of every call's beginning and end and of every progress reply, so that it releases
    /// only once the socket has been quiet that long (a call that only waits does not hold it off).
    private let idleRelease: IdleRelease
    private let metrics: DaemonMetrics

    /// How long calls in progress may run after shutdown begins before they are cancelled.
    public static let drainTimeout: Duration = .seconds(10)

    /// What every connection's handlers get, worked out once from the configuration.
    private struct ConnectionLimits {
        var maximumSize: Int
        var idleTimeout: TimeAmount
        var writeTimeout: TimeAmount
        /// The `IdleTimeout` error, encoded.
        var idleReply: [UInt8]
    }
    private let connectionLimits: ConnectionLimits

    /// `dispatcher` routes to `authority`; start-up builds it while the authority restores its
    /// state.
    init(
        listener: VarlinkListener, authority: Authority, dispatcher: Dispatcher,
        configuration: DaemonConfiguration.Socket, idleRelease: IdleRelease, logger: Logger,
        onListening: @escaping @Sendable () -> Void
    ) {
        self.connectionLimits = ConnectionLimits(
            maximumSize: min(configuration.maxMessageSize, VarlinkLimits.maximumMessageSize),
            idleTimeout: .milliseconds(Int64(configuration.idleTimeout * 1000)),
            // A reply nobody reads counts as idle: the connection closes once its output has
            // been stuck over the high-water mark for the write timeout or the idle timeout.
            writeTimeout: .milliseconds(Int64(min(configuration.writeTimeout, configuration.idleTimeout) * 1000)),
            idleReply: Self.encode(APIError.idleTimeout(Int(configuration.idleTimeout))))
        self.listener = listener
        self.authority = authority
        self.dispatcher = dispatcher
        self.metrics = authority.services.metrics
        self.configuration = configuration
        self.logger = logger
        self.onListening = onListening
        self.idleRelease = idleRelease
        self.registry = ConnectionRegistry(
            maxTotal: configuration.maxConnections, maxPerUID: configuration.maxConnectionsPerUID,
            reserved: configuration.reservedConnections)
        self.rateLimit = Mutex(RequestRateLimit(rate: configuration.requestsPerSecondPerUID))
    }

    /// An accepted connection on its way from the server's stream to `serve`.
    ///
    /// One accepted while the server shuts down can be dropped by the server's stream and never
    /// reach `serve`; NIO traps when a channel's writer is released unfinished, so such a
    /// connection finishes its writer and closes its channel itself when it goes. `serve` keeps
    /// the connection alive until it is done with the channel (finishing an already finished
    /// writer, or closing a closed channel, does nothing).
    final class Connection: Sendable {
        let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>
        let caller: Caller?
        let admission: ConnectionRegistry.Admission

        init(channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>, caller: Caller?, admission: ConnectionRegistry.Admission)
        {
            self.channel = channel
            self.caller = caller
            self.admission = admission
        }

        deinit {
            channel.outbound.finish()
            channel.channel.close(promise: nil)
        }
    }

    /// Sets up an accepted connection: its caller, its admission and its handlers.
    func setUp(_ channel: any Channel) -> EventLoopFuture<Connection> {
        let limits = connectionLimits
        return Self.peerCredentials(of: channel).flatMapThrowing { caller in
            let admission: ConnectionRegistry.Admission =
                caller.map {
                    self.registry.admit(uid: $0.uid, privileged: self.authority.isPrivileged($0), channel: channel)
                } ?? .rejected(limit: 0)
            try channel.pipeline.syncOperations.addHandler(
                ByteToMessageHandler(NULFrameDecoder(maximumSize: limits.maximumSize)))
            try channel.pipeline.syncOperations.addHandler(
                IdleGuard(
                    timeout: limits.idleTimeout, writeTimeout: limits.writeTimeout,
                    timeoutReply: ByteBuffer(bytes: limits.idleReply)))
            var identified = caller
            if case .admitted(let id) = admission, let caller {
                identified?.connectionID = id
                let admitted = identified ?? caller
                try channel.pipeline.syncOperations.addHandler(
                    ImmediateCalls { frame in self.immediateAnswer(frame, caller: admitted) })
            }
            let asyncChannel = try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            return Connection(channel: asyncChannel, caller: identified, admission: admission)
        }
    }

    public func run() async throws {
        defer { listener.removePath() }
        let registry = self.registry
        let server = listener.channel
        // READY=1 first: a call accepted while start-up ran is served only after it.
        onListening()
        listener.attach(self)

        try await withGracefulShutdownHandler {
            try await withThrowingTaskGroup(of: Void.self) { outer in
                outer.addTask {
                    try await withThrowingDiscardingTaskGroup { connections in
                        try await server.executeThenClose { inbound in
                            for try await connection in inbound {
                                connections.addTask { await self.serve(connection) }
                            }
                        }
                    }
                }
                // Once shutdown begins, calls in progress get a bounded time to finish.
                outer.addTask {
                    try await gracefulShutdown()
                    try await Task.sleep(for: Self.drainTimeout)
                }
                _ = try await outer.next()
                outer.cancelAll()
            }
        } onGracefulShutdown: {
            self.logger.info("shutting down: no new connections; finishing calls in progress")
            // The file first, while the socket still listens and so cannot have been replaced.
            self.listener.removePath()
            server.channel.close(promise: nil)
            registry.drain()
        }
    }

    /// Reads the peer's credentials from the kernel. Groups that cannot be read become nil,
    /// which grants nothing.
    static func peerCredentials(of channel: any Channel) -> EventLoopFuture<Caller?> {
        guard let provider = channel as? any SocketOptionProvider else {
            return channel.eventLoop.makeSucceededFuture(nil)
        }
        let credentials: EventLoopFuture<kioskauth_peer_credentials> = provider.unsafeGetSocketOption(
            level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(kioskauth_so_peercred()))
        return credentials.flatMap { credentials in
            let groups: EventLoopFuture<kioskauth_peer_groups> = provider.unsafeGetSocketOption(
                level: SocketOptionLevel(SOL_SOCKET), name: SocketOptionName(kioskauth_so_peergroups()))
            return groups.map { list -> Set<Int>? in
                // The buffer is zero-filled past the peer's groups; gid 0 never grants anything.
                withUnsafeBytes(of: list.gids) { raw in
                    Set(raw.bindMemory(to: gid_t.self).filter { $0 != 0 }.map { Int($0) })
                }
            }.recover { _ in nil }
                .map { groups -> Caller? in
                    Caller(
                        uid: Int(credentials.uid), gid: Int(credentials.gid), pid: Int(credentials.pid), groups: groups,
                        connectionID: 0)
                }
        }.recover { _ in nil }
    }

    static func encode(_ error: APIError) -> [UInt8] {
        (try? VarlinkCoding.frame(VarlinkReply(parameters: error.parameters, error: error.name))) ?? [0]
    }

    /// Serves one connection: calls in order, one reply (or a stream for `more`) each.
    private func serve(_ connection: Connection) async {
        defer { withExtendedLifetime(connection) {} }
        let channel = connection.channel
        guard case .admitted(let connectionID) = connection.admission, let caller = connection.caller else {
            let error: APIError
            switch connection.admission {
            case .rejected(let limit): error = .tooManyConnections(limit)
            case .draining: error = .shuttingDown
            case .admitted: error = .permissionDenied("peer credentials unavailable")
            }
            logger.notice("connection refused", metadata: ["error": "\(error.name)"])
            metrics.refused(error: error.name)
            try? await channel.executeThenClose { _, outbound in
                try await outbound.write(ByteBuffer(bytes: Self.encode(error)))
            }
            return
        }
        defer {
            registry.release(id: connectionID, uid: caller.uid)
            memory.connectionClosed(on: channel.channel.eventLoop)
        }
        metrics.connectionAccepted()
        var logger = self.logger
        logger[metadataKey: "peer_uid"] = "\(caller.uid)"
        logger[metadataKey: "peer_pid"] = "\(caller.pid)"
        // A client that goes away cancels its call: a scan in progress stops at once.
        let work = Task {
            do {
                try await channel.executeThenClose { inbound, outbound in
                    do {
                        for try await frame in inbound {
                            let keepOpen = await handle(
                                frame: frame, caller: caller, outbound: outbound, logger: logger)
                            channel.channel.triggerUserOutboundEvent(CallFinished(), promise: nil)
                            if !keepOpen { break }
                        }
                    } catch is NULFrameDecoder.MessageTooLarge {
                        logger.notice("message too large; disconnecting")
                        metrics.refused(error: APIError.tooLarge(configuration.maxMessageSize).name)
                        try? await outbound.write(
                            ByteBuffer(bytes: Self.encode(.tooLarge(configuration.maxMessageSize))))
                    }
                }
            } catch {
                logger.debug("connection ended", metadata: ["error": "\(error)"])
            }
        }
        channel.channel.closeFuture.whenComplete { _ in work.cancel() }
        await withTaskCancellationHandler {
            await work.value
        } onCancel: {
            work.cancel()
        }
        await authority.connectionClosed(connectionID)
    }

    /// Takes a token from the caller's bucket; nil when the call may go ahead, else the seconds
    /// until it may retry.
    private func takeToken(_ caller: Caller) -> Double? {
        let now = Double(DispatchTime.now().uptimeNanoseconds) / 1e9
        return rateLimit.withLock { $0.take(uid: caller.uid, now: now) }
    }

    /// Answers a call on the event loop when its method has an immediate form and the caller
    /// may call now; anything else (malformed, `more`, rate-limited, a method that does I/O, an
    /// answer that needs the actor after all) goes the ordinary way through `handle`.
    private func immediateAnswer(_ frame: ByteBuffer, caller: Caller) -> ImmediateCalls.Answer {
        idleRelease.callSeen()
        guard let call = try? VarlinkCoding.message(VarlinkCall.self, from: frame.readableBytesView),
            call.upgrade != true, call.more != true, let method = dispatcher.immediate(call.method)
        else { return .forward }
        // A refused token is not taken: the ordinary path asks again and says RateLimited.
        if !authority.isPrivileged(caller), takeToken(caller) != nil { return .forward }
        guard let reply = method(caller, call.parameters) else { return .forward }
        return call.oneway == true ? .noReply : .reply(reply)
    }

    /// Handles one message; returns false when the connection must close.
    private func handle(
        frame: ByteBuffer, caller: Caller, outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>, logger: Logger
    ) async -> Bool {
        idleRelease.callSeen()
        let call: VarlinkCall
        do {
            call = try VarlinkCoding.message(VarlinkCall.self, from: frame.readableBytesView)
        } catch {
            logger.notice("malformed message; disconnecting")
            metrics.refused(error: APIError.malformed("").name)
            try? await outbound.write(
                ByteBuffer(
                    bytes: Self.encode(
                        .malformed("not a varlink call: expected a JSON object with a \"method\" string"))))
            return false
        }
        if call.upgrade == true {
            try? await outbound.write(ByteBuffer(bytes: Self.encode(.malformed("protocol upgrades are not supported"))))
            return false
        }
        if !authority.isPrivileged(caller), let retryAfter = takeToken(caller) {
            authority.tallyRefusal(caller, action: .rateLimited, rateLimited: true)
            metrics.refused(
                error: APIError.rateLimited(configuration.requestsPerSecondPerUID, retryAfter: retryAfter).name)
            if call.oneway != true {
                let error = APIError.rateLimited(configuration.requestsPerSecondPerUID, retryAfter: retryAfter)
                try? await outbound.write(ByteBuffer(bytes: Self.encode(error)))
            }
            return true
        }
        let oneway = call.oneway == true
        let wantsMore = call.more == true && !oneway
        let sink = ReplySink(
            send: { [idleRelease] reply in
                guard wantsMore else { return }
                idleRelease.callSeen()  // a scan's or an enrolment's progress is activity too
                try await outbound.write(ByteBuffer(bytes: try VarlinkCoding.frame(reply)))
            }, wantsMore: wantsMore)
        let reply: VarlinkReply
        var keepOpen = true
        let started = ContinuousClock.now
        do {
            let parameters = try await dispatcher.call(
                call.method, caller: caller, parameters: call.parameters, sink: sink)
            reply = VarlinkReply(parameters: parameters)
            metrics.callFinished(method: call.method, duration: ContinuousClock.now - started, error: nil)
        } catch {
            metrics.callFinished(method: call.method, duration: ContinuousClock.now - started, error: error.name)
            reply = VarlinkReply(parameters: error.parameters, error: error.name)
            keepOpen = !error.closesConnection
            logger.debug("call failed", metadata: ["method": "\(call.method)", "error": "\(error.name)"])
        }
        idleRelease.callSeen()  // ended: quiet is counted from here
        if !oneway {
            do {
                try await outbound.write(ByteBuffer(bytes: try VarlinkCoding.frame(reply)))
            } catch {
                return false
            }
        }
        return keepOpen
    }
}

/// The lock that makes one process at a time the owner of a socket path it binds itself: an
/// exclusive `flock` on `PATH.lock` beside it. The daemon takes it first thing, before it starts
/// the reader or opens the store, so a daemon that is refused has touched neither; and lets go
/// of it only once its store is closed (or when it exits, however it exits: the kernel releases
/// it). Not waited for: a daemon that finds it held is refused (`AlreadyServed`, `lockHeld`).
///
/// The file is created empty, mode 0600, and opened read-only (flock needs no more). Nobody else
/// may open it: anyone who could (a read-only descriptor is enough) could take the lock and keep
/// the daemon from starting, so one that others may read is made 0600 first. Never through a
/// symbolic link, never a hard link (one link only), only a regular file of this user or of root
/// (the directory's owner is one of them); and never removed: a lock file unlinked while another process
/// opens it would let two hold "the" lock.
public final class SocketPathLock: Sendable {
    /// The socket path this lock is for (the lock file is this plus ".lock").
    public let socketPath: String
    private let descriptor: Mutex<Int32?>

    private init(socketPath: String, descriptor: Int32) {
        self.socketPath = socketPath
        self.descriptor = Mutex(descriptor)
    }

    /// Takes the lock of `socketPath`, in a directory `VarlinkListener.checkDirectory` accepts.
    public static func acquire(for socketPath: String) throws -> SocketPathLock {
        try VarlinkListener.checkDirectory(of: socketPath)
        let lockFile = socketPath + ".lock"
        let fd = open(lockFile, O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0o600)
        guard fd >= 0 else {
            throw VarlinkListener.ListenError(
                "\(lockFile): \(String(cString: strerror(errno))) (a lock file left by another user can be removed)")
        }
        var status = stat()
        guard fstat(fd, &status) == 0, status.st_mode & S_IFMT == S_IFREG, status.st_nlink == 1,
            status.st_uid == geteuid() || status.st_uid == 0
        else {
            close(fd)
            throw VarlinkListener.ListenError(
                "\(lockFile) is not a regular file with one link owned by this user or root")
        }
        guard status.st_mode & 0o077 == 0 || fchmod(fd, 0o600) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw VarlinkListener.ListenError("\(lockFile) may be opened by others and cannot be made 0600: \(reason)")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            let error = errno
            close(fd)
            guard error == EWOULDBLOCK else {
                throw VarlinkListener.ListenError("cannot lock \(lockFile): \(String(cString: strerror(error)))")
            }
            throw VarlinkListener.AlreadyServed(path: socketPath, lockHeld: true)
        }
        return SocketPathLock(socketPath: socketPath, descriptor: fd)
    }

    /// Lets go of the lock. Idempotent.
    public func release() {
        descriptor.withLock { descriptor in
            if let held = descriptor { close(held) }
            descriptor = nil
        }
    }

    deinit { release() }
}
