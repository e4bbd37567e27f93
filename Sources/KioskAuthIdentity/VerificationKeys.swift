import Crypto
import FoundationEssentials
import KioskAuthProtocol
import _CryptoExtras

/// Signature algorithms the validator accepts. `none` and everything else is refused.
enum SignatureAlgorithm: String, Sendable {
    case rs256 = "RS256"
    case es256 = "ES256"
    case hs256 = "HS256"
}

/// One key that can check a signature.
enum VerificationKey: Sendable {
    case rsa(_RSA.Signing.PublicKey)
    case p256(P256.Signing.PublicKey)
    case hmac(SymmetricKey)

    func canVerify(_ algorithm: SignatureAlgorithm) -> Bool {
        switch (self, algorithm) {
        case (.rsa, .rs256), (.p256, .es256), (.hmac, .hs256): true
        default: false
        }
    }

    func isValidSignature(_ signature: Data, over input: Data, algorithm: SignatureAlgorithm) -> Bool {
        switch (self, algorithm) {
        case (.rsa(let key), .rs256):
            return key.isValidSignature(
                _RSA.Signing.RSASignature(rawRepresentation: signature), for: input, padding: .insecurePKCS1v1_5)
        case (.p256(let key), .es256):
            // JWS carries ECDSA signatures as r || s, 32 bytes each (RFC 7518 §3.4).
            guard signature.count == 64, let parsed = try? P256.Signing.ECDSASignature(rawRepresentation: signature)
            else { return false }
            return key.isValidSignature(parsed, for: input)
        case (.hmac(let key), .hs256):
            return HMAC<SHA256>.isValidAuthenticationCode(signature, authenticating: input, using: key)
        default:
            return false
        }
    }
}

/// A parsed JWKS: the provider's public signing keys.
struct VerificationKeySet: Sendable {
    /// JWKS documents larger than this are refused.
    static let maximumDocumentSize = 256 * 1024
    /// At most this many keys are kept from one document.
    static let maximumKeys = 32

    struct Entry: Sendable {
        let keyID: String?
        /// The `alg` the JWK pins, if any.
        let algorithm: String?
        let key: VerificationKey
    }

    let entries: [Entry]

    init(entries: [Entry]) {
        self.entries = entries
    }

    /// Parses a JWKS (RFC 7517 §5). Keys of unknown types, encryption keys and RSA keys shorter
    /// than 2048 bits are skipped, not fatal: providers publish keys for other purposes too.
    init(jwks data: Data) throws {
        guard data.count <= Self.maximumDocumentSize else {
            throw IdentityError(.invalidResponse, "the JWKS document is larger than \(Self.maximumDocumentSize) bytes")
        }
        guard let document = JSONValue.parseObject(data), case .array(let keys)? = document["keys"] else {
            throw IdentityError(.invalidResponse, "the JWKS document has no \"keys\" array")
        }
        var entries: [Entry] = []
        for case .object(let jwk) in keys.prefix(Self.maximumKeys) {
            if let use = jwk["use"]?.stringValue, use != "sig" { continue }
            guard let key = Self.key(from: jwk) else { continue }
            entries.append(Entry(keyID: jwk["kid"]?.stringValue, algorithm: jwk["alg"]?.stringValue, key: key))
        }
        self.entries = entries
    }

    private static func key(from jwk: [String: JSONValue]) -> VerificationKey? {
        switch jwk["kty"]?.stringValue {
        case "RSA":
            guard let n = jwk["n"]?.stringValue.flatMap(Base64URL.decode),
                let e = jwk["e"]?.stringValue.flatMap(Base64URL.decode),
                let key = try? _RSA.Signing.PublicKey(n: n, e: e)
            else { return nil }
            return .rsa(key)
        case "EC":
            guard jwk["crv"]?.stringValue == "P-256",
                let x = jwk["x"]?.stringValue.flatMap(Base64URL.decode), x.count == 32,
                let y = jwk["y"]?.stringValue.flatMap(Base64URL.decode), y.count == 32,
                let key = try? P256.Signing.PublicKey(rawRepresentation: x + y)
            else { return nil }
            return .p256(key)
        default:
            return nil
        }
    }

    /// The keys that may have signed a token with this `kid` and algorithm. Without a `kid`,
    /// every key of the right type is a candidate.
    func candidates(keyID: String?, algorithm: SignatureAlgorithm) -> [VerificationKey] {
        entries.filter { entry in
            guard entry.key.canVerify(algorithm) else { return false }
            if let pinned = entry.algorithm, pinned != algorithm.rawValue { return false }
            if let keyID { return entry.keyID == keyID }
            return true
        }.map(\.key)
    }

    func containsKey(withID keyID: String) -> Bool {
        entries.contains { $0.keyID == keyID }
    }
}
