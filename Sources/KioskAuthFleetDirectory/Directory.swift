import Crypto
import Foundation
public import FoundationEssentials
public import KioskAuthFleet
public import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import Synchronization

/// One terminal's connection to the fleet directory. Operations on one `FleetDirectory` run one
/// at a time (a connection carries one transaction); a terminal keeps a second one for
/// `changeWakeups()`. docs/fleet.md describes the protocol.
public actor FleetDirectory: FleetDirectoryConnection {
    /// The channel the change feed's trigger notifies.
    public static let changeChannel = "kioskauth_fleet_changes"

    let connection: PostgresConnection
    let logger: Logger
    private var isBusy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []
    /// The data keys this terminal holds: push MACs rows with them, pull verifies with them.
    private var keyring: FleetKeyring?
    /// The newest version (and its MAC) seen per MACed row ("entity/key"); `Int64.max` after
    /// a deletion, since row ids are never reused.
    private var rowVersions: [String: (version: Int64, mac: [UInt8])] = [:]
    /// The last version this directory handed out, so the versions it writes always increase.
    private var lastVersion: Int64 = 0

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

    /// Calls `body` once the connection has closed, however it closed.
    public nonisolated func whenClosed(_ body: @escaping @Sendable () -> Void) {
        connection.closeFuture.whenComplete { _ in body() }
    }

    /// Closes the connection.
    public func close() async {
        try? await connection.close()
    }

    // MARK: Schema

    /// Brings the schema to the newest version this build knows, one migration per transaction,
    /// under an advisory lock so terminals starting together do not race. Returns the version.
    /// Only the owner role can migrate; a terminal role finds the schema current and returns.
    @discardableResult
    public func migrate() async throws(FleetError) -> Int32 {
        try await transaction { connection, logger in
            try await connection.query("SELECT pg_advisory_xact_lock(7466532)", logger: logger)
            // Read first: terminal roles may not create anything, and need not.
            let exists = try await connection.query(
                "SELECT to_regclass('fleet_schema') IS NOT NULL", logger: logger
            ).collect().first?.decode(Bool.self)
            if exists == true {
                let existing = try await connection.query(
                    "SELECT COALESCE(MAX(version), 0) FROM fleet_schema", logger: logger
                ).collect().first?.decode(Int32.self)
                if existing == FleetMigration.latestVersion { return FleetMigration.latestVersion }
            }
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
    /// key, wrapped to it. Refused once the fleet has a member. The terminal is recorded as
    /// belonging to this connection's database role, and generation 1 becomes this directory's
    /// keyring.
    public func bootstrap(_ terminal: TerminalRegistration) async throws(FleetError) -> FleetDataKey {
        let dataKey = FleetDataKey.random(generation: 1)
        let wrapped = try WrappedDataKey.wrap(dataKey, to: terminal.publicKey, terminalID: terminal.id)
        _ = try await bootstrap(terminal, dataKey: dataKey, wrapped: wrapped)
        return dataKey
    }

    /// Creates the fleet with `dataKey` (generation 1), sent as `wrapped` (to `terminal`'s public
    /// key), or finds that an earlier attempt with the same terminal and the same wrapped bytes
    /// already did: one whose answer was lost, or whose terminal stopped before recording it.
    /// The caller keeps those bytes between attempts (HPKE wrapping is randomised, so nobody
    /// else can produce them). A fleet made by anyone else, or with another key, is refused.
    public func bootstrap(
        _ terminal: TerminalRegistration, dataKey: FleetDataKey, wrapped: WrappedDataKey
    ) async throws(FleetError) -> FleetAttemptOutcome {
        try await requireSchema(4, for: "creating a fleet")
        // The creator vouches for its own row: a rotation is wrapped only to vouched members.
        let vouch = FleetKeyAuthentication.vouchMAC(
            terminal: terminal.id, publicKey: terminal.publicKey, under: dataKey)
        let created = try await exclusive { connection, logger in
            try await connection.query(
                """
                SELECT fleet_bootstrap(\(terminal.id), \(terminal.name), \(Data(terminal.publicKey)),
                                       \(terminal.readerDriver), \(terminal.readerDeviceType), \(terminal.isMatchOnChip),
                                       \(Data(wrapped.encapsulatedKey)), \(Data(wrapped.ciphertext)), \(vouch))
                """, logger: logger
            ).collect().first?.decode(Bool.self)
        }
        var outcome = FleetAttemptOutcome.applied
        if created != true {
            // This role's member terminal, with this public key and the very bytes sent.
            let found = try await exclusive { connection, logger in
                try await connection.query(
                    """
                    SELECT w.encapsulated_key, w.ciphertext FROM terminals t
                    JOIN wrapped_keys w ON w.terminal_id = t.terminal_id AND w.generation = 1
                    WHERE t.terminal_id = \(terminal.id) AND t.db_role = session_user AND t.state = 'member'
                      AND t.public_key = \(Data(terminal.publicKey))
                    """, logger: logger
                ).collect().first?.decode((Data, Data).self)
            }
            guard let found, Array(found.0) == wrapped.encapsulatedKey, Array(found.1) == wrapped.ciphertext else {
                throw FleetError(.conflict("the fleet already has members"))
            }
            outcome = .resumed
        }
        keyring = FleetKeyring([dataKey])
        return outcome
    }

    /// Issues a one-time join token valid for `lifetime` by the directory's clock. `issuer` must
    /// be a member belonging to this connection's role.
    public func issueJoinToken(by issuer: UUID, lifetime: Duration) async throws(FleetError) -> JoinToken {
        let token = JoinToken(
            id: UUID(), secret: SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })
        let hash = Data(SHA256.hash(data: token.secret))
        let milliseconds = lifetime.components.seconds * 1000 + lifetime.components.attoseconds / 1_000_000_000_000_000
        try await exclusive { connection, logger in
            try await connection.query(
                "SELECT fleet_issue_join_token(\(token.id), \(hash), \(issuer), \(Double(milliseconds) / 1000))",
                logger: logger
            ).collect()
        }
        return token
    }

    /// Uses a join token: single use, before it expires. Registers the terminal as pending, with
    /// the proof a member checks before wrapping the data key to it, owned by this connection's
    /// database role (one live terminal per role). When the token is used already, or the role
    /// has a terminal, but the one that used it is this very terminal (same id, public key and
    /// proof, this role's), an earlier attempt did it: `resumed`, with the state it has now
    /// (`pending`, or `member` once admitted).
    @discardableResult
    public func join(
        with token: JoinToken, as terminal: TerminalRegistration
    ) async throws(FleetError) -> (outcome: FleetAttemptOutcome, state: String) {
        // Admitted on a directory before migration 4, the newcomer would find no admission MAC
        // to check, and stay pending.
        try await requireSchema(4, for: "joining a fleet")
        let hash = Data(SHA256.hash(data: token.secret))
        let proof = Self.joinProof(token: token, terminal: terminal).mac
        let refusal: FleetError
        do throws(FleetError) {
            let joined = try await exclusive { connection, logger in
                try await connection.query(
                    """
                    SELECT fleet_join(\(token.id), \(hash), \(terminal.id), \(terminal.name), \(Data(terminal.publicKey)),
                                      \(terminal.readerDriver), \(terminal.readerDeviceType), \(terminal.isMatchOnChip),
                                      \(proof))
                    """, logger: logger
                ).collect().first?.decode(Bool.self)
            }
            if joined == true { return (.applied, "pending") }
            refusal = FleetError(.joinRefused("the token is unknown, used or expired"))
        } catch {
            // "Role already has a terminal": perhaps the one an earlier attempt registered.
            guard error.code == .conflict else { throw error }
            refusal = error
        }
        let state = try await exclusive { connection, logger in
            try await connection.query(
                """
                SELECT state FROM terminals
                WHERE terminal_id = \(terminal.id) AND db_role = session_user AND state <> 'removed'
                  AND public_key = \(Data(terminal.publicKey)) AND join_token_id = \(token.id) AND join_proof = \(proof)
                """, logger: logger
            ).collect().first?.decode(String.self)
        }
        guard let state else { throw refusal }
        return (.resumed, state)
    }

    /// Admits the terminal that joined with `token` (which this member issued and kept): checks
    /// its proof, wraps every generation in `dataKeys` to its public key and makes it a member.
    /// A row the directory made up, or whose public key was swapped, fails the proof and is
    /// refused. Only the member that issued the token (this connection's role's) may admit with
    /// it. The directory refuses (`conflict`) unless `dataKeys` are exactly the fleet's
    /// generations, so a member that has not yet taken a new generation cannot make a member
    /// without it: take the keys (`loadKeyring`) and call again. The admission carries a MAC of
    /// every generation under the join secret, which the newcomer checks before it takes them,
    /// and this member's vouch for the newcomer under the newest generation (§6.2).
    public func admit(joinedWith token: JoinToken, dataKeys: [FleetDataKey]) async throws(FleetError) -> UUID {
        try await requireSchema(4, for: "admitting a terminal")
        guard let newest = dataKeys.max(by: { $0.generation < $1.generation }) else {
            throw FleetError(.keyUnavailable("no data key to admit with"))
        }
        return try await exclusive { connection, logger in
            // Read, check the proof here, then admit in one call that succeeds only while the
            // row still has the public key that was checked.
            let rows = try await connection.query(
                """
                SELECT terminal_id, name, public_key, reader_driver, reader_device_type, match_on_chip, join_proof
                FROM terminals WHERE join_token_id = \(token.id) AND state = 'pending'
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
            var wraps: [String: WrappedDataKey] = [:]
            for dataKey in dataKeys {
                wraps[String(dataKey.generation)] = try WrappedDataKey.wrap(
                    dataKey, to: terminal.publicKey, terminalID: id)
            }
            let json = try Self.wrapsJSON(wraps)
            let admission = FleetKeyAuthentication.admissionMAC(
                joinSecret: token.secret, terminal: id, publicKey: terminal.publicKey, keys: dataKeys)
            let vouch = FleetKeyAuthentication.vouchMAC(terminal: id, publicKey: terminal.publicKey, under: newest)
            try await connection.query(
                """
                SELECT fleet_admit_keys(\(id), \(token.id), \(publicKey), \(json)::jsonb, \(admission),
                                        \(newest.generation), \(vouch))
                """, logger: logger
            ).collect()
            return id
        }
    }

    /// Admits with one generation: the fleet must have only that one.
    public func admit(joinedWith token: JoinToken, dataKey: FleetDataKey) async throws(FleetError) -> UUID {
        try await admit(joinedWith: token, dataKeys: [dataKey])
    }

    /// Removes a terminal: it may no longer push, and its wrapped keys are deleted. If it held
    /// the data key, the fleet owes a rotation (`rotateDataKeyIfDue`), after which what is
    /// written is sealed under a generation it never had. A member may remove any terminal, a
    /// terminal itself. An unknown id is `notFound`; removing a removed terminal changes nothing.
    public func removeTerminal(_ id: UUID) async throws(FleetError) {
        try await exclusive { connection, logger in
            try await connection.query("SELECT fleet_remove_terminal(\(id))", logger: logger).collect()
        }
    }

    /// The directory's schema version once it is known to be the newest this build knows (it
    /// only rises): an older one is asked again each time, until its owner migrates it.
    private var schemaVersion: Int32?

    func currentSchemaVersion() async throws(FleetError) -> Int32 {
        if let schemaVersion { return schemaVersion }
        let version = try await exclusive { connection, logger in
            try await connection.query("SELECT COALESCE(max(version), 0) FROM fleet_schema", logger: logger)
                .collect().first?.decode(Int32.self) ?? 0
        }
        if version >= FleetMigration.latestVersion { schemaVersion = version }
        return version
    }

    /// Refuses, by name, what a directory older than `version` cannot do safely.
    func requireSchema(_ version: Int32, for what: String) async throws(FleetError) {
        let found = try await currentSchemaVersion()
        guard found >= version else { throw FleetError(.outdatedSchema(found: found, needed: version, what)) }
    }

    /// Whether a removal owes the fleet a new data-key generation, and the newest generation.
    /// Never owed by a directory before migration 3 (it has no record of the debt): its owner
    /// migrates it with `fleet migrate`.
    public func rotationDue() async throws(FleetError) -> (due: Bool, newest: Int32) {
        guard try await currentSchemaVersion() >= 3 else { return (false, 0) }
        return try await exclusive { connection, logger in
            let row = try await connection.query(
                """
                SELECT EXISTS (SELECT 1 FROM terminals WHERE rekey_due),
                       (SELECT COALESCE(max(generation), 0) FROM data_keys)
                """, logger: logger
            ).collect().first
            return try row?.decode((Bool, Int32).self) ?? (false, 0)
        }
    }

    /// Publishes the generation a removal owes, if one is owed: a fresh key one above the
    /// newest, wrapped to every current member. Returns it, or nil when none was owed or another
    /// member published it first (members race for it; exactly one wins, the others find the
    /// debt paid at their next call).
    public func rotateDataKeyIfDue(
        by member: UUID, publicKey: [UInt8], excluding removed: Set<UUID> = []
    ) async throws(FleetError) -> FleetRotation? {
        // A conflict means another member published first (the debt is then paid) or the
        // members changed meanwhile (it is not): look again, a few times.
        for _ in 0..<3 {
            let (due, newest) = try await rotationDue()
            guard due else { return nil }
            guard newest < Int32.max else {
                throw FleetError(.conflict("the newest data-key generation is \(newest): there is no next one"))
            }
            let dataKey = FleetDataKey.random(generation: newest + 1)
            do {
                let unvouched = try await rotateDataKey(
                    to: dataKey, by: member, publicKey: publicKey, excluding: removed, reason: "terminal removed")
                return FleetRotation(key: dataKey, unvouched: unvouched)
            } catch {
                guard error.code == .conflict else { throw error }
            }
        }
        return nil
    }

    /// Publishes a new data-key generation, wrapped to every current member whose vouch opens
    /// with a generation held here (§6.2): a member row a directory writer added, or whose
    /// public key it changed, is not given the key. The caller is a member; it makes the key
    /// (`FleetDataKey.random(generation:)`) one above the newest, and holds the newest, under
    /// which the new one is MACed so members can tell it came from a member. The new key joins
    /// this directory's keyring. Refused (`conflict`) if the members change between reading them
    /// and publishing, or the generation is not the next one; call again. Returns the members
    /// left out, unvouched.
    @discardableResult
    public func rotateDataKey(
        to dataKey: FleetDataKey, by member: UUID, publicKey ownKey: [UInt8], excluding removed: Set<UUID> = [],
        reason: String
    ) async throws(FleetError) -> [UUID] {
        try await requireSchema(4, for: "rotating the data key")
        guard let keyring, let previous = keyring.dataKey(generation: dataKey.generation - 1) else {
            throw FleetError(
                .keyUnavailable("generation \(dataKey.generation - 1) is not held: take the fleet's keys first"))
        }
        // The directory's newest generation must be the newest held: one it lost (a writer
        // deleted it) would be minted again under another key, which this terminal would use
        // for its own rows while every other member kept the first.
        guard keyring.currentGeneration == previous.generation else {
            throw FleetError(
                .integrity(
                    "the directory's newest data-key generation is \(previous.generation), but this terminal holds \(keyring.currentGeneration): not rotating"
                ))
        }
        let chain = FleetKeyAuthentication.chainMAC(of: dataKey, under: previous)
        let unvouched = try await exclusive { connection, logger in
            let members = try await connection.query(
                "SELECT terminal_id, public_key, vouch_generation, vouch_mac FROM terminals WHERE state = 'member'",
                logger: logger
            ).collect()
            var wraps: [String: WrappedDataKey] = [:]
            var vouches: [String: Data] = [:]
            var unvouched: [UUID] = []
            for row in members {
                let (id, publicKey, generation, mac) = try row.decode((UUID, Data, Int32?, Data?).self)
                var vouched = false
                if id == member {
                    // This terminal's own row: wrapped to the key it knows is its own, never to
                    // whatever the directory lists (a writer's key there would get the rotation,
                    // with a genuine chain MAC every other member then takes).
                    guard Array(publicKey) == ownKey else {
                        throw FleetError(
                            .integrity("the directory lists another public key for this terminal: not rotating"))
                    }
                    vouched = true
                } else if !removed.contains(id), generation == previous.generation, let mac {
                    // Only a vouch under the newest generation counts: each rotation renews the
                    // vouches of the members it wraps to, so an older one (a removed terminal's,
                    // put back by a writer) is worth nothing.
                    vouched = FleetKeyAuthentication.isValidVouch(
                        mac, terminal: id, publicKey: Array(publicKey), under: previous)
                }
                guard vouched else {
                    unvouched.append(id)
                    continue
                }
                wraps[id.fleetText] = try WrappedDataKey.wrap(dataKey, to: Array(publicKey), terminalID: id)
                vouches[id.fleetText] = FleetKeyAuthentication.vouchMAC(
                    terminal: id, publicKey: Array(publicKey), under: dataKey)
            }
            let json = try Self.wrapsJSON(wraps, vouches: vouches)
            let left = String(
                decoding: try JSONSerialization.data(withJSONObject: unvouched.map(\.fleetText)), as: UTF8.self)
            try await connection.query(
                """
                SELECT fleet_rotate_data_key(\(dataKey.generation), \(member), \(reason), \(json)::jsonb, \(chain),
                                             \(left)::jsonb)
                """, logger: logger
            ).collect()
            return unvouched
        }
        if !unvouched.isEmpty {
            logger.error(
                "fleet rotation: members whose vouch does not open were not given the new key",
                metadata: ["terminals": "\(unvouched)", "generation": "\(dataKey.generation)"])
        }
        self.keyring?.add(dataKey)
        return unvouched
    }

    /// Vouches for `terminal`'s own member row under the newest generation held, unless its
    /// vouch already opens: a row from before migration 4 has none, a writer may have cleared
    /// it, and a rotation is wrapped only to vouched members. A sync calls it each time (one
    /// query while the vouch opens). Returns whether it wrote one.
    @discardableResult
    public func vouchForSelf(_ terminal: UUID, publicKey: [UInt8]) async throws(FleetError) -> Bool {
        guard try await currentSchemaVersion() >= 4 else { return false }
        guard let keyring, let newest = keyring.dataKey(generation: keyring.currentGeneration) else { return false }
        return try await exclusive { connection, logger in
            let row = try await connection.query(
                """
                SELECT public_key, vouch_generation, vouch_mac, (SELECT max(generation) FROM data_keys) FROM terminals
                WHERE terminal_id = \(terminal) AND state = 'member'
                """, logger: logger
            ).collect().first
            guard let (listedKey, generation, mac, fleetNewest) = try row?.decode((Data, Int32?, Data?, Int32?).self)
            else { return false }
            // A public key that is not this terminal's is the directory's doing: vouching for
            // it would give a writer the next rotation.
            guard Array(listedKey) == publicKey else {
                throw FleetError(.integrity("the directory lists another public key for this terminal"))
            }
            // Only a vouch under the newest generation counts (`rotateDataKey`). With a newer
            // generation in the directory (or a vouch under one) than this terminal holds, a
            // rotation it has not taken yet renewed its vouch: rewriting it under an older one
            // would leave it out of the next, and `fleet_vouch` would refuse it anyway.
            if max(generation ?? 0, fleetNewest ?? 0) > newest.generation { return false }
            if generation == newest.generation, let mac,
                FleetKeyAuthentication.isValidVouch(mac, terminal: terminal, publicKey: publicKey, under: newest)
            {
                return false
            }
            let vouch = FleetKeyAuthentication.vouchMAC(terminal: terminal, publicKey: publicKey, under: newest)
            try await connection.query(
                "SELECT fleet_vouch(\(terminal), \(newest.generation), \(vouch))", logger: logger
            ).collect()
            return true
        }
    }

    /// What the directory holds for `terminal`'s keys: its wrapped generations, their chain
    /// MACs and its admission, for `FleetKeyAuthentication.accept`. A terminal role sees only
    /// its own wrapped keys (row-level security).
    public func keyDelivery(for terminal: UUID) async throws(FleetError) -> FleetKeyDelivery {
        let wrapped = try await wrappedDataKeys(for: terminal)
        guard try await currentSchemaVersion() >= 4 else {
            return FleetKeyDelivery(wrapped: wrapped, chainMACs: [:], admission: nil)
        }
        return try await exclusive { connection, logger in
            var chain: [Int32: Data] = [:]
            for try await (generation, mac) in try await connection.query(
                "SELECT generation, chain_mac FROM data_keys WHERE chain_mac IS NOT NULL", logger: logger
            ).decode((Int32, Data).self) {
                chain[generation] = mac
            }
            let admission = try await connection.query(
                "SELECT admission_mac, admitted_through FROM terminals WHERE terminal_id = \(terminal)", logger: logger
            ).collect().first?.decode((Data?, Int32?).self)
            var admitted: (mac: Data, through: Int32)?
            if let admission, let mac = admission.0, let through = admission.1 { admitted = (mac, through) }
            return FleetKeyDelivery(wrapped: wrapped, chainMACs: chain, admission: admitted)
        }
    }

    /// The data-key generations wrapped to `terminal`, oldest first. A terminal role sees only
    /// its own (row-level security).
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

    /// Wrapped keys as the directory's functions take them: key → {encapsulated, ciphertext} in
    /// base64, as JSON text.
    static func wrapsJSON(_ wraps: [String: WrappedDataKey], vouches: [String: Data] = [:]) throws -> String {
        var object: [String: [String: String]] = [:]
        for (key, wrapped) in wraps {
            object[key] = [
                "encapsulated": Data(wrapped.encapsulatedKey).base64EncodedString(),
                "ciphertext": Data(wrapped.ciphertext).base64EncodedString(),
            ]
            object[key]?["vouch"] = vouches[key]?.base64EncodedString()
        }
        return String(decoding: try JSONSerialization.data(withJSONObject: object), as: UTF8.self)
    }

    /// Where `terminal` stands, in one query a sync makes first: its state in the directory
    /// (`pending`, `member`, `removed`; nil if it has no row) and whether a removal owes the fleet
    /// a new data-key generation (never before migration 3).
    public func standing(of terminal: UUID) async throws(FleetError) -> (state: String?, rotationDue: Bool) {
        let owes =
            try await currentSchemaVersion() >= 3 ? "EXISTS (SELECT 1 FROM terminals WHERE rekey_due)" : "false"
        return try await exclusive { connection, logger in
            let row = try await connection.query(
                "SELECT (SELECT state FROM terminals WHERE terminal_id = \(terminal)), \(unescaped: owes)",
                logger: logger
            ).collect().first
            return try row?.decode((String?, Bool).self) ?? (nil, false)
        }
    }

    /// Every terminal the directory knows, removed ones included, oldest first, with when each
    /// last recorded its cursor.
    public func terminals() async throws(FleetError) -> [FleetTerminal] {
        try await exclusive { connection, logger in
            var terminals: [FleetTerminal] = []
            for try await (id, name, state, driver, deviceType, matchOnChip, joinedAt, removedAt, lastSeenAt)
                in try await connection.query(
                    """
                    SELECT t.terminal_id, t.name, t.state, t.reader_driver, t.reader_device_type, t.match_on_chip,
                           t.joined_at, t.removed_at, s.last_seen_at
                    FROM terminals t LEFT JOIN terminal_sync s USING (terminal_id)
                    ORDER BY t.joined_at, t.terminal_id
                    """, logger: logger
                ).decode((UUID, String, String, String?, String?, Bool, Date, Date?, Date?).self)
            {
                terminals.append(
                    FleetTerminal(
                        id: id, name: name, state: state, readerDriver: driver, readerDeviceType: deviceType,
                        isMatchOnChip: matchOnChip, joinedAt: joinedAt, removedAt: removedAt, lastSeenAt: lastSeenAt))
            }
            return terminals
        }
    }

    // MARK: Sync

    /// Applies a batch in one transaction, exactly once per idempotency key. People, verifier
    /// and template writes are given a version and a row MAC here, under the keyring's newest
    /// generation (verifiers and templates: their sealing generation), so they need the data
    /// key (`useKeyring`). The directory refuses a batch for a terminal that is not this
    /// connection role's (`permissionDenied`) or not a member (`notMember`).
    @discardableResult
    public func push(_ batch: PushBatch) async throws(FleetError) -> PushOutcome {
        var records: [[String: String]] = []
        // What this connection knew of each MACed row before this push: restored if the
        // directory already had the batch (a resend), since it then keeps the version of the
        // attempt that was applied, not this one's.
        var previous: [String: (version: Int64, mac: [UInt8])?] = [:]
        for write in batch.writes {
            if let (table, row, _) = FleetRowMAC.content(of: write), previous["\(table)/\(row)"] == nil {
                previous["\(table)/\(row)"] = .some(rowVersions["\(table)/\(row)"])
            }
            records.append(try authenticatedRecord(write))
        }
        let operations: String
        do {
            operations = String(decoding: try JSONSerialization.data(withJSONObject: records), as: UTF8.self)
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
        if applied != true {
            for (row, known) in previous { rowVersions[row] = known }
        }
        return applied == true ? .applied : .alreadyApplied
    }

    /// The changes after `cursor`, in change-id order, at most `limit`. A pull never misses a
    /// change: ids are handed out in commit order (docs/fleet.md §4), so every change with an id
    /// at most the last one returned is already visible.
    ///
    /// Rows of the MACed tables are verified with the keyring (`useKeyring`): a change whose MAC
    /// is missing or wrong, that is older than a version of its row already seen, or that this
    /// terminal cannot check, comes back with its body withheld and `integrity` saying why.
    /// Never apply a change that is not `isTrusted`; the cursor may move past it.
    public func pull(after cursor: Int64, limit: Int) async throws(FleetError) -> [FleetChange] {
        let changes = try await exclusive { connection, logger in
            var changes: [FleetChange] = []
            for try await (id, entity, key, deleted, body) in try await connection.query(
                """
                SELECT change_id, entity, entity_key, deleted, body::text FROM changes
                WHERE change_id > \(cursor) ORDER BY change_id LIMIT \(min(limit, FleetChange.maximumPerPull))
                """, logger: logger
            ).decode((Int64, String, String, Bool, String?).self) {
                changes.append(FleetChange(id: id, entity: entity, key: key, isDeletion: deleted, body: body))
            }
            return changes
        }
        return changes.map { verify($0) }
    }

    /// Records how far `terminal` (this connection role's) has pulled, for `fleet status`.
    public func recordCursor(_ cursor: Int64, for terminal: UUID) async throws(FleetError) {
        try await exclusive { connection, logger in
            try await connection.query("SELECT fleet_record_cursor(\(terminal), \(cursor))", logger: logger)
                .collect()
        }
    }

    // MARK: Row MACs

    /// Gives the directory the data keys this terminal holds: pushes MAC rows with them and
    /// pulls verify rows with them. `bootstrap` and `rotateDataKey` add their keys themselves.
    public func useKeyring(_ keyring: FleetKeyring) {
        self.keyring = keyring
    }

    /// Generation `generation` of the keyring this directory uses, if held.
    func heldKey(generation: Int32) -> FleetDataKey? { keyring?.dataKey(generation: generation) }

    /// Fetches the data keys wrapped to `terminal`, opens them with its key pair, takes those
    /// that authenticate (`FleetKeyAuthentication.accept`: by the generations this directory
    /// already holds, or, for a newcomer holding none, by its admission under `joinSecret`) and
    /// uses them. Any generation refused is an `integrity` error, and nothing new is taken.
    @discardableResult
    public func loadKeyring(
        for terminal: UUID, keyPair: TerminalKeyPair, joinSecret: [UInt8]? = nil
    ) async throws(FleetError) -> FleetKeyring {
        let delivery = try await keyDelivery(for: terminal)
        let held = keyring?.heldKeys ?? []
        let acceptance = FleetKeyAuthentication.accept(
            delivery, keyPair: keyPair, terminal: terminal, held: held, joinSecret: joinSecret)
        if let refused = acceptance.refused.first {
            throw FleetError(.integrity("data-key generation \(refused.generation) refused: \(refused.reason)"))
        }
        let keyring = FleetKeyring(acceptance.keys)
        self.keyring = keyring
        return keyring
    }

    /// Tells the directory the version of a row this terminal already holds (from its store,
    /// after a restart), so that an older version written back into the directory is refused.
    /// `Int64.max` marks a row the terminal saw deleted: it is refused if it ever reappears.
    public func rememberRowVersion(_ version: Int64, entity: String, key: String) {
        let row = "\(entity)/\(key)"
        if version > rowVersions[row]?.version ?? Int64.min { rowVersions[row] = (version, []) }
    }

    /// `rememberRowVersion` for each of `rows`.
    public func rememberRowVersions(_ rows: [FleetRowVersion]) {
        for row in rows { rememberRowVersion(row.version, entity: row.entity, key: row.key) }
    }

    /// The largest row version taken from the directory. Versions are microseconds since 1970
    /// (this is the year 148,000); one near `Int64.max`, validly MACed by a member gone bad, made
    /// every later version overflow, trapping each terminal that pulled it at its next writes.
    public static let largestRowVersion = Int64.max / 2

    /// A fresh version: the writer's clock in microseconds, and above any version this
    /// directory has written, or seen for the row, so a terminal's write supersedes what it
    /// pulled even if its clock is behind. (`Int64.max`, or anything past the largest version,
    /// marks a deleted row: a row made again starts afresh.)
    private func nextVersion(for row: String) -> Int64 {
        let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
        let seen = rowVersions[row]?.version ?? 0
        let afterSeen = seen < Self.largestRowVersion ? seen + 1 : 0
        let afterLast = lastVersion < Self.largestRowVersion ? lastVersion + 1 : 0
        lastVersion = max(now, afterLast, afterSeen)
        return lastVersion
    }

    /// The record pushed for `write`: with generation, version and row MAC for MACed tables.
    func authenticatedRecord(_ write: FleetWrite) throws(FleetError) -> [String: String] {
        var record = write.record
        guard let (table, row, fields) = FleetRowMAC.content(of: write) else { return record }
        guard let keyring else {
            throw FleetError(.keyUnavailable("pushing \(table) rows needs the fleet data key (useKeyring)"))
        }
        let generation: Int32
        switch write {
        case .verifier(_, let sealed), .template(_, _, _, _, _, let sealed): generation = sealed.generation
        default: generation = keyring.currentGeneration
        }
        let version = nextVersion(for: "\(table)/\(row)")
        let input = FleetRowMAC.input(table: table, row: row, generation: generation, version: version, fields: fields)
        guard let mac = keyring.rowMAC(input, generation: generation) else {
            throw FleetError(.keyUnavailable("no data key of generation \(generation) to MAC \(table) row \(row)"))
        }
        record["generation"] = String(generation)
        record["version"] = String(version)
        record["mac"] = mac.base64EncodedString()
        rowVersions["\(table)/\(row)"] = (version, Array(mac))
        return record
    }

    /// Checks a pulled change's row MAC and version; withholds the body of one that fails.
    private func verify(_ change: FleetChange) -> FleetChange {
        guard FleetRowMAC.tables.contains(change.entity) else { return change }
        let row = "\(change.entity)/\(change.key)"
        var change = change
        if change.isDeletion {
            rowVersions[row] = (Int64.max, [])
            return change
        }
        let fields = change.fields
        change.rowVersion = fields["version"].flatMap { Int64($0) }
        func reject(_ integrity: FleetChange.Integrity) -> FleetChange {
            change.integrity = integrity
            change.body = nil
            logger.warning(
                "fleet row refused", metadata: ["change": "\(change.id)", "row": "\(row)", "why": "\(integrity)"])
            return change
        }
        guard let generation = fields["generation"].flatMap({ Int32($0) }), let version = change.rowVersion,
            let mac = fields["mac"].flatMap(FleetRowMAC.bytea),
            let content = FleetRowMAC.content(ofChange: change.entity, key: change.key, fields: fields)
        else { return reject(.forged("\(row) carries no row MAC")) }
        guard (1...Self.largestRowVersion).contains(version) else {
            return reject(.forged("\(row) carries version \(version), beyond any clock"))
        }
        let input = FleetRowMAC.input(
            table: change.entity, row: change.key, generation: generation, version: version, fields: content)
        guard let keyring, let valid = keyring.isValidRowMAC(mac, for: input, generation: generation) else {
            return reject(.unverifiable("\(row) is MACed under generation \(generation), which is not held"))
        }
        guard valid else { return reject(.forged("the row MAC of \(row) does not match its contents")) }
        if let seen = rowVersions[row] {
            if seen.version == Int64.max {
                return reject(.replayed("\(row) was deleted and has reappeared at version \(version)"))
            }
            if version < seen.version || (version == seen.version && !seen.mac.isEmpty && seen.mac != mac) {
                return reject(.replayed("\(row) at version \(version) is older than version \(seen.version)"))
            }
        }
        rowVersions[row] = (version, mac)
        change.integrity = .verified
        return change
    }

    // MARK: Terminal roles
    //
    // Every call of a fleet function collects its rows: PostgreSQL reports an error raised
    // inside a function after the row description, so an uncollected query would not throw.

    /// Creates a login role for one terminal, a member of `kioskauth_terminal`: the owner's
    /// helper (it needs CREATEROLE) for tests, benchmarks and provisioning scripts; docs/fleet.md
    /// §6 has the same in SQL. Without a password the role can log in only where pg_hba.conf
    /// lets it in without one (peer on a Unix socket).
    public func createTerminalRole(_ name: String, password: String?) async throws(FleetError) {
        try await exclusive { connection, logger in
            try await connection.query("SELECT fleet_create_terminal_role(\(name), \(password))", logger: logger)
                .collect()
        }
    }

    /// Who this connection is, as the directory sees it: a terminal should log in as its own
    /// role (a member of `kioskauth_terminal`), never as the owner or a superuser, whose power
    /// it would otherwise carry (docs/fleet.md §2.1).
    public func sessionRole() async throws(FleetError) -> FleetSessionRole {
        try await exclusive { connection, logger in
            let row = try await connection.query(
                """
                SELECT session_user::text,
                       COALESCE((SELECT rolsuper FROM pg_roles WHERE rolname = session_user), false),
                       COALESCE((SELECT pg_has_role(session_user, oid, 'MEMBER') FROM pg_roles
                                 WHERE rolname = 'kioskauth_terminal'), false),
                       COALESCE((SELECT tableowner = session_user FROM pg_tables
                                 WHERE schemaname = current_schema() AND tablename = 'terminals'), false)
                """, logger: logger
            ).collect().first
            let (name, isSuperuser, isTerminal, isOwner) =
                try row?.decode((String, Bool, Bool, Bool).self) ?? ("", false, false, false)
            return FleetSessionRole(name: name, isSuperuser: isSuperuser, isTerminalRole: isTerminal, isOwner: isOwner)
        }
    }

    /// The named error for a directory's refusal: 42501 (insufficient privilege: a terminal
    /// acting for another, or touching what terminals may not) is `permissionDenied`; the
    /// schema's own KA001 is `notMember`; KA409 and unique violations are `conflict`; KA404 is
    /// `notFound`.
    static func fleetError(_ error: PSQLError) -> FleetError {
        let message = error.serverInfo?[.message] ?? String(reflecting: error)
        switch error.serverInfo?[.sqlState] {
        case "42501": return FleetError(.permissionDenied(message))
        case "KA001": return FleetError(.notMember(message))
        case "KA409", "23505": return FleetError(.conflict(message))
        case "KA404": return FleetError(.notFound(message))
        default: return FleetError(.directoryUnavailable(String(reflecting: error)))
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
            var iterator = notifications.makeAsyncIterator()
            return try await body(FleetWakeups { try await iterator.next() == nil ? nil : () })
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
        // The connection may have closed while this call waited its turn (the call before it
        // met a server that went away). A statement written to a closed connection is never
        // answered (PostgresNIO drops the write), so it would wait out its caller's deadline.
        guard !connection.isClosed else { throw FleetError(.connectionClosed) }
        FleetSendProbe.current?.markSent()
        do {
            return try await body(connection, logger)
        } catch let error as FleetError {
            throw error
        } catch let error as PSQLError {
            throw Self.fleetError(error)
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
