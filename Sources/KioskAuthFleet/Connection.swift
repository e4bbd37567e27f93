public import FoundationEssentials
import Synchronization

/// What a terminal asks of one connection to the fleet directory (docs/fleet.md): the daemon's
/// fleet agent and sync service use only this, never the database client behind it, so the
/// client can live apart from the process that holds the store key. `FleetDirectory`
/// (KioskAuthFleetDirectory, on postgres-nio) is the connection that talks to PostgreSQL.
///
/// Operations on one connection run one at a time (it carries one transaction at a time); a
/// terminal keeps a second connection for `withChangeWakeups`. Every operation that reaches the
/// directory marks the caller's `FleetSendProbe.current` before it sends anything.
public protocol FleetDirectoryConnection: AnyObject, Sendable {
    /// Whether the connection has closed (the server went away, or `close()`): a caller keeping
    /// it open connects again instead of queueing on a dead connection.
    var isClosed: Bool { get }
    /// Closes the connection.
    func close() async

    /// Brings the schema to the newest version this build knows (only the owner role can);
    /// returns the version.
    @discardableResult
    func migrate() async throws(FleetError) -> Int32
    /// The database role the connection logged in as.
    func sessionRole() async throws(FleetError) -> FleetSessionRole

    /// Creates the fleet with `dataKey` (generation 1) sent as `wrapped`, or finds that an
    /// earlier attempt with the same terminal and bytes did.
    func bootstrap(
        _ terminal: TerminalRegistration, dataKey: FleetDataKey, wrapped: WrappedDataKey
    ) async throws(FleetError) -> FleetAttemptOutcome
    /// A single-use join token issued by the member `issuer`.
    func issueJoinToken(by issuer: UUID, lifetime: Duration) async throws(FleetError) -> JoinToken
    /// Registers `terminal` as pending with `token`; `resumed` when an earlier attempt did.
    @discardableResult
    func join(
        with token: JoinToken, as terminal: TerminalRegistration
    ) async throws(FleetError) -> (outcome: FleetAttemptOutcome, state: String)
    /// Admits the terminal that joined with `token`, wrapping every generation of `dataKeys` to it.
    func admit(joinedWith token: JoinToken, dataKeys: [FleetDataKey]) async throws(FleetError) -> UUID
    /// Removes a terminal from the fleet.
    func removeTerminal(_ id: UUID) async throws(FleetError)
    /// Whether a removal owes a new data-key generation, and the newest generation.
    func rotationDue() async throws(FleetError) -> (due: Bool, newest: Int32)
    /// Publishes the generation a removal owes, if one is owed and nobody published it first.
    func rotateDataKeyIfDue(
        by member: UUID, publicKey: [UInt8], excluding removed: Set<UUID>
    ) async throws(FleetError) -> FleetRotation?
    /// Vouches for this terminal's own row under the newest generation, when it is not yet.
    func vouchForSelf(_ terminal: UUID, publicKey: [UInt8]) async throws(FleetError) -> Bool
    /// The data keys wrapped to `terminal`, with their MACs and admission.
    func keyDelivery(for terminal: UUID) async throws(FleetError) -> FleetKeyDelivery
    /// `terminal`'s state in the directory (nil once its row is gone) and whether a rotation is owed.
    func standing(of terminal: UUID) async throws(FleetError) -> (state: String?, rotationDue: Bool)
    /// The terminals the directory lists.
    func terminals() async throws(FleetError) -> [FleetTerminal]

    /// Sends one batch of this terminal's writes, sealed and MACed with the keyring.
    func push(_ batch: PushBatch) async throws(FleetError) -> PushOutcome
    /// At most `limit` changes after `cursor`, verified with the keyring.
    func pull(after cursor: Int64, limit: Int) async throws(FleetError) -> [FleetChange]
    /// Records how far `terminal` has pulled.
    func recordCursor(_ cursor: Int64, for terminal: UUID) async throws(FleetError)
    /// The newest change id and `terminal`'s recorded cursor.
    func feedPosition(for terminal: UUID) async throws(FleetError) -> (head: Int64, cursor: Int64)

    /// The data keys pushes MAC and seal rows with and pulls verify with.
    func useKeyring(_ keyring: FleetKeyring) async
    /// Row versions this terminal already trusted, so an older one written back is refused.
    func rememberRowVersions(_ rows: [FleetRowVersion]) async

    /// Listens for the change feed's notifications while `body` runs: each wake-up means "pull now".
    func withChangeWakeups<Value: Sendable>(_ body: (FleetWakeups) async throws -> Value) async throws -> Value
}

extension FleetDirectoryConnection {
    /// The changes after `cursor`, at most `FleetChange.maximumPerPull` of them, checked
    /// (`FleetChange.checkPage`) before anyone applies one.
    public func pull(after cursor: Int64) async throws(FleetError) -> [FleetChange] {
        let changes = try await pull(after: cursor, limit: FleetChange.maximumPerPull)
        try FleetChange.checkPage(changes, after: cursor, limit: FleetChange.maximumPerPull)
        return changes
    }
}

/// A row version a terminal trusted (`FleetDirectoryConnection.rememberRowVersions`).
public struct FleetRowVersion: Sendable, Equatable, Codable {
    public var version: Int64
    /// The table, as `FleetChange.entity` names it.
    public var entity: String
    public var key: String

    public init(version: Int64, entity: String, key: String) {
        self.version = version
        self.entity = entity
        self.key = key
    }
}

extension FleetChange {
    /// Refuses a page of the change feed that the feed cannot have produced: more than `limit`
    /// changes, or ids not strictly increasing from after `cursor`. Applied, such a page could
    /// move the cursor back or keep a sync pulling the same changes for ever; whoever answered
    /// it (the directory, or the helper between) is not followed.
    public static func checkPage(_ changes: [FleetChange], after cursor: Int64, limit: Int) throws(FleetError) {
        guard changes.count <= limit else {
            throw FleetError(
                .integrity("the directory answered a pull of at most \(limit) changes with \(changes.count)"))
        }
        var previous = cursor
        for change in changes {
            guard change.id > previous else {
                throw FleetError(
                    .integrity(
                        "the directory answered a pull after \(cursor) with change \(change.id) after \(previous)"))
            }
            previous = change.id
        }
    }
}

extension FleetChange {
    /// The most changes one pull returns: a terminal that got this many pulls again.
    public static let maximumPerPull = 1000
}

/// Wake-ups from the change feed: one element per notified commit; the sequence ends (or
/// throws) when the connection does.
public struct FleetWakeups: AsyncSequence {
    public typealias Element = Void
    private let pull: () async throws -> Void?

    /// A sequence whose iterator calls `next` for each element.
    public init(next: @escaping () async throws -> Void?) { pull = next }

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(pull: pull) }

    public struct AsyncIterator: AsyncIteratorProtocol {
        let pull: () async throws -> Void?

        public mutating func next() async throws -> Void? { try await pull() }
    }
}

/// Whether any statement of one operation was sent: a caller sets one around the operation
/// (`FleetSendProbe.$current`). An operation that failed with `isClosedBeforeSending` and sent
/// nothing asked the directory nothing, and may be run again on a new connection.
public final class FleetSendProbe: Sendable {
    private let sent = Mutex(false)

    public init() {}

    /// The probe of the operation the current task runs, if its caller set one.
    @TaskLocal public static var current: FleetSendProbe?

    /// Whether a statement of the operation was handed to the connection.
    public var anySent: Bool { sent.withLock { $0 } }

    /// Called by a connection just before it hands a statement over.
    public func markSent() { sent.withLock { $0 = true } }
}

/// A generation `rotateDataKeyIfDue` published.
public struct FleetRotation: Sendable {
    /// The new generation.
    public var key: FleetDataKey
    /// Members it was not wrapped to: their vouch does not open (§6.2).
    public var unvouched: [UUID]
    public var generation: Int32 { key.generation }

    public init(key: FleetDataKey, unvouched: [UUID]) {
        self.key = key
        self.unvouched = unvouched
    }
}

/// How a `bootstrap` or `join` ended at the directory.
public enum FleetAttemptOutcome: Sendable, Equatable, Codable {
    /// This call's statement made the change.
    case applied
    /// An earlier attempt by the same terminal had made it (its answer was lost, or the terminal
    /// stopped before recording it); this call found it there.
    case resumed
}

/// The database role a directory connection logged in as (`FleetDirectoryConnection.sessionRole`).
public struct FleetSessionRole: Sendable, Equatable, Codable {
    /// `session_user`.
    public var name: String
    /// A superuser: bypasses every check and row-level security.
    public var isSuperuser: Bool
    /// A member of `kioskauth_terminal` (superusers count as members of every role).
    public var isTerminalRole: Bool
    /// Owns the directory's tables.
    public var isOwner: Bool

    public init(name: String, isSuperuser: Bool, isTerminalRole: Bool, isOwner: Bool) {
        self.name = name
        self.isSuperuser = isSuperuser
        self.isTerminalRole = isTerminalRole
        self.isOwner = isOwner
    }

    /// Whether a terminal may use this role: its own, with no more than a terminal's rights.
    public var isTerminalOnly: Bool { isTerminalRole && !isSuperuser && !isOwner }
}
