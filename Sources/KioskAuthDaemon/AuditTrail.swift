import FoundationEssentials
import KioskAuthCore
import KioskAuthStore
import Logging

/// A store transaction with the audit trail's way of writing records: the state change and the
/// entries that record it commit together, or neither does.
struct AuditedTransaction {
    let transaction: StoreTransaction

    /// Appends an entry recording the change made in this transaction (the same record `audit`
    /// would write).
    func audit(
        _ caller: Caller?, action: AuditAction, result: AuditResult, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil
    ) throws(StoreError) {
        try transaction.appendAudit(
            AuditRecord(
                action: action.rawValue, result: result.rawValue, person: person, method: method,
                callerUID: caller?.uid, callerPID: caller?.pid, service: service, detail: detail))
    }
}

/// The audit trail: every entry the authority writes goes through here, with its journal line
/// and the nudge to audit delivery. Refusals of unprivileged callers are summarised per uid
/// (`RefusalSummaries`); store failures become API errors, integrity failures audited.
@AuthorityActor
final class AuditTrail {
    let store: Store
    let logger: Logger
    let now: @Sendable () -> Date
    let access: AccessControl
    let auditDelivery: AuditDeliveryMonitor?
    let metrics: DaemonMetrics
    nonisolated let refusalSummaryInterval: TimeInterval
    /// Refusals of unprivileged callers awaiting their summary audit entry.
    nonisolated let refusals = RefusalSummaries()

    nonisolated init(
        store: Store, logger: Logger, now: @escaping @Sendable () -> Date, access: AccessControl,
        auditDelivery: AuditDeliveryMonitor?, metrics: DaemonMetrics, refusalSummaryInterval: TimeInterval
    ) {
        self.store = store
        self.logger = logger
        self.now = now
        self.access = access
        self.auditDelivery = auditDelivery
        self.metrics = metrics
        self.refusalSummaryInterval = refusalSummaryInterval
    }

    /// Runs a store call, turning its failures into API errors; integrity failures are audited.
    func withStore<T>(
        _ caller: Caller?, action: AuditAction, person: String? = nil, _ body: () throws(StoreError) -> T
    ) throws(APIError) -> T {
        do {
            return try body()
        } catch {
            if error.code == .integrity || error.code == .wrongKey {
                logger.error("store integrity failure", metadata: ["action": "\(action)", "error": "\(error.message)"])
                audit(
                    caller, action: .storeIntegrity, result: .failure, person: person,
                    detail: "\(action): \(error.message)")
            } else {
                logger.error("store failure", metadata: ["action": "\(action)", "error": "\(error.message)"])
            }
            throw APIError.store(error)
        }
    }

    /// A store failure caught outside `withStore`, handled as `withStore` would.
    func failStore(_ caller: Caller, _ action: AuditAction, _ error: StoreError) throws(APIError) -> APIError {
        try withStore(caller, action: action) { () throws(StoreError) in throw error }
    }

    /// Counts a refusal of an unprivileged caller towards its uid's summary entry, and schedules
    /// the summary at the end of the interval when it is the first one.
    nonisolated func tallyRefusal(_ caller: Caller, action: AuditAction, rateLimited: Bool) {
        guard refusals.add(uid: caller.uid, pid: caller.pid, action: action.rawValue, rateLimited: rateLimited)
        else { return }
        let interval = refusalSummaryInterval
        Task { [weak self] in
            try? await Task.sleep(for: .milliseconds(Int64(interval * 1000)))
            await self?.flushRefusalSummaries()
        }
    }

    /// Audits what `tallyRefusal` counted: one `access.refused.summary` entry per uid. Runs at
    /// the end of each interval and at shutdown.
    func flushRefusalSummaries() {
        for (uid, tally) in refusals.take() {
            let caller = Caller(uid: uid, gid: -1, pid: tally.lastPID, groups: nil, connectionID: 0)
            appendAudit(
                caller, action: .accessRefusedSummary, result: .refused,
                detail: RefusalSummaries.detail(tally, interval: refusalSummaryInterval))
        }
    }

    /// Appends to the audit chain and writes the new head to the journal. A failure to audit is
    /// logged loudly; it never hides the outcome from the caller. Refusals of unprivileged
    /// callers are counted into a summary entry per uid and interval instead (see
    /// `tallyRefusal`).
    func audit(
        _ caller: Caller?, action: AuditAction, result: AuditResult, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil, durable: Bool = true
    ) {
        if result == .refused, let caller, !access.isPrivileged(caller) {
            logger.debug("refused", metadata: ["action": "\(action)", "uid": "\(caller.uid)"])
            metrics.observeAudit(action: action.rawValue, result: result.rawValue, method: method)
            tallyRefusal(caller, action: action, rateLimited: false)
            return
        }
        appendAudit(
            caller, action: action, result: result, person: person, method: method, service: service, detail: detail,
            durable: durable)
    }

    private func appendAudit(
        _ caller: Caller?, action: AuditAction, result: AuditResult, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil, durable: Bool = true
    ) {
        let record = AuditRecord(
            action: action.rawValue, result: result.rawValue, person: person, method: method, callerUID: caller?.uid,
            callerPID: caller?.pid, service: service, detail: detail)
        do {
            let entry = try store.appendAudit(record, now: now(), durable: durable)
            journal(entry)
        } catch {
            logger.critical(
                "cannot append to the audit trail", metadata: ["action": "\(action)", "error": "\(error.message)"])
        }
    }

    /// Writes an appended entry's journal line and nudges audit delivery.
    private func journal(_ entry: AuditEntry) {
        auditDelivery?.entryAppended()
        journalLine(entry)
    }

    /// Writes the journal message of an appended audit entry and counts it in the metrics.
    ///
    /// The message carries the entry's `MESSAGE_ID` (one per kind of event, explained in the
    /// journal catalog) and the fields admins filter on: `KIOSKAUTH_ACTION`, `KIOSKAUTH_RESULT`,
    /// `KIOSKAUTH_METHOD` (when the event is an authentication) and `KIOSKAUTH_PERSON_ID` (the
    /// person's login name, the identifier every kioskauthctl command and the audit trail use),
    /// besides `audit_seq` and `audit_head`, which anchor the trail outside its table.
    private func journalLine(_ entry: AuditEntry) {
        let record = entry.record
        var metadata: Logger.Metadata = [
            "action": "\(record.action)", "result": "\(record.result)", "person": "\(record.person ?? "-")",
            "audit_seq": "\(entry.sequence)", "audit_head": "\(entry.macHex)",
            "MESSAGE_ID": "\(AuditMessageID.of(record.action))",
            "KIOSKAUTH_ACTION": "\(record.action)", "KIOSKAUTH_RESULT": "\(record.result)",
        ]
        if let person = record.person { metadata["KIOSKAUTH_PERSON_ID"] = "\(person)" }
        if let method = record.method { metadata["KIOSKAUTH_METHOD"] = "\(method)" }
        logger.info("audit", metadata: metadata)
        metrics.observeAudit(action: record.action, result: record.result, method: record.method)
    }

    /// Records an authentication's outcome (counters, unlock time, audit) in one durable commit,
    /// writes the new audit head to the journal, and returns the person as they now stand,
    /// without reading them back.
    @discardableResult
    func recordAuthentication(
        _ caller: Caller, person: StoredPerson, failures: CredentialFailureState, unlocked: Bool,
        action: AuditAction, result: AuditResult, method: String, service: String?, detail: String? = nil,
        finishingPasscodeCheck: Bool = false
    ) throws(APIError) -> StoredPerson {
        let record = AuditRecord(
            action: action.rawValue, result: result.rawValue, person: person.name.rawValue, method: method,
            callerUID: caller.uid, callerPID: caller.pid, service: service, detail: detail)
        let at = now()
        let entry = try withStore(caller, action: action, person: person.name.rawValue) { () throws(StoreError) in
            try store.recordAuthentication(
                of: person, failures: failures, unlockedAt: unlocked ? at : nil, audit: record, now: at,
                finishingPasscodeCheck: finishingPasscodeCheck)
        }
        journal(entry)
        var updated = person
        updated.failures = failures
        if unlocked { updated.lastUnlockAt = at }
        return updated
    }

    /// Runs a state change and its audit entries as one durable store transaction
    /// (`Store.transaction(now:_:)`): a crash or a failed append leaves neither, so no action is
    /// ever without its entry and no multi-step write stops half-way. The store methods `body`
    /// calls join the transaction. Once it has committed, each new entry's journal line
    /// (`audit_seq`, `audit_head`) is written and audit delivery is nudged, as `audit` does.
    ///
    /// Refusals that change nothing keep using `audit`.
    func audited<T>(_ body: (AuditedTransaction) throws(StoreError) -> T) throws(StoreError) -> T {
        var entries: [AuditEntry] = []
        let result = try store.transaction(now: now()) { tx throws(StoreError) -> T in
            let result = try body(AuditedTransaction(transaction: tx))
            entries = tx.appendedAudit
            return result
        }
        for entry in entries { journalLine(entry) }
        if !entries.isEmpty { auditDelivery?.entryAppended() }
        return result
    }

    /// `audited`, with store failures turned into API errors (integrity failures audited) as
    /// `withStore` does.
    func audited<T>(
        _ caller: Caller?, action: AuditAction, person: String? = nil,
        _ body: (AuditedTransaction) throws(StoreError) -> T
    ) throws(APIError) -> T {
        try withStore(caller, action: action, person: person) { () throws(StoreError) -> T in try audited(body) }
    }
}
