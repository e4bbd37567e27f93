public import FoundationEssentials
public import KioskAuthCore

/// One enrolled finger with its opened template (`fp_print_serialize` bytes). Templates are
/// biometric data: never log them.
public struct StoredFinger: Sendable {
    public var personID: Int64
    public var personName: LoginName
    public var finger: String
    public var template: [UInt8]
    public var createdAt: Date
}

/// The walk-up identify roster: fingers in the order to try, and how many exist beyond it.
public struct Roster: Sendable {
    /// Fingers in trial order, at most the cap.
    public var fingers: [StoredFinger]
    /// Fingers of active people on this terminal in all.
    public var totalFingers: Int
    /// Whether some enrolled fingers were left out by the cap.
    public var isTruncated: Bool { totalFingers > fingers.count }
}

extension Store {
    /// Seals and stores an enrolled finger.
    public func addFinger(_ finger: String, template: [UInt8], for person: StoredPerson, now: Date) throws(StoreError) {
        let binding = Self.fingerBinding(personID: person.id, name: person.name, finger: finger)
        let sealed: [UInt8]
        do { sealed = try sealer.seal(template, binding: binding) } catch {
            throw StoreError(.integrity("sealing failed: \(error)"))
        }
        try transaction { db in
            if try !db.query(
                "SELECT id FROM fingers WHERE person_id = ? AND finger = ?", [.integer(person.id), .text(finger)]
            ).isEmpty {
                throw StoreError(.personExists("\(person.name.rawValue) \(finger)"))
            }
            try db.query(
                "INSERT INTO fingers (person_id, finger, template, created_at) VALUES (?, ?, ?, ?)",
                [.integer(person.id), .text(finger), .blob(sealed), .real(now.timeIntervalSince1970)])
            noteFleetTemplateChange(person.id, finger: finger, added: true)
        }
    }

    private func openFingers(_ rows: [SQLRow]) throws(StoreError) -> [StoredFinger] {
        var fingers: [StoredFinger] = []
        for row in rows {
            guard let sealed = row["template"].bytes, let nameText = row["name"].string,
                let finger = row["finger"].string
            else {
                continue
            }
            let name: LoginName
            do { name = try LoginName(nameText) } catch { throw StoreError(.integrity("bad name in people row")) }
            let personID = Int64(row["person_id"].int ?? 0)
            let template = try sealer.open(
                sealed, binding: Self.fingerBinding(personID: personID, name: name, finger: finger))
            fingers.append(
                StoredFinger(
                    personID: personID, personName: name, finger: finger, template: template,
                    createdAt: Date(timeIntervalSince1970: row["created_at"].double ?? 0)))
        }
        return fingers
    }

    /// A person's fingers, oldest first, opened.
    public func fingers(of person: StoredPerson) throws(StoreError) -> [StoredFinger] {
        let rows = try locked {
            try connection.query(
                "SELECT f.person_id, p.name, f.finger, f.template, f.created_at FROM fingers f JOIN people p ON p.id = f.person_id WHERE f.person_id = ? ORDER BY f.id",
                [.integer(person.id)])
        }
        return try openFingers(rows)
    }

    /// Every enrolled finger on this terminal, opened (duplicate checks, sensor reconciliation).
    public func allFingers() throws(StoreError) -> [StoredFinger] {
        let rows = try locked {
            try connection.query(
                "SELECT f.person_id, p.name, f.finger, f.template, f.created_at FROM fingers f JOIN people p ON p.id = f.person_id ORDER BY f.id"
            )
        }
        return try openFingers(rows)
    }

    /// The identify roster: fingers of active people (and of suspended ones, so that a suspended
    /// person's finger is recognised and they are told to sign in online), people ordered by their most recent
    /// unlock (or, for someone who has not unlocked yet, their most recent enrolment), each
    /// person's fingers newest first; at most `cap` fingers.
    public func roster(cap: Int) throws(StoreError) -> Roster {
        let (rows, total) = try locked { () -> ([SQLRow], Int) in
            let rows = try connection.query(
                """
                SELECT f.person_id, p.name, f.finger, f.template, f.created_at
                FROM fingers f JOIN people p ON p.id = f.person_id
                WHERE p.state IN ('active', 'suspended')
                ORDER BY COALESCE(p.last_unlock_at, (SELECT MAX(g.created_at) FROM fingers g WHERE g.person_id = p.id)) DESC,
                         p.id, f.created_at DESC, f.id DESC
                LIMIT ?
                """, [.integer(Int64(max(cap, 0)))])
            let total =
                try connection.query(
                    "SELECT COUNT(*) AS n FROM fingers f JOIN people p ON p.id = f.person_id WHERE p.state IN ('active', 'suspended')"
                ).first?["n"].int ?? 0
            return (rows, total)
        }
        return Roster(fingers: try openFingers(rows), totalFingers: total)
    }

    /// Removes one finger (or all, when `finger` is nil) and returns the removed templates so
    /// on-sensor copies can be deleted too. Freed pages are zeroed and the WAL truncated.
    @discardableResult
    public func removeFingers(_ finger: String?, of person: StoredPerson) throws(StoreError) -> [StoredFinger] {
        let removed = try fingers(of: person).filter { finger == nil || $0.finger == finger }
        try transaction { db in
            for removedFinger in removed {
                noteFleetTemplateChange(person.id, finger: removedFinger.finger, added: false)
            }
            if let finger {
                try db.query(
                    "DELETE FROM fingers WHERE person_id = ? AND finger = ?", [.integer(person.id), .text(finger)])
            } else {
                try db.query("DELETE FROM fingers WHERE person_id = ?", [.integer(person.id)])
            }
        }
        try checkpointTruncating()
        return removed
    }
}
