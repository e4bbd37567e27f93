import Crypto
public import FoundationEssentials

/// One activation code as stored: only its HMAC under a key derived from the store key, never
/// the code itself.
public struct StoredActivationCode: Sendable, Equatable {
    public var id: Int64
    public var personID: Int64
    public var issuedAt: Date
    public var expiresAt: Date
    public var failures: Int
    public var usedAt: Date?
    public var revokedAt: Date?
}

extension Store {
    /// The MAC a normalized code is stored and looked up by.
    func activationMAC(_ normalizedCode: String) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: Array(normalizedCode.utf8), using: activationKey))
    }

    /// Decodes a row read with `SELECT *`, after checking its MAC.
    func decodeCode(_ row: SQLRow) throws(StoreError) -> StoredActivationCode {
        try checkRow(Self.activationCodesTable, row)
        return StoredActivationCode(
            id: Int64(row["id"].int ?? 0), personID: Int64(row["person_id"].int ?? 0),
            issuedAt: Date(timeIntervalSince1970: row["issued_at"].double ?? 0),
            expiresAt: Date(timeIntervalSince1970: row["expires_at"].double ?? 0), failures: row["failures"].int ?? 0,
            usedAt: row["used_at"].double.map(Date.init(timeIntervalSince1970:)),
            revokedAt: row["revoked_at"].double.map(Date.init(timeIntervalSince1970:)))
    }

    /// Stores a new code for a person; any earlier live code of theirs is revoked in the same
    /// transaction, so at most one code works at a time.
    @discardableResult
    public func issueActivationCode(
        _ normalizedCode: String, for person: StoredPerson, lifetime: TimeInterval, now: Date
    ) throws(StoreError) -> StoredActivationCode {
        let mac = activationMAC(normalizedCode)
        return try transaction { db in
            try revokeLiveCodes(of: person, now: now, in: db)
            try db.query(
                "INSERT INTO activation_codes (person_id, code_mac, issued_at, expires_at) VALUES (?, ?, ?, ?)",
                [
                    .integer(person.id), .blob(mac), .real(now.timeIntervalSince1970),
                    .real(now.addingTimeInterval(lifetime).timeIntervalSince1970),
                ])
            let id = db.lastInsertRowID
            try resealRows(Self.activationCodesTable, where: "id = ?", [.integer(id)], in: db)
            return try decodeCode(try db.query("SELECT * FROM activation_codes WHERE id = ?", [.integer(id)])[0])
        }
    }

    /// The code with this value, live or not (so a reused or replaced code can be told apart
    /// from a wrong one).
    public func activationCode(matching normalizedCode: String) throws(StoreError) -> StoredActivationCode? {
        let mac = activationMAC(normalizedCode)
        return try locked {
            try connection.query(
                "SELECT * FROM activation_codes WHERE code_mac = ? ORDER BY id DESC LIMIT 1", [.blob(mac)]
            )
            .first.map { row throws(StoreError) in try decodeCode(row) }
        }
    }

    /// A person's live code (not used, not revoked), if any.
    public func liveActivationCode(for person: StoredPerson) throws(StoreError) -> StoredActivationCode? {
        try locked {
            try connection.query(
                "SELECT * FROM activation_codes WHERE person_id = ? AND used_at IS NULL AND revoked_at IS NULL ORDER BY id DESC LIMIT 1",
                [.integer(person.id)]
            ).first.map { row throws(StoreError) in try decodeCode(row) }
        }
    }

    /// Counts a wrong try against a code; at `maxFailures` the code is revoked. Durable.
    @discardableResult
    public func recordActivationFailure(
        _ code: StoredActivationCode, maxFailures: Int, now: Date
    ) throws(StoreError)
        -> StoredActivationCode
    {
        try transaction { db in
            try updatingRows(Self.activationCodesTable, where: "id = ?", [.integer(code.id)], in: db) {
                try db.query("UPDATE activation_codes SET failures = failures + 1 WHERE id = ?", [.integer(code.id)])
                try db.query(
                    "UPDATE activation_codes SET revoked_at = ? WHERE id = ? AND failures >= ? AND revoked_at IS NULL",
                    [.real(now.timeIntervalSince1970), .integer(code.id), .integer(Int64(maxFailures))])
            }
            return try decodeCode(try db.query("SELECT * FROM activation_codes WHERE id = ?", [.integer(code.id)])[0])
        }
    }

    /// Revokes a person's live code; returns whether there was one.
    @discardableResult
    public func revokeActivationCode(for person: StoredPerson, now: Date) throws(StoreError) -> Bool {
        try transaction { db in try revokeLiveCodes(of: person, now: now, in: db) > 0 }
    }

    /// Revokes a person's live codes inside `db`'s transaction (rows checked first, resealed
    /// after); returns how many.
    private func revokeLiveCodes(of person: StoredPerson, now: Date, in db: SQLiteConnection) throws -> Int {
        let live = try db.query(
            "SELECT id FROM activation_codes WHERE person_id = ? AND used_at IS NULL AND revoked_at IS NULL",
            [.integer(person.id)])
        for row in live {
            try updatingRows(Self.activationCodesTable, where: "id = ?", [row["id"]], in: db) {
                try db.query(
                    "UPDATE activation_codes SET revoked_at = ? WHERE id = ?",
                    [.real(now.timeIntervalSince1970), row["id"]])
            }
        }
        return live.count
    }

    /// Activates a person with their code: sets the passcode verifier, marks the code used and
    /// the person active, in one transaction (a crash leaves either nothing or all of it).
    public func completeActivation(
        _ code: StoredActivationCode, person: StoredPerson, verifier: PasscodeVerifier, now: Date
    ) throws(StoreError) {
        let plaintext = try JSONEncoder().encodeOrThrow(verifier)
        let sealed: [UInt8]
        do {
            sealed = try sealer.seal(
                plaintext, binding: Self.secretBinding(personID: person.id, name: person.name, kind: "passcode"))
        } catch { throw StoreError(.integrity("sealing failed: \(error)")) }
        try transaction { db in
            try updatingRows(Self.activationCodesTable, where: "id = ?", [.integer(code.id)], in: db) {
                try db.query(
                    "UPDATE activation_codes SET used_at = ? WHERE id = ? AND used_at IS NULL AND revoked_at IS NULL",
                    [.real(now.timeIntervalSince1970), .integer(code.id)])
                guard db.changes == 1 else {
                    throw StoreError(.integrity("the activation code was used or revoked meanwhile"))
                }
            }
            try db.query(
                "INSERT INTO secrets (person_id, kind, sealed, updated_at) VALUES (?, 'passcode', ?, ?) ON CONFLICT (person_id, kind) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
                [.integer(person.id), .blob(sealed), .real(now.timeIntervalSince1970)])
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET state = 'active', has_passcode = 1, passcode_failures = 0, passcode_locked_until = NULL, passcode_hard_locked = 0, updated_at = ? WHERE id = ?",
                    [.real(now.timeIntervalSince1970), .integer(person.id)])
            }
        }
    }

    /// The person with this row id.
    public func person(id: Int64) throws(StoreError) -> StoredPerson? {
        try locked {
            try connection.query("SELECT \(Self.personColumns) FROM people WHERE id = ?", [.integer(id)]).first.map(
                decodePerson)
        }
    }
}

extension Store {
    /// A person's activation codes, oldest first (no code values: those are never stored).
    public func activationCodes(of person: StoredPerson) throws(StoreError) -> [StoredActivationCode] {
        try locked {
            try connection.query(
                "SELECT * FROM activation_codes WHERE person_id = ? ORDER BY id", [.integer(person.id)]
            )
            .map { row throws(StoreError) in try decodeCode(row) }
        }
    }
}
