public import FoundationEssentials

/// How to reach and trust one identity provider. The daemon builds it from its config file and
/// the secrets from systemd credentials.
public struct IdentityProviderConfiguration: Sendable {
    /// The protocol the provider speaks.
    public enum Dialect: String, Sendable, CaseIterable {
        /// OAuth 2.0 and OpenID Connect: form-encoded token requests, ID tokens, RFC 7009
        /// revocation, RFC 8628 device grant.
        case oidc
        /// Supabase Auth (GoTrue): JSON token requests with an `apikey` header, no ID token,
        /// `POST /auth/v1/logout` instead of revocation, no device grant.
        case supabase
    }

    /// Where the endpoints come from.
    public enum Endpoints: Sendable {
        /// OpenID Connect discovery at `{issuer}/.well-known/openid-configuration`. The
        /// document's `issuer` must equal this URL exactly.
        case discovery(issuer: URL)
        /// Endpoints given one by one, for providers without discovery.
        case explicit(ExplicitEndpoints)
        /// A Supabase project URL such as `https://abc.supabase.co`; the Auth API lives under
        /// `/auth/v1`.
        case supabaseProject(URL)
    }

    /// Endpoints for a provider without discovery.
    public struct ExplicitEndpoints: Sendable {
        /// The `iss` its tokens carry.
        public var issuer: String
        /// The token endpoint.
        public var token: URL
        /// Where its signing keys are published; without it ID tokens cannot be validated and
        /// logins fail with ``IdentityError/Code-swift.struct/invalidToken``.
        public var jwks: URL?
        /// The RFC 7009 revocation endpoint, if it has one.
        public var revocation: URL?
        /// The RFC 8628 device authorization endpoint, if it has one.
        public var deviceAuthorization: URL?

        /// Creates the endpoint list.
        public init(issuer: String, token: URL, jwks: URL?, revocation: URL? = nil, deviceAuthorization: URL? = nil) {
            self.issuer = issuer
            self.token = token
            self.jwks = jwks
            self.revocation = revocation
            self.deviceAuthorization = deviceAuthorization
        }
    }

    /// How the client proves its identity at the token endpoint.
    public enum ClientAuthentication: String, Sendable {
        /// HTTP Basic with the form-encoded id and secret (RFC 6749 §2.3.1; the default).
        case clientSecretBasic
        /// `client_id` and `client_secret` in the request body.
        case clientSecretPost
    }

    /// How Supabase access tokens are checked.
    public enum SupabaseTokenVerification: Sendable {
        /// The project's legacy shared HS256 JWT secret: tokens are validated locally.
        case sharedSecret(CredentialSecret)
        /// The project's asymmetric signing keys, published at
        /// `{project}/auth/v1/.well-known/jwks.json`.
        case jwks
        /// No key: the identity comes from the `user` object in the token response, which the
        /// client received directly from the provider over TLS. Tokens are then validated
        /// online only (by the provider, on each refresh) — nothing is checked locally.
        case onlineOnly
    }

    /// Settings only the Supabase dialect uses.
    public struct Supabase: Sendable {
        /// The project's API key (anon or publishable key), sent as the `apikey` header.
        public var apiKey: CredentialSecret
        /// How access tokens are checked.
        public var tokenVerification: SupabaseTokenVerification
        /// The `aud` Supabase puts in user tokens.
        public var audience: String

        /// Creates Supabase settings.
        public init(
            apiKey: CredentialSecret, tokenVerification: SupabaseTokenVerification, audience: String = "authenticated"
        ) {
            self.apiKey = apiKey
            self.tokenVerification = tokenVerification
            self.audience = audience
        }
    }

    /// The protocol dialect.
    public var dialect: Dialect
    /// Where the endpoints come from.
    public var endpoints: Endpoints
    /// The OAuth client id (also the expected `aud` of ID tokens).
    public var clientID: String
    /// The OAuth client secret; `nil` for a public client.
    public var clientSecret: CredentialSecret?
    /// How the client authenticates at the token endpoint.
    public var clientAuthentication: ClientAuthentication
    /// Scopes requested at login and device authorization.
    public var scopes: [String]
    /// The claim holding the person's role(s): a string or an array of strings. A dotted path
    /// (`app_metadata.kioskauth_role`) reaches into nested objects.
    public var roleClaim: String
    /// The claim holding the person's groups (string or array of strings; dotted paths work).
    public var groupsClaim: String
    /// Roles this terminal knows. A login whose role claim is missing or holds anything else is
    /// refused with ``IdentityError/Code-swift.struct/unknownRole``.
    public var acceptedRoles: Set<String>
    /// Who may log in at all.
    public var admission: AdmissionPolicy
    /// Roles for people whose token carries no role claim, from their groups: the first
    /// mapping whose group the person is in gives the role. Empty: no mapping.
    public var roleFromGroup: [GroupRoleMapping] = []
    /// The role of people whose token carries neither a role claim nor a mapped group; `nil`
    /// refuses them (``IdentityError/Code-swift.struct/unknownRole``).
    public var defaultRole: String?
    /// Overrides (or supplies, where discovery lacks it) the RFC 7009 revocation endpoint.
    public var revocationEndpoint: URL?
    /// Overrides (or supplies) the RFC 8628 device authorization endpoint.
    public var deviceAuthorizationEndpoint: URL?
    /// The longest any single request may take, connection included. A request that has not
    /// completed by then fails with ``IdentityError/Code-swift.struct/timedOut``.
    public var requestTimeout: Duration
    /// Clock difference tolerated when checking `exp`, `nbf` and `iat`.
    public var clockSkew: Duration
    /// The shortest time between two JWKS downloads triggered by an unknown key id.
    public var minimumKeyRefetchInterval: Duration
    /// Supabase settings; required for the Supabase dialect.
    public var supabase: Supabase?

    /// Roles the product defines (docs/design.md): `caregiver`, `coordinator`, `family`.
    public static let productRoles: Set<String> = ["caregiver", "coordinator", "family"]

    /// Creates a configuration with the product's defaults: scopes `openid email profile`,
    /// role claim `kioskauth_role`, groups claim `groups`, 10 s request timeout, 60 s clock
    /// skew, JWKS refetched at most once a minute.
    public init(
        dialect: Dialect = .oidc,
        endpoints: Endpoints,
        clientID: String,
        clientSecret: CredentialSecret?,
        clientAuthentication: ClientAuthentication = .clientSecretBasic,
        scopes: [String] = ["openid", "email", "profile"],
        roleClaim: String = "kioskauth_role",
        groupsClaim: String = "groups",
        acceptedRoles: Set<String> = IdentityProviderConfiguration.productRoles,
        admission: AdmissionPolicy,
        revocationEndpoint: URL? = nil,
        deviceAuthorizationEndpoint: URL? = nil,
        requestTimeout: Duration = .seconds(10),
        clockSkew: Duration = .seconds(60),
        minimumKeyRefetchInterval: Duration = .seconds(60),
        supabase: Supabase? = nil
    ) {
        self.dialect = dialect
        self.endpoints = endpoints
        self.clientID = clientID
        self.clientSecret = clientSecret
        self.clientAuthentication = clientAuthentication
        self.scopes = scopes
        self.roleClaim = roleClaim
        self.groupsClaim = groupsClaim
        self.acceptedRoles = acceptedRoles
        self.admission = admission
        self.revocationEndpoint = revocationEndpoint
        self.deviceAuthorizationEndpoint = deviceAuthorizationEndpoint
        self.requestTimeout = requestTimeout
        self.clockSkew = clockSkew
        self.minimumKeyRefetchInterval = minimumKeyRefetchInterval
        self.supabase = supabase
    }
}

/// One `RoleFromGroup=GROUP:ROLE` rule.
public struct GroupRoleMapping: Sendable, Equatable {
    /// The group (a value of the groups claim).
    public var group: String
    /// The role its members get.
    public var role: String

    /// Creates a mapping.
    public init(group: String, role: String) {
        self.group = group
        self.role = role
    }
}

/// Which authenticated people this terminal admits. The identity provider proves who someone
/// is; this decides whether they belong here.
public struct AdmissionPolicy: Sendable, Equatable {
    /// Email domains admitted (lower-cased, exact match of the part after `@`; subdomains are
    /// not implied). Empty: no domain condition.
    public let allowedEmailDomains: Set<String>
    /// A group the person must be in. `nil`: no group condition.
    public let requiredGroup: String?

    private init(allowedEmailDomains: Set<String>, requiredGroup: String?) {
        self.allowedEmailDomains = Set(allowedEmailDomains.map { $0.lowercased() })
        self.requiredGroup = requiredGroup
    }

    /// Admits people whose verified email is in one of `domains`.
    public static func emailDomains(_ domains: Set<String>) -> AdmissionPolicy {
        AdmissionPolicy(allowedEmailDomains: domains, requiredGroup: nil)
    }

    /// Admits people whose groups claim contains `group`.
    public static func group(_ group: String) -> AdmissionPolicy {
        AdmissionPolicy(allowedEmailDomains: [], requiredGroup: group)
    }

    /// Admits people who satisfy both conditions.
    public static func emailDomains(_ domains: Set<String>, andGroup group: String) -> AdmissionPolicy {
        AdmissionPolicy(allowedEmailDomains: domains, requiredGroup: group)
    }

    /// Admits everyone the provider authenticates (and whose role is known). Only for a provider
    /// that holds nobody but this organisation's staff.
    public static let everyoneTheProviderAuthenticates = AdmissionPolicy(allowedEmailDomains: [], requiredGroup: nil)
}
