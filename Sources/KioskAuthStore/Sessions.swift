public import FoundationEssentials
public import KioskAuthCore

/// A session row: who it belongs to and its state machine, as JSON the daemon owns.
public struct StoredSession: Sendable {
    /// The session id.
    public var id: String
    /// The person's row id.
    public var personID: Int64
    /// The person's login name.
    public var personName: LoginName
    /// The daemon's persisted session state (JSON).
    public var state: String
    /// PAM service that opened it, if any.
    public var service: String?
    /// Terminal, if any.
    public var tty: String?
    /// When it opened.
    public var openedAt: Date

    /// Creates a row.
    public init(
        id: String, personID: Int64, personName: LoginName, state: String, service: String?, tty: String?,
        openedAt: Date
    ) {
        self.id = id
        self.personID = personID
        self.personName = personName
        self.state = state
        self.service = service
        self.tty = tty
        self.openedAt = openedAt
    }
}

extension Store {
    /// Records a new session.
    public func insertSession(_ session: StoredSession) throws(StoreError) {
        try transaction { db in
            _ = try db.query(
                "INSERT INTO sessions (id, person_id, state, service, tty, opened_at) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    .text(session.id), .integer(session.personID), .text(session.state),
                    session.service.map { .text($0) } ?? .null, session.tty.map { .text($0) } ?? .null,
                    .real(session.openedAt.timeIntervalSince1970),
                ])
            try resealRows(Self.sessionsTable, where: "id = ?", [.text(session.id)], in: db)
        }
    }

    /// Saves a session's state; with `endReason`, marks it ended.
    public func updateSession(id: String, state: String, endedAt: Date?, endReason: String?) throws(StoreError) {
        try transaction { db in
            try updatingRows(Self.sessionsTable, where: "id = ?", [.text(id)], in: db) {
                _ = try db.query(
                    "UPDATE sessions SET state = ?, ended_at = COALESCE(?, ended_at), end_reason = COALESCE(?, end_reason) WHERE id = ?",
                    [
                        .text(state), endedAt.map { .real($0.timeIntervalSince1970) } ?? .null,
                        endReason.map { .text($0) } ?? .null, .text(id),
                    ])
            }
        }
    }

    /// Sessions that have not ended, oldest first.
    public func openSessions() throws(StoreError) -> [StoredSession] {
        let rows = try locked {
            try connection.query(
                "SELECT s.id, s.person_id, p.name, s.state, s.service, s.tty, s.opened_at, s.ended_at, s.end_reason, s.mac FROM sessions s JOIN people p ON p.id = s.person_id WHERE s.ended_at IS NULL ORDER BY s.opened_at"
            )
        }
        var sessions: [StoredSession] = []
        for row in rows {
            try checkRow(Self.sessionsTable, row)
            guard let name = try? LoginName(row["name"].string ?? "") else { continue }
            sessions.append(
                StoredSession(
                    id: row["id"].string ?? "", personID: Int64(row["person_id"].int ?? 0), personName: name,
                    state: row["state"].string ?? "", service: row["service"].string, tty: row["tty"].string,
                    openedAt: Date(timeIntervalSince1970: row["opened_at"].double ?? 0)))
        }
        return sessions
    }

    /// Deletes sessions that ended before `date` (the audit trail keeps their events).
    public func pruneEndedSessions(before date: Date) throws(StoreError) {
        try transaction { db in
            _ = try db.query(
                "DELETE FROM sessions WHERE ended_at IS NOT NULL AND ended_at < ?", [.real(date.timeIntervalSince1970)])
        }
    }
}
