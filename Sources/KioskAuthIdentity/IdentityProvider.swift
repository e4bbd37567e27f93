public import FoundationEssentials

/// The identity provider as the daemon sees it.
///
/// ``IdentityProviderClient`` implements it against a real OAuth 2.0 / OIDC or Supabase
/// server; the daemon's own unit tests may substitute a double where the provider is not what
/// they test. Every method throws ``IdentityError`` and never waits longer than the configured
/// request timeout per request.
public protocol IdentityProvider: Sendable {
    /// First login with email and password (the OAuth password grant). Refuses people the
    /// configuration does not admit and roles it does not know.
    func passwordLogin(email: String, password: String) async throws -> LoginResult

    /// Starts an RFC 8628 device authorization: the terminal shows the code and URL, the
    /// person completes the login on a phone.
    func startDeviceAuthorization() async throws -> DeviceAuthorization

    /// Asks once whether the person has completed the device authorization. Call it no more
    /// often than the authorization's ``DeviceAuthorization/interval``.
    func pollDeviceAuthorization(_ authorization: DeviceAuthorization) async throws -> DeviceAuthorizationStatus

    /// Exchanges a refresh token for fresh tokens. The answer may carry a new (rotated) refresh
    /// token, which replaces the old one.
    func refresh(refreshToken: OAuthToken) async throws -> RefreshResult

    /// Revokes a refresh token (and, at most providers, the tokens issued from it). Revoking a
    /// token the provider no longer knows succeeds.
    func revoke(refreshToken: OAuthToken) async throws

    /// Asks, cheaply and without side effects, whether the provider answers: for OIDC a fresh
    /// GET of the discovery document (of the JWKS when the endpoints are configured explicitly),
    /// for Supabase GoTrue's `GET /auth/v1/health`. Nothing is read from or written to a cache,
    /// no token is sent, and nothing at the provider changes.
    ///
    /// Only the expected success proves the provider reachable.
    ///
    /// - Parameter timeout: the deadline for the whole exchange.
    /// - Throws: ``IdentityError``: a transient code (``IdentityError/isTransient``: refused,
    ///   timed out, connection lost, 5xx/429) when the provider cannot be reached or is failing;
    ///   ``IdentityError/Code-swift.struct/invalidResponse`` when something answered, but not
    ///   with the expected success (proof neither way: a captive portal, a wrong path, a
    ///   rejected API key).
    func probe(timeout: Duration) async throws
}

/// Who the provider says the person is, after the token carrying it was validated.
public struct IdentityClaims: Sendable, Equatable {
    /// The `iss` of the token the claims came from.
    public var issuer: String
    /// The provider's stable identifier for the person (`sub`).
    public var subject: String
    /// The email address, if the provider sent one.
    public var email: String?
    /// Whether the provider says it verified the email; `nil` if it does not say.
    public var isEmailVerified: Bool?
    /// The role claim's values, in the provider's order (the first is the primary role).
    public var roles: [String]
    /// The groups claim's values.
    public var groups: [String]
    /// Where ``roles`` came from: `claim`, `group GROUP` (`RoleFromGroup=`) or `default`
    /// (`DefaultRole=`); empty while no role is known.
    public var roleSource: String
    /// Where ``email`` came from: `id_token`, `userinfo`, `access_token`, or `login-name` when no
    /// token or userinfo carried one and the name typed for the password grant (which the
    /// provider has just authenticated) stands in.
    public var emailSource: String?

    /// Creates claims (the client creates them from validated tokens; tests may build them).
    public init(
        issuer: String, subject: String, email: String?, isEmailVerified: Bool?, roles: [String], groups: [String],
        roleSource: String = "claim", emailSource: String? = nil
    ) {
        self.issuer = issuer
        self.subject = subject
        self.email = email
        self.isEmailVerified = isEmailVerified
        self.roles = roles
        self.groups = groups
        self.roleSource = roles.isEmpty ? "" : roleSource
        self.emailSource = email == nil ? nil : emailSource
    }
}

/// The tokens of one successful grant.
public struct TokenSet: Sendable {
    /// The access token, for calls to the organisation's APIs.
    public var accessToken: OAuthToken
    /// When the access token expires (from `expires_in`, else the token's own `exp`, else
    /// five minutes after receipt).
    public var accessTokenExpiresAt: Date
    /// The refresh token, if the provider issued one.
    public var refreshToken: OAuthToken?
    /// The ID token, if the provider issued one.
    public var idToken: OAuthToken?

    /// Creates a token set.
    public init(accessToken: OAuthToken, accessTokenExpiresAt: Date, refreshToken: OAuthToken?, idToken: OAuthToken?) {
        self.accessToken = accessToken
        self.accessTokenExpiresAt = accessTokenExpiresAt
        self.refreshToken = refreshToken
        self.idToken = idToken
    }
}

/// A successful first login: the person is admitted and every role is known.
public struct LoginResult: Sendable {
    /// The tokens issued.
    public var tokens: TokenSet
    /// The validated identity.
    public var identity: IdentityClaims

    /// Creates a login result.
    public init(tokens: TokenSet, identity: IdentityClaims) {
        self.tokens = tokens
        self.identity = identity
    }
}

/// A successful refresh.
///
/// The provider has already rotated the refresh token when this arrives, so a policy problem
/// with the refreshed identity is reported here rather than thrown: throwing would lose the
/// only valid refresh token.
public struct RefreshResult: Sendable {
    /// The tokens issued. When ``TokenSet/refreshToken`` is `nil` the provider did not rotate
    /// it and the old refresh token stays valid.
    public var tokens: TokenSet
    /// The identity from the new ID token (or Supabase access token), when the provider sent
    /// one; validated like a login's.
    public var identity: IdentityClaims?
    /// Set when ``identity`` would no longer be admitted at login (group or domain removed,
    /// role unknown): ``IdentityError/Code-swift.struct/notAdmitted`` or
    /// ``IdentityError/Code-swift.struct/unknownRole``. The caller decides (typically: suspend
    /// and revoke).
    public var policyViolation: IdentityError?

    /// Creates a refresh result.
    public init(tokens: TokenSet, identity: IdentityClaims?, policyViolation: IdentityError?) {
        self.tokens = tokens
        self.identity = identity
        self.policyViolation = policyViolation
    }
}

/// A started RFC 8628 device authorization: what to show the person, and how to poll.
public struct DeviceAuthorization: Sendable {
    /// The code the person types at ``verificationURI``.
    public var userCode: String
    /// Where the person goes.
    public var verificationURI: URL
    /// A URL that already carries the code (for a QR code), if the provider sends one.
    public var verificationURIComplete: URL?
    /// The minimum time between polls (RFC 8628 default 5 s).
    public var interval: Duration
    /// How long the codes stay valid.
    public var expiresIn: Duration
    /// The secret the terminal polls with.
    public var deviceCode: OAuthToken

    /// The longest validity an answer is taken to give the codes (a day; RFC 8628's example is
    /// 30 minutes).
    static let longestValidity: Double = 86_400
    /// The longest interval between polls an answer is taken to ask for.
    static let longestInterval: Double = 600

    /// Creates a device authorization.
    public init(
        userCode: String, verificationURI: URL, verificationURIComplete: URL?, interval: Duration, expiresIn: Duration,
        deviceCode: OAuthToken
    ) {
        self.userCode = userCode
        self.verificationURI = verificationURI
        self.verificationURIComplete = verificationURIComplete
        self.interval = interval
        self.expiresIn = expiresIn
        self.deviceCode = deviceCode
    }
}

/// The answer to one device-authorization poll.
public enum DeviceAuthorizationStatus: Sendable {
    /// The person has not finished yet; poll again after the interval.
    case pending
    /// Polling too fast; poll again after `interval` (the old interval plus 5 s, RFC 8628 §3.5).
    case slowDown(interval: Duration)
    /// The person completed the login and is admitted.
    case authorized(LoginResult)
}

extension IdentityProvider {
    /// Polls until the device authorization completes, is denied or expires, sleeping the
    /// interval (raised on `slow_down`) between polls.
    ///
    /// - Throws: ``IdentityError`` with ``IdentityError/Code-swift.struct/deviceCodeExpired``
    ///   once `authorization.expiresIn` has passed on `clock`, or whatever a poll throws;
    ///   `CancellationError` if the task is cancelled.
    public func waitForDeviceAuthorization<C: Clock>(
        _ authorization: DeviceAuthorization, clock: C = ContinuousClock()
    ) async throws -> LoginResult where C.Duration == Duration {
        let deadline = clock.now.advanced(by: authorization.expiresIn)
        var interval = authorization.interval
        while true {
            try await clock.sleep(for: interval)
            guard clock.now < deadline else {
                throw IdentityError(.deviceCodeExpired, "the device authorization expired before it was completed")
            }
            switch try await pollDeviceAuthorization(authorization) {
            case .pending: continue
            case .slowDown(let newInterval): interval = newInterval
            case .authorized(let result): return result
            }
        }
    }
}
