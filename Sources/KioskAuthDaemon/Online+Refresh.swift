import FoundationEssentials
import KioskAuthCore
import KioskAuthIdentity
import KioskAuthProtocol
import KioskAuthStore

// The decisions behind background refresh: the RefreshSchedule state machine lives here, in the
// actor, and RefreshService (RefreshService.swift) only sends the requests it is handed and
// reports how they ended. Every record is persisted before its request is sent, and a rotated
// refresh token is written in the same transaction as the record that follows it.

extension OnlineAuthority {
    /// Outbox deliveries in flight at once.
    static let maximumConcurrentDeliveries = 4
    /// Longest pause between delivery attempts of one outbox item.
    static let maximumDeliveryBackoff: TimeInterval = 3600
    /// `GetSessionToken` refreshes a token that expires sooner than this.
    static let minimumAccessTokenValidity: TimeInterval = 30

    /// Rebuilds the schedule from the persisted records (start-up).
    func restoreRefreshSchedule() {
        guard services.provider != nil else { return }
        let people: [(person: StoredPerson, profile: IdentityProviderProfile)]
        do { people = try store.identityProviderPeople() } catch {
            logger.error(
                "cannot read identity-provider people; background refresh disabled",
                metadata: ["error": "\(error.message)"])
            return
        }
        let now = now()
        var random = SystemRandomNumberGenerator()
        var restored = 0
        for (person, profile) in people {
            guard let record = profile.refresh, (try? store.refreshToken(of: person)) != nil else { continue }
            online.names[person.id] = person.name
            _ = online.bumpGeneration(of: person.id)
            performRefreshActions(online.schedule.restore(person.id, from: record, at: now, using: &random))
            restored += 1
        }
        if restored > 0 { logger.info("background refresh schedule restored", metadata: ["people": "\(restored)"]) }
    }

    /// Performs the schedule's actions in order. `success` carries what a successful refresh of
    /// one person must persist with that person's next record: the rotated token and the contact.
    func performRefreshActions(
        _ actions: [RefreshSchedule<Int64>.Action],
        success: (personID: Int64, rotatedToken: [UInt8]?, contact: OfflineWindow.Contact)? = nil
    ) {
        var success = success
        for action in actions {
            switch action {
            case .refresh(let person, let at):
                online.refreshTimers[person] = at
                services.refreshWakeup.signal()
            case .cancelRefresh(let person):
                online.refreshTimers[person] = nil
            case .wakeCircuitBreaker(let at):
                // Kept on steady time: setting the wall clock back does not keep the breaker
                // asleep (nor does setting it forward wake it early).
                online.breakerWake = steadyNow().addingTimeInterval(at.timeIntervalSince(now()))
                services.refreshWakeup.signal()
            case .persist(let personID, let record):
                guard let person = trackedPerson(personID) else { continue }
                let carried = success?.personID == personID ? success : nil
                if carried != nil { success = nil }
                do {
                    try store.saveRefresh(
                        record, rotatedToken: carried?.rotatedToken, contact: carried?.contact, for: person, now: now())
                } catch {
                    logger.error(
                        "cannot persist a refresh record",
                        metadata: ["person": "\(person.name)", "error": "\(error.message)"])
                }
            case .startRefresh(let personID):
                startRefresh(personID)
            case .suspend(let personID, let reason):
                suspend(personID, reason: Self.suspensionReason(reason), record: online.schedule.record(for: personID))
            case .audit(let event):
                auditRefresh(event)
            }
        }
    }

    static func suspensionReason(_ reason: RefreshSuspension) -> String {
        switch reason {
        case .refreshTokenRejected: "refresh-token-rejected"
        case .refreshTokenRejectedAfterLostResponse: "refresh-token-rejected-after-lost-response"
        }
    }

    func trackedPerson(_ personID: Int64) -> StoredPerson? {
        guard let name = online.names[personID], let person = try? store.person(named: name), person.id == personID
        else {
            return nil
        }
        return person
    }

    /// Hands a refresh to the refresh service (the in-flight record is already persisted).
    private func startRefresh(_ personID: Int64) {
        guard let person = trackedPerson(personID), let token = try? store.refreshToken(of: person) else {
            // Nothing to refresh with: stop scheduling; an online login starts again.
            logger.warning("no refresh token for a scheduled refresh", metadata: ["person": "\(personID)"])
            performRefreshActions(online.schedule.stopTracking(personID, at: now()))
            return
        }
        let generation = online.bumpGeneration(of: personID)
        online.pendingJobs.append(
            RefreshJob(
                personID: personID, name: person.name, generation: generation,
                refreshToken: OAuthToken(String(decoding: token, as: UTF8.self))))
        services.refreshWakeup.signal()
    }

    private func auditRefresh(_ event: RefreshSchedule<Int64>.AuditEvent) {
        func name(_ id: Int64) -> String? { online.names[id]?.rawValue }
        switch event {
        case .refreshTokenRejected(let id):
            audit(
                nil, action: .idpRefresh, result: .failure, person: name(id), method: "idp",
                detail: "refresh token rejected (invalid_grant): local unlock suspended until the next online login")
        case .refreshTokenRejectedAfterLostResponse(let id):
            audit(
                nil, action: .idpRefresh, result: .failure, person: name(id), method: "idp",
                detail:
                    "refresh token rejected after a lost response (possibly our own retry, not necessarily a revocation): local unlock suspended until the next online login"
            )
        case .refreshInterruptedByRestart(let id):
            audit(
                nil, action: .idpRefresh, result: .failure, person: name(id), method: "idp",
                detail: "a refresh was in flight when the daemon stopped; retried as a lost response")
        case .circuitOpened(let until, let failures):
            audit(
                nil, action: .idpCircuit, result: .failure,
                detail: "opened after \(failures) failures in a row; refreshes pause until \(Self.timestamp(until))")
        case .circuitClosed:
            audit(nil, action: .idpCircuit, result: .success, detail: "closed: the identity provider answers again")
        }
    }

    /// Suspends a person's local unlock until their next online login: their sessions end.
    /// `recording` appends the audit entries of the suspension in its transaction.
    func suspend(
        _ personID: Int64, reason: String, record: RefreshRecord?,
        recording: (AuditedTransaction) throws(StoreError) -> Void = { _ in }
    ) {
        guard let person = trackedPerson(personID) else { return }
        do {
            try audited { tx throws(StoreError) in
                try store.suspend(person, reason: reason, refresh: record, now: now())
                try recording(tx)
            }
        } catch {
            logger.error(
                "cannot suspend a person", metadata: ["person": "\(person.name)", "error": "\(error.message)"])
        }
        online.accessTokens[personID] = nil
        endSessions(of: personID, reason: .securityLogout)
        publish(
            EventRecord(
                kind: "person-suspended", time: Self.timestamp(now()), name: person.name.rawValue, reason: reason))
    }

    // MARK: The refresh service's side

    /// Fires the timers that are due and returns the work to start now (refreshes, deliveries
    /// and, with its timeout, a reachability probe), and how long the service may sleep before
    /// asking again.
    func refreshTick() -> (jobs: [RefreshJob], deliveries: [DeliveryJob], probe: Duration?, sleep: Duration) {
        let now = now()
        for (person, at) in online.refreshTimers where at <= now {
            online.refreshTimers[person] = nil
            performRefreshActions(online.schedule.requestRefresh(for: person, at: now))
        }
        let steady = steadyNow()
        if let wake = online.breakerWake, wake <= steady {
            online.breakerWake = nil
            performRefreshActions(online.schedule.circuitTimerFired(at: now))
        }
        let jobs = online.pendingJobs
        online.pendingJobs = []
        var deliveries: [DeliveryJob] = []
        var circuitOpen = false
        if case .open(let until) = online.schedule.circuit, until > now { circuitOpen = true }
        let room = Self.maximumConcurrentDeliveries - online.deliveriesInFlight.count
        if services.provider != nil, !circuitOpen, room > 0 {
            // Just back online: every queued item is due, whatever its backoff said.
            let dueBy = online.outboxRetryNow ? Date.distantFuture : now
            online.outboxRetryNow = false
            let due = (try? store.dueOutboxItems(now: dueBy, limit: room + online.deliveriesInFlight.count)) ?? []
            for item in due where !online.deliveriesInFlight.contains(item.id) && deliveries.count < room {
                guard let secret = item.secret else {
                    try? store.markDelivered(item.id, now: now)
                    continue
                }
                online.deliveriesInFlight.insert(item.id)
                let person = item.payload.flatMap {
                    try? JSONDecoder().decode([String: String].self, from: Data($0.utf8))
                }?["person"]
                deliveries.append(
                    DeliveryJob(
                        id: item.id, kind: item.kind, person: person,
                        token: OAuthToken(String(decoding: secret, as: UTF8.self)),
                        attempts: item.attempts))
            }
        }
        var next = online.refreshTimers.values.min()
        if let wake = online.breakerWake.map({ now.addingTimeInterval($0.timeIntervalSince(steady)) }) {
            next = min(next ?? wake, wake)
        }
        if let outbox = try? store.nextOutboxAttempt(), online.deliveriesInFlight.isEmpty || outbox > now {
            next = min(next ?? outbox, outbox)
        }
        var sleep =
            next.map { Duration.milliseconds(Int64(max(0, $0.timeIntervalSince(now)) * 1000)) } ?? .seconds(3600)
        let probe = takeProbe()
        if let probeSleep = probe.sleep { sleep = min(sleep, probeSleep) }
        return (jobs, deliveries, probe.timeout, sleep)
    }

    /// Reports how a refresh ended.
    func completeRefresh(_ job: RefreshJob, _ result: RefreshJobResult) {
        guard online.generations[job.personID] == job.generation else {
            logger.debug("discarding the result of a superseded refresh", metadata: ["person": "\(job.name)"])
            // The provider rotated a token nobody will use (the person logged in again or was
            // removed meanwhile): revoke it rather than leave it alive.
            if case .refreshed(let refreshed, _) = result, let orphan = refreshed.tokens.refreshToken {
                do {
                    try store.queueRevocation(
                        token: Array(orphan.rawValue.utf8), ofPersonNamed: job.name.rawValue, now: now())
                    services.refreshWakeup.signal()
                } catch {
                    logger.error(
                        "cannot queue the revocation of an orphaned refresh token",
                        metadata: ["error": "\(error.message)"])
                }
            }
            return
        }
        countRefresh(result)
        let reading = services.clock.reading()
        let now = reading.wall
        var random = SystemRandomNumberGenerator()
        switch result {
        case .refreshed(let refreshed, let receivedAt):
            let lifetime = Self.lifetime(of: refreshed.tokens, at: now, receivedAt: receivedAt)
            let (contact, windowActions) = online.offlineWindow.recordContact(at: reading)
            applyWindowActions(windowActions)
            let rotated = refreshed.tokens.refreshToken.map { Array($0.rawValue.utf8) }
            performRefreshActions(
                online.schedule.complete(.succeeded(lifetime), for: job.personID, at: now, using: &random),
                success: (job.personID, rotated, contact))
            online.accessTokens[job.personID] = CachedAccessToken(
                token: refreshed.tokens.accessToken, obtainedAt: lifetime.obtainedAt, expiresAt: lifetime.expiresAt)
            logger.info("tokens refreshed", metadata: ["person": "\(job.name)", "rotated": "\(rotated != nil)"])
            noteProviderAnswered()
            if let identity = refreshed.identity, let person = trackedPerson(job.personID),
                let pinned = try? store.identityProviderProfile(of: person).subject, pinned != identity.subject
            {
                suspendNoLongerAdmitted(
                    job.personID,
                    IdentityError.subjectChanged(
                        "the refreshed identity has the subject \(identity.subject), not \(pinned)"),
                    reason: "subject-changed")
            } else if let violation = refreshed.policyViolation {
                suspendNoLongerAdmitted(job.personID, violation)
            } else if let identity = refreshed.identity, let person = trackedPerson(job.personID) {
                let roles = identity.roles.compactMap(Role.init(rawValue:))
                if roles.count == identity.roles.count, let set = try? RoleSet(roles), set != person.roles {
                    do {
                        try audited { tx throws(StoreError) in
                            try store.setRoles(set, for: person, now: now)
                            try tx.audit(
                                nil, action: .idpRoles, result: .success, person: person.name.rawValue,
                                detail: "roles=\(set.all.map(\.rawValue).joined(separator: ","))")
                        }
                    } catch {
                        logger.error(
                            "cannot record new roles",
                            metadata: ["person": "\(person.name)", "error": "\(error.message)"])
                    }
                }
            }
        case .failed(let error):
            let outcome = Self.outcome(of: error)
            logger.notice("refresh failed", metadata: ["person": "\(job.name)", "error": "\(error)"])
            if case .responseLost = outcome {
                // Neither proof of reachability nor of an outage.
            } else {
                noteProvider(error)
            }
            performRefreshActions(online.schedule.complete(outcome, for: job.personID, at: now, using: &random))
        }
    }

    /// What a client error means to the schedule.
    static func outcome(of error: IdentityError) -> RefreshOutcome {
        switch error.code {
        case .refreshRejected: return .invalidGrant
        case .unreachable: return .unreachable
        case .timedOut: return error.isAmbiguous ? .timedOut : .unreachable
        case .connectionLost: return error.isAmbiguous ? .responseLost : .unreachable
        case .serverError: return .serverError(retryAfter: nil)
        // The provider answered and may have rotated the token, but the answer was unusable.
        case .invalidResponse, .invalidToken: return .responseLost
        // A configuration fault: back off like an unwell provider until an admin fixes it.
        default: return .serverError(retryAfter: nil)
        }
    }

    /// A refresh showed the person is no longer admitted (group or domain removed, role
    /// unknown): stop refreshing, queue the revocation of their token, suspend local unlock.
    private func suspendNoLongerAdmitted(
        _ personID: Int64, _ violation: IdentityError, reason: String = "not-admitted"
    ) {
        guard let person = trackedPerson(personID) else { return }
        performRefreshActions(online.schedule.stopTracking(personID, at: now()))
        // The revocation, the suspension and their audit entry: one transaction.
        var queued = false
        suspend(personID, reason: reason, record: nil) { tx throws(StoreError) in
            queued = (try? store.queueRevocation(of: person, now: now())) == true
            try tx.audit(
                nil, action: .idpRefresh, result: .failure, person: person.name.rawValue, method: "idp",
                detail: "no longer admitted (\(violation.message)): local unlock suspended, tokens revoked")
        }
        if queued { services.refreshWakeup.signal() }
    }

    /// Forgets a delivery cut short by shutdown; it is retried at the next start.
    func releaseDelivery(_ job: DeliveryJob) {
        online.deliveriesInFlight.remove(job.id)
    }

    /// Reports how an outbox delivery ended; a failure is retried with a capped backoff.
    func completeDelivery(_ job: DeliveryJob, error: (any Error)?) {
        online.deliveriesInFlight.remove(job.id)
        let now = now()
        guard let error else {
            try? store.markDelivered(job.id, now: now)
            audit(
                nil, action: .idpRevoke, result: .success, person: job.person, method: "idp",
                detail: "queued revocation delivered")
            noteProviderAnswered()
            return
        }
        noteProvider(error)
        let delay = min(Self.maximumDeliveryBackoff, 5 * Double(1 << min(job.attempts, 20)))
        try? store.markAttemptFailed(job.id, error: Self.summary(error), nextAttempt: now.addingTimeInterval(delay))
        logger.notice(
            "queued revocation not delivered; will retry",
            metadata: ["retry_in": "\(Int(delay)) s", "error": "\(Self.summary(error))"])
    }

    // MARK: Access tokens for kiosk apps

    /// The person's current access token, refreshed first when it is about to expire (less than
    /// 30 s, or a quarter of its lifetime, left). Waits at most the provider's request timeout for
    /// that refresh (this is never an unlock path).
    func accessToken(for person: StoredPerson) async throws(APIError) -> CachedAccessToken {
        if let cached = online.accessTokens[person.id] {
            let lifetime = cached.expiresAt.timeIntervalSince(cached.obtainedAt)
            let margin = min(Self.minimumAccessTokenValidity, lifetime / 4)
            if cached.expiresAt.timeIntervalSince(now()) > margin { return cached }
        }
        guard services.provider != nil else {
            throw APIError.own("NoAccessToken", ["reason": .string("no identity provider is configured")])
        }
        guard online.schedule.phase(of: person.id) != nil else {
            throw APIError.own(
                "NoAccessToken",
                ["reason": .string("no refresh token is held for \(person.name.rawValue): sign in online")])
        }
        let requested = now()
        performRefreshActions(online.schedule.requestRefresh(for: person.id, at: requested))
        let deadline =
            ContinuousClock.now + .milliseconds(Int64(configuration.identityProvider.requestTimeout * 1000))
            + .seconds(1)
        while ContinuousClock.now < deadline {
            do { try await Task.sleep(for: .milliseconds(50)) } catch { break }
            // A token obtained since the request is as fresh as the provider makes them.
            if let cached = online.accessTokens[person.id], cached.obtainedAt >= requested, cached.expiresAt > now() {
                return cached
            }
        }
        throw APIError.own(
            "NoAccessToken", ["reason": .string("the identity provider could not be reached; try again later")])
    }
}
