import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore
import NIOPosix

/// Credential work: people, passcodes, fingerprints, activation, binding to Unix accounts and
/// suspension. Every method authorises its caller first, audits what it did (including refusals),
/// and throws only `APIError`s, each of which is one named varlink error. What it needs of online
/// work (the offline window, ending sessions, revoking tokens) it asks `online` for.
@AuthorityActor
final class CredentialAuthority: AuthorityPart {
    let context: AuthorityContext
    /// Online work, for the offline window, sessions and token revocation.
    let online: OnlineAuthority
    let passcodePolicy: PasscodePolicy
    let credentialGuard: CredentialGuard
    let hashParameters: PasscodeHashParameters
    /// Failed 1:1 fingerprint matches per connection (one authentication attempt) and person:
    /// after FailuresBeforeFallback of them that connection gets `FallbackRequired` for that
    /// person. Never durable, so nobody can drive a colleague into the fallback elsewhere.
    var fingerFailures: [UInt64: [Int64: Int]] = [:]
    /// The terminal-wide fingerprint throttle, as persisted (loaded at first use).
    var fingerThrottleState: IdentifyThrottleState?
    /// Touches admitted by the throttle and not yet recorded.
    var fingerTouchesInFlight = 0
    /// Touches waiting for admission, by ticket, in arrival order (`fingerTouchQueue`).
    var fingerTouchWaiters: [UInt64: CheckedContinuation<Void, Never>] = [:]
    /// The tickets of the touches not yet admitted, oldest first.
    var fingerTouchQueue: [UInt64] = []
    /// The next touch's ticket.
    var nextFingerTouchTicket: UInt64 = 0
    /// Scans of unprivileged callers running or waiting for the reader, each with what cancels
    /// it: a scan of root or the groups (the greeter, a kiosk app, an admin enrolling) takes the
    /// reader from them (see `readerScan`).
    var preemptibleScans: [UInt64: @Sendable () -> Void] = [:]
    var nextPreemptibleScan: UInt64 = 0

    nonisolated init(context: AuthorityContext, online: OnlineAuthority) {
        self.context = context
        self.online = online
        let configuration = context.configuration
        self.passcodePolicy = PasscodePolicy(
            minimumLength: configuration.passcode.minimumLength, maximumLength: configuration.passcode.maximumLength)
        self.credentialGuard = CredentialGuard(
            policy: LockoutPolicy(
                delays: configuration.passcode.lockoutDelays, hardLockAfter: configuration.passcode.hardLockAfter,
                fingerprintFailuresBeforeFallback: configuration.fingerprint.failuresBeforeFallback))
        self.hashParameters = PasscodeHashParameters(
            memoryKiB: configuration.store.passcodeHashMemoryKiB,
            iterations: configuration.store.passcodeHashIterations,
            parallelism: configuration.store.passcodeHashParallelism)
    }

    /// Forgets the fingerprint failures counted on a closed connection.
    func connectionClosed(_ connectionID: UInt64) {
        fingerFailures[connectionID] = nil
    }

    // MARK: People

    func addPerson(_ caller: Caller, _ input: Message.AddPerson) throws(APIError) -> Message.PersonAdded {
        try requireAdmin(caller, action: .personAdd, person: input.name)
        let name = try loginName(input.name)
        let displayName = (input.displayName ?? name.rawValue).trimmingWhitespace()
        guard !displayName.isEmpty, displayName.count <= 128,
            !displayName.contains(where: { $0.isNewline || $0 == "\0" })
        else {
            throw APIError.invalidInput("displayName", "a display name is 1 to 128 characters on one line")
        }
        var roles: [Role] = []
        for text in input.roles ?? ["caregiver"] {
            guard let role = Role(rawValue: text) else {
                throw APIError.invalidInput("roles", "unknown role \(text); roles are caregiver, coordinator, family")
            }
            roles.append(role)
        }
        let roleSet: RoleSet
        do { roleSet = try RoleSet(roles) } catch { throw APIError.invalidInput("roles", error.message) }
        if let uid = input.uid, !(0...Int(UInt32.max - 1)).contains(uid) {
            throw APIError.invalidInput("uid", "not a valid uid")
        }
        if let reason =
            name.rawValue.hasPrefix(IdentityProviderLoginName.digestPrefix)
            ? "names beginning with \(IdentityProviderLoginName.digestPrefix) are kept for identity-provider people"
            : access.bindingRefusal(name, uid: input.uid) ?? fleetUIDRefusal(input.uid)
        {
            audit(caller, action: .personAdd, result: .refused, person: name.rawValue, detail: reason)
            throw Self.bindingRefused(name, reason)
        }
        // The person, their first activation code and both audit entries: one transaction.
        let person: StoredPerson
        let code: ActivationCode
        let expires: Date
        do {
            (person, code, expires) = try audited { tx throws(StoreError) in
                let person = try store.addPerson(
                    name: name, displayName: displayName, roles: roleSet, origin: .local, state: .pendingActivation,
                    uid: input.uid, boundAccount: access.accountForBinding(input.uid), now: now())
                try tx.audit(
                    caller, action: .personAdd, result: .success, person: name.rawValue,
                    detail: "roles=\(roleSet.all.map(\.rawValue).joined(separator: ","))")
                let (code, expires) = try issueActivationCode(tx, caller, for: person)
                return (person, code, expires)
            }
        } catch {
            if error.code == .personExists {
                audit(caller, action: .personAdd, result: .failure, person: name.rawValue, detail: error.message)
                throw APIError.personExists(input.uid.map { "\(name.rawValue) or uid \($0)" } ?? name.rawValue)
            }
            throw try failStore(caller, .personAdd, error)
        }
        return Message.PersonAdded(
            person: record(person), activationCode: code.description, activationExpiresAt: Self.timestamp(expires))
    }

    func listPeople(_ caller: Caller) throws(APIError) -> [PersonRecord] {
        try requireAdmin(caller, action: .personList)
        return try withStore(caller, action: .personList) { () throws(StoreError) in try store.people() }.map(record)
    }

    func getPerson(_ caller: Caller, _ name: String) throws(APIError) -> PersonRecord {
        let name = try loginName(name)
        let person = try withStore(caller, action: .personShow) { () throws(StoreError) in
            try store.person(named: name)
        }
        if let person, isSelf(caller, person) { return record(person) }
        try requireAdmin(caller, action: .personShow, person: name.rawValue)
        guard let person else { throw APIError.noSuchPerson(name.rawValue) }
        return record(person)
    }

    func removePerson(_ caller: Caller, _ name: String) async throws(APIError) {
        try requireAdmin(caller, action: .personRemove, person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: .personRemove)
        try online.prepareRemoval(caller, of: person)
        let templates = try audited(caller, action: .personRemove, person: name.rawValue) { tx throws(StoreError) in
            let templates = try store.removePerson(person)
            try tx.audit(
                caller, action: .personRemove, result: .success, person: name.rawValue, detail: "secrets erased")
            return templates
        }
        // The sensor's own copies cannot be in the transaction: deleted after it commits, and
        // any left by a crash in between are removed at start (`reconcileSensor`).
        await deleteFromSensor(templates)
        context.fingersMissingFromSensor[person.id] = nil
        context.tickets.void(personID: person.id)
    }

    // MARK: Passcodes

    /// A place in the hashing pool in the caller's own queue (its uid's: see `HashingPool`), or
    /// `Busy` when that queue is full (tallied in the caller's refusal summary). Taken before
    /// anything that only the hash's outcome would undo.
    func reserveHash(_ caller: Caller) throws(APIError) -> HashingPool.Permit {
        do {
            return try context.hashingPool.reserve(flow: caller.uid)
        } catch {
            context.trail.tallyRefusal(caller, action: .passcodeBusy, rateLimited: false)
            throw APIError.busy(pending: error.pending, retryAfter: error.retryAfter)
        }
    }

    /// Hashes off the actor and off the event loops, on the bounded pool: Argon2id takes a tenth
    /// of a second.
    /// `lanes`: the threads Argon2id runs the hash on (its parallelism).
    func hash<T: Sendable>(
        _ caller: Caller, permit: HashingPool.Permit? = nil, lanes: Int,
        _ body: @escaping @Sendable () throws(StoreError) -> T
    ) async throws(APIError) -> T {
        let taken: HashingPool.Permit
        if let permit { taken = permit } else { taken = try reserveHash(caller) }
        do {
            return try await context.hashingPool.run(taken, lanes: lanes) { () throws -> T in try body() }
        } catch is CancellationError {
            throw APIError.own("InternalError", ["reason": .string("hashing cancelled")])
        } catch let error as StoreError {
            throw APIError.store(error)
        } catch {
            throw APIError.own("InternalError", ["reason": .string("hashing failed")])
        }
    }

    /// A new passcode against the policy; a weak one is refused `WeakPasscode` and audited as
    /// `action` (the same for an admin's SetPasscode, self-service and first-use activation).
    func checkPasscodePolicy(
        _ caller: Caller, _ passcode: String, confirmation: String, action: AuditAction, person: String
    ) throws(APIError) {
        do {
            try passcodePolicy.validate(passcode, confirmation: confirmation)
        } catch {
            audit(caller, action: action, result: .refused, person: person, detail: "weak: \(error.reason.rawValue)")
            throw APIError.own(
                "WeakPasscode", ["reason": .string(error.reason.rawValue), "message": .string(error.description)])
        }
    }

    /// The Argon2id verifier of a new passcode, hashed on the bounded pool.
    func makeVerifier(_ caller: Caller, _ passcode: String) async throws(APIError) -> PasscodeVerifier {
        let parameters = hashParameters
        return try await hash(caller, lanes: parameters.parallelism) { () throws(StoreError) in
            try PasscodeVerifier.make(passcode: passcode, parameters: parameters)
        }
    }

    func setPasscode(_ caller: Caller, _ input: Message.SetPasscode) async throws(APIError) -> PersonRecord {
        let name = try loginName(input.name)
        let person = try authorisedPerson(
            name, caller: caller, action: .passcodeSet, privileged: groups.isAdmin(caller),
            refusal: "only admins set other people's passcodes")
        if !groups.isAdmin(caller) {
            // Checked now, used up only once the new code is accepted: a weak code does not cost
            // the person their fresh authentication.
            guard let ticket = input.ticket, isValidTicket(ticket, person: person, caller: caller) else {
                audit(
                    caller, action: .passcodeSet, result: .refused, person: name.rawValue,
                    detail: "self-service without a valid ticket")
                throw APIError.ticketInvalid
            }
        }
        try checkPasscodePolicy(
            caller, input.passcode, confirmation: input.confirmation, action: .passcodeSet, person: name.rawValue)
        let verifier = try await makeVerifier(caller, input.passcode)
        if !groups.isAdmin(caller), let ticket = input.ticket, !consumeTicket(ticket, person: person, caller: caller) {
            throw APIError.ticketInvalid
        }
        var current = try existingPerson(name, caller: caller, action: .passcodeSet)
        guard current.id == person.id else { throw APIError.noSuchPerson(name.rawValue) }
        // Verifier, counters, activation and the code used up, and the audit entry: one transaction.
        try audited(caller, action: .passcodeSet, person: name.rawValue) { tx throws(StoreError) in
            try store.setPasscodeVerifier(verifier, for: current, now: now())
            // A new passcode starts with a clean slate; an admin setting it also activates.
            var failures = current.failures
            failures.passcodeFailures = 0
            failures.passcodeLockedUntil = nil
            failures.passcodeHardLocked = false
            try store.saveFailures(failures, for: current, now: now())
            if current.state == .pendingActivation, groups.isAdmin(caller) {
                try store.setState(.active, for: current, now: now())
                try store.revokeActivationCode(for: current, now: now())
            }
            try tx.audit(caller, action: .passcodeSet, result: .success, person: name.rawValue, method: "passcode")
        }
        current = try existingPerson(name, caller: caller, action: .passcodeSet)
        return record(current)
    }

    /// Why a passcode may not be used for this login, if it may not.
    func passcodeRefusal(_ caller: Caller, _ person: StoredPerson, _ context: CallerContext?) -> String? {
        loginPolicy.passcodeRefusal(context?.loginContext, personUID: access.boundUID(person))
    }

    /// The person a 1:1 authentication is for, once everything but the credential itself allows
    /// it: the person exists, the caller is an authenticator or that person, the login context
    /// allows this method (`refusal`, with `refusalError` as the named error), the offline window
    /// is open, and the person is active. Every refusal is audited.
    func authenticationSubject(
        _ caller: Caller, name: LoginName, context: CallerContext?, action: AuditAction, method: String,
        refusalError: String, refusal: (StoredPerson) -> String?
    ) throws(APIError) -> StoredPerson {
        let service = context?.service
        func refuse(_ result: AuditResult, _ detail: String) {
            audit(
                caller, action: action, result: result, person: name.rawValue, method: method, service: service,
                detail: detail + Self.logindNote(context))
        }
        let found = try withStore(caller, action: action) { () throws(StoreError) in try store.person(named: name) }
        // Authorised before existence is told: others than authenticators get one answer for
        // somebody else and for nobody.
        guard groups.isAuthenticator(caller) || found.map({ isSelf(caller, $0) }) == true else {
            refuse(.refused, "caller may only authenticate as themself")
            throw APIError.permissionDenied("you may only authenticate as yourself")
        }
        guard let person = found else {
            refuse(.failure, "no such person")
            throw APIError.noSuchPerson(name.rawValue)
        }
        try requireAccountAllowed(caller, person, context: context, action: action, method: method)
        if let reason = refusal(person) {
            refuse(.refused, reason)
            throw APIError.own(refusalError, ["reason": .string(reason)])
        }
        try online.checkOfflineUnlock(caller, person, action: action, method: method, service: service)
        guard person.state == .active else {
            refuse(.refused, "state \(person.state.rawValue)")
            throw APIError.own(
                "PersonNotActive",
                [
                    "name": .string(name.rawValue),
                    "state": .string(person.state.rawValue.replacing("-", with: "_")),
                ])
        }
        return person
    }

    /// Re-checks, once an authentication's wait is over (a scan that waits for a finger, the
    /// hash), what `authenticationSubject` checked before it: meanwhile the person may have been
    /// suspended, bound to another uid, or their offline window may have ended. Returns the
    /// person as they now stand; a refusal is audited and thrown as before the wait.
    func recheckSubject(
        _ caller: Caller, _ person: StoredPerson, context: CallerContext?, action: AuditAction, method: String
    ) throws(APIError) -> StoredPerson {
        let current = try existingPerson(person.name, caller: caller, action: action)
        guard current.id == person.id else { throw APIError.noSuchPerson(person.name.rawValue) }
        try requireAccountAllowed(caller, current, context: context, action: action, method: method)
        try online.checkOfflineUnlock(caller, current, action: action, method: method, service: context?.service)
        guard current.state == .active else {
            audit(
                caller, action: action, result: .refused, person: current.name.rawValue, method: method,
                service: context?.service, detail: "state \(current.state.rawValue) when the authentication ended")
            throw APIError.own(
                "PersonNotActive",
                [
                    "name": .string(current.name.rawValue),
                    "state": .string(current.state.rawValue.replacing("-", with: "_")),
                ])
        }
        return current
    }

    func verifyPasscode(
        _ caller: Caller, _ input: Message.VerifyPasscode
    ) async throws(APIError) -> Message.PasscodeVerified {
        let name = try loginName(input.name)
        let service = input.context?.service
        // A fleet sum set aside for a reset queued here counts again once its window is over.
        endFleetResetWindows()
        let person = try authenticationSubject(
            caller, name: name, context: input.context, action: .passcodeVerify, method: "passcode",
            refusalError: "PasscodeNotAllowed", refusal: { passcodeRefusal(caller, $0, input.context) })
        // Delays run on steady time: moving the wall clock forward skips none.
        let started = steadyNow()
        switch credentialGuard.passcodeGate(person.failures, now: started) {
        case .allowed: break
        case .delayed(let until):
            audit(
                caller, action: .passcodeVerify, result: .refused, person: name.rawValue, method: "passcode",
                service: service, detail: "delayed")
            throw Self.locked(until: until, now: started, shownAs: wallTime(ofSteady: until))
        case .hardLocked:
            audit(
                caller, action: .passcodeVerify, result: .refused, person: name.rawValue, method: "passcode",
                service: service, detail: "hard-locked")
            throw Self.locked(until: nil, now: started)
        }
        guard
            let verifier = try withStore(
                caller, action: .passcodeVerify, person: name.rawValue,
                { () throws(StoreError) in try store.passcodeVerifier(for: person) })
        else {
            audit(
                caller, action: .passcodeVerify, result: .failure, person: name.rawValue, method: "passcode",
                service: service, detail: "no passcode set")
            throw APIError.own("NoPasscode", ["name": .string(name.rawValue)])
        }
        // A full hashing queue refuses the attempt before it counts as one.
        let permit = try reserveHash(caller)
        // Count the attempt as failed, durably, before checking it: a daemon killed mid-check
        // (or a flood of concurrent attempts) never yields a free try. Success undoes it below.
        // The check stays listed as unfinished until it ends, and only then is a failure
        // reported to the fleet: a right passcode reports none (docs/fleet.md §9.6).
        let before = person.failures
        var pessimistic = before
        let outcome = credentialGuard.recordPasscode(matched: false, in: &pessimistic, now: started)
        try withStore(caller, action: .passcodeVerify, person: name.rawValue) { () throws(StoreError) in
            try store.saveFailuresOfUnfinishedCheck(pessimistic, for: person, now: started)
        }
        // Whatever ends the call before the check's outcome is recorded (a hashing or store
        // error), the attempt stays the failure it was counted as, and is reported as one.
        var checkEnded = false
        defer {
            if !checkEnded {
                endPasscodeCheckAsFailed(
                    caller, person, service: service, detail: "the check did not end (an error); counted as failed")
            }
        }
        let passcode = input.passcode
        let matched = try await hash(caller, permit: permit, lanes: verifier.parameters.parallelism) {
            () throws(StoreError) in try verifier.matches(passcode)
        }
        if matched {
            var cleared = before
            _ = credentialGuard.recordPasscode(matched: true, in: &cleared, now: started)
            // The right passcode is no failure, even when the person may no longer log in.
            let subject: StoredPerson
            do {
                subject = try recheckSubject(
                    caller, person, context: input.context, action: .passcodeVerify, method: "passcode")
            } catch {
                if let current = try? store.person(named: name), current.id == person.id,
                    (try? store.saveFailures(cleared, for: current, now: started, finishingPasscodeCheck: true)) != nil
                {
                    checkEnded = true
                }
                throw error
            }
            let current = try recordAuthentication(
                caller, person: subject, failures: cleared, unlocked: true, action: .passcodeVerify,
                result: .success,
                method: "passcode", service: service,
                detail: input.context?.logind.map { "logind: \($0.prefix(80))" }, finishingPasscodeCheck: true)
            checkEnded = true
            let ticket = issueTicket(for: subject, caller: caller)
            let offer = await offerFleetEnrolment(caller, current, service: service)
            return Message.PasscodeVerified(
                person: record(current), ticket: ticket,
                ticketExpiresIn: Int(configuration.access.ticketLifetime), offerFingerprint: offer ? true : nil)
        }
        // The failure's record and its report to the fleet in one commit.
        checkEnded = true
        endPasscodeCheckAsFailed(caller, person, service: service, detail: "failures=\(pessimistic.passcodeFailures)")
        countLockout(from: before, to: pessimistic)
        var parameters: [String: JSONValue] = ["failures": .number(Double(pessimistic.passcodeFailures))]
        switch outcome {
        case .rejected(next: .delayed(let until)):
            parameters["until"] = .string(Self.timestamp(wallTime(ofSteady: until)))
            parameters["retryAfterSeconds"] = .number(max(0, until.timeIntervalSince(started)).rounded(.up))
        case .rejected(next: .hardLocked):
            throw Self.locked(until: nil, now: started)
        default: break
        }
        throw APIError.own("WrongPasscode", parameters)
    }

    /// Ends a passcode check (`all`: every one of the person's, those a stop interrupted) as
    /// failed: the attempt stays the failure it was counted as, and is audited and reported to
    /// the fleet in one commit. Should the audit entry not be written, the check is still ended
    /// (the fleet must learn of the failure; left listed, it would hide later failures from the
    /// directory until the next start). Should that fail too, the check stays listed for the
    /// next start to record (`recordInterruptedPasscodeChecks`).
    private func endPasscodeCheckAsFailed(
        _ caller: Caller?, _ person: StoredPerson, service: String?, detail: String, all: Bool = false
    ) {
        do {
            try audited { tx throws(StoreError) in
                try store.finishPasscodeCheck(of: person, all: all)
                try tx.audit(
                    caller, action: .passcodeVerify, result: .failure, person: person.name.rawValue,
                    method: "passcode", service: service, detail: detail)
            }
            return
        } catch {
            logger.critical(
                "cannot record a failed passcode check",
                metadata: ["person": "\(person.name)", "error": "\(error.message)"])
        }
        do { try store.finishPasscodeCheck(of: person, all: all) } catch {
            logger.error(
                "cannot end a passcode check", metadata: ["person": "\(person.name)", "error": "\(error.message)"])
        }
    }

    /// Records the passcode checks that were under way when the daemon last stopped (killed, or
    /// a power cut): each attempt was counted as a failure before its hash was checked, and
    /// stays one. Audited, and reported to the fleet now. Run before serving.
    func recordInterruptedPasscodeChecks() {
        let unfinished: [(person: StoredPerson, attempts: Int)]
        do { unfinished = try store.unfinishedPasscodeChecks() } catch {
            logger.error("cannot read unfinished passcode checks", metadata: ["error": "\(error.message)"])
            return
        }
        for (person, attempts) in unfinished {
            endPasscodeCheckAsFailed(
                nil, person, service: nil,
                detail:
                    "\(attempts) attempt\(attempts == 1 ? "" : "s") interrupted before the check ended, counted as failed; failures=\(person.failures.passcodeFailures)",
                all: true)
        }
    }

    static func locked(until: Date?, now: Date, shownAs wall: Date? = nil) -> APIError {
        var parameters: [String: JSONValue] = ["hardLocked": .bool(until == nil)]
        if let until {
            parameters["until"] = .string(timestamp(wall ?? until))
            parameters["retryAfterSeconds"] = .number(max(0, until.timeIntervalSince(now)).rounded(.up))
        }
        return APIError.own("PasscodeLocked", parameters)
    }

    func resetLockout(_ caller: Caller, _ name: String) throws(APIError) -> PersonRecord {
        try requireAdmin(caller, action: .lockoutReset, person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: .lockoutReset)
        var failures = person.failures
        credentialGuard.reset(&failures)
        let updated = try audited(caller, action: .lockoutReset, person: name.rawValue) { tx throws(StoreError) in
            try store.saveFailures(failures, for: person, now: now())
            try tx.audit(caller, action: .lockoutReset, result: .success, person: name.rawValue)
            return try store.person(named: name)
        }
        return record(updated ?? person)
    }
}
