import Foundation
import KioskAuthCore
import KioskAuthFingerprint
import KioskAuthProtocol
import KioskAuthStore

extension CredentialAuthority {
    static let identifyThrottleKey = "identify-throttle"

    /// The one-line prompt shown while a scan waits for a finger.
    static let touchPrompt = "Touch the fingerprint reader"

    /// The touch prompt for a scan on `reader`: with several readers attached, it names the one
    /// to touch ("Touch the fingerprint reader (NAME)"); with one, it is ``touchPrompt``.
    static func touchPrompt(on reader: ReaderInfo?, attached: [ReaderInfo]) -> String {
        guard let reader, attached.count > 1 else { return touchPrompt }
        return "\(touchPrompt) (\(reader.name))"
    }

    /// The attached reader to scan `fingers` on, and those of them usable there: a template works
    /// only on the reader it was enrolled on (driver and device id), so this is the attached
    /// reader holding most of them (ties: discovery order), among those that can identify when
    /// `identifying`. Nil when no attached reader holds any.
    func readerHolding(
        _ fingers: [StoredFinger], attached: [ReaderInfo], on service: FingerprintReader, identifying: Bool = false
    ) async -> (reader: ReaderInfo, fingers: [StoredFinger])? {
        let enrolledOn = await service.readerIDs(of: fingers.map(\.template))
        var best: (reader: ReaderInfo, fingers: [StoredFinger])?
        for candidate in attached where !identifying || candidate.canIdentify {
            let usable = zip(fingers, enrolledOn).filter { $0.1 == candidate.id }.map(\.0)
            if !usable.isEmpty, usable.count > best?.fingers.count ?? 0 { best = (candidate, usable) }
        }
        return best
    }

    /// The one-line notice shown while a scan waits for another login to finish with the reader.
    static let waitPrompt = "Waiting for the fingerprint reader: another login is using it. Do not touch it yet."

    /// Streams where a verify or identify stands: "wait" while another operation holds the
    /// reader, then "touch" once the touch will be this scan's own (never before: a touch made
    /// while another scan holds the reader is that scan's).
    static func scanPhases(
        _ sink: ReplySink, saidWait: Bool = false, prompt: String = touchPrompt
    )
        -> @Sendable (ScanPhase) async -> Void
    {
        { phase in
            switch phase {
            case .waitingForReader:
                // The throttle's wait already said so: once is enough.
                if !saidWait {
                    try? await sink.progress(Message.ScanReply(progress: ScanProgress(state: "wait", hint: waitPrompt)))
                }
            case .readyForTouch:
                try? await sink.progress(Message.ScanReply(progress: ScanProgress(state: "touch", hint: prompt)))
            }
        }
    }

    /// Every reader failure as exactly one named API error.
    static func apiError(_ error: any Error, scanTimeout: TimeInterval) -> APIError {
        if error is CancellationError { return APIError.own("ScanCancelled") }
        guard let error = error as? FingerprintError else {
            return APIError.own("InternalError", ["reason": .string("reader failure")])
        }
        switch error.code {
        case .noReader: return APIError.own("NoReader")
        case .busy: return APIError.own("ReaderUnavailable", ["reason": .string("the reader is busy")])
        case .tooHot:
            return APIError.own(
                "ReaderUnavailable", ["reason": .string("the reader is too hot; try again in a few minutes")])
        case .removed: return APIError.own("ReaderRemoved")
        case .retry: return APIError.own("ScanRetry", ["hint": .string(error.message)])
        case .fingerAlreadyPresent:
            return APIError.own("ScanRetry", ["hint": .string("lift your finger, then touch the reader again")])
        case .dataFull: return APIError.own("ReaderFull")
        case .duplicate: return APIError.own("FingerAlreadyEnrolled", ["finger": .string("")])
        case .timeout: return APIError.own("ScanTimeout", ["seconds": .number(scanTimeout)])
        case .cancelled: return APIError.own("ScanCancelled")
        case .notSupported: return APIError.own("ReaderUnavailable", ["reason": .string("the reader cannot do this")])
        case .invalidTemplate, .deviceFailure:
            return APIError.own("ReaderUnavailable", ["reason": .string(error.message)])
        }
    }

    func requireReader() throws(APIError) -> FingerprintReader {
        guard let reader else { throw APIError.own("NoReader") }
        return reader
    }

    func readers(_ caller: Caller) async -> [ReaderRecord] {
        guard let reader else { return [] }
        return await reader.readers.map {
            ReaderRecord(
                id: $0.id, driver: $0.driver, name: $0.name, canIdentify: $0.canIdentify, hasStorage: $0.hasStorage,
                enrollStages: $0.enrollStages, scanType: $0.scanType)
        }
    }

    /// What a person falls back to after too many failed matches.
    func fallback(for person: StoredPerson) -> String {
        person.hasPasscode || person.origin == .local ? "passcode" : "idp"
    }

    func fingerprintRefusal(_ context: CallerContext?) -> String? {
        loginPolicy.fingerprintRefusal(context?.loginContext)
    }

    // MARK: Enrolment

    func enrollFinger(
        _ caller: Caller, _ input: Message.EnrollFinger, sink: ReplySink
    ) async throws(APIError) -> Message.ScanReply {
        let name = try loginName(input.name)
        let person = try authorisedPerson(
            name, caller: caller, action: .fingerEnroll,
            privileged: groups.isAdmin(caller)
                || (configuration.fingerprint.selfEnrollment && groups.isAuthenticator(caller)),
            refusal: "only admins enrol other people's fingers")
        if !groups.isAdmin(caller) {
            // Self-service: the person bound to the caller's uid, or a kiosk app enrolling the
            // person it just authenticated (or activated) on this connection.
            guard configuration.fingerprint.selfEnrollment, isSelf(caller, person) || groups.isAuthenticator(caller)
            else {
                audit(
                    caller, action: .fingerEnroll, result: .refused, person: name.rawValue,
                    detail: "not an admin and not self")
                throw APIError.permissionDenied("only admins enrol other people's fingers")
            }
            guard let ticket = input.ticket, isValidTicket(ticket, person: person, caller: caller) else {
                audit(
                    caller, action: .fingerEnroll, result: .refused, person: name.rawValue,
                    detail: "self-service without a valid ticket")
                throw APIError.ticketInvalid
            }
        } else if let ticket = input.ticket, !isValidTicket(ticket, person: person, caller: caller) {
            // An admin needs no ticket, but one presented is checked all the same: a greeter
            // running as root enrols on the strength of an authentication only while it is fresh.
            audit(
                caller, action: .fingerEnroll, result: .refused, person: name.rawValue,
                detail: "the presented ticket is not valid")
            throw APIError.ticketInvalid
        }
        let fingerName = input.finger ?? Finger.rightIndex.rawValue
        guard let finger = Finger(rawValue: fingerName) else {
            throw APIError.invalidInput("finger", "unknown finger \(fingerName); use left-thumb ... right-little")
        }
        guard !person.fingers.contains(finger.rawValue) else {
            throw APIError.own(
                "FingerAlreadyEnrolled", ["finger": .string(finger.rawValue), "name": .string(name.rawValue)])
        }
        guard person.fingers.count < configuration.fingerprint.maxFingersPerPerson else {
            throw APIError.own(
                "TooManyFingers", ["max": .number(Double(configuration.fingerprint.maxFingersPerPerson))])
        }
        let reader = try requireReader()
        // On the reader asked for, else the first attached one.
        let attached = await reader.readers
        let target: ReaderInfo?
        if let wanted = input.reader {
            guard let found = attached.first(where: { $0.id == wanted }) else {
                throw APIError.invalidInput(
                    "reader", "no attached reader \(wanted); GetReaders (kioskauthctl reader) names those attached")
            }
            target = found
        } else {
            target = attached.first
        }
        var enrolled =
            configuration.fingerprint.duplicateCheck
            ? try withStore(caller, action: .fingerEnroll, person: name.rawValue) { () throws(StoreError) in
                try store.allFingers()
            } : []
        if let target, !enrolled.isEmpty {
            // Only prints enrolled on that reader can be matched there.
            let enrolledOn = await reader.readerIDs(of: enrolled.map(\.template))
            enrolled = zip(enrolled, enrolledOn).filter { $0.1 == target.id }.map(\.0)
        }
        let gallery = enrolled.map { GalleryEntry(id: "\($0.personID)/\($0.finger)", template: $0.template) }
        let prompt = Self.touchPrompt(on: target, attached: attached)

        let enrolment: (template: [UInt8]?, duplicateChecked: Bool)
        // With nothing enrolled yet there is nothing to duplicate: checked, whatever the reader.
        let nothingToDuplicate = configuration.fingerprint.duplicateCheck && gallery.isEmpty
        do {
            enrolment = try await readerScan(caller) {
                try await Self.enrol(
                    reader: reader, finger: finger, name: name.rawValue, gallery: gallery, on: target?.id,
                    prompt: prompt, nothingToDuplicate: nothingToDuplicate, sink: sink)
            }
        } catch {
            let apiError = Self.apiError(error, scanTimeout: configuration.fingerprint.scanTimeout)
            audit(
                caller, action: .fingerEnroll, result: .failure, person: name.rawValue, method: "fingerprint",
                detail: "\(finger.rawValue): \(apiError.name)")
            if let error = error as? FingerprintError, error.code == .duplicate {
                throw alreadyEnrolled(error.matchedID, caller: caller, enrolling: person)
            }
            throw apiError
        }
        guard let template = enrolment.template else { throw APIError.own("ScanCancelled") }
        let duplicateChecked = enrolment.duplicateChecked
        // The ticket is used up only by a successful enrolment: a failed touch does not cost
        // the person their fresh authentication.
        var spentTicket: Ticket?
        if let ticket = input.ticket {
            guard let entry = takeTicket(ticket, person: person, caller: caller) else { throw APIError.ticketInvalid }
            spentTicket = entry
        }
        // The person may have been removed while the scan ran.
        let current = try existingPerson(name, caller: caller, action: .fingerEnroll)
        guard current.id == person.id else { throw APIError.noSuchPerson(name.rawValue) }
        // The stored template, the activation it may bring and the audit entry: one transaction.
        // The sensor's own copy (made by the scan) cannot be in it; one left without a stored
        // template by a failure or a crash here is deleted at start (`reconcileSensor`).
        do {
            try audited { tx throws(StoreError) in
                try store.addFinger(finger.rawValue, template: template, for: current, now: now())
                // An admin enrolling a pending person at the terminal vouches for them: activated.
                if current.state == .pendingActivation, groups.isAdmin(caller) {
                    try store.setState(.active, for: current, now: now())
                    try store.revokeActivationCode(for: current, now: now())
                }
                try tx.audit(
                    caller, action: .fingerEnroll, result: .success, person: name.rawValue, method: "fingerprint",
                    detail: finger.rawValue + (target.map { " on \($0.id)" } ?? "")
                        + (duplicateChecked ? "" : " (duplicates not checked)"))
            }
        } catch {
            if error.code == .personExists {
                throw APIError.own(
                    "FingerAlreadyEnrolled", ["finger": .string(finger.rawValue), "name": .string(name.rawValue)])
            }
            throw try failStore(caller, .fingerEnroll, error)
        }
        // The new print is on the sensor whatever the last reconciliation found.
        context.fingersMissingFromSensor[current.id]?.remove(finger.rawValue)
        let updated = try existingPerson(name, caller: caller, action: .fingerEnroll)
        // The spent ticket's authentication is handed on, no fresher than it was, so that the
        // login that offered enrolment can still open its session (or step up) on this connection.
        let handedOn = spentTicket.map {
            issueTicket(
                for: updated, caller: caller, startedAt: $0.startedAt, issuedAt: $0.issuedAt, expires: $0.expires)
        }
        return Message.ScanReply(
            person: record(updated), finger: finger.rawValue, duplicateChecked: duplicateChecked, ticket: handedOn,
            ticketExpiresIn: spentTicket.map { max(0, Int($0.expires.timeIntervalSince(steadyNow()))) })
    }

    /// One enrolment on the reader, its progress sent to `sink`: the template (nil when the
    /// stream ended without one) and whether duplicates were checked.
    static func enrol(
        reader: FingerprintReader, finger: Finger, name: String, gallery: [GalleryEntry], on readerID: String?,
        prompt: String, nothingToDuplicate: Bool, sink: ReplySink
    ) async throws -> (template: [UInt8]?, duplicateChecked: Bool) {
        var template: [UInt8]?
        var duplicateChecked = nothingToDuplicate
        for try await event in reader.enroll(
            finger: finger, username: name, duplicateGallery: gallery, reader: readerID)
        {
            switch event {
            case .progress(let stage, let stages, let hint):
                let state: String
                if hint == EnrollHint.checkingForDuplicates {
                    state = "duplicate-check"
                    duplicateChecked = true
                } else if hint == EnrollHint.duplicatesNotChecked {
                    state = "duplicate-check"
                } else if hint != nil {
                    state = "retry"
                } else {
                    state = stage == 0 ? "touch" : "stage"
                }
                try? await sink.progress(
                    Message.ScanReply(
                        progress: ScanProgress(
                            state: state, stage: stage, stages: stages,
                            hint: hint ?? (stage == 0 ? prompt : nil))))
            case .completed(let bytes):
                template = bytes
            }
        }
        return (template, duplicateChecked)
    }

    func listFingers(_ caller: Caller, _ name: String) throws(APIError) -> Message.Fingers {
        let name = try loginName(name)
        let person = try authorisedPerson(
            name, caller: caller, action: .fingerList, privileged: groups.isAdmin(caller),
            refusal: "finger.list needs root or membership in \(configuration.access.adminGroup)")
        let missing = missingFromSensor(person)
        return Message.Fingers(fingers: person.fingers, missingFromSensor: missing.isEmpty ? nil : missing)
    }

    /// `FingerAlreadyEnrolled` for a duplicate check's match: the finger the touch matched, and
    /// whose it is when the caller may know (an admin, or the person enrolling it themself).
    func alreadyEnrolled(
        _ matchedID: String?, caller: Caller, enrolling person: StoredPerson
    ) -> APIError {
        guard let matchedID, let slash = matchedID.firstIndex(of: "/"),
            let ownerID = Int64(matchedID[..<slash])
        else { return APIError.own("FingerAlreadyEnrolled", ["finger": .string("")]) }
        let matchedFinger = String(matchedID[matchedID.index(after: slash)...])
        guard ownerID == person.id || groups.isAdmin(caller) else {
            return APIError.own("FingerAlreadyEnrolled", ["finger": .string("")])
        }
        var parameters: [String: JSONValue] = ["finger": .string(matchedFinger)]
        if ownerID == person.id {
            parameters["name"] = .string(person.name.rawValue)
        } else if let owner = try? store.person(id: ownerID) {
            parameters["name"] = .string(owner.name.rawValue)
        }
        return APIError.own("FingerAlreadyEnrolled", parameters)
    }

    func removeFinger(_ caller: Caller, _ input: Message.RemoveFinger) async throws(APIError) -> [String] {
        try requireAdmin(caller, action: .fingerRemove, person: input.name)
        let name = try loginName(input.name)
        let person = try existingPerson(name, caller: caller, action: .fingerRemove)
        if let finger = input.finger, !person.fingers.contains(finger) {
            throw APIError.invalidInput("finger", "\(name.rawValue) has no \(finger) enrolled")
        }
        let removed = try audited(caller, action: .fingerRemove, person: name.rawValue) { tx throws(StoreError) in
            let removed = try store.removeFingers(input.finger, of: person)
            try tx.audit(
                caller, action: .fingerRemove, result: .success, person: name.rawValue,
                detail: removed.map(\.finger).joined(separator: ","))
            return removed
        }
        // After the commit; prints a crash leaves on the sensor are deleted at start.
        await deleteFromSensor(removed.map(\.template))
        return removed.map(\.finger)
    }

    /// Deletes prints kept on a sensor, each on the attached storage reader it was enrolled on; a
    /// failure is logged, never fatal (reconciliation at the next start removes orphans; a print
    /// on a reader not attached now is left to that).
    func deleteFromSensor(_ templates: [[UInt8]]) async {
        guard let reader, !templates.isEmpty else { return }
        let storageReaders = await reader.readers.filter(\.hasStorage).map(\.id)
        guard !storageReaders.isEmpty else { return }
        for (template, enrolledOn) in zip(templates, await reader.readerIDs(of: templates)) {
            guard let enrolledOn, storageReaders.contains(enrolledOn) else { continue }
            do { try await reader.deleteFromSensor(template: template, reader: enrolledOn) } catch {
                logger.warning(
                    "could not delete a print from the sensor",
                    metadata: ["reader": "\(enrolledOn)", "error": "\(error)"])
            }
        }
    }

    // MARK: Verify

    func verifyFinger(
        _ caller: Caller, _ input: Message.VerifyFinger, sink: ReplySink
    ) async throws(APIError) -> Message.ScanReply {
        let name = try loginName(input.name)
        let service = input.context?.service
        let person = try authenticationSubject(
            caller, name: name, context: input.context, action: .fingerVerify, method: "fingerprint",
            refusalError: "FingerprintNotAllowed", refusal: { _ in fingerprintRefusal(input.context) })
        let failedHere = fingerFailures[caller.connectionID]?[person.id] ?? 0
        guard failedHere < configuration.fingerprint.failuresBeforeFallback else {
            audit(
                caller, action: .fingerVerify, result: .refused, person: name.rawValue, method: "fingerprint",
                service: service, detail: "fallback required on this connection")
            throw APIError.own(
                "FallbackRequired", ["name": .string(name.rawValue), "fallback": .string(fallback(for: person))])
        }
        let fingers = try withStore(caller, action: .fingerVerify, person: name.rawValue) { () throws(StoreError) in
            try store.fingers(of: person)
        }
        guard !fingers.isEmpty else { throw APIError.own("NoFingers", ["name": .string(name.rawValue)]) }
        let reader = try requireReader()
        // The attached reader holding this person's prints (with none attached, the scan fails
        // as NoReader below).
        let attached = await reader.readers
        var target: ReaderInfo?
        var usable = fingers
        if !attached.isEmpty {
            guard let holding = await readerHolding(fingers, attached: attached, on: reader) else {
                audit(
                    caller, action: .fingerVerify, result: .refused, person: name.rawValue, method: "fingerprint",
                    service: service, detail: "fingers enrolled only on readers not attached")
                throw APIError.own("NoFingers", ["name": .string(name.rawValue)])
            }
            (target, usable) = (holding.reader, holding.fingers)
        }
        let prompt = Self.touchPrompt(on: target, attached: attached)
        // Both counts are taken before the scan and settled after it, so that concurrent touches
        // never share a slot.
        let saidWait = try await admitFingerTouch(
            caller, action: .fingerVerify, person: name.rawValue, service: service, sink: sink)
        fingerFailures[caller.connectionID, default: [:]][person.id, default: 0] += 1
        let scanStarted = services.clock.reading()
        let phases = Self.scanPhases(sink, saidWait: saidWait, prompt: prompt)
        let matched: Bool
        do {
            let (usable, target) = (usable, target)
            matched = try await readerScan(caller) {
                if usable.count > 1, target?.canIdentify == true {
                    // Several fingers: one touch, matched against all of this person's prints there.
                    let result = try await reader.identify(
                        gallery: usable.map { GalleryEntry(id: $0.finger, template: $0.template) },
                        reader: target?.id, phase: phases)
                    return result != .noMatch
                } else {
                    return try await reader.verify(template: usable[0].template, reader: target?.id, phase: phases)
                }
            }
        } catch {
            recordFingerTouch(nil)
            fingerFailures[caller.connectionID, default: [:]][person.id, default: 1] -= 1
            let apiError = Self.apiError(error, scanTimeout: configuration.fingerprint.scanTimeout)
            audit(
                caller, action: .fingerVerify, result: .failure, person: name.rawValue, method: "fingerprint",
                service: service, detail: apiError.name)
            throw apiError
        }
        let inARow = recordFingerTouch(matched)
        if matched { fingerFailures[caller.connectionID]?[person.id] = nil }
        let failuresHere = fingerFailures[caller.connectionID]?[person.id] ?? 0
        let fallbackRequired = failuresHere >= configuration.fingerprint.failuresBeforeFallback
        // A match unlocks her whatever her passcode's state, and clears any finger count an
        // older store kept for her.
        // A match counts only for someone who may still log in: the scan may have waited long.
        let current =
            matched
            ? try recheckSubject(
                caller, person, context: input.context, action: .fingerVerify, method: "fingerprint")
            : try existingPerson(name, caller: caller, action: .fingerVerify)
        var failures = current.failures
        if matched { failures.fingerprintFailures = 0 }
        let updated = try recordAuthentication(
            caller, person: current, failures: failures, unlocked: matched, action: .fingerVerify,
            result: matched ? .success : .failure, method: "fingerprint", service: service,
            detail: matched
                ? nil : "no match; \(failuresHere) on this connection; \(inARow) in a row")
        guard matched else {
            throw APIError.own(
                "FingerprintNotRecognized",
                [
                    "failures": .number(Double(failuresHere)),
                    "fallbackRequired": .bool(fallbackRequired),
                    "fallback": .string(fallback(for: current)),
                ])
        }
        return Message.ScanReply(
            person: record(updated), ticket: issueTicket(for: updated, caller: caller, startedAt: scanStarted),
            ticketExpiresIn: Int(configuration.access.ticketLifetime))
    }

    // MARK: Who gets the reader

    /// Runs one reader operation for `caller`. A privileged caller's operation first cancels every
    /// unprivileged one running or queued (they end with `ScanCancelled`), so the next touch goes
    /// to the greeter or kiosk app: a user who keeps a scan of her own waiting, from anywhere,
    /// can neither hold the reader nor have colleagues' touches matched against her print (and
    /// counted towards the terminal-wide pause). An unprivileged operation can be taken this way.
    func readerScan<T: Sendable>(
        _ caller: Caller, _ operation: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        if access.isPrivileged(caller) {
            preemptUnprivilegedScans()
            return try await operation()
        }
        let task = Task { try await operation() }
        let key = nextPreemptibleScan
        nextPreemptibleScan &+= 1
        preemptibleScans[key] = { task.cancel() }
        defer { preemptibleScans[key] = nil }
        return try await withTaskCancellationHandler {
            try await task.value
        } onCancel: {
            task.cancel()
        }
    }

    /// Cancels every unprivileged reader operation (a privileged one is about to start).
    func preemptUnprivilegedScans() {
        let cancels = preemptibleScans.values
        preemptibleScans = [:]
        for cancel in cancels { cancel() }
    }

    // MARK: Terminal-wide finger throttle

    var fingerThrottle: IdentifyThrottle {
        IdentifyThrottle(
            unknownFingersBeforePause: configuration.fingerprint.identifyPauseAfter,
            pause: configuration.fingerprint.identifyPause,
            failuresInWindow: configuration.fingerprint.fingerFailuresInWindow,
            failureWindow: configuration.fingerprint.fingerFailureWindow)
    }

    func loadFingerThrottleState(_ caller: Caller? = nil) throws(APIError) -> IdentifyThrottleState {
        if let state = fingerThrottleState { return state }
        let state =
            try terminalValue(
                IdentifyThrottleState.self, forKey: Self.identifyThrottleKey, caller: caller, action: .fingerThrottle)
            ?? IdentifyThrottleState()
        fingerThrottleState = state
        return state
    }

    /// Saves the state durably, unless it is the state already saved: a match after no unknown
    /// finger changes nothing, and the unlock path then makes no commit (and waits for no
    /// `fsync`) for the throttle.
    func saveFingerThrottleState(_ state: IdentifyThrottleState) {
        guard state != fingerThrottleState else { return }
        fingerThrottleState = state
        saveTerminalValue(state, forKey: Self.identifyThrottleKey, action: .fingerThrottle)
    }

    /// Admits one touch against the terminal-wide throttle, or refuses it while fingerprint
    /// matching is paused: `IdentifyPaused` for walk-up identify, `FingerprintPaused` for a 1:1
    /// match. A touch that could, with those in flight, pass the limit waits its turn (in arrival
    /// order, as the reader serves them) until one is recorded, and the caller is told to wait;
    /// the touch prompt itself goes out only once the scan owns the reader (`scanPhases`).
    /// Returns whether the wait notice went out.
    @discardableResult
    func admitFingerTouch(
        _ caller: Caller, action: AuditAction, person: String?, service: String?, sink: ReplySink
    ) async throws(APIError) -> Bool {
        var prompted = false
        let wait = Message.ScanReply(progress: ScanProgress(state: "wait", hint: Self.waitPrompt))
        // Strictly first come, first served: only the oldest waiting touch may be admitted, so
        // touches reach the reader's queue in the order they arrived (a touch must never be
        // charged to someone whose prompt came later).
        let ticket = nextFingerTouchTicket
        nextFingerTouchTicket &+= 1
        fingerTouchQueue.append(ticket)
        defer {
            if let index = fingerTouchQueue.firstIndex(of: ticket) { fingerTouchQueue.remove(at: index) }
            // The next in line may fit now, or learn of a pause.
            wakeFingerTouchWaiters()
        }
        while true {
            let at = steadyNow()
            let admission = fingerThrottle.admission(
                try loadFingerThrottleState(caller), inFlight: fingerTouchesInFlight, now: at)
            switch admission {
            case .paused(let until):
                audit(
                    caller, action: action, result: .refused, person: person, method: "fingerprint",
                    service: service, detail: "paused after unknown fingers")
                let retry = JSONValue.number(max(1, until.timeIntervalSince(at).rounded(.up)))
                throw action == .fingerIdentify
                    ? APIError.own("IdentifyPaused", ["retryAfterSeconds": retry])
                    : APIError.own("FingerprintPaused", ["retryAfterSeconds": retry])
            case .admit where fingerTouchQueue.first == ticket:
                fingerTouchesInFlight += 1
                return prompted
            case .admit, .wait:
                if !prompted {
                    prompted = true
                    try? await sink.progress(wait)
                    // Re-checked after the notice went out: things may have moved meanwhile.
                    continue
                }
                // No suspension point between the check above and this registration: a wake-up
                // cannot be lost.
                await withCheckedContinuation { continuation in fingerTouchWaiters[ticket] = continuation }
            }
        }
    }

    /// Lets every waiting touch check again (each one admits itself only when it is first).
    func wakeFingerTouchWaiters() {
        let waiters = fingerTouchWaiters
        fingerTouchWaiters = [:]
        for continuation in waiters.values { continuation.resume() }
    }

    /// Records an admitted touch: matched, unknown, or (nil) never matched (a reader failure);
    /// returns the run of unknown fingers it leaves (the pause's start when it reached the limit).
    @discardableResult
    func recordFingerTouch(_ outcome: Bool?) -> Int {
        fingerTouchesInFlight = max(0, fingerTouchesInFlight - 1)
        // Loaded when the touch was admitted; cached since.
        guard var state = try? loadFingerThrottleState() else {
            wakeFingerTouchWaiters()
            return 0
        }
        var position = state.unknownInARow
        if let outcome {
            position = outcome ? 0 : state.unknownInARow + 1
            fingerThrottle.record(identified: outcome, in: &state, now: steadyNow())
            saveFingerThrottleState(state)
        }
        wakeFingerTouchWaiters()
        return position
    }

    // MARK: Identify

    func identify(
        _ caller: Caller, _ input: Message.Identify, sink: ReplySink
    ) async throws(APIError) -> Message.ScanReply {
        let service = input.context?.service
        guard groups.isAuthenticator(caller) else {
            audit(
                caller, action: .fingerIdentify, result: .refused, method: "fingerprint", service: service,
                detail: "caller is not an authenticator")
            throw APIError.permissionDenied(
                "walk-up identify needs root or membership in \(configuration.access.authenticatorGroup)")
        }
        if let reason = fingerprintRefusal(input.context) {
            audit(
                caller, action: .fingerIdentify, result: .refused, method: "fingerprint", service: service,
                detail: reason)
            throw APIError.own("FingerprintNotAllowed", ["reason": .string(reason)])
        }
        let reader = try requireReader()
        let roster = try withStore(caller, action: .fingerIdentify) { () throws(StoreError) in
            try store.roster(cap: configuration.fingerprint.identifyRosterCap)
        }
        guard !roster.fingers.isEmpty else {
            // Nothing to match against, but with no reader attached (unplugged) the answer is
            // that, as it is when fingers are enrolled.
            if await reader.readers.isEmpty { throw APIError.own("NoReader") }
            throw APIError.own("NotIdentified", ["unknownInARow": .number(0), "askForName": .bool(false)])
        }
        // One reader scans: the attached one that can identify and holds most of the roster's
        // prints, over those of them usable there (with none attached, the scan fails as NoReader;
        // with none that can identify, as on the first reader).
        let attached = await reader.readers
        var target: ReaderInfo?
        var candidates = roster.fingers
        if let holding = await readerHolding(roster.fingers, attached: attached, on: reader, identifying: true) {
            (target, candidates) = (holding.reader, holding.fingers)
        } else if attached.contains(where: \.canIdentify) {
            // Nobody in the roster can be recognised on the readers attached: no touch to ask for.
            throw APIError.own(
                "NotIdentified", ["unknownInARow": .number(0), "askForName": .bool(roster.isTruncated)])
        }
        let prompt = Self.touchPrompt(on: target, attached: attached)
        let saidWait = try await admitFingerTouch(
            caller, action: .fingerIdentify, person: nil, service: service, sink: sink)
        let scanStarted = services.clock.reading()
        let result: MatchResult
        do {
            let gallery = candidates.map { GalleryEntry(id: "\($0.personID)", template: $0.template) }
            let layout = configuration.fingerprint.identifyLayout
            let phases = Self.scanPhases(sink, saidWait: saidWait, prompt: prompt)
            let targetID = target?.id
            result = try await readerScan(caller) {
                try await reader.identify(gallery: gallery, layout: layout, reader: targetID, phase: phases)
            }
        } catch {
            recordFingerTouch(nil)
            let apiError = Self.apiError(error, scanTimeout: configuration.fingerprint.scanTimeout)
            audit(
                caller, action: .fingerIdentify, result: .failure, method: "fingerprint", service: service,
                detail: apiError.name)
            throw apiError
        }
        guard case .match(let id) = result, let match = candidates.first(where: { "\($0.personID)" == id }),
            let person = try withStore(
                caller, action: .fingerIdentify,
                { () throws(StoreError) in try store.person(named: match.personName) }),
            person.id == match.personID
        else {
            let unknownInARow = recordFingerTouch(false)
            audit(
                caller, action: .fingerIdentify, result: .failure, method: "fingerprint", service: service,
                detail:
                    "unknown finger; \(unknownInARow) in a row; roster \(roster.fingers.count)/\(roster.totalFingers)")
            throw APIError.own(
                "NotIdentified",
                ["unknownInARow": .number(Double(unknownInARow)), "askForName": .bool(roster.isTruncated)])
        }
        // Recognised: not an unknown finger, whatever follows. Someone whose local unlock is
        // suspended, or whose offline window has ended, is told to sign in online; someone not
        // active otherwise is told so (PersonNotActive), never "not recognised".
        recordFingerTouch(true)
        // A walk-up identification clears whatever finger state exists.
        fingerFailures[caller.connectionID]?[person.id] = nil
        try online.checkOfflineUnlock(caller, person, action: .fingerIdentify, method: "fingerprint", service: service)
        guard person.state == .active else {
            audit(
                caller, action: .fingerIdentify, result: .refused, person: person.name.rawValue,
                method: "fingerprint", service: service, detail: "state \(person.state.rawValue)")
            throw APIError.own(
                "PersonNotActive",
                [
                    "name": .string(person.name.rawValue),
                    "state": .string(person.state.rawValue.replacingOccurrences(of: "-", with: "_")),
                ])
        }
        try requireAccountAllowed(
            caller, person, context: input.context, action: .fingerIdentify, method: "fingerprint")
        var failures = person.failures
        failures.fingerprintFailures = 0
        let updated = try recordAuthentication(
            caller, person: person, failures: failures, unlocked: true, action: .fingerIdentify, result: .success,
            method: "fingerprint", service: service, detail: "roster \(roster.fingers.count)")
        return Message.ScanReply(
            person: record(updated), ticket: issueTicket(for: updated, caller: caller, startedAt: scanStarted),
            ticketExpiresIn: Int(configuration.access.ticketLifetime), rosterSize: roster.fingers.count)
    }

    // MARK: Start-up

    /// Reconciles each attached storage reader's on-sensor prints with the store: prints on the
    /// sensor that no person owns are deleted; people's prints enrolled on that reader but missing
    /// from its sensor are reported.
    func reconcileSensor() async {
        guard let reader else { return }
        // Recomputed over every storage reader attached now.
        context.fingersMissingFromSensor = [:]
        for sensor in await reader.readers where sensor.hasStorage {
            await reconcileSensor(sensor, on: reader)
        }
    }

    private func reconcileSensor(_ sensor: ReaderInfo, on reader: FingerprintReader) async {
        do {
            let onSensor = try await reader.sensorPrints(reader: sensor.id)
            let all = try store.allFingers()
            let enrolledOn = await reader.readerIDs(of: all.map(\.template))
            let stored = zip(all, enrolledOn).filter { $0.1 == sensor.id }.map(\.0)
            var orphans = 0
            for print in onSensor {
                var owned = false
                for finger in stored where await reader.isSamePrint(print, finger.template) {
                    owned = true
                    break
                }
                if !owned {
                    try await reader.deleteFromSensor(template: print, reader: sensor.id)
                    orphans += 1
                }
            }
            var missing: [String] = []
            var missingByPerson: [Int64: Set<String>] = [:]
            for finger in stored {
                var present = false
                for print in onSensor where await reader.isSamePrint(print, finger.template) {
                    present = true
                    break
                }
                if !present {
                    missing.append("\(finger.personName.rawValue)/\(finger.finger)")
                    missingByPerson[finger.personID, default: []].insert(finger.finger)
                }
            }
            for (personID, fingers) in missingByPerson {
                context.fingersMissingFromSensor[personID, default: []].formUnion(fingers)
            }
            if !missing.isEmpty {
                // Said plainly: a virtual reader forgets its prints whenever the daemon restarts.
                logger.warning(
                    """
                    \(missing.count) enrolled finger\(missing.count == 1 ? " is" : "s are") missing from the \
                    sensor and cannot match until enrolled again: \(missing.joined(separator: ", ")) \
                    (kioskauthctl finger list NAME marks them)
                    """,
                    metadata: [
                        "reader": "\(sensor.id)", "orphans_removed": "\(orphans)",
                        "missing": "\(missing.joined(separator: ","))",
                    ])
            } else if orphans > 0 {
                logger.warning("sensor reconciled", metadata: ["orphans_removed": "\(orphans)"])
            }
            audit(
                nil, action: .readerReconcile, result: missing.isEmpty ? .success : .failure,
                detail:
                    "orphans removed: \(orphans); missing from sensor: \(missing.isEmpty ? "none" : missing.joined(separator: ","))"
            )
        } catch {
            logger.warning("sensor reconciliation failed", metadata: ["reader": "\(sensor.id)", "error": "\(error)"])
        }
    }
}
