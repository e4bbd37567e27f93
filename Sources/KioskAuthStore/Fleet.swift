import Crypto
public import FoundationEssentials
import KioskAuthCore

/// This terminal's membership of a fleet (docs/fleet.md §9), as the store keeps it.
public struct FleetMembership: Sendable, Equatable {
    /// The directory's address (`postgres://…`), without a password.
    public var directory: String
    /// This terminal's id in the directory (a UUID, lower case).
    public var terminalID: String
    /// The name it registered with.
    public var name: String
    /// `pending` until a member admitted it and its wrapped data key arrived, then `member`.
    public var state: String
    /// The highest change id applied.
    public var cursor: Int64
    /// When it joined (or created the fleet).
    public var joinedAt: Date
    /// When a sync last completed.
    public var lastSyncAt: Date?
    /// Why the last sync failed; nil after a successful one.
    public var lastError: String?
    /// The last audit entry pushed to the directory.
    public var auditPushedThrough: Int
    /// How many pulled changes were refused (forged, replayed or unverifiable rows).
    public var rejectedChanges: Int
    /// Why the last one was refused.
    public var lastRejection: String?

    public init(
        directory: String, terminalID: String, name: String, state: String, cursor: Int64 = 0, joinedAt: Date,
        lastSyncAt: Date? = nil, lastError: String? = nil, auditPushedThrough: Int = 0, rejectedChanges: Int = 0,
        lastRejection: String? = nil
    ) {
        self.rejectedChanges = rejectedChanges
        self.lastRejection = lastRejection
        self.directory = directory
        self.terminalID = terminalID
        self.name = name
        self.state = state
        self.cursor = cursor
        self.joinedAt = joinedAt
        self.lastSyncAt = lastSyncAt
        self.lastError = lastError
        self.auditPushedThrough = auditPushedThrough
    }
}

/// One local write as the fleet queue records it. The daemon turns these into the directory's
/// writes when it pushes, sealing the verifier under the fleet data key then.
public enum FleetLocalOperation: Codable, Sendable, Equatable {
    /// A person as they now are (`state`: active, suspended or removed).
    case person(fleetID: String, name: String, roles: String, uid: Int?, state: String)
    /// A person's passcode verifier (its JSON, as the store seals it locally).
    case verifier(fleetID: String, verifier: [UInt8])
    /// Passcode failures counted here since the last push.
    case passcodeFailures(fleetID: String, count: Int)
    /// A person's failures were cleared here (a success or an admin reset).
    case passcodeReset(fleetID: String)
    /// A finger enrolled here (the template as the reader made it).
    case template(fleetID: String, finger: String, template: [UInt8])
    /// A finger removed here.
    case removeTemplate(fleetID: String, finger: String)
}

/// A `fleet create` or `fleet join` asked of the directory and not yet recorded as a membership
/// (docs/fleet.md §6.1). Written before the directory is asked, so that a retry after a lost
/// answer, or after the daemon stopped, sends the same terminal id (and, for a create, the same
/// wrapped data key) and recognises its own earlier attempt there. Beginning or ending a
/// membership forgets it.
public struct FleetPendingAttempt: Codable, Sendable, Equatable {
    public enum Operation: String, Codable, Sendable {
        case create
        case join
    }
    public var operation: Operation
    /// The directory's address, as given.
    public var directory: String
    /// The terminal id sent (a UUID, lower case).
    public var terminalID: String
    /// A join's token id (lower case).
    public var tokenID: String?
    /// A create's generation-1 data key as sent, wrapped to this terminal's public key, in the
    /// encoding `fleet_keys` keeps (`acceptFleetKeys`): only this terminal's private key opens it,
    /// and no one else can make the same bytes.
    public var wrappedKey: [UInt8]?

    public init(
        operation: Operation, directory: String, terminalID: String, tokenID: String? = nil,
        wrappedKey: [UInt8]? = nil
    ) {
        self.operation = operation
        self.directory = directory
        self.terminalID = terminalID
        self.tokenID = tokenID
        self.wrappedKey = wrappedKey
    }
}

/// A queued push: the operations of one local transaction, in order, with the key that makes
/// the directory apply it once.
public struct FleetOutboxBatch: Sendable, Equatable {
    public var id: Int64
    public var idempotencyKey: String
    public var operations: [FleetLocalOperation]
    public var attempts: Int
}

/// What the transaction in progress changed, for its fleet batch.
struct FleetPendingChanges {
    /// People whose row changed, in first-change order.
    var people: [Int64] = []
    /// People whose passcode verifier was set.
    var verifiers: Set<Int64> = []
    /// People removed, with their last directory state.
    var removed: [Int64: FleetLocalOperation] = [:]
    /// Fingers enrolled (true) or removed (false), per person.
    var templates: [Int64: [String: Bool]] = [:]
}

extension Store {
    static let fleetStates: Set<String> = ["pending", "member"]

    static func fleetOutboxBinding(key: String) -> SealBinding {
        SealBinding(table: "fleet_outbox", column: "batch", row: key, owner: "terminal")
    }

    static func fleetKeyBinding(generation: Int32) -> SealBinding {
        SealBinding(table: "fleet_keys", column: "wrapped", row: "\(generation)", owner: "terminal")
    }

    static func fleetTokenBinding(id: String) -> SealBinding {
        SealBinding(table: "fleet_join_tokens", column: "token", row: id, owner: "terminal")
    }

    // MARK: Membership

    /// Whether this terminal is in a fleet that has not removed it (pending or member), from
    /// memory: no query.
    public var isInFleet: Bool { (try? locked { isFleetMember }) ?? false }

    /// The membership, or nil when this terminal is in no fleet.
    public func fleetMembership() throws(StoreError) -> FleetMembership? {
        try locked {
            guard
                let row = try connection.query(
                    """
                    SELECT m.*, r.count AS rejected_changes, r.last_reason AS last_rejection
                    FROM fleet_membership m LEFT JOIN fleet_rejections r ON r.singleton = 1
                    """
                ).first
            else { return nil }
            return FleetMembership(
                directory: row["directory"].string ?? "", terminalID: row["terminal_id"].string ?? "",
                name: row["name"].string ?? "", state: row["state"].string ?? "",
                cursor: Int64(row["cursor"].int ?? 0),
                joinedAt: Date(timeIntervalSince1970: row["joined_at"].double ?? 0),
                lastSyncAt: row["last_sync_at"].double.map(Date.init(timeIntervalSince1970:)),
                lastError: row["last_error"].string, auditPushedThrough: row["audit_pushed_through"].int ?? 0,
                rejectedChanges: row["rejected_changes"].int ?? 0, lastRejection: row["last_rejection"].string)
        }
    }

    static let fleetPendingAttemptKey = "fleet.pending-attempt"

    /// The `fleet create` or `fleet join` asked and not yet recorded, if any.
    public func fleetPendingAttempt() throws(StoreError) -> FleetPendingAttempt? {
        try terminalValue(FleetPendingAttempt.self, forKey: Self.fleetPendingAttemptKey)
    }

    /// Records the attempt about to be asked of the directory (durably, before it is asked).
    public func setFleetPendingAttempt(_ attempt: FleetPendingAttempt) throws(StoreError) {
        try setTerminalValue(attempt, forKey: Self.fleetPendingAttemptKey)
    }

    /// Records a new membership (after `fleet create` or `fleet join`), in one transaction
    /// with what comes with it, so a crash never keeps half of it:
    ///
    /// * `firstKey`: the creator's generation 1, as wrapped to it;
    /// * `bringLocalPeople`: the creator queues every local person (active or suspended) with
    ///   their passcode verifier, in one batch, for the (empty) directory;
    /// * `joinSecret`: a joining terminal keeps its join token's secret, sealed, until its
    ///   admission has been checked with it (`acceptFleetKeys`).
    ///
    /// From here on local writes queue pushes. Refused when the terminal is already in a fleet.
    /// The pending attempt, done now, is forgotten with it.
    public func beginFleetMembership(
        _ membership: FleetMembership, firstKey: (generation: Int32, wrapped: [UInt8])? = nil,
        bringLocalPeople: Bool = false, joinSecret: [UInt8]? = nil, now: Date = Date()
    ) throws(StoreError) {
        guard Self.fleetStates.contains(membership.state) else {
            throw StoreError(.integrity("unknown fleet state \(membership.state)"))
        }
        let sealedKey = try firstKey.map { key throws(StoreError) in try sealFleetKey(key) }
        let sealedSecret = try joinSecret.map { secret throws(StoreError) in
            try seal(secret, Self.fleetJoinSecretBinding)
        }
        let wasMember = try locked { isFleetMember }
        do {
            try transaction { db in
                guard try db.query("SELECT 1 FROM fleet_membership").isEmpty else {
                    throw StoreError(.integrity("this terminal is already in a fleet"))
                }
                // Keys of an earlier membership (a sync that ran on after a leave) are not this one's.
                try db.query("DELETE FROM fleet_keys")
                try db.query(
                    "INSERT INTO fleet_membership (singleton, directory, terminal_id, name, state, cursor, joined_at) VALUES (1, ?, ?, ?, ?, ?, ?)",
                    [
                        .text(membership.directory), .text(membership.terminalID), .text(membership.name),
                        .text(membership.state), .integer(membership.cursor),
                        .real(membership.joinedAt.timeIntervalSince1970),
                    ])
                if let sealedKey { try insertFleetKey(sealedKey, now: now, in: db) }
                if let sealedSecret { try writeTerminalValue(sealedSecret, forKey: Self.fleetJoinSecretKey, in: db) }
                try deleteTerminalValues(Self.fleetPendingAttemptKey, in: db)
                isFleetMember = true
                if bringLocalPeople {
                    for row in try db.query(
                        "SELECT id FROM people WHERE origin = ? ORDER BY id", [.text(Origin.local.rawValue)])
                    {
                        noteFleetVerifierChange(Int64(row["id"].int ?? 0))
                    }
                }
            }
        } catch {
            try? locked { isFleetMember = wasMember }
            throw error
        }
    }

    static let fleetRemovedTerminalsKey = "fleet.removed-terminals"

    /// The terminals this one has seen removed in the directory's feed (ids, lower case): a
    /// rotation never wraps to them, whatever the directory says of them later.
    public func fleetRemovedTerminals() throws(StoreError) -> Set<String> {
        Set(try terminalValue([String].self, forKey: Self.fleetRemovedTerminalsKey) ?? [])
    }

    /// Adds to `fleetRemovedTerminals`.
    public func noteFleetRemovedTerminals(_ ids: some Sequence<String>) throws(StoreError) {
        let known = try fleetRemovedTerminals()
        let all = known.union(ids)
        guard all.count > known.count else { return }
        try setTerminalValue(all.sorted(), forKey: Self.fleetRemovedTerminalsKey)
    }

    static let fleetJoinSecretKey = "fleet.join-secret"
    static let fleetJoinSecretBinding = SealBinding(
        table: "terminal_state", column: "value", row: fleetJoinSecretKey, owner: "terminal")

    /// The join secret a joining terminal keeps until its admission is checked, if any.
    public func fleetJoinSecret() throws(StoreError) -> [UInt8]? {
        guard let sealed = try terminalValue([UInt8].self, forKey: Self.fleetJoinSecretKey) else { return nil }
        return try sealer.open(sealed, binding: Self.fleetJoinSecretBinding)
    }

    /// Keeps the data-key generations just authenticated (`FleetKeyAuthentication.accept`), as
    /// wrapped to this terminal and sealed under the store key (so one opens only with the store
    /// key and the terminal's own key together), in one transaction; a generation already held
    /// is never replaced. `becomeMember`: a pending terminal's first keys make it a member, and its join
    /// secret, used now, is erased.
    public func acceptFleetKeys(
        _ keys: [(generation: Int32, wrapped: [UInt8])], becomeMember: Bool, now: Date
    ) throws(StoreError) {
        var sealed: [(generation: Int32, sealed: [UInt8])] = []
        for key in keys { sealed.append(try sealFleetKey(key)) }
        try transaction { db in
            // Only for a membership still there (a leave may have ended it meanwhile).
            guard try !db.query("SELECT 1 FROM fleet_membership WHERE state <> 'removed'").isEmpty else { return }
            for key in sealed { try insertFleetKey(key, now: now, in: db) }
            if becomeMember {
                try db.query("UPDATE fleet_membership SET state = 'member' WHERE state = 'pending'")
                try deleteTerminalValues(Self.fleetJoinSecretKey, in: db)
            }
        }
    }

    /// A generation as wrapped to this terminal, sealed under the store key: it opens only with
    /// the store key and the terminal's own key together.
    private func sealFleetKey(
        _ key: (generation: Int32, wrapped: [UInt8])
    ) throws(StoreError) -> (generation: Int32, sealed: [UInt8]) {
        (key.generation, try seal(key.wrapped, Self.fleetKeyBinding(generation: key.generation)))
    }

    /// Keeps a sealed generation; one already held is never replaced.
    private func insertFleetKey(
        _ key: (generation: Int32, sealed: [UInt8]), now: Date, in db: SQLiteConnection
    ) throws {
        try db.query(
            "INSERT INTO fleet_keys (generation, sealed, received_at) VALUES (?, ?, ?) ON CONFLICT (generation) DO NOTHING",
            [.integer(Int64(key.generation)), .blob(key.sealed), .real(now.timeIntervalSince1970)])
    }

    /// Changes the membership's state, cursor and sync record.
    public func updateFleetMembership(
        state: String? = nil, cursor: Int64? = nil, syncedAt: Date? = nil, error: String?? = nil,
        auditPushedThrough: Int? = nil
    ) throws(StoreError) {
        if let state, !Self.fleetStates.contains(state) {
            throw StoreError(.integrity("unknown fleet state \(state)"))
        }
        try transaction { db in
            if let state { try db.query("UPDATE fleet_membership SET state = ?", [.text(state)]) }
            if let cursor { try db.query("UPDATE fleet_membership SET cursor = MAX(cursor, ?)", [.integer(cursor)]) }
            if let syncedAt {
                try db.query(
                    "UPDATE fleet_membership SET last_sync_at = ?", [.real(syncedAt.timeIntervalSince1970)])
            }
            if let error {
                try db.query(
                    "UPDATE fleet_membership SET last_error = ?", [error.map { .text(String($0.prefix(500))) } ?? .null]
                )
            }
            if let auditPushedThrough {
                try db.query(
                    "UPDATE fleet_membership SET audit_pushed_through = MAX(audit_pushed_through, ?)",
                    [.integer(Int64(auditPushedThrough))])
            }
        }
    }

    /// Ends the membership: forgets the directory, the keys, the tokens, the mapping of people
    /// and the queue. Local people and their secrets stay.
    public func endFleetMembership() throws(StoreError) {
        try transaction { db in
            for table in [
                "fleet_outbox", "fleet_templates", "fleet_people", "fleet_join_tokens", "fleet_keys",
                "fleet_row_versions", "fleet_rejections",
                "fleet_membership",
            ] {
                try db.query("DELETE FROM \(table)")
            }
            try deleteTerminalValues(
                Self.fleetPendingAttemptKey, Self.fleetJoinSecretKey, Self.fleetRemovedTerminalsKey, in: db)
            isFleetMember = false
        }
        try checkpointTruncating()
    }

    /// Records that the directory removed this terminal (another member's `fleet remove`, or
    /// its role's terminal row marked removed): forgets the data keys it held, the tokens it
    /// issued and the queue (the directory takes nothing more from it), and keeps the membership
    /// row in state `removed`, so `fleet status` says what happened until `fleet leave` forgets
    /// it. Local people and their secrets stay; writes no longer queue pushes.
    public func markFleetRemoved(reason: String) throws(StoreError) {
        try transaction { db in
            for table in ["fleet_outbox", "fleet_join_tokens", "fleet_keys"] {
                try db.query("DELETE FROM \(table)")
            }
            try deleteTerminalValues(Self.fleetJoinSecretKey, in: db)
            try db.query(
                "UPDATE fleet_membership SET state = 'removed', last_error = ?", [.text(String(reason.prefix(500)))])
            isFleetMember = false
        }
        try checkpointTruncating()
    }

    // MARK: Row versions and refusals

    /// Records the version of a directory row this terminal trusted (`Int64.max`: the row was
    /// deleted). Only ever raised: an older version never replaces a newer one.
    public func setFleetRowVersion(_ version: Int64, entity: String, key: String) throws(StoreError) {
        try transaction { db in
            try db.query(
                """
                INSERT INTO fleet_row_versions (entity, row_key, version) VALUES (?, ?, ?)
                ON CONFLICT (entity, row_key) DO UPDATE SET version = MAX(version, excluded.version)
                """, [.text(entity), .text(key), .integer(version)])
        }
    }

    /// The row versions recorded, for the directory connection after a restart.
    public func fleetRowVersions() throws(StoreError) -> [(entity: String, key: String, version: Int64)] {
        try locked {
            try connection.query("SELECT entity, row_key, version FROM fleet_row_versions").map { row in
                (row["entity"].string ?? "", row["row_key"].string ?? "", Int64(row["version"].int ?? 0))
            }
        }
    }

    /// Counts a pulled change that was refused, and keeps why.
    public func recordFleetRejection(_ reason: String) throws(StoreError) {
        try transaction { db in
            try db.query(
                """
                INSERT INTO fleet_rejections (singleton, count, last_reason) VALUES (1, 1, ?)
                ON CONFLICT (singleton) DO UPDATE SET count = count + 1, last_reason = excluded.last_reason
                """, [.text(String(reason.prefix(500)))])
        }
    }

    // MARK: Keys and tokens

    /// The data-key generations held, oldest first, as wrapped.
    public func fleetKeys() throws(StoreError) -> [(generation: Int32, wrapped: [UInt8])] {
        let rows = try locked { try connection.query("SELECT generation, sealed FROM fleet_keys ORDER BY generation") }
        var keys: [(generation: Int32, wrapped: [UInt8])] = []
        for row in rows {
            let generation = Int32(row["generation"].int ?? 0)
            guard let sealed = row["sealed"].bytes else {
                throw StoreError(.integrity("fleet key \(generation) is not a blob"))
            }
            keys.append((generation, try sealer.open(sealed, binding: Self.fleetKeyBinding(generation: generation))))
        }
        return keys
    }

    /// Keeps a join token this terminal issued (its full text), sealed, until it admits the
    /// terminal that uses it.
    public func addFleetJoinToken(id: String, token: [UInt8], expiresAt: Date, now: Date) throws(StoreError) {
        let sealed = try seal(token, Self.fleetTokenBinding(id: id))
        try transaction { db in
            try db.query(
                "INSERT INTO fleet_join_tokens (token_id, sealed, issued_at, expires_at) VALUES (?, ?, ?, ?)",
                [.text(id), .blob(sealed), .real(now.timeIntervalSince1970), .real(expiresAt.timeIntervalSince1970)])
        }
    }

    /// A join token this terminal issued and has not used to admit anybody yet.
    public func fleetJoinToken(id: String) throws(StoreError) -> [UInt8]? {
        let sealed = try locked {
            try connection.query(
                "SELECT sealed FROM fleet_join_tokens WHERE token_id = ? AND admitted_at IS NULL", [.text(id)]
            ).first?["sealed"].bytes
        }
        guard let sealed else { return nil }
        return try sealer.open(sealed, binding: Self.fleetTokenBinding(id: id))
    }

    /// Marks a token used up by the admission of `terminal`, and erases its secret.
    public func markFleetJoinTokenUsed(id: String, terminal: String, now: Date) throws(StoreError) {
        try transaction { db in
            try db.query(
                "UPDATE fleet_join_tokens SET admitted_at = ?, admitted_terminal = ?, sealed = X'' WHERE token_id = ?",
                [.real(now.timeIntervalSince1970), .text(terminal), .text(id)])
        }
    }

    private func seal(_ plaintext: [UInt8], _ binding: SealBinding) throws(StoreError) -> [UInt8] {
        do { return try sealer.seal(plaintext, binding: binding) } catch {
            throw StoreError(.integrity("sealing failed: \(error)"))
        }
    }

    // MARK: People

    /// The directory id of a local person, if they are in the fleet.
    public func fleetID(of person: StoredPerson) throws(StoreError) -> String? {
        try locked {
            try connection.query("SELECT fleet_id FROM fleet_people WHERE person_id = ?", [.integer(person.id)])
                .first?["fleet_id"].string
        }
    }

    /// The local person with this directory id, if any.
    public func person(fleetID: String) throws(StoreError) -> StoredPerson? {
        try locked {
            try connection.query(
                "SELECT \(Self.personColumns) FROM people WHERE id = (SELECT person_id FROM fleet_people WHERE fleet_id = ?)",
                [.text(fleetID)]
            ).first.map(decodePerson)
        }
    }

    /// Links a local person to a directory person (when a pulled person arrives).
    public func linkFleetPerson(_ person: StoredPerson, fleetID: String) throws(StoreError) {
        try transaction { db in
            try db.query(
                "INSERT INTO fleet_people (person_id, fleet_id) VALUES (?, ?) ON CONFLICT (person_id) DO UPDATE SET fleet_id = excluded.fleet_id",
                [.integer(person.id), .text(fleetID)])
        }
    }

    /// The passcode failures counted here and not yet acknowledged by the directory.
    public func unpushedFleetFailures(of person: StoredPerson) throws(StoreError) -> Int {
        try locked {
            try connection.query(
                "SELECT unpushed_failures FROM fleet_people WHERE person_id = ?", [.integer(person.id)]
            ).first?["unpushed_failures"].int ?? 0
        }
    }

    /// Records the fleet-wide failure sum last pulled for a person.
    public func setFleetFailureSum(_ sum: Int, of person: StoredPerson) throws(StoreError) {
        try transaction { db in
            try db.query(
                "UPDATE fleet_people SET fleet_failures = ? WHERE person_id = ?",
                [.integer(Int64(sum)), .integer(person.id)])
        }
    }

    /// Runs `body` as one transaction whose writes came from the directory: they are applied
    /// locally but not queued to be pushed back.
    public func applyingFleetChanges<T>(
        now: Date, _ body: (StoreTransaction) throws(StoreError) -> T
    ) throws(StoreError)
        -> T
    {
        try locked {
            let before = isApplyingFleetChanges
            isApplyingFleetChanges = true
            defer { isApplyingFleetChanges = before }
            return try transaction(now: now, body)
        }
    }

    /// Runs `body` (store calls and transactions, on this thread) as writes that came from the
    /// directory: applied locally but not queued to be pushed back.
    public func applyingFleetChanges<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try locked {
            let before = isApplyingFleetChanges
            isApplyingFleetChanges = true
            defer { isApplyingFleetChanges = before }
            return try body()
        }
    }

    // MARK: The queue

    /// The queued pushes, oldest first.
    public func fleetOutbox(limit: Int) throws(StoreError) -> [FleetOutboxBatch] {
        let rows = try locked {
            try connection.query(
                "SELECT id, idempotency_key, sealed, attempts FROM fleet_outbox ORDER BY id LIMIT ?",
                [.integer(Int64(limit))])
        }
        var batches: [FleetOutboxBatch] = []
        for row in rows {
            batches.append(
                FleetOutboxBatch(
                    id: Int64(row["id"].int ?? 0), idempotencyKey: row["idempotency_key"].string ?? "",
                    operations: try queuedOperations(row), attempts: row["attempts"].int ?? 0))
        }
        return batches
    }

    /// The operations of a `fleet_outbox` row (its `idempotency_key` and `sealed` columns).
    private func queuedOperations(_ row: SQLRow) throws(StoreError) -> [FleetLocalOperation] {
        let key = row["idempotency_key"].string ?? ""
        guard let sealed = row["sealed"].bytes else {
            throw StoreError(.integrity("fleet_outbox row \(key) is not a blob"))
        }
        let plaintext = try sealer.open(sealed, binding: Self.fleetOutboxBinding(key: key))
        do { return try JSONDecoder().decode([FleetLocalOperation].self, from: Data(plaintext)) } catch {
            throw StoreError(.integrity("fleet_outbox row \(key) does not decode"))
        }
    }

    /// Number of queued pushes.
    public func fleetOutboxCount() throws(StoreError) -> Int {
        try locked { try connection.query("SELECT COUNT(*) AS n FROM fleet_outbox").first?["n"].int ?? 0 }
    }

    /// Removes a batch the directory acknowledged (applied now or before), and takes its
    /// failures off the people's unpushed counts. Batches are acknowledged oldest first, so
    /// failures followed by a reset still queued were already taken off when that reset was
    /// queued: only failures counted since the person's last reset are unpushed.
    public func acknowledgeFleetBatch(_ batch: FleetOutboxBatch) throws(StoreError) {
        try transaction { db in
            for case .passcodeFailures(let fleetID, let count) in batch.operations {
                let resetLater = try db.query(
                    "SELECT 1 FROM fleet_queued_resets WHERE fleet_id IN (?, '*') AND batch_id > ? LIMIT 1",
                    [.text(fleetID), .integer(batch.id)])
                guard resetLater.isEmpty else { continue }
                try db.query(
                    "UPDATE fleet_people SET unpushed_failures = MAX(0, unpushed_failures - ?) WHERE fleet_id = ?",
                    [.integer(Int64(count)), .text(fleetID)])
            }
            try db.query("DELETE FROM fleet_outbox WHERE id = ?", [.integer(batch.id)])
        }
    }

    /// Whether a fleet-wide sum pulled now for the person `fleetID` is set aside: a reset of
    /// their passcode failures waits in the queue, queued less than `window` seconds ago by this
    /// machine's clock. Until the directory has it, the sum it sends counts failures the reset
    /// forgave. A reset seen past its window (or dated in the future) is marked expired for
    /// good, so a clock set back does not reopen it; one that sets a sum aside is marked so,
    /// and its end is counted again (`endedFleetResetWindows`).
    public func setsAsideFleetSum(fleetID: String, window: TimeInterval) throws(StoreError) -> Bool {
        let open = ResetWindow(window)
        return try transaction { db in
            try expireResets(fleetID: fleetID, outside: open, in: db)
            try db.query(
                "UPDATE fleet_queued_resets SET set_aside = 1 WHERE fleet_id = ? AND expired = 0",
                [.text(fleetID)])
            return db.changes > 0
        }
    }

    /// The people whose reset window is over after a pulled sum was set aside, with the sum
    /// last pulled (`fleet_people.fleet_failures`): their count must take it in again, now, and
    /// not wait for the directory's next change of their row, which a stuck queue may never
    /// bring. Their resets stay as they are until `expireFleetResets(of:window:)`, called once
    /// the count is saved, so a crash or an error in between leaves them to be named again.
    /// Resets past their window that set nothing aside are marked expired here; a set-aside
    /// whose reset is over while a newer one is still in its window goes on with the newer one.
    public func endedFleetResetWindows(window: TimeInterval) throws(StoreError) -> [(StoredPerson, Int)] {
        // Before every passcode check: no write transaction when no reset is waiting (always,
        // outside a fleet).
        let waiting = try locked {
            try !connection.query("SELECT 1 FROM fleet_queued_resets WHERE expired = 0 LIMIT 1").isEmpty
        }
        guard waiting else { return [] }
        let open = ResetWindow(window)
        let ended: [(id: Int64, sum: Int)] = try transaction { db in
            try db.query(
                "UPDATE fleet_queued_resets SET expired = 1 WHERE expired = 0 AND set_aside = 0 AND \(open.outside)",
                open.bounds)
            var ended: [(id: Int64, sum: Int)] = []
            for row in try db.query(
                "SELECT DISTINCT fleet_id FROM fleet_queued_resets WHERE expired = 0 AND set_aside = 1 AND \(open.outside)",
                open.bounds)
            {
                guard let fleetID = row["fleet_id"].string else { continue }
                try db.query(
                    "UPDATE fleet_queued_resets SET set_aside = 1 WHERE fleet_id = ? AND expired = 0 AND \(open.inside)",
                    [.text(fleetID)] + open.bounds)
                if db.changes > 0 {
                    try expireResets(fleetID: fleetID, outside: open, in: db)
                } else if let mapping = try db.query(
                    "SELECT person_id, fleet_failures FROM fleet_people WHERE fleet_id = ?", [.text(fleetID)]
                ).first, let id = mapping["person_id"].int {
                    ended.append((Int64(id), mapping["fleet_failures"].int ?? 0))
                }
            }
            return ended
        }
        var people: [(StoredPerson, Int)] = []
        for (id, sum) in ended.sorted(by: { $0.id < $1.id }) {
            if let person = try person(id: id) { people.append((person, sum)) }
        }
        return people
    }

    /// Marks this person's queued resets past their window expired for good (a wall clock set
    /// back does not reopen them): their count took the sum last pulled in again.
    public func expireFleetResets(of person: StoredPerson, window: TimeInterval) throws(StoreError) {
        try transaction { db in
            guard
                let fleetID = try db.query(
                    "SELECT fleet_id FROM fleet_people WHERE person_id = ?", [.integer(person.id)]
                ).first?["fleet_id"].string
            else { return }
            try expireResets(fleetID: fleetID, outside: ResetWindow(window), in: db)
        }
    }

    /// The window of a queued reset, as of now by this machine's clock: queued less than
    /// `seconds` ago, and not in the future (by more than a second).
    private struct ResetWindow {
        let bounds: [SQLValue]
        /// SQL over `queued_at`, taking `bounds` as its parameters.
        let inside = "(queued_at > ? AND queued_at <= ?)"
        var outside: String { "NOT \(inside)" }

        init(_ seconds: TimeInterval) {
            let now = Date().timeIntervalSince1970
            bounds = [.real(now - seconds), .real(now + 1)]
        }
    }

    private func expireResets(fleetID: String, outside open: ResetWindow, in db: SQLiteConnection) throws {
        try db.query(
            "UPDATE fleet_queued_resets SET expired = 1 WHERE fleet_id = ? AND expired = 0 AND \(open.outside)",
            [.text(fleetID)] + open.bounds)
    }

    /// Fills `fleet_queued_resets` from the queue, at the upgrade to schema 8. A queued batch
    /// that does not open is recorded as a reset of anyone (`fleet_id` '*', already expired), so
    /// acknowledging failures queued before it takes nothing off; the sync reports the batch
    /// when it reaches it.
    func recordQueuedResets() throws {
        for row in try connection.query("SELECT id, idempotency_key, sealed, created_at FROM fleet_outbox ORDER BY id")
        {
            guard let id = row["id"].int else { continue }
            guard let operations = try? queuedOperations(row) else {
                logger.warning(
                    "a queued fleet batch does not open: it is taken as a reset of everyone's unpushed failures",
                    metadata: ["key": "\(row["idempotency_key"].string ?? "")"])
                try connection.query(
                    "INSERT OR IGNORE INTO fleet_queued_resets (batch_id, fleet_id, queued_at, expired) VALUES (?, '*', 0, 1)",
                    [.integer(Int64(id))])
                continue
            }
            try recordQueuedResets(
                of: operations, batch: Int64(id), queuedAt: row["created_at"].double ?? 0, in: connection)
        }
    }

    private func recordQueuedResets(
        of operations: [FleetLocalOperation], batch: Int64, queuedAt: Double, in db: SQLiteConnection
    ) throws {
        for case .passcodeReset(let fleetID) in operations {
            try db.query(
                "INSERT OR IGNORE INTO fleet_queued_resets (batch_id, fleet_id, queued_at) VALUES (?, ?, ?)",
                [.integer(batch), .text(fleetID), .real(queuedAt)])
        }
    }

    /// Records a failed push of a batch; it stays first in the queue.
    public func fleetBatchFailed(_ batch: FleetOutboxBatch, error: String) throws(StoreError) {
        try transaction { db in
            try db.query(
                "UPDATE fleet_outbox SET attempts = attempts + 1, last_error = ? WHERE id = ?",
                [.text(String(error.prefix(500))), .integer(batch.id)])
        }
    }

    // MARK: Queueing inside the writing transaction

    /// Called whenever a person's row is written (with its MAC): remembered for the batch.
    func noteFleetPersonChange(_ id: Int64) {
        guard isFleetMember, !fleetPending.people.contains(id) else { return }
        fleetPending.people.append(id)
    }

    /// Called when a person's passcode verifier is set.
    func noteFleetVerifierChange(_ id: Int64) {
        guard isFleetMember else { return }
        fleetPending.verifiers.insert(id)
        noteFleetPersonChange(id)
    }

    /// Called when a finger is enrolled or removed.
    func noteFleetTemplateChange(_ id: Int64, finger: String, added: Bool) {
        guard isFleetMember else { return }
        fleetPending.templates[id, default: [:]][finger] = added
        noteFleetPersonChange(id)
    }

    /// Links a directory template to a local finger (when a pulled template is applied).
    public func linkFleetTemplate(_ templateID: String, person: StoredPerson, finger: String) throws(StoreError) {
        try transaction { db in
            try db.query(
                "INSERT OR REPLACE INTO fleet_templates (template_id, person_id, finger) VALUES (?, ?, ?)",
                [.text(templateID), .integer(person.id), .text(finger)])
        }
    }

    /// The local person and finger a directory template was applied as.
    public func fleetTemplate(_ templateID: String) throws(StoreError) -> (person: StoredPerson, finger: String)? {
        try locked {
            guard
                let row = try connection.query(
                    "SELECT p.name AS template_person, t.finger FROM fleet_templates t JOIN people p ON p.id = t.person_id WHERE t.template_id = ?",
                    [.text(templateID)]
                ).first, let finger = row["finger"].string, let name = row["template_person"].string,
                let person = try connection.query(
                    "SELECT \(Self.personColumns) FROM people WHERE name = ?", [.text(name)]
                ).first.map(decodePerson)
            else { return nil }
            return (person, finger)
        }
    }

    /// Called before a person's row is deleted: the directory learns they are removed.
    func noteFleetRemoval(of id: Int64, in db: SQLiteConnection) throws {
        guard isFleetMember, !isApplyingFleetChanges,
            let row = try db.query(
                "SELECT p.name, p.roles, p.uid, f.fleet_id FROM people p JOIN fleet_people f ON f.person_id = p.id WHERE p.id = ?",
                [.integer(id)]
            ).first, let fleetID = row["fleet_id"].string
        else { return }
        fleetPending.removed[id] = .person(
            fleetID: fleetID, name: row["name"].string ?? "", roles: row["roles"].string ?? "", uid: row["uid"].int,
            state: "removed")
        noteFleetPersonChange(id)
    }

    /// Writes the transaction's fleet batch, inside it, just before it commits: the people it
    /// changed as they now are, verifiers set, and passcode failures counted or cleared. Nothing
    /// when this terminal is in no fleet, or when the changes came from the directory (then
    /// only the bookkeeping follows them).
    @discardableResult
    func flushFleetChanges(in db: SQLiteConnection) throws -> Bool {
        guard isFleetMember, !fleetPending.people.isEmpty else { return false }
        var operations: [FleetLocalOperation] = []
        for id in fleetPending.people {
            guard
                let row = try db.query(
                    "SELECT name, roles, origin, state, uid, passcode_failures FROM people WHERE id = ?",
                    [.integer(id)]
                ).first
            else {
                if let removal = fleetPending.removed[id] { operations.append(removal) }
                continue
            }
            guard row["origin"].string == Origin.local.rawValue else { continue }
            let name = row["name"].string ?? ""
            let state = row["state"].string ?? ""
            // Attempts whose passcode check has not ended are counted here but not reported:
            // a right passcode must not reach the directory as a failure (schema 9).
            let unfinished = try unfinishedPasscodeAttempts(id, in: db)
            let failures = max(0, (row["passcode_failures"].int ?? 0) - unfinished)
            var mapping = try db.query(
                "SELECT fleet_id, pushed_digest, reported_failures FROM fleet_people WHERE person_id = ?",
                [.integer(id)]
            ).first
            if mapping == nil {
                // People waiting for activation stay local until they are active.
                if state == PersonState.pendingActivation.rawValue || isApplyingFleetChanges { continue }
                try db.query(
                    "INSERT INTO fleet_people (person_id, fleet_id) VALUES (?, ?)",
                    [.integer(id), .text(UUID().uuidString.lowercased())])
                mapping = try db.query(
                    "SELECT fleet_id, pushed_digest, reported_failures FROM fleet_people WHERE person_id = ?",
                    [.integer(id)]
                ).first
            }
            guard let mapping, let fleetID = mapping["fleet_id"].string else { continue }
            let fleetState = state == PersonState.active.rawValue ? "active" : "suspended"
            let roles = row["roles"].string ?? ""
            let uid = row["uid"].int
            let digest = "\(name)\n\(roles)\n\(uid.map(String.init) ?? "-")\n\(fleetState)"
            let reported = mapping["reported_failures"].int ?? 0
            if isApplyingFleetChanges {
                try db.query(
                    "UPDATE fleet_people SET pushed_digest = ?, reported_failures = ? WHERE person_id = ?",
                    [.text(digest), .integer(Int64(failures)), .integer(id)])
                continue
            }
            if mapping["pushed_digest"].string != digest {
                operations.append(.person(fleetID: fleetID, name: name, roles: roles, uid: uid, state: fleetState))
            }
            if fleetPending.verifiers.contains(id),
                let sealed = try db.query(
                    "SELECT sealed FROM secrets WHERE person_id = ? AND kind = 'passcode'", [.integer(id)]
                ).first?["sealed"].bytes
            {
                let verifier = try sealer.open(
                    sealed, binding: Self.secretBinding(personID: id, name: try LoginName(name), kind: "passcode"))
                operations.append(.verifier(fleetID: fleetID, verifier: verifier))
            }
            for (finger, added) in (fleetPending.templates[id] ?? [:]).sorted(by: { $0.key < $1.key }) {
                if added {
                    guard
                        let sealed = try db.query(
                            "SELECT template FROM fingers WHERE person_id = ? AND finger = ?",
                            [.integer(id), .text(finger)]
                        ).first?["template"].bytes
                    else { continue }
                    let template = try sealer.open(
                        sealed, binding: Self.fingerBinding(personID: id, name: try LoginName(name), finger: finger))
                    operations.append(.template(fleetID: fleetID, finger: finger, template: template))
                } else {
                    operations.append(.removeTemplate(fleetID: fleetID, finger: finger))
                }
            }
            var unpushed = "unpushed_failures"
            if failures > reported {
                operations.append(.passcodeFailures(fleetID: fleetID, count: failures - reported))
                unpushed = "unpushed_failures + \(failures - reported)"
            } else if failures == 0, reported > 0 {
                operations.append(.passcodeReset(fleetID: fleetID))
                unpushed = "0"
            }
            try db.query(
                "UPDATE fleet_people SET pushed_digest = ?, reported_failures = ?, unpushed_failures = \(unpushed) WHERE person_id = ?",
                [.text(digest), .integer(Int64(failures)), .integer(id)])
        }
        guard !operations.isEmpty else { return false }
        let key = UUID().uuidString.lowercased()
        let plaintext: Data
        do { plaintext = try JSONEncoder().encode(operations) } catch {
            throw StoreError(.integrity("the fleet batch does not encode: \(error)"))
        }
        let sealed = try sealer.seal(Array(plaintext), binding: Self.fleetOutboxBinding(key: key))
        let queuedAt = Date().timeIntervalSince1970
        try db.query(
            "INSERT INTO fleet_outbox (idempotency_key, sealed, created_at) VALUES (?, ?, ?)",
            [.text(key), .blob(sealed), .real(queuedAt)])
        try recordQueuedResets(of: operations, batch: db.lastInsertRowID, queuedAt: queuedAt, in: db)
        return true
    }
}

extension StoreError {
    /// A change pulled from the fleet directory that cannot be applied here.
    public static func fleetChange(_ reason: String) -> StoreError {
        StoreError(.integrity("fleet: \(reason)"))
    }
}
