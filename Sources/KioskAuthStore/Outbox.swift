public import FoundationEssentials

/// One queued delivery to the network (a token revocation), with its secret opened.
public struct OutboxItem: Sendable {
    /// Row id.
    public var id: Int64
    /// What to deliver, e.g. `revoke-refresh-token`.
    public var kind: String
    /// Unique per item; sent along where the receiver supports it, so a retry after a lost
    /// answer is recognised as the same delivery.
    public var idempotencyKey: String
    /// Non-secret details (JSON), e.g. whose token this was.
    public var payload: String?
    /// The sealed secret, opened (a refresh token). Never log it.
    public var secret: [UInt8]?
    /// Failed attempts so far.
    public var attempts: Int
}

/// How the outbox stands, for `kioskauthctl status`.
public struct OutboxSummary: Sendable, Equatable {
    /// Items not yet delivered.
    public var pending: Int
    /// When the last item was delivered.
    public var lastDelivery: Date?
    /// The last error of a pending item, if any.
    public var lastError: String?
}

extension Store {
    /// The outbox kind of a queued refresh-token revocation.
    public static let revokeRefreshTokenKind = "revoke-refresh-token"

    static func outboxBinding(kind: String, key: String) -> SealBinding {
        SealBinding(table: "outbox", column: kind, row: key, owner: "terminal")
    }

    /// Queues the revocation of a person's refresh token, sealed, before the person is removed;
    /// returns false when they have none. Delivered at least once by the refresh service.
    @discardableResult
    public func queueRevocation(of person: StoredPerson, now: Date) throws(StoreError) -> Bool {
        guard let token = try refreshToken(of: person) else { return false }
        try queueRevocation(token: token, ofPersonNamed: person.name.rawValue, now: now)
        return true
    }

    /// Queues the revocation of a refresh token the terminal no longer keeps (one a superseded
    /// refresh rotated in), sealed.
    public func queueRevocation(token: [UInt8], ofPersonNamed name: String, now: Date) throws(StoreError) {
        let key = UUID().uuidString.lowercased()
        let binding = Self.outboxBinding(kind: Self.revokeRefreshTokenKind, key: key)
        let sealed: [UInt8]
        do { sealed = try sealer.seal(token, binding: binding) } catch {
            throw StoreError(.integrity("sealing failed: \(error)"))
        }
        let payload = String(decoding: try JSONEncoder().encodeOrThrow(["person": name]), as: UTF8.self)
        try transaction { db in
            try db.query(
                "INSERT INTO outbox (kind, idempotency_key, payload, sealed, created_at, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    .text(Self.revokeRefreshTokenKind), .text(key), .text(payload), .blob(sealed),
                    .real(now.timeIntervalSince1970), .real(now.timeIntervalSince1970),
                ])
        }
    }

    /// Items due for delivery at `now`, oldest first, their secrets opened. An item whose secret
    /// no longer opens is an integrity failure.
    public func dueOutboxItems(now: Date, limit: Int) throws(StoreError) -> [OutboxItem] {
        let rows = try locked {
            try connection.query(
                "SELECT id, kind, idempotency_key, payload, sealed, attempts FROM outbox WHERE delivered_at IS NULL AND (next_attempt_at IS NULL OR next_attempt_at <= ?) ORDER BY id LIMIT ?",
                [.real(now.timeIntervalSince1970), .integer(Int64(limit))])
        }
        var items: [OutboxItem] = []
        for row in rows {
            let kind = row["kind"].string ?? ""
            let key = row["idempotency_key"].string ?? ""
            var secret: [UInt8]?
            if let sealed = row["sealed"].bytes {
                secret = try sealer.open(sealed, binding: Self.outboxBinding(kind: kind, key: key))
            }
            items.append(
                OutboxItem(
                    id: Int64(row["id"].int ?? 0), kind: kind, idempotencyKey: key, payload: row["payload"].string,
                    secret: secret, attempts: row["attempts"].int ?? 0))
        }
        return items
    }

    /// The earliest time an undelivered item is due, if any.
    public func nextOutboxAttempt() throws(StoreError) -> Date? {
        try locked {
            try connection.query("SELECT MIN(COALESCE(next_attempt_at, 0)) AS t FROM outbox WHERE delivered_at IS NULL")
                .first?["t"].double.map(Date.init(timeIntervalSince1970:))
        }
    }

    /// Marks an item delivered and erases its secret (freed pages are zeroed).
    public func markDelivered(_ id: Int64, now: Date) throws(StoreError) {
        try transaction { db in
            try db.query(
                "UPDATE outbox SET delivered_at = ?, sealed = NULL, last_error = NULL WHERE id = ?",
                [.real(now.timeIntervalSince1970), .integer(id)])
        }
    }

    /// Records a failed attempt and when to try again.
    public func markAttemptFailed(_ id: Int64, error: String, nextAttempt: Date) throws(StoreError) {
        try transaction { db in
            try db.query(
                "UPDATE outbox SET attempts = attempts + 1, last_error = ?, next_attempt_at = ? WHERE id = ?",
                [.text(String(error.prefix(500))), .real(nextAttempt.timeIntervalSince1970), .integer(id)])
        }
    }

    /// Pending count, last delivery and last error.
    public func outboxSummary() throws(StoreError) -> OutboxSummary {
        try locked {
            let pending =
                try connection.query("SELECT COUNT(*) AS n FROM outbox WHERE delivered_at IS NULL").first?["n"].int ?? 0
            let last = try connection.query("SELECT MAX(delivered_at) AS t FROM outbox").first?["t"].double
            let error = try connection.query(
                "SELECT last_error FROM outbox WHERE delivered_at IS NULL AND last_error IS NOT NULL ORDER BY id DESC LIMIT 1"
            ).first?["last_error"].string
            return OutboxSummary(
                pending: pending, lastDelivery: last.map(Date.init(timeIntervalSince1970:)), lastError: error)
        }
    }
}
