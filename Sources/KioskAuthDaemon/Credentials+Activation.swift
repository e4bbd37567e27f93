import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

/// One-time activation of pre-provisioned people: an admin adds the person and hands over a
/// code; at the terminal the person enters it, sets a passcode, may enrol a finger, and is in.
extension CredentialAuthority {
    static let activationLimiterKey = "activation-rate-limit"

    static let expiredMessage = "This code has expired. Ask your coordinator for a new code."
    static let usedMessage =
        "This code has already been used. If you have not activated yet, ask your coordinator for a new code."
    static let revokedMessage = "This code no longer works. Ask your coordinator for a new code."
    static let wrongMessage = "That code is not right. Check it and try again."

    /// A fresh code from the system's random source.
    func makeActivationCode() -> ActivationCode {
        var generator = SystemRandomNumberGenerator()
        return ActivationCode(randomBytes: (0..<5).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    /// Issues a code for a person who is not active yet; the earlier one dies.
    func issueActivationCode(_ caller: Caller, for person: StoredPerson) throws(APIError) -> (ActivationCode, Date) {
        try audited(caller, action: .activationIssue, person: person.name.rawValue) { tx throws(StoreError) in
            try issueActivationCode(tx, caller, for: person)
        }
    }

    /// Issues a code and records it, inside the caller's transaction.
    func issueActivationCode(
        _ tx: AuditedTransaction, _ caller: Caller, for person: StoredPerson
    ) throws(StoreError) -> (ActivationCode, Date) {
        let code = makeActivationCode()
        let stored = try store.issueActivationCode(
            code.normalized, for: person, lifetime: configuration.activation.codeLifetime, now: now())
        try tx.audit(
            caller, action: .activationIssue, result: .success, person: person.name.rawValue,
            method: "activation-code")
        return (code, stored.expiresAt)
    }

    func issueActivationCode(_ caller: Caller, _ name: String) throws(APIError) -> Message.ActivationCodeIssued {
        try requireAdmin(caller, action: .activationIssue, person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: .activationIssue)
        guard person.state == .pendingActivation else {
            throw APIError.own("AlreadyActive", ["name": .string(name.rawValue)])
        }
        let (code, expires) = try issueActivationCode(caller, for: person)
        return Message.ActivationCodeIssued(code: code.description, expiresAt: Self.timestamp(expires))
    }

    func revokeActivationCode(_ caller: Caller, _ name: String) throws(APIError) -> Bool {
        try requireAdmin(caller, action: .activationRevoke, person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: .activationRevoke)
        return try audited(caller, action: .activationRevoke, person: name.rawValue) { tx throws(StoreError) in
            let revoked = try store.revokeActivationCode(for: person, now: now())
            try tx.audit(
                caller, action: .activationRevoke, result: revoked ? .success : .failure, person: name.rawValue,
                method: "activation-code")
            return revoked
        }
    }

    private func activationFailure(
        _ caller: Caller, _ error: APIError, person: String?, service: String?, limiter: inout ActivationRateLimiter,
        detail: String
    ) -> APIError {
        limiter.recordFailure(now: steadyNow())
        saveTerminalValue(limiter, forKey: Self.activationLimiterKey, action: .activationCheck, caller: caller)
        audit(
            caller, action: .activationCheck, result: .failure, person: person, method: "activation-code",
            service: service, detail: detail)
        return error
    }

    func checkActivationCode(
        _ caller: Caller, _ input: Message.CheckActivationCode
    ) throws(APIError) -> Message.Verified {
        let service = input.context?.service
        guard groups.isAuthenticator(caller) else {
            audit(
                caller, action: .activationCheck, result: .refused, method: "activation-code", service: service,
                detail: "caller is not an authenticator")
            throw APIError.permissionDenied(
                "activation at the terminal needs root or membership in \(configuration.access.authenticatorGroup)")
        }
        // The same service rules as passcodes: activation sets one. Never through su/sudo-like
        // services, where the invoking user is somebody else, nor from services not allowed to
        // take passcodes.
        if let service, !loginPolicy.mayActivate(service: service) {
            audit(
                caller, action: .activationCheck, result: .refused, method: "activation-code", service: service,
                detail: "service not allowed")
            throw APIError.own(
                "PasscodeNotAllowed", ["reason": .string("the PAM service \(service) cannot activate accounts")])
        }
        if let context = input.context?.loginContext, let refusal = loginPolicy.remoteRefusal(context, for: .activation)
        {
            audit(
                caller, action: .activationCheck, result: .refused, method: "activation-code", service: service,
                detail: "remote session")
            throw APIError.permissionDenied(refusal)
        }
        let started = now()
        var limiter =
            try terminalValue(
                ActivationRateLimiter.self, forKey: Self.activationLimiterKey, caller: caller,
                action: .activationCheck)
            ?? ActivationRateLimiter(
                maxFailures: configuration.activation.terminalMaxFailures,
                window: configuration.activation.terminalWindow)
        let steady = steadyNow()
        if let until = limiter.pausedUntil(now: steady) {
            audit(
                caller, action: .activationCheck, result: .refused, method: "activation-code", service: service,
                detail: "paused")
            throw APIError.own(
                "ActivationPaused",
                [
                    "message": .string(
                        "Too many wrong codes on this terminal. Wait a few minutes, or ask your coordinator."),
                    "retryAfterSeconds": .number(until.timeIntervalSince(steady).rounded(.up)),
                ])
        }
        let named: StoredPerson?
        if let name = input.name, !name.isEmpty {
            let login = try loginName(name)
            named = try withStore(caller, action: .activationCheck) { () throws(StoreError) in
                try store.person(named: login)
            }
        } else {
            named = nil
        }
        let code: ActivationCode
        do { code = try ActivationCode(parsing: input.code) } catch {
            throw activationFailure(
                caller, APIError.own("ActivationCodeWrong", ["message": .string(Self.wrongMessage)]),
                person: named?.name.rawValue,
                service: service, limiter: &limiter, detail: "malformed code")
        }
        let stored = try withStore(caller, action: .activationCheck) { () throws(StoreError) in
            try store.activationCode(matching: code.normalized)
        }
        guard let stored, named == nil || named?.id == stored.personID else {
            // A wrong code for a named person counts against that person's live code too.
            var remaining: Int?
            if let named, let live = try? store.liveActivationCode(for: named) {
                if let updated = try? store.recordActivationFailure(
                    live, maxFailures: configuration.activation.maxTries, now: started)
                {
                    remaining = max(0, configuration.activation.maxTries - updated.failures)
                }
            }
            var parameters: [String: JSONValue] = ["message": .string(Self.wrongMessage)]
            if let remaining { parameters["remainingTries"] = .number(Double(remaining)) }
            throw activationFailure(
                caller, APIError.own("ActivationCodeWrong", parameters), person: named?.name.rawValue, service: service,
                limiter: &limiter, detail: "wrong code")
        }
        let owner = try withStore(caller, action: .activationCheck) { () throws(StoreError) in
            try store.person(id: stored.personID)
        }
        guard let owner else { throw APIError.own("ActivationCodeRevoked", ["message": .string(Self.revokedMessage)]) }
        if stored.usedAt != nil {
            throw activationFailure(
                caller, APIError.own("ActivationCodeUsed", ["message": .string(Self.usedMessage)]),
                person: owner.name.rawValue,
                service: service, limiter: &limiter, detail: "reused code")
        }
        if stored.revokedAt != nil {
            throw activationFailure(
                caller, APIError.own("ActivationCodeRevoked", ["message": .string(Self.revokedMessage)]),
                person: owner.name.rawValue,
                service: service, limiter: &limiter, detail: "revoked or replaced code")
        }
        if stored.expiresAt <= started {
            throw activationFailure(
                caller, APIError.own("ActivationCodeExpired", ["message": .string(Self.expiredMessage)]),
                person: owner.name.rawValue,
                service: service, limiter: &limiter, detail: "expired code")
        }
        guard owner.state == .pendingActivation else {
            throw APIError.own("AlreadyActive", ["name": .string(owner.name.rawValue)])
        }
        audit(
            caller, action: .activationCheck, result: .success, person: owner.name.rawValue,
            method: "activation-code", service: service)
        let ticket = issueTicket(for: owner, caller: caller, purpose: .activation(codeID: stored.id))
        return Message.Verified(
            person: record(owner), ticket: ticket, ticketExpiresIn: Int(configuration.access.ticketLifetime))
    }

    func completeActivation(
        _ caller: Caller, _ input: Message.CompleteActivation
    ) async throws(APIError) -> Message.Activated {
        guard let (personID, codeID) = peekActivationTicket(input.ticket, caller: caller),
            let person = try withStore(
                caller, action: .activationComplete, { () throws(StoreError) in try store.person(id: personID) })
        else {
            audit(
                caller, action: .activationComplete, result: .refused, method: "activation-code",
                detail: "invalid ticket")
            throw APIError.ticketInvalid
        }
        // A weak passcode leaves the ticket valid: the person tries another.
        try checkPasscodePolicy(
            caller, input.passcode, confirmation: input.confirmation, action: .activationComplete,
            person: person.name.rawValue)
        let verifier = try await makeVerifier(caller, input.passcode)
        guard consumeActivationTicket(input.ticket, caller: caller) != nil,
            let code = try withStore(
                caller, action: .activationComplete,
                { () throws(StoreError) in try store.liveActivationCode(for: person) }),
            code.id == codeID
        else {
            throw APIError.own("ActivationCodeRevoked", ["message": .string(Self.revokedMessage)])
        }
        try audited(caller, action: .activationComplete, person: person.name.rawValue) { tx throws(StoreError) in
            try store.completeActivation(code, person: person, verifier: verifier, now: now())
            try tx.audit(
                caller, action: .activationComplete, result: .success, person: person.name.rawValue,
                method: "activation-code")
        }
        let active = try existingPerson(person.name, caller: caller, action: .activationComplete)
        let offerEnabled = (try? store.identityProviderProfile(of: active))?.isBiometricOfferEnabled ?? true
        let offer = await reader?.readers.isEmpty == false && active.fingers.isEmpty && offerEnabled
        return Message.Activated(
            person: record(active), welcome: welcome(for: active), roleDescription: roleDescription(for: active),
            offerFingerprint: offer, ticket: issueTicket(for: active, caller: caller),
            ticketExpiresIn: Int(configuration.access.ticketLifetime))
    }

    /// "You're all set, Sarah. Your role: caregiver." — the primary role, "and more" for several.
    func welcome(for person: StoredPerson) -> String {
        let first = person.displayName.split(separator: " ").first.map(String.init) ?? person.displayName
        let more = person.roles.all.count > 1 ? " and more" : ""
        return "You're all set, \(first). Your role: \(person.roles.primary.rawValue)\(more)."
    }

    func roleDescription(for person: StoredPerson) -> String {
        configuration.activation.roleDescriptions[person.roles.primary.rawValue] ?? ""
    }

    // MARK: Export

    func exportPerson(_ caller: Caller, _ name: String) throws(APIError) -> Message.PersonExport {
        try requireAdmin(caller, action: .personExport, person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: .personExport)
        let events = try withStore(caller, action: .personExport) { () throws(StoreError) in
            try store.auditEntries(after: 0, limit: 1_000_000).filter { $0.record.person == name.rawValue }
        }
        let codes = try withStore(caller, action: .personExport) { () throws(StoreError) in
            try store.activationCodes(of: person)
        }
        audit(caller, action: .personExport, result: .success, person: name.rawValue)
        return Message.PersonExport(
            person: record(person),
            audit: events.map { entry in
                AuditEventRecord(
                    sequence: entry.sequence,
                    time: ISO8601.string(entry.time, milliseconds: true),
                    action: entry.record.action, result: entry.record.result, person: entry.record.person,
                    method: entry.record.method, callerUid: entry.record.callerUID, callerPid: entry.record.callerPID,
                    service: entry.record.service, detail: entry.record.detail, mac: entry.macHex)
            },
            activationCodes: codes.map { code in
                var fields: [String: JSONValue] = [
                    "issuedAt": .string(Self.timestamp(code.issuedAt)),
                    "expiresAt": .string(Self.timestamp(code.expiresAt)),
                    "failures": .number(Double(code.failures)),
                ]
                if let used = code.usedAt { fields["usedAt"] = .string(Self.timestamp(used)) }
                if let revoked = code.revokedAt { fields["revokedAt"] = .string(Self.timestamp(revoked)) }
                return .object(fields)
            })
    }
}
