public import FoundationEssentials
import KioskAuthCore

/// A terminal's registration: who it is and which reader it has, so templates reach only
/// terminals that can use them.
public struct TerminalRegistration: Sendable, Equatable, Codable {
    public var id: UUID
    public var name: String
    public var publicKey: [UInt8]
    /// libfprint's driver name (e.g. `virtual_image`), nil without a reader.
    public var readerDriver: String?
    /// The device type within the driver; templates are tagged with both.
    public var readerDeviceType: String?
    /// A match-on-chip reader enrols locally and never takes templates from the directory.
    public var isMatchOnChip: Bool

    /// A registration for `keyPair`'s terminal.
    public init(
        id: UUID, name: String, publicKey: [UInt8], readerDriver: String?, readerDeviceType: String?,
        isMatchOnChip: Bool
    ) {
        self.id = id
        self.name = name
        self.publicKey = publicKey
        self.readerDriver = readerDriver
        self.readerDeviceType = readerDeviceType
        self.isMatchOnChip = isMatchOnChip
    }
}

/// A terminal as the directory lists it (`FleetDirectory.terminals`).
public struct FleetTerminal: Sendable, Equatable, Codable {
    public var id: UUID
    public var name: String
    /// `pending`, `member` or `removed`.
    public var state: String
    public var readerDriver: String?
    public var readerDeviceType: String?
    public var isMatchOnChip: Bool
    public var joinedAt: Date
    public var removedAt: Date?
    /// When it last recorded its cursor (its last completed pull); nil if it never did.
    public var lastSeenAt: Date?

    package init(
        id: UUID, name: String, state: String, readerDriver: String?, readerDeviceType: String?, isMatchOnChip: Bool,
        joinedAt: Date, removedAt: Date?, lastSeenAt: Date?
    ) {
        self.id = id
        self.name = name
        self.state = state
        self.readerDriver = readerDriver
        self.readerDeviceType = readerDeviceType
        self.isMatchOnChip = isMatchOnChip
        self.joinedAt = joinedAt
        self.removedAt = removedAt
        self.lastSeenAt = lastSeenAt
    }
}

/// One write a terminal pushes. Secrets are sealed before they get here.
public enum FleetWrite: Sendable, Equatable, Codable {
    /// Adds or changes a person (`state`: active, suspended or removed).
    case person(id: UUID, name: String, role: String, uid: Int32?, state: String)
    /// Sets a person's passcode verifier.
    case verifier(person: UUID, sealed: SealedBlob)
    /// Adds or replaces a template, tagged with the reader it was made on.
    case template(id: UUID, person: UUID, finger: String, driver: String, deviceType: String, sealed: SealedBlob)
    /// Removes a template.
    case removeTemplate(id: UUID)
    /// Adds `count` passcode failures counted at this terminal.
    case passcodeFailures(person: UUID, count: Int32)
    /// Clears a person's failures everywhere (a successful passcode, an admin reset).
    case passcodeReset(person: UUID)
    /// Appends one audit event; `key` makes it stored once however often it is resent.
    case audit(key: UUID, sequence: Int64, occurredAt: Date, person: String?, action: String, result: String)

    package var record: [String: String] {
        switch self {
        case .person(let id, let name, let role, let uid, let state):
            var record = ["op": "person", "person": id.fleetText, "name": name, "role": role, "state": state]
            if let uid { record["uid"] = String(uid) }
            return record
        case .verifier(let person, let sealed):
            return [
                "op": "verifier", "person": person.fleetText, "generation": String(sealed.generation),
                "sealed": Data(sealed.bytes).base64EncodedString(),
            ]
        case .template(let id, let person, let finger, let driver, let deviceType, let sealed):
            return [
                "op": "template", "template": id.fleetText, "person": person.fleetText, "finger": finger,
                "driver": driver, "device_type": deviceType, "generation": String(sealed.generation),
                "sealed": Data(sealed.bytes).base64EncodedString(),
            ]
        case .removeTemplate(let id):
            return ["op": "remove_template", "template": id.fleetText]
        case .passcodeFailures(let person, let count):
            return ["op": "passcode_failures", "person": person.fleetText, "count": String(count)]
        case .passcodeReset(let person):
            return ["op": "passcode_reset", "person": person.fleetText]
        case .audit(let key, let sequence, let occurredAt, let person, let action, let result):
            var record = [
                "op": "audit", "key": key.fleetText, "sequence": String(sequence),
                "occurred_at": ISO8601.string(occurredAt), "action": action, "result": result,
            ]
            if let person { record["person"] = person }
            return record
        }
    }
}

/// A batch of writes applied in one transaction, exactly once per idempotency key. The terminal
/// stores the batch with its key in its durable queue before the first attempt and resends it,
/// same key, until the directory answers.
public struct PushBatch: Sendable, Equatable, Codable {
    public var idempotencyKey: UUID
    public var terminal: UUID
    public var writes: [FleetWrite]

    /// A batch from `terminal`.
    public init(idempotencyKey: UUID, terminal: UUID, writes: [FleetWrite]) {
        self.idempotencyKey = idempotencyKey
        self.terminal = terminal
        self.writes = writes
    }
}

/// What became of a push.
public enum PushOutcome: Sendable, Equatable, Codable {
    /// Applied now.
    case applied
    /// Its idempotency key had been applied before; nothing changed.
    case alreadyApplied
}

/// One entry of the change feed: the row as it is after the change, secrets sealed.
public struct FleetChange: Sendable, Equatable, Codable {
    /// The change id: increasing in commit order, with gaps.
    public var id: Int64
    /// The table (`people`, `passcode_verifiers`, `templates`, `person_lockout`, `terminals`,
    /// `wrapped_keys`).
    public var entity: String
    /// The row's key (a person, template or terminal id; `terminal/generation` for wrapped keys).
    public var key: String
    /// The row was deleted.
    public var isDeletion: Bool
    /// The row after the change as JSON (bytea columns as `\x` hex), nil for a deletion, and
    /// nil for a change that is not trusted (see `integrity`).
    public var body: String?
    /// What the row MAC check found (docs/fleet.md §3). Apply only changes that `isTrusted`.
    public var integrity: Integrity = .notCovered
    /// The row's version (people, verifiers, templates): a terminal keeps it with its copy
    /// and hands it back through `FleetDirectory.rememberRowVersion` after a restart, so an
    /// older row written back is recognised.
    public var rowVersion: Int64? = nil

    package init(id: Int64, entity: String, key: String, isDeletion: Bool, body: String?) {
        self.id = id
        self.entity = entity
        self.key = key
        self.isDeletion = isDeletion
        self.body = body
    }

    /// The body's fields, strings as they are and other values as JSON text, as NSNumber gave
    /// them before this module left Foundation: an integer literal as its exact digits (a row
    /// version may be near Int64.max), any other number as written (so "1001.0" or "5e0" never
    /// reads as an integer, and a row that spells one so stays refused), booleans as "1" and
    /// "0"; nulls, arrays and objects are left out. Not a JSON object: no fields.
    public var fields: [String: String] {
        guard let body, let object = try? JSONDecoder().decode([String: FieldValue].self, from: Data(body.utf8))
        else { return [:] }
        let literals = Self.topLevelNumberLiterals(Array(body.utf8))
        var fields: [String: String] = [:]
        for (name, value) in object {
            switch value {
            case .text(let text): fields[name] = text
            case .number(let number):
                guard let literal = literals[name] else {
                    // A name spelt with escapes, which the scan leaves out: as NSNumber printed it.
                    let isIntegral = number.rounded() == number && abs(number) < 9_007_199_254_740_992
                    fields[name] = isIntegral ? String(Int64(number)) : String(number)
                    continue
                }
                let isInteger = literal.utf8.allSatisfy { $0 == UInt8(ascii: "-") || (0x30...0x39).contains($0) }
                fields[name] = isInteger ? Int64(literal).map { String($0) } ?? literal : literal
            case .absent: break
            }
        }
        return fields
    }

    /// One field of a body as `fields` reads it.
    private enum FieldValue: Decodable {
        case text(String)
        case number(Double)
        /// Null, an array or an object.
        case absent

        init(from decoder: any Decoder) throws {
            let value = try decoder.singleValueContainer()
            if value.decodeNil() {
                self = .absent
            } else if let string = try? value.decode(String.self) {
                self = .text(string)
            } else if let flag = try? value.decode(Bool.self) {
                self = .text(flag ? "1" : "0")
            } else if let number = try? value.decode(Double.self) {
                self = .number(number)
            } else {
                self = .absent
            }
        }
    }

    /// The literal text of each number that is a member of the top-level object of `json`, by
    /// member name (names spelt with escapes are left out). `json` was already decoded, so it is
    /// well formed; this only finds where each top-level value starts and ends.
    static func topLevelNumberLiterals(_ json: [UInt8]) -> [String: String] {
        var literals: [String: String] = [:]
        var index = 0
        func skipBlank() {
            while index < json.count, [0x20, 0x09, 0x0A, 0x0D].contains(json[index]) { index += 1 }
        }
        /// Past a string starting at `index`; its text when it has no escapes.
        func string() -> String? {
            index += 1
            let start = index
            var escaped = false
            while index < json.count, json[index] != UInt8(ascii: "\"") {
                if json[index] == UInt8(ascii: "\\") {
                    escaped = true
                    index += 1
                }
                index += 1
            }
            let text = escaped ? nil : String(decoding: json[start..<min(index, json.count)], as: UTF8.self)
            index += 1
            return text
        }
        /// Past a value starting at `index`; its text when it is a number.
        func value() -> String? {
            guard index < json.count else { return nil }
            switch json[index] {
            case UInt8(ascii: "\""):
                _ = string()
                return nil
            case UInt8(ascii: "{"), UInt8(ascii: "["):
                var depth = 0
                repeat {
                    switch json[index] {
                    case UInt8(ascii: "\""):
                        _ = string()
                        continue
                    case UInt8(ascii: "{"), UInt8(ascii: "["): depth += 1
                    case UInt8(ascii: "}"), UInt8(ascii: "]"): depth -= 1
                    default: break
                    }
                    index += 1
                } while depth > 0 && index < json.count
                return nil
            default:
                let start = index
                while index < json.count, !",}] \t\n\r".utf8.contains(json[index]) { index += 1 }
                let literal = String(decoding: json[start..<index], as: UTF8.self)
                return literal.first.map { $0 == "-" || $0.isNumber } == true ? literal : nil
            }
        }
        skipBlank()
        if index < json.count, json[index] == 0xEF { index += 3 }  // a byte-order mark
        skipBlank()
        guard index < json.count, json[index] == UInt8(ascii: "{") else { return [:] }
        index += 1
        while index < json.count {
            skipBlank()
            guard index < json.count, json[index] == UInt8(ascii: "\"") else { break }
            let name = string()
            skipBlank()
            guard index < json.count, json[index] == UInt8(ascii: ":") else { break }
            index += 1
            skipBlank()
            if let literal = value(), let name { literals[name] = literal }
            skipBlank()
            guard index < json.count, json[index] == UInt8(ascii: ",") else { break }
            index += 1
        }
        return literals
    }

    /// The sealed secret in a `templates` or `passcode_verifiers` change.
    public var sealedBlob: SealedBlob? { Self.sealedBlob(in: fields) }

    /// The sealed secret in the `fields` of such a change (each reading of `fields` parses the
    /// body again: a caller that holds them already passes them here).
    public static func sealedBlob(in fields: [String: String]) -> SealedBlob? {
        guard let generation = fields["generation"].flatMap({ Int32($0) }),
            let bytes = fields["sealed"].flatMap(FleetRowMAC.bytea)
        else { return nil }
        return SealedBlob(generation: generation, bytes: bytes)
    }
}

/// A one-time join token as the admin hands it over: `kat1.<token id>.<secret>`. The directory
/// stores only SHA-256 of the secret; the issuing member keeps the secret until it has admitted
/// the terminal that used it.
public struct JoinToken: Sendable, Equatable, Codable, CustomStringConvertible {
    public let id: UUID
    /// The secret: the joining terminal keeps it until its admission is checked with it (§6.2).
    public let secret: [UInt8]

    package init(id: UUID, secret: [UInt8]) {
        self.id = id
        self.secret = secret
    }

    /// Parses the text the admin types.
    public init(text: String) throws(FleetError) {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "kat1", let id = UUID(uuidString: String(parts[1])),
            let secret = Data(base64URL: String(parts[2])), secret.count == 32
        else { throw FleetError(.joinRefused("malformed join token")) }
        self.init(id: id, secret: Array(secret))
    }

    /// The text to hand to the joining terminal's admin.
    public var text: String { "kat1.\(id.fleetText).\(Data(secret).base64URL)" }

    /// Never prints the secret.
    public var description: String { "join token \(id.fleetText)" }
}

extension UUID {
    package var fleetText: String { uuidString.lowercased() }
}

extension Data {
    init?(base64URL text: String) {
        var base64 = String(text.map { $0 == "-" ? "+" : $0 == "_" ? "/" : $0 })
        while base64.count % 4 != 0 { base64 += "=" }
        self.init(base64Encoded: base64)
    }

    var base64URL: String {
        String(base64EncodedString().compactMap { $0 == "+" ? "-" : $0 == "/" ? "_" : $0 == "=" ? nil : $0 })
    }
}
