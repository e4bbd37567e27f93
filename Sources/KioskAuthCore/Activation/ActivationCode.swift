/// One-time activation codes (used by a later issue): `XXXX-XXXX`, Crockford base32, 40 bits.
///
/// The alphabet is Crockford's `0123456789ABCDEFGHJKMNPQRSTVWXYZ`: no I, L, O or U, so a code
/// read aloud or copied by hand survives. Store only an HMAC of ``normalized``, never the code.
public struct ActivationCode: Sendable, Equatable, CustomStringConvertible {
    /// Crockford's base32 alphabet, in value order.
    public static let alphabet: [Character] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    /// Characters in a code, hyphen excluded.
    public static let length = 8
    /// The most characters ``init(parsing:)`` looks at; longer input is refused unread.
    public static let maximumTypedLength = 64

    /// 8 uppercase Crockford characters, no hyphen.
    public let normalized: String

    /// `ABCD-EFGH`, as shown to an admin.
    public var description: String {
        "\(normalized.prefix(4))-\(normalized.dropFirst(4))"
    }

    /// Parses what a person typed: case-insensitive, hyphens and spaces optional wherever they
    /// stand, Crockford's aliases accepted (O for 0, I and L for 1), U refused.
    ///
    /// - Throws: ``InvalidInputError`` for field `activationCode` when the input has a character
    ///   outside the alphabet (after aliases), or not exactly ``length`` characters.
    public init(parsing typed: String) throws(InvalidInputError) {
        func refuse(_ message: String) -> InvalidInputError {
            InvalidInputError(field: "activationCode", message: message)
        }
        guard typed.utf8.count <= Self.maximumTypedLength else {
            throw refuse("An activation code has 8 characters, like ABCD-EFGH.")
        }
        var characters: [UInt8] = []
        for byte in typed.utf8 {
            switch byte {
            case UInt8(ascii: "-"), UInt8(ascii: " "), UInt8(ascii: "\t"):
                continue
            case UInt8(ascii: "a")...UInt8(ascii: "z"):
                characters.append(Self.canonical(byte - 0x20))
            default:
                characters.append(Self.canonical(byte))
            }
        }
        guard characters.allSatisfy({ Self.value(of: $0) != nil }) else {
            throw refuse(
                "An activation code uses only the letters and digits 0-9 and A-Z without U.")
        }
        guard characters.count == Self.length else {
            throw refuse("An activation code has 8 characters, like ABCD-EFGH.")
        }
        normalized = String(decoding: characters, as: UTF8.self)
    }

    /// From 5 random bytes (the caller supplies randomness).
    ///
    /// The 40 bits are read big-endian, five bits per character.
    /// - Precondition: `randomBytes.count == 5`.
    public init(randomBytes: [UInt8]) {
        precondition(randomBytes.count == 5, "an activation code takes exactly 5 random bytes")
        let bits = randomBytes.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        normalized = String(
            (0..<Self.length).reversed().map { index in
                Self.alphabet[Int((bits >> (5 * UInt64(index))) & 0x1F)]
            })
    }

    /// A fresh code from `generator`, which must be cryptographically secure
    /// (`SystemRandomNumberGenerator` is).
    public static func random(using generator: inout some RandomNumberGenerator) -> ActivationCode {
        ActivationCode(
            randomBytes: (0..<5).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    /// Maps Crockford's aliases to the character they stand for: O to 0, I and L to 1.
    private static func canonical(_ upper: UInt8) -> UInt8 {
        switch upper {
        case UInt8(ascii: "O"): UInt8(ascii: "0")
        case UInt8(ascii: "I"), UInt8(ascii: "L"): UInt8(ascii: "1")
        default: upper
        }
    }

    /// The value of an uppercase alphabet character, or `nil` outside the alphabet.
    private static func value(of byte: UInt8) -> Int? {
        alphabet.firstIndex(of: Character(Unicode.Scalar(byte)))
    }
}
