/// The character rule for text that callers send and people later read: names, display names,
/// PAM services, terminals, hosts and every other identifier. Refused: NUL and every other C0
/// control (U+0000–U+001F), DEL (U+007F), the C1 controls (U+0080–U+009F), the bidirectional
/// embeddings and overrides (U+202A–U+202E), isolates (U+2066–U+2069), and the line and
/// paragraph separators (U+2028, U+2029). The directional marks (U+200E, U+200F, U+061C) stay
/// allowed: mixed-direction names need them, and they reorder nothing but neutral characters.
/// Such characters can
/// truncate a string in C, forge a line of a log, or move and recolour what a terminal shows.
public enum SafeText {
    /// Whether `scalar` is refused.
    public static func isForbidden(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x00...0x1F, 0x7F...0x9F, 0x202A...0x202E, 0x2066...0x2069, 0x2028, 0x2029: true
        default: false
        }
    }

    /// The first refused character of `text`, or nil when it has none.
    public static func firstForbidden(in text: String) -> Unicode.Scalar? {
        text.unicodeScalars.first(where: isForbidden)
    }

    /// Checks `text` for the input named `field`.
    ///
    /// - Throws: ``InvalidInputError`` naming `field` and the refused character's code point.
    public static func check(_ text: String, field: String) throws(InvalidInputError) {
        if let scalar = firstForbidden(in: text) {
            throw InvalidInputError(
                field: field,
                message: "Control and bidirectional-override characters are not allowed (found \(codePoint(scalar))).")
        }
    }

    /// `text` with every refused character written as an escape: `\xNN` below U+0100,
    /// `\u{NNNN}` above. Safe to print to a terminal.
    public static func escaped(_ text: String) -> String {
        guard text.unicodeScalars.contains(where: isForbidden) else { return text }
        var result = ""
        result.reserveCapacity(text.utf8.count + 8)
        for scalar in text.unicodeScalars {
            if isForbidden(scalar) {
                result +=
                    scalar.value < 0x100
                    ? "\\x" + hex(scalar.value, width: 2) : "\\u{" + hex(scalar.value, width: 4) + "}"
            } else {
                result.unicodeScalars.append(scalar)
            }
        }
        return result
    }

    /// `U+001B` for ESC.
    public static func codePoint(_ scalar: Unicode.Scalar) -> String { "U+" + hex(scalar.value, width: 4) }

    private static func hex(_ value: UInt32, width: Int) -> String {
        let digits = String(value, radix: 16, uppercase: true)
        return String(repeating: "0", count: max(0, width - digits.count)) + digits
    }
}
