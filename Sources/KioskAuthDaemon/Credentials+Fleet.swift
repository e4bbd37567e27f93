import FoundationEssentials
import KioskAuthCore
import KioskAuthFleet
import KioskAuthStore

extension CredentialAuthority {
    /// The reason recorded for a person suspended somewhere in the fleet.
    static let fleetSuspensionReason = "suspended in the fleet"

    /// Applies changes pulled from the directory to the local store, in change order, through the
    /// same store calls and audit trail as an admin's action here (audited as `fleet.apply`).
    /// Nothing applied is queued back to the directory. A removal or suspension takes effect at
    /// once: the person's tickets die and their sessions end. Secrets are opened with the fleet
    /// keyring and sealed again under the store key by the store. Only the local store is
    /// touched; the caller (the fleet agent) did the network I/O.
    ///
    /// A change the directory connection did not trust (a row whose MAC is missing or wrong,
    /// an older version of a row than one already seen, or one MACed under a key this terminal
    /// does not hold) is never applied: it is audited as `fleet.reject` and counted for
    /// `FleetStatus`. Each trusted row's version is kept, so that after a restart the directory
    /// connection still refuses an older one.
    func applyFleetChanges(_ changes: [FleetChange], _ fleet: FleetApplyContext) -> FleetApplyOutcome {
        var outcome = FleetApplyOutcome()
        for change in changes {
            guard change.isTrusted else {
                rejectFleetChange(change)
                outcome.rejected += 1
                continue
            }
            do {
                let applied: Bool
                switch change.entity {
                case "people": applied = try applyFleetPerson(change)
                case "passcode_verifiers": applied = try applyFleetVerifier(change, fleet)
                case "person_lockout": applied = try applyFleetLockout(change)
                case "templates": applied = try applyFleetTemplate(change, fleet)
                default: applied = false
                }
                if applied { outcome.applied += 1 }
                try recordFleetRowVersion(change)
            } catch {
                // One change that cannot be applied (a name taken here, a value that does not
                // open) is audited and skipped; the rest still arrive.
                logger.error(
                    "fleet change not applied", metadata: ["change": "\(change.id)", "error": "\(error.message)"])
                audit(
                    nil, action: .fleetApply, result: .failure,
                    detail: "change \(change.id) (\(change.entity)): \(error.message)")
                outcome.problem = error.message
            }
        }
        return outcome
    }

    /// Whether to offer fingerprint enrolment after `person` unlocked with her passcode here
    /// (issue 17: a caregiver whose print cannot be used on this terminal is asked to enrol
    /// after her passcode, once). Only on a fleet member, for one of the fleet's people with no
    /// finger enrolled here, with a reader attached and self-enrolment allowed, never for a
    /// su/sudo-like service, and only while her offer is on. Making the offer turns it off
    /// (audited), so it is made once; `SetBiometricOffer` turns it back on.
    func offerFleetEnrolment(_ caller: Caller, _ person: StoredPerson, service: String?) async -> Bool {
        // Every passcode unlock passes here: the in-memory checks come first, so a terminal in
        // no fleet, or a person with a finger, costs no query.
        guard configuration.fingerprint.enabled, configuration.fingerprint.selfEnrollment, person.fingers.isEmpty,
            !(service.map { configuration.access.switchUserServices.contains($0) } ?? false), store.isInFleet,
            (try? store.fleetMembership())?.state == "member",
            (try? store.fleetID(of: person)) != nil,
            (try? store.identityProviderProfile(of: person))?.isBiometricOfferEnabled == true,
            await reader?.readers.isEmpty == false
        else { return false }
        do {
            return try audited { tx throws(StoreError) in
                guard try store.markBiometricOffered(person, now: now()) else { return false }
                try tx.audit(
                    caller, action: .personBiometricOffer, result: .success, person: person.name.rawValue,
                    method: "passcode", service: service,
                    detail: "offered once: no finger enrolled on this terminal's reader")
                return true
            }
        } catch {
            logger.error("cannot record the enrolment offer", metadata: ["error": "\(error.message)"])
            return false
        }
    }

    /// Why a change was not trusted, in words for the audit trail and `FleetStatus`.
    static func fleetRejection(_ change: FleetChange) -> String {
        let why: String
        switch change.integrity {
        case .forged(let reason): why = "forged: \(reason)"
        case .replayed(let reason): why = "replayed: \(reason)"
        case .unverifiable(let reason): why = "unverifiable: \(reason)"
        case .verified, .notCovered: why = "not trusted"
        }
        return "change \(change.id) (\(change.entity) \(change.key)) refused, \(why)"
    }

    /// Audits a change that is not applied because it is not trusted, and counts it.
    private func rejectFleetChange(_ change: FleetChange) {
        let reason = Self.fleetRejection(change)
        logger.error("fleet change refused", metadata: ["change": "\(change.id)", "reason": "\(reason)"])
        do {
            try audited { tx throws(StoreError) in
                try tx.audit(nil, action: .fleetReject, result: .refused, detail: reason)
                try store.recordFleetRejection(reason)
            }
        } catch {
            logger.error("cannot record a refused fleet change", metadata: ["error": "\(error.message)"])
        }
    }

    /// Keeps the version of a trusted row of a MACed table (`Int64.max` for a deleted one).
    /// Called inside the transaction that applies the row, and again after it (idempotent), so
    /// rows that needed no local change are remembered too.
    private func recordFleetRowVersion(_ change: FleetChange) throws(StoreError) {
        if let version = change.rowVersion, change.isTrusted, !change.isDeletion {
            try store.setFleetRowVersion(version, entity: change.entity, key: change.key)
        } else if change.isDeletion, Self.fleetMACedTables.contains(change.entity) {
            try store.setFleetRowVersion(Int64.max, entity: change.entity, key: change.key)
        }
    }

    /// The directory tables whose rows carry a row MAC (docs/fleet.md §3).
    static let fleetMACedTables: Set<String> = ["people", "passcode_verifiers", "templates"]

    private func applyingFleet<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try store.applyingFleetChanges(body)
    }

    /// The local person a directory person is, linking a local person of the same name who is
    /// in no fleet yet.
    private func fleetPerson(_ fleetID: String, name: LoginName?) throws(StoreError) -> StoredPerson? {
        if let person = try store.person(fleetID: fleetID) { return person }
        guard let name, let local = try store.person(named: name), local.origin == .local,
            try store.fleetID(of: local) == nil
        else { return nil }
        return local
    }

    private func applyFleetPerson(_ change: FleetChange) throws(StoreError) -> Bool {
        let fields = change.fields
        guard let fleetID = fields["person_id"] ?? Optional(change.key), let text = fields["name"],
            let name = try? LoginName(text), let state = fields["state"]
        else { return false }
        let existing = try fleetPerson(fleetID, name: name)
        if state == "removed" {
            guard let person = existing else { return false }
            let templates = try applyingFleet { () throws(StoreError) in
                try audited { tx throws(StoreError) in
                    let templates = try store.removePerson(person)
                    try recordFleetRowVersion(change)
                    try tx.audit(
                        nil, action: .fleetApply, result: .success, person: person.name.rawValue,
                        detail: "removed in the fleet; secrets erased")
                    return templates
                }
            }
            context.tickets.void(personID: person.id)
            _ = online.endSessions(of: person.id, reason: .securityLogout)
            context.fingersMissingFromSensor[person.id] = nil
            Task { await self.deleteFromSensor(templates) }
            return true
        }
        var roles: [Role] = []
        for role in (fields["role"] ?? "").split(separator: ",") {
            guard let parsed = Role(rawValue: String(role)) else {
                throw StoreError.fleet("unknown role \(role) for \(name.rawValue)")
            }
            roles.append(parsed)
        }
        let roleSet: RoleSet
        do { roleSet = try RoleSet(roles) } catch { throw StoreError.fleet("bad roles for \(name.rawValue)") }
        let uid = fields["uid"].flatMap { Int($0) }
        let suspended = state == "suspended"
        let person = try applyingFleet { () throws(StoreError) -> StoredPerson in
            try audited { tx throws(StoreError) -> StoredPerson in
                var person: StoredPerson
                if let existing {
                    person = existing
                    if existing.roles != roleSet { try store.setRoles(roleSet, for: person, now: now()) }
                    if existing.uid != uid {
                        var free = true
                        if let uid { free = try store.person(boundTo: uid) == nil }
                        if free {
                            try store.setUID(uid, account: access.accountForBinding(uid), for: person, now: now())
                        }
                    }
                } else {
                    var free = true
                    if let uid { free = try store.person(boundTo: uid) == nil }
                    person = try store.addPerson(
                        name: name, displayName: name.rawValue, roles: roleSet, origin: .local,
                        state: suspended ? .suspended : .active, uid: free ? uid : nil,
                        boundAccount: free ? access.accountForBinding(uid) : nil, now: now())
                }
                try store.linkFleetPerson(person, fleetID: fleetID)
                try recordFleetRowVersion(change)
                if suspended, person.state != .suspended || existing == nil {
                    try store.setSuspension(Self.fleetSuspensionReason, for: person, now: now())
                } else if !suspended, person.state == .suspended {
                    try store.setSuspension(nil, for: person, now: now())
                } else if !suspended, person.state == .pendingActivation {
                    try store.setState(.active, for: person, now: now())
                }
                try tx.audit(
                    nil, action: .fleetApply, result: .success, person: name.rawValue,
                    detail: "\(existing == nil ? "added" : "updated") from the fleet: state=\(state)")
                return try store.person(named: name) ?? person
            }
        }
        if suspended {
            context.tickets.void(personID: person.id)
            _ = online.endSessions(of: person.id, reason: .securityLogout)
        }
        return true
    }

    private func applyFleetVerifier(_ change: FleetChange, _ fleet: FleetApplyContext) throws(StoreError) -> Bool {
        let fields = change.fields
        guard !change.isDeletion, let fleetID = fields["person_id"], let uuid = UUID(uuidString: fleetID),
            let sealed = FleetChange.sealedBlob(in: fields), let person = try store.person(fleetID: fleetID)
        else { return false }
        let plaintext: [UInt8]
        do { plaintext = try fleet.keyring.open(sealed, binding: .verifier(person: uuid)) } catch {
            throw StoreError.fleet("the verifier of \(person.name.rawValue) does not open: \(error)")
        }
        let verifier: PasscodeVerifier
        do { verifier = try JSONDecoder().decode(PasscodeVerifier.self, from: Data(plaintext)) } catch {
            throw StoreError.fleet("the verifier of \(person.name.rawValue) does not decode")
        }
        try applyingFleet { () throws(StoreError) in
            try audited { tx throws(StoreError) in
                try store.setPasscodeVerifier(verifier, for: person, now: now())
                try recordFleetRowVersion(change)
                try tx.audit(
                    nil, action: .fleetApply, result: .success, person: person.name.rawValue, method: "passcode",
                    detail: "passcode set in the fleet")
            }
        }
        return true
    }

    /// A template made on the same kind of reader as this terminal's (driver and device type) is
    /// opened with the fleet keyring and stored under the store key; any other, and every
    /// template at a terminal whose reader keeps prints on the sensor, is ignored. A removal
    /// removes the finger it was applied as.
    private func applyFleetTemplate(_ change: FleetChange, _ fleet: FleetApplyContext) throws(StoreError) -> Bool {
        guard let reader = fleet.reader, !reader.isMatchOnChip else { return false }
        if change.isDeletion {
            guard let (person, finger) = try store.fleetTemplate(change.key) else { return false }
            try applyingFleet { () throws(StoreError) in
                try audited { tx throws(StoreError) in
                    try store.removeFingers(finger, of: person)
                    try recordFleetRowVersion(change)
                    try tx.audit(
                        nil, action: .fleetApply, result: .success, person: person.name.rawValue, method: "fingerprint",
                        detail: "finger \(finger) removed in the fleet")
                }
            }
            return true
        }
        let fields = change.fields
        guard fields["driver"] == reader.driver, fields["device_type"] == reader.deviceType,
            let templateID = fields["template_id"], let templateUUID = UUID(uuidString: templateID),
            let fleetID = fields["person_id"], let personUUID = UUID(uuidString: fleetID),
            let finger = fields["finger"], let sealed = FleetChange.sealedBlob(in: fields),
            let person = try store.person(fleetID: fleetID)
        else { return false }
        let template: [UInt8]
        do {
            template = try fleet.keyring.open(sealed, binding: .template(templateUUID, person: personUUID))
        } catch { throw StoreError.fleet("the template of \(person.name.rawValue) does not open: \(error)") }
        try applyingFleet { () throws(StoreError) in
            try audited { tx throws(StoreError) in
                if person.fingers.contains(finger) { try store.removeFingers(finger, of: person) }
                try store.addFinger(finger, template: template, for: person, now: now())
                try store.linkFleetTemplate(templateID, person: person, finger: finger)
                try recordFleetRowVersion(change)
                try tx.audit(
                    nil, action: .fleetApply, result: .success, person: person.name.rawValue, method: "fingerprint",
                    detail: "finger \(finger) enrolled in the fleet")
            }
        }
        return true
    }

    /// The fleet-wide failure sum (docs/fleet.md §5): this terminal counts the sum pulled plus
    /// its own failures not yet pushed (`FleetPasscodeBudget`), hard-locks at HardLockAfter, and
    /// clears when the fleet was reset and nothing is pending here. While a reset made here
    /// waits in the queue, the sum pulled predates it and is set aside: only the failures since
    /// count, and a count of 0 lowers the count without lifting a delay or a hard lock. For a
    /// bounded time only, `resetWindow`: a queue that stays stuck (its pushes refused, or their
    /// answers held back, while pulls work) must not leave this terminal blind to a lock the
    /// rest of the fleet counted. When the window ends, the sum last pulled counts again
    /// (`endFleetResetWindows`), the forgiven failures with it, until the reset goes through:
    /// failing closed.
    private func applyFleetLockout(_ change: FleetChange) throws(StoreError) -> Bool {
        let fields = change.fields
        guard let fleetID = fields["person_id"], let pulled = fields["fleet_failures"].flatMap({ Int($0) }),
            let person = try store.person(fleetID: fleetID)
        else { return false }
        let setAside = try store.setsAsideFleetSum(fleetID: fleetID, window: resetWindow)
        return try countFleetFailures(
            of: person, pulled: pulled, setAside: setAside, note: setAside ? " (set aside: a reset queued here)" : "")
    }

    /// Counts a person's failures from the fleet sum `pulled` (0 when `setAside`) and the
    /// failures not yet pushed from here, and saves (and audits) what changed.
    private func countFleetFailures(
        of person: StoredPerson, pulled: Int, setAside: Bool, note: String
    ) throws(StoreError) -> Bool {
        // Attempts whose check is under way count here too: they were counted as failures
        // before their hash was checked, and are reported only once it has been.
        let unpushed = try store.unpushedFleetFailures(of: person) + store.unfinishedPasscodeAttempts(of: person)
        let sum = setAside ? 0 : pulled
        let budget = FleetPasscodeBudget(
            hardLockAfter: configuration.passcode.hardLockAfter,
            delaysSeconds: configuration.passcode.lockoutDelays.map { Int($0) })
        let count = budget.failures(fleetSum: sum, unpushedLocal: unpushed)
        var failures = person.failures
        if count == 0 && !setAside {
            failures.passcodeFailures = 0
            failures.passcodeLockedUntil = nil
            failures.passcodeHardLocked = false
        } else {
            failures.passcodeFailures = count
            if !budget.mayAttempt(fleetSum: sum, unpushedLocal: unpushed) { failures.passcodeHardLocked = true }
        }
        guard failures != person.failures else {
            try store.setFleetFailureSum(pulled, of: person)
            return false
        }
        try applyingFleet { () throws(StoreError) in
            try audited { tx throws(StoreError) in
                try store.setFleetFailureSum(pulled, of: person)
                try store.saveFailures(failures, for: person, now: now())
                try tx.audit(
                    nil, action: .fleetApply, result: .success, person: person.name.rawValue, method: "passcode",
                    detail:
                        "fleet failures=\(pulled)\(note), unpushed here=\(unpushed)\(failures.passcodeHardLocked ? ", hard-locked" : "")"
                )
            }
        }
        return true
    }

    /// How long a reset queued here makes this terminal set the pulled fleet sum aside: the
    /// first non-zero `LockoutDelaysSec` (60 s by default), or 60 s when there is none. Within
    /// it a guesser here meets only the failures counted here since the reset, and once those
    /// reach the first delay, waiting it out ends the window (docs/fleet.md §5).
    var resetWindow: TimeInterval { configuration.passcode.lockoutDelays.first(where: { $0 > 0 }) ?? 60 }

    /// Ends the reset windows that are over: each person for whom a pulled sum was set aside
    /// counts the sum last pulled again, now, rather than at the directory's next change of
    /// their row, which a stuck queue may never bring. Run before every passcode check and at
    /// the start of every sync, reachable or not. A store error is logged: what it precedes
    /// goes on.
    func endFleetResetWindows() {
        let ended: [(StoredPerson, Int)]
        do { ended = try store.endedFleetResetWindows(window: resetWindow) } catch {
            logger.error("fleet reset windows not ended", metadata: ["error": "\(error.message)"])
            return
        }
        // Each person on their own: one that cannot be saved is named again next time.
        for (person, pulled) in ended {
            do {
                _ = try countFleetFailures(
                    of: person, pulled: pulled, setAside: false,
                    note: " (counted again: the window of a reset queued here ended before the directory had it)")
                try store.expireFleetResets(of: person, window: resetWindow)
            } catch {
                logger.error(
                    "fleet reset window not ended",
                    metadata: ["person": "\(person.name.rawValue)", "error": "\(error.message)"])
            }
        }
    }
}

extension StoreError {
    static func fleet(_ reason: String) -> StoreError { fleetChange(reason) }
}
