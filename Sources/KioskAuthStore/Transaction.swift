public import FoundationEssentials

/// A transaction in progress (see `Store.transaction(now:_:)`): what `body` can do beyond calling
/// the store's own methods, which join it.
public final class StoreTransaction {
    let store: Store
    let connection: SQLiteConnection
    /// The time the transaction's audit entries carry.
    public let now: Date
    /// The audit entries appended so far, oldest first; durable once the transaction commits.
    public private(set) var appendedAudit: [AuditEntry] = []
    /// False once the transaction has ended; using it after that is a programming error.
    var isOpen = true

    init(store: Store, connection: SQLiteConnection, now: Date) {
        self.store = store
        self.connection = connection
        self.now = now
    }

    /// Appends a record to the audit chain inside this transaction, so it commits together with
    /// the state change it records, or not at all. Returns the entry (the new head once committed).
    @discardableResult
    public func appendAudit(_ record: AuditRecord) throws(StoreError) -> AuditEntry {
        precondition(isOpen, "audit append on a finished transaction")
        // A savepoint: a failed append leaves the transaction as it was, for the caller to decide.
        let entry = try store.transaction { db in try store.appendAudit(record, now: now, in: db) }
        appendedAudit.append(entry)
        return entry
    }
}
