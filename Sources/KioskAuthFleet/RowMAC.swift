import Crypto
public import FoundationEssentials

/// Row MACs (docs/fleet.md §3): the rows whose forgery would change an unlock decision (people,
/// passcode verifiers, templates) carry HMAC-SHA256 under the data key's row-MAC subkey, made by
/// the member that wrote them. The MAC covers the table, the row id, the generation, the row's
/// version and every column that matters, each length-prefixed, so no value can be moved to
/// another row, table or generation, and an older version of the row is recognisable.
package enum FleetRowMAC {
    /// The tables whose rows carry a MAC.
    package static let tables: Set<String> = ["people", "passcode_verifiers", "templates"]

    /// The bytes the MAC is computed over. `nil` fields (a person without a uid) are encoded
    /// distinctly from empty ones.
    package static func input(table: String, row: String, generation: Int32, version: Int64, fields: [[UInt8]?]) -> Data
    {
        var input = Data()
        func append(_ bytes: [UInt8]?) {
            guard let bytes else {
                input.append(0)
                return
            }
            input.append(1)
            withUnsafeBytes(of: UInt32(bytes.count).bigEndian) { input.append(contentsOf: $0) }
            input.append(contentsOf: bytes)
        }
        for part in ["kioskauth.fleet.row-mac.v1", table, row, String(generation), String(version)] {
            append(Array(part.utf8))
        }
        for field in fields { append(field) }
        return input
    }

    /// The covered columns of a write as it is pushed: (table, row id, fields).
    package static func content(of write: FleetWrite) -> (table: String, row: String, fields: [[UInt8]?])? {
        switch write {
        case .person(let id, let name, let role, let uid, let state):
            return ("people", id.fleetText, [utf8(name), utf8(role), uid.map { utf8(String($0)) }, utf8(state)])
        case .verifier(let person, let sealed):
            return ("passcode_verifiers", person.fleetText, [sealed.bytes])
        case .template(let id, let person, let finger, let driver, let deviceType, let sealed):
            return (
                "templates", id.fleetText,
                [utf8(person.fleetText), utf8(finger), utf8(driver), utf8(deviceType), sealed.bytes]
            )
        default:
            return nil
        }
    }

    /// The covered columns of a row as the change feed carries it, or nil if one is missing.
    package static func content(ofChange entity: String, key: String, fields: [String: String]) -> [[UInt8]?]? {
        switch entity {
        case "people":
            guard let name = fields["name"], let role = fields["role"], let state = fields["state"] else { return nil }
            return [utf8(name), utf8(role), fields["uid"].map(utf8), utf8(state)]
        case "passcode_verifiers":
            guard let sealed = fields["sealed"].flatMap(bytea) else { return nil }
            return [sealed]
        case "templates":
            guard let person = fields["person_id"], let finger = fields["finger"], let driver = fields["driver"],
                let deviceType = fields["device_type"], let sealed = fields["sealed"].flatMap(bytea)
            else { return nil }
            return [utf8(person), utf8(finger), utf8(driver), utf8(deviceType), sealed]
        default:
            return nil
        }
    }

    package static func utf8(_ text: String) -> [UInt8] { Array(text.utf8) }

    /// A bytea as the feed's jsonb writes it (`\x` and hex).
    package static func bytea(_ text: String) -> [UInt8]? {
        guard text.hasPrefix("\\x") else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity((text.utf8.count - 2) / 2)
        var index = text.index(text.startIndex, offsetBy: 2)
        while index < text.endIndex {
            guard let next = text.index(index, offsetBy: 2, limitedBy: text.endIndex),
                let byte = UInt8(text[index..<next], radix: 16)
            else { return nil }
            bytes.append(byte)
            index = next
        }
        return bytes
    }
}

extension FleetChange {
    /// Whether a change may be applied, as `FleetDirectory.pull` found it.
    public enum Integrity: Sendable, Equatable, Codable {
        /// The table carries no row MAC (terminals, wrapped keys, lockout sums), or the change is
        /// a deletion, which a directory writer can always make (docs/fleet.md §8).
        case notCovered
        /// The row's MAC is valid and its version is not older than one already seen.
        case verified
        /// The MAC is missing or wrong: the row was written by someone without the data key.
        /// Its body is withheld; never apply it.
        case forged(String)
        /// A genuine row older than a version of it already seen (or one deleted before): an
        /// old row written back. Its body is withheld; never apply it.
        case replayed(String)
        /// The row is MACed under a generation this terminal does not hold (or no keyring was
        /// given to the directory). Its body is withheld.
        case unverifiable(String)
    }

    /// True when the change may be applied: verified, or of a table without row MACs.
    public var isTrusted: Bool {
        switch integrity {
        case .notCovered, .verified: true
        case .forged, .replayed, .unverifiable: false
        }
    }
}
