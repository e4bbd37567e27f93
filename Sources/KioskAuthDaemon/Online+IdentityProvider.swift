import Crypto
import FoundationEssentials
import KioskAuthCore
import KioskAuthIdentity
import KioskAuthProtocol
import KioskAuthStore

// Online logins with the identity provider, the offline window that bounds local unlock of IdP
// people, and the terminal's connectivity. The identity provider is only ever called from the
// login methods and the refresh service; the unlock paths (VerifyPasscode, VerifyFinger,
// Identify) only read the store and the clock, so a provider that is down or hanging cannot
// slow them down.

extension OnlineAuthority {
    static let offlineWindowStateKey = "offline-window"
    /// The line PAM and the CLI show when the offline window has ended.
    static let offlineWindowMessage = "Sign in online: this terminal has been offline for too long."
    /// The line shown when a person's unlock is suspended until an online login.
    static let onlineLoginRequiredMessage = "Sign in online: your organisation's sign-in must be renewed."
    /// Longest email and password accepted (RFC 5321 path limit; a generous password cap).
    static let maximumEmailLength = 254
    static let maximumPasswordLength = 1024

    // MARK: Start-up

    /// Loads the offline-window state, the open sessions and the refresh schedule from the store.
    /// Called once, before the socket is served.
    func startOnline() {
        if let state = try? terminalValue(
            OfflineWindow.State.self, forKey: Self.offlineWindowStateKey, caller: nil, action: .offlineWindow)
            ?? nil
        {
            online.offlineWindow = OfflineWindow(policy: online.offlineWindow.policy, state: state)
        }
        observeClock()
        restoreSessions()
        restoreRefreshSchedule()
    }

    // MARK: Errors

    /// Every identity-provider failure as exactly one named API error.
    static func apiError(identity error: any Error) -> APIError {
        guard let error = error as? IdentityError else {
            if error is CancellationError {
                return APIError.own("IdentityProviderUnavailable", ["reason": .string("cancelled")])
            }
            return APIError.own("IdentityProviderUnavailable", ["reason": .string("the request failed")])
        }
        switch error.code {
        case .invalidCredentials: return APIError.own("WrongCredentials")
        case .notAdmitted: return APIError.own("NotAdmitted", ["reason": .string(error.message)])
        case .unknownRole: return APIError.own("UnknownRole", ["reason": .string(error.message)])
        case .unreachable, .timedOut, .connectionLost, .serverError:
            return APIError.own("IdentityProviderUnavailable", ["reason": .string(error.message)])
        case .authorizationDenied: return APIError.own("DeviceLoginDenied")
        case .deviceCodeExpired: return APIError.own("DeviceLoginExpired")
        default: return APIError.own("IdentityProviderRefused", ["reason": .string(error.message)])
        }
    }

    static let notConfigured = APIError.own("IdentityProviderNotConfigured")

    static func offlineWindowExpired(_ name: LoginName) -> APIError {
        APIError.own(
            "OfflineWindowExpired", ["name": .string(name.rawValue), "message": .string(offlineWindowMessage)])
    }

    // MARK: Online login

    func loginWithPassword(
        _ caller: Caller, _ input: Message.LoginWithPassword
    ) async throws(APIError)
        -> Message.OnlineLogin
    {
        let service = input.context?.service
        let gate = try openOnlineLoginGate(caller, context: input.context, name: nil, method: "idp-password")
        guard let provider = services.provider else { throw Self.notConfigured }
        let email = input.email.trimmingWhitespace(newlines: false)
        guard (3...Self.maximumEmailLength).contains(email.utf8.count), email.contains("@"),
            !email.contains(where: { $0.isNewline || $0 == "\0" || $0.isWhitespace })
        else { throw APIError.invalidInput("email", "expected an email address") }
        guard (1...Self.maximumPasswordLength).contains(input.password.utf8.count) else {
            throw APIError.invalidInput("password", "a password is 1 to \(Self.maximumPasswordLength) bytes")
        }
        // From su and the like, only the invoking user's own address is tried.
        if let invoking = gate.invokingPerson {
            let recorded = try? store.identityProviderProfile(of: invoking).email
            guard let recorded, recorded.lowercased() == email.lowercased() else {
                audit(
                    caller, action: .idpLogin, result: .refused, method: "idp-password", service: service,
                    detail: "\(service ?? "-") accepts an online login only for the invoking user")
                throw APIError.own(
                    "OnlineLoginNotAllowed",
                    ["reason": .string("\(service ?? "-") accepts an online login only for the invoking user")])
            }
        }
        let slot = try reserveOnlineLoginSlot(caller)
        let started = services.clock.reading()
        let result: LoginResult
        do {
            result = try await provider.passwordLogin(email: email, password: input.password)
            settleOnlineLoginSlot(reservedAt: slot, error: nil)
        } catch {
            settleOnlineLoginSlot(reservedAt: slot, error: error)
            noteProvider(error)
            audit(
                caller, action: .idpLogin, result: .failure, method: "idp-password", service: service,
                detail: "\(email): \(Self.summary(error))")
            throw Self.apiError(identity: error)
        }
        return try await completeOnlineLogin(
            caller, result, method: "idp-password", service: service, startedAt: started,
            invokingPerson: gate.invokingPerson)
    }

    func startDeviceLogin(
        _ caller: Caller, _ input: Message.StartDeviceLogin, sink: ReplySink
    ) async throws(APIError)
        -> Message.OnlineLogin
    {
        let service = input.context?.service
        let gate = try openOnlineLoginGate(caller, context: input.context, name: nil, method: "idp-device")
        guard let provider = services.provider else { throw Self.notConfigured }
        guard sink.wantsMore else { throw APIError(VarlinkErrorName.expectedMore) }
        let started = services.clock.reading()
        let authorization: DeviceAuthorization
        do {
            authorization = try await provider.startDeviceAuthorization()
        } catch {
            noteProvider(error)
            audit(
                caller, action: .idpLogin, result: .failure, method: "idp-device", service: service,
                detail: Self.summary(error))
            throw Self.apiError(identity: error)
        }
        noteProviderAnswered()
        let prompt = DeviceLoginPrompt(
            userCode: authorization.userCode, verificationUri: authorization.verificationURI.absoluteString,
            verificationUriComplete: authorization.verificationURIComplete?.absoluteString,
            expiresIn: Int(authorization.expiresIn.components.seconds),
            interval: Int(authorization.interval.components.seconds))
        try? await sink.progress(Message.OnlineLogin(prompt: prompt))
        let result: LoginResult
        do {
            result = try await provider.waitForDeviceAuthorization(authorization)
        } catch {
            noteProvider(error)
            audit(
                caller, action: .idpLogin, result: .failure, method: "idp-device", service: service,
                detail: Self.summary(error))
            throw Self.apiError(identity: error)
        }
        return try await completeOnlineLogin(
            caller, result, method: "idp-device", service: service, startedAt: started,
            invokingPerson: gate.invokingPerson)
    }

    static func summary(_ error: any Error) -> String {
        if let error = error as? IdentityError { return "\(error.code): \(error.message)" }
        return "\(type(of: error))"
    }

    /// Records a successful online login: the person (created at first login), their roles,
    /// sealed refresh token and new offline window; lifts a suspension and clears a passcode hard
    /// lock; starts background refresh.
    func completeOnlineLogin(
        _ caller: Caller, _ result: LoginResult, method: String, service: String?, startedAt: ClockReading,
        invokingPerson: StoredPerson? = nil
    ) async throws(APIError)
        -> Message.OnlineLogin
    {
        let identity = result.identity
        // From su and the like, the login must be the invoking user's own person; anyone else is
        // refused before anything is recorded.
        if let invokingPerson,
            (try? store.person(withSubject: identity.subject))?.id != invokingPerson.id
        {
            audit(
                caller, action: .idpLogin, result: .refused, method: method, service: service,
                detail: "signed in as someone other than the invoking user")
            throw APIError.own(
                "OnlineLoginNotAllowed",
                ["reason": .string("\(service ?? "-") accepts an online login only for the invoking user")])
        }
        try refuseSubjectChange(caller, result, method: method, service: service)
        var roles: [Role] = []
        for text in identity.roles {
            guard let role = Role(rawValue: text) else {
                throw APIError.own(
                    "UnknownRole", ["reason": .string("the role \(text) is not one this terminal knows")])
            }
            roles.append(role)
        }
        let roleSet: RoleSet
        do { roleSet = try RoleSet(roles) } catch {
            throw APIError.own("UnknownRole", ["reason": .string("the provider sent no role claim")])
        }
        let reading = services.clock.reading()
        let (contact, windowActions) = online.offlineWindow.recordContact(at: reading)
        applyWindowActions(windowActions)
        let lifetime = Self.lifetime(of: result.tokens, at: reading.wall)
        let refreshToken = result.tokens.refreshToken.map { Array($0.rawValue.utf8) }
        let login = OnlineLogin(
            subject: identity.subject, email: identity.email,
            candidateNames: Self.candidateNames(email: identity.email, subject: identity.subject).filter {
                access.accounts.uidOfAccount($0.rawValue) == nil
            },
            displayName: LoginContextPolicy.displayName(email: identity.email), roles: roleSet,
            contact: contact, refreshToken: refreshToken,
            refresh: refreshToken.map { _ in RefreshRecord(token: lifetime) })
        // The revocation of the token family this login replaces, the login's person and
        // tokens, and the audit entry: one transaction.
        var revocationQueued = false
        let (person, created) = try audited(caller, action: .idpLogin) { tx throws(StoreError) in
            // A login starts a new token family: the one it replaces is revoked, not left alive.
            if let existing = try? store.person(withSubject: identity.subject),
                (try? store.queueRevocation(of: existing, now: reading.wall)) == true
            {
                revocationQueued = true
            }
            let (person, created) = try store.recordOnlineLogin(login, now: reading.wall)
            try tx.audit(
                caller, action: .idpLogin, result: .success, person: person.name.rawValue, method: method,
                service: service,
                detail: Self.loginDetail(identity, roles: roleSet, created: created, refreshToken: refreshToken != nil))
            return (person, created)
        }
        if revocationQueued { services.refreshWakeup.signal() }
        online.names[person.id] = person.name
        _ = online.bumpGeneration(of: person.id)
        var random = SystemRandomNumberGenerator()
        if refreshToken != nil {
            performRefreshActions(online.schedule.track(person.id, token: lifetime, at: reading.wall, using: &random))
        } else {
            performRefreshActions(online.schedule.stopTracking(person.id, at: reading.wall))
        }
        online.accessTokens[person.id] = CachedAccessToken(
            token: result.tokens.accessToken, obtainedAt: lifetime.obtainedAt, expiresAt: lifetime.expiresAt)
        noteProviderAnswered()
        let offer = await shouldOfferFingerprint(person)
        return Message.OnlineLogin(
            person: record(person), created: created, offerFingerprint: offer,
            ticket: issueTicket(for: person, caller: caller, startedAt: startedAt),
            ticketExpiresIn: Int(configuration.access.ticketLifetime))
    }

    /// A login whose email belongs to an identity-provider person pinned to another subject (the
    /// account was deleted and recreated at the provider, or the provider changed how it names
    /// people) is refused: the new account must not take over the old person's record, fingers
    /// and sessions, nor become a second person with the same email. An administrator who means
    /// it removes the old person; the next login then creates the person afresh.
    func refuseSubjectChange(
        _ caller: Caller, _ result: LoginResult, method: String, service: String?
    ) throws(APIError) {
        let identity = result.identity
        guard (try? store.person(withSubject: identity.subject)) == nil, let email = identity.email?.lowercased(),
            let people = try? store.identityProviderPeople(),
            let (holder, profile) = people.first(where: { person, profile in
                profile.subject != nil && profile.subject != identity.subject
                    && (profile.email?.lowercased() == email || person.name.rawValue == email)
            })
        else { return }
        let name = holder.name.rawValue
        let reason =
            "the identity provider now names \(email) with the subject \(identity.subject), not \(profile.subject ?? "-"): "
            + "the account was recreated or renamed at the provider; an administrator who means it removes the old "
            + "person first (kioskauthctl user remove \(name))"
        audit(
            caller, action: .idpLogin, result: .refused, person: name, method: method, service: service,
            detail: "subject-changed: \(reason)")
        // The refused login's tokens are nobody's: revoked, not left alive at the provider.
        if let orphan = result.tokens.refreshToken,
            (try? store.queueRevocation(token: Array(orphan.rawValue.utf8), ofPersonNamed: name, now: now())) != nil
        {
            services.refreshWakeup.signal()
        }
        throw APIError.own("SubjectChanged", ["name": .string(name), "reason": .string(reason)])
    }

    /// The audit detail of a successful online login: what was created, the roles and where
    /// they came from, and where the email came from when no token or userinfo carried it.
    static func loginDetail(_ identity: IdentityClaims, roles: RoleSet, created: Bool, refreshToken: Bool) -> String {
        var detail = "\(created ? "created; " : "")roles=\(roles.all.map(\.rawValue).joined(separator: ","))"
        if identity.roleSource != "claim", !identity.roleSource.isEmpty {
            detail += " (from \(identity.roleSource == "default" ? "DefaultRole" : identity.roleSource))"
        }
        if identity.emailSource == "login-name" {
            detail += "; email as typed at sign-in (the provider sent none)"
        }
        if !refreshToken { detail += "; no refresh token issued" }
        return detail
    }

    /// The access token's lifetime on the daemon's clock: the provider client measured the expiry
    /// against the real wall clock, so only the remaining duration is carried over.
    static func lifetime(of tokens: TokenSet, at now: Date, receivedAt: Date = Date()) -> AccessTokenLifetime {
        let remaining = max(0, tokens.accessTokenExpiresAt.timeIntervalSince(receivedAt))
        return AccessTokenLifetime(obtainedAt: now, expiresAt: now.addingTimeInterval(remaining))
    }

    /// Login names for a new IdP person: the email address when it is a valid login name as it is,
    /// else `idp-` and a digest of the subject (see ``IdentityProviderLoginName``). The caller drops
    /// names that are Unix accounts; the store skips names held by someone else.
    static func candidateNames(email: String?, subject: String) -> [LoginName] {
        let digest = SHA256.hash(data: Data("kioskauth-login-name\0\(subject)".utf8))
        return IdentityProviderLoginName.candidates(
            email: email, digestHex: Hex.encode(Array(digest)))
    }

    /// Offer fingerprint enrolment: policy allows, a reader is present, the person has no finger
    /// yet and has not declined.
    func shouldOfferFingerprint(_ person: StoredPerson) async -> Bool {
        guard configuration.identityProvider.offerFingerprint, configuration.fingerprint.enabled,
            person.fingers.isEmpty,
            let reader, !(await reader.readers.isEmpty)
        else { return false }
        return (try? store.identityProviderProfile(of: person).isBiometricOfferEnabled) ?? false
    }

    func setBiometricOffer(_ caller: Caller, _ input: Message.SetBiometricOffer) throws(APIError) -> PersonRecord {
        let name = try loginName(input.name)
        let person = try authorisedPerson(
            name, caller: caller, action: .personBiometricOffer,
            privileged: groups.isAdmin(caller) || groups.isAuthenticator(caller),
            refusal: "you may only change your own biometric offer")
        if !groups.isAdmin(caller) && !isSelf(caller, person) {
            guard groups.isAuthenticator(caller), let ticket = input.ticket,
                consumeTicket(ticket, person: person, caller: caller)
            else {
                audit(
                    caller, action: .personBiometricOffer, result: .refused, person: name.rawValue,
                    detail: "not an admin, not self, no valid ticket")
                throw APIError.permissionDenied(
                    "only admins, the person, or the app that just authenticated them may change the offer")
            }
        }
        try audited(caller, action: .personBiometricOffer, person: name.rawValue) { tx throws(StoreError) in
            try store.setBiometricOffer(input.enabled, for: person, now: now())
            try tx.audit(
                caller, action: .personBiometricOffer, result: .success, person: name.rawValue,
                detail: input.enabled ? "on" : "declined")
        }
        return record(try existingPerson(name, caller: caller, action: .personBiometricOffer))
    }

    // MARK: The offline window

    /// Refuses local unlock of an IdP person whose unlock is suspended or whose offline window
    /// has ended. Reads only the store and the clock: never the network. Local people pass.
    func checkOfflineUnlock(
        _ caller: Caller?, _ person: StoredPerson, action: AuditAction, method: String?, service: String?
    )
        throws(APIError)
    {
        guard person.origin == .idp else { return }
        let profile = try withStore(caller, action: action, person: person.name.rawValue) { () throws(StoreError) in
            try store.identityProviderProfile(of: person)
        }
        if let reason = profile.suspendedReason {
            audit(
                caller, action: action, result: .refused, person: person.name.rawValue, method: method,
                service: service, detail: "suspended until an online login: \(reason)")
            throw APIError.own(
                "OnlineLoginRequired",
                [
                    "name": .string(person.name.rawValue), "reason": .string(reason),
                    "message": .string(Self.onlineLoginRequiredMessage),
                ])
        }
        guard let contact = profile.contact else {
            audit(
                caller, action: action, result: .refused, person: person.name.rawValue, method: method,
                service: service, detail: "no online contact recorded")
            throw Self.offlineWindowExpired(person.name)
        }
        let evaluation = online.offlineWindow.evaluate(
            .identityProvider(lastContact: contact), at: services.clock.reading())
        applyWindowActions(evaluation.actions)
        switch evaluation.decision {
        case .notApplicable, .allowed:
            return
        case .expired(let ago):
            audit(
                caller, action: action, result: .refused, person: person.name.rawValue, method: method,
                service: service, detail: "offline window ended \(Int(ago.components.seconds)) s ago")
            throw Self.offlineWindowExpired(person.name)
        case .clockWentBackwards:
            audit(
                caller, action: action, result: .refused, person: person.name.rawValue, method: method,
                service: service, detail: "offline window ended: the wall clock went backwards")
            throw Self.offlineWindowExpired(person.name)
        }
    }

    /// Persists the window's state and audits what it reports.
    func applyWindowActions(_ actions: [OfflineWindow.Action]) {
        for action in actions {
            switch action {
            case .persist(let state):
                saveTerminalValue(state, forKey: Self.offlineWindowStateKey, action: .offlineWindow)
            case .audit(.clockWentBackwards(let previous, let current)):
                logger.warning("the wall clock went backwards; every offline window ended")
                audit(
                    nil, action: .clockBackwards, result: .failure,
                    detail:
                        "wall clock went from \(Self.timestamp(previous.wall)) to \(Self.timestamp(current.wall)); every open offline window ended"
                )
            }
        }
    }

    /// Feeds the window a reading (periodically and at shutdown) so that a reboot with the clock
    /// set back hides at most one interval of uptime.
    func observeClock() {
        let reading = services.clock.reading()
        online.lastObservation = reading
        applyWindowActions(online.offlineWindow.observe(reading))
        checkpointSteadyClock(reading)
    }

    // MARK: Reachability

    /// The provider answered (with tokens, with a refusal, or a reachability probe's success):
    /// it is online.
    ///
    /// This is reachability only. It records nobody's contact for the offline window: that
    /// happens where a person's own tokens were obtained (login, refresh), never here.
    func noteProviderAnswered() {
        let now = now()
        noteTraffic()
        online.reachability.lastAnswer = now
        guard online.reachability.state != .online else { return }
        let wasOffline = online.reachability.state == .offline
        online.reachability.state = .online
        online.reachability.since = now
        logger.info("identity provider reachable")
        publish(EventRecord(kind: "online", time: Self.timestamp(now)))
        if wasOffline {
            // Let the refresher probe at once rather than after its cool-down, send the
            // revocations queued while offline without waiting out their backoff, and the audit
            // events queued meanwhile.
            performRefreshActions(online.schedule.connectivityChanged(at: now))
            online.outboxRetryNow = true
            services.refreshWakeup.signal()
            services.auditDelivery?.networkAvailable()
        }
    }

    /// The provider could not be reached (or failed): it is offline since now, if it was not.
    func noteProviderUnavailable(_ reason: String) {
        noteTraffic()
        guard online.reachability.state != .offline else { return }
        let now = now()
        online.reachability.state = .offline
        online.reachability.since = now
        logger.notice("identity provider unreachable", metadata: ["reason": "\(reason)"])
        publish(EventRecord(kind: "offline", time: Self.timestamp(now), reason: reason))
    }

    /// Classifies a failed call for reachability.
    func noteProvider(_ error: any Error) {
        if let error = error as? IdentityError, !error.isTransient {
            if error.code != .misconfigured { noteProviderAnswered() }
        } else if !(error is CancellationError) {
            noteProviderUnavailable(Self.summary(error))
        }
    }

    func publish(_ event: EventRecord) {
        services.events.publish(event)
    }

    /// Publishes a reader hot-plug event.
    func publishReaderEvent(added: Bool, reader: String) {
        publish(
            EventRecord(kind: added ? "reader-added" : "reader-removed", time: Self.timestamp(now()), reader: reader))
    }

    // MARK: Connectivity

    /// The terminal's connectivity. Root (a greeter or kiosk app) needs only the aggregate, so the
    /// per-person list comes only when asked for (`people`): everyone for admins, otherwise only
    /// the caller's own person. The aggregate goes to root and the kioskauth and admin groups.
    func connectivity(_ caller: Caller, people askedForPeople: Bool = false) throws(APIError) -> Message.Connectivity {
        let seesEveryone = groups.isAdmin(caller)
        let seesAggregate = groups.isAuthenticator(caller) || groups.isAdmin(caller)
        let people = try withStore(caller, action: .connectivity) { () throws(StoreError) in
            try store.identityProviderPeople()
        }
        let reading = services.clock.reading()
        var window = online.offlineWindow
        var list: [PersonConnectivity] = []
        var counts = WindowCounts()
        for (person, profile) in people {
            let listed = askedForPeople && (seesEveryone || isSelf(caller, person))
            guard listed || seesAggregate else { continue }
            var state = "never"
            var left: Int?
            if profile.suspendedReason != nil {
                state = "suspended"
            } else if let contact = profile.contact {
                // A copy: asking must not change (or persist) anything.
                switch window.evaluate(.identityProvider(lastContact: contact), at: reading).decision {
                case .allowed(let remaining):
                    state = "open"
                    left = Int(remaining.components.seconds)
                case .expired: state = "expired"
                case .clockWentBackwards: state = "clock-went-backwards"
                case .notApplicable: state = "open"
                }
            }
            counts.count(state)
            guard listed else { continue }
            list.append(
                PersonConnectivity(
                    name: person.name.rawValue, window: state, windowSecondsLeft: left,
                    lastContactAt: profile.contact.map { Self.timestamp($0.reading.wall) },
                    suspendedReason: profile.suspendedReason))
        }
        let outbox = try withStore(caller, action: .connectivity) { () throws(StoreError) in try store.outboxSummary()
        }
        let circuit: String
        switch online.schedule.circuit {
        case .closed: circuit = "closed"
        case .open: circuit = "open"
        case .halfOpen: circuit = "half-open"
        }
        return Message.Connectivity(
            identityProvider: services.provider != nil, state: online.reachability.state.rawValue,
            since: online.reachability.since.map(Self.timestamp),
            lastContactAt: online.reachability.lastAnswer.map(Self.timestamp),
            circuit: circuit, offlineWindowSeconds: Int(configuration.identityProvider.offlineWindow), people: list,
            windows: seesAggregate ? counts : nil, outboxPending: outbox.pending,
            lastDeliveryAt: outbox.lastDelivery.map(Self.timestamp),
            lastDeliveryError: outbox.lastError)
    }

    // MARK: Removal

    /// Before a person is removed: queue the revocation of their refresh token (sealed, delivered
    /// by the refresh service when online), end their sessions and stop refreshing for them.
    func prepareRemoval(_ caller: Caller, of person: StoredPerson) throws(APIError) {
        let queued = try audited(caller, action: .personRemove, person: person.name.rawValue) {
            tx throws(StoreError) in
            let queued = try store.queueRevocation(of: person, now: now())
            if queued {
                try tx.audit(
                    caller, action: .idpRevoke, result: .success, person: person.name.rawValue,
                    detail: "refresh token revocation queued for delivery")
            }
            return queued
        }
        if queued { services.refreshWakeup.signal() }
        endSessions(of: person.id, reason: .personRemoved)
        performRefreshActions(online.schedule.stopTracking(person.id, at: now()))
        online.generations[person.id] = nil
        online.accessTokens[person.id] = nil
        online.names[person.id] = nil
    }
}
