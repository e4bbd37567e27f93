import FoundationEssentials
import KioskAuthProtocol

/// A compact JWS (`header.payload.signature`) split and decoded, not yet trusted.
struct JSONWebToken: Sendable {
    /// Tokens longer than this are refused before any parsing.
    static let maximumLength = 16 * 1024

    let header: [String: JSONValue]
    let claims: [String: JSONValue]
    /// `base64url(header) "." base64url(payload)`, the bytes the signature covers.
    let signingInput: Data
    let signature: Data

    var algorithm: String? { header["alg"]?.stringValue }
    var keyID: String? { header["kid"]?.stringValue }
    var type: String? { header["typ"]?.stringValue }

    init(parsing token: String) throws {
        guard token.utf8.count <= Self.maximumLength else {
            throw IdentityError(.invalidToken, "the token is longer than \(Self.maximumLength) bytes")
        }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            throw IdentityError(.invalidToken, "the token is not a compact JWS (\(parts.count) parts)")
        }
        guard let headerBytes = Base64URL.decode(parts[0]), let header = JSONValue.parseObject(headerBytes) else {
            throw IdentityError(.invalidToken, "the token header is not base64url-encoded JSON")
        }
        guard let payloadBytes = Base64URL.decode(parts[1]), let claims = JSONValue.parseObject(payloadBytes) else {
            throw IdentityError(.invalidToken, "the token payload is not base64url-encoded JSON")
        }
        guard let signature = Base64URL.decode(parts[2]) else {
            throw IdentityError(.invalidToken, "the token signature is not base64url")
        }
        self.header = header
        self.claims = claims
        self.signingInput = Data("\(parts[0]).\(parts[1])".utf8)
        self.signature = signature
    }

    /// Reads the claims of a token without checking it, to learn an opaque-looking access
    /// token's `exp`. Never use the result for a decision that needs trust.
    static func unverifiedClaims(of token: String) -> [String: JSONValue]? {
        try? JSONWebToken(parsing: token).claims
    }
}

/// Base64url without padding (RFC 7515 §2).
enum Base64URL {
    static func decode(_ text: some StringProtocol) -> Data? {
        var base64 = ""
        base64.reserveCapacity(text.utf8.count + 3)
        for scalar in text.unicodeScalars {
            switch scalar {
            case "A"..."Z", "a"..."z", "0"..."9": base64.unicodeScalars.append(scalar)
            case "-": base64 += "+"
            case "_": base64 += "/"
            default: return nil
            }
        }
        if base64.utf8.count % 4 == 1 { return nil }
        base64 += String(repeating: "=", count: (4 - base64.utf8.count % 4) % 4)
        return Data(base64Encoded: base64)
    }

    static func encode(_ data: some DataProtocol) -> String {
        String(
            Data(data).base64EncodedString().compactMap { character -> Character? in
                switch character {
                case "+": "-"
                case "/": "_"
                case "=": nil
                default: character
                }
            })
    }
}
