import Crypto
public import FoundationEssentials
public import KioskAuthCore

/// What is recorded for every authentication and admin action. Never a secret.
public struct AuditRecord: Sendable, Equatable {
    public var action: String
    public var result: String
    public var person: String?
    public var method: String?
    public var callerUID: Int?
    public var callerPID: Int?
    public var service: String?
    public var detail: String?

    public init(
        action: String, result: String, person: String? = nil, method: String? = nil, callerUID: Int? = nil,
        callerPID: Int? = nil, service: String? = nil, detail: String? = nil
    ) {
        self.action = action
        self.result = result
        self.person = person
        self.method = method
        self.callerUID = callerUID
        self.callerPID = callerPID
        self.service = service
        self.detail = detail
    }
}

/// An audit record in the chain.
public struct AuditEntry: Sendable, Equatable {
    public var sequence: Int
    /// Microseconds since 1970, as stored (so the MAC input is exact).
    public var timeMicroseconds: Int64
    public var record: AuditRecord
    /// HMAC-SHA256 over the previous MAC and this entry.
    public var mac: [UInt8]

    public var time: Date { Date(timeIntervalSince1970: Double(timeMicroseconds) / 1_000_000) }
    public var macHex: String { Hex.encode(mac) }
}

/// Outcome of checking the chain.
public struct AuditChainVerification: Sendable, Equatable {
    public var isValid: Bool
    public var events: Int
    /// The MAC of the last entry checked (empty for an empty chain).
    public var head: [UInt8]
    public var brokenAt: Int?
    public var reason: String?

    /// The head in hex, as the API shows it.
    public var headHex: String { Hex.encode(head) }
}

extension Store {
    /// The chain's starting MAC, bound to this store's identity so chains cannot be spliced
    /// between stores.
    private var genesis: [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: Array("kioskauth audit genesis".utf8) + storeID, using: auditKey))
    }

    private func mac(previous: [UInt8], sequence: Int, timeMicroseconds: Int64, record: AuditRecord) -> [UInt8] {
        // Length-prefixed fields: no two different entries serialise alike.
        var input = previous
        func field(_ text: String?) {
            guard let text else {
                input += [0xff, 0xff, 0xff, 0xff]
                return
            }
            let bytes = Array(text.utf8)
            withUnsafeBytes(of: UInt32(bytes.count).bigEndian) { input += $0 }
            input += bytes
        }
        field(String(sequence))
        field(String(timeMicroseconds))
        field(record.action)
        field(record.result)
        field(record.person)
        field(record.method)
        field(record.callerUID.map(String.init))
        field(record.callerPID.map(String.init))
        field(record.service)
        field(record.detail)
        return Array(HMAC<SHA256>.authenticationCode(for: input, using: auditKey))
    }

    /// Appends a record to the chain, durably, and returns it with its MAC (the new head).
    ///
    /// With `durable: false` the commit does not wait for `fsync` (the WAL is synced in the
    /// background straight after, and only then is the new head anchored), as for a successful
    /// unlock: for a record whose loss in a power cut within those moments is harmless, because
    /// the chain then simply ends one entry earlier and stays valid.
    @discardableResult
    public func appendAudit(_ record: AuditRecord, now: Date, durable: Bool = true) throws(StoreError) -> AuditEntry {
        durable
            ? try transaction { db in try appendAudit(record, now: now, in: db) }
            : try deferredSyncTransaction { db in try appendAudit(record, now: now, in: db) }
    }

    /// Appends inside a transaction the caller holds, so an action and its audit entry commit
    /// together (or not at all).
    func appendAudit(_ record: AuditRecord, now: Date, in db: SQLiteConnection) throws -> AuditEntry {
        #if DEBUG
            if _failingAuditActions.contains(record.action) {
                throw StoreError(.integrity("injected audit append failure for \(record.action) (test hook)"))
            }
        #endif
        let last = try db.query("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1").first
        // The anchor moves only forward along the chain it anchors: once the chain has lost the
        // anchored head (rows deleted or replaced), it keeps that head as evidence.
        if let anchored = anchor.lastHead, anchored.sequence > 0, !anchor.isFrozen {
            let mac = try db.query("SELECT mac FROM audit WHERE seq = ?", [.integer(Int64(anchored.sequence))]).first?[
                "mac"
            ].bytes
            if mac != anchored.mac {
                anchor.freeze()
                logger.critical(
                    "the audit chain no longer contains the anchored head: truncated or rolled back",
                    metadata: ["anchored_seq": "\(anchored.sequence)"])
            }
        }
        let previous = last?["mac"].bytes ?? genesis
        let sequence = (last?["seq"].int ?? 0) + 1
        let time = Int64((now.timeIntervalSince1970 * 1_000_000).rounded())
        let mac = mac(previous: previous, sequence: sequence, timeMicroseconds: time, record: record)
        try db.query(
            "INSERT INTO audit (seq, time_us, action, result, person, method, caller_uid, caller_pid, service, detail, mac) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                .integer(Int64(sequence)), .integer(time), .text(record.action), .text(record.result),
                record.person.map { .text($0) } ?? .null, record.method.map { .text($0) } ?? .null,
                record.callerUID.map { .integer(Int64($0)) } ?? .null,
                record.callerPID.map { .integer(Int64($0)) } ?? .null,
                record.service.map { .text($0) } ?? .null, record.detail.map { .text($0) } ?? .null, .blob(mac),
            ])
        try db.query(
            "INSERT INTO meta (key, value) VALUES ('audit_head', ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [.blob(Array(String(sequence).utf8) + [0] + mac)])
        pendingHead = AuditHeadMark(sequence: sequence, mac: mac)
        return AuditEntry(sequence: sequence, timeMicroseconds: time, record: record, mac: mac)
    }

    /// The effects of one authentication in one durable commit: the person's failure counters,
    /// the unlock time when it succeeded, and its audit entry. One fsync on the unlock path
    /// instead of three, and no state where the counters moved but the audit did not.
    ///
    /// A failure is durable before this returns, so that no crash or power cut can erase a failed
    /// attempt from the counters. A success (`unlockedAt` set) does not wait for `fsync`; the
    /// WAL is synced in the background straight after. Losing it in a power cut within those
    /// moments is harmless: the counters keep their earlier, higher values, the last-unlock time
    /// is older, and the audit chain simply ends one entry earlier (it stays valid), and a
    /// passcode check it finishes (`finishingPasscodeCheck`) is found unfinished at the next
    /// start, which keeps it counted as the failure the counters still hold.
    public func recordAuthentication(
        of person: StoredPerson, failures: CredentialFailureState, unlockedAt: Date?, audit record: AuditRecord,
        now: Date, finishingPasscodeCheck: Bool = false
    ) throws(StoreError) -> AuditEntry {
        let write = { (db: SQLiteConnection) throws -> AuditEntry in
            try self.checkPersonRow(person.id, in: db)
            if finishingPasscodeCheck { try self.finishPasscodeCheck(person.id, in: db) }
            try db.query(
                "UPDATE people SET passcode_failures = ?, passcode_locked_until = ?, passcode_hard_locked = ?, fingerprint_failures = ?, last_unlock_at = COALESCE(?, last_unlock_at), updated_at = ? WHERE id = ?",
                [
                    .integer(Int64(failures.passcodeFailures)),
                    failures.passcodeLockedUntil.map { .real($0.timeIntervalSince1970) } ?? .null,
                    .integer(failures.passcodeHardLocked ? 1 : 0), .integer(Int64(failures.fingerprintFailures)),
                    unlockedAt.map { .real($0.timeIntervalSince1970) } ?? .null, .real(now.timeIntervalSince1970),
                    .integer(person.id),
                ])
            guard db.changes == 1 else { throw StoreError(.noSuchPerson(person.name.rawValue)) }
            try self.resealPersonRow(person.id, in: db)
            return try self.appendAudit(record, now: now, in: db)
        }
        // Only a success that tightens nothing may skip the wait.
        let stored = person.failures
        let relaxesOnly =
            unlockedAt != nil && failures.passcodeFailures <= stored.passcodeFailures
            && failures.fingerprintFailures <= stored.fingerprintFailures
            && (!failures.passcodeHardLocked || stored.passcodeHardLocked)
            && (failures.passcodeLockedUntil ?? .distantPast) <= (stored.passcodeLockedUntil ?? .distantPast)
        return relaxesOnly ? try deferredSyncTransaction(write) : try transaction(write)
    }

    func decodeAudit(_ row: SQLRow) -> AuditEntry {
        AuditEntry(
            sequence: row["seq"].int ?? 0,
            timeMicroseconds: Int64(row["time_us"].int ?? 0),
            record: AuditRecord(
                action: row["action"].string ?? "", result: row["result"].string ?? "", person: row["person"].string,
                method: row["method"].string, callerUID: row["caller_uid"].int, callerPID: row["caller_pid"].int,
                service: row["service"].string, detail: row["detail"].string),
            mac: row["mac"].bytes ?? [])
    }

    /// Audit entries after `sequence`, oldest first, at most `limit`: the first `limit` of them,
    /// or with `newest` the last `limit` (as `journalctl -n` shows the end of the journal).
    public func auditEntries(
        after sequence: Int = 0, limit: Int = 1000, newest: Bool = false
    ) throws(StoreError) -> [AuditEntry] {
        try locked {
            try connection.query(
                newest
                    ? "SELECT * FROM (SELECT * FROM audit WHERE seq > ? ORDER BY seq DESC LIMIT ?) ORDER BY seq"
                    : "SELECT * FROM audit WHERE seq > ? ORDER BY seq LIMIT ?",
                [.integer(Int64(sequence)), .integer(Int64(limit))]
            ).map(decodeAudit)
        }
    }

    /// Number of audit entries and the head MAC, as bytes (hex only where it is shown).
    public func auditHead() throws(StoreError) -> (events: Int, mac: [UInt8]) {
        try locked {
            let row = try connection.query("SELECT seq, mac FROM audit ORDER BY seq DESC LIMIT 1").first
            return (row?["seq"].int ?? 0, row?["mac"].bytes ?? [])
        }
    }

    /// Recomputes the chain from its genesis: an edited, deleted, inserted or reordered entry, a
    /// recomputed MAC without the key, or a head that disagrees with the recorded one is found.
    /// Truncating the newest entries together with the recorded head is only visible against a
    /// head kept elsewhere: pass the one from the journal as `expectedHead`.
    public func verifyAudit(
        expectedHead: (sequence: Int, macHex: String)? = nil
    ) throws(StoreError) -> AuditChainVerification {
        try verifyAudit(
            trustedHead: expectedHead.map { AuditHeadMark(sequence: $0.sequence, mac: Hex.decode($0.macHex) ?? []) })
    }

    /// Recomputes the chain from its genesis and compares its end with the head anchor beside
    /// the database and, when given, a head from a trusted copy (the journal's `audit_seq` and
    /// `audit_head`). Either may be behind the chain's end (the chain grew since), but the
    /// chain's entry at their sequence must carry their MAC; a head beyond the chain's end, or
    /// whose entry has another MAC, means the chain was truncated or rolled back.
    public func verifyAudit(
        trustedHead: AuditHeadMark?, chunkSize: Int = 2048
    ) throws(StoreError) -> AuditChainVerification {
        defer { releaseCacheMemory() }  // it read the whole trail through the page cache
        let genesis = self.genesis
        let anchorReading = anchor.read()
        var anchored: AuditHeadMark?
        var watched: [Int: [UInt8]] = [:]
        switch anchorReading {
        case .head(let head):
            anchored = head
            watched[head.sequence] = []
        case .missing, .invalid:
            break
        }
        if let trustedHead { watched[trustedHead.sequence] = [] }
        var previous = genesis
        var expectedSequence = 1
        var count = 0
        var head: [UInt8] = []
        var recorded: [UInt8]?
        var lastSeen: Int64?
        // One chunk of entries at a time under the store lock, so a long trail never holds up
        // the calls being served. The chain only grows at its end, so the chunks join up; the
        // last chunk and the head recorded in `meta` are read under one lock, so they agree.
        while true {
            let chunk = try locked { () throws -> (rows: [SQLRow], recorded: [UInt8]?, isLast: Bool) in
                let rows =
                    try lastSeen.map {
                        try connection.query(
                            "SELECT * FROM audit WHERE seq > ? ORDER BY seq LIMIT ?",
                            [.integer($0), .integer(Int64(chunkSize))])
                    }
                    ?? connection.query("SELECT * FROM audit ORDER BY seq LIMIT ?", [.integer(Int64(chunkSize))])
                guard rows.count < chunkSize else { return (rows, nil, false) }
                let recorded = try connection.query("SELECT value FROM meta WHERE key = 'audit_head'").first?["value"]
                    .bytes
                return (rows, recorded, true)
            }
            for row in chunk.rows {
                let entry = decodeAudit(row)
                lastSeen = Int64(entry.sequence)
                if entry.sequence != expectedSequence {
                    return AuditChainVerification(
                        isValid: false, events: count, head: head, brokenAt: expectedSequence,
                        reason: "entry \(expectedSequence) is missing")
                }
                let expected = mac(
                    previous: previous, sequence: entry.sequence, timeMicroseconds: entry.timeMicroseconds,
                    record: entry.record)
                guard expected == entry.mac else {
                    return AuditChainVerification(
                        isValid: false, events: count, head: head, brokenAt: entry.sequence,
                        reason:
                            "entry \(entry.sequence) does not match its MAC (edited, or the chain was recomputed without the key)"
                    )
                }
                previous = entry.mac
                if watched[entry.sequence] != nil { watched[entry.sequence] = entry.mac }
                head = entry.mac
                count += 1
                expectedSequence += 1
            }
            if chunk.isLast {
                recorded = chunk.recorded
                break
            }
        }
        if let recorded {
            let parts = recorded.split(separator: 0, maxSplits: 1)
            let recordedSequence = Int(String(decoding: parts.first ?? [], as: UTF8.self)) ?? -1
            let recordedMac = parts.count > 1 ? Array(parts[1]) : []
            if recordedSequence != count || (count > 0 && recordedMac != previous) {
                return AuditChainVerification(
                    isValid: false, events: count, head: head, brokenAt: min(count + 1, recordedSequence),
                    reason:
                        "the chain ends at entry \(count) but its recorded head is entry \(recordedSequence): entries were deleted"
                )
            }
        } else if count > 0 {
            return AuditChainVerification(
                isValid: false, events: count, head: head, brokenAt: 1, reason: "the recorded head is missing"
            )
        }
        switch anchorReading {
        case .missing:
            return AuditChainVerification(
                isValid: false, events: count, head: head, brokenAt: count + 1,
                reason: "the head anchor (\(AuditAnchor.fileName)) is missing: the chain may have been truncated")
        case .invalid:
            return AuditChainVerification(
                isValid: false, events: count, head: head, brokenAt: count + 1,
                reason:
                    "the head anchor (\(AuditAnchor.fileName)) does not check out (edited, or another store's)")
        case .head: break
        }
        func check(_ mark: AuditHeadMark, against what: String) -> AuditChainVerification? {
            if mark.sequence > count {
                return AuditChainVerification(
                    isValid: false, events: count, head: head, brokenAt: count + 1,
                    reason:
                        "\(what) is entry \(mark.sequence) but the chain ends at entry \(count): truncated or rolled back"
                )
            }
            if mark.sequence > 0, watched[mark.sequence] != mark.mac {
                return AuditChainVerification(
                    isValid: false, events: count, head: head, brokenAt: mark.sequence,
                    reason:
                        "entry \(mark.sequence) has another MAC than \(what) records: the chain was rolled back or replaced"
                )
            }
            return nil
        }
        if let anchored, let failure = check(anchored, against: "the head anchor (\(AuditAnchor.fileName))") {
            return failure
        }
        if let trustedHead, let failure = check(trustedHead, against: "the trusted head") {
            return failure
        }
        return AuditChainVerification(isValid: true, events: count, head: head, brokenAt: nil, reason: nil)
    }
}

/// What the check before serving found.
public struct StoreStartupCheck: Sendable, Equatable {
    /// The audit chain's last entry.
    public var events: Int
    /// The entry the tail check started from (the anchored head, a sealed checkpoint).
    public var checkedFrom: Int
}

extension Store {
    /// The tables `PRAGMA quick_check` covers before serving: the small ones of fixed size (the
    /// store's keys and identity, terminal-wide values). Their size never grows with the people
    /// or the trail.
    static let startupCheckedTables = ["meta", "terminal_state"]

    /// The tables `PRAGMA quick_check` covers in the sweep after start-up (`verifyRows`): they
    /// grow with the people, their codes and sessions. The audit trail is not among them: its
    /// size would make the sweep grow with it (`audit verify` checks the whole chain).
    static let sweptTables = ["people", "secrets", "fingers", "sessions", "activation_codes", "outbox"]

    /// The check before serving, in time that grows with neither the people nor the audit
    /// trail: `PRAGMA quick_check` on the fixed-size tables, the row MAC of every terminal-wide
    /// value, and the chain from the anchored entry (its MAC is the anchor's, a sealed
    /// checkpoint) to the end, which must also be the head recorded in the database. The store
    /// key was checked and the anchor compared with the chain when the store was opened. Any
    /// failure is `StoreError.Code.integrity` naming what is wrong.
    ///
    /// What grows with the people is swept by `verifyRows` once the daemon serves, and checked
    /// again wherever it is used: every person row's MAC when it is read, every sealed secret and
    /// template when it is opened, every code, session and terminal row's MAC when read, a row
    /// found through an index against the key it was looked up by, and damage to the file where
    /// SQLite reads it (all `StoreIntegrity`).
    public func verifyAtStart() throws(StoreError) -> StoreStartupCheck {
        let genesis = self.genesis
        let anchored = anchor.lastHead ?? AuditHeadMark(sequence: 0, mac: [])
        return try locked { () throws -> StoreStartupCheck in
            do {
                try quickCheck(Self.startupCheckedTables)
                try checkRows(Self.terminalStateTable, where: "1", [], in: connection)
                // The tail of the chain, from the sealed checkpoint the anchor holds.
                // The anchored entry itself is recomputed too (from the stored MAC before it), so
                // an edit of its content is found although its MAC column is untouched.
                var previous = genesis
                if anchored.sequence > 1 {
                    previous =
                        try connection.query(
                            "SELECT mac FROM audit WHERE seq = ?", [.integer(Int64(anchored.sequence - 1))]
                        ).first?["mac"].bytes ?? []
                }
                var expected = max(1, anchored.sequence)
                for row in try connection.query(
                    "SELECT * FROM audit WHERE seq >= ? ORDER BY seq", [.integer(Int64(expected))])
                {
                    let entry = decodeAudit(row)
                    guard entry.sequence == expected else {
                        throw StoreError(.integrity("audit entry \(expected) is missing"))
                    }
                    guard
                        mac(
                            previous: previous, sequence: entry.sequence, timeMicroseconds: entry.timeMicroseconds,
                            record: entry.record) == entry.mac
                    else {
                        throw StoreError(.integrity("audit entry \(entry.sequence) does not match its MAC"))
                    }
                    if entry.sequence == anchored.sequence, entry.mac != anchored.mac {
                        throw StoreError(.integrity("audit entry \(entry.sequence) is not the one the anchor records"))
                    }
                    previous = entry.mac
                    expected += 1
                }
                let end = expected - 1
                let recorded = try connection.query("SELECT value FROM meta WHERE key = 'audit_head'").first?["value"]
                    .bytes
                if end > 0 || recorded != nil {
                    let parts = (recorded ?? []).split(separator: 0, maxSplits: 1)
                    let recordedSequence = Int(String(decoding: parts.first ?? [], as: UTF8.self)) ?? -1
                    guard recordedSequence == end, parts.count > 1, Array(parts[1]) == previous else {
                        throw StoreError(
                            .integrity(
                                "the audit chain ends at entry \(end) but the head recorded in the database is entry \(recordedSequence)"
                            ))
                    }
                }
                return StoreStartupCheck(events: end, checkedFrom: anchored.sequence)
            } catch let error as SQLiteError where error.isCorrupt {
                throw StoreError(.integrity("the database file is damaged: \(error.message)"))
            }
        }
    }

    /// `PRAGMA quick_check` on each of `tables`, with the store's lock held.
    private func quickCheck(_ tables: [String]) throws {
        for table in tables {
            let rows = try connection.query("PRAGMA quick_check(\(table))")
            let answer = rows.compactMap { $0["quick_check"].string }
            guard answer == ["ok"] else {
                throw StoreError(
                    .integrity("PRAGMA quick_check(\(table)): \(answer.first ?? "no answer") (the file is damaged)"))
            }
        }
    }

    /// The sweep of everything that grows with the people, run once the daemon serves:
    /// `PRAGMA quick_check` on the tables that hold them, every row MAC (people, activation
    /// codes, sessions), and every sealed secret and template opens. Each step takes the store's
    /// lock on its own, so calls are served between them. Returns the rows checked. Any failure
    /// is `StoreError.Code.integrity` naming what is wrong, as before serving; everything swept
    /// here is also checked where it is used, so nothing served before the sweep ends relied on
    /// it unchecked.
    @discardableResult
    public func verifyRows() throws(StoreError) -> Int {
        defer { releaseCacheMemory() }  // it read every row through the page cache
        var checked = 0
        for table in Self.sweptTables {
            try locked { try quickCheck([table]) }
        }
        try locked {
            for row in try connection.query("SELECT \(Self.personColumns) FROM people") {
                _ = try decodePerson(row)
                checked += 1
            }
        }
        for table in [Self.activationCodesTable, Self.sessionsTable] {
            try locked {
                for row in try connection.query("SELECT \(table.selectList) FROM \(table.name)") {
                    try checkRow(table, row)
                    checked += 1
                }
            }
        }
        try locked {
            for row in try connection.query(
                "SELECT s.person_id, s.kind, s.sealed, p.name FROM secrets s JOIN people p ON p.id = s.person_id")
            {
                let name = try LoginName(row["name"].string ?? "")
                let binding = Self.secretBinding(
                    personID: Int64(row["person_id"].int ?? 0), name: name, kind: row["kind"].string ?? "")
                guard let sealed = row["sealed"].bytes else {
                    throw StoreError(.integrity("\(binding): the sealed value is not a blob"))
                }
                _ = try sealer.open(sealed, binding: binding)
                checked += 1
            }
        }
        try locked {
            for row in try connection.query(
                "SELECT f.person_id, f.finger, f.template, p.name FROM fingers f JOIN people p ON p.id = f.person_id")
            {
                let name = try LoginName(row["name"].string ?? "")
                let binding = Self.fingerBinding(
                    personID: Int64(row["person_id"].int ?? 0), name: name, finger: row["finger"].string ?? "")
                guard let sealed = row["template"].bytes else {
                    throw StoreError(.integrity("\(binding): the sealed template is not a blob"))
                }
                _ = try sealer.open(sealed, binding: binding)
                checked += 1
            }
        }
        return checked
    }

    /// Gives back the memory of the pages a pass over every row left in SQLite's page cache (up
    /// to 2 MiB, SQLite's default, held for the life of the connection); the pages calls use are
    /// read again as they are used, from the kernel's page cache. Called after the sweep and
    /// after verifying the whole audit chain. The allocator keeps the freed memory until it is
    /// trimmed (`MemoryBounds`).
    public func releaseCacheMemory() {
        try? locked { connection.releaseMemory() }
    }

    /// The heap memory SQLite's page cache holds now (for tests).
    var pageCacheBytes: Int { (try? locked { connection.pageCacheBytes }) ?? 0 }
}
