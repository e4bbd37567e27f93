import Crypto
import FoundationEssentials
import KioskAuthCore
import KioskAuthFleet
import KioskAuthProtocol
import KioskAuthStore
import Logging
import Synchronization

/// The credentials a fleet member reads from `$CREDENTIALS_DIRECTORY` (docs/fleet.md §9).
enum FleetCredentials {
    /// The terminal's X25519 private key, 32 raw bytes.
    static let key = "kioskauth.fleet-key"
    /// The directory password; absent means none (peer or trust authentication).
    static let password = "kioskauth.fleet-password"
}

/// A fleet failure as one of the API's named errors.
extension APIError {
    static func fleet(_ error: FleetError) -> APIError {
        switch error.code {
        case .directoryUnavailable: .own("FleetUnreachable", ["reason": .string(error.description)])
        case .joinRefused: .own("FleetTokenInvalid", ["reason": .string(error.description)])
        case .permissionDenied: .fleetPermissionDenied(error.description)
        default: .own("FleetError", ["reason": .string(error.description)])
        }
    }

    static func fleetError(_ reason: String) -> APIError { .own("FleetError", ["reason": .string(reason)]) }

    static let fleetNotConfigured = APIError.own("FleetNotConfigured")

    static func fleetPermissionDenied(_ reason: String) -> APIError {
        .own("FleetPermissionDenied", ["reason": .string(reason)])
    }
}

/// The fleet's network side of one terminal: the directory connection used for pulls and pushes,
/// the keyring, and what `FleetStatus` shows. An actor of its own, so nothing here ever runs on
/// (or holds) the authority's actor: unlocks never wait for the directory. Pulled changes are
/// handed to the authority's credential part to apply (`CredentialAuthority.applyFleetChanges`),
/// which touches only the local store.
actor FleetAgent {
    let store: Store
    let configuration: DaemonConfiguration.Fleet
    let credentialsDirectory: String?
    let logger: Logger
    let now: @Sendable () -> Date
    /// Wakes the sync service: a notification, a membership that began, a sync asked for.
    nonisolated let wakeup = Wakeup()
    /// Applies pulled changes to the local store (the authority's credential part).
    private let apply: @Sendable ([FleetChange], FleetApplyContext) async -> FleetApplyOutcome
    /// Ends the passcode-reset windows that are over (the authority's credential part, §5).
    private let endResetWindows: @Sendable () async -> Void
    /// The reader this terminal registers with, as libfprint names it.
    private let readerTags: @Sendable () async -> FleetReaderTags?
    /// Audits what the agent does on its own (a rotation, this terminal's removal).
    private let record: @Sendable (AuditAction, AuditResult, String) async -> Void

    /// Opens directory connections.
    let connector: FleetDirectoryConnector
    private var connection: (any FleetDirectoryConnection)?
    /// The directory address `connection` was made for: a call for another one connects anew.
    private var connectionDirectory: String?
    private var keyPair: TerminalKeyPair?
    private var keyring = FleetKeyring([])
    /// The data-key generations held (the keyring derives its sealing keys from them). Set
    /// through `hold(_:)`, which hands them to the directory connection too.
    private var dataKeys: [FleetDataKey] = [] {
        didSet { keyring = FleetKeyring(dataKeys) }
    }
    /// The generations of `dataKeys`.
    private var heldGenerations: Set<Int32> { Set(dataKeys.map(\.generation)) }
    private(set) var reachable = false
    private var head: Int64 = 0
    /// Whether a listener is connected (the sync service runs it).
    var isListening = false

    init(
        store: Store, configuration: DaemonConfiguration.Fleet, credentialsDirectory: String?, logger: Logger,
        now: @escaping @Sendable () -> Date, readerTags: @escaping @Sendable () async -> FleetReaderTags?,
        apply: @escaping @Sendable ([FleetChange], FleetApplyContext) async -> FleetApplyOutcome,
        endResetWindows: @escaping @Sendable () async -> Void,
        record: @escaping @Sendable (AuditAction, AuditResult, String) async -> Void = { _, _, _ in },
        connector: FleetDirectoryConnector
    ) {
        self.connector = connector
        self.record = record
        self.readerTags = readerTags
        self.apply = apply
        self.endResetWindows = endResetWindows
        self.store = store
        self.configuration = configuration
        self.credentialsDirectory = credentialsDirectory
        self.logger = logger
        self.now = now
    }

    // MARK: Credentials

    private func credential(_ name: String) -> [UInt8]? {
        guard let directory = credentialsDirectory,
            let data = FileManager.default.contents(atPath: directory + "/" + name)
        else { return nil }
        return Array(data)
    }

    private func loadKeyPair() throws(APIError) -> TerminalKeyPair {
        if let keyPair { return keyPair }
        guard let bytes = credential(FleetCredentials.key) else {
            throw APIError.fleetError(
                "no \(FleetCredentials.key) credential: create one with kioskauthctl fleet keygen and load it with LoadCredentialEncrypted="
            )
        }
        do {
            let pair = try TerminalKeyPair(credential: bytes)
            keyPair = pair
            return pair
        } catch { throw APIError.fleet(error) }
    }

    private var password: String? {
        credential(FleetCredentials.password).map {
            String(decoding: $0, as: UTF8.self).trimmingNewlines()
        }
    }

    private func registration(id: UUID, name: String?) async throws(APIError) -> TerminalRegistration {
        let tags = await readerTags()
        let chosen = name ?? (configuration.terminalName.isEmpty ? Daemon.hostName() : configuration.terminalName)
        return TerminalRegistration(
            id: id, name: chosen.isEmpty ? "terminal-\(id.uuidString.prefix(8).lowercased())" : chosen,
            publicKey: try loadKeyPair().publicKey, readerDriver: tags?.driver,
            readerDeviceType: tags?.deviceType, isMatchOnChip: tags?.isMatchOnChip ?? false)
    }

    // MARK: Connection

    private func connect(_ directory: String) async throws(FleetError) -> any FleetDirectoryConnection {
        if let connection, !connection.isClosed, connectionDirectory == directory { return connection }
        dropConnection()
        let endpoint = try FleetEndpoint(url: directory)
        do throws(FleetError) {
            var attempt = 0
            while true {
                attempt += 1
                let connection = try await connector.connect(endpoint, password, logger)
                await prepare(connection)
                // One that did not take them was closed (its pulls could not be trusted): the
                // helper or the directory went away meanwhile. One more, then the call fails.
                if connection.isClosed {
                    guard attempt < 2 else {
                        throw FleetError(
                            .directoryUnavailable(
                                "the directory connection closed before it took this terminal's keys and row versions"))
                    }
                    continue
                }
                // Another call (a sync beside a FleetCreate, say) connected while this one awaited:
                // keep that connection and close this one. Replaced unclosed, this one would have
                // been left open (a connection the directory keeps until it times out) by whichever
                // call still held it.
                if let other = self.connection, !other.isClosed, connectionDirectory == directory {
                    Task { await connection.close() }
                    return other
                }
                dropConnection()
                self.connection = connection
                connectionDirectory = directory
                reachable = true
                return connection
            }
        } catch {
            reachable = false
            throw error
        }
    }

    /// A new connection knows no keys and no rows: it is given the version of every row this
    /// terminal already trusted (an older version written back into the directory is refused as
    /// replayed) and the keyring (pushes MAC rows with it, pulls verify them). The keyring is
    /// handed again if it changed while this awaited: `hold` gives new keys only to the connection
    /// already in use, and this one is not yet.
    private func prepare(_ connection: any FleetDirectoryConnection) async {
        if let versions = try? store.fleetRowVersions(), !versions.isEmpty {
            await connection.rememberRowVersions(
                versions.map { FleetRowVersion(version: $0.version, entity: $0.entity, key: $0.key) })
        }
        var given = Set<Int32>()
        while !connection.isClosed {
            let held = heldGenerations
            guard held != given else { return }
            await connection.useKeyring(keyring)
            given = held
        }
    }

    /// Holds `keys` as this terminal's data keys, on the directory connection too.
    private func hold(_ keys: [FleetDataKey]) async {
        dataKeys = keys
        if let connection, !keys.isEmpty { await connection.useKeyring(keyring) }
    }

    /// Refuses a directory role that is not a terminal's own: the owner or a superuser would
    /// give this terminal the power to rewrite the directory (docs/fleet.md §2.1).
    private static func requireTerminalRole(
        _ connection: any FleetDirectoryConnection
    ) async throws(FleetError) -> String? {
        let role = try await connection.sessionRole()
        if role.isTerminalOnly { return nil }
        let what =
            role.isSuperuser
            ? "a superuser" : role.isOwner ? "the directory's owner" : "not a member of kioskauth_terminal"
        return
            "the directory URL names the role \(role.name), which is \(what): connect as this terminal's own role (created with fleet_create_terminal_role)"
    }

    /// Migrates the directory's schema with the owner's URL and password, given for this call
    /// only: the connection is closed afterwards and neither is kept.
    func migrate(directory: String, password: String?) async throws(APIError) -> Int {
        let endpoint: FleetEndpoint
        do { endpoint = try FleetEndpoint(url: directory) } catch { throw APIError.fleet(error) }
        let owner: any FleetDirectoryConnection
        do { owner = try await connector.connect(endpoint, password, logger) } catch {
            throw APIError.fleet(error)
        }
        do {
            let version = try await owner.migrate()
            await owner.close()
            return Int(version)
        } catch {
            await owner.close()
            throw APIError.fleet(error)
        }
    }

    /// Checks, before the terminal registers, that it connects as its own role and that the
    /// schema is current (a terminal role cannot migrate it).
    private func prepareTerminal(_ directory: String) async throws(APIError) {
        // Not yet in a fleet: a connection left from an earlier attempt may name another
        // directory or role.
        await close()
        do {
            try await checkTerminal(directory)
        } catch {
            await close()
            throw error
        }
    }

    private func checkTerminal(_ directory: String) async throws(APIError) {
        let refusal = try await withDirectory(directory) { connection throws(FleetError) in
            try await Self.requireTerminalRole(connection)
        }
        if let refusal { throw APIError.fleetPermissionDenied(refusal) }
        do {
            try await withDirectory(directory) { connection throws(FleetError) in
                _ = try await connection.migrate()
            }
        } catch {
            guard error.name.hasSuffix(".FleetPermissionDenied") else { throw error }
            throw APIError.fleetPermissionDenied(
                "the directory's schema is not current, and only its owner can migrate it: run kioskauthctl fleet migrate with the owner's URL first"
            )
        }
    }

    /// Closes the directory connection (at shutdown, on leaving, before a new directory), so the
    /// next attempt connects again; waits for the close at most the operation deadline.
    func close() async {
        guard let old = forgetConnection() else { return }
        _ = await Self.race(min(operationDeadline, .seconds(20))) { await old.close() }
    }

    /// Forgets the connection, so the next attempt connects again; the caller closes what it
    /// returns.
    private func forgetConnection() -> (any FleetDirectoryConnection)? {
        let old = connection
        connection = nil
        connectionDirectory = nil
        reachable = false
        return old
    }

    /// A second connection for the change feed's notifications (the sync service owns it).
    func listenerConnection() async throws(FleetError) -> (any FleetDirectoryConnection)? {
        guard let membership = try? store.fleetMembership() else { return nil }
        let endpoint = try FleetEndpoint(url: membership.directory)
        return try await connector.connect(endpoint, password, logger)
    }

    /// The longest one directory operation may take before the connection is given up as dead
    /// (a server that went away without closing it, a network that drops packets):
    /// `[Fleet] OperationTimeoutSec`, 20 s by default.
    var operationDeadline: Duration { .milliseconds(Int64((configuration.operationTimeout * 1000).rounded())) }

    /// What a `FleetUnreachable` from `fleet create` or `fleet join` adds: the directory may have
    /// applied it, and running it again finishes it (docs/fleet.md §6.1).
    static let repeatToFinish =
        "it may have been applied there: run the same command again (a join with the same token), which finds its own earlier attempt and finishes it"
    /// The same for `fleet leave`, which is repeatable as it is.
    static let repeatable = "it may have been applied there: run the same command again, which is safe to repeat"
    /// And for `fleet remove`: repeatable, by id (another terminal may take the name meanwhile).
    static func repeatRemoval(_ id: UUID) -> String {
        "it may have been applied there: run it again as fleet remove \(id.uuidString.lowercased()), which is safe to repeat"
    }

    /// Runs `body` on the directory within the deadline. `ifUnanswered` is added to the reason
    /// of a `FleetUnreachable` for an operation whose effect may have been applied although its
    /// answer was not heard (the deadline, or a connection lost in the middle).
    private func withDirectory<T: Sendable>(
        _ directory: String, ifUnanswered: String? = nil,
        _ body: @escaping @Sendable (any FleetDirectoryConnection) async throws(FleetError) -> T
    ) async throws(APIError) -> T {
        // Connecting counts against the deadline too, and an operation that ignores
        // cancellation is left behind rather than waited for: the agent (and with it every
        // sync, FleetStatus and shutdown) never hangs on a directory that stopped answering.
        // `asked`: whether a statement of it was sent. An operation whose connection turned out
        // closed before it sent anything (it waited behind a call that met a server gone away)
        // asked nothing: it runs once more, on a new connection, within the same deadline.
        let deadline = operationDeadline
        let outcome: (result: Result<T, FleetError>, asked: Bool)? = await Self.race(deadline) {
            () async -> (result: Result<T, FleetError>, asked: Bool) in
            var attempt = 0
            while true {
                attempt += 1
                let connection: any FleetDirectoryConnection
                do throws(FleetError) { connection = try await self.connect(directory) } catch {
                    return (.failure(error), false)
                }
                let probe = FleetSendProbe()
                let result = await FleetSendProbe.$current.withValue(probe) { () async -> Result<T, FleetError> in
                    do throws(FleetError) { return .success(try await body(connection)) } catch {
                        return .failure(error)
                    }
                }
                if case .failure(let error) = result, error.isClosedBeforeSending, !probe.anySent, attempt == 1,
                    !Task.isCancelled
                {
                    await self.forget(connection)
                    continue
                }
                return (result, probe.anySent)
            }
        }
        switch outcome {
        case (.success(let value), _)?: return value
        case (.failure(let error), let asked)?:
            guard error.code == .directoryUnavailable else { throw APIError.fleet(error) }
            dropConnection()
            throw Self.unreachable(error.description, asked ? ifUnanswered : nil)
        case nil:
            dropConnection()
            throw Self.unreachable("the directory did not answer within \(deadline)", ifUnanswered)
        }
    }

    /// Whether two directory addresses name the same directory and role (a port written out or
    /// not, parameters in another order): a retry spelt differently still finds its attempt.
    static func sameDirectory(_ a: String, _ b: String) -> Bool {
        if a == b { return true }
        guard let first = try? FleetEndpoint(url: a), let second = try? FleetEndpoint(url: b) else { return false }
        return first == second
    }

    static func unreachable(_ reason: String, _ ifUnanswered: String?) -> APIError {
        .own("FleetUnreachable", ["reason": .string(reason + (ifUnanswered.map { "; " + $0 } ?? ""))])
    }

    /// Forgets `closed` if it is still the connection in use (another call may have replaced it).
    private func forget(_ closed: any FleetDirectoryConnection) async {
        guard connection === closed else { return }
        _ = forgetConnection()
        await closed.close()
    }

    /// Forgets the connection after a failure (the next attempt reconnects) and closes it in the
    /// background: closing a connection to a directory that stopped answering may take long.
    private func dropConnection() {
        if let old = forgetConnection() { Task { await old.close() } }
    }

    /// The outcome of `operation`, or nil once `deadline` has passed; an operation still running
    /// then is cancelled and not waited for.
    static func race<T: Sendable>(
        _ deadline: Duration, _ operation: @escaping @Sendable () async -> T
    ) async -> T? {
        let gate = RaceGate<T>()
        return await withCheckedContinuation { continuation in
            gate.install(continuation)
            let timer = Task {
                try? await Task.sleep(for: deadline)
                if gate.finish(nil) { gate.cancelWork() }
            }
            gate.setWork(
                Task {
                    if gate.finish(await operation()) { timer.cancel() }
                })
        }
    }

    // MARK: Create, token, join, leave

    func create(directory: String, name: String?) async throws(APIError) -> String {
        try await inTurn(.membership) { () throws(APIError) in try await createOnce(directory: directory, name: name) }
    }

    private func createOnce(directory: String, name: String?) async throws(APIError) -> String {
        if let membership = try storeCall({ () throws(StoreError) in try store.fleetMembership() }) {
            throw APIError.own("FleetAlreadyMember", ["directory": .string(membership.directory)])
        }
        do { _ = try FleetEndpoint(url: directory) } catch { throw APIError.fleet(error) }
        try requireSharableUIDs()
        let keyPair = try loadKeyPair()
        // An earlier attempt on this directory whose outcome is unknown: the same terminal id and
        // the same wrapped key again, so the directory's row, if it made one, is recognised.
        let earlier = try storeCall { () throws(StoreError) in try store.fleetPendingAttempt() }
            .flatMap { $0.operation == .create && Self.sameDirectory($0.directory, directory) ? $0 : nil }
        let id = earlier.flatMap { UUID(uuidString: $0.terminalID) } ?? UUID()
        let terminal = try await registration(id: id, name: name)
        try await prepareTerminal(directory)
        let dataKey: FleetDataKey
        let sent: WrappedDataKey
        if let earlier,
            let again = earlier.wrappedKey.flatMap({ Self.decode($0, terminal: earlier.terminalID, generation: 1) }),
            let key = try? again.unwrap(with: keyPair)
        {
            (dataKey, sent) = (key, again)
        } else {
            dataKey = FleetDataKey.random(generation: 1)
            do { sent = try WrappedDataKey.wrap(dataKey, to: keyPair.publicKey, terminalID: id) } catch {
                throw APIError.fleet(error)
            }
            try storeCall { () throws(StoreError) in
                try store.setFleetPendingAttempt(
                    FleetPendingAttempt(
                        operation: .create, directory: directory, terminalID: id.uuidString.lowercased(),
                        wrappedKey: Self.encode(sent)))
            }
        }
        let outcome = try await withDirectory(directory, ifUnanswered: Self.repeatToFinish) {
            connection throws(FleetError) in
            try await connection.bootstrap(terminal, dataKey: dataKey, wrapped: sent)
        }
        if outcome == .resumed {
            logger.notice(
                "fleet create: the directory already holds this terminal's fleet from an earlier attempt; finishing it",
                metadata: ["terminal": "\(id)"])
        }
        // The fleet's key is the one this terminal generated and sent, kept as it sent it, never
        // what the directory lists now: anyone who can write there can wrap a generation of
        // their own to this terminal's public key. It is kept in one transaction with the
        // membership and the creator's people (the first member brings them into the empty
        // directory): a crash never keeps half of it.
        try storeCall { () throws(StoreError) in
            try store.beginFleetMembership(
                FleetMembership(
                    directory: directory, terminalID: terminal.id.uuidString.lowercased(), name: terminal.name,
                    state: "member", joinedAt: now()),
                firstKey: (1, Self.encode(sent)), bringLocalPeople: true, now: now())
        }
        await hold([dataKey])
        wakeup.signal()
        return terminal.id.uuidString.lowercased()
    }

    func issueToken(validSeconds: Int) async throws(APIError) -> String {
        let membership = try requireMembership()
        try requireNotRemoved(membership)
        guard membership.state == "member", let terminal = UUID(uuidString: membership.terminalID) else {
            throw APIError.fleetError("only a member issues join tokens; this terminal is \(membership.state)")
        }
        let token = try await withDirectory(membership.directory) { connection throws(FleetError) in
            try await connection.issueJoinToken(by: terminal, lifetime: .seconds(validSeconds))
        }
        try storeCall { () throws(StoreError) in
            try store.addFleetJoinToken(
                id: token.id.uuidString.lowercased(), token: Array(token.text.utf8),
                expiresAt: now().addingTimeInterval(TimeInterval(validSeconds)), now: now())
        }
        return token.text
    }

    func join(directory: String, tokenText: String, name: String?) async throws(APIError) -> (String, String) {
        try await inTurn(.membership) { () throws(APIError) in
            try await joinOnce(directory: directory, tokenText: tokenText, name: name)
        }
    }

    private func joinOnce(
        directory: String, tokenText: String, name: String?
    ) async throws(APIError) -> (
        String, String
    ) {
        if let membership = try storeCall({ () throws(StoreError) in try store.fleetMembership() }) {
            throw APIError.own("FleetAlreadyMember", ["directory": .string(membership.directory)])
        }
        let token: JoinToken
        do { token = try JoinToken(text: tokenText) } catch { throw APIError.fleet(error) }
        do { _ = try FleetEndpoint(url: directory) } catch { throw APIError.fleet(error) }
        try requireSharableUIDs()
        let tokenID = token.id.uuidString.lowercased()
        // An earlier attempt with this token whose outcome is unknown: the same terminal id again.
        let earlier = try storeCall { () throws(StoreError) in try store.fleetPendingAttempt() }
            .flatMap {
                $0.operation == .join && Self.sameDirectory($0.directory, directory) && $0.tokenID == tokenID ? $0 : nil
            }
        let id = earlier.flatMap { UUID(uuidString: $0.terminalID) } ?? UUID()
        let terminal = try await registration(id: id, name: name)
        try await prepareTerminal(directory)
        if earlier?.terminalID != id.uuidString.lowercased() {
            try storeCall { () throws(StoreError) in
                try store.setFleetPendingAttempt(
                    FleetPendingAttempt(
                        operation: .join, directory: directory, terminalID: id.uuidString.lowercased(),
                        tokenID: tokenID))
            }
        }
        let joined = try await withDirectory(directory, ifUnanswered: Self.repeatToFinish) {
            connection throws(FleetError) in
            try await connection.join(with: token, as: terminal)
        }
        if joined.outcome == .resumed {
            // Already a member if the issuer admitted it meanwhile: the next pull takes its keys.
            logger.notice(
                "fleet join: the directory already holds this terminal's join from an earlier attempt; finishing it",
                metadata: ["terminal": "\(id)", "state": "\(joined.state)"])
        }
        // The join secret stays, sealed, until the admission has been checked with it (§6.2).
        try storeCall { () throws(StoreError) in
            try store.beginFleetMembership(
                FleetMembership(
                    directory: directory, terminalID: terminal.id.uuidString.lowercased(), name: terminal.name,
                    state: "pending", joinedAt: now()),
                joinSecret: token.secret, now: now())
        }
        wakeup.signal()
        return (terminal.id.uuidString.lowercased(), "pending")
    }

    func leave() async throws(APIError) {
        // Also the sync's turn: a sync running beside it (woken by the push it makes) would
        // reconnect and take keys and rows after the membership is forgotten.
        try await inTurn(.membership) { () throws(APIError) in
            try await inTurn(.sync) { () throws(APIError) in try await leaveOnce() }
        }
    }

    private func leaveOnce() async throws(APIError) {
        let membership = try requireMembership()
        guard let terminal = UUID(uuidString: membership.terminalID) else {
            throw APIError.fleetError("the stored terminal id is not a UUID")
        }
        // Already removed by the directory: there is nothing to tell it, only to forget. That
        // includes a removal an earlier `fleet leave` asked for whose answer was lost: this
        // terminal may no longer push there, so its queue is not sent.
        if membership.state != "removed" {
            let standing = try await withDirectory(membership.directory) { connection throws(FleetError) in
                try await connection.standing(of: terminal)
            }
            if standing.state != "removed" {
                if membership.state == "member" { try await pushQueue(membership) }
                try await withDirectory(membership.directory, ifUnanswered: Self.repeatable) {
                    connection throws(FleetError) in
                    try await connection.removeTerminal(terminal)
                }
            }
        }
        try storeCall { () throws(StoreError) in try store.endFleetMembership() }
        dataKeys = []
        await close()
        wakeup.signal()
    }

    /// The directory's terminals, for `fleet terminals`, and this terminal's id among them.
    func terminals() async throws(APIError) -> (terminals: [FleetTerminal], this: String) {
        let membership = try requireMembership()
        try requireNotRemoved(membership)
        let terminals = try await withDirectory(membership.directory) { connection throws(FleetError) in
            try await connection.terminals()
        }
        return (terminals, membership.terminalID)
    }

    /// What `removeTerminal` did.
    struct Removal: Sendable {
        var terminal: FleetTerminal
        /// The newest generation this terminal holds afterwards.
        var generation: Int32
        /// Whether this call published the generation the removal owed.
        var rotated: Bool
        /// Whether a rotation is still owed (this call's failed; the next member to sync pays).
        var rotationOwed: Bool
    }

    /// Removes another terminal, named by its id or by its name (a stolen or retired one:
    /// docs/fleet.md §9.8), then publishes the data-key generation the removal owes, so what is
    /// written from now on is sealed under a key that terminal never had. A name is looked up
    /// among the terminals not yet removed first, then among the removed ones, so repeating a
    /// call whose rotation failed finishes it. Once the removal has committed nothing throws: a
    /// rotation that fails afterwards is audited and reported (`rotationOwed`), and any member
    /// pays it at its next sync. This terminal leaves with `leave()`, never through here.
    func removeTerminal(_ named: String) async throws(APIError) -> Removal {
        // In the membership turn: a `leave` running beside it would forget the fleet while this
        // call took keys after the rotation.
        try await inTurn(.membership) { () throws(APIError) in try await removeTerminalOnce(named) }
    }

    private func removeTerminalOnce(_ named: String) async throws(APIError) -> Removal {
        let membership = try requireMembership()
        try requireNotRemoved(membership)
        guard membership.state == "member", let me = UUID(uuidString: membership.terminalID) else {
            throw APIError.fleetError("only a member removes terminals; this terminal is \(membership.state)")
        }
        let all = try await withDirectory(membership.directory) { connection throws(FleetError) in
            try await connection.terminals()
        }
        let byID = UUID(uuidString: named).flatMap { id in all.first { $0.id == id } }
        let live = all.filter { $0.name == named && $0.state != "removed" }
        let byName = live.isEmpty ? all.filter { $0.name == named }.suffix(1) : live[...]
        guard let target = byID ?? byName.first else {
            throw APIError.own("FleetTerminalNotFound", ["terminal": .string(named)])
        }
        if byID == nil, byName.count > 1 {
            throw APIError.fleetError(
                "\(byName.count) terminals not yet removed are named \(named): name one by its id (fleet terminals)")
        }
        guard target.id != me else {
            throw APIError.fleetError("that is this terminal: leave the fleet with fleet leave")
        }
        try await withDirectory(membership.directory, ifUnanswered: Self.repeatRemoval(target.id)) {
            connection throws(FleetError) in
            try await connection.removeTerminal(target.id)
        }
        // Nothing below throws: the removal has committed, and the caller audits it as done.
        var current = membership
        var rotated = false
        do {
            try await loadKeyring(membership)
            // The terminal just removed is left out whatever the directory says of it (a writer
            // could put its row and vouch back before this rotation).
            rotated = try await rotateIfDue(&current, excluding: [target.id])
            if !rotated {
                // Every member races for the rotation a removal owes, and another one (woken by
                // this removal's change) may have published it first: take that generation, so
                // that what this terminal seals from now on, and reports, is the new one.
                try await receiveKeys(terminal: me, membership: &current)
            }
        } catch {
            logger.error("fleet rotation after a removal failed", metadata: ["error": "\(error)"])
            await record(.fleetRotate, .failure, "after removing \(target.name): \(error.name): \(error.parameters)")
        }
        let owed =
            rotated
            ? false
            : (try? await withDirectory(membership.directory) { connection throws(FleetError) in
                try await connection.rotationDue().due
            }) ?? true
        return Removal(terminal: target, generation: keyring.currentGeneration, rotated: rotated, rotationOwed: owed)
    }

    // MARK: Sync

    /// Work that must not interleave with itself although it awaits the directory (an actor
    /// alone lets another call in at every await). Callers of one kind queue, in order.
    enum Turn: Hashable {
        /// A sync: two at once (`fleet sync` from the CLI while the sync service runs one) would
        /// pull from the same cursor, and the one behind would meet rows older than what the
        /// other had just recorded, and refuse them as replayed.
        case sync
        /// `fleet create`, `join` and `leave`: two at once closed each other's connection, and
        /// the later one's attempt record replaced the other's (§6.1 could then not finish it).
        /// One at a time, the second finds the first's membership (`FleetAlreadyMember`).
        case membership
    }

    private var busyTurns: Set<Turn> = []
    private var waitingTurns: [Turn: [CheckedContinuation<Void, Never>]] = [:]

    private func inTurn<T>(_ turn: Turn, _ body: () async throws(APIError) -> T) async throws(APIError) -> T {
        if busyTurns.contains(turn) {
            await withCheckedContinuation { waitingTurns[turn, default: []].append($0) }
        } else {
            busyTurns.insert(turn)
        }
        defer {
            if let next = waitingTurns[turn]?.first {
                waitingTurns[turn]?.removeFirst()
                next.resume()
            } else {
                busyTurns.remove(turn)
            }
        }
        return try await body()
    }

    /// Pulls until the feed is exhausted and pushes the queue; the sync service and `FleetSync`
    /// both call it, one at a time (`Turn.sync`). A terminal the directory has removed stops
    /// here (`noticeRemoval`).
    func sync() async throws(APIError) {
        try await inTurn(.sync) { () throws(APIError) in try await syncOnce() }
    }

    private func syncOnce() async throws(APIError) {
        var membership = try requireMembership()
        try requireNotRemoved(membership)
        guard let terminal = UUID(uuidString: membership.terminalID) else {
            throw APIError.fleetError("the stored terminal id is not a UUID")
        }
        // Reset windows that are over end first, whether or not the directory answers (§5).
        await endResetWindows()
        do throws(APIError) {
            let standing = try await withDirectory(membership.directory) { connection throws(FleetError) in
                try await connection.standing(of: terminal)
            }
            if try await noticeRemoval(membership, state: standing.state) { return }
            try await pull(&membership)
            if membership.state == "member" {
                // A row from before migration 4 has no vouch, and a writer may clear one: without
                // it, no rotation would be wrapped to this terminal (§6.2). Checked each sync.
                // A row whose public key is not this terminal's is refused (counted and shown in
                // `fleet status`), and the sync goes on: pushes do not depend on it.
                let publicKey = try loadKeyPair().publicKey
                do throws(APIError) {
                    try await withDirectory(membership.directory) { connection throws(FleetError) in
                        try await connection.vouchForSelf(terminal, publicKey: publicKey)
                    }
                } catch {
                    if error.name.hasSuffix(".FleetUnreachable") { throw error }
                    await refused("this terminal's row refused: \(error.parameters)")
                }
            }
            if membership.state == "member", standing.rotationDue {
                // Before pushing, so what this sync pushes is sealed under the new generation.
                // A rotation this terminal cannot make (a directory not yet migrated, a
                // generation it does not hold, its own row's key changed there) is logged and
                // left to the next sync or another member: it does not hold up pushes and audit.
                do throws(APIError) {
                    try await rotateIfDue(&membership)
                } catch {
                    if error.name.hasSuffix(".FleetUnreachable") { throw error }
                    logger.error("fleet rotation owed but not made", metadata: ["error": "\(error)"])
                }
            }
            if membership.state == "member" {
                try await pushQueue(membership)
                try await pushAudit(membership)
                // What this terminal pushed comes back in the feed: take it in now.
                try await pull(&membership)
            }
            try storeCall { () throws(StoreError) in
                try store.updateFleetMembership(syncedAt: now(), error: .some(nil))
            }
        } catch {
            _ = try? store.updateFleetMembership(error: .some("\(error.name): \(error.parameters)"))
            throw error
        }
    }

    /// Whether the directory has removed this terminal (its `state` there: another member's
    /// `fleet remove`, or the DBA). If so the terminal forgets its data keys, the tokens it
    /// issued and its queue, keeps its local people, audits `fleet.removed`, and stops syncing
    /// until `fleet leave`.
    private func noticeRemoval(_ membership: FleetMembership, state: String?) async throws(APIError) -> Bool {
        // A directory that does not list this terminal at all is more likely the wrong one (or
        // one restored from an older backup) than a removal: say so and forget nothing.
        guard let state else {
            throw APIError.fleetError(
                "the directory does not list this terminal (\(membership.terminalID)): is it the fleet's directory?")
        }
        guard state == "removed" else { return false }
        // A `fleet leave` that ran while this sync waited for the directory has already
        // forgotten the fleet: nothing is left to forget, and nothing to report.
        guard let current = try? store.fleetMembership(), current.terminalID == membership.terminalID,
            current.state != "removed"
        else { return true }
        let reason = "the directory marked this terminal removed"
        let queued = (try? store.fleetOutboxCount()) ?? 0
        try storeCall { () throws(StoreError) in try store.markFleetRemoved(reason: reason) }
        dataKeys = []
        await close()
        logger.warning("fleet: this terminal was removed", metadata: ["reason": "\(reason)"])
        await record(
            .fleetRemoved, .success,
            "\(reason); forgot its data keys and \(queued) queued push(es); local people stay")
        return true
    }

    private func requireNotRemoved(_ membership: FleetMembership) throws(APIError) {
        guard membership.state == "removed" else { return }
        throw APIError.own(
            "FleetRemoved", ["reason": .string(membership.lastError ?? "this terminal was removed from the fleet")])
    }

    /// Publishes the data-key generation a removal owes, if one is owed and no other member
    /// has published it first, then takes it (and any other new generation) into the store
    /// and the keyring.
    @discardableResult
    private func rotateIfDue(
        _ membership: inout FleetMembership, excluding removed: Set<UUID> = []
    ) async throws(APIError) -> Bool {
        guard let terminal = UUID(uuidString: membership.terminalID) else { return false }
        let publicKey = try loadKeyPair().publicKey
        // Every terminal this one has seen removed stays out too (`admitPending` notes them).
        let seenRemoved = try storeCall { () throws(StoreError) in try store.fleetRemovedTerminals() }
        let excluded = removed.union(seenRemoved.compactMap { UUID(uuidString: $0) })
        let rotated = try await withDirectory(membership.directory) { connection throws(FleetError) in
            try await connection.rotateDataKeyIfDue(by: terminal, publicKey: publicKey, excluding: excluded)
        }
        guard let rotated else { return false }
        if !rotated.unvouched.isEmpty {
            await record(
                .fleetRotate, .failure,
                "generation \(rotated.key.generation) was not wrapped to \(rotated.unvouched.count) member(s) whose vouch does not open: \(rotated.unvouched.map { $0.uuidString.lowercased() }.joined(separator: ", "))"
            )
        }
        // The connection took the new key when it published it; `receiveKeys` leaves it with
        // exactly what this terminal has authenticated and kept.
        try await receiveKeys(terminal: terminal, membership: &membership)
        logger.notice("fleet data key rotated", metadata: ["generation": "\(rotated.key.generation)"])
        await record(
            .fleetRotate, .success,
            "published data-key generation \(rotated.key.generation), wrapped to the remaining members, after a removal"
        )
        return true
    }

    private func pull(_ membership: inout FleetMembership) async throws(APIError) {
        guard let terminal = UUID(uuidString: membership.terminalID) else {
            throw APIError.fleetError("the stored terminal id is not a UUID")
        }
        try await loadKeyring(membership)
        // A pending terminal holds no data key: it could open none of the secrets in the feed
        // and verify none of its rows (they would be refused as unverifiable). So it only asks
        // whether its wrapped key has arrived, and pulls nothing until then (its cursor stays
        // where it is, so it applies everything once it is a member).
        if membership.state != "member" || dataKeys.isEmpty {
            try await receiveKeys(terminal: terminal, membership: &membership)
            guard membership.state == "member", !dataKeys.isEmpty else { return }
        }
        var cursor = membership.cursor
        while true {
            let after = cursor
            let heldBefore = heldGenerations
            let changes = try await withDirectory(membership.directory) { connection throws(FleetError) in
                try await connection.pull(after: after)
            }
            guard let last = changes.last else { break }
            // Keys first: a member takes new generations before the values sealed under them.
            if changes.contains(where: { $0.entity == "wrapped_keys" && $0.key.hasPrefix(membership.terminalID) }) {
                try await receiveKeys(terminal: terminal, membership: &membership)
            }
            // Rows MACed under a generation that arrived after the page was asked for (in this
            // page, or taken by a removal's rotation beside this sync) came back unverifiable:
            // pull the page again with the new keys rather than refuse them and move past them.
            if heldGenerations != heldBefore,
                changes.contains(where: { if case .unverifiable = $0.integrity { true } else { false } })
            {
                continue
            }
            try await admitPending(changes, membership: membership)
            let outcome = await apply(
                changes,
                FleetApplyContext(keyring: keyring, terminalID: membership.terminalID, reader: await readerTags()))
            if let problem = outcome.problem { logger.warning("fleet apply", metadata: ["problem": "\(problem)"]) }
            if outcome.rejected > 0 {
                logger.error("fleet rows refused", metadata: ["count": "\(outcome.rejected)"])
            }
            cursor = last.id
            try storeCall { () throws(StoreError) in try store.updateFleetMembership(cursor: cursor) }
            membership.cursor = cursor
            if changes.count < FleetChange.maximumPerPull { break }
        }
        let reached = cursor
        let position = try await withDirectory(membership.directory) { connection throws(FleetError) in
            try await connection.recordCursor(reached, for: terminal)
            return try await connection.feedPosition(for: terminal)
        }
        head = position.head
    }

    private func loadKeyring(_ membership: FleetMembership) async throws(APIError) {
        let stored = try storeCall { () throws(StoreError) in try store.fleetKeys() }
        guard Set(stored.map(\.generation)) != heldGenerations else { return }
        let pair = try loadKeyPair()
        var keys: [FleetDataKey] = []
        for (generation, bytes) in stored {
            guard let wrapped = Self.decode(bytes, terminal: membership.terminalID, generation: generation) else {
                throw APIError.fleetError("a stored data key does not decode")
            }
            do { keys.append(try wrapped.unwrap(with: pair)) } catch { throw APIError.fleet(error) }
        }
        await hold(keys)
    }

    /// Takes the generations the directory has wrapped to this terminal that authenticate
    /// (docs/fleet.md §6.2): a held generation is never replaced, a newcomer's first keys must
    /// carry its admission MAC under the join secret, and every later generation a MAC under the
    /// one before it. Anything else a directory writer could have made: it is refused, counted
    /// among the refused rows, logged and audited, and never used.
    private func receiveKeys(terminal: UUID, membership: inout FleetMembership) async throws(APIError) {
        // Every caller has loaded the keyring from the store just before (`loadKeyring`).
        let delivery = try await withDirectory(membership.directory) { connection throws(FleetError) in
            try await connection.keyDelivery(for: terminal)
        }
        let pair = try loadKeyPair()
        let secret = try storeCall { () throws(StoreError) in try store.fleetJoinSecret() }
        let acceptance = FleetKeyAuthentication.accept(
            delivery, keyPair: pair, terminal: terminal, held: dataKeys, joinSecret: secret)
        if !acceptance.refused.isEmpty {
            await refused(
                acceptance.refused.map { "data-key generation \($0.generation) refused: \($0.reason)" }
                    .joined(separator: "; "))
        }
        let becomeMember = membership.state != "member" && !acceptance.keys.isEmpty
        if !acceptance.accepted.isEmpty || becomeMember {
            try storeCall { () throws(StoreError) in
                try store.acceptFleetKeys(
                    acceptance.accepted.map { ($0.generation, Self.encode($0)) }, becomeMember: becomeMember,
                    now: now())
            }
            if becomeMember { membership.state = "member" }
        }
        // Also when nothing new was taken: the connection then drops a key it added itself
        // (its own rotation's) until that key has been authenticated and kept here.
        await hold(acceptance.keys)
    }

    /// Records what the directory offered and this terminal refused (a key, its own row):
    /// logged, counted among the refused rows, audited as `fleet.reject`. A pending terminal
    /// asks at every sync, so the same refusal is recorded once, not at each (a forged
    /// admission would otherwise fill the audit trail).
    private func refused(_ reason: String) async {
        guard reason != (try? store.fleetMembership()?.lastRejection) else { return }
        logger.error("fleet: refused what the directory offered", metadata: ["why": "\(reason)"])
        _ = try? store.recordFleetRejection(reason)
        await record(.fleetReject, .refused, reason)
    }

    /// Admits the pending terminals that joined with a token this terminal issued.
    private func admitPending(_ changes: [FleetChange], membership: FleetMembership) async throws(APIError) {
        let terminals = changes.filter { $0.entity == "terminals" && !$0.isDeletion }
        // Terminals seen removed are remembered: no rotation of this terminal's wraps to them,
        // whatever the directory says of them later (a writer could put a removed row back).
        let removed = terminals.compactMap { change in
            let fields = change.fields
            return fields["state"] == "removed" ? fields["terminal_id"] : nil
        }
        if !removed.isEmpty {
            try storeCall { () throws(StoreError) in try store.noteFleetRemovedTerminals(removed) }
        }
        guard membership.state == "member" else { return }
        // First the whole page: a terminal that joined with a token kept here and is a member
        // (or removed) already was admitted by an attempt whose answer was lost. Its token is
        // spent before anything is admitted, so that a row set back to pending by a writer, on
        // this page or a later one, is not admitted again.
        for change in terminals {
            let fields = change.fields
            guard fields["state"] == "member" || fields["state"] == "removed", let tokenID = fields["join_token_id"],
                let id = fields["terminal_id"],
                try storeCall({ () throws(StoreError) in try store.fleetJoinToken(id: tokenID) }) != nil
            else { continue }
            try storeCall { () throws(StoreError) in
                try store.markFleetJoinTokenUsed(id: tokenID, terminal: id, now: now())
            }
        }
        for change in terminals {
            let fields = change.fields
            guard fields["state"] == "pending", let tokenID = fields["join_token_id"],
                let text = try storeCall({ () throws(StoreError) in try store.fleetJoinToken(id: tokenID) })
            else { continue }
            let token: JoinToken
            do { token = try JoinToken(text: String(decoding: text, as: UTF8.self)) } catch {
                throw APIError.fleet(error)
            }
            guard !dataKeys.isEmpty else { throw APIError.fleetError("no data key to admit with") }
            let admitted: UUID
            do {
                admitted = try await admit(token, membership: membership)
            } catch {
                // A proof that does not match is refused and logged; the token stays unused.
                logger.error("fleet admission refused", metadata: ["token": "\(tokenID)", "error": "\(error)"])
                if error.name.hasSuffix(".FleetUnreachable") { throw error }
                continue
            }
            try storeCall { () throws(StoreError) in
                try store.markFleetJoinTokenUsed(id: tokenID, terminal: admitted.uuidString.lowercased(), now: now())
            }
            logger.notice("fleet terminal admitted", metadata: ["terminal": "\(admitted)"])
        }
    }

    /// Admits with every generation held. The directory refuses (`FleetError`, a conflict) when
    /// the fleet has a generation this terminal has not taken yet: take the keys, try once more.
    private func admit(_ token: JoinToken, membership: FleetMembership) async throws(APIError) -> UUID {
        do {
            let keys = dataKeys
            return try await withDirectory(membership.directory) { connection throws(FleetError) in
                try await connection.admit(joinedWith: token, dataKeys: keys)
            }
        } catch {
            guard error.name.hasSuffix(".FleetError"), let terminal = UUID(uuidString: membership.terminalID)
            else { throw error }
            var current = membership
            try await receiveKeys(terminal: terminal, membership: &current)
            let keys = dataKeys
            return try await withDirectory(membership.directory) { connection throws(FleetError) in
                try await connection.admit(joinedWith: token, dataKeys: keys)
            }
        }
    }

    private func pushQueue(_ membership: FleetMembership) async throws(APIError) {
        guard let terminal = UUID(uuidString: membership.terminalID) else { return }
        while true {
            let batches = try storeCall { () throws(StoreError) in try store.fleetOutbox(limit: 16) }
            if batches.isEmpty { return }
            for batch in batches {
                let push = try await pushBatch(batch, terminal: terminal)
                do {
                    _ = try await withDirectory(membership.directory) { connection throws(FleetError) in
                        try await connection.push(push)
                    }
                } catch {
                    _ = try? store.fleetBatchFailed(batch, error: "\(error.name): \(error.parameters)")
                    throw error
                }
                // Applied now or before: either way the directory has it.
                try storeCall { () throws(StoreError) in try store.acknowledgeFleetBatch(batch) }
            }
        }
    }

    private func pushBatch(_ batch: FleetOutboxBatch, terminal: UUID) async throws(APIError) -> PushBatch {
        let tags = await readerTags()
        guard let key = UUID(uuidString: batch.idempotencyKey) else {
            throw APIError.fleetError("queued batch \(batch.id) has no UUID key")
        }
        var writes: [FleetWrite] = []
        for operation in batch.operations {
            switch operation {
            case .person(let id, let name, let roles, let uid, let state):
                guard let person = UUID(uuidString: id) else { continue }
                // The directory holds uids as `integer`; a larger one is refused before it can
                // be queued (bind, create, join). Should one be queued all the same, the batch
                // fails by name, and stays queued, rather than trap the daemon at every sync.
                let shared = uid.flatMap { Int32(exactly: $0) }
                if let uid, shared == nil {
                    throw APIError.fleetError(
                        "\(name)'s uid \(uid) is above 2147483647, the largest the directory holds")
                }
                writes.append(.person(id: person, name: name, role: roles, uid: shared, state: state))
            case .verifier(let id, let verifier):
                guard let person = UUID(uuidString: id) else { continue }
                do {
                    writes.append(
                        .verifier(
                            person: person, sealed: try keyring.seal(verifier, binding: .verifier(person: person))))
                } catch { throw APIError.fleet(error) }
            case .passcodeFailures(let id, let count):
                guard let person = UUID(uuidString: id) else { continue }
                writes.append(.passcodeFailures(person: person, count: Int32(count)))
            case .passcodeReset(let id):
                guard let person = UUID(uuidString: id) else { continue }
                writes.append(.passcodeReset(person: person))
            case .template(let id, let finger, let template):
                // Tagged with the reader it was made on; without one attached now it cannot be.
                guard let person = UUID(uuidString: id), let tags else { continue }
                let templateID = Self.templateID(person: id, finger: finger, tags: tags)
                do {
                    writes.append(
                        .template(
                            id: templateID, person: person, finger: finger, driver: tags.driver,
                            deviceType: tags.deviceType,
                            sealed: try keyring.seal(template, binding: .template(templateID, person: person))))
                } catch { throw APIError.fleet(error) }
            case .removeTemplate(let id, let finger):
                guard let tags else { continue }
                writes.append(.removeTemplate(id: Self.templateID(person: id, finger: finger, tags: tags)))
            }
        }
        return PushBatch(idempotencyKey: key, terminal: terminal, writes: writes)
    }

    /// Pushes the audit entries appended since the last push, each with a key derived from this
    /// terminal and its sequence number, so a resent entry is stored once.
    private func pushAudit(_ membership: FleetMembership) async throws(APIError) {
        guard let terminal = UUID(uuidString: membership.terminalID) else { return }
        var through = membership.auditPushedThrough
        while true {
            let entries = try storeCall { () throws(StoreError) in try store.auditEntries(after: through, limit: 200) }
            guard let last = entries.last else { return }
            let writes = entries.map { entry in
                FleetWrite.audit(
                    key: Self.derivedUUID(terminal: membership.terminalID, label: "audit", value: entry.sequence),
                    sequence: Int64(entry.sequence), occurredAt: entry.time, person: entry.record.person,
                    action: entry.record.action, result: entry.record.result)
            }
            let batch = PushBatch(
                idempotencyKey: Self.derivedUUID(
                    terminal: membership.terminalID, label: "audit-batch",
                    value: entries[0].sequence * 1_000_000 + last.sequence),
                terminal: terminal, writes: writes)
            try await withDirectory(membership.directory) { connection throws(FleetError) in
                _ = try await connection.push(batch)
            }
            through = last.sequence
            try storeCall { () throws(StoreError) in try store.updateFleetMembership(auditPushedThrough: through) }
        }
    }

    // MARK: Status

    func status() async throws(APIError) -> Message.FleetStatus {
        guard let membership = try storeCall({ () throws(StoreError) in try store.fleetMembership() }) else {
            return Message.FleetStatus(configured: false)
        }
        let queued = try storeCall { () throws(StoreError) in try store.fleetOutboxCount() }
        let generations = try storeCall { () throws(StoreError) in try store.fleetKeys().map(\.generation) }
        let shownHead = max(head, membership.cursor)
        return Message.FleetStatus(
            configured: true, state: membership.state, terminalId: membership.terminalID,
            directory: membership.directory, reachable: reachable, cursor: Int(membership.cursor),
            head: Int(shownHead), lag: Int(shownHead - membership.cursor), queuedPushes: queued,
            generation: Int(generations.max() ?? 0),
            lastSyncAt: membership.lastSyncAt.map { ISO8601.string($0) },
            lastError: membership.lastError, rejectedChanges: membership.rejectedChanges,
            lastRejection: membership.lastRejection)
    }

    /// Whether the terminal is in a fleet that has not removed it (the sync service idles
    /// otherwise).
    nonisolated func isMember() -> Bool {
        guard let membership = try? store.fleetMembership() else { return false }
        return membership.state != "removed"
    }

    // MARK: Helpers

    /// The directory holds uids as PostgreSQL `integer`s: a terminal whose people include one
    /// bound above 2147483647 founds or joins no fleet until that binding changes (a member
    /// refuses such a binding, `fleetUIDRefusal`), rather than share the person without it.
    private func requireSharableUIDs() throws(APIError) {
        let people = try storeCall { () throws(StoreError) in try store.people() }
        if let person = people.first(where: { $0.origin == .local && ($0.uid ?? 0) > Int(Int32.max) }) {
            throw CredentialAuthority.bindingRefused(
                person.name,
                "\(person.name) is bound to uid \(person.uid ?? 0), above 2147483647, the largest the fleet "
                    + "directory holds: bind them to another uid, or unbind them, before the terminal joins a fleet")
        }
    }

    private func requireMembership() throws(APIError) -> FleetMembership {
        guard let membership = try storeCall({ () throws(StoreError) in try store.fleetMembership() }) else {
            throw APIError.fleetNotConfigured
        }
        return membership
    }

    private func storeCall<T>(_ body: () throws(StoreError) -> T) throws(APIError) -> T {
        do { return try body() } catch { throw APIError.store(error) }
    }

    /// A template's directory id: one per person, finger and kind of reader, so the same finger
    /// enrolled on two kinds of reader is two templates.
    static func templateID(person: String, finger: String, tags: FleetReaderTags) -> UUID {
        derivedUUID(
            terminal: person, label: "template\u{0}\(finger)\u{0}\(tags.driver)\u{0}\(tags.deviceType)", value: 0)
    }

    static func derivedUUID(terminal: String, label: String, value: Int) -> UUID {
        let digest = Array(SHA256.hash(data: Data("kioskauth.fleet.\(label)\u{0}\(terminal)\u{0}\(value)".utf8)))
        var bytes = Array(digest.prefix(16))
        bytes[6] = (bytes[6] & 0x0f) | 0x50
        bytes[8] = (bytes[8] & 0x3f) | 0x80
        return UUID(
            uuid: (
                bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9],
                bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
            ))
    }

    /// A wrapped key as the store keeps it: 2-byte length of the encapsulated key, it, then the
    /// ciphertext.
    static func encode(_ key: WrappedDataKey) -> [UInt8] {
        let count = key.encapsulatedKey.count
        return [UInt8(count >> 8), UInt8(count & 0xff)] + key.encapsulatedKey + key.ciphertext
    }

    static func decode(_ bytes: [UInt8], terminal: String, generation: Int32) -> WrappedDataKey? {
        guard bytes.count > 2, let id = UUID(uuidString: terminal) else { return nil }
        let count = Int(bytes[0]) << 8 | Int(bytes[1])
        guard bytes.count > 2 + count else { return nil }
        return WrappedDataKey(
            terminalID: id, generation: generation, encapsulatedKey: Array(bytes[2..<2 + count]),
            ciphertext: Array(bytes[(2 + count)...]))
    }
}

/// What applying pulled changes needs from the agent.
struct FleetApplyContext: Sendable {
    var keyring: FleetKeyring
    var terminalID: String
    /// This terminal's reader, for templates; nil without one.
    var reader: FleetReaderTags?
}

/// The reader a template is tagged with: libfprint's driver and the device within it.
struct FleetReaderTags: Sendable, Equatable {
    var driver: String
    var deviceType: String
    /// A reader that keeps prints on the sensor takes none from the directory.
    var isMatchOnChip: Bool
}

/// What applying pulled changes came to.
struct FleetApplyOutcome: Sendable {
    var applied = 0
    /// Changes refused: not trusted (forged, replayed, unverifiable), audited as `fleet.reject`.
    var rejected = 0
    var problem: String?
}

/// The meeting point of `FleetAgent.race`: whichever of the operation and the timer finishes
/// first resumes the caller, once.
final class RaceGate<T: Sendable>: Sendable {
    private struct State {
        var continuation: CheckedContinuation<T?, Never>?
        var finished = false
        var work: Task<Void, Never>?
    }
    private let state = Mutex(State())

    func install(_ continuation: CheckedContinuation<T?, Never>) {
        state.withLock { $0.continuation = continuation }
    }

    func setWork(_ work: Task<Void, Never>) {
        let finished = state.withLock { state -> Bool in
            state.work = work
            return state.finished
        }
        // The timer may have fired before the work was recorded (cancelling work that already
        // finished does nothing).
        if finished { work.cancel() }
    }

    /// Resumes the caller with `value` if nothing did yet; true when this call did.
    @discardableResult
    func finish(_ value: T?) -> Bool {
        let continuation = state.withLock { state -> CheckedContinuation<T?, Never>? in
            guard !state.finished else { return nil }
            state.finished = true
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume(returning: value)
        return continuation != nil
    }

    func cancelWork() {
        state.withLock { $0.work }?.cancel()
    }
}
