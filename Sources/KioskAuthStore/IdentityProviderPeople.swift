public import FoundationEssentials
public import KioskAuthCore

/// What the store keeps about a person's link with the identity provider. Local people have
/// an empty profile (only the biometric offer applies to them).
public struct IdentityProviderProfile: Sendable, Equatable {
    /// The email address the provider sent at the last online login.
    public var email: String?
    /// The provider's stable identifier for the person (`sub`).
    public var subject: String?
    /// The person's last successful contact with the provider (offline window).
    public var contact: OfflineWindow.Contact?
    /// Whether fingerprint enrolment may be offered after an online login; false once declined.
    public var isBiometricOfferEnabled: Bool
    /// Why local unlock is suspended until the next online login, if it is.
    public var suspendedReason: String?
    /// The refresh schedule's persisted record.
    public var refresh: RefreshRecord?
}

/// What an online login changes, written in one transaction.
public struct OnlineLogin: Sendable {
    /// The provider's `sub`.
    public var subject: String
    /// The email address, if the provider sent one.
    public var email: String?
    /// Names to try, in order, when the person is created (the first one free is taken).
    public var candidateNames: [LoginName]
    /// Display name for a new person.
    public var displayName: String
    /// Roles from the role claim, the first primary.
    public var roles: RoleSet
    /// The contact to record (starts a new offline window).
    public var contact: OfflineWindow.Contact
    /// The refresh token to seal, if the provider issued one.
    public var refreshToken: [UInt8]?
    /// The refresh record to persist, when a refresh token was issued.
    public var refresh: RefreshRecord?

    /// Creates the change set.
    public init(
        subject: String, email: String?, candidateNames: [LoginName], displayName: String, roles: RoleSet,
        contact: OfflineWindow.Contact, refreshToken: [UInt8]?, refresh: RefreshRecord?
    ) {
        self.subject = subject
        self.email = email
        self.candidateNames = candidateNames
        self.displayName = displayName
        self.roles = roles
        self.contact = contact
        self.refreshToken = refreshToken
        self.refresh = refresh
    }
}

extension Store {
    /// The kind under which a person's refresh token is sealed in `secrets`.
    public static let refreshTokenKind = "refresh-token"

    private static func encodeJSON(_ value: some Encodable) throws -> String {
        String(decoding: try JSONEncoder().encode(value), as: UTF8.self)
    }

    private static func decodeJSON<T: Decodable>(_ type: T.Type, _ text: String?) -> T? {
        guard let text else { return nil }
        return try? JSONDecoder().decode(type, from: Data(text.utf8))
    }

    /// A person's identity-provider profile.
    public func identityProviderProfile(of person: StoredPerson) throws(StoreError) -> IdentityProviderProfile {
        let row = try locked {
            try connection.query(
                "SELECT id, email, \(Self.peopleMACColumns), mac FROM people WHERE id = ?", [.integer(person.id)]
            ).first
        }
        guard let row else { throw StoreError(.noSuchPerson(person.name.rawValue)) }
        try checkPersonRow(row)
        return IdentityProviderProfile(
            email: row["email"].string, subject: row["idp_subject"].string,
            contact: Self.decodeJSON(OfflineWindow.Contact.self, row["idp_contact"].string),
            isBiometricOfferEnabled: !["declined", "offered"].contains(row["biometric_offer"].string ?? "on"),
            suspendedReason: row["suspended_reason"].string,
            refresh: Self.decodeJSON(RefreshRecord.self, row["refresh_state"].string))
    }

    /// The person the provider knows by `subject`, if any.
    public func person(withSubject subject: String) throws(StoreError) -> StoredPerson? {
        let name = try locked {
            try connection.query("SELECT name FROM people WHERE idp_subject = ?", [.text(subject)]).first?["name"]
                .string
        }
        guard let name else { return nil }
        do { return try person(named: try LoginName(name)) } catch {
            throw StoreError(.integrity("bad name in people row"))
        }
    }

    /// Every person who came from the identity provider, with their profile.
    public func identityProviderPeople() throws(StoreError) -> [(
        person: StoredPerson, profile: IdentityProviderProfile
    )] {
        var result: [(person: StoredPerson, profile: IdentityProviderProfile)] = []
        for person in try people() where person.origin == .idp {
            result.append((person, try identityProviderProfile(of: person)))
        }
        return result
    }

    /// Records a successful online login in one durable transaction: creates the person (origin
    /// idp) on first login, or updates roles and email; activates them and clears any
    /// suspension; records the contact; clears passcode and fingerprint failures (an online
    /// login proves more than a passcode); seals the refresh token beside its refresh record.
    /// Returns the person and whether they were created.
    public func recordOnlineLogin(
        _ login: OnlineLogin, now: Date
    ) throws(StoreError) -> (person: StoredPerson, created: Bool) {
        let (name, created) = try transaction { db -> (LoginName, Bool) in
            var created = false
            var personID: Int64
            var name: LoginName
            if let row = try db.query("SELECT id, name FROM people WHERE idp_subject = ?", [.text(login.subject)]).first
            {
                personID = Int64(row["id"].int ?? 0)
                name = try LoginName(row["name"].string ?? "")
            } else {
                var chosen: LoginName?
                for candidate in login.candidateNames
                where try db.query("SELECT id FROM people WHERE name = ?", [.text(candidate.rawValue)]).isEmpty {
                    chosen = candidate
                    break
                }
                guard let chosen else { throw StoreError(.personExists(login.candidateNames.first?.rawValue ?? "")) }
                try db.query(
                    "INSERT INTO people (name, display_name, roles, origin, state, created_at, updated_at, idp_subject) VALUES (?, ?, ?, 'idp', 'active', ?, ?, ?)",
                    [
                        .text(chosen.rawValue), .text(login.displayName),
                        .text(login.roles.all.map(\.rawValue).joined(separator: ",")), .real(now.timeIntervalSince1970),
                        .real(now.timeIntervalSince1970), .text(login.subject),
                    ])
                personID = db.lastInsertRowID
                name = chosen
                created = true
                try resealPersonRow(personID, in: db)
            }
            try checkPersonRow(personID, in: db)
            try db.query(
                """
                UPDATE people SET roles = ?, email = ?, state = 'active', suspended_reason = NULL, idp_contact = ?,
                  refresh_state = ?, passcode_failures = 0, passcode_locked_until = NULL, passcode_hard_locked = 0,
                  fingerprint_failures = 0, updated_at = ?
                WHERE id = ?
                """,
                [
                    .text(login.roles.all.map(\.rawValue).joined(separator: ",")),
                    login.email.map { .text($0) } ?? .null,
                    .text(try Self.encodeJSON(login.contact)),
                    try login.refresh.map { .text(try Self.encodeJSON($0)) } ?? .null,
                    .real(now.timeIntervalSince1970), .integer(personID),
                ])
            try resealPersonRow(personID, in: db)
            try writeRefreshToken(login.refreshToken, personID: personID, name: name, db: db, now: now)
            return (name, created)
        }
        guard let person = try person(named: name) else { throw StoreError(.noSuchPerson(name.rawValue)) }
        return (person, created)
    }

    /// Seals `token` as the person's refresh token (or deletes it when nil), inside `db`'s
    /// transaction.
    private func writeRefreshToken(
        _ token: [UInt8]?, personID: Int64, name: LoginName, db: SQLiteConnection, now: Date
    )
        throws
    {
        guard let token else {
            try db.query(
                "DELETE FROM secrets WHERE person_id = ? AND kind = ?",
                [.integer(personID), .text(Self.refreshTokenKind)])
            return
        }
        let sealed = try sealer.seal(
            token, binding: Self.secretBinding(personID: personID, name: name, kind: Self.refreshTokenKind))
        try db.query(
            "INSERT INTO secrets (person_id, kind, sealed, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT (person_id, kind) DO UPDATE SET sealed = excluded.sealed, updated_at = excluded.updated_at",
            [.integer(personID), .text(Self.refreshTokenKind), .blob(sealed), .real(now.timeIntervalSince1970)])
    }

    /// The person's refresh token, opened; nil when none is stored.
    public func refreshToken(of person: StoredPerson) throws(StoreError) -> [UInt8]? {
        try secret(kind: Self.refreshTokenKind, for: person)
    }

    /// Persists a person's refresh record; with `rotatedToken`, replaces the refresh token in
    /// the same transaction, and with `contact`, records a successful contact too — so a crash
    /// never leaves a new record beside an old token, or the reverse.
    public func saveRefresh(
        _ record: RefreshRecord, rotatedToken: [UInt8]? = nil, contact: OfflineWindow.Contact? = nil,
        for person: StoredPerson, now: Date
    ) throws(StoreError) {
        try transaction { db in
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET refresh_state = ?, updated_at = ? WHERE id = ?",
                    [.text(try Self.encodeJSON(record)), .real(now.timeIntervalSince1970), .integer(person.id)])
                guard db.changes == 1 else { throw StoreError(.noSuchPerson(person.name.rawValue)) }
                if let contact {
                    try db.query(
                        "UPDATE people SET idp_contact = ? WHERE id = ?",
                        [.text(try Self.encodeJSON(contact)), .integer(person.id)])
                }
                if let rotatedToken {
                    try writeRefreshToken(rotatedToken, personID: person.id, name: person.name, db: db, now: now)
                }
            }
        }
    }

    /// Suspends a person's local unlock until their next online login, with the reason.
    public func suspend(_ person: StoredPerson, reason: String, refresh: RefreshRecord?, now: Date) throws(StoreError) {
        try transaction { db in
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET state = 'suspended', suspended_reason = ?, refresh_state = COALESCE(?, refresh_state), updated_at = ? WHERE id = ?",
                    [
                        .text(reason), try refresh.map { .text(try Self.encodeJSON($0)) } ?? .null,
                        .real(now.timeIntervalSince1970),
                        .integer(person.id),
                    ])
                guard db.changes == 1 else { throw StoreError(.noSuchPerson(person.name.rawValue)) }
            }
        }
    }

    /// Turns the fingerprint-enrolment offer on or off (a decline is remembered until re-enabled).
    public func setBiometricOffer(_ enabled: Bool, for person: StoredPerson, now: Date) throws(StoreError) {
        guard try updateBiometricOffer(to: enabled ? "on" : "declined", from: nil, of: person, now: now) else {
            throw StoreError(.noSuchPerson(person.name.rawValue))
        }
    }

    /// Records that fingerprint enrolment was offered to `person` (once: the offer is then off,
    /// as after a decline, until someone turns it back on). False when it was not on.
    public func markBiometricOffered(_ person: StoredPerson, now: Date) throws(StoreError) -> Bool {
        try updateBiometricOffer(to: "offered", from: "on", of: person, now: now)
    }

    /// Sets `biometric_offer` to `value` (only where it is `current`, when given); whether the
    /// row changed.
    private func updateBiometricOffer(
        to value: String, from current: String?, of person: StoredPerson, now: Date
    ) throws(StoreError) -> Bool {
        try transaction { db in
            var changed = false
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET biometric_offer = ?, updated_at = ? WHERE id = ?"
                        + (current == nil ? "" : " AND biometric_offer = ?"),
                    [.text(value), .real(now.timeIntervalSince1970), .integer(person.id)]
                        + (current.map { [.text($0)] } ?? []))
                changed = db.changes == 1
            }
            return changed
        }
    }

    /// Replaces a person's roles (the role claim changed at a refresh).
    public func setRoles(_ roles: RoleSet, for person: StoredPerson, now: Date) throws(StoreError) {
        try transaction { db in
            try updatingPerson(person.id, in: db) {
                try db.query(
                    "UPDATE people SET roles = ?, updated_at = ? WHERE id = ?",
                    [
                        .text(roles.all.map(\.rawValue).joined(separator: ",")), .real(now.timeIntervalSince1970),
                        .integer(person.id),
                    ])
            }
        }
    }
}
