import Crypto
public import FoundationEssentials
import KioskAuthProtocol
public import Logging

/// The identity provider client: OAuth 2.0 / OpenID Connect or Supabase Auth over HTTPS.
///
/// Every request carries the configured timeout as a hard deadline, so a provider that hangs
/// costs at most that long per call; nothing here retries, because the refresh scheduler owns
/// backoff. Logs go to the injected logger at `debug` (requests, statuses) and never contain a
/// password, token or secret.
public actor IdentityProviderClient: IdentityProvider {
    /// Providers must use HTTPS, except on loopback (tests, a local proxy).
    static func isAcceptable(_ url: URL) -> Bool {
        switch url.scheme?.lowercased() {
        case "https": return true
        case "http": return ["127.0.0.1", "::1", "[::1]", "localhost"].contains(url.host?.lowercased() ?? "")
        default: return false
        }
    }

    private let configuration: IdentityProviderConfiguration
    private let logger: Logger
    private let now: @Sendable () -> Date
    private let transport = HTTPTransport()
    private var endpoints: ResolvedEndpoints?
    private var validator: TokenValidator?

    /// Creates a client; nothing is fetched until the first call.
    ///
    /// - Parameters:
    ///   - now: the wall clock, for token lifetimes (injected by tests).
    /// - Throws: ``IdentityError`` with ``IdentityError/Code-swift.struct/misconfigured`` for
    ///   an inconsistent configuration.
    public init(
        configuration: IdentityProviderConfiguration, logger: Logger, now: @escaping @Sendable () -> Date = { Date() }
    ) throws {
        try Self.check(configuration)
        self.configuration = configuration
        self.logger = logger
        self.now = now
    }

    private static func check(_ configuration: IdentityProviderConfiguration) throws {
        var urls: [URL] = [configuration.revocationEndpoint, configuration.deviceAuthorizationEndpoint].compactMap {
            $0
        }
        switch (configuration.dialect, configuration.endpoints) {
        case (.oidc, .discovery(let issuer)):
            urls.append(issuer)
        case (.oidc, .explicit(let explicit)):
            urls += [explicit.token, explicit.jwks, explicit.revocation, explicit.deviceAuthorization].compactMap { $0 }
        case (.supabase, .supabaseProject(let project)):
            guard configuration.supabase != nil else {
                throw IdentityError(.misconfigured, "the Supabase dialect needs the project's API key")
            }
            urls.append(project)
        default:
            throw IdentityError(
                .misconfigured, "the \(configuration.dialect.rawValue) dialect cannot use these endpoint settings")
        }
        for url in urls where !isAcceptable(url) {
            throw IdentityError(.misconfigured, "\(url.absoluteString) is neither HTTPS nor loopback")
        }
        if configuration.acceptedRoles.isEmpty {
            throw IdentityError(.misconfigured, "no role is accepted, so nobody could log in")
        }
        for role in [configuration.defaultRole].compactMap({ $0 }) + configuration.roleFromGroup.map(\.role)
        where !configuration.acceptedRoles.contains(role) {
            throw IdentityError(.misconfigured, "the role \(role) is not one this terminal knows")
        }
    }

    // MARK: - IdentityProvider

    /// First login with the password grant (Supabase: `grant_type=password`).
    public func passwordLogin(email: String, password: String) async throws -> LoginResult {
        let endpoints = try await resolvedEndpoints()
        let request: HTTPRequest
        switch configuration.dialect {
        case .oidc: request = try oidcRequests(endpoints).password(endpoints, email: email, password: password)
        case .supabase: request = try supabaseRequests.password(endpoints, email: email, password: password)
        }
        let response = try await tokenResponse(request, context: .password)
        return try await login(from: response, endpoints: endpoints, typedName: email)
    }

    /// Starts an RFC 8628 device authorization.
    public func startDeviceAuthorization() async throws -> DeviceAuthorization {
        guard configuration.dialect == .oidc else {
            throw IdentityError(.unsupported, "Supabase Auth has no device authorization grant")
        }
        let endpoints = try await resolvedEndpoints()
        guard let url = configuration.deviceAuthorizationEndpoint ?? endpoints.deviceAuthorization else {
            throw IdentityError(
                .unsupported, "the provider publishes no device_authorization_endpoint and none is configured")
        }
        let response = try await send(try oidcRequests(endpoints).deviceAuthorization(url), context: .deviceStart)
        guard (200..<300).contains(response.status) else {
            throw ProviderResponses.error(for: response, context: .deviceStart, dialect: .oidc)
        }
        return try ProviderResponses.deviceAuthorization(response)
    }

    /// Polls the token endpoint once for a device authorization.
    public func pollDeviceAuthorization(_ authorization: DeviceAuthorization) async throws -> DeviceAuthorizationStatus
    {
        guard configuration.dialect == .oidc else {
            throw IdentityError(.unsupported, "Supabase Auth has no device authorization grant")
        }
        let endpoints = try await resolvedEndpoints()
        let request = try oidcRequests(endpoints).devicePoll(endpoints, deviceCode: authorization.deviceCode)
        let response = try await send(request, context: .devicePoll)
        if !(200..<300).contains(response.status) {
            switch ProviderErrorBody(response.body).code {
            case "authorization_pending": return .pending
            case "slow_down": return .slowDown(interval: authorization.interval + .seconds(5))
            default: throw ProviderResponses.error(for: response, context: .devicePoll, dialect: .oidc)
            }
        }
        let tokens = try ProviderResponses.parseTokens(response, now: now())
        return .authorized(try await login(from: tokens, endpoints: endpoints, typedName: nil))
    }

    /// Exchanges a refresh token. Policy problems with the refreshed identity are reported in
    /// ``RefreshResult/policyViolation``, not thrown.
    public func refresh(refreshToken: OAuthToken) async throws -> RefreshResult {
        let endpoints = try await resolvedEndpoints()
        let request: HTTPRequest
        switch configuration.dialect {
        case .oidc: request = try oidcRequests(endpoints).refresh(endpoints, refreshToken: refreshToken)
        case .supabase: request = try supabaseRequests.refresh(endpoints, refreshToken: refreshToken)
        }
        let response = try await tokenResponse(request, context: .refresh)
        // The provider has rotated the refresh token already: an identity that cannot be read
        // now (userinfo unreachable) is no reason to lose it.
        var identity: IdentityClaims?
        do {
            identity = try await self.identity(from: response, endpoints: endpoints, required: false)
        } catch let error as IdentityError where error.isTransient {
            logger.debug("no identity with this refresh", metadata: ["error": "\(error)"])
        } catch is CancellationError {
            // Shutdown while the identity was being fetched: the tokens still go back.
            logger.debug("no identity with this refresh: cancelled")
        }
        var violation: IdentityError?
        if let found = identity {
            do {
                identity = try resolvedRoles(found)
                // The email was checked at login and the subject is pinned; a refresh answer
                // without one (userinfo with only `sub`) is not a reason to refuse.
                try admit(identity!, emailRequired: found.email != nil)
            } catch let error as IdentityError { violation = error }
        }
        return RefreshResult(tokens: response.tokens, identity: identity, policyViolation: violation)
    }

    /// Revokes a refresh token: RFC 7009 for OIDC; for Supabase, a refresh (to obtain the
    /// session's access token) followed by `POST /logout?scope=local`. A token the provider
    /// already refuses counts as revoked.
    public func revoke(refreshToken: OAuthToken) async throws {
        let endpoints = try await resolvedEndpoints()
        switch configuration.dialect {
        case .oidc:
            guard let url = configuration.revocationEndpoint ?? endpoints.revocation else {
                throw IdentityError(
                    .unsupported, "the provider publishes no revocation_endpoint and none is configured")
            }
            let response = try await send(
                try oidcRequests(endpoints).revoke(url, refreshToken: refreshToken), context: .revocation)
            guard (200..<300).contains(response.status) else {
                throw ProviderResponses.error(for: response, context: .revocation, dialect: .oidc)
            }
        case .supabase:
            let session: TokenResponse
            do {
                session = try await tokenResponse(
                    try supabaseRequests.refresh(endpoints, refreshToken: refreshToken), context: .refresh)
            } catch let error as IdentityError where error.code == .refreshRejected {
                return
            }
            let response = try await send(
                try supabaseRequests.logout(endpoints, accessToken: session.accessToken), context: .logout)
            // 401/403/404: the session is already gone.
            guard (200..<300).contains(response.status) || [401, 403, 404].contains(response.status) else {
                throw ProviderResponses.error(for: response, context: .logout, dialect: .supabase)
            }
        }
    }

    /// Probes reachability (see ``IdentityProvider/probe(timeout:)``). Deliberately leaves the
    /// resolved endpoints and the key cache alone, and never goes through them: a cached
    /// document proves nothing about the network now.
    public func probe(timeout: Duration) async throws {
        let request: HTTPRequest
        let probe: ReachabilityProbe
        switch (configuration.dialect, configuration.endpoints) {
        case (.oidc, .discovery(let issuer)):
            guard let url = OIDCRequests.discoveryURL(issuer: issuer) else {
                throw IdentityError(.misconfigured, "cannot build the discovery URL from \(issuer.absoluteString)")
            }
            request = .get(url)
            probe = .discovery(issuer: issuer)
        case (.oidc, .explicit(let explicit)):
            guard let jwks = explicit.jwks else {
                throw IdentityError(.unsupported, "no JWKS is configured to probe")
            }
            request = .get(jwks)
            probe = .jwks(jwks)
        case (.supabase, .supabaseProject(let project)):
            request = try supabaseRequests.health(project: project)
            probe = .supabaseHealth(project: project)
        default:
            throw IdentityError(
                .misconfigured, "the \(configuration.dialect.rawValue) dialect cannot use these endpoints")
        }
        let started = ContinuousClock.now
        let response: HTTPResponse
        do {
            response = try await transport.send(request, timeout: min(timeout, configuration.requestTimeout))
        } catch let error as IdentityError {
            logger.debug(
                "reachability probe failed",
                metadata: ["error": "\(error)", "elapsed": "\(ContinuousClock.now - started)"])
            throw error
        }
        logger.debug(
            "reachability probe answered",
            metadata: ["status": "\(response.status)", "elapsed": "\(ContinuousClock.now - started)"])
        try probe.check(response)
    }

    // MARK: - Policy

    /// Checks the configured admission policy and role rules against `claims`.
    ///
    /// - Throws: ``IdentityError`` with ``IdentityError/Code-swift.struct/notAdmitted`` or
    ///   ``IdentityError/Code-swift.struct/unknownRole``.
    public nonisolated func admit(_ claims: IdentityClaims, emailRequired: Bool = true) throws {
        try Admission.check(
            claims, policy: configuration.admission, acceptedRoles: configuration.acceptedRoles,
            emailRequired: emailRequired)
    }

    /// The claims with their roles resolved: the role claim when present, else the first
    /// `RoleFromGroup=` mapping the person's groups match, else `DefaultRole=`.
    nonisolated func resolvedRoles(_ claims: IdentityClaims) throws -> IdentityClaims {
        RoleResolution.resolve(
            claims, roleFromGroup: configuration.roleFromGroup, defaultRole: configuration.defaultRole)
    }

    // MARK: - Internals

    private func oidcRequests(_ endpoints: ResolvedEndpoints) -> OIDCRequests {
        OIDCRequests(
            clientID: configuration.clientID, clientSecret: configuration.clientSecret,
            authentication: configuration.clientAuthentication,
            scopes: ScopeSelection.select(configured: configuration.scopes, supported: endpoints.scopesSupported)
                .requested)
    }

    private var supabaseRequests: SupabaseRequests {
        SupabaseRequests(apiKey: configuration.supabase!.apiKey)
    }

    private func login(
        from response: TokenResponse, endpoints: ResolvedEndpoints, typedName: String?
    ) async throws -> LoginResult {
        guard var identity = try await identity(from: response, endpoints: endpoints, required: true) else {
            throw IdentityError(.invalidResponse, "the login response carries no identity")
        }
        do {
            if identity.email == nil {
                // The provider has just authenticated the name typed for the password grant.
                guard let typedName else {
                    throw IdentityError(
                        .notAdmitted,
                        "the provider sent no email address (neither in a token nor from userinfo); the device login needs an email claim: grant the email scope or have the provider publish the email"
                    )
                }
                identity.email = typedName
                identity.emailSource = "login-name"
            }
            identity = try resolvedRoles(identity)
            try admit(identity)
        } catch let refusal as IdentityError {
            // The provider issued tokens to someone this terminal refuses: do not leave a live
            // refresh token behind. Best effort; the refusal is what the caller hears.
            if let refreshToken = response.refreshToken {
                do { try await revoke(refreshToken: refreshToken) } catch {
                    logger.debug("could not revoke the tokens of a refused login", metadata: ["error": "\(error)"])
                }
            }
            throw refusal
        }
        return LoginResult(tokens: response.tokens, identity: identity)
    }

    /// The identity in a token response: the ID token (OIDC), the access token (Supabase with
    /// a key), or the `user` object (Supabase, online-only).
    private func identity(
        from response: TokenResponse, endpoints: ResolvedEndpoints, required: Bool
    ) async throws
        -> IdentityClaims?
    {
        switch configuration.dialect {
        case .oidc:
            guard let idToken = response.idToken else {
                if let claims = try await accessTokenClaims(response, endpoints: endpoints) {
                    return try await withUserinfo(claims, response: response, endpoints: endpoints)
                }
                guard endpoints.userinfo != nil else {
                    if required {
                        throw IdentityError(
                            .invalidResponse,
                            "the token response has no id_token and the provider publishes no userinfo_endpoint")
                    }
                    return nil
                }
                return try await userinfoClaims(response.accessToken, endpoints: endpoints)
            }
            let validated = try await validator(endpoints).validate(
                idToken,
                expecting: .idToken(
                    issuer: endpoints.issuer, clientID: configuration.clientID, clockSkew: configuration.clockSkew),
                now: now())
            if let atHash = validated.string("at_hash"), atHash != Self.leftHalfHash(of: response.accessToken.rawValue)
            {
                throw IdentityError(.invalidToken, "the ID token's at_hash does not match the access token")
            }
            var claims = try claims(from: validated)
            if claims.email != nil { claims.emailSource = "id_token" }
            return try await withUserinfo(claims, response: response, endpoints: endpoints)
        case .supabase:
            let settings = configuration.supabase!
            if case .onlineOnly = settings.tokenVerification {
                return try IdentityExtraction.supabaseUserClaims(
                    response.object, issuer: endpoints.issuer, roleClaim: configuration.roleClaim,
                    groupsClaim: configuration.groupsClaim)
            }
            let validated = try await validator(endpoints).validate(
                response.accessToken,
                expecting: .accessToken(
                    issuer: endpoints.issuer, audience: settings.audience, clockSkew: configuration.clockSkew),
                now: now())
            return try claims(from: validated)
        }
    }

    /// A JWT access token signed by the provider's keys for this client (issuer and audience
    /// checked) serves as the identity; anything else (an opaque token, another audience) does not.
    private func accessTokenClaims(
        _ response: TokenResponse, endpoints: ResolvedEndpoints
    ) async throws -> IdentityClaims? {
        guard response.accessToken.rawValue.split(separator: ".", omittingEmptySubsequences: false).count == 3,
            endpoints.jwks != nil
        else { return nil }
        do {
            let validated = try await validator(endpoints).validate(
                response.accessToken,
                expecting: .accessToken(
                    issuer: endpoints.issuer, audience: configuration.clientID, clockSkew: configuration.clockSkew),
                now: now())
            var claims = try claims(from: validated)
            if claims.email != nil { claims.emailSource = "access_token" }
            return claims
        } catch let error as IdentityError where !error.isTransient {
            logger.debug("the access token is not an identity token here", metadata: ["error": "\(error)"])
            return nil
        }
    }

    /// Fills what the token lacked (email, groups, roles) from userinfo, when the provider has
    /// a userinfo endpoint and the token lacks an email or any role or group. OIDC Core 5.3.2:
    /// the userinfo `sub` must be the token's.
    private func withUserinfo(
        _ claims: IdentityClaims, response: TokenResponse, endpoints: ResolvedEndpoints
    ) async throws -> IdentityClaims {
        guard endpoints.userinfo != nil, claims.email == nil || (claims.roles.isEmpty && claims.groups.isEmpty) else {
            return claims
        }
        let info = try await userinfoClaims(response.accessToken, endpoints: endpoints)
        guard info.subject == claims.subject else {
            throw IdentityError(.invalidToken, "userinfo names a different subject than the token")
        }
        var merged = claims
        if merged.email == nil, let email = info.email {
            merged.email = email
            merged.isEmailVerified = info.isEmailVerified
            merged.emailSource = "userinfo"
        }
        if merged.roles.isEmpty { merged.roles = info.roles }
        if merged.groups.isEmpty { merged.groups = info.groups }
        return merged
    }

    /// OIDC Core 5.3: the claims the userinfo endpoint returns for the access token (JSON only;
    /// a signed userinfo response is not accepted).
    private func userinfoClaims(
        _ accessToken: OAuthToken, endpoints: ResolvedEndpoints
    ) async throws
        -> IdentityClaims
    {
        guard let url = endpoints.userinfo else {
            throw IdentityError(.unsupported, "the provider publishes no userinfo_endpoint")
        }
        let response = try await send(
            .get(url, headers: ["Authorization": "Bearer " + accessToken.rawValue]), context: .userinfo)
        guard (200..<300).contains(response.status) else {
            throw ProviderResponses.error(for: response, context: .userinfo, dialect: .oidc)
        }
        guard let object = JSONValue.parseObject(response.body) else {
            throw IdentityError(
                .invalidResponse, "the userinfo answer is not a JSON object (signed userinfo is not supported)")
        }
        guard let subject = object["sub"]?.stringValue, !subject.isEmpty else {
            throw IdentityError(.invalidResponse, "the userinfo answer has no sub")
        }
        var claims = IdentityExtraction.userinfoClaims(
            object, issuer: endpoints.issuer, subject: subject, roleClaim: configuration.roleClaim,
            groupsClaim: configuration.groupsClaim)
        if claims.email != nil { claims.emailSource = "userinfo" }
        return claims
    }

    private func claims(from token: ValidatedToken) throws -> IdentityClaims {
        try IdentityExtraction.claims(
            from: token, roleClaim: configuration.roleClaim, groupsClaim: configuration.groupsClaim)
    }

    /// OIDC Core 3.1.3.6: base64url of the left half of SHA-256 (the RS256/ES256 hash).
    static func leftHalfHash(of token: String) -> String {
        let digest = Array(SHA256.hash(data: Data(token.utf8)))
        return Base64URL.encode(digest[..<(digest.count / 2)])
    }

    private func validator(_ endpoints: ResolvedEndpoints) throws -> TokenValidator {
        if let validator { return validator }
        let source: TokenValidator.KeySource
        if configuration.dialect == .supabase,
            case .sharedSecret(let secret) = configuration.supabase!.tokenVerification
        {
            source = .sharedSecret(secret)
        } else {
            guard let jwks = endpoints.jwks else {
                throw IdentityError(.invalidToken, "no JWKS endpoint is known, so tokens cannot be validated")
            }
            let transport = transport
            let timeout = configuration.requestTimeout
            let logger = logger
            source = .jwks(fetch: {
                logger.debug("fetching JWKS", metadata: ["url": "\(jwks.absoluteString)"])
                let response = try await transport.send(.get(jwks), timeout: timeout)
                guard (200..<300).contains(response.status) else {
                    throw ProviderResponses.error(for: response, context: .jwks, dialect: .oidc)
                }
                return response.body
            })
        }
        let made = TokenValidator(keySource: source, minimumRefetchInterval: configuration.minimumKeyRefetchInterval)
        validator = made
        return made
    }

    private func tokenResponse(_ request: HTTPRequest, context: GrantContext) async throws -> TokenResponse {
        let response = try await send(request, context: context)
        guard (200..<300).contains(response.status) else {
            throw ProviderResponses.error(for: response, context: context, dialect: configuration.dialect)
        }
        return try ProviderResponses.parseTokens(response, now: now())
    }

    private func send(_ request: HTTPRequest, context: GrantContext) async throws -> HTTPResponse {
        let started = ContinuousClock.now
        do {
            let response = try await transport.send(request, timeout: configuration.requestTimeout)
            logger.debug(
                "identity provider answered",
                metadata: [
                    "call": "\(context.rawValue)", "status": "\(response.status)",
                    "elapsed": "\(ContinuousClock.now - started)",
                ])
            return response
        } catch let error as IdentityError {
            logger.debug(
                "identity provider request failed",
                metadata: [
                    "call": "\(context.rawValue)", "error": "\(error)", "elapsed": "\(ContinuousClock.now - started)",
                ])
            throw error
        }
    }

    private func resolvedEndpoints() async throws -> ResolvedEndpoints {
        if let endpoints { return endpoints }
        let resolved: ResolvedEndpoints
        switch configuration.endpoints {
        case .explicit(let explicit):
            resolved = ResolvedEndpoints(
                issuer: explicit.issuer, token: explicit.token, jwks: explicit.jwks, revocation: explicit.revocation,
                deviceAuthorization: explicit.deviceAuthorization, logout: nil)
        case .supabaseProject(let project):
            resolved = SupabaseRequests.endpoints(project: project)
        case .discovery(let issuer):
            resolved = try await discover(issuer)
        }
        endpoints = resolved
        return resolved
    }

    /// OpenID Connect Discovery 1.0 §4.
    private func discover(_ issuer: URL) async throws -> ResolvedEndpoints {
        guard let url = OIDCRequests.discoveryURL(issuer: issuer) else {
            throw IdentityError(.misconfigured, "cannot build the discovery URL from \(issuer.absoluteString)")
        }
        let response = try await send(.get(url), context: .discovery)
        guard (200..<300).contains(response.status) else {
            throw ProviderResponses.error(for: response, context: .discovery, dialect: .oidc)
        }
        guard let document = JSONValue.parseObject(response.body) else {
            throw IdentityError(.invalidResponse, "the discovery document is not a JSON object")
        }
        guard document["issuer"]?.stringValue == issuer.absoluteString else {
            throw IdentityError(
                .invalidResponse,
                "the discovery document is for issuer \(document["issuer"]?.stringValue ?? "(none)"), not \(issuer.absoluteString)"
            )
        }
        func endpoint(_ name: String) throws -> URL? {
            guard let text = document[name]?.stringValue else { return nil }
            guard let url = URL(string: text), Self.isAcceptable(url) else {
                throw IdentityError(.invalidResponse, "the discovery document's \(name) is neither HTTPS nor loopback")
            }
            return url
        }
        guard let token = try endpoint("token_endpoint"), let jwks = try endpoint("jwks_uri") else {
            throw IdentityError(.invalidResponse, "the discovery document lacks token_endpoint or jwks_uri")
        }
        let supported = document["scopes_supported"]?.stringList
        let selection = ScopeSelection.select(configured: configuration.scopes, supported: supported)
        for scope in selection.dropped {
            logger.notice(
                "not requesting a configured scope: the provider does not list it in scopes_supported",
                metadata: ["scope": "\(scope)"])
        }
        return ResolvedEndpoints(
            issuer: issuer.absoluteString, token: token, jwks: jwks, revocation: try endpoint("revocation_endpoint"),
            deviceAuthorization: try endpoint("device_authorization_endpoint"), logout: nil,
            userinfo: try endpoint("userinfo_endpoint"), scopesSupported: supported)
    }
}

/// Reading an identity out of a validated token or a Supabase `user` object.
enum IdentityExtraction {
    static func claims(from token: ValidatedToken, roleClaim: String, groupsClaim: String) throws -> IdentityClaims {
        guard let subject = token.subject, !subject.isEmpty else {
            throw IdentityError(.invalidToken, "the token has no subject")
        }
        var verified = token.bool("email_verified")
        // Some providers (Cognito) send the boolean as a string.
        if verified == nil, let text = token.string("email_verified") { verified = text.lowercased() == "true" }
        return make(
            issuer: token.issuer, subject: subject, isEmailVerified: verified, roleClaim: roleClaim,
            groupsClaim: groupsClaim, lookup: { token.claims.value(atPath: $0) })
    }

    /// A userinfo answer (OIDC Core 5.3.2), which came straight from the provider over TLS.
    static func userinfoClaims(
        _ object: [String: JSONValue], issuer: String, subject: String, roleClaim: String, groupsClaim: String
    ) -> IdentityClaims {
        var verified = object["email_verified"]?.boolValue
        if verified == nil, let text = object["email_verified"]?.stringValue { verified = text.lowercased() == "true" }
        return make(
            issuer: issuer, subject: subject, isEmailVerified: verified, roleClaim: roleClaim,
            groupsClaim: groupsClaim, lookup: { object.value(atPath: $0) })
    }

    /// Supabase without a verification key: the `user` object of the token response, which
    /// came straight from the provider over TLS (`id`, `email`, `email_confirmed_at`,
    /// `app_metadata`, `user_metadata`).
    static func supabaseUserClaims(
        _ response: [String: JSONValue], issuer: String, roleClaim: String, groupsClaim: String
    )
        throws -> IdentityClaims
    {
        guard let user = response["user"]?.objectValue, let subject = user["id"]?.stringValue, !subject.isEmpty else {
            throw IdentityError(.invalidResponse, "the Supabase token response has no user")
        }
        let confirmed = user["email_confirmed_at"].map { $0 != .null }
        return make(
            issuer: issuer, subject: subject, isEmailVerified: confirmed, roleClaim: roleClaim,
            groupsClaim: groupsClaim,
            lookup: { user.value(atPath: $0) })
    }

    private static func make(
        issuer: String, subject: String, isEmailVerified: Bool?, roleClaim: String, groupsClaim: String,
        lookup: (String) -> JSONValue?
    ) -> IdentityClaims {
        func unique(_ values: [String]) -> [String] {
            var seen = Set<String>()
            return values.filter { seen.insert($0).inserted }
        }
        return IdentityClaims(
            issuer: issuer, subject: subject, email: lookup("email")?.stringValue, isEmailVerified: isEmailVerified,
            roles: unique(lookup(roleClaim)?.stringList ?? []), groups: unique(lookup(groupsClaim)?.stringList ?? []))
    }
}

/// The admission policy and role rules, as pure functions.
enum Admission {
    static func check(
        _ claims: IdentityClaims, policy: AdmissionPolicy, acceptedRoles: Set<String>, emailRequired: Bool = true
    ) throws {
        if !policy.allowedEmailDomains.isEmpty, emailRequired || claims.email != nil {
            guard let email = claims.email, let at = email.lastIndex(of: "@") else {
                throw IdentityError(
                    .notAdmitted, "the provider sent no email address, and admission is by email domain")
            }
            let domain = email[email.index(after: at)...].lowercased()
            guard policy.allowedEmailDomains.contains(domain) else {
                throw IdentityError(.notAdmitted, "the email domain \(domain) is not admitted on this terminal")
            }
            guard claims.isEmailVerified != false else {
                throw IdentityError(.notAdmitted, "the provider has not verified the email address")
            }
        }
        if let group = policy.requiredGroup, !claims.groups.contains(group) {
            throw IdentityError(.notAdmitted, "the person is not in the group \(group)")
        }
        guard !claims.roles.isEmpty else {
            throw IdentityError(
                .unknownRole, "the provider sent no role claim, no group maps to a role, and no DefaultRole is set")
        }
        if let unknown = claims.roles.first(where: { !acceptedRoles.contains($0) }) {
            throw IdentityError(.unknownRole, "the role \(unknown) is not one this terminal knows")
        }
    }
}

/// Roles for people whose provider sends no role claim (`RoleFromGroup=`, `DefaultRole=`).
enum RoleResolution {
    static func resolve(
        _ claims: IdentityClaims, roleFromGroup: [GroupRoleMapping], defaultRole: String?
    ) -> IdentityClaims {
        guard claims.roles.isEmpty else { return claims }
        var resolved = claims
        if let mapping = roleFromGroup.first(where: { claims.groups.contains($0.group) }) {
            resolved.roles = [mapping.role]
            resolved.roleSource = "group \(mapping.group)"
        } else if let defaultRole {
            resolved.roles = [defaultRole]
            resolved.roleSource = "default"
        }
        return resolved
    }
}
