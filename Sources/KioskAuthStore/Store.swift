import CSQLite3
import Crypto
public import FoundationEssentials
public import KioskAuthCore
public import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// A person as stored, without secrets.
public struct StoredPerson: Sendable, Equatable {
    /// Stable row id; never reused, so old ciphertexts can never be bound to a new person.
    public var id: Int64
    public var name: LoginName
    public var displayName: String
    public var roles: RoleSet
    public var origin: Origin
    public var state: PersonState
    /// The Unix uid bound to this person.
    public var uid: Int?
    /// The name of the Unix account that had `uid` when the binding was made: "" when the uid
    /// had no account then, nil for a binding made before the store recorded it (schema < 5)
    /// or no binding. A uid that later belongs to another account is not this person's.
    public var boundAccount: String?
    public var createdAt: Date
    public var lastUnlockAt: Date?
    /// Persisted failure counters.
    public var failures: CredentialFailureState
    public var hasPasscode: Bool
    /// Enrolled fingers by name.
    public var fingers: [String]
}

/// The sealed SQLite store: people, sealed secrets, failure counters, the audit chain.
///
/// WAL with `synchronous=FULL`, so a commit (failure counters included) is durable before the
/// call returns; the one exception is a successful authentication's record (`durable: false`),
/// whose loss in a power cut is harmless (see `recordAuthentication`) and which is synced in the
/// background within moments. `secure_delete` and a truncating checkpoint when erasing. One
/// connection, serialised by a lock; calls are short.
public final class Store: @unchecked Sendable {
    /// The schema version this code writes.
    public static let schemaVersion = 9
    /// File name of the database in the state directory.
    public static let databaseFileName = "kioskauth.sqlite"

    let connection: SQLiteConnection
    /// Recursive, so that the store's own operations called inside `transaction(now:_:)` on the
    /// same thread join the transaction instead of deadlocking.
    private let lock = Lock(recursive: true)
    let sealer: Sealer
    let auditKey: SymmetricKey
    let activationKey: SymmetricKey
    /// Key of the MACs that bind each row's security-relevant columns to it.
    let rowKey: SymmetricKey
    let logger: Logger
    private let walSync: WALSync
    /// The durable copy of the audit head beside the database (see `AuditAnchor`).
    let anchor: AuditAnchor
    /// The head appended by the transaction in progress, recorded in the anchor once it commits.
    /// Guarded by the store's lock.
    var pendingHead: AuditHeadMark?
    /// Whether an admin accepted starting from a store behind (or without) its anchor.
    let acceptRollback: Bool
    /// The schema version the file had when opened (0: a new store).
    private(set) var openedAtVersion = 0
    /// What was lost, when a rollback was found and accepted at opening (audited as
    /// `store.rollback.accepted`).
    public private(set) var acceptedRollback: String?
    /// How deep in `transaction` the thread holding the lock is; nested transactions are
    /// savepoints of the outermost one. Guarded by the store's lock.
    private var transactionDepth = 0
    /// Whether this store belongs to a fleet (a `fleet_membership` row): only then do writes
    /// queue pushes. Guarded by the store's lock.
    var isFleetMember = false
    /// Set while changes pulled from the directory are applied, so they are not pushed back.
    /// Guarded by the store's lock.
    var isApplyingFleetChanges = false
    /// The people changed by the transaction in progress, pushed as one batch when it commits.
    /// Guarded by the store's lock.
    var fleetPending = FleetPendingChanges()
    /// Called (under the store's lock, so it must only signal) after a transaction that queued a
    /// fleet batch committed: the daemon wakes its sync service with it. Set once, before use.
    public nonisolated(unsafe) var fleetBatchQueued: (@Sendable () -> Void)?
    /// `statusFigures()` as last read, and the connection's change count then.
    private var statusCache: (changes: Int64, dataVersion: Int, figures: StoreStatusFigures)?
    /// A truncating checkpoint asked for inside a transaction, run once the outermost commits.
    /// Guarded by the store's lock.
    private var checkpointAfterCommit = false
    #if DEBUG
        /// Test-only (debug builds): audit appends of these actions fail, as if the process had
        /// died between an action and its audit entry. Guarded by the store's lock.
        public var failingAuditActions: Set<String> {
            get { lock.withLock { _failingAuditActions } }
            set { lock.withLock { _failingAuditActions = newValue } }
        }
        var _failingAuditActions: Set<String> = []
    #endif

    /// Opens (creating if needed) the store at `path` with `key`. Refuses a store from a newer
    /// schema and a key that does not open it, without writing anything.
    ///
    /// A database that is missing, empty or behind its audit head anchor (see `startAnchor`) is
    /// refused with `StoreError.Code.rollback` unless `acceptRollback`; then it opens, a fresh
    /// anchor is written and `store.rollback.accepted` is audited with what was lost.
    public init(
        path: String, key: StoreKey, logger: Logger, now: Date = Date(), acceptRollback: Bool = false
    ) throws(StoreError) {
        self.logger = logger
        self.acceptRollback = acceptRollback
        self.sealer = Sealer(storeKey: key)
        self.auditKey = key.derived(for: "audit")
        self.activationKey = key.derived(for: "activation-code")
        self.rowKey = key.derived(for: "row-mac")
        self.walSync = WALSync(databasePath: path)
        self.anchor = AuditAnchor(
            directory: directoryName(of: path), key: key.derived(for: "audit-head"))
        let directory = directoryName(of: path)
        let size = fileSize(atPath: path)
        if size == nil || size == 0, anchor.exists {
            let problem = "\(path) is \(size == nil ? "missing" : "empty") but \(anchor.describeForRollback())"
            guard acceptRollback else { throw StoreError(.rollback(problem)) }
            acceptedRollback = problem
        }
        if access(directory, W_OK) != 0 || (size != nil && access(path, W_OK) != 0) {
            throw StoreError(.readOnly(access(directory, W_OK) != 0 ? "the state directory \(directory)" : path))
        }
        do {
            connection = try SQLiteConnection(path: path)
        } catch {
            if error.code & 0xff == 14 || error.code & 0xff == 8 {
                throw StoreError(.readOnly("\(path) or its directory"))
            }
            throw StoreError(.database(error))
        }
        do {
            try openSchema(now: now)
        } catch {
            connection.close()
            throw error
        }
        anchor.storeID = storeID
        walSync.anchor = anchor
        isFleetMember =
            (try? connection.query("SELECT 1 FROM fleet_membership WHERE state <> 'removed'").isEmpty == false)
            ?? false
        do {
            try startAnchor()
            if let lost = acceptedRollback {
                logger.critical("store rollback accepted", metadata: ["lost": "\(lost)"])
                try appendAudit(
                    AuditRecord(action: "store.rollback.accepted", result: "success", detail: lost), now: now)
            }
        } catch {
            connection.close()
            throw error
        }
    }

    /// Creates the anchor for a new store, or for one from before anchors existed (recorded in
    /// `meta`, so a store that had one never silently gets a fresh one: a missing anchor is then
    /// a finding of `verifyAudit`).
    ///
    /// The anchor is also the durable record that this store exists and how far it has got: a
    /// store that has (or, at schema 4, must have) an anchor is refused when the anchor is
    /// missing or does not check out, when the chain ends before the anchored entry, or when
    /// that entry has another MAC (rolled back, replaced, or acknowledged writes lost with a
    /// WAL). The chain may end after the anchored entry: commits that skip the `fsync` wait are
    /// anchored only once the background sync made them durable.
    private func startAnchor() throws(StoreError) {
        try locked {
            let recorded = try !connection.query("SELECT value FROM meta WHERE key = 'audit_anchor'").isEmpty
            // Every store at schema 4 wrote its anchor when it got there, so deleting the meta
            // row as well as the file does not make it look like a store from before anchors.
            let required = recorded || openedAtVersion >= 4
            let row = try connection.query("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1").first
            let head = AuditHeadMark(sequence: row?["seq"].int ?? 0, mac: row?["mac"].bytes ?? [])
            var problem: String?
            if required || anchor.exists {
                switch anchor.read() {
                case .missing:
                    problem =
                        "the audit head anchor \(anchor.path) is missing (the chain ends at entry \(head.sequence))"
                case .invalid:
                    problem =
                        "the audit head anchor \(anchor.path) does not check out for this store (edited, or another store's: \(anchor.describeForRollback()))"
                case .head(let anchored):
                    if anchored.sequence > head.sequence {
                        problem =
                            "the store is behind its audit head anchor \(anchor.path): the anchor records entry \(anchored.sequence), the chain ends at entry \(head.sequence)"
                    } else if anchored.sequence > 0,
                        try connection.query(
                            "SELECT mac FROM audit WHERE seq = ?", [.integer(Int64(anchored.sequence))]
                        ).first?["mac"].bytes != anchored.mac
                    {
                        problem =
                            "audit entry \(anchored.sequence) is not the one the anchor \(anchor.path) records (rolled back or replaced)"
                    }
                }
            } else {
                // A new store, or one from before anchors.
                problem = nil
            }
            if let problem {
                guard acceptRollback else { throw StoreError(.rollback(problem)) }
                acceptedRollback = acceptedRollback ?? problem
                guard anchor.reset(to: head) else {
                    throw StoreError(.integrity("cannot write the audit head anchor \(anchor.path)"))
                }
            } else if required || anchor.exists {
                anchor.load()
            } else {
                guard anchor.write(head) else {
                    throw StoreError(.integrity("cannot write the audit head anchor \(anchor.path)"))
                }
            }
            if !recorded {
                try connection.transaction {
                    try connection.query("INSERT INTO meta (key, value) VALUES ('audit_anchor', X'01')")
                }
            }
        }
    }

    /// Closes the database after a final checkpoint.
    public func close() {
        walSync.close()
        anchor.close()
        lock.withLock {
            _ = try? connection.query("PRAGMA wal_checkpoint(TRUNCATE)")
            connection.close()
        }
    }

    // MARK: Schema

    private static let migrations: [String] = [
        // 1: people, sealed secrets, fingers, the audit chain, terminal-wide state.
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL);
        CREATE TABLE people (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          name TEXT NOT NULL UNIQUE,
          display_name TEXT NOT NULL,
          roles TEXT NOT NULL,
          origin TEXT NOT NULL,
          state TEXT NOT NULL,
          uid INTEGER UNIQUE,
          created_at REAL NOT NULL,
          updated_at REAL NOT NULL,
          last_unlock_at REAL,
          passcode_failures INTEGER NOT NULL DEFAULT 0,
          passcode_locked_until REAL,
          passcode_hard_locked INTEGER NOT NULL DEFAULT 0,
          fingerprint_failures INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE secrets (
          person_id INTEGER NOT NULL REFERENCES people(id) ON DELETE CASCADE,
          kind TEXT NOT NULL,
          sealed BLOB NOT NULL,
          updated_at REAL NOT NULL,
          PRIMARY KEY (person_id, kind)
        );
        CREATE TABLE fingers (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          person_id INTEGER NOT NULL REFERENCES people(id) ON DELETE CASCADE,
          finger TEXT NOT NULL,
          template BLOB NOT NULL,
          created_at REAL NOT NULL,
          UNIQUE (person_id, finger)
        );
        CREATE TABLE audit (
          seq INTEGER PRIMARY KEY,
          time_us INTEGER NOT NULL,
          action TEXT NOT NULL,
          result TEXT NOT NULL,
          person TEXT,
          method TEXT,
          caller_uid INTEGER,
          caller_pid INTEGER,
          service TEXT,
          detail TEXT,
          mac BLOB NOT NULL
        );
        CREATE TABLE terminal_state (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
        """,
        // 2: identity-provider people, sessions, the outbox (queued revocations and audit
        // deliveries), one-time activation codes.
        """
        ALTER TABLE people ADD COLUMN email TEXT;
        ALTER TABLE people ADD COLUMN idp_subject TEXT;
        ALTER TABLE people ADD COLUMN idp_contact TEXT;
        ALTER TABLE people ADD COLUMN biometric_offer TEXT NOT NULL DEFAULT 'on';
        ALTER TABLE people ADD COLUMN suspended_reason TEXT;
        ALTER TABLE people ADD COLUMN refresh_state TEXT;
        CREATE UNIQUE INDEX people_idp_subject ON people (idp_subject) WHERE idp_subject IS NOT NULL;
        CREATE TABLE sessions (
          id TEXT PRIMARY KEY NOT NULL,
          person_id INTEGER NOT NULL REFERENCES people(id) ON DELETE CASCADE,
          state TEXT NOT NULL,
          service TEXT,
          tty TEXT,
          opened_at REAL NOT NULL,
          ended_at REAL,
          end_reason TEXT
        );
        CREATE INDEX sessions_person ON sessions (person_id);
        CREATE TABLE outbox (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          kind TEXT NOT NULL,
          idempotency_key TEXT NOT NULL UNIQUE,
          payload TEXT,
          sealed BLOB,
          created_at REAL NOT NULL,
          attempts INTEGER NOT NULL DEFAULT 0,
          next_attempt_at REAL,
          delivered_at REAL,
          last_error TEXT
        );
        CREATE TABLE activation_codes (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          person_id INTEGER NOT NULL REFERENCES people(id) ON DELETE CASCADE,
          code_mac BLOB NOT NULL,
          issued_at REAL NOT NULL,
          expires_at REAL NOT NULL,
          failures INTEGER NOT NULL DEFAULT 0,
          used_at REAL,
          revoked_at REAL
        );
        CREATE INDEX activation_codes_mac ON activation_codes (code_mac);
        CREATE INDEX activation_codes_person ON activation_codes (person_id);
        """,
        // 3: a MAC over each person's security-relevant columns (computed for existing rows at
        // the upgrade; see `peopleMACColumns`).
        """
        ALTER TABLE people ADD COLUMN mac BLOB;
        """,
        // 4: whether a person has a passcode, under their row MAC (so deleting the secrets row is
        // found), and MACs over activation codes, sessions and terminal-wide state (computed for
        // existing rows at the upgrade; see RowIntegrity.swift).
        """
        ALTER TABLE people ADD COLUMN has_passcode INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE activation_codes ADD COLUMN mac BLOB;
        ALTER TABLE sessions ADD COLUMN mac BLOB;
        ALTER TABLE terminal_state ADD COLUMN mac BLOB;
        """,
        // 5: the name of the Unix account a bound uid belonged to at binding, under the row MAC,
        // so that a uid reused for a new account does not inherit the binding (rows bound before
        // are recorded by the daemon at its first start on this schema).
        """
        ALTER TABLE people ADD COLUMN bound_account TEXT;
        """,
        // 6: fleet membership (docs/fleet.md §9): the terminal's membership and cursor, the
        // data-key generations it received and the join tokens it issued (both sealed), the
        // mapping of local people to directory person ids, and the durable queue of pushes.
        """
        CREATE TABLE IF NOT EXISTS fleet_membership (
          singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
          directory TEXT NOT NULL,
          terminal_id TEXT NOT NULL,
          name TEXT NOT NULL,
          state TEXT NOT NULL,
          cursor INTEGER NOT NULL DEFAULT 0,
          joined_at REAL NOT NULL,
          last_sync_at REAL,
          last_error TEXT,
          audit_pushed_through INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE IF NOT EXISTS fleet_keys (
          generation INTEGER PRIMARY KEY,
          sealed BLOB NOT NULL,
          received_at REAL NOT NULL
        );
        CREATE TABLE IF NOT EXISTS fleet_join_tokens (
          token_id TEXT PRIMARY KEY NOT NULL,
          sealed BLOB NOT NULL,
          issued_at REAL NOT NULL,
          expires_at REAL NOT NULL,
          admitted_at REAL,
          admitted_terminal TEXT
        );
        CREATE TABLE IF NOT EXISTS fleet_people (
          person_id INTEGER PRIMARY KEY REFERENCES people(id) ON DELETE CASCADE,
          fleet_id TEXT NOT NULL UNIQUE,
          pushed_digest TEXT,
          reported_failures INTEGER NOT NULL DEFAULT 0,
          unpushed_failures INTEGER NOT NULL DEFAULT 0,
          fleet_failures INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE IF NOT EXISTS fleet_templates (
          template_id TEXT PRIMARY KEY NOT NULL,
          person_id INTEGER NOT NULL REFERENCES people(id) ON DELETE CASCADE,
          finger TEXT NOT NULL,
          UNIQUE (person_id, finger)
        );
        CREATE TABLE IF NOT EXISTS fleet_outbox (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          idempotency_key TEXT NOT NULL UNIQUE,
          sealed BLOB NOT NULL,
          created_at REAL NOT NULL,
          attempts INTEGER NOT NULL DEFAULT 0,
          last_error TEXT
        );
        """,
        // 7: the fleet's hardened directory (docs/fleet.md §9.5): the version of every directory
        // row this terminal trusted (handed back to the directory connection after a restart, so
        // an older row written back is refused), and the changes it refused. Idempotent, like
        // every migration here: a store set back to an older version runs it again.
        """
        CREATE TABLE IF NOT EXISTS fleet_row_versions (
          entity TEXT NOT NULL,
          row_key TEXT NOT NULL,
          version INTEGER NOT NULL,
          PRIMARY KEY (entity, row_key)
        ) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS fleet_rejections (
          singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
          count INTEGER NOT NULL,
          last_reason TEXT NOT NULL
        );
        """,
        // 8: which queued pushes reset whose passcode failures, and when (docs/fleet.md §5):
        // while a reset waits in the queue, a fleet-wide sum pulled from the directory predates
        // it, and the failures acknowledged from batches before it were already forgiven here.
        // `set_aside`: a pulled sum was set aside for it; `expired`: its window was seen over.
        // `fleet_id` '*': a queued batch that did not open at the upgrade (it may hold a reset
        // of anyone). Filled from the queue at the upgrade (`recordQueuedResets`). Idempotent.
        """
        CREATE TABLE IF NOT EXISTS fleet_queued_resets (
          batch_id INTEGER NOT NULL REFERENCES fleet_outbox(id) ON DELETE CASCADE,
          fleet_id TEXT NOT NULL,
          queued_at REAL NOT NULL,
          set_aside INTEGER NOT NULL DEFAULT 0,
          expired INTEGER NOT NULL DEFAULT 0,
          PRIMARY KEY (fleet_id, batch_id)
        ) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS fleet_queued_resets_batch ON fleet_queued_resets (batch_id);
        """,
        // 9: passcode checks under way. An attempt is counted as a failure before its hash is
        // checked (`saveFailuresOfUnfinishedCheck`) and is listed here until the check ends; one
        // still listed at the next start was interrupted (a kill, a power cut) and stays a
        // failure. Until its check ends the attempt is not reported to the fleet directory
        // (docs/fleet.md §9.6). Idempotent.
        """
        CREATE TABLE IF NOT EXISTS unfinished_passcode_checks (
          person_id INTEGER PRIMARY KEY REFERENCES people(id) ON DELETE CASCADE,
          attempts INTEGER NOT NULL CHECK (attempts > 0)
        ) WITHOUT ROWID;
        """,
    ]

    private func openSchema(now: Date) throws(StoreError) {
        do {
            // Connection settings only: FULL makes each commit durable (counters survive a kill).
            try connection.execute("PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON; PRAGMA secure_delete=ON")
            let version = try connection.query("PRAGMA user_version").first?["user_version"].int ?? 0
            openedAtVersion = version
            if version == 0, anchor.exists, acceptedRollback == nil {
                let problem = "\(connection.path) holds no store but \(anchor.describeForRollback())"
                guard acceptRollback else { throw StoreError(.rollback(problem)) }
                acceptedRollback = problem
            }
            guard version <= Self.migrations.count else {
                throw StoreError(.futureSchema(found: version, supported: Self.migrations.count))
            }
            if version > 0 {
                try checkKey()
            }
            // Switching to WAL writes the file header, so only once the store is known to be ours.
            try connection.execute("PRAGMA journal_mode=WAL")
            if version < Self.migrations.count {
                try connection.transaction {
                    for index in version..<Self.migrations.count {
                        try connection.execute(Self.migrations[index])
                        logger.info("store schema migrated", metadata: ["version": "\(index + 1)"])
                    }
                    if version == 0 {
                        try initialiseMeta()
                    }
                    if version > 0 && version < 4 {
                        try upgradeRowMACs(from: version)
                    } else if version == 4 {
                        try upgradePeopleMACs(columns: Self.peopleMACColumnNamesV4)
                    }
                    if version >= 6 && version < 8 {
                        try recordQueuedResets()
                    }
                    try connection.execute("PRAGMA user_version=\(Self.migrations.count)")
                }
            }
        } catch let error as StoreError {
            throw error
        } catch let error as SQLiteError {
            if error.isCorrupt {
                throw StoreError(.integrity("the database file is not a valid kioskauth store: \(error.message)"))
            }
            throw StoreError(.database(error))
        } catch {
            throw StoreError(.integrity("\(error)"))
        }
    }

    /// Computes the row MACs schema 4 adds. A schema-3 store's people rows are checked against
    /// their old MACs first, so the upgrade never launders an earlier edit into a valid MAC.
    private func upgradeRowMACs(from version: Int) throws {
        for row in try connection.query(
            "SELECT id, \(Self.peopleMACColumnNamesV3.joined(separator: ", ")), mac FROM people")
        {
            let id = Int64(row["id"].int ?? 0)
            if version == 3, row["mac"].bytes != personRowMAC(id: id, row, columns: Self.peopleMACColumnNamesV3) {
                throw StoreError(
                    .integrity("people row \(id) does not match its MAC (found while upgrading the store)"))
            }
            try connection.query(
                "UPDATE people SET has_passcode = EXISTS (SELECT 1 FROM secrets s WHERE s.person_id = people.id AND s.kind = 'passcode') WHERE id = ?",
                [.integer(id)])
            try resealPersonRow(id, in: connection)
        }
        for table in Self.macTables {
            try resealRows(table, where: "1", [], in: connection)
        }
    }

    /// Recomputes the people row MACs after a migration added a covered column, checking each
    /// row against the MAC over the columns it had first (`columns`).
    private func upgradePeopleMACs(columns: [String]) throws {
        for row in try connection.query("SELECT id, \(columns.joined(separator: ", ")), mac FROM people") {
            let id = Int64(row["id"].int ?? 0)
            guard row["mac"].bytes == personRowMAC(id: id, row, columns: columns) else {
                throw StoreError(
                    .integrity("people row \(id) does not match its MAC (found while upgrading the store)"))
            }
            try resealPersonRow(id, in: connection)
        }
    }

    private static let keyCheckBinding = SealBinding(table: "meta", column: "value", row: "key_check", owner: "store")
    private static let keyCheckPlaintext = Array("kioskauth store key check".utf8)

    private func initialiseMeta() throws {
        var storeID = [UInt8](repeating: 0, count: 16)
        SymmetricKey(size: .bits128).withUnsafeBytes { storeID = Array($0) }
        try connection.query("INSERT INTO meta (key, value) VALUES ('store_id', ?)", [.blob(storeID)])
        let check = try sealer.seal(Self.keyCheckPlaintext, binding: Self.keyCheckBinding)
        try connection.query("INSERT INTO meta (key, value) VALUES ('key_check', ?)", [.blob(check)])
    }

    private func checkKey() throws {
        guard let sealed = try connection.query("SELECT value FROM meta WHERE key = 'key_check'").first?["value"].bytes
        else {
            throw StoreError(.integrity("the store has no key check"))
        }
        do {
            guard try sealer.open(sealed, binding: Self.keyCheckBinding) == Self.keyCheckPlaintext else {
                throw StoreError(.wrongKey)
            }
        } catch {
            throw StoreError(.wrongKey)
        }
    }

    /// The schema version of the open store.
    public var openSchemaVersion: Int { Self.schemaVersion }

    /// The store's random identity, bound into the audit chain's genesis.
    var storeID: [UInt8] {
        (try? connection.query("SELECT value FROM meta WHERE key = 'store_id'").first?["value"].bytes) ?? []
    }

    // MARK: Serialised access

    /// Runs `body` under the store lock, turning SQLite failures into store errors.
    func locked<T>(_ body: () throws -> T) throws(StoreError) -> T {
        lock.lock()
        defer { lock.unlock() }
        do {
            return try body()
        } catch let error as StoreError {
            throw error
        } catch let error as SQLiteError where error.isCorrupt {
            // Damage found where it is read is the same finding as the check's: StoreIntegrity.
            throw StoreError(.integrity("the database file is damaged: \(error.message)"))
        } catch let error as SQLiteError {
            throw StoreError(.database(error))
        } catch {
            throw StoreError(.integrity("\(error)"))
        }
    }

    /// Runs `body` in one durable transaction under the store lock. Called inside another
    /// transaction (on the thread holding the lock), it runs as a savepoint of that one: its
    /// writes commit or roll back with the outermost transaction, and a failure in it undoes
    /// only its own writes.
    ///
    /// While the daemon starts (`holdSyncsUntilServing`), the commit is made as
    /// `deferredSyncTransaction` makes one.
    @discardableResult
    func transaction<T>(_ body: (SQLiteConnection) throws -> T) throws(StoreError) -> T {
        let held = try locked { syncsHeldUntilServing }
        return try runTransaction(synchronous: !(held ? try canDeferSync() : false), body)
    }

    /// Whether a commit may skip its `fsync` wait: the WAL file can be synced from here
    /// (`WALSync`), and the commit is not nested in another transaction (it joins that one).
    private func canDeferSync() throws(StoreError) -> Bool {
        try locked { transactionDepth == 0 } && walSync.available()
    }

    /// From now until `serving()`, no commit waits for `fsync`: each is written to the WAL and
    /// synced by `WALSync` right after, off the caller's path, its audit head anchored once that
    /// sync is done.
    ///
    /// For the writes a daemon makes on its way to serving (its start in the audit trail, the
    /// offline window and the steady clock observed at start, reconciling the reader), which
    /// otherwise each waited for a sync of their own before READY=1. Losing them in a power cut
    /// is the same as a power cut just before the start: nothing has been served on the strength
    /// of them, and WAL frames become durable in order, so the first durable commit after
    /// serving (a failed attempt's, or any write that tightens something) makes every one of
    /// them durable first, and the background sync does within milliseconds anyway. A store
    /// closed before serving syncs them at `close()`. Journal lines that name the audit head
    /// (`audit_seq`, `audit_head`) can run ahead of the disk in that moment, as they already
    /// could for the deferred commits of successful authentications. Whatever follows an
    /// irreversible act (deleting prints from a reader's own storage) is written after
    /// `serving()`.
    public func holdSyncsUntilServing() {
        lock.withLock { syncsHeldUntilServing = true }
    }

    /// Ends `holdSyncsUntilServing`: commits are durable again before they return.
    public func serving() {
        lock.withLock { syncsHeldUntilServing = false }
    }

    /// Guarded by the store's lock.
    private var syncsHeldUntilServing = false

    private func runTransaction<T>(synchronous: Bool, _ body: (SQLiteConnection) throws -> T) throws(StoreError) -> T {
        let (result, head, checkpoint) = try locked { () throws -> (T, AuditHeadMark?, Bool) in
            if transactionDepth > 0 {
                let outerHead = pendingHead
                transactionDepth += 1
                defer { transactionDepth -= 1 }
                do {
                    return (try connection.savepoint { try body(connection) }, nil, false)
                } catch {
                    pendingHead = outerHead
                    throw error
                }
            }
            pendingHead = nil
            checkpointAfterCommit = false
            transactionDepth = 1
            defer {
                transactionDepth = 0
                pendingHead = nil
                checkpointAfterCommit = false
            }
            var queuedFleetBatch = false
            let result = try connection.transaction(synchronous: synchronous) { () throws -> T in
                defer { fleetPending = FleetPendingChanges() }
                let result = try body(connection)
                queuedFleetBatch = try flushFleetChanges(in: connection)
                return result
            }
            if queuedFleetBatch { fleetBatchQueued?() }
            if !synchronous { deferredSyncCommits += 1 }
            return (result, pendingHead, checkpointAfterCommit)
        }
        if synchronous {
            if let head { writeAnchor(head) }
        } else {
            walSync.request(head: head)
        }
        if checkpoint { try? locked { _ = try connection.query("PRAGMA wal_checkpoint(TRUNCATE)") } }
        return result
    }

    /// Runs a truncating checkpoint now, or once the transaction in progress commits.
    func checkpointTruncating() throws(StoreError) {
        try locked {
            if transactionDepth > 0 {
                checkpointAfterCommit = true
            } else {
                _ = try connection.query("PRAGMA wal_checkpoint(TRUNCATE)")
            }
        }
    }

    /// Runs several store operations and their audit entries as one durable transaction: all of
    /// it commits, or none of it does. The store's own methods called from `body` (on this
    /// thread) join the transaction; `tx.appendAudit` appends to the chain inside it. A crash at
    /// any point leaves either everything or nothing; an error thrown from `body` rolls it all
    /// back. The audit head anchor is written once the commit is durable.
    ///
    /// The store is locked for the whole of `body`: keep it short, and never wait in it.
    public func transaction<T>(now: Date, _ body: (StoreTransaction) throws(StoreError) -> T) throws(StoreError) -> T {
        try transaction { db throws -> T in
            let tx = StoreTransaction(store: self, connection: db, now: now)
            defer { tx.isOpen = false }
            return try body(tx)
        }
    }

    /// Records a committed, durable head in the anchor.
    private func writeAnchor(_ head: AuditHeadMark) {
        if !anchor.write(head) {
            logger.error("cannot write the audit head anchor", metadata: ["path": "\(anchor.path)"])
        }
    }

    /// Like `transaction`, but the commit does not wait for `fsync`: the WAL file is synced in
    /// the background right after. Only for writes whose loss in a power cut is harmless. Falls
    /// back to a durable commit when the WAL file cannot be synced from here; inside another
    /// transaction it joins that one (durable).
    func deferredSyncTransaction<T>(_ body: (SQLiteConnection) throws -> T) throws(StoreError) -> T {
        try runTransaction(synchronous: !(try canDeferSync()), body)
    }

    /// Commits made without waiting for `fsync` (for tests). Guarded by the store's lock.
    private(set) var deferredSyncCommits = 0

    // MARK: People

    /// The columns a person's row MAC covers, in order: everything that decides who may
    /// authenticate as whom and how (uid binding, roles, state, failure counters and lock times,
    /// the identity-provider link, offline window and refresh state, the biometric offer).
    static let peopleMACColumnNames = [
        "name", "roles", "origin", "state", "uid", "passcode_failures", "passcode_locked_until",
        "passcode_hard_locked", "fingerprint_failures", "idp_subject", "idp_contact", "suspended_reason",
        "refresh_state", "biometric_offer", "has_passcode", "bound_account",
    ]
    /// The columns schema 4 covered (before `bound_account`), for checking at the upgrade.
    static let peopleMACColumnNamesV4 = Array(peopleMACColumnNames.dropLast())
    /// The columns schema 3 covered (before `has_passcode`), for checking at the upgrade.
    static let peopleMACColumnNamesV3 = Array(peopleMACColumnNamesV4.dropLast())
    static let peopleMACColumns = peopleMACColumnNames.joined(separator: ", ")

    /// The MAC over a person's row: table, row id, and each covered column with its type, in a
    /// canonical length-prefixed encoding.
    func personRowMAC(id: Int64, _ row: SQLRow, columns: [String] = Store.peopleMACColumnNames) -> [UInt8] {
        var input: [UInt8] = Array("people".utf8)
        input.append(0)
        withUnsafeBytes(of: id.bigEndian) { input += $0 }
        for column in columns {
            Self.appendCanonical(row[column], to: &input)
        }
        return Array(HMAC<SHA256>.authenticationCode(for: input, using: rowKey))
    }

    /// Checks a people row read with `id`, the covered columns and `mac`.
    func checkPersonRow(_ row: SQLRow) throws(StoreError) {
        let id = Int64(row["id"].int ?? 0)
        guard let mac = row["mac"].bytes, mac == personRowMAC(id: id, row) else {
            throw StoreError(
                .integrity(
                    "people row \(id) does not match its MAC (a uid, role, state, counter, window or passcode was changed)"
                ))
        }
        // The passcode's existence is under the MAC; the secrets row must agree with it.
        if let rows = row["passcode_rows"].int, (rows > 0) != ((row["has_passcode"].int ?? 0) != 0) {
            throw StoreError(
                .integrity(
                    rows > 0
                        ? "people row \(id) has a passcode row it does not record"
                        : "people row \(id) records a passcode but its secrets row is gone (deleted behind the store's back)"
                ))
        }
    }

    /// Checks a person's row before a write, so a write never launders a change made behind the
    /// store's back into a valid MAC.
    func checkPersonRow(_ id: Int64, in db: SQLiteConnection) throws {
        guard
            let row = try db.query("SELECT id, \(Self.peopleMACColumns), mac FROM people WHERE id = ?", [.integer(id)])
                .first
        else { return }
        try checkPersonRow(row)
    }

    /// Recomputes a person's row MAC after a write, in the same transaction.
    func resealPersonRow(_ id: Int64, in db: SQLiteConnection) throws {
        guard
            let row = try db.query("SELECT id, \(Self.peopleMACColumns) FROM people WHERE id = ?", [.integer(id)]).first
        else { return }
        try db.query("UPDATE people SET mac = ? WHERE id = ?", [.blob(personRowMAC(id: id, row)), .integer(id)])
        noteFleetPersonChange(id)
    }

    /// Runs a write to a person's row: checks the row first, recomputes its MAC after.
    func updatingPerson<T>(_ id: Int64, in db: SQLiteConnection, _ body: () throws -> T) throws -> T {
        try checkPersonRow(id, in: db)
        let result = try body()
        try resealPersonRow(id, in: db)
        return result
    }

    static let personColumns =
        "id, name, display_name, roles, origin, state, uid, bound_account, created_at, last_unlock_at, passcode_failures, passcode_locked_until, passcode_hard_locked, fingerprint_failures, idp_subject, idp_contact, suspended_reason, refresh_state, biometric_offer, has_passcode, mac, (SELECT COUNT(*) FROM secrets s WHERE s.person_id = people.id AND s.kind = 'passcode') AS passcode_rows, (SELECT group_concat(finger) FROM (SELECT finger FROM fingers f WHERE f.person_id = people.id ORDER BY f.id)) AS fingers"

    func decodePerson(_ row: SQLRow) throws -> StoredPerson {
        try checkPersonRow(row)
        let roleNames = (row["roles"].string ?? "").split(separator: ",").map(String.init)
        let roles = try RoleSet(
            roleNames.map { name in
                guard let role = Role(rawValue: name) else {
                    throw StoreError(.integrity("unknown role \(name) in people row"))
                }
                return role
            })
        guard let origin = Origin(rawValue: row["origin"].string ?? ""),
            let state = PersonState(rawValue: row["state"].string ?? "")
        else { throw StoreError(.integrity("bad origin or state in people row")) }
        var failures = CredentialFailureState()
        failures.passcodeFailures = row["passcode_failures"].int ?? 0
        failures.passcodeLockedUntil = row["passcode_locked_until"].double.map(Date.init(timeIntervalSince1970:))
        failures.passcodeHardLocked = (row["passcode_hard_locked"].int ?? 0) != 0
        failures.fingerprintFailures = row["fingerprint_failures"].int ?? 0
        return StoredPerson(
            id: Int64(row["id"].int ?? 0),
            name: try LoginName(row["name"].string ?? ""),
            displayName: row["display_name"].string ?? "",
            roles: roles,
            origin: origin,
            state: state,
            uid: row["uid"].int,
            boundAccount: row["bound_account"].string,
            createdAt: Date(timeIntervalSince1970: row["created_at"].double ?? 0),
            lastUnlockAt: row["last_unlock_at"].double.map(Date.init(timeIntervalSince1970:)),
            failures: failures,
            hasPasscode: (row["has_passcode"].int ?? 0) > 0,
            fingers: (row["fingers"].string ?? "").split(separator: ",").map(String.init))
    }

    /// Creates a person. Names and bound uids are unique. `boundAccount` is the name of the Unix
    /// account that has `uid` now ("" when none has it; nil: not known).
    public func addPerson(
        name: LoginName, displayName: String, roles: RoleSet, origin: Origin, state: PersonState, uid: Int?,
        boundAccount: String? = nil, now: Date
    ) throws(StoreError) -> StoredPerson {
        try transaction { db in
            if try !db.query("SELECT id FROM people WHERE name = ?", [.text(name.rawValue)]).isEmpty {
                throw StoreError(.personExists(name.rawValue))
            }
            if let uid, try !db.query("SELECT id FROM people WHERE uid = ?", [.integer(Int64(uid))]).isEmpty {
                throw StoreError(.personExists("uid \(uid)"))
            }
            try db.query(
                "INSERT INTO people (name, display_name, roles, origin, state, uid, bound_account, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    .text(name.rawValue), .text(displayName), .text(roles.all.map(\.rawValue).joined(separator: ",")),
                    .text(origin.rawValue), .text(state.rawValue), uid.map { .integer(Int64($0)) } ?? .null,
                    uid == nil ? .null : boundAccount.map { .text($0) } ?? .null,
                    .real(now.timeIntervalSince1970), .real(now.timeIntervalSince1970),
                ])
            let id = db.lastInsertRowID
            try resealPersonRow(id, in: db)
            return try decodePerson(
                db.query("SELECT \(Self.personColumns) FROM people WHERE id = ?", [.integer(id)])[0])
        }
    }

    /// The person with this name, if any.
    ///
    /// The row is found through the name's index, which no MAC covers: the row's own (MAC-checked)
    /// name must be the one asked for, so an index changed behind the store's back can never hand
    /// out another person's row.
    public func person(named name: LoginName) throws(StoreError) -> StoredPerson? {
        try locked {
            let person = try connection.query(
                "SELECT \(Self.personColumns) FROM people WHERE name = ?", [.text(name.rawValue)]
            ).first.map(decodePerson)
            if let person, person.name != name {
                throw StoreError(
                    .integrity("people row \(person.id) was found under the name \(name.rawValue) but is not theirs"))
            }
            return person
        }
    }

    /// The person bound to this Unix uid, if any.
    /// As with names, the row's own uid must be the one asked for.
    public func person(boundTo uid: Int) throws(StoreError) -> StoredPerson? {
        try locked {
            let person = try connection.query(
                "SELECT \(Self.personColumns) FROM people WHERE uid = ?", [.integer(Int64(uid))]
            ).first.map(decodePerson)
            if let person, person.uid != uid {
                throw StoreError(
                    .integrity("people row \(person.id) was found under uid \(uid) but is not bound to it"))
            }
            return person
        }
    }

    /// Everyone, by name.
    public func people() throws(StoreError) -> [StoredPerson] {
        try locked { try connection.query("SELECT \(Self.personColumns) FROM people ORDER BY name").map(decodePerson) }
    }

    /// Number of people.
    /// What `GetStatus` shows from the store: the number of people and the audit head. Kept
    /// between calls and read again only after a write, by this connection (its change count)
    /// or by another process (`PRAGMA data_version`), so a status call costs the store lock and
    /// one pragma, not a count of the people.
    public func statusFigures() throws(StoreError) -> StoreStatusFigures {
        try locked {
            let version = try connection.query("PRAGMA data_version").first?["data_version"].int ?? 0
            let changes = connection.totalChanges
            if let cached = statusCache, cached.changes == changes, cached.dataVersion == version {
                return cached.figures
            }
            let people = try connection.query("SELECT COUNT(*) AS n FROM people").first?["n"].int ?? 0
            let row = try connection.query("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1").first
            let figures = StoreStatusFigures(
                people: people, auditEvents: row?["seq"].int ?? 0, auditHead: row?["mac"].bytes ?? [])
            statusCache = (changes, version, figures)
            return figures
        }
    }

    public func peopleCount() throws(StoreError) -> Int {
        try locked { try connection.query("SELECT COUNT(*) AS n FROM people").first?["n"].int ?? 0 }
    }

    /// Removes a person and erases every secret of theirs. Freed pages are zeroed
    /// (`secure_delete`) and the WAL is checkpointed and truncated so no old frame keeps them.
    /// Returns the removed person's fingers' templates so on-sensor prints can be deleted too.
    @discardableResult
    public func removePerson(_ person: StoredPerson) throws(StoreError) -> [[UInt8]] {
        let templates = try transaction { db -> [[UInt8]] in
            let fingers = try db.query(
                "SELECT id, finger, template FROM fingers WHERE person_id = ?", [.integer(person.id)])
            var opened: [[UInt8]] = []
            for row in fingers {
                if let sealed = row["template"].bytes,
                    let template = try? sealer.open(
                        sealed,
                        binding: Self.fingerBinding(
                            personID: person.id, name: person.name, finger: row["finger"].string ?? ""))
                {
                    opened.append(template)
                }
            }
            try noteFleetRemoval(of: person.id, in: db)
            try db.query("DELETE FROM secrets WHERE person_id = ?", [.integer(person.id)])
            try db.query("DELETE FROM fingers WHERE person_id = ?", [.integer(person.id)])
            try db.query("DELETE FROM people WHERE id = ?", [.integer(person.id)])
            guard db.changes == 1 else { throw StoreError(.noSuchPerson(person.name.rawValue)) }
            return opened
        }
        try checkpointTruncating()
        return templates
    }

    /// Persists a person's failure counters; durable when this returns. `finishingPasscodeCheck`:
    /// the counters are a passcode check's outcome, and one of the person's unfinished checks
    /// (`saveFailuresOfUnfinishedCheck`) ends with them.
    public func saveFailures(
        _ failures: CredentialFailureState, for person: StoredPerson, now: Date, finishingPasscodeCheck: Bool = false
    ) throws(StoreError) {
        try transaction { db in
            if finishingPasscodeCheck { try finishPasscodeCheck(person.id, in: db) }
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET passcode_failures = ?, passcode_locked_until = ?, passcode_hard_locked = ?, fingerprint_failures = ?, updated_at = ? WHERE id = ?",
                    [
                        .integer(Int64(failures.passcodeFailures)),
                        failures.passcodeLockedUntil.map { .real($0.timeIntervalSince1970) } ?? .null,
                        .integer(failures.passcodeHardLocked ? 1 : 0), .integer(Int64(failures.fingerprintFailures)),
                        .real(now.timeIntervalSince1970), .integer(person.id),
                    ])
                guard db.changes == 1 else { throw StoreError(.noSuchPerson(person.name.rawValue)) }
            }
        }
    }

    // MARK: Passcode checks under way

    /// Persists the failure counters of a passcode attempt whose hash is about to be checked,
    /// counted as failed (durable when this returns), and lists the check as unfinished: a
    /// daemon killed before the check ends never yields a free try. Until the check ends
    /// (`finishPasscodeCheck`, or a success's `recordAuthentication(…finishingPasscodeCheck:)`)
    /// the attempt is not reported to the fleet directory, so a right passcode reports no
    /// failure there.
    public func saveFailuresOfUnfinishedCheck(
        _ failures: CredentialFailureState, for person: StoredPerson, now: Date
    ) throws(StoreError) {
        try transaction { db in
            try db.query(
                "INSERT INTO unfinished_passcode_checks (person_id, attempts) VALUES (?, 1) ON CONFLICT (person_id) DO UPDATE SET attempts = attempts + 1",
                [.integer(person.id)])
            try saveFailures(failures, for: person, now: now)
        }
    }

    /// Ends one unfinished passcode check of `person` (`all`: every one, those a stop
    /// interrupted, see `unfinishedPasscodeChecks`) whose attempt stays counted as a failure:
    /// the fleet directory is told of it now. Nothing when none is listed.
    public func finishPasscodeCheck(of person: StoredPerson, all: Bool = false) throws(StoreError) {
        try transaction { db in try finishPasscodeCheck(person.id, all: all, in: db) }
    }

    func finishPasscodeCheck(_ id: Int64, all: Bool = false, in db: SQLiteConnection) throws {
        if !all {
            try db.query(
                "UPDATE unfinished_passcode_checks SET attempts = attempts - 1 WHERE person_id = ? AND attempts > 1",
                [.integer(id)])
        }
        if all || db.changes == 0 {
            try db.query("DELETE FROM unfinished_passcode_checks WHERE person_id = ?", [.integer(id)])
            guard db.changes > 0 else { return }
        }
        noteFleetPersonChange(id)
    }

    /// The passcode checks that were under way when the daemon last stopped (or that are under
    /// way now: call before serving), by person: each attempt counts as a failure.
    public func unfinishedPasscodeChecks() throws(StoreError) -> [(person: StoredPerson, attempts: Int)] {
        let rows = try locked {
            try connection.query("SELECT person_id, attempts FROM unfinished_passcode_checks ORDER BY person_id")
        }
        var found: [(person: StoredPerson, attempts: Int)] = []
        for row in rows {
            guard let id = row["person_id"].int, let person = try person(id: Int64(id)) else { continue }
            found.append((person, row["attempts"].int ?? 1))
        }
        return found
    }

    /// The passcode attempts of `person` whose check has not ended (counted as failures here,
    /// not yet reported to the fleet directory).
    public func unfinishedPasscodeAttempts(of person: StoredPerson) throws(StoreError) -> Int {
        try locked { try unfinishedPasscodeAttempts(person.id, in: connection) }
    }

    func unfinishedPasscodeAttempts(_ id: Int64, in db: SQLiteConnection) throws -> Int {
        try db.query("SELECT attempts FROM unfinished_passcode_checks WHERE person_id = ?", [.integer(id)])
            .first?["attempts"].int ?? 0
    }

    /// Changes a person's state.
    public func setState(_ state: PersonState, for person: StoredPerson, now: Date) throws(StoreError) {
        try transaction { db in
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET state = ?, updated_at = ? WHERE id = ?",
                    [.text(state.rawValue), .real(now.timeIntervalSince1970), .integer(person.id)])
            }
        }
    }

    /// Suspends a person with an admin's reason, or (nil) makes a suspended person active again.
    public func setSuspension(_ reason: String?, for person: StoredPerson, now: Date) throws(StoreError) {
        try transaction { db in
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET state = ?, suspended_reason = ?, updated_at = ? WHERE id = ?",
                    [
                        .text(reason == nil ? PersonState.active.rawValue : PersonState.suspended.rawValue),
                        reason.map { .text($0) } ?? .null, .real(now.timeIntervalSince1970), .integer(person.id),
                    ])
            }
        }
    }

    /// Binds a person to a Unix uid, or unbinds them (nil). A uid is bound to one person at most.
    /// Binds `person` to `uid` (nil: unbinds), recording `account`, the name of the Unix account
    /// that has `uid` now ("" when none has it; nil: not known).
    public func setUID(_ uid: Int?, account: String?, for person: StoredPerson, now: Date) throws(StoreError) {
        try transaction { db in
            if let uid,
                try !db.query(
                    "SELECT id FROM people WHERE uid = ? AND id != ?", [.integer(Int64(uid)), .integer(person.id)]
                )
                .isEmpty
            {
                throw StoreError(.personExists("uid \(uid)"))
            }
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET uid = ?, bound_account = ?, updated_at = ? WHERE id = ?",
                    [
                        uid.map { .integer(Int64($0)) } ?? .null,
                        uid == nil ? .null : account.map { .text($0) } ?? .null,
                        .real(now.timeIntervalSince1970), .integer(person.id),
                    ])
            }
        }
    }

    /// The people bound to a uid whose account at binding was never recorded (bound before
    /// schema 5).
    public func peopleWithUnrecordedAccounts() throws(StoreError) -> [StoredPerson] {
        try locked {
            try connection.query(
                "SELECT \(Self.personColumns) FROM people WHERE uid IS NOT NULL AND bound_account IS NULL ORDER BY id"
            ).map(decodePerson)
        }
    }

    /// Records the account that has `person`'s uid now ("" when none has it), for a binding made
    /// before schema 5. A binding whose account is already recorded is left as it is.
    public func recordBoundAccount(_ account: String, for person: StoredPerson, now: Date) throws(StoreError) {
        try transaction { db in
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET bound_account = ? WHERE id = ? AND uid IS NOT NULL AND bound_account IS NULL",
                    [.text(account), .integer(person.id)])
            }
        }
    }

    /// Records a successful unlock (orders the walk-up identify roster).
    public func recordUnlock(of person: StoredPerson, now: Date) throws(StoreError) {
        try transaction { db in
            try db.query(
                "UPDATE people SET last_unlock_at = ? WHERE id = ?",
                [.real(now.timeIntervalSince1970), .integer(person.id)])
        }
    }

    // MARK: Secrets

    static func secretBinding(personID: Int64, name: LoginName, kind: String) -> SealBinding {
        SealBinding(table: "secrets", column: kind, row: "\(personID)", owner: name.rawValue)
    }

    static func fingerBinding(personID: Int64, name: LoginName, finger: String) -> SealBinding {
        SealBinding(table: "fingers", column: finger, row: "\(personID)", owner: name.rawValue)
    }

    /// Seals and stores a person's passcode verifier, replacing any earlier one.
    public func setPasscodeVerifier(
        _ verifier: PasscodeVerifier, for person: StoredPerson, now: Date
    ) throws(StoreError) {
        try setSecret(try JSONEncoder().encodeOrThrow(verifier), kind: "passcode", for: person, now: now)
    }

    /// The person's passcode verifier, opened; nil when none is set. A verifier that does not
    /// open (edited, swapped, wrong key) is an integrity error.
    public func passcodeVerifier(for person: StoredPerson) throws(StoreError) -> PasscodeVerifier? {
        guard let bytes = try secret(kind: "passcode", for: person) else {
            if person.hasPasscode {
                throw StoreError(.integrity("the passcode of \(person.name) is recorded but its secrets row is gone"))
            }
            return nil
        }
        do { return try JSONDecoder().decode(PasscodeVerifier.self, from: Data(bytes)) } catch {
            throw StoreError(.integrity("passcode verifier of \(person.name) does not decode"))
        }
    }

    /// Seals and stores a secret of `kind` for a person.
    public func setSecret(_ plaintext: [UInt8], kind: String, for person: StoredPerson, now: Date) throws(StoreError) {
        let sealed: [UInt8]
        do {
            sealed = try sealer.seal(
                plaintext, binding: Self.secretBinding(personID: person.id, name: person.name, kind: kind))
        } catch {
            throw StoreError(.integrity("sealing failed: \(error)"))
        }
        try transaction { db in
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "INSERT INTO secrets (person_id, kind, sealed, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (person_id, kind) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
                    [.integer(person.id), .text(kind), .blob(sealed), .real(now.timeIntervalSince1970)])
                if kind == "passcode" {
                    noteFleetVerifierChange(person.id)
                    try db.query("UPDATE people SET has_passcode = 1 WHERE id = ?", [.integer(person.id)])
                }
            }
        }
    }

    /// Opens a stored secret of `kind`; nil when absent.
    public func secret(kind: String, for person: StoredPerson) throws(StoreError) -> [UInt8]? {
        let stored = try locked {
            try connection.query(
                "SELECT sealed FROM secrets WHERE person_id = ? AND kind = ?", [.integer(person.id), .text(kind)]
            )
            .first?["sealed"]
        }
        guard let stored else { return nil }
        // A row that is there but holds no blob (rewritten as TEXT, say) was tampered with; it is
        // not "no secret".
        guard let sealed = stored.bytes else {
            throw StoreError(
                .integrity(
                    "\(Self.secretBinding(personID: person.id, name: person.name, kind: kind)): the sealed value is not a blob"
                ))
        }
        return try sealer.open(sealed, binding: Self.secretBinding(personID: person.id, name: person.name, kind: kind))
    }

    // MARK: Terminal-wide state

    /// A terminal-wide value (JSON), e.g. the identify throttle.
    public func terminalValue<T: Decodable>(_ type: T.Type, forKey key: String) throws(StoreError) -> T? {
        let text = try locked { () throws -> String? in
            guard
                let row = try connection.query(
                    "SELECT \(Self.terminalStateTable.selectList) FROM terminal_state WHERE key = ?", [.text(key)]
                ).first
            else { return nil }
            try checkRow(Self.terminalStateTable, row)
            guard let text = row["value"].string else {
                throw StoreError(.integrity("terminal_state row \(key) is not text"))
            }
            return text
        }
        guard let text else { return nil }
        // The MAC checked out, so a value that does not decode was written by another version.
        return try? JSONDecoder().decode(type, from: Data(text.utf8))
    }

    /// Stores a terminal-wide value (JSON), durably.
    public func setTerminalValue(_ value: some Encodable, forKey key: String) throws(StoreError) {
        try transaction { db in try writeTerminalValue(value, forKey: key, in: db) }
    }

    /// Writes a terminal value (JSON) and its MAC inside `db`'s transaction, after checking the
    /// row it replaces.
    func writeTerminalValue(_ value: some Encodable, forKey key: String, in db: SQLiteConnection) throws {
        let text = String(decoding: try JSONEncoder().encodeOrThrow(value), as: UTF8.self)
        try updatingRows(Self.terminalStateTable, where: "key = ?", [.text(key)], in: db) {
            try db.query(
                "INSERT INTO terminal_state (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [.text(key), .text(text)])
        }
    }

    /// Deletes terminal values inside `db`'s transaction.
    func deleteTerminalValues(_ keys: String..., in db: SQLiteConnection) throws {
        for key in keys { try db.query("DELETE FROM terminal_state WHERE key = ?", [.text(key)]) }
    }
}

extension JSONEncoder {
    func encodeOrThrow(_ value: some Encodable) throws(StoreError) -> [UInt8] {
        do { return Array(try encode(value)) } catch { throw StoreError(.integrity("encoding failed: \(error)")) }
    }
}

/// The store's part of `GetStatus`.
public struct StoreStatusFigures: Sendable, Equatable {
    public var people: Int
    public var auditEvents: Int
    /// The last audit entry's MAC (empty for an empty trail).
    public var auditHead: [UInt8]
}
