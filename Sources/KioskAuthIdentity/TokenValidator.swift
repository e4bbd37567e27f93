public import FoundationEssentials
import KioskAuthProtocol

/// What a token must say to be accepted.
public struct TokenExpectations: Sendable {
    /// The exact `iss`.
    public var issuer: String
    /// A value `aud` must be or contain.
    public var audience: String
    /// Header `typ` values accepted when the header has one, compared case-insensitively and
    /// without an `application/` prefix (RFC 7515 §4.1.9). A token without `typ` passes.
    public var acceptedTypes: Set<String>
    /// Clock difference tolerated for `exp`, `nbf` and `iat`.
    public var clockSkew: Duration

    /// Creates expectations.
    public init(issuer: String, audience: String, acceptedTypes: Set<String>, clockSkew: Duration) {
        self.issuer = issuer
        self.audience = audience
        self.acceptedTypes = Set(acceptedTypes.map(TokenExpectations.normalizedType))
        self.clockSkew = clockSkew
    }

    /// An OpenID Connect ID token for client `clientID` (`typ` `JWT` where present).
    public static func idToken(issuer: String, clientID: String, clockSkew: Duration) -> TokenExpectations {
        TokenExpectations(issuer: issuer, audience: clientID, acceptedTypes: ["JWT"], clockSkew: clockSkew)
    }

    /// An access token (`typ` `at+jwt` per RFC 9068, or plain `JWT` as Supabase and many
    /// providers issue).
    public static func accessToken(issuer: String, audience: String, clockSkew: Duration) -> TokenExpectations {
        TokenExpectations(issuer: issuer, audience: audience, acceptedTypes: ["at+jwt", "JWT"], clockSkew: clockSkew)
    }

    static func normalizedType(_ type: String) -> String {
        let lower = type.lowercased()
        return lower.hasPrefix("application/") ? String(lower.dropFirst("application/".count)) : lower
    }
}

/// A token whose signature, issuer, audience, lifetime and type were checked.
public struct ValidatedToken: Sendable {
    let header: [String: JSONValue]
    let claims: [String: JSONValue]

    /// `iss`.
    public var issuer: String { claims["iss"]?.stringValue ?? "" }
    /// `sub`, if present.
    public var subject: String? { claims["sub"]?.stringValue }
    /// `exp`.
    public var expiresAt: Date? { claims["exp"]?.doubleValue.map(Date.init(timeIntervalSince1970:)) }
    /// The header's `alg`.
    public var algorithm: String { header["alg"]?.stringValue ?? "" }

    /// A string claim (dotted paths reach into objects).
    public func string(_ claim: String) -> String? {
        claims.value(atPath: claim)?.stringValue
    }

    /// A claim that is a string or an array of strings, as a list.
    public func strings(_ claim: String) -> [String]? {
        claims.value(atPath: claim)?.stringList
    }

    /// A boolean claim.
    public func bool(_ claim: String) -> Bool? {
        claims.value(atPath: claim)?.boolValue
    }
}

/// Validates JWTs: RS256 and ES256 against the provider's JWKS, or HS256 against a shared
/// secret (Supabase's legacy JWT secret). `alg: none` and any other algorithm are refused, and
/// a key is only ever used with its own algorithm, so a token cannot pick a weaker one.
///
/// The JWKS is downloaded on first use and cached; a token whose `kid` is not in the cache
/// triggers one refetch (key rotation), at most once per minimum interval, so a stream of
/// forged `kid`s cannot make the daemon hammer the provider.
public actor TokenValidator {
    /// Where the keys come from.
    public enum KeySource: Sendable {
        /// A JWKS document, obtained by calling `fetch` (the client passes an HTTP GET of the
        /// provider's `jwks_uri`).
        case jwks(fetch: @Sendable () async throws -> Data)
        /// One shared HS256 secret.
        case sharedSecret(CredentialSecret)
    }

    private let source: KeySource
    private let minimumRefetchInterval: TimeInterval
    private var cached: VerificationKeySet?
    private var lastFetch: Date?
    private var inflight: Task<VerificationKeySet, any Error>?

    /// Creates a validator; nothing is fetched until the first token.
    public init(keySource: KeySource, minimumRefetchInterval: Duration = .seconds(60)) {
        self.source = keySource
        self.minimumRefetchInterval = minimumRefetchInterval.timeInterval
    }

    /// Checks `token` against `expectations` at time `now`.
    ///
    /// - Throws: ``IdentityError`` with ``IdentityError/Code-swift.struct/invalidToken`` for a
    ///   token that fails any check; the fetch's error (for example
    ///   ``IdentityError/Code-swift.struct/unreachable``) if the keys cannot be obtained.
    public func validate(
        _ token: OAuthToken, expecting expectations: TokenExpectations, now: Date
    ) async throws
        -> ValidatedToken
    {
        let jwt = try JSONWebToken(parsing: token.rawValue)
        guard let name = jwt.algorithm, let algorithm = SignatureAlgorithm(rawValue: name) else {
            throw IdentityError(.invalidToken, "unsupported signature algorithm \(jwt.algorithm ?? "(none)")")
        }
        guard jwt.header["crit"] == nil else {
            throw IdentityError(
                .invalidToken, "the token has critical header extensions this client does not implement")
        }
        if let type = jwt.type, !expectations.acceptedTypes.contains(TokenExpectations.normalizedType(type)) {
            throw IdentityError(.invalidToken, "unexpected token type \(type)")
        }

        let candidates = try await keys(for: jwt.keyID, algorithm: algorithm, now: now)
        guard !candidates.isEmpty else {
            throw IdentityError(.invalidToken, "no \(algorithm.rawValue) key with id \(jwt.keyID ?? "(none)")")
        }
        guard
            candidates.contains(where: {
                $0.isValidSignature(jwt.signature, over: jwt.signingInput, algorithm: algorithm)
            })
        else {
            throw IdentityError(.invalidToken, "the token signature is not valid")
        }

        try Self.checkClaims(jwt.claims, expectations: expectations, now: now)
        return ValidatedToken(header: jwt.header, claims: jwt.claims)
    }

    static func checkClaims(_ claims: [String: JSONValue], expectations: TokenExpectations, now: Date) throws {
        let skew = expectations.clockSkew.timeInterval
        let nowSeconds = now.timeIntervalSince1970
        guard claims["iss"]?.stringValue == expectations.issuer else {
            throw IdentityError(
                .invalidToken,
                "the token was issued by \(claims["iss"]?.stringValue ?? "(nobody)"), not \(expectations.issuer)")
        }
        guard let audiences = claims["aud"]?.stringList, audiences.contains(expectations.audience) else {
            throw IdentityError(.invalidToken, "the token is not meant for \(expectations.audience)")
        }
        // OIDC Core 3.1.3.7: with several audiences, the authorized party must be us.
        if audiences.count > 1, let azp = claims["azp"]?.stringValue, azp != expectations.audience {
            throw IdentityError(.invalidToken, "the token's authorized party is \(azp)")
        }
        guard let exp = claims["exp"]?.doubleValue else {
            throw IdentityError(.invalidToken, "the token has no exp")
        }
        guard nowSeconds < exp + skew else {
            throw IdentityError(.invalidToken, "the token expired at \(Date(timeIntervalSince1970: exp))")
        }
        if let nbf = claims["nbf"]?.doubleValue, nowSeconds + skew < nbf {
            throw IdentityError(.invalidToken, "the token is not valid before \(Date(timeIntervalSince1970: nbf))")
        }
        if let iat = claims["iat"]?.doubleValue, iat > nowSeconds + skew {
            throw IdentityError(
                .invalidToken, "the token was issued in the future (\(Date(timeIntervalSince1970: iat)))")
        }
    }

    private func keys(for keyID: String?, algorithm: SignatureAlgorithm, now: Date) async throws -> [VerificationKey] {
        switch source {
        case .sharedSecret(let secret):
            return algorithm == .hs256 ? [.hmac(secret.key)] : []
        case .jwks(let fetch):
            if cached == nil {
                cached = try await download(fetch, now: now)
            }
            var set = cached!
            var candidates = set.candidates(keyID: keyID, algorithm: algorithm)
            if candidates.isEmpty, let keyID, !set.containsKey(withID: keyID), mayRefetch(now: now) {
                set = try await download(fetch, now: now)
                cached = set
                candidates = set.candidates(keyID: keyID, algorithm: algorithm)
            }
            return candidates
        }
    }

    private func mayRefetch(now: Date) -> Bool {
        guard let lastFetch else { return true }
        let elapsed = now.timeIntervalSince(lastFetch)
        // A clock that went backwards says nothing about how long ago the fetch was.
        return elapsed < 0 || elapsed >= minimumRefetchInterval
    }

    private func download(
        _ fetch: @escaping @Sendable () async throws -> Data, now: Date
    ) async throws
        -> VerificationKeySet
    {
        if let inflight { return try await inflight.value }
        let task = Task { try VerificationKeySet(jwks: try await fetch()) }
        inflight = task
        defer { inflight = nil }
        lastFetch = now
        return try await task.value
    }
}

extension Duration {
    var timeInterval: TimeInterval {
        let parts = components
        return TimeInterval(parts.seconds) + TimeInterval(parts.attoseconds) / 1e18
    }
}
