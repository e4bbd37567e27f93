import KioskAuthCore
import KioskAuthStore
import Logging

extension Authority {
    /// Writes the journal message of an appended audit entry and counts it in the metrics.
    ///
    /// The message carries the entry's `MESSAGE_ID` (one per kind of event, explained in the
    /// journal catalog) and the fields admins filter on: `KIOSKAUTH_ACTION`, `KIOSKAUTH_RESULT`,
    /// `KIOSKAUTH_METHOD` (when the event is an authentication) and `KIOSKAUTH_PERSON_ID` (the
    /// person's login name, the identifier every kioskauthctl command and the audit trail use),
    /// besides `audit_seq` and `audit_head`, which anchor the trail outside its table.
    func journalAudit(_ entry: AuditEntry) {
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
        services.metrics.observeAudit(action: record.action, result: record.result, method: record.method)
    }

    /// Counts a passcode lockout when a failure moved a person into a delay or the hard lock.
    func countLockout(from before: CredentialFailureState, to after: CredentialFailureState) {
        if after.passcodeHardLocked && !before.passcodeHardLocked {
            services.metrics.passcodeLockedOut(hard: true)
        } else if let until = after.passcodeLockedUntil, until != before.passcodeLockedUntil,
            after.passcodeFailures > before.passcodeFailures
        {
            services.metrics.passcodeLockedOut(hard: false)
        }
    }
}
