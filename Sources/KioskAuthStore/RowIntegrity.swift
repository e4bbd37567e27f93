import Crypto
import FoundationEssentials

/// Row MACs for the tables beside `people` whose rows decide what is allowed: one-time
/// activation codes (failures, expiry, use, revocation), sessions (state and the columns that say
/// whose, where and whether ended), and terminal-wide state (identify throttle, offline window,
/// rate limiters, the steady clock, audit delivery progress).
///
/// Each row's MAC is an HMAC under the store's row key (HKDF label "row-mac") over the table's
/// name, the row's key and each covered column with its SQL type, in the same canonical
/// length-prefixed encoding as the people rows. Reads check it and fail with `StoreIntegrity`;
/// writes check the rows they change first (so a write never launders an edit into a valid MAC)
/// and recompute the MAC after, in the same transaction.
extension Store {
    /// A table with row MACs other than `people`: its name, the column that identifies a row,
    /// and the columns the MAC covers.
    struct MACTable: Sendable {
        var name: String
        var keyColumn: String
        var columns: [String]

        var selectList: String { ([keyColumn] + columns + ["mac"]).joined(separator: ", ") }
    }

    static let activationCodesTable = MACTable(
        name: "activation_codes", keyColumn: "id",
        columns: ["person_id", "code_mac", "issued_at", "expires_at", "failures", "used_at", "revoked_at"])
    static let sessionsTable = MACTable(
        name: "sessions", keyColumn: "id",
        columns: ["person_id", "state", "service", "tty", "opened_at", "ended_at", "end_reason"])
    static let terminalStateTable = MACTable(name: "terminal_state", keyColumn: "key", columns: ["value"])

    static let macTables = [activationCodesTable, sessionsTable, terminalStateTable]

    /// Appends `value` with its type to `input`, length-prefixed.
    static func appendCanonical(_ value: SQLValue, to input: inout [UInt8]) {
        switch value {
        case .null: input.append(0)
        case .integer(let v):
            input.append(1)
            withUnsafeBytes(of: v.bigEndian) { input += $0 }
        case .real(let v):
            input.append(2)
            withUnsafeBytes(of: v.bitPattern.bigEndian) { input += $0 }
        case .text(let v):
            input.append(3)
            let bytes = Array(v.utf8)
            withUnsafeBytes(of: UInt32(bytes.count).bigEndian) { input += $0 }
            input += bytes
        case .blob(let v):
            input.append(4)
            withUnsafeBytes(of: UInt32(v.count).bigEndian) { input += $0 }
            input += v
        }
    }

    /// The MAC over one row of `table`.
    func rowMAC(_ table: MACTable, _ row: SQLRow) -> [UInt8] {
        var input: [UInt8] = Array(table.name.utf8)
        input.append(0)
        Self.appendCanonical(row[table.keyColumn], to: &input)
        for column in table.columns {
            Self.appendCanonical(row[column], to: &input)
        }
        return Array(HMAC<SHA256>.authenticationCode(for: input, using: rowKey))
    }

    /// Checks a row read with `table.selectList` (or `SELECT *`).
    func checkRow(_ table: MACTable, _ row: SQLRow) throws(StoreError) {
        guard let mac = row["mac"].bytes, mac == rowMAC(table, row) else {
            let key: String =
                switch row[table.keyColumn] {
                case .integer(let v): "\(v)"
                case .text(let v): v
                default: "?"
                }
            throw StoreError(
                .integrity("\(table.name) row \(key) does not match its MAC (changed behind the store's back)"))
        }
    }

    /// Checks the rows of `table` matching `condition` (before a write).
    func checkRows(_ table: MACTable, where condition: String, _ parameters: [SQLValue], in db: SQLiteConnection) throws
    {
        for row in try db.query("SELECT \(table.selectList) FROM \(table.name) WHERE \(condition)", parameters) {
            try checkRow(table, row)
        }
    }

    /// Recomputes the MACs of the rows of `table` matching `condition` (after a write).
    func resealRows(
        _ table: MACTable, where condition: String, _ parameters: [SQLValue], in db: SQLiteConnection
    ) throws {
        for row in try db.query(
            "SELECT \(([table.keyColumn] + table.columns).joined(separator: ", ")) FROM \(table.name) WHERE \(condition)",
            parameters)
        {
            try db.query(
                "UPDATE \(table.name) SET mac = ? WHERE \(table.keyColumn) = ?",
                [.blob(rowMAC(table, row)), row[table.keyColumn]])
        }
    }

    /// Checks the rows a write will touch, runs it, and reseals them. `condition` must select
    /// the same rows before and after the write (use the row key).
    func updatingRows<T>(
        _ table: MACTable, where condition: String, _ parameters: [SQLValue], in db: SQLiteConnection,
        _ body: () throws -> T
    ) throws -> T {
        try checkRows(table, where: condition, parameters, in: db)
        let result = try body()
        try resealRows(table, where: condition, parameters, in: db)
        return result
    }

    /// Every row MAC in the store (people and the tables above): for the check at start-up.
    /// Proportional to the number of people, codes, sessions and terminal values, never to the
    /// audit trail.
    func checkAllRowMACs(in db: SQLiteConnection) throws {
        for row in try db.query("SELECT \(Self.personColumns) FROM people") {
            _ = try decodePerson(row)
        }
        for table in Self.macTables {
            try checkRows(table, where: "1", [], in: db)
        }
    }
}
