import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

// Sessions: opened by PAM open_session or a kiosk app, ended by idleness, the overnight cut-off,
// the maximum age, logout or a security logout. SessionStateMachine decides; every request about
// a session re-checks its expiry first, and the timekeeping service re-checks every second, so
// suspend/resume and clock changes are noticed whether or not a timer fired.

extension OnlineAuthority {
    /// Open sessions on the terminal at once.
    static let maximumOpenSessions = 256
    /// Open sessions of one person at once.
    static let maximumSessionsPerPerson = 16
    /// Ended sessions are kept this long for reference, then deleted (the audit trail keeps them).
    static let endedSessionRetention: TimeInterval = 7 * 86400

    // MARK: Start-up

    /// Reloads open sessions; those from another boot end as `rebooted`.
    func restoreSessions() {
        try? store.pruneEndedSessions(before: now().addingTimeInterval(-Self.endedSessionRetention))
        let stored: [StoredSession]
        do { stored = try store.openSessions() } catch {
            logger.error("cannot read sessions", metadata: ["error": "\(error.message)"])
            return
        }
        let reading = services.clock.reading()
        for row in stored {
            guard let state = try? JSONDecoder().decode(PersistedSession.self, from: Data(row.state.utf8)) else {
                logger.warning("dropping an unreadable session", metadata: ["session": "\(row.id)"])
                try? store.updateSession(id: row.id, state: row.state, endedAt: now(), endReason: "unreadable")
                continue
            }
            online.sessions[row.id] = SessionEntry(
                id: row.id, personID: row.personID, name: row.personName, service: row.service, tty: row.tty,
                state: state)
            checkSession(row.id, at: reading)
        }
    }

    // MARK: Applying the state machine's actions

    /// Applies a session's actions, persists it, and forgets it once ended.
    func applySession(_ id: String, _ actions: [SessionStateMachine.Action], at reading: ClockReading) {
        guard let entry = online.sessions[id] else { return }
        var endReason: SessionStateMachine.EndReason?
        for action in actions {
            switch action {
            case .emit(let event):
                var record = EventRecord(
                    kind: "", time: Self.timestamp(reading.wall), session: id, name: entry.name.rawValue)
                switch event {
                case .locked: record.kind = "session-locked"
                case .unlocked: record.kind = "session-unlocked"
                case .ended(let reason):
                    record.kind = "session-ended"
                    record.reason = reason.rawValue
                    endReason = reason
                }
                publish(record)
            case .rescheduleTimeout:
                services.sessionWakeup.signal()
            case .cancelTimeout:
                break
            }
        }
        // A session's end and its audit entry: one transaction.
        persistSession(entry, endReason: endReason, at: reading)
        if endReason != nil { online.sessions[id] = nil }
    }

    private func persistSession(
        _ entry: SessionEntry, endReason: SessionStateMachine.EndReason?, at reading: ClockReading
    ) {
        do {
            let text = String(decoding: try JSONEncoder().encode(entry.state), as: UTF8.self)
            try audited { tx throws(StoreError) in
                try store.updateSession(
                    id: entry.id, state: text, endedAt: endReason.map { _ in reading.wall },
                    endReason: endReason?.rawValue)
                if let endReason {
                    try tx.audit(
                        nil, action: .sessionEnd, result: .success, person: entry.name.rawValue,
                        service: entry.service, detail: "\(entry.id.prefix(8)): \(endReason.rawValue)")
                }
            }
        } catch {
            logger.error(
                "cannot persist a session", metadata: ["session": "\(entry.id.prefix(8))", "error": "\(error)"])
        }
    }

    /// Re-checks one session's end rules.
    func checkSession(_ id: String, at reading: ClockReading) {
        guard var entry = online.sessions[id] else { return }
        let before = entry.state.machine
        let actions = entry.state.machine.check(at: reading)
        online.sessions[id] = entry
        if entry.state.machine != before { applySession(id, actions, at: reading) }
    }

    /// Re-checks every session and feeds the offline window a reading every
    /// `OfflineWindow.recommendedObservationInterval`. Returns how long the timekeeping service
    /// may wait before the next tick: a second while a session is open (its idle lock and end
    /// rules are counted in seconds) or the clock is a test clock (tests move it at will);
    /// otherwise until the next observation is due, so that an idle daemon does not wake every
    /// second for nothing. Opening a session signals the service, which then ticks at once.
    func timekeepingTick() -> Duration {
        let reading = services.clock.reading()
        for id in Array(online.sessions.keys) { checkSession(id, at: reading) }
        let interval = OfflineWindow.recommendedObservationInterval
        var sinceObservation = Duration.zero
        if let last = online.lastObservation, let elapsed = reading.bootTimeElapsed(since: last), elapsed < interval,
            elapsed >= .zero
        {
            sinceObservation = elapsed
        } else {
            observeClock()
        }
        guard online.sessions.isEmpty, services.clock.followsSystemClocks else { return .seconds(1) }
        return max(.seconds(1), interval - sinceObservation)
    }

    /// Ends every open session of a person.
    @discardableResult
    func endSessions(of personID: Int64, reason: SessionStateMachine.EndReason) -> Int {
        let reading = services.clock.reading()
        var ended = 0
        for (id, entry) in online.sessions where entry.personID == personID {
            var updated = entry
            let actions = updated.state.machine.end(reason, at: reading)
            online.sessions[id] = updated
            if !actions.isEmpty { ended += 1 }
            applySession(id, actions, at: reading)
        }
        return ended
    }

    // MARK: Records

    func sessionRecord(_ entry: SessionEntry) -> SessionRecord {
        let machine = entry.state.machine
        var state = "active"
        var endReason: String?
        var endedAt: String?
        switch machine.phase {
        case .active: break
        case .locked: state = "locked"
        case .ended(let reason, let at):
            state = "ended"
            endReason = reason.rawValue
            endedAt = Self.timestamp(at.wall)
        }
        // Wall times of boot-clock readings are what the clock said then.
        return SessionRecord(
            id: entry.id, name: entry.name.rawValue, state: state, service: entry.service, tty: entry.tty,
            openedAt: Self.timestamp(machine.openedAt.wall), lastActivityAt: Self.timestamp(machine.lastActivity.wall),
            lastAuthenticationAt: machine.lastAuthentication.map { Self.timestamp($0.at.wall) },
            lockEpoch: Int(machine.lockEpoch),
            overnightCutoff: machine.overnightCutoff.map(Self.timestamp), endReason: endReason, endedAt: endedAt)
    }

    // MARK: Methods

    func openSession(_ caller: Caller, _ input: Message.OpenSession) throws(APIError) -> SessionRecord {
        let name = try loginName(input.name)
        let service = input.context?.service
        // Authorised before the person is looked up: an unprivileged caller learns nothing about
        // who exists.
        let person = try authorisedPerson(
            name, caller: caller, action: .sessionOpen, privileged: groups.isAuthenticator(caller),
            refusal: "you may only open your own sessions")
        // A session opens on the strength of a fresh authentication of its person on this
        // connection. Only root (the PAM module in a login or greeter process, after another
        // module authenticated) may register one without: it opens unauthenticated and its
        // token is released to nobody until AuthenticateSession.
        guard input.ticket != nil || caller.isRoot else {
            audit(
                caller, action: .sessionOpen, result: .refused, person: name.rawValue, service: service,
                detail: "no ticket")
            throw APIError.ticketInvalid
        }
        try requireAccountAllowed(caller, person, context: input.context, action: .sessionOpen, method: nil)
        try checkOfflineUnlock(caller, person, action: .sessionOpen, method: nil, service: service)
        guard person.state == .active else {
            throw APIError.own(
                "PersonNotActive",
                [
                    "name": .string(name.rawValue),
                    "state": .string(person.state.rawValue.replacing("-", with: "_")),
                ])
        }
        var authenticatedAt: ClockReading?
        if let ticket = input.ticket {
            guard let entry = takeTicket(ticket, person: person, caller: caller) else {
                audit(
                    caller, action: .sessionOpen, result: .refused, person: name.rawValue, service: service,
                    detail: "no valid ticket for this person on this connection")
                throw APIError.ticketInvalid
            }
            authenticatedAt = entry.issuedAt
        }
        guard online.sessions.count < Self.maximumOpenSessions,
            online.sessions.values.filter({ $0.personID == person.id }).count < Self.maximumSessionsPerPerson
        else { throw APIError.invalidInput("name", "too many open sessions") }
        let reading = services.clock.reading()
        var machine = SessionStateMachine(
            openedAt: reading, authenticatedAt: authenticatedAt, policy: configuration.session.policy,
            nextLocalTime: LocalTime.next(after:hour:minute:))
        _ = machine.check(at: reading)
        var bytes = [UInt8](repeating: 0, count: 16)
        var generator = SystemRandomNumberGenerator()
        for index in bytes.indices { bytes[index] = generator.next() }
        let id = Hex.encode(bytes)
        let entry = SessionEntry(
            id: id, personID: person.id, name: person.name, service: service,
            tty: input.context?.tty.map { String($0.prefix(64)) },
            state: PersistedSession(machine: machine, lastLockedAt: nil),
            tokenConnection: authenticatedAt == nil ? nil : caller.connectionID)
        do {
            let session = StoredSession(
                id: id, personID: person.id, personName: person.name,
                state: String(decoding: try JSONEncoder().encode(entry.state), as: UTF8.self),
                service: entry.service,
                tty: entry.tty, openedAt: reading.wall)
            // The session and its audit entry: one transaction.
            try audited { tx throws(StoreError) in
                try store.insertSession(session)
                try tx.audit(
                    caller, action: .sessionOpen, result: .success, person: name.rawValue, service: service,
                    detail: "\(id.prefix(8))\(authenticatedAt == nil ? "" : "; authenticated")")
            }
        } catch let error as StoreError {
            throw try failStore(caller, .sessionOpen, error)
        } catch {
            throw APIError.own("InternalError", ["reason": .string("session did not encode")])
        }
        online.sessions[id] = entry
        services.sessionWakeup.signal()
        publish(
            EventRecord(kind: "session-opened", time: Self.timestamp(reading.wall), session: id, name: name.rawValue))
        return sessionRecord(entry)
    }

    /// The open session `id`, after re-checking its end rules, for a caller allowed to act on it:
    /// root, the kioskauth and kioskauth-admin groups, or the person bound to the caller's uid.
    func session(_ caller: Caller, _ id: String, action: AuditAction) throws(APIError) -> SessionEntry {
        guard id.count <= 64, let entry = online.sessions[id] else {
            throw APIError.own("NoSuchSession", ["id": .string(String(id.prefix(64)))])
        }
        if !(groups.isAuthenticator(caller) || groups.isAdmin(caller)) {
            let person = try? store.person(named: entry.name)
            guard let person, isSelf(caller, person) else {
                audit(
                    caller, action: action, result: .refused, person: entry.name.rawValue,
                    detail: "not the session's person")
                throw APIError.own("NoSuchSession", ["id": .string(id)])
            }
        }
        let reading = services.clock.reading()
        checkSession(id, at: reading)
        guard let current = online.sessions[id] else {
            throw APIError.own(
                "SessionEnded", ["id": .string(id), "reason": .string(Self.endReason(of: entry, at: reading))])
        }
        return current
    }

    private static func endReason(of entry: SessionEntry, at reading: ClockReading) -> String {
        entry.state.machine.endReason(at: reading)?.rawValue ?? "ended"
    }

    func closeSession(_ caller: Caller, _ id: String) throws(APIError) {
        var entry = try session(caller, id, action: .sessionClose)
        let reading = services.clock.reading()
        let actions = entry.state.machine.end(.loggedOut, at: reading)
        online.sessions[id] = entry
        applySession(id, actions, at: reading)
    }

    func lockSession(_ caller: Caller, _ id: String) throws(APIError) -> SessionRecord {
        var entry = try session(caller, id, action: .sessionLock)
        let reading = services.clock.reading()
        let wasLocked = entry.state.machine.isLocked
        let actions = entry.state.machine.lock(at: reading)
        if !wasLocked, entry.state.machine.isLocked { entry.state.lastLockedAt = reading }
        if entry.state.machine.isLocked { entry.tokenConnection = nil }
        online.sessions[id] = entry
        applySession(id, actions, at: reading)
        return sessionRecord(online.sessions[id] ?? entry)
    }

    func reportActivity(_ caller: Caller, _ id: String) throws(APIError) -> SessionRecord {
        var entry = try session(caller, id, action: .sessionActivity)
        let reading = services.clock.reading()
        let actions = entry.state.machine.recordActivity(at: reading)
        online.sessions[id] = entry
        applySession(id, actions, at: reading)
        return sessionRecord(online.sessions[id] ?? entry)
    }

    func authenticateSession(_ caller: Caller, _ input: Message.AuthenticateSession) throws(APIError) -> SessionRecord {
        var entry = try session(caller, input.id, action: .sessionAuthenticate)
        guard let person = try? store.person(named: entry.name), person.id == entry.personID,
            let ticket = takeTicket(input.ticket, person: person, caller: caller)
        else {
            audit(
                caller, action: .sessionAuthenticate, result: .refused, person: entry.name.rawValue,
                detail: "no valid ticket for this person on this connection")
            throw APIError.ticketInvalid
        }
        let reading = services.clock.reading()
        // An authentication that started before the last lock belongs to an earlier lock epoch.
        var epoch = entry.state.machine.lockEpoch
        if let locked = entry.state.lastLockedAt {
            let startedBeforeLock =
                ticket.startedAt.bootTimeElapsed(since: locked).map { $0 < .zero }
                ?? (ticket.startedAt.wall < locked.wall)
            if startedBeforeLock { epoch = epoch == 0 ? UInt64.max : epoch - 1 }
        }
        let (result, actions) = entry.state.machine.recordAuthentication(at: ticket.issuedAt, startedInLockEpoch: epoch)
        online.sessions[input.id] = entry
        applySession(input.id, actions, at: reading)
        switch result {
        case .accepted:
            online.sessions[input.id]?.tokenConnection = caller.connectionID
            audit(
                caller, action: .sessionAuthenticate, result: .success, person: entry.name.rawValue,
                service: entry.service, detail: String(input.id.prefix(8)))
            return sessionRecord(online.sessions[input.id] ?? entry)
        case .staleLockEpoch:
            audit(
                caller, action: .sessionAuthenticate, result: .refused, person: entry.name.rawValue,
                service: entry.service, detail: "authentication started before the last lock")
            throw APIError.own("StaleAuthentication", ["id": .string(input.id)])
        case .sessionEnded(let reason):
            throw APIError.own("SessionEnded", ["id": .string(input.id), "reason": .string(reason.rawValue)])
        }
    }

    func stepUp(_ caller: Caller, _ input: Message.StepUp) throws(APIError) -> Message.StepUpReply {
        guard (0...(7 * 86400)).contains(input.maxAgeSeconds) else {
            throw APIError.invalidInput("maxAgeSeconds", "expected 0 to 604800 seconds")
        }
        let entry = try session(caller, input.id, action: .sessionStepUp)
        let reading = services.clock.reading()
        switch entry.state.machine.stepUp(maximumAge: .seconds(input.maxAgeSeconds), at: reading) {
        case .satisfied: return Message.StepUpReply(satisfied: true, session: sessionRecord(entry))
        case .needsAuthentication: return Message.StepUpReply(satisfied: false, session: sessionRecord(entry))
        case .sessionEnded(let reason):
            throw APIError.own("SessionEnded", ["id": .string(input.id), "reason": .string(reason.rawValue)])
        }
    }

    func listSessions(_ caller: Caller, _ input: Message.ListSessions) throws(APIError) -> [SessionRecord] {
        let reading = services.clock.reading()
        for id in Array(online.sessions.keys) { checkSession(id, at: reading) }
        let seesEveryone = groups.isAuthenticator(caller) || groups.isAdmin(caller)
        let own =
            seesEveryone
            ? nil
            : try withStore(caller, action: .sessionList) { () throws(StoreError) in
                try store.person(boundTo: caller.uid)
            }.flatMap { access.isSelf(caller, $0) ? $0 : nil }
        let filter = try input.name.map { text throws(APIError) in try loginName(text) }
        return online.sessions.values
            .filter { seesEveryone || $0.personID == own?.id }
            .filter { filter == nil || $0.name == filter }
            .sorted { $0.state.machine.openedAt.sinceBoot < $1.state.machine.openedAt.sinceBoot }
            .map(sessionRecord)
    }

    func endSessions(_ caller: Caller, _ name: String) throws(APIError) -> Int {
        let name = try loginName(name)
        let person = try authorisedPerson(
            name, caller: caller, action: .sessionSecurityLogout, privileged: groups.isAdmin(caller),
            refusal: "session.security-logout needs root or membership in \(configuration.access.adminGroup)")
        let ended = endSessions(of: person.id, reason: .securityLogout)
        audit(
            caller, action: .sessionSecurityLogout, result: .success, person: name.rawValue,
            detail: "\(ended) session(s) ended")
        return ended
    }

    func sessionToken(_ caller: Caller, _ id: String) async throws(APIError) -> Message.SessionToken {
        let entry = try session(caller, id, action: .sessionToken)
        guard
            groups.isAuthenticator(caller) || (try? store.person(named: entry.name)).map({ isSelf(caller, $0) }) == true
        else {
            throw APIError.permissionDenied("only the kioskauth group or the person may read a session's token")
        }
        try requireTokenRelease(caller, entry)
        let person = try existingPerson(entry.name, caller: caller, action: .sessionToken)
        guard person.origin == .idp else {
            throw APIError.own(
                "NoAccessToken",
                ["reason": .string("\(person.name.rawValue) is a local person: there is no identity-provider token")])
        }
        try checkOfflineUnlock(caller, person, action: .sessionToken, method: nil, service: entry.service)
        let token = try await accessToken(for: person)
        // The session may have ended, been locked or re-authenticated elsewhere while the token
        // was refreshed.
        let current = try session(caller, id, action: .sessionToken)
        try requireTokenRelease(caller, current)
        audit(
            caller, action: .sessionToken, result: .success, person: entry.name.rawValue, service: entry.service,
            detail: String(id.prefix(8)))
        return Message.SessionToken(
            accessToken: token.token.rawValue, expiresAt: Self.timestamp(token.expiresAt),
            expiresIn: max(0, Int(token.expiresAt.timeIntervalSince(now()))))
    }

    /// A session's token goes only to the connection that presented its latest authentication,
    /// only while that authentication stands: not locked since, not from before the last lock.
    /// Idleness and the other end rules were re-checked by `session(_:_:action:)`.
    private func requireTokenRelease(_ caller: Caller, _ entry: SessionEntry) throws(APIError) {
        let id = entry.id
        guard !entry.state.machine.isLocked else {
            audit(
                caller, action: .sessionToken, result: .refused, person: entry.name.rawValue,
                service: entry.service, detail: "\(id.prefix(8)): locked")
            throw APIError.own("SessionLocked", ["id": .string(id)])
        }
        guard let authentication = entry.state.machine.lastAuthentication,
            authentication.lockEpoch == entry.state.machine.lockEpoch, entry.tokenConnection == caller.connectionID
        else {
            audit(
                caller, action: .sessionToken, result: .refused, person: entry.name.rawValue,
                service: entry.service, detail: "\(id.prefix(8)): not authenticated on this connection")
            throw APIError.own("SessionNotAuthenticated", ["id": .string(id)])
        }
    }

    // MARK: Events

    /// Whether `caller` may see `event`: privileged callers see everything, others connectivity
    /// and reader events and their own person's.
    func mayReceive(_ caller: Caller, _ event: EventRecord) -> Bool {
        if groups.isAuthenticator(caller) || groups.isAdmin(caller) { return true }
        guard let name = event.name else { return true }
        guard let person = try? store.person(boundTo: caller.uid), access.isSelf(caller, person) else { return false }
        return person.name.rawValue == name
    }
}
