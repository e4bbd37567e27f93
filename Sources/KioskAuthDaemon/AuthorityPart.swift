import FoundationEssentials
import KioskAuthCore
import KioskAuthFingerprint
import KioskAuthProtocol
import KioskAuthStore
import Logging

/// One of the authority's parts. Each reaches the shared context, and through these helpers the
/// store, the clocks, access control, the audit trail and the ticket book, in the same words.
@AuthorityActor
protocol AuthorityPart: AnyObject {
    var context: AuthorityContext { get }
}

extension AuthorityPart {
    typealias Ticket = LoginTicket

    var store: Store { context.store }
    var configuration: DaemonConfiguration { context.configuration }
    var logger: Logger { context.logger }
    var now: @Sendable () -> Date { context.now }
    var services: OnlineServices { context.services }
    var reader: FingerprintReader? { context.reader }
    var access: AccessControl { context.access }
    var groups: AccessGroups { context.access.groups }
    var loginPolicy: LoginContextPolicy { context.access.loginPolicy }

    // MARK: Time

    func steadyNow(_ given: ClockReading? = nil) -> Date { context.steadyNow(given) }
    func checkpointSteadyClock(_ reading: ClockReading) { context.checkpointSteadyClock(reading) }
    func wallTime(ofSteady time: Date) -> Date { context.wallTime(ofSteady: time) }

    func terminalValue<T: Decodable>(
        _ type: T.Type, forKey key: String, caller: Caller?, action: AuditAction
    ) throws(APIError) -> T? {
        try context.terminalValue(type, forKey: key, caller: caller, action: action)
    }

    func saveTerminalValue(_ value: some Encodable, forKey key: String, action: AuditAction, caller: Caller? = nil) {
        context.saveTerminalValue(value, forKey: key, action: action, caller: caller)
    }

    nonisolated static func timestamp(_ date: Date) -> String {
        ISO8601.string(date)
    }

    // MARK: The audit trail

    func audit(
        _ caller: Caller?, action: AuditAction, result: AuditResult, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil
    ) {
        context.trail.audit(
            caller, action: action, result: result, person: person, method: method, service: service, detail: detail)
    }

    func withStore<T>(
        _ caller: Caller?, action: AuditAction, person: String? = nil, _ body: () throws(StoreError) -> T
    ) throws(APIError) -> T {
        try context.trail.withStore(caller, action: action, person: person, body)
    }

    func failStore(_ caller: Caller, _ action: AuditAction, _ error: StoreError) throws(APIError) -> APIError {
        try context.trail.failStore(caller, action, error)
    }

    func audited<T>(_ body: (AuditedTransaction) throws(StoreError) -> T) throws(StoreError) -> T {
        try context.trail.audited(body)
    }

    func audited<T>(
        _ caller: Caller?, action: AuditAction, person: String? = nil,
        _ body: (AuditedTransaction) throws(StoreError) -> T
    ) throws(APIError) -> T {
        try context.trail.audited(caller, action: action, person: person, body)
    }

    @discardableResult
    func recordAuthentication(
        _ caller: Caller, person: StoredPerson, failures: CredentialFailureState, unlocked: Bool,
        action: AuditAction, result: AuditResult, method: String, service: String?, detail: String? = nil,
        finishingPasscodeCheck: Bool = false
    ) throws(APIError) -> StoredPerson {
        try context.trail.recordAuthentication(
            caller, person: person, failures: failures, unlocked: unlocked, action: action, result: result,
            method: method, service: service, detail: detail, finishingPasscodeCheck: finishingPasscodeCheck)
    }

    /// "; logind: …" for the audit trail, when the module said what logind knows.
    static func logindNote(_ context: CallerContext?) -> String {
        guard let logind = context?.logind, !logind.isEmpty else { return "" }
        return "; logind: \(logind.prefix(80))"
    }

    // MARK: Access control

    func isSelf(_ caller: Caller, _ person: StoredPerson) -> Bool { access.isSelf(caller, person) }

    func requireAdmin(_ caller: Caller, action: AuditAction, person: String? = nil) throws(APIError) {
        guard access.isAdmin(caller) else {
            audit(caller, action: action, result: .refused, person: person, detail: "caller is not an admin")
            throw APIError.permissionDenied("\(action) needs root or membership in \(access.adminGroup)")
        }
    }

    /// Refuses, audits and throws `AccountNotAllowed` when `person` may not log in to the Unix
    /// account at stake (see `AccessControl.accountLoginRefusal`).
    func requireAccountAllowed(
        _ caller: Caller, _ person: StoredPerson, context: CallerContext?, action: AuditAction, method: String?
    ) throws(APIError) {
        guard let reason = access.accountLoginRefusal(person, context?.loginContext) else { return }
        audit(
            caller, action: action, result: .refused, person: person.name.rawValue, method: method,
            service: context?.service, detail: reason + Self.logindNote(context))
        throw APIError.own("AccountNotAllowed", ["name": .string(person.name.rawValue), "reason": .string(reason)])
    }

    // MARK: The ticket book

    func issueTicket(
        for person: StoredPerson, caller: Caller, purpose: TicketPurpose = .selfService, startedAt: ClockReading? = nil,
        issuedAt: ClockReading? = nil, expires: Date? = nil
    ) -> String {
        let reading = services.clock.reading()
        let current = steadyNow(reading)
        return context.tickets.issue(
            LoginTicket(
                personID: person.id, connectionID: caller.connectionID,
                expires: expires ?? loginPolicy.ticketExpiry(issuedAt: current), purpose: purpose,
                startedAt: startedAt ?? reading, issuedAt: issuedAt ?? reading),
            now: current)
    }

    /// Single use; bound to the person and the connection that earned it.
    func consumeTicket(_ ticket: String, person: StoredPerson, caller: Caller) -> Bool {
        takeTicket(ticket, person: person, caller: caller) != nil
    }

    /// Consumes a self-service ticket and returns it when it is valid for `person` on the
    /// caller's connection. A ticket presented wrongly dies too.
    func takeTicket(_ ticket: String, person: StoredPerson, caller: Caller) -> Ticket? {
        context.tickets.take(ticket, personID: person.id, connectionID: caller.connectionID, now: steadyNow())
    }

    /// Whether a self-service ticket is valid for this person and connection, without using it up.
    func isValidTicket(_ ticket: String, person: StoredPerson, caller: Caller) -> Bool {
        context.tickets.isValid(ticket, personID: person.id, connectionID: caller.connectionID, now: steadyNow())
    }

    /// The person and code an activation ticket is for, without using it up.
    func peekActivationTicket(_ ticket: String, caller: Caller) -> (personID: Int64, codeID: Int64)? {
        context.tickets.peekActivation(ticket, connectionID: caller.connectionID, now: steadyNow())
    }

    /// Uses up an activation ticket.
    func consumeActivationTicket(_ ticket: String, caller: Caller) -> (personID: Int64, codeID: Int64)? {
        context.tickets.consumeActivation(ticket, connectionID: caller.connectionID, now: steadyNow())
    }

    // MARK: People

    func loginName(_ text: String) throws(APIError) -> LoginName {
        do { return try LoginName(text) } catch { throw APIError.invalidInput("name", error.message) }
    }

    func existingPerson(_ name: LoginName, caller: Caller?, action: AuditAction) throws(APIError) -> StoredPerson {
        guard
            let person = try withStore(
                caller, action: action, person: name.rawValue,
                { () throws(StoreError) in try store.person(named: name) })
        else {
            throw APIError.noSuchPerson(name.rawValue)
        }
        return person
    }

    /// The person `name` for a caller about to act on them. A `privileged` caller (for this
    /// action) learns whether the person exists (`NoSuchPerson`); anyone else may act only on the
    /// person bound to their own uid, and gets the same `PermissionDenied` whether `name` is
    /// somebody else or nobody, so that names cannot be enumerated. Refusals are audited.
    func authorisedPerson(
        _ name: LoginName, caller: Caller, action: AuditAction, privileged: Bool, refusal: String
    ) throws(APIError) -> StoredPerson {
        if privileged { return try existingPerson(name, caller: caller, action: action) }
        let person = try withStore(caller, action: action, person: name.rawValue) { () throws(StoreError) in
            try store.person(named: name)
        }
        guard let person, isSelf(caller, person) else {
            audit(caller, action: action, result: .refused, person: name.rawValue, detail: "not the caller's person")
            throw APIError.permissionDenied(refusal)
        }
        return person
    }

    func record(_ person: StoredPerson) -> PersonRecord {
        var record = PersonRecord(
            name: person.name.rawValue, displayName: person.displayName, primaryRole: person.roles.primary.rawValue,
            roles: person.roles.all.map(\.rawValue), origin: person.origin.rawValue,
            state: person.state.rawValue.replacing("-", with: "_"), uid: access.boundUID(person),
            hasPasscode: person.hasPasscode, fingers: person.fingers,
            passcodeFailures: person.failures.passcodeFailures,
            passcodeLockedUntil: person.failures.passcodeLockedUntil.flatMap {
                $0 > steadyNow() ? Self.timestamp(wallTime(ofSteady: $0)) : nil
            },
            passcodeHardLocked: person.failures.passcodeHardLocked,
            fingerprintFailures: person.failures.fingerprintFailures,
            createdAt: Self.timestamp(person.createdAt), lastUnlockAt: person.lastUnlockAt.map { Self.timestamp($0) })
        record.staleBinding = access.staleBinding(person)
        let missing = missingFromSensor(person)
        record.fingersMissingFromSensor = missing.isEmpty ? nil : missing
        addIdentityProviderFields(to: &record, of: person)
        return record
    }

    /// Those of the person's fingers the storage reader lacked at its last reconciliation.
    func missingFromSensor(_ person: StoredPerson) -> [String] {
        guard let missing = context.fingersMissingFromSensor[person.id] else { return [] }
        return person.fingers.filter(missing.contains)
    }

    /// Adds the identity-provider fields to a person record.
    func addIdentityProviderFields(to record: inout PersonRecord, of person: StoredPerson) {
        guard let profile = try? store.identityProviderProfile(of: person) else { return }
        record.biometricOffer = profile.isBiometricOfferEnabled
        guard person.origin == .idp else { return }
        record.email = profile.email
        record.suspendedReason = profile.suspendedReason
        record.lastOnlineContactAt = profile.contact.map { Self.timestamp($0.reading.wall) }
    }
}
