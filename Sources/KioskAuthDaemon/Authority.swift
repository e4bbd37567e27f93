public import Foundation
import KioskAuthCore
public import KioskAuthFingerprint
import KioskAuthProtocol
public import KioskAuthStore
public import Logging
public import NIOPosix

/// The daemon's decisions: who may do what to whom, and the effects on the store. Every
/// method authorises its caller first, audits what it did (including refusals), and throws
/// only `APIError`s, each of which is one named varlink error.
public actor Authority {
    let store: Store
    let configuration: DaemonConfiguration
    let groups: AccessGroups
    let logger: Logger
    let now: @Sendable () -> Date
    let hashingPool: HashingPool
    let passcodePolicy: PasscodePolicy
    let credentialGuard: CredentialGuard
    let hashParameters: PasscodeHashParameters
    let startedAt: Date
    let isSocketActivated: Bool
    let usesDevelopmentKey: Bool
    /// The fingerprint reader service; nil when fingerprints are disabled.
    let reader: FingerprintReader?
    /// The system's Unix accounts, for the binding rules.
    let accounts: SystemAccounts

    /// What a ticket may be used for.
    enum TicketPurpose: Equatable {
        /// Self-service after a fresh authentication (change passcode, enrol a finger).
        case selfService
        /// Completing activation with the code it was issued for.
        case activation(codeID: Int64)
    }

    struct Ticket {
        var personID: Int64
        var connectionID: UInt64
        /// On steady time (`steadyNow()`).
        var expires: Date
        var purpose: TicketPurpose
        /// When the authentication that earned it began (a session lock after this voids it).
        var startedAt: ClockReading
        /// When it succeeded.
        var issuedAt: ClockReading
    }
    var tickets: [String: Ticket] = [:]
    /// Failed 1:1 fingerprint matches per connection (one authentication attempt) and person:
    /// after FailuresBeforeFallback of them that connection gets `FallbackRequired` for that
    /// person. Never durable, so nobody can drive a colleague into the fallback elsewhere.
    var fingerFailures: [UInt64: [Int64: Int]] = [:]
    /// Per person, the enrolled fingers a storage reader did not hold at its last reconciliation
    /// (`reconcileSensor`); shown on the person and by ListFingers until enrolled again.
    var fingersMissingFromSensor: [Int64: Set<String>] = [:]
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
    /// Refusals of unprivileged callers awaiting their summary audit entry.
    let refusals = RefusalSummaries()
    /// The clock, the identity provider and the event hub (see Authority+IdentityProvider.swift).
    let services: OnlineServices
    /// Offline window, refresh schedule, sessions and connectivity; isolated to this actor.
    let online: OnlineState

    public init(
        store: Store, configuration: DaemonConfiguration, groups: AccessGroups, hashingPool: HashingPool,
        isSocketActivated: Bool, usesDevelopmentKey: Bool, reader: FingerprintReader?, logger: Logger,
        services: OnlineServices = OnlineServices(), accounts: SystemAccounts = .system(),
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        self.accounts = accounts
        self.services = services
        self.online = OnlineState(configuration: configuration)
        self.store = store
        self.configuration = configuration
        self.groups = groups
        self.hashingPool = hashingPool
        self.logger = logger
        self.now = now
        self.startedAt = now()
        self.isSocketActivated = isSocketActivated
        self.usesDevelopmentKey = usesDevelopmentKey
        self.reader = reader
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

    // MARK: Helpers

    static let steadyClockKey = "steady-clock"

    /// Terminal steady time (see `SteadyClock`): what lockout delays, pauses, limiter windows and
    /// ticket lifetimes are measured on, so that moving the wall clock skips or extends none.
    func steadyNow(_ given: ClockReading? = nil) -> Date {
        let reading = given ?? services.clock.reading()
        let loaded = online.steadyClock
        var clock =
            loaded
            ?? ((try? terminalValue(SteadyClock.self, forKey: Self.steadyClockKey, caller: nil, action: "clock")) ?? nil)
            ?? SteadyClock(first: reading)
        let bootBefore = clock.anchor.bootID
        let time = clock.time(at: reading)
        online.steadyClock = clock
        if loaded == nil || clock.anchor.bootID != bootBefore {
            saveTerminalValue(clock, forKey: Self.steadyClockKey, action: "clock")
        }
        return time
    }

    /// Persists a recent steady time: the high-water mark the next boot resumes from.
    func checkpointSteadyClock(_ reading: ClockReading) {
        _ = steadyNow(reading)
        guard var clock = online.steadyClock else { return }
        clock.checkpoint(reading)
        online.steadyClock = clock
        saveTerminalValue(clock, forKey: Self.steadyClockKey, action: "clock")
    }

    /// A terminal-wide value (a limiter, the identify throttle, the offline window, the steady
    /// clock). One changed behind the store's back is `StoreIntegrity`, logged and audited, never
    /// silently replaced by a fresh default.
    func terminalValue<T: Decodable>(
        _ type: T.Type, forKey key: String, caller: Caller?, action: String
    ) throws(APIError) -> T? {
        try withStore(caller, action: action) { () throws(StoreError) in try store.terminalValue(type, forKey: key) }
    }

    /// Stores a terminal-wide value; a failure (a row changed behind the store's back is not
    /// overwritten) is logged, and audited when it is an integrity failure.
    func saveTerminalValue(_ value: some Encodable, forKey key: String, action: String, caller: Caller? = nil) {
        _ = try? withStore(caller, action: action) { () throws(StoreError) in
            try store.setTerminalValue(value, forKey: key)
        }
    }

    /// The wall-clock instant a steady-time instant corresponds to now, for display.
    func wallTime(ofSteady time: Date) -> Date {
        let reading = services.clock.reading()
        return reading.wall.addingTimeInterval(time.timeIntervalSince(steadyNow(reading)))
    }

    /// Runs a store call, turning its failures into API errors; integrity failures are audited.
    func withStore<T>(
        _ caller: Caller?, action: String, person: String? = nil, _ body: () throws(StoreError) -> T
    ) throws(APIError) -> T {
        do {
            return try body()
        } catch {
            if error.code == .integrity || error.code == .wrongKey {
                logger.error("store integrity failure", metadata: ["action": "\(action)", "error": "\(error.message)"])
                audit(
                    caller, action: "store.integrity", result: "failure", person: person,
                    detail: "\(action): \(error.message)")
            } else {
                logger.error("store failure", metadata: ["action": "\(action)", "error": "\(error.message)"])
            }
            throw APIError.store(error)
        }
    }

    /// Whether `caller` is root or in the admin or authenticator group: such callers are never
    /// rate-limited, may use the reserved connections, and have each refusal audited on its own.
    nonisolated func isPrivileged(_ caller: Caller) -> Bool {
        groups.isAdmin(caller) || groups.isAuthenticator(caller)
    }

    /// Counts a refusal of an unprivileged caller towards its uid's summary entry, and schedules
    /// the summary at the end of the interval when it is the first one.
    nonisolated func tallyRefusal(_ caller: Caller, action: String, rateLimited: Bool) {
        guard refusals.add(uid: caller.uid, pid: caller.pid, action: action, rateLimited: rateLimited) else { return }
        let interval = configuration.access.refusalSummaryInterval
        Task { [weak self] in
            try? await Task.sleep(for: .milliseconds(Int64(interval * 1000)))
            await self?.flushRefusalSummaries()
        }
    }

    /// Audits what `tallyRefusal` counted: one `access.refused.summary` entry per uid. Runs at
    /// the end of each interval and at shutdown.
    public func flushRefusalSummaries() {
        let interval = configuration.access.refusalSummaryInterval
        for (uid, tally) in refusals.take() {
            let caller = Caller(uid: uid, gid: -1, pid: tally.lastPID, groups: nil, connectionID: 0)
            appendAudit(
                caller, action: "access.refused.summary", result: "refused",
                detail: RefusalSummaries.detail(tally, interval: interval))
        }
    }

    /// Appends to the audit chain and writes the new head to the journal. A failure to audit is
    /// logged loudly; it never hides the outcome from the caller. Refusals of unprivileged
    /// callers are counted into a summary entry per uid and interval instead (see
    /// `tallyRefusal`).
    func audit(
        _ caller: Caller?, action: String, result: String, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil
    ) {
        if result == "refused", let caller, !isPrivileged(caller) {
            logger.debug("refused", metadata: ["action": "\(action)", "uid": "\(caller.uid)"])
            services.metrics.observeAudit(action: action, result: result, method: method)
            tallyRefusal(caller, action: action, rateLimited: false)
            return
        }
        appendAudit(
            caller, action: action, result: result, person: person, method: method, service: service, detail: detail)
    }

    private func appendAudit(
        _ caller: Caller?, action: String, result: String, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil
    ) {
        let record = AuditRecord(
            action: action, result: result, person: person, method: method, callerUID: caller?.uid,
            callerPID: caller?.pid,
            service: service, detail: detail)
        do {
            let entry = try store.appendAudit(record, now: now())
            services.auditDelivery?.entryAppended()
            journalAudit(entry)
        } catch {
            logger.critical(
                "cannot append to the audit trail", metadata: ["action": "\(action)", "error": "\(error.message)"])
        }
    }

    /// Saves an authentication's effects — failure counters, the unlock time on success — and
    /// its audit entry in one durable commit, and writes the new audit head to the journal.
    /// Records an authentication's outcome (counters, unlock time, audit) in one transaction and
    /// returns the person as it now stands, without reading them back.
    @discardableResult
    func recordAuthentication(
        _ caller: Caller, person: StoredPerson, failures: CredentialFailureState, unlocked: Bool, action: String,
        result: String, method: String, service: String?, detail: String? = nil
    ) throws(APIError) -> StoredPerson {
        let record = AuditRecord(
            action: action, result: result, person: person.name.rawValue, method: method, callerUID: caller.uid,
            callerPID: caller.pid, service: service, detail: detail)
        let at = now()
        let entry = try withStore(caller, action: action, person: person.name.rawValue) { () throws(StoreError) in
            try store.recordAuthentication(
                of: person, failures: failures, unlockedAt: unlocked ? at : nil, audit: record, now: at)
        }
        services.auditDelivery?.entryAppended()
        journalAudit(entry)
        var updated = person
        updated.failures = failures
        if unlocked { updated.lastUnlockAt = at }
        return updated
    }

    func requireAdmin(_ caller: Caller, action: String, person: String? = nil) throws(APIError) {
        guard groups.isAdmin(caller) else {
            audit(caller, action: action, result: "refused", person: person, detail: "caller is not an admin")
            throw APIError.permissionDenied("\(action) needs root or membership in \(configuration.access.adminGroup)")
        }
    }

    func loginName(_ text: String) throws(APIError) -> LoginName {
        do { return try LoginName(text) } catch { throw APIError.invalidInput("name", error.message) }
    }

    func existingPerson(_ name: LoginName, caller: Caller?, action: String) throws(APIError) -> StoredPerson {
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
        _ name: LoginName, caller: Caller, action: String, privileged: Bool, refusal: String
    ) throws(APIError) -> StoredPerson {
        if privileged { return try existingPerson(name, caller: caller, action: action) }
        let person = try withStore(caller, action: action, person: name.rawValue) { () throws(StoreError) in
            try store.person(named: name)
        }
        guard let person, isSelf(caller, person) else {
            audit(caller, action: action, result: "refused", person: name.rawValue, detail: "not the caller's person")
            throw APIError.permissionDenied(refusal)
        }
        return person
    }

    /// The caller acts on `person`: an admin, or the person bound to the caller's own uid.
    func isSelf(_ caller: Caller, _ person: StoredPerson) -> Bool {
        person.uid != nil && person.uid == caller.uid
    }

    static func timestamp(_ date: Date) -> String {
        date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: false))
    }

    func record(_ person: StoredPerson) -> PersonRecord {
        var record = PersonRecord(
            name: person.name.rawValue, displayName: person.displayName, primaryRole: person.roles.primary.rawValue,
            roles: person.roles.all.map(\.rawValue), origin: person.origin.rawValue,
            state: person.state.rawValue.replacingOccurrences(of: "-", with: "_"), uid: person.uid,
            hasPasscode: person.hasPasscode, fingers: person.fingers,
            passcodeFailures: person.failures.passcodeFailures,
            passcodeLockedUntil: person.failures.passcodeLockedUntil.flatMap {
                $0 > steadyNow() ? Self.timestamp(wallTime(ofSteady: $0)) : nil
            },
            passcodeHardLocked: person.failures.passcodeHardLocked,
            fingerprintFailures: person.failures.fingerprintFailures,
            createdAt: Self.timestamp(person.createdAt), lastUnlockAt: person.lastUnlockAt.map(Self.timestamp))
        let missing = missingFromSensor(person)
        record.fingersMissingFromSensor = missing.isEmpty ? nil : missing
        addIdentityProviderFields(to: &record, of: person)
        return record
    }

    /// Those of the person's fingers the storage reader lacked at its last reconciliation.
    func missingFromSensor(_ person: StoredPerson) -> [String] {
        guard let missing = fingersMissingFromSensor[person.id] else { return [] }
        return person.fingers.filter(missing.contains)
    }

    // MARK: Status

    func status(_ caller: Caller) throws(APIError) -> Message.Status {
        let figures = try withStore(caller, action: "status") { () throws(StoreError) in try store.statusFigures() }
        return try withAdminSummary(status(caller, figures), for: caller)
    }

    /// `GetStatus` answered on the connection's event loop, without a hop to the actor: it reads
    /// only constants, the audit delivery monitor and the store (under the store's own lock).
    /// nil when the store fails, so that the call goes through `status(_:)`, which audits it, and
    /// for admins, whose answer carries the lockout and unlock summary read on the actor.
    nonisolated func immediateStatus(_ caller: Caller) -> Message.Status? {
        guard !groups.isAdmin(caller), let figures = try? store.statusFigures() else { return nil }
        return status(caller, figures)
    }

    nonisolated private func status(_ caller: Caller, _ figures: StoreStatusFigures) -> Message.Status {
        Message.Status(
            version: KioskAuthVersion.string, schemaVersion: Store.schemaVersion, people: figures.people,
            socketActivated: isSocketActivated, developmentKey: usesDevelopmentKey,
            uptimeSeconds: Int(now().timeIntervalSince(startedAt)), auditEvents: figures.auditEvents,
            auditHead: Hex.encode(figures.auditHead),
            auditDelivery: auditDeliveryStatus(caller, head: figures.auditEvents))
    }

    /// Audit delivery as `caller` may see it: the state, the queue and the last delivery for
    /// everyone (the trail's length is public in `GetStatus` anyway); the endpoint and why it
    /// fails for admins only, since error text and host names describe the organisation's network.
    nonisolated func auditDeliveryStatus(_ caller: Caller, head: Int) -> AuditDeliveryStatus {
        guard let monitor = services.auditDelivery else {
            return AuditDeliveryStatus(configured: false, state: "off", queued: 0, lastDeliveryAt: nil)
        }
        let snapshot = monitor.snapshot
        let queued = max(head - snapshot.deliveredThrough, 0)
        let state =
            snapshot.consecutiveFailures > 0 ? "retrying" : queued > 0 || snapshot.isSending ? "delivering" : "idle"
        var status = AuditDeliveryStatus(
            configured: true, state: state, queued: queued, lastDeliveryAt: snapshot.lastDeliveryAt.map(Self.timestamp))
        if groups.isAdmin(caller) {
            status.endpointHost = snapshot.endpointHost
            status.deliveredThrough = snapshot.deliveredThrough
            status.lastError = snapshot.lastError
            status.lastErrorAt = snapshot.lastErrorAt.map(Self.timestamp)
            status.consecutiveFailures = snapshot.consecutiveFailures
            status.nextAttemptAt = snapshot.nextAttemptAt.map(Self.timestamp)
        }
        return status
    }

    // MARK: People

    func addPerson(_ caller: Caller, _ input: Message.AddPerson) throws(APIError) -> Message.PersonAdded {
        try requireAdmin(caller, action: "person.add", person: input.name)
        let name = try loginName(input.name)
        let displayName = (input.displayName ?? name.rawValue).trimmingCharacters(in: .whitespacesAndNewlines)
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
            : bindingRefusal(name, uid: input.uid)
        {
            audit(caller, action: "person.add", result: "refused", person: name.rawValue, detail: reason)
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
                    uid: input.uid, now: now())
                try tx.audit(
                    caller, action: "person.add", result: "success", person: name.rawValue,
                    detail: "roles=\(roleSet.all.map(\.rawValue).joined(separator: ","))")
                let (code, expires) = try issueActivationCode(tx, caller, for: person)
                return (person, code, expires)
            }
        } catch {
            if error.code == .personExists {
                audit(caller, action: "person.add", result: "failure", person: name.rawValue, detail: error.message)
                throw APIError.personExists(input.uid.map { "\(name.rawValue) or uid \($0)" } ?? name.rawValue)
            }
            throw try failStore(caller, "person.add", error)
        }
        return Message.PersonAdded(
            person: record(person), activationCode: code.description, activationExpiresAt: Self.timestamp(expires))
    }

    func failStore(_ caller: Caller, _ action: String, _ error: StoreError) throws(APIError) -> APIError {
        try withStore(caller, action: action) { () throws(StoreError) in throw error }
    }

    func listPeople(_ caller: Caller) throws(APIError) -> [PersonRecord] {
        try requireAdmin(caller, action: "person.list")
        return try withStore(caller, action: "person.list") { () throws(StoreError) in try store.people() }.map(record)
    }

    func getPerson(_ caller: Caller, _ name: String) throws(APIError) -> PersonRecord {
        let name = try loginName(name)
        let person = try withStore(caller, action: "person.show") { () throws(StoreError) in
            try store.person(named: name)
        }
        if let person, isSelf(caller, person) { return record(person) }
        try requireAdmin(caller, action: "person.show", person: name.rawValue)
        guard let person else { throw APIError.noSuchPerson(name.rawValue) }
        return record(person)
    }

    func removePerson(_ caller: Caller, _ name: String) async throws(APIError) {
        try requireAdmin(caller, action: "person.remove", person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: "person.remove")
        try prepareRemoval(caller, of: person)
        let templates = try audited(caller, action: "person.remove", person: name.rawValue) { tx throws(StoreError) in
            let templates = try store.removePerson(person)
            try tx.audit(
                caller, action: "person.remove", result: "success", person: name.rawValue, detail: "secrets erased")
            return templates
        }
        // The sensor's own copies cannot be in the transaction: deleted after it commits, and
        // any left by a crash in between are removed at start (`reconcileSensor`).
        await deleteFromSensor(templates)
        fingersMissingFromSensor[person.id] = nil
        tickets = tickets.filter { $0.value.personID != person.id }
    }

    // MARK: Passcodes

    /// A place in the hashing pool, or `Busy` when its workers and queue are full (tallied in the
    /// caller's refusal summary). Taken before anything that only the hash's outcome would undo.
    func reserveHash(_ caller: Caller) throws(APIError) -> HashingPool.Permit {
        do {
            return try hashingPool.reserve()
        } catch {
            tallyRefusal(caller, action: "passcode.busy", rateLimited: false)
            throw APIError.busy(pending: error.pending, retryAfter: error.retryAfter)
        }
    }

    /// Hashes off the actor and off the event loops, on the bounded pool: Argon2id takes a tenth
    /// of a second.
    func hash<T: Sendable>(
        _ caller: Caller, permit: HashingPool.Permit? = nil, _ body: @escaping @Sendable () throws(StoreError) -> T
    ) async throws(APIError) -> T {
        let taken: HashingPool.Permit
        if let permit { taken = permit } else { taken = try reserveHash(caller) }
        do {
            return try await hashingPool.run(taken) { () throws -> T in try body() }
        } catch is CancellationError {
            throw APIError.own("InternalError", ["reason": .string("hashing cancelled")])
        } catch let error as StoreError {
            throw APIError.store(error)
        } catch {
            throw APIError.own("InternalError", ["reason": .string("hashing failed")])
        }
    }

    func setPasscode(_ caller: Caller, _ input: Message.SetPasscode) async throws(APIError) -> PersonRecord {
        let name = try loginName(input.name)
        let person = try authorisedPerson(
            name, caller: caller, action: "passcode.set", privileged: groups.isAdmin(caller),
            refusal: "only admins set other people's passcodes")
        if !groups.isAdmin(caller) {
            // Checked now, used up only once the new code is accepted: a weak code does not cost
            // the person their fresh authentication.
            guard let ticket = input.ticket, isValidTicket(ticket, person: person, caller: caller) else {
                audit(
                    caller, action: "passcode.set", result: "refused", person: name.rawValue,
                    detail: "self-service without a valid ticket")
                throw APIError.ticketInvalid
            }
        }
        do {
            try passcodePolicy.validate(input.passcode, confirmation: input.confirmation)
        } catch {
            audit(
                caller, action: "passcode.set", result: "refused", person: name.rawValue,
                detail: "weak: \(error.reason.rawValue)")
            throw APIError.own(
                "WeakPasscode", ["reason": .string(error.reason.rawValue), "message": .string(error.description)])
        }
        let passcode = input.passcode
        let parameters = hashParameters
        let verifier = try await hash(caller) { () throws(StoreError) in
            try PasscodeVerifier.make(passcode: passcode, parameters: parameters)
        }
        if !groups.isAdmin(caller), let ticket = input.ticket, !consumeTicket(ticket, person: person, caller: caller) {
            throw APIError.ticketInvalid
        }
        var current = try existingPerson(name, caller: caller, action: "passcode.set")
        guard current.id == person.id else { throw APIError.noSuchPerson(name.rawValue) }
        // Verifier, counters, activation and the code used up, and the audit entry: one transaction.
        try audited(caller, action: "passcode.set", person: name.rawValue) { tx throws(StoreError) in
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
            try tx.audit(caller, action: "passcode.set", result: "success", person: name.rawValue, method: "passcode")
        }
        current = try existingPerson(name, caller: caller, action: "passcode.set")
        return record(current)
    }

    /// Why a passcode may not be used for this login, if it may not.
    func passcodeRefusal(_ caller: Caller, _ person: StoredPerson, _ context: CallerContext?) -> String? {
        guard let context else { return nil }
        if context.isRemote {
            return "passcodes are not accepted over remote sessions"
        }
        if let service = context.service {
            if configuration.access.switchUserServices.contains(service) {
                guard let ruid = context.ruid, let uid = person.uid, ruid == uid else {
                    return "\(service) accepts a passcode only for the invoking user"
                }
            } else if !configuration.access.passcodeServices.contains(service) {
                return "the PAM service \(service) is not allowed to use passcodes"
            }
        }
        return nil
    }

    /// The person a 1:1 authentication is for, once everything but the credential itself allows
    /// it: the person exists, the caller is an authenticator or that person, the login context
    /// allows this method (`refusal`, with `refusalError` as the named error), the offline window
    /// is open, and the person is active. Every refusal is audited.
    func authenticationSubject(
        _ caller: Caller, name: LoginName, context: CallerContext?, action: String, method: String,
        refusalError: String, refusal: (StoredPerson) -> String?
    ) throws(APIError) -> StoredPerson {
        let service = context?.service
        func refuse(_ result: String, _ detail: String) {
            audit(
                caller, action: action, result: result, person: name.rawValue, method: method, service: service,
                detail: detail + Self.logindNote(context))
        }
        let found = try withStore(caller, action: action) { () throws(StoreError) in try store.person(named: name) }
        // Authorised before existence is told: others than authenticators get one answer for
        // somebody else and for nobody.
        guard groups.isAuthenticator(caller) || found.map({ isSelf(caller, $0) }) == true else {
            refuse("refused", "caller may only authenticate as themself")
            throw APIError.permissionDenied("you may only authenticate as yourself")
        }
        guard let person = found else {
            refuse("failure", "no such person")
            throw APIError.noSuchPerson(name.rawValue)
        }
        try requireAccountAllowed(caller, person, context: context, action: action, method: method)
        if let reason = refusal(person) {
            refuse("refused", reason)
            throw APIError.own(refusalError, ["reason": .string(reason)])
        }
        try checkOfflineUnlock(caller, person, action: action, method: method, service: service)
        guard person.state == .active else {
            refuse("refused", "state \(person.state.rawValue)")
            throw APIError.own(
                "PersonNotActive",
                [
                    "name": .string(name.rawValue),
                    "state": .string(person.state.rawValue.replacingOccurrences(of: "-", with: "_")),
                ])
        }
        return person
    }

    /// Re-checks, once an authentication's wait is over (a scan that waits for a finger, the
    /// hash), what `authenticationSubject` checked before it: meanwhile the person may have been
    /// suspended, bound to another uid, or their offline window may have ended. Returns the
    /// person as they now stand; a refusal is audited and thrown as before the wait.
    func recheckSubject(
        _ caller: Caller, _ person: StoredPerson, context: CallerContext?, action: String, method: String
    ) throws(APIError) -> StoredPerson {
        let current = try existingPerson(person.name, caller: caller, action: action)
        guard current.id == person.id else { throw APIError.noSuchPerson(person.name.rawValue) }
        try requireAccountAllowed(caller, current, context: context, action: action, method: method)
        try checkOfflineUnlock(caller, current, action: action, method: method, service: context?.service)
        guard current.state == .active else {
            audit(
                caller, action: action, result: "refused", person: current.name.rawValue, method: method,
                service: context?.service, detail: "state \(current.state.rawValue) when the authentication ended")
            throw APIError.own(
                "PersonNotActive",
                [
                    "name": .string(current.name.rawValue),
                    "state": .string(current.state.rawValue.replacingOccurrences(of: "-", with: "_")),
                ])
        }
        return current
    }

    func verifyPasscode(_ caller: Caller, _ input: Message.VerifyPasscode) async throws(APIError) -> Message.Verified {
        let name = try loginName(input.name)
        let service = input.context?.service
        let person = try authenticationSubject(
            caller, name: name, context: input.context, action: "passcode.verify", method: "passcode",
            refusalError: "PasscodeNotAllowed", refusal: { passcodeRefusal(caller, $0, input.context) })
        // Delays run on steady time: moving the wall clock forward skips none.
        let started = steadyNow()
        switch credentialGuard.passcodeGate(person.failures, now: started) {
        case .allowed: break
        case .delayed(let until):
            audit(
                caller, action: "passcode.verify", result: "refused", person: name.rawValue, method: "passcode",
                service: service, detail: "delayed")
            throw Self.locked(until: until, now: started, shownAs: wallTime(ofSteady: until))
        case .hardLocked:
            audit(
                caller, action: "passcode.verify", result: "refused", person: name.rawValue, method: "passcode",
                service: service, detail: "hard-locked")
            throw Self.locked(until: nil, now: started)
        }
        guard
            let verifier = try withStore(
                caller, action: "passcode.verify", person: name.rawValue,
                { () throws(StoreError) in try store.passcodeVerifier(for: person) })
        else {
            audit(
                caller, action: "passcode.verify", result: "failure", person: name.rawValue, method: "passcode",
                service: service, detail: "no passcode set")
            throw APIError.own("NoPasscode", ["name": .string(name.rawValue)])
        }
        // A full hashing queue refuses the attempt before it counts as one.
        let permit = try reserveHash(caller)
        // Count the attempt as failed, durably, before checking it: a daemon killed mid-check
        // (or a flood of concurrent attempts) never yields a free try. Success undoes it below.
        let before = person.failures
        var pessimistic = before
        let outcome = credentialGuard.recordPasscode(matched: false, in: &pessimistic, now: started)
        try withStore(caller, action: "passcode.verify", person: name.rawValue) { () throws(StoreError) in
            try store.saveFailures(pessimistic, for: person, now: started)
        }
        let passcode = input.passcode
        let matched = try await hash(caller, permit: permit) { () throws(StoreError) in try verifier.matches(passcode) }
        if matched {
            var cleared = before
            _ = credentialGuard.recordPasscode(matched: true, in: &cleared, now: started)
            // The right passcode is no failure, even when the person may no longer log in.
            let subject: StoredPerson
            do {
                subject = try recheckSubject(
                    caller, person, context: input.context, action: "passcode.verify", method: "passcode")
            } catch {
                if let current = try? store.person(named: name), current.id == person.id {
                    try? store.saveFailures(cleared, for: current, now: started)
                }
                throw error
            }
            let current = try recordAuthentication(
                caller, person: subject, failures: cleared, unlocked: true, action: "passcode.verify",
                result: "success",
                method: "passcode", service: service,
                detail: input.context?.logind.map { "logind: \($0.prefix(80))" })
            let ticket = issueTicket(for: subject, caller: caller)
            return Message.Verified(
                person: record(current), ticket: ticket,
                ticketExpiresIn: Int(configuration.access.ticketLifetime))
        }
        audit(
            caller, action: "passcode.verify", result: "failure", person: name.rawValue, method: "passcode",
            service: service, detail: "failures=\(pessimistic.passcodeFailures)")
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

    static func locked(until: Date?, now: Date, shownAs wall: Date? = nil) -> APIError {
        var parameters: [String: JSONValue] = ["hardLocked": .bool(until == nil)]
        if let until {
            parameters["until"] = .string(timestamp(wall ?? until))
            parameters["retryAfterSeconds"] = .number(max(0, until.timeIntervalSince(now)).rounded(.up))
        }
        return APIError.own("PasscodeLocked", parameters)
    }

    func resetLockout(_ caller: Caller, _ name: String) throws(APIError) -> PersonRecord {
        try requireAdmin(caller, action: "lockout.reset", person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: "lockout.reset")
        var failures = person.failures
        credentialGuard.reset(&failures)
        let updated = try audited(caller, action: "lockout.reset", person: name.rawValue) { tx throws(StoreError) in
            try store.saveFailures(failures, for: person, now: now())
            try tx.audit(caller, action: "lockout.reset", result: "success", person: name.rawValue)
            return try store.person(named: name)
        }
        return record(updated ?? person)
    }

    // MARK: Tickets

    func issueTicket(
        for person: StoredPerson, caller: Caller, purpose: TicketPurpose = .selfService, startedAt: ClockReading? = nil,
        issuedAt: ClockReading? = nil, expires: Date? = nil
    ) -> String {
        let reading = services.clock.reading()
        let current = steadyNow(reading)
        tickets = tickets.filter { $0.value.expires > current }
        var bytes = [UInt8](repeating: 0, count: 24)
        var generator = SystemRandomNumberGenerator()
        for index in bytes.indices { bytes[index] = generator.next() }
        let ticket = Data(bytes).base64EncodedString()
        tickets[ticket] = Ticket(
            personID: person.id, connectionID: caller.connectionID,
            expires: expires ?? current.addingTimeInterval(configuration.access.ticketLifetime), purpose: purpose,
            startedAt: startedAt ?? reading, issuedAt: issuedAt ?? reading)
        return ticket
    }

    /// Single use; bound to the person and the connection that earned it.
    func consumeTicket(_ ticket: String, person: StoredPerson, caller: Caller) -> Bool {
        takeTicket(ticket, person: person, caller: caller) != nil
    }

    /// Consumes a self-service ticket and returns it when it is valid for `person` on the
    /// caller's connection. A ticket presented wrongly dies too.
    func takeTicket(_ ticket: String, person: StoredPerson, caller: Caller) -> Ticket? {
        defer { tickets[ticket] = nil }
        guard isValidTicket(ticket, person: person, caller: caller) else { return nil }
        return tickets[ticket]
    }

    /// Whether a self-service ticket is valid for this person and connection, without using it up.
    func isValidTicket(_ ticket: String, person: StoredPerson, caller: Caller) -> Bool {
        guard let entry = tickets[ticket] else { return false }
        return entry.purpose == .selfService && entry.personID == person.id && entry.connectionID == caller.connectionID
            && entry.expires > steadyNow()
    }

    /// The person and code an activation ticket is for, without using it up.
    func peekActivationTicket(_ ticket: String, caller: Caller) -> (personID: Int64, codeID: Int64)? {
        guard let entry = tickets[ticket], entry.connectionID == caller.connectionID, entry.expires > steadyNow(),
            case .activation(let codeID) = entry.purpose
        else { return nil }
        return (entry.personID, codeID)
    }

    /// Uses up an activation ticket.
    func consumeActivationTicket(_ ticket: String, caller: Caller) -> (personID: Int64, codeID: Int64)? {
        guard let found = peekActivationTicket(ticket, caller: caller) else { return nil }
        tickets[ticket] = nil
        return found
    }

    /// Forgets every ticket of a closed connection.
    func connectionClosed(_ connectionID: UInt64) {
        tickets = tickets.filter { $0.value.connectionID != connectionID }
        fingerFailures[connectionID] = nil
    }

    // MARK: Audit

    func auditEvents(_ caller: Caller, _ input: Message.GetAudit) throws(APIError) -> [AuditEventRecord] {
        try requireAdmin(caller, action: "audit.read")
        let limit = min(max(input.limit ?? 1000, 1), 10_000)
        let entries = try withStore(caller, action: "audit.read") { () throws(StoreError) in
            try store.auditEntries(after: max(input.after ?? 0, 0), limit: limit, newest: input.newest ?? false)
        }
        return entries.map { entry in
            AuditEventRecord(
                sequence: entry.sequence,
                time: entry.time.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true)),
                action: entry.record.action, result: entry.record.result, person: entry.record.person,
                method: entry.record.method, callerUid: entry.record.callerUID, callerPid: entry.record.callerPID,
                service: entry.record.service, detail: entry.record.detail, mac: entry.macHex)
        }
    }

    func verifyAudit(
        _ caller: Caller, _ input: Message.VerifyAudit = .init()
    ) throws(APIError)
        -> Message.AuditVerification
    {
        try requireAdmin(caller, action: "audit.verify")
        var trusted: AuditHeadMark?
        if let text = input.head {
            guard let head = AuditHeadMark(parsing: text) else {
                throw .invalidInput("head", "expected SEQ:MAC, the sequence and the head MAC in hex")
            }
            trusted = head
        }
        let result = try withStore(caller, action: "audit.verify") { () throws(StoreError) in
            try store.verifyAudit(trustedHead: trusted)
        }
        if !result.isValid {
            logger.critical(
                "audit chain broken", metadata: ["at": "\(result.brokenAt ?? 0)", "reason": "\(result.reason ?? "")"])
        }
        return Message.AuditVerification(
            valid: result.isValid, events: result.events, head: result.headHex, brokenAt: result.brokenAt,
            reason: result.reason)
    }
}
