import CSQLite3
public import FoundationEssentials

/// An SQLite failure: the result code, SQLite's message, and where it happened.
public struct SQLiteError: Error, CustomStringConvertible, Sendable {
    /// The extended result code.
    public var code: Int32
    /// SQLite's message for it.
    public var message: String
    /// The statement, when there was one (never with bound values).
    public var sql: String?
    public var file: String
    public var line: Int

    public var description: String {
        "SQLite error \(code): \(message)" + (sql.map { " in `\($0)`" } ?? "") + " (\(file):\(line))"
    }

    /// The database is busy or locked by another connection.
    public var isBusy: Bool { code & 0xff == SQLITE_BUSY || code & 0xff == SQLITE_LOCKED }
    /// The file is not a database, or is corrupt.
    public var isCorrupt: Bool { code & 0xff == SQLITE_NOTADB || code & 0xff == SQLITE_CORRUPT }
}

/// A value bound to or read from a statement.
enum SQLValue: Sendable, Equatable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])

    var int: Int? {
        if case .integer(let value) = self { return Int(value) }
        return nil
    }
    var double: Double? {
        switch self {
        case .real(let value): return value
        case .integer(let value): return Double(value)
        default: return nil
        }
    }
    var string: String? {
        if case .text(let value) = self { return value }
        return nil
    }
    var bytes: [UInt8]? {
        if case .blob(let value) = self { return value }
        return nil
    }
}

/// One result row, by column name.
struct SQLRow {
    var values: [String: SQLValue]
    subscript(_ column: String) -> SQLValue { values[column] ?? .null }
}

/// The tiny SQLite wrapper the store needs: one connection, prepared statements kept for reuse,
/// and every C call funnelled through `check` so a failure becomes one typed error.
///
/// Not thread-safe on its own; `Store` serialises access.
final class SQLiteConnection {
    private var handle: OpaquePointer?
    let path: String

    /// Prepared statements by SQL text. The store's statements are a fixed set of literals, so
    /// compiling each once saves most of a simple query's cost (parsing dominated it); the bound
    /// keeps a caller that builds SQL text dynamically from growing it without limit. SQLite
    /// re-prepares a cached statement by itself when the schema changes.
    private var statements: [String: OpaquePointer] = [:]
    static let statementCacheLimit = 128

    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    init(path: String, readOnly: Bool = false) throws(SQLiteError) {
        self.path = path
        var db: OpaquePointer?
        let flags =
            (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
            | SQLITE_OPEN_NOFOLLOW
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            sqlite3_close_v2(db)
            throw SQLiteError(code: rc, message: message, sql: nil, file: #fileID, line: #line)
        }
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, 5000)
        handle = db
    }

    deinit { close() }

    /// Frees the page cache's unused pages (`sqlite3_db_release_memory`).
    func releaseMemory() {
        if let handle { _ = sqlite3_db_release_memory(handle) }
    }

    /// The heap memory the page cache holds (`SQLITE_DBSTATUS_CACHE_USED`).
    var pageCacheBytes: Int {
        var current: Int32 = 0
        var highest: Int32 = 0
        guard let handle, sqlite3_db_status(handle, SQLITE_DBSTATUS_CACHE_USED, &current, &highest, 0) == SQLITE_OK
        else { return 0 }
        return Int(current)
    }

    /// Closes the connection; later calls fail.
    func close() {
        for statement in statements.values { sqlite3_finalize(statement) }
        statements.removeAll()
        if let handle {
            sqlite3_close_v2(handle)
            self.handle = nil
        }
    }

    private func check(_ rc: Int32, _ sql: String?, file: String = #fileID, line: Int = #line) throws(SQLiteError) {
        guard rc == SQLITE_OK || rc == SQLITE_ROW || rc == SQLITE_DONE else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "connection closed"
            throw SQLiteError(code: rc, message: message, sql: sql, file: file, line: line)
        }
    }

    /// Runs one or more statements without parameters.
    func execute(_ sql: String, file: String = #fileID, line: Int = #line) throws(SQLiteError) {
        var errorMessage: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &errorMessage)
        if let errorMessage {
            let message = String(cString: errorMessage)
            sqlite3_free(errorMessage)
            throw SQLiteError(code: rc, message: message, sql: sql, file: file, line: line)
        }
        try check(rc, sql, file: file, line: line)
    }

    /// Runs one statement with bound parameters and returns every row.
    @discardableResult
    func query(
        _ sql: String, _ parameters: [SQLValue] = [], file: String = #fileID, line: Int = #line
    ) throws(SQLiteError)
        -> [SQLRow]
    {
        let statement = try prepared(sql, file: file, line: line)
        // Reset even on failure, so that the statement ends its read or write and holds no
        // values bound to it (they may be secrets) once this returns.
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        for (index, value) in parameters.enumerated() {
            let position = Int32(index + 1)
            let rc: Int32
            switch value {
            case .null: rc = sqlite3_bind_null(statement, position)
            case .integer(let v): rc = sqlite3_bind_int64(statement, position, v)
            case .real(let v): rc = sqlite3_bind_double(statement, position, v)
            case .text(let v):
                // With its byte length: a NUL inside the string is stored, not cut off there.
                // (A null pointer would bind SQL NULL, so the empty string gets a literal.)
                var text = v
                rc = text.withUTF8 { utf8 in
                    guard let base = utf8.baseAddress, !utf8.isEmpty else {
                        return sqlite3_bind_text(statement, position, "", 0, Self.transient)
                    }
                    return base.withMemoryRebound(to: CChar.self, capacity: utf8.count) {
                        sqlite3_bind_text(statement, position, $0, Int32(utf8.count), Self.transient)
                    }
                }
            case .blob(let v):
                rc = v.withUnsafeBytes {
                    sqlite3_bind_blob(statement, position, $0.baseAddress, Int32($0.count), Self.transient)
                }
            }
            try check(rc, sql, file: file, line: line)
        }
        var rows: [SQLRow] = []
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { break }
            try check(rc, sql, file: file, line: line)
            var values: [String: SQLValue] = [:]
            for column in 0..<sqlite3_column_count(statement) {
                let name = String(cString: sqlite3_column_name(statement, column))
                switch sqlite3_column_type(statement, column) {
                case SQLITE_INTEGER: values[name] = .integer(sqlite3_column_int64(statement, column))
                case SQLITE_FLOAT: values[name] = .real(sqlite3_column_double(statement, column))
                case SQLITE_TEXT:
                    // Read with its byte length, so an embedded NUL round-trips exactly.
                    let count = Int(sqlite3_column_bytes(statement, column))
                    if count == 0 {
                        values[name] = .text("")
                    } else {
                        let pointer = sqlite3_column_text(statement, column)!
                        values[name] = .text(
                            String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self))
                    }
                case SQLITE_BLOB:
                    let count = Int(sqlite3_column_bytes(statement, column))
                    if count == 0 {
                        values[name] = .blob([])
                    } else {
                        let pointer = sqlite3_column_blob(statement, column)!
                        values[name] = .blob([UInt8](UnsafeRawBufferPointer(start: pointer, count: count)))
                    }
                default: values[name] = .null
                }
            }
            rows.append(SQLRow(values: values))
        }
        return rows
    }

    /// The cached statement for `sql`, compiled on first use.
    private func prepared(_ sql: String, file: String, line: Int) throws(SQLiteError) -> OpaquePointer {
        if let statement = statements[sql] { return statement }
        var statement: OpaquePointer?
        let rc = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil)
        guard rc == SQLITE_OK, let statement else {
            sqlite3_finalize(statement)
            try check(rc == SQLITE_OK ? SQLITE_MISUSE : rc, sql, file: file, line: line)
            throw SQLiteError(code: SQLITE_MISUSE, message: "empty statement", sql: sql, file: file, line: line)
        }
        if statements.count >= Self.statementCacheLimit {
            for cached in statements.values { sqlite3_finalize(cached) }
            statements.removeAll()
        }
        statements[sql] = statement
        return statement
    }

    /// Statements compiled and kept for reuse (for tests).
    var cachedStatementCount: Int { statements.count }

    /// The rowid of the last insert.
    var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// Rows changed by the last statement.
    var changes: Int { Int(sqlite3_changes(handle)) }

    /// Rows changed by every statement since the connection opened (rolled back ones included):
    /// unchanged means nothing was written since.
    var totalChanges: Int64 { sqlite3_total_changes64(handle) }

    /// Runs `body` in an immediate transaction, committing on return and rolling back on throw.
    /// With `synchronous: false` the commit does not wait for `fsync` (the connection's
    /// `synchronous=FULL` is lowered to NORMAL for this transaction only).
    func transaction<T>(synchronous: Bool = true, _ body: () throws -> T) throws -> T {
        if !synchronous {
            try query("PRAGMA synchronous=NORMAL")
        }
        defer {
            if !synchronous { _ = try? query("PRAGMA synchronous=FULL") }
        }
        try query("BEGIN IMMEDIATE")
        do {
            let result = try body()
            try query("COMMIT")
            return result
        } catch {
            try? query("ROLLBACK")
            throw error
        }
    }

    /// Runs `body` in a savepoint of the transaction in progress: a failure rolls back only
    /// what `body` wrote.
    func savepoint<T>(_ body: () throws -> T) throws -> T {
        try query("SAVEPOINT nested")
        do {
            let result = try body()
            try query("RELEASE nested")
            return result
        } catch {
            try? query("ROLLBACK TO nested")
            try? query("RELEASE nested")
            throw error
        }
    }
}
