/// A store failure. A struct over a private enum so new cases never break callers; `code` says
/// which named API error it becomes.
public struct StoreError: Error, CustomStringConvertible, Sendable {
    /// What went wrong, for mapping to API errors and exit codes.
    public enum Code: String, Sendable {
        /// No usable key: missing credential, wrong size, or a development key refused.
        case keyUnavailable
        /// The key does not open this store.
        case wrongKey
        /// A sealed value or the audit chain failed its integrity check.
        case integrity
        /// The store was written by a newer schema than this daemon knows.
        case futureSchema
        /// A person with that name or uid exists.
        case personExists
        /// No such person.
        case noSuchPerson
        /// An SQLite failure.
        case database
        /// The store is missing, emptied or behind the durable record of how far it had got
        /// (the audit head anchor): it was rolled back or lost acknowledged writes.
        case rollback
        /// The state directory or database cannot be written.
        case readOnly
    }

    enum Kind: Sendable {
        case keyUnavailable(String)
        case wrongKey
        case integrity(String)
        case futureSchema(found: Int, supported: Int)
        case personExists(String)
        case noSuchPerson(String)
        case database(SQLiteError)
        case rollback(String)
        case readOnly(String)
    }

    let kind: Kind
    /// Where the error was raised.
    public let file: String
    public let line: Int

    init(_ kind: Kind, file: String = #fileID, line: Int = #line) {
        self.kind = kind
        self.file = file
        self.line = line
    }

    /// The error's code.
    public var code: Code {
        switch kind {
        case .keyUnavailable: .keyUnavailable
        case .wrongKey: .wrongKey
        case .integrity: .integrity
        case .futureSchema: .futureSchema
        case .personExists: .personExists
        case .noSuchPerson: .noSuchPerson
        case .database: .database
        case .rollback: .rollback
        case .readOnly: .readOnly
        }
    }

    /// One line for a person or a log; never contains a secret.
    public var message: String {
        switch kind {
        case .keyUnavailable(let why): "store key unavailable: \(why)"
        case .wrongKey: "the store key does not open this store (wrong key or different machine)"
        case .integrity(let what): "store integrity check failed: \(what)"
        case .futureSchema(let found, let supported):
            "the store has schema version \(found), newer than this daemon supports (\(supported)); refusing to touch it"
        case .personExists(let name): "a person named or bound as \(name) already exists"
        case .noSuchPerson(let name): "no person named \(name)"
        case .database(let error): "database error: \(error.message) (code \(error.code))"
        case .rollback(let what):
            "store rolled back or lost: \(what); refusing to serve it (kioskauthd --accept-store-rollback starts anyway and audits what was lost)"
        case .readOnly(let path): "\(path) is read-only: the store cannot be written there"
        }
    }

    public var description: String { message }
}
