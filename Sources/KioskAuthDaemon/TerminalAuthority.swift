import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

/// Terminal-wide reads: the status and the audit trail's entries and verification.
@AuthorityActor
final class TerminalAuthority: AuthorityPart {
    let context: AuthorityContext

    nonisolated init(context: AuthorityContext) { self.context = context }

    // MARK: Status

    /// `GetStatus`; with `summary`, admins also get who is locked out and the last unlocks.
    func status(_ caller: Caller, summary: Bool = false) throws(APIError) -> Message.Status {
        let figures = try withStore(caller, action: .status) { () throws(StoreError) in try store.statusFigures() }
        let status = status(caller, figures)
        return summary ? try withAdminSummary(status, for: caller) : status
    }

    /// `GetStatus` without the summary, answered on the connection's event loop without a hop to
    /// the actor: it reads only constants, the audit delivery monitor and the store (under the
    /// store's own lock). nil when the store fails, so that the call goes through `status(_:)`,
    /// which audits it.
    nonisolated func immediateStatus(_ caller: Caller) -> Message.Status? {
        guard let figures = try? context.store.statusFigures() else { return nil }
        return status(caller, figures)
    }

    nonisolated private func status(_ caller: Caller, _ figures: StoreStatusFigures) -> Message.Status {
        Message.Status(
            version: KioskAuthVersion.string, schemaVersion: Store.schemaVersion, people: figures.people,
            socketActivated: context.isSocketActivated, developmentKey: context.usesDevelopmentKey,
            uptimeSeconds: Int(context.now().timeIntervalSince(context.startedAt)), auditEvents: figures.auditEvents,
            auditHead: Hex.encode(figures.auditHead),
            auditDelivery: auditDeliveryStatus(caller, head: figures.auditEvents))
    }

    /// Audit delivery as `caller` may see it: the state, the queue and the last delivery for
    /// everyone (the trail's length is public in `GetStatus` anyway); the endpoint and why it
    /// fails for admins only, since error text and host names describe the organisation's network.
    nonisolated func auditDeliveryStatus(_ caller: Caller, head: Int) -> AuditDeliveryStatus {
        guard let monitor = context.services.auditDelivery else {
            return AuditDeliveryStatus(configured: false, state: "off", queued: 0, lastDeliveryAt: nil)
        }
        let snapshot = monitor.snapshot
        let queued = max(head - snapshot.deliveredThrough, 0)
        let state =
            snapshot.consecutiveFailures > 0 ? "retrying" : queued > 0 || snapshot.isSending ? "delivering" : "idle"
        var status = AuditDeliveryStatus(
            configured: true, state: state, queued: queued, lastDeliveryAt: snapshot.lastDeliveryAt.map(Self.timestamp))
        if context.access.isAdmin(caller) {
            status.endpointHost = snapshot.endpointHost
            status.deliveredThrough = snapshot.deliveredThrough
            status.lastError = snapshot.lastError
            status.lastErrorAt = snapshot.lastErrorAt.map(Self.timestamp)
            status.consecutiveFailures = snapshot.consecutiveFailures
            status.nextAttemptAt = snapshot.nextAttemptAt.map(Self.timestamp)
        }
        return status
    }

    // MARK: Audit

    func auditEvents(_ caller: Caller, _ input: Message.GetAudit) throws(APIError) -> [AuditEventRecord] {
        try requireAdmin(caller, action: .auditRead)
        let limit = min(max(input.limit ?? 1000, 1), 10_000)
        let entries = try withStore(caller, action: .auditRead) { () throws(StoreError) in
            try store.auditEntries(after: max(input.after ?? 0, 0), limit: limit, newest: input.newest ?? false)
        }
        return entries.map { entry in
            AuditEventRecord(
                sequence: entry.sequence,
                time: ISO8601.string(entry.time, milliseconds: true),
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
        try requireAdmin(caller, action: .auditVerify)
        var trusted: AuditHeadMark?
        if let text = input.head {
            guard let head = AuditHeadMark(parsing: text) else {
                throw .invalidInput("head", "expected SEQ:MAC, the sequence and the head MAC in hex")
            }
            trusted = head
        }
        let result = try withStore(caller, action: .auditVerify) { () throws(StoreError) in
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
