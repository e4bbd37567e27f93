import Crypto
public import Foundation
public import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO

/// One terminal's connection to the fleet directory. Operations on one `FleetDirectory` run one
/// at a time (a connection carries one transaction); a terminal keeps a second one for
/// `changeWakeups()`. docs/fleet.md describes the protocol.
public actor FleetDirectory {
    /// The channel the change feed's trigger notifies.
    public static let changeChannel = "kioskauth_fleet_changes"
    /// The most changes one pull returns.
    public static let maximumPullSize = 1000

    let connection: PostgresConnection
    let logger: Logger
    private var isBusy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    private init(connection: PostgresConnection, logger: Logger) {
        self.connection = connection
        self.logger = logger
    }

    /// Connects to the directory. TLS is required unless the endpoint is on this machine.
    public static func connect(
        to endpoint: FleetEndpoint, password: String?, logger: Logger
    ) async throws(FleetError)
        -> FleetDirectory
    {
        var configuration: PostgresConnection.Configuration
        switch endpoint.transport {
        case .unixSocket(let path):
            configuration = .init(
                unixSocketPath: path, username: endpoint.username, password: password, database: endpoint.database)
        case .tcp(let host, let port):
            let tls: PostgresConnection.Configuration.TLS
            switch endpoint.security {
            case .plaintext:
                tls = .disable
            case .tls(let rootCertificatePath):
                var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
                tlsConfiguration.minimumTLSVersion = .tlsv12
                tlsConfiguration.certificateVerification = .fullVerification
                if let rootCertificatePath {
                    tlsConfiguration.trustRoots = .file(rootCertificatePath)
                }
                do {
                    tls = .require(try NIOSSLContext(configuration: tlsConfiguration))
                } catch {
                    throw FleetError(.badEndpoint("cannot set up TLS: \(error)"))
                }
            }
            configuration = .init(
                host: host, port: port, username: endpoint.username, password: password,
                database: endpoint.database, tls: tls)
        }
        configuration.options.connectTimeout = .seconds(10)
        do {
            let connection = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.next(), configuration: configuration,
                id: Int.random(in: 1...Int(Int32.max)), logger: logger
            ).get()
            return FleetDirectory(connection: connection, logger: logger)
        } catch {
            throw FleetError(.directoryUnavailable(String(reflecting: error)))
        }
    }

    /// Whether the connection has closed (the server went away, or `close()`): a caller keeping
    /// the directory open connects again instead of queueing on a dead connection.
    public nonisolated var isClosed: Bool { connection.isClosed }

    /// Closes the connection.
    public func close() async {
        try? await connection.close()
    }

    // MARK: Schema

    /// Brings the schema to the newest version this build knows, one migration per transaction,
    /// under an advisory lock so terminals starting together do not race. Returns the version.
    @discardableResult
    public func migrate() async throws(FleetError) -> Int32 {
        try await transaction { connection, logger in
            try await connection.query("SELECT pg_advisory_xact_lock(7466532)", logger: logger)
            try await connection.query(
                """
                CREATE TABLE IF NOT EXISTS fleet_schema (
                    version integer PRIMARY KEY,
                    summary text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now()
                )
                """, logger: logger)
            var current: Int32 = 0
            for try await version in try await connection.query(
                "SELECT COALESCE(MAX(version), 0) FROM fleet_schema", logger: logger
            ).decode(Int32.self) {
                current = version
            }
            guard current <= FleetMigration.latestVersion else {
                throw FleetError(.futureSchema(found: current, supported: FleetMigration.latestVersion))
            }
            for migration in FleetMigration.all where migration.version > current {
                for statement in migration.statements {
                    try await connection.query(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.query(
                    "INSERT INTO fleet_schema (version, summary) VALUES (\(migration.version), \(migration.summary))",
                    logger: logger)
                current = migration.version
            }
            return current
        }
    }

    // MARK: Membership and keys

    /// Creates the fleet with this terminal as its first member and generation 1 of the data
    /// key, wrapped to it. Refused once the fleet has a member.
    public func bootstrap(_ terminal: TerminalRegistration) async throws(FleetError) -> FleetDataKey {
        let dataKey = FleetDataKey.random(generation: 1)
        let wrapped = try WrappedDataKey.wrap(dataKey, to: terminal.publicKey, terminalID: terminal.id)
        try await transaction { connection, logger in
            try await connection.query("LOCK TABLE terminals IN EXCLUSIVE MODE", logger: logger)
            let members = try await connection.query(
                "SELECT count(*) FROM terminals WHERE state = 'member'", logger: logger
            ).collect().first?.decode(Int64.self)
            guard members == 0 else { throw FleetError(.conflict("the fleet already has members")) }
            try await Self.insert(terminal, state: "member", tokenID: nil, proof: nil, on: connection, logger: logger)
            try await connection.query(
                "INSERT INTO data_keys (generation, created_by, reason) VALUES (1, \(terminal.id), 'fleet created')",
                logger: logger)
            try await Self.insert(wrapped, on: connection, logger: logger)
        }
        return dataKey
    }

    /// Issues a one-time join token valid for `lifetime` by the directory's clock.
    public func issueJoinToken(by issuer: UUID, lifetime: Duration) async throws(FleetError) -> JoinToken {
        let token = JoinToken(
            id: UUID(), secret: SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })
        let hash = Data(SHA256.hash(data: token.secret))
        let milliseconds = lifetime.components.seconds * 1000 + lifetime.components.attoseconds / 1_000_000_000_000_000
        try await exclusive { connection, logger in
            try await connection.query(
                """
                INSERT INTO join_tokens (token_id, secret_hash, issued_by, expires_at)
                VALUES (\(token.id), \(hash), \(issuer), now() + make_interval(secs => \(Double(milliseconds) / 1000)))
                """, logger: logger)
        }
        return token
    }

    /// Uses a join token: single use, before it expires. Registers the terminal as pending, with
    /// the proof a member checks before wrapping the data key to it.
    public func join(with token: JoinToken, as terminal: TerminalRegistration) async throws(FleetError) {
        let hash = Data(SHA256.hash(data: token.secret))
        let proof = Self.joinProof(token: token, terminal: terminal)
        try await transaction { connection, logger in
            let used = try await connection.query(
                """
                UPDATE join_tokens SET used_at = now(), used_by = \(terminal.id)
                WHERE token_id = \(token.id) AND secret_hash = \(hash) AND used_at IS NULL AND expires_at > now()
                RETURNING token_id
                """, logger: logger
            ).collect()
            guard !used.isEmpty else { throw FleetError(.joinRefused("the token is unknown, used or expired")) }
            try await Self.insert(
                terminal, state: "pending", tokenID: token.id, proof: proof, on: connection, logger: logger)
        }
    }

    /// Admits the terminal that joined with `token` (which this member issued and kept): checks
    /// its proof, wraps `dataKey` to its public key and makes it a member. A row the directory
    /// made up, or whose public key was swapped, fails the proof and is refused.
    public func admit(joinedWith token: JoinToken, dataKey: FleetDataKey) async throws(FleetError) -> UUID {
        try await transaction { connection, logger in
            let rows = try await connection.query(
                """
                SELECT terminal_id, name, public_key, reader_driver, reader_device_type, match_on_chip, join_proof
                FROM terminals WHERE join_token_id = \(token.id) AND state = 'pending' FOR UPDATE
                """, logger: logger
            ).collect()
            guard rows.count == 1, let row = rows.first else {
                throw FleetError(.joinRefused("no single pending terminal joined with \(token)"))
            }
            let (id, name, publicKey, driver, deviceType, matchOnChip, proof) = try row.decode(
                (UUID, String, Data, String?, String?, Bool, Data?).self)
            let terminal = TerminalRegistration(
                id: id, name: name, publicKey: Array(publicKey), readerDriver: driver, readerDeviceType: deviceType,
                isMatchOnChip: matchOnChip)
            let expected = Self.joinProof(token: token, terminal: terminal)
            guard let proof,
                HMAC<SHA256>.isValidAuthenticationCode(proof, authenticating: expected.macInput, using: expected.key)
            else { throw FleetError(.joinRefused("the pending terminal's proof does not match \(token)")) }
            let wrapped = try WrappedDataKey.wrap(dataKey, to: terminal.publicKey, terminalID: id)
            try await Self.insert(wrapped, on: connection, logger: logger)
            try await connection.query(
                "UPDATE terminals SET state = 'member' WHERE terminal_id = \(id)", logger: logger)
            return id
        }
    }

    /// Removes a terminal: it may no longer push, and its wrapped keys are deleted. What it
    /// already holds it keeps; call `rotateDataKey` so what is written afterwards is sealed
    /// under a generation it never had.
    public func removeTerminal(_ id: UUID) async throws(FleetError) {
        try await transaction { connection, logger in
            try await connection.query(
                "UPDATE terminals SET state = 'removed', removed_at = now() WHERE terminal_id = \(id)", logger: logger)
            try await connection.query("DELETE FROM wrapped_keys WHERE terminal_id = \(id)", logger: logger)
        }
    }

    /// Publishes a new data-key generation, wrapped to every current member. The caller is a
    /// member; it makes the key (`FleetDataKey.random(generation:)`) one above the newest.
    public func rotateDataKey(to dataKey: FleetDataKey, by member: UUID, reason: String) async throws(FleetError) {
        try await transaction { connection, logger in
            try await connection.query("LOCK TABLE terminals IN SHARE MODE", logger: logger)
            try await connection.query(
                "INSERT INTO data_keys (generation, created_by, reason) VALUES (\(dataKey.generation), \(member), \(reason))",
                logger: logger)
            let members = try await connection.query(
                "SELECT terminal_id, public_key FROM terminals WHERE state = 'member'", logger: logger
            ).collect()
            for member in members {
                let (id, publicKey) = try member.decode((UUID, Data).self)
                let wrapped = try WrappedDataKey.wrap(dataKey, to: Array(publicKey), terminalID: id)
                try await Self.insert(wrapped, on: connection, logger: logger)
            }
        }
    }

    /// The data-key generations wrapped to `terminal`, oldest first.
    public func wrappedDataKeys(for terminal: UUID) async throws(FleetError) -> [WrappedDataKey] {
        try await exclusive { connection, logger in
            var keys: [WrappedDataKey] = []
            for try await (generation, encapsulated, ciphertext) in try await connection.query(
                """
                SELECT generation, encapsulated_key, ciphertext FROM wrapped_keys
                WHERE terminal_id = \(terminal) ORDER BY generation
                """, logger: logger
            ).decode((Int32, Data, Data).self) {
                keys.append(
                    WrappedDataKey(
                        terminalID: terminal, generation: generation, encapsulatedKey: Array(encapsulated),
                        ciphertext: Array(ciphertext)))
            }
            return keys
        }
    }

    // MARK: Sync

    /// Applies a batch in one transaction, exactly once per idempotency key.
    @discardableResult
    public func push(_ batch: PushBatch) async throws(FleetError) -> PushOutcome {
        let operations: String
        do {
            operations = String(
                decoding: try JSONSerialization.data(withJSONObject: batch.writes.map(\.record)), as: UTF8.self)
        } catch {
            throw FleetError(.conflict("cannot encode the batch: \(error)"))
        }
        // One statement, so its own transaction: the change-clock lock is held only while the
        // server applies the batch (docs/fleet.md §4).
        let applied = try await exclusive { connection, logger in
            try await connection.query(
                "SELECT fleet_apply_push(\(batch.idempotencyKey), \(batch.terminal), \(operations)::jsonb)",
                logger: logger
            ).collect().first?.decode(Bool.self)
        }
        return applied == true ? .applied : .alreadyApplied
    }

    /// The changes after `cursor`, in change-id order, at most `limit`. A pull never misses a
    /// change: ids are handed out in commit order (docs/fleet.md §4), so every change with an id
    /// at most the last one returned is already visible.
    public func pull(after cursor: Int64, limit: Int = maximumPullSize) async throws(FleetError) -> [FleetChange] {
        try await exclusive { connection, logger in
            var changes: [FleetChange] = []
            for try await (id, entity, key, deleted, body) in try await connection.query(
                """
                SELECT change_id, entity, entity_key, deleted, body::text FROM changes
                WHERE change_id > \(cursor) ORDER BY change_id LIMIT \(min(limit, Self.maximumPullSize))
                """, logger: logger
            ).decode((Int64, String, String, Bool, String?).self) {
                changes.append(FleetChange(id: id, entity: entity, key: key, isDeletion: deleted, body: body))
            }
            return changes
        }
    }

    /// Records how far `terminal` has pulled, for `fleet status`.
    public func recordCursor(_ cursor: Int64, for terminal: UUID) async throws(FleetError) {
        try await exclusive { connection, logger in
            try await connection.query(
                """
                INSERT INTO terminal_sync (terminal_id, cursor) VALUES (\(terminal), \(cursor))
                ON CONFLICT (terminal_id) DO UPDATE SET cursor = EXCLUDED.cursor, last_seen_at = now()
                """, logger: logger)
        }
    }

    /// The newest change id, and `terminal`'s recorded cursor (0 if none): their difference is
    /// its lag.
    public func feedPosition(for terminal: UUID) async throws(FleetError) -> (head: Int64, cursor: Int64) {
        try await exclusive { connection, logger in
            let row = try await connection.query(
                """
                SELECT (SELECT last_id FROM change_clock),
                       COALESCE((SELECT cursor FROM terminal_sync WHERE terminal_id = \(terminal)), 0)
                """, logger: logger
            ).collect().first
            return try row?.decode((Int64, Int64).self) ?? (0, 0)
        }
    }

    /// Listens for the change feed's notifications on this connection while `body` runs: each
    /// wake-up means "pull now". Notifications are lost while a connection is down, so terminals
    /// also poll. Use a connection of its own: the directory's other calls go on another.
    public nonisolated func withChangeWakeups<Value: Sendable>(
        _ body: (FleetWakeups) async throws -> Value
    ) async throws -> Value {
        try await connection.listen(on: Self.changeChannel) { notifications in
            try await body(FleetWakeups(base: notifications))
        }
    }

    // MARK: Passcode failures

    /// The passcode failures counted for `person` across the fleet since the last reset.
    public func fleetPasscodeFailures(person: UUID) async throws(FleetError) -> Int {
        try await exclusive { connection, logger in
            let sum = try await connection.query(
                "SELECT COALESCE(SUM(failures), 0)::bigint FROM passcode_failures WHERE person_id = \(person)",
                logger: logger
            ).collect().first?.decode(Int64.self)
            return Int(sum ?? 0)
        }
    }

    /// The audit events stored for `terminal`, for comparing against what it sent.
    public func auditEventCount(terminal: UUID) async throws(FleetError) -> Int {
        try await exclusive { connection, logger in
            let count = try await connection.query(
                "SELECT count(*) FROM audit_events WHERE terminal_id = \(terminal)", logger: logger
            ).collect().first?.decode(Int64.self)
            return Int(count ?? 0)
        }
    }

    // MARK: Helpers

    static func joinProof(
        token: JoinToken, terminal: TerminalRegistration
    ) -> (
        key: SymmetricKey, macInput: Data, mac: Data
    ) {
        let key = SymmetricKey(data: token.secret)
        let input = Data("kioskauth.fleet.join.v1\u{0}\(terminal.id.fleetText)\u{0}".utf8) + Data(terminal.publicKey)
        return (key, input, Data(HMAC<SHA256>.authenticationCode(for: input, using: key)))
    }

    static func insert(
        _ terminal: TerminalRegistration, state: String, tokenID: UUID?,
        proof: (key: SymmetricKey, macInput: Data, mac: Data)?,
        on connection: PostgresConnection, logger: Logger
    ) async throws {
        try await connection.query(
            """
            INSERT INTO terminals (terminal_id, name, public_key, reader_driver, reader_device_type, match_on_chip,
                                   state, join_token_id, join_proof)
            VALUES (\(terminal.id), \(terminal.name), \(Data(terminal.publicKey)), \(terminal.readerDriver),
                    \(terminal.readerDeviceType), \(terminal.isMatchOnChip), \(state), \(tokenID), \(proof?.mac))
            """, logger: logger)
    }

    static func insert(_ wrapped: WrappedDataKey, on connection: PostgresConnection, logger: Logger) async throws {
        try await connection.query(
            """
            INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
            VALUES (\(wrapped.terminalID), \(wrapped.generation), \(Data(wrapped.encapsulatedKey)),
                    \(Data(wrapped.ciphertext)))
            """, logger: logger)
    }

    /// Runs `body` alone on the connection; errors other than `FleetError` become
    /// `directoryUnavailable`.
    @discardableResult
    func exclusive<T: Sendable>(
        _ body: (PostgresConnection, Logger) async throws -> T
    ) async throws(FleetError) -> T {
        while isBusy {
            await withCheckedContinuation { waiters.append($0) }
        }
        isBusy = true
        defer {
            isBusy = false
            if !waiters.isEmpty { waiters.removeFirst().resume() }
        }
        do {
            return try await body(connection, logger)
        } catch let error as FleetError {
            throw error
        } catch {
            throw FleetError(.directoryUnavailable(String(reflecting: error)))
        }
    }

    /// Runs `body` in one transaction, alone on the connection; rolls back if it throws.
    func transaction<T: Sendable>(
        _ body: (PostgresConnection, Logger) async throws -> T
    ) async throws(FleetError) -> T {
        try await exclusive { connection, logger in
            try await connection.query("BEGIN", logger: logger)
            do {
                let result = try await body(connection, logger)
                try await connection.query("COMMIT", logger: logger)
                return result
            } catch {
                _ = try? await connection.query("ROLLBACK", logger: logger)
                throw error
            }
        }
    }
}

/// Wake-ups from the change feed's `NOTIFY`.
public struct FleetWakeups: AsyncSequence, Sendable {
    public typealias Element = Void
    let base: PostgresNotificationSequence

    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(base: base.makeAsyncIterator()) }

    /// Yields once per notified commit.
    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: PostgresNotificationSequence.AsyncIterator

        public mutating func next() async throws -> Void? {
            try await base.next() == nil ? nil : ()
        }
    }
}
