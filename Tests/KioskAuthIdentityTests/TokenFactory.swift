import Crypto
import Foundation
import Logging
import Synchronization
import _CryptoExtras

@testable import KioskAuthIdentity

/// Keys generated once per test run, and JWTs signed with them.
enum TestKeys {
    static let rsa = try! _RSA.Signing.PrivateKey(keySize: .bits2048)
    static let rotatedRSA = try! _RSA.Signing.PrivateKey(keySize: .bits2048)
    static let p256 = P256.Signing.PrivateKey()
    static let weakRSA = try! _RSA.Signing.PrivateKey(unsafeKeySize: .init(bitCount: 1024))
    static let hmacSecret = "super-secret-jwt-token-with-at-least-32-characters-long"
}

enum Signer {
    case rsa(_RSA.Signing.PrivateKey)
    case p256(P256.Signing.PrivateKey)
    case hmac(String)
    case unsigned
}

enum TokenFactory {
    static let issuer = "https://idp.clinic.example"
    static let clientID = "kioskauth-terminal"
    static let now = Date(timeIntervalSince1970: 1_800_000_000)

    static func claims(_ overrides: [String: Any] = [:], removing: [String] = []) -> [String: Any] {
        var claims: [String: Any] = [
            "iss": issuer, "aud": clientID, "sub": "user-42", "email": "sarah@clinic.example",
            "iat": now.timeIntervalSince1970 - 10, "exp": now.timeIntervalSince1970 + 300,
            "kioskauth_role": "caregiver", "groups": ["nurses"],
        ]
        for (key, value) in overrides { claims[key] = value }
        for key in removing { claims.removeValue(forKey: key) }
        return claims
    }

    static func token(
        _ claims: [String: Any] = TokenFactory.claims(), signer: Signer = .rsa(TestKeys.rsa), kid: String? = "rsa-1",
        alg: String? = nil, typ: String? = "JWT", extraHeader: [String: Any] = [:]
    ) -> String {
        var header: [String: Any] = [:]
        switch signer {
        case .rsa: header["alg"] = "RS256"
        case .p256: header["alg"] = "ES256"
        case .hmac: header["alg"] = "HS256"
        case .unsigned: header["alg"] = "none"
        }
        if let alg { header["alg"] = alg }
        if let kid { header["kid"] = kid }
        if let typ { header["typ"] = typ }
        for (key, value) in extraHeader { header[key] = value }
        let input = "\(encode(header)).\(encode(claims))"
        let signature: Data
        switch signer {
        case .rsa(let key):
            signature = try! key.signature(for: Data(input.utf8), padding: .insecurePKCS1v1_5).rawRepresentation
        case .p256(let key):
            signature = try! key.signature(for: Data(input.utf8)).rawRepresentation
        case .hmac(let secret):
            signature = Data(
                HMAC<SHA256>.authenticationCode(for: Data(input.utf8), using: SymmetricKey(data: Data(secret.utf8))))
        case .unsigned:
            signature = Data()
        }
        return "\(input).\(Base64URL.encode(signature))"
    }

    static func encode(_ object: [String: Any]) -> String {
        Base64URL.encode(try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]))
    }

    static func jwk(rsa key: _RSA.Signing.PublicKey, kid: String?) -> [String: Any] {
        let primitives = try! key.getKeyPrimitives()
        var jwk: [String: Any] = [
            "kty": "RSA", "alg": "RS256", "use": "sig", "n": Base64URL.encode(primitives.modulus),
            "e": Base64URL.encode(primitives.publicExponent),
        ]
        if let kid { jwk["kid"] = kid }
        return jwk
    }

    static func jwk(p256 key: P256.Signing.PublicKey, kid: String) -> [String: Any] {
        let raw = key.rawRepresentation
        return [
            "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig", "x": Base64URL.encode(raw.prefix(32)),
            "y": Base64URL.encode(raw.suffix(32)),
        ]
    }

    static func jwks(_ keys: [[String: Any]]) -> Data {
        try! JSONSerialization.data(withJSONObject: ["keys": keys])
    }
}

/// A JWKS source for unit tests: serves a document that the test may replace, counting the
/// fetches.
final class JWKSSource: Sendable {
    private let state: Mutex<(document: Data, fetches: Int)>

    init(_ document: Data) {
        state = Mutex((document, 0))
    }

    var fetches: Int { state.withLock { $0.fetches } }

    func replace(with document: Data) {
        state.withLock { $0.document = document }
    }

    var keySource: TokenValidator.KeySource {
        .jwks(fetch: { [self] in
            self.state.withLock { state in
                state.fetches += 1
                return state.document
            }
        })
    }
}

/// Keeps every log line in memory so tests can check what the client logs (and what it must
/// never log).
final class CollectedLogs: Sendable {
    private let lines = Mutex<[String]>([])

    var all: [String] { lines.withLock { $0 } }

    func append(_ line: String) { lines.withLock { $0.append(line) } }

    func logger(level: Logger.Level = .trace) -> Logger {
        var logger = Logger(label: "kioskauth.identity.test") { _ in CollectingLogHandler(logs: self) }
        logger.logLevel = level
        return logger
    }
}

struct CollectingLogHandler: LogHandler {
    let logs: CollectedLogs
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = metadata.merging(event.metadata ?? [:]) { $1 }
        logs.append("\(event.level) \(event.message) \(merged.map { "\($0)=\($1)" }.sorted().joined(separator: " "))")
    }
}
