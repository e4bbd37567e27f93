import FoundationEssentials
import KioskAuthProtocol

/// The endpoints of a configured provider, after discovery.
struct ResolvedEndpoints: Sendable, Equatable {
    var issuer: String
    var token: URL
    var jwks: URL?
    var revocation: URL?
    var deviceAuthorization: URL?
    /// Supabase only: `POST /auth/v1/logout`.
    var logout: URL?
    /// The OIDC userinfo endpoint, where discovery names one.
    var userinfo: URL? = nil
    /// Discovery's `scopes_supported`; `nil` or empty when it lists none.
    var scopesSupported: [String]? = nil
}

/// Which configured scopes to request: all of them, unless discovery lists the scopes it
/// supports; then only those (the rest are reported as dropped).
enum ScopeSelection {
    static func select(configured: [String], supported: [String]?) -> (requested: [String], dropped: [String]) {
        guard let supported, !supported.isEmpty else { return (configured, []) }
        let known = Set(supported)
        return (configured.filter { known.contains($0) }, configured.filter { !known.contains($0) })
    }
}

/// Request shapes of OAuth 2.0 / OpenID Connect (RFC 6749, RFC 7009, RFC 8628).
struct OIDCRequests: Sendable {
    static let deviceCodeGrantType = "urn:ietf:params:oauth:grant-type:device_code"

    let clientID: String
    let clientSecret: CredentialSecret?

    /// OpenID Connect Discovery 1.0 §4: `{issuer}/.well-known/openid-configuration`, with any
    /// trailing slash of the issuer dropped.
    static func discoveryURL(issuer: URL) -> URL? {
        var base = issuer.absoluteString
        while base.hasSuffix("/") { base.removeLast() }
        return URL(string: base + "/.well-known/openid-configuration")
    }
    let authentication: IdentityProviderConfiguration.ClientAuthentication
    let scopes: [String]

    func password(_ endpoints: ResolvedEndpoints, email: String, password: String) throws -> HTTPRequest {
        try authenticated(
            endpoints.token,
            [
                ("grant_type", "password"), ("username", email), ("password", password),
                ("scope", scopes.joined(separator: " ")),
            ])
    }

    func refresh(_ endpoints: ResolvedEndpoints, refreshToken: OAuthToken) throws -> HTTPRequest {
        try authenticated(endpoints.token, [("grant_type", "refresh_token"), ("refresh_token", refreshToken.rawValue)])
    }

    func revoke(_ url: URL, refreshToken: OAuthToken) throws -> HTTPRequest {
        try authenticated(url, [("token", refreshToken.rawValue), ("token_type_hint", "refresh_token")])
    }

    /// RFC 8628 §3.1. `client_id` goes in the body even when the client also authenticates:
    /// the RFC requires it for public clients, and some servers (django-oauth-toolkit among
    /// them) read it from the body unconditionally.
    func deviceAuthorization(_ url: URL) throws -> HTTPRequest {
        try authenticated(url, [("client_id", clientID), ("scope", scopes.joined(separator: " "))])
    }

    func devicePoll(_ endpoints: ResolvedEndpoints, deviceCode: OAuthToken) throws -> HTTPRequest {
        try authenticated(
            endpoints.token,
            [("grant_type", Self.deviceCodeGrantType), ("device_code", deviceCode.rawValue), ("client_id", clientID)])
    }

    /// Adds client authentication: HTTP Basic over the form-encoded id and secret
    /// (RFC 6749 §2.3.1), the two in the body, or — for a public client — the id alone.
    private func authenticated(_ url: URL, _ fields: [(String, String)]) throws -> HTTPRequest {
        var fields = fields
        var headers: [String: String] = [:]
        let hasClientID = fields.contains { $0.0 == "client_id" }
        if let clientSecret {
            switch authentication {
            case .clientSecretBasic:
                let pair = try clientSecret.withText { "\(FormEncoding.escape(clientID)):\(FormEncoding.escape($0))" }
                headers["Authorization"] = "Basic " + Data(pair.utf8).base64EncodedString()
            case .clientSecretPost:
                if !hasClientID { fields.append(("client_id", clientID)) }
                try clientSecret.withText { fields.append(("client_secret", $0)) }
            }
        } else if !hasClientID {
            fields.append(("client_id", clientID))
        }
        return .postForm(url, fields, headers: headers)
    }
}

/// Request shapes of Supabase Auth (GoTrue): `POST /auth/v1/token?grant_type=…` with a JSON
/// body and the project's `apikey` header, and `POST /auth/v1/logout` with the user's access
/// token.
struct SupabaseRequests: Sendable {
    let apiKey: CredentialSecret

    /// `{project}/auth/v1`, which is also the `iss` of the project's tokens.
    static func authBase(project: URL) -> URL {
        project.appendingPathComponent("auth").appendingPathComponent("v1")
    }

    static func endpoints(project: URL) -> ResolvedEndpoints {
        let base = authBase(project: project)
        return ResolvedEndpoints(
            issuer: base.absoluteString,
            token: base.appendingPathComponent("token"),
            jwks: base.appendingPathComponent(".well-known").appendingPathComponent("jwks.json"),
            revocation: nil,
            deviceAuthorization: nil,
            logout: base.appendingPathComponent("logout"))
    }

    func password(_ endpoints: ResolvedEndpoints, email: String, password: String) throws -> HTTPRequest {
        .postJSON(
            Self.adding(query: "grant_type=password", to: endpoints.token), ["email": email, "password": password],
            headers: try keyHeaders())
    }

    func refresh(_ endpoints: ResolvedEndpoints, refreshToken: OAuthToken) throws -> HTTPRequest {
        .postJSON(
            Self.adding(query: "grant_type=refresh_token", to: endpoints.token),
            ["refresh_token": refreshToken.rawValue],
            headers: try keyHeaders())
    }

    /// Ends the session the access token belongs to (`scope=local`: other devices of the same
    /// person stay signed in), which revokes that session's refresh tokens.
    func logout(_ endpoints: ResolvedEndpoints, accessToken: OAuthToken) throws -> HTTPRequest {
        var headers = try keyHeaders()
        headers["Authorization"] = "Bearer \(accessToken.rawValue)"
        return HTTPRequest(
            method: "POST", url: Self.adding(query: "scope=local", to: endpoints.logout!), headers: headers, body: nil)
    }

    /// GoTrue's health check, `GET {project}/auth/v1/health`: no user, no token, no side
    /// effect. The Supabase API gateway admits it only with the project's `apikey`; GoTrue
    /// answers 200 with `{"version": …, "name": "GoTrue", "description": …}`.
    func health(project: URL) throws -> HTTPRequest {
        var request = HTTPRequest.get(Self.authBase(project: project).appendingPathComponent("health"))
        request.headers.merge(try keyHeaders()) { _, key in key }
        return request
    }

    private func keyHeaders() throws -> [String: String] {
        ["apikey": try apiKey.withText { $0 }]
    }

    private static func adding(query: String, to url: URL) -> URL {
        var components = URLComponents(url: url, resolvingAgainstBaseURL: false)!
        components.percentEncodedQuery = query
        return components.url!
    }
}

/// What a reachability probe asks for, and the only answer that proves the provider reachable.
enum ReachabilityProbe: Sendable, Equatable {
    /// The discovery document of this issuer: 2xx, a JSON object naming the issuer.
    case discovery(issuer: URL)
    /// A JWKS: 2xx, a JSON object with a `keys` array.
    case jwks(URL)
    /// GoTrue's health check: 2xx, a JSON object.
    case supabaseHealth(project: URL)

    /// Checks the answer to the probe.
    ///
    /// - Throws: ``IdentityError``: `serverError` for 5xx and 429 (the provider is failing:
    ///   as good as unreachable), `invalidResponse` for any other answer than the expected one.
    func check(_ response: HTTPResponse) throws {
        let what: String
        switch self {
        case .discovery: what = "discovery document"
        case .jwks: what = "JWKS"
        case .supabaseHealth: what = "health check"
        }
        if response.status >= 500 || response.status == 429 {
            throw IdentityError(.serverError, "the \(what) answered HTTP \(response.status)")
        }
        guard (200..<300).contains(response.status) else {
            throw IdentityError(
                .invalidResponse, "the \(what) answered HTTP \(response.status), not the expected success")
        }
        guard let object = JSONValue.parseObject(response.body) else {
            throw IdentityError(.invalidResponse, "the \(what) answered HTTP \(response.status) without a JSON object")
        }
        switch self {
        case .discovery(let issuer):
            guard object["issuer"]?.stringValue == issuer.absoluteString else {
                throw IdentityError(.invalidResponse, "the discovery document is for another issuer")
            }
        case .jwks:
            guard case .array = object["keys"] else {
                throw IdentityError(.invalidResponse, "the JWKS has no keys array")
            }
        case .supabaseHealth:
            break
        }
    }
}
