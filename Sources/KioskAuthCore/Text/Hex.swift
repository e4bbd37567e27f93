/// Lower-case hexadecimal, the one encoder for MACs, store ids, session ids and digests: a
/// 16-entry table and one allocation per string, never `String(format:)` (32 formatter calls per
/// MAC showed up as half of start-up and a quarter of `GetStatus` CPU).
public enum Hex {
    /// `bytes` as lower-case hex, two digits per byte.
    public static func encode<Bytes: Collection>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        let count = bytes.count
        if count == 0 { return "" }
        let table: StaticString = "0123456789abcdef"
        let digits = table.utf8Start
        return String(unsafeUninitializedCapacity: count * 2) { buffer in
            var index = 0
            for byte in bytes {
                buffer[index] = digits[Int(byte >> 4)]
                buffer[index + 1] = digits[Int(byte & 0x0f)]
                index += 2
            }
            return index
        }
    }

    /// The bytes `text` spells in hex (either case), or nil when it has an odd length or a
    /// character that is not a hex digit.
    public static func decode<Text: StringProtocol>(_ text: Text) -> [UInt8]? {
        let utf8 = text.utf8
        guard utf8.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(utf8.count / 2)
        var high: UInt8?
        for character in utf8 {
            guard let value = nibble(character) else { return nil }
            if let first = high {
                bytes.append(first << 4 | value)
                high = nil
            } else {
                high = value
            }
        }
        return bytes
    }

    @inline(__always)
    private static func nibble(_ character: UInt8) -> UInt8? {
        switch character {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): character &- UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): character &- UInt8(ascii: "a") &+ 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): character &- UInt8(ascii: "A") &+ 10
        default: nil
        }
    }
}
