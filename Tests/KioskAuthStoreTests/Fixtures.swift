import CSQLite3
import Foundation
import KioskAuthCore
import KioskAuthStore
import Logging
import Testing

/// A fresh directory under the system's temporary directory, removed when the value goes away.
final class TemporaryDirectory {
    let path: String

    init() throws {
        path =
            FileManager.default.temporaryDirectory.appendingPathComponent("kioskauth-store-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }

    /// A path inside the directory.
    func file(_ name: String) -> String { path + "/" + name }
}

/// Small Argon2id parameters so tests stay fast; the store records them with every verifier.
let testHashParameters = PasscodeHashParameters(memoryKiB: 1024, iterations: 1, parallelism: 1)

/// A logger that drops everything.
let quietLogger = Logger(label: "kioskauth.tests") { _ in SwiftLogNoOpLogHandler() }

/// A fixed instant with whole seconds, so dates survive the store's REAL columns exactly.
let testNow = Date(timeIntervalSince1970: 1_750_000_000)

/// A store in a temporary directory, with its key, reopened at will.
final class StoreFixture {
    let directory: TemporaryDirectory
    let key: StoreKey
    let path: String

    init(key: StoreKey = .random()) throws {
        directory = try TemporaryDirectory()
        self.key = key
        path = directory.file(Store.databaseFileName)
    }

    func open(with key: StoreKey? = nil) throws -> Store {
        try Store(path: path, key: key ?? self.key, logger: quietLogger, now: testNow)
    }

    /// Opens the store, runs `body`, and closes the store again whatever happens.
    func withStore<T>(_ body: (Store) throws -> T) throws -> T {
        let store = try open()
        defer { store.close() }
        return try body(store)
    }

    /// The main database file's bytes.
    func databaseBytes() throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) }

    /// The write-ahead log's bytes, empty when there is none.
    func walBytes() -> [UInt8] {
        (try? Data(contentsOf: URL(fileURLWithPath: path + "-wal"))).map { [UInt8]($0) } ?? []
    }

    /// A raw SQLite connection to the same file, bypassing the store.
    func raw() throws -> RawDatabase { try RawDatabase(path: path) }
}

extension Store {
    /// Adds a local, active caregiver.
    func addTestPerson(_ name: String, displayName: String? = nil, uid: Int? = nil) throws -> StoredPerson {
        try addPerson(
            name: LoginName(name), displayName: displayName ?? name.capitalized, roles: RoleSet(primary: .caregiver),
            origin: .local, state: .active, uid: uid, now: testNow)
    }

    /// Sets a passcode with the small test parameters.
    func setTestPasscode(_ passcode: String, for person: StoredPerson) throws {
        try setPasscodeVerifier(
            PasscodeVerifier.make(passcode: passcode, parameters: testHashParameters), for: person, now: testNow)
    }
}

/// Whether `haystack` contains `needle` as a contiguous run.
func bytes(_ haystack: [UInt8], contain needle: [UInt8]) -> Bool {
    guard !needle.isEmpty, haystack.count >= needle.count else { return needle.isEmpty }
    let first = needle[0]
    var index = 0
    let last = haystack.count - needle.count
    while index <= last {
        if haystack[index] == first, haystack[index..<(index + needle.count)].elementsEqual(needle) { return true }
        index += 1
    }
    return false
}

/// Runs `body` and returns the store error's code, or nil when it did not throw a store error.
func storeErrorCode(_ body: () throws -> Void) -> StoreError.Code? {
    do {
        try body()
        return nil
    } catch let error as StoreError {
        return error.code
    } catch {
        return nil
    }
}

/// A failure of the raw connection.
struct RawSQLiteError: Error, CustomStringConvertible {
    var description: String
}

/// A value bound to or read from a raw statement.
enum RawValue: Equatable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])

    var blob: [UInt8]? {
        if case .blob(let bytes) = self { return bytes }
        return nil
    }
    var integer: Int64? {
        if case .integer(let value) = self { return value }
        return nil
    }
    var text: String? {
        if case .text(let value) = self { return value }
        return nil
    }
}

/// A plain SQLite connection, for doing to the file what an attacker or a newer daemon would.
final class RawDatabase {
    private var handle: OpaquePointer?
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    init(path: String) throws {
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE, nil) == SQLITE_OK else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            sqlite3_close_v2(handle)
            throw RawSQLiteError(description: message)
        }
    }

    deinit { close() }

    func close() {
        if let handle { sqlite3_close_v2(handle) }
        handle = nil
    }

    /// Runs one statement and returns its rows.
    @discardableResult
    func query(_ sql: String, _ parameters: [RawValue] = []) throws -> [[RawValue]] {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else {
            throw RawSQLiteError(description: "\(String(cString: sqlite3_errmsg(handle))) in \(sql)")
        }
        defer { sqlite3_finalize(statement) }
        for (index, value) in parameters.enumerated() {
            let position = Int32(index + 1)
            switch value {
            case .null: sqlite3_bind_null(statement, position)
            case .integer(let v): sqlite3_bind_int64(statement, position, v)
            case .real(let v): sqlite3_bind_double(statement, position, v)
            case .text(let v): sqlite3_bind_text(statement, position, v, -1, Self.transient)
            case .blob(let v):
                _ = v.withUnsafeBytes {
                    sqlite3_bind_blob(statement, position, $0.baseAddress, Int32($0.count), Self.transient)
                }
            }
        }
        var rows: [[RawValue]] = []
        while true {
            let rc = sqlite3_step(statement)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else {
                throw RawSQLiteError(description: "\(String(cString: sqlite3_errmsg(handle))) in \(sql)")
            }
            var row: [RawValue] = []
            for column in 0..<sqlite3_column_count(statement) {
                switch sqlite3_column_type(statement, column) {
                case SQLITE_INTEGER: row.append(.integer(sqlite3_column_int64(statement, column)))
                case SQLITE_FLOAT: row.append(.real(sqlite3_column_double(statement, column)))
                case SQLITE_TEXT: row.append(.text(String(cString: sqlite3_column_text(statement, column))))
                case SQLITE_BLOB:
                    let count = Int(sqlite3_column_bytes(statement, column))
                    let pointer = sqlite3_column_blob(statement, column)
                    row.append(.blob(count == 0 ? [] : [UInt8](UnsafeRawBufferPointer(start: pointer, count: count))))
                default: row.append(.null)
                }
            }
            rows.append(row)
        }
        return rows
    }

    /// The first column of the first row.
    func scalar(_ sql: String, _ parameters: [RawValue] = []) throws -> RawValue {
        try query(sql, parameters).first?.first ?? .null
    }
}
