/// A validated login name: 1–64 characters of lowercase ASCII letters, digits and `._-@+`,
/// starting with a letter or a digit.
///
/// Uppercase ASCII letters are accepted and lowercased, so `Sarah.K` and `sarah.k` name the same
/// person; anything else outside the allowed set (spaces, non-ASCII letters) is refused rather
/// than folded, so two different-looking names can never collide.
public struct LoginName: Hashable, Comparable, Codable, Sendable, CustomStringConvertible {
    /// The longest login name accepted, in characters.
    public static let maximumLength = 64

    /// The normalised (lowercase) name.
    public let rawValue: String

    /// Validates `raw`, lowercasing ASCII letters.
    ///
    /// - Throws: ``InvalidInputError`` for field `login` when `raw` is empty, longer than
    ///   ``maximumLength``, contains a character outside `a–z 0–9 . _ - @ +`, or starts with
    ///   punctuation.
    public init(_ raw: String) throws(InvalidInputError) {
        func refuse(_ message: String) -> InvalidInputError {
            InvalidInputError(field: "login", message: message)
        }
        if raw.isEmpty {
            throw refuse("A login name must not be empty.")
        }
        // Measured in UTF-8 bytes: equal to characters for the allowed ASCII set, and any longer
        // non-ASCII input is refused below anyway.
        if raw.utf8.count > Self.maximumLength {
            throw refuse("A login name must be at most \(Self.maximumLength) characters long.")
        }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(raw.utf8.count)
        for byte in raw.utf8 {
            let lowered =
                (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte + 0x20 : byte
            guard Self.isAllowed(lowered) else {
                throw refuse(
                    "A login name may contain only letters a–z, digits and . _ - @ +."
                )
            }
            bytes.append(lowered)
        }
        guard Self.isAlphanumeric(bytes[0]) else {
            throw refuse("A login name must start with a letter or a digit.")
        }
        rawValue = String(decoding: bytes, as: UTF8.self)
    }

    /// The name itself.
    public var description: String { rawValue }

    /// Orders names by their normalised spelling.
    public static func < (lhs: LoginName, rhs: LoginName) -> Bool { lhs.rawValue < rhs.rawValue }

    /// Decodes a single string and validates it like ``init(_:)``.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let raw = try container.decode(String.self)
        do {
            try self.init(raw)
        } catch {
            throw DecodingError.dataCorruptedError(
                in: container, debugDescription: error.description)
        }
    }

    /// Encodes the name as a single string.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }

    private static func isAlphanumeric(_ byte: UInt8) -> Bool {
        (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
            || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte)
    }

    private static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-"), UInt8(ascii: "@"),
            UInt8(ascii: "+"):
            return true
        default:
            return isAlphanumeric(byte)
        }
    }
}
