public import FoundationEssentials
import KioskAuthCore

// Audit delivery's durable side: the cursor (the last entry the endpoint acknowledged) lives in
// the same store as the trail, so both are restored together from a backup and a cursor can never
// point past the entries it covers. The wire format of a batch is here too, because it is a pure
// function of the stored entries and the store's identity.

/// How far audit delivery has come, as persisted.
public struct AuditDeliveryProgress: Sendable, Equatable, Codable {
    /// The endpoint that acknowledged the entries (the configured URL).
    public var endpoint: String
    /// The highest sequence number it acknowledged; 0 when none.
    public var deliveredThrough: Int
    /// When it last acknowledged a batch.
    public var lastDeliveryAt: Date?

    /// Creates a progress record.
    public init(endpoint: String, deliveredThrough: Int, lastDeliveryAt: Date?) {
        self.endpoint = endpoint
        self.deliveredThrough = deliveredThrough
        self.lastDeliveryAt = lastDeliveryAt
    }
}

extension Store {
    static let auditDeliveryKey = "audit_delivery"

    /// The identity of this store's audit trail in delivered event ids: the store's random id in
    /// hex. It survives restarts and is new for a new store, whose sequence numbers start again.
    public var auditStreamID: String {
        (try? locked { storeID }).map(Hex.encode) ?? ""
    }

    /// The progress as recorded, whichever endpoint it belongs to; nil when nothing was ever
    /// delivered.
    public func recordedAuditDeliveryProgress() throws(StoreError) -> AuditDeliveryProgress? {
        try terminalValue(AuditDeliveryProgress.self, forKey: Self.auditDeliveryKey)
    }

    /// Delivery progress towards `endpoint`. A different endpoint than the one recorded starts
    /// from the beginning of the trail: nothing it holds was acknowledged by it.
    public func auditDeliveryProgress(endpoint: String) throws(StoreError) -> AuditDeliveryProgress {
        guard let stored = try recordedAuditDeliveryProgress(), stored.endpoint == endpoint else {
            return AuditDeliveryProgress(endpoint: endpoint, deliveredThrough: 0, lastDeliveryAt: nil)
        }
        return stored
    }

    /// Durably records that `endpoint` acknowledged every entry through `sequence`, at `now`.
    /// The cursor never moves backwards, and never past the trail's newest entry (an integrity
    /// error: nothing can acknowledge an entry that does not exist).
    public func recordAuditDelivery(through sequence: Int, endpoint: String, at now: Date) throws(StoreError) {
        try transaction { db in
            let head = try db.query("SELECT MAX(seq) AS seq FROM audit").first?["seq"].int ?? 0
            guard sequence <= head else {
                throw StoreError(
                    .integrity("audit delivery acknowledged entry \(sequence) but the trail ends at entry \(head)"))
            }
            var progress = AuditDeliveryProgress(endpoint: endpoint, deliveredThrough: sequence, lastDeliveryAt: now)
            let row = try db.query(
                "SELECT \(Self.terminalStateTable.selectList) FROM terminal_state WHERE key = ?",
                [.text(Self.auditDeliveryKey)]
            ).first
            if let row { try checkRow(Self.terminalStateTable, row) }
            if let text = row?["value"].string,
                let stored = try? JSONDecoder().decode(AuditDeliveryProgress.self, from: Data(text.utf8)),
                stored.endpoint == endpoint
            {
                progress.deliveredThrough = max(stored.deliveredThrough, sequence)
            }
            try writeTerminalValue(progress, forKey: Self.auditDeliveryKey, in: db)
        }
    }

    /// The entries with sequence numbers in `range`, oldest first. Fewer than `range.count` only
    /// when entries were deleted behind the store's back (``verifyAudit(expectedHead:)`` says so).
    public func auditEntries(in range: ClosedRange<Int>) throws(StoreError) -> [AuditEntry] {
        try locked {
            try connection.query(
                "SELECT * FROM audit WHERE seq BETWEEN ? AND ? ORDER BY seq",
                [.integer(Int64(range.lowerBound)), .integer(Int64(range.upperBound))]
            ).map(decodeAudit)
        }
    }
}

/// One request body of audit delivery: consecutive entries of one store's trail, as JSON.
///
/// ```json
/// {"events": [{"action": "passcode.verify", "callerPid": 812, "callerUid": 0,
///              "id": "<stream>-42-<mac prefix>", "mac": "<64 hex>", "method": "passcode",
///              "person": "sarah", "result": "success", "sequence": 42, "service": "kioskauth",
///              "time": "2025-06-15T08:00:00.123Z", "timeMicroseconds": 1749974400123456}],
///  "format": "io.kioskauth.audit.v1",
///  "terminal": {"hostname": "ward-3-kiosk", "stream": "<32 hex>"}}
/// ```
///
/// Absent optional fields are left out. `time` is for people; `timeMicroseconds` is the exact
/// value the chain MAC covers, so whoever holds the store key can recompute every MAC.
public struct AuditBatch: Sendable {
    /// The `format` every body carries.
    public static let format = "io.kioskauth.audit.v1"

    /// The store's audit stream id (``Store/auditStreamID``).
    public let stream: String
    /// The terminal's host name, for people reading the collector.
    public let terminal: String
    /// Consecutive entries, oldest first.
    public let entries: [AuditEntry]

    /// Bundles `entries` of the trail `stream` from host `terminal`.
    public init(stream: String, terminal: String, entries: [AuditEntry]) {
        self.stream = stream
        self.terminal = terminal
        self.entries = entries
    }

    /// An entry's delivery id: the same on every retry and after every restart, different for every
    /// entry of every store. The MAC prefix keeps it unique even when a store is restored from a
    /// backup and sequence numbers are reused for different events.
    public static func eventID(stream: String, entry: AuditEntry) -> String {
        "\(stream)-\(entry.sequence)-\(entry.macHex.prefix(16))"
    }

    /// The batch's key (the `Idempotency-Key` header): the same for the same range of the same
    /// trail.
    public var key: String {
        guard let first = entries.first, let last = entries.last else { return "\(stream)-empty" }
        return "\(stream)-\(first.sequence)-\(last.sequence)-\(last.macHex.prefix(16))"
    }

    private struct Body: Encodable {
        var format: String
        var terminal: Terminal
        var events: [Event]
    }

    private struct Terminal: Encodable {
        var stream: String
        var hostname: String
    }

    private struct Event: Encodable {
        var id: String
        var sequence: Int
        var time: String
        var timeMicroseconds: Int64
        var action: String
        var result: String
        var person: String?
        var method: String?
        var callerUid: Int?
        var callerPid: Int?
        var service: String?
        var detail: String?
        var mac: String
    }

    /// The JSON body: sorted keys, so the same batch is the same bytes on every retry.
    public func encoded() -> Data {
        let body = Body(
            format: Self.format, terminal: Terminal(stream: stream, hostname: terminal),
            events: entries.map { entry in
                Event(
                    id: Self.eventID(stream: stream, entry: entry), sequence: entry.sequence,
                    time: ISO8601.string(entry.time, milliseconds: true),
                    timeMicroseconds: entry.timeMicroseconds, action: entry.record.action,
                    result: entry.record.result, person: entry.record.person, method: entry.record.method,
                    callerUid: entry.record.callerUID, callerPid: entry.record.callerPID,
                    service: entry.record.service, detail: entry.record.detail, mac: entry.macHex)
            })
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        // Strings, numbers and optionals only: encoding cannot fail.
        return (try? encoder.encode(body)) ?? Data()
    }
}
