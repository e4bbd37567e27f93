import Foundation
import KioskAuthStore

/// A store transaction with the authority's way of writing audit records: the state change and
/// the entries that record it commit together, or neither does.
struct AuditedTransaction {
    let transaction: StoreTransaction

    /// Appends an entry recording the change made in this transaction (the same record `audit`
    /// would write).
    func audit(
        _ caller: Caller?, action: String, result: String, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil
    ) throws(StoreError) {
        try transaction.appendAudit(
            AuditRecord(
                action: action, result: result, person: person, method: method, callerUID: caller?.uid,
                callerPID: caller?.pid, service: service, detail: detail))
    }
}

extension Authority {
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
        for entry in entries { journalAudit(entry) }
        if !entries.isEmpty { services.auditDelivery?.entryAppended() }
        return result
    }

    /// `audited`, with store failures turned into API errors (integrity failures audited) as
    /// `withStore` does.
    func audited<T>(
        _ caller: Caller?, action: String, person: String? = nil, _ body: (AuditedTransaction) throws(StoreError) -> T
    ) throws(APIError) -> T {
        try withStore(caller, action: action, person: person) { () throws(StoreError) -> T in try audited(body) }
    }
}
