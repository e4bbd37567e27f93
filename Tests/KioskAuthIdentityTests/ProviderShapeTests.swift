import Foundation
import Testing

@testable import KioskAuthIdentity

/// Request building and response parsing, checked against the shapes the specifications and
/// Supabase Auth's source document. There is no Supabase server here: the Supabase tests say
/// so in their names.
@Suite("Provider request and response shapes")
struct ProviderShapeTests {
    let token = URL(string: "https://idp.example/token")!
    var endpoints: ResolvedEndpoints {
        ResolvedEndpoints(
            issuer: "https://idp.example", token: token, jwks: nil, revocation: nil, deviceAuthorization: nil,
            logout: nil)
    }

    func form(_ request: HTTPRequest) -> [String: String] {
        let body = String(decoding: request.body ?? Data(), as: UTF8.self)
        var fields: [String: String] = [:]
        for pair in body.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map {
                String($0).replacingOccurrences(of: "+", with: " ").removingPercentEncoding!
            }
            fields[parts[0]] = parts.count > 1 ? parts[1] : ""
        }
        return fields
    }

    func json(_ request: HTTPRequest) -> [String: String] {
        (try? JSONSerialization.jsonObject(with: request.body ?? Data())) as? [String: String] ?? [:]
    }

    func response(_ status: Int, _ body: String) -> HTTPResponse {
        HTTPResponse(status: status, body: Data(body.utf8))
    }

    func code(
        _ status: Int, _ body: String, _ context: GrantContext, _ dialect: IdentityProviderConfiguration.Dialect = .oidc
    )
        -> IdentityError.Code
    {
        ProviderResponses.error(for: response(status, body), context: context, dialect: dialect).code
    }

    // MARK: OAuth 2.0 / OIDC

    @Test func oidc_passwordGrant_formEncodesAndAuthenticatesWithBasic() throws {
        let requests = OIDCRequests(
            clientID: "kiosk:1", clientSecret: CredentialSecret("p@ss word&"), authentication: .clientSecretBasic,
            scopes: ["openid", "email"])
        let request = try requests.password(endpoints, email: "sarah+ward@clinic.example", password: "a&b=c d")
        #expect(request.method == "POST")
        #expect(request.url == token)
        #expect(request.headers["Content-Type"] == "application/x-www-form-urlencoded")
        // RFC 6749 §2.3.1: id and secret are form-encoded before Basic encoding.
        let basic = Data(base64Encoded: String(request.headers["Authorization"]!.dropFirst("Basic ".count)))!
        #expect(String(decoding: basic, as: UTF8.self) == "kiosk%3A1:p%40ss+word%26")
        #expect(
            form(request) == [
                "grant_type": "password", "username": "sarah+ward@clinic.example", "password": "a&b=c d",
                "scope": "openid email",
            ])
    }

    @Test func oidc_clientSecretPost_andPublicClient_putTheIdInTheBody() throws {
        let post = try OIDCRequests(
            clientID: "kiosk", clientSecret: CredentialSecret("s"), authentication: .clientSecretPost, scopes: []
        ).refresh(endpoints, refreshToken: OAuthToken("rt"))
        #expect(post.headers["Authorization"] == nil)
        #expect(
            form(post) == [
                "grant_type": "refresh_token", "refresh_token": "rt", "client_id": "kiosk", "client_secret": "s",
            ])
        let publicClient = try OIDCRequests(
            clientID: "kiosk", clientSecret: nil, authentication: .clientSecretBasic, scopes: []
        )
        .revoke(token, refreshToken: OAuthToken("rt"))
        #expect(form(publicClient) == ["token": "rt", "token_type_hint": "refresh_token", "client_id": "kiosk"])
    }

    @Test func oidc_devicePoll_carriesTheGrantTypeAndClientID() throws {
        let request = try OIDCRequests(
            clientID: "kiosk", clientSecret: CredentialSecret("s"), authentication: .clientSecretBasic, scopes: []
        )
        .devicePoll(endpoints, deviceCode: OAuthToken("dc"))
        #expect(
            form(request) == [
                "grant_type": "urn:ietf:params:oauth:grant-type:device_code", "device_code": "dc", "client_id": "kiosk",
            ])
    }

    @Test func oidc_errors_dependOnTheCall() {
        let invalidGrant = #"{"error": "invalid_grant", "error_description": "Invalid credentials given."}"#
        #expect(code(400, invalidGrant, .password) == .invalidCredentials)
        #expect(code(400, invalidGrant, .refresh) == .refreshRejected)
        #expect(code(400, invalidGrant, .devicePoll) == .deviceCodeExpired)
        #expect(code(401, #"{"error": "invalid_client"}"#, .refresh) == .clientRejected)
        #expect(code(400, #"{"error": "invalid_scope"}"#, .password) == .requestRejected)
        #expect(code(400, #"{"error": "access_denied"}"#, .devicePoll) == .authorizationDenied)
        #expect(code(400, #"{"error": "expired_token"}"#, .devicePoll) == .deviceCodeExpired)
        #expect(code(503, "<html>Service Unavailable</html>", .refresh) == .serverError)
        #expect(code(500, "", .password) == .serverError)
        #expect(code(429, "", .refresh) == .serverError)
        // A refresh that meets an HTML error page is not a revocation.
        #expect(code(400, "<html>Bad Request</html>", .refresh) == .requestRejected)
    }

    @Test func tokenResponse_lifetimeFromExpiresIn_elseTheJWT_elseAssumed() throws {
        let now = Date(timeIntervalSince1970: 1_000)
        let withExpiresIn = try ProviderResponses.parseTokens(
            response(200, #"{"access_token": "a", "token_type": "Bearer", "expires_in": 30, "refresh_token": "r"}"#),
            now: now)
        #expect(withExpiresIn.expiresAt == Date(timeIntervalSince1970: 1_030))
        #expect(withExpiresIn.refreshToken == OAuthToken("r"))
        let jwt = TokenFactory.token(TokenFactory.claims(["exp": 5_000.0]))
        let fromJWT = try ProviderResponses.parseTokens(response(200, #"{"access_token": "\#(jwt)"}"#), now: now)
        #expect(fromJWT.expiresAt == Date(timeIntervalSince1970: 5_000))
        let assumed = try ProviderResponses.parseTokens(
            response(200, #"{"access_token": "opaque", "expires_in": "0"}"#), now: now)
        #expect(assumed.expiresAt == Date(timeIntervalSince1970: 1_300))
        #expect(assumed.refreshToken == nil)
    }

    /// Numbers from a provider are bounded before any arithmetic: each of these used to trap (an
    /// integer or `Duration` conversion overflowing), stopping the daemon on one answer.
    @Test func tokenResponse_absurdLifetimes_areBounded_notATrap() throws {
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let latest = now.addingTimeInterval(TokenResponse.longestLifetime)
        let earliest = now.addingTimeInterval(-TokenResponse.longestLifetime)
        let assumed = now.addingTimeInterval(TokenResponse.assumedLifetime)
        let cases: [(String, Date)] = [
            (#""expires_in": 1e19"#, latest),
            (#""expires_in": 1.7e308"#, latest),
            (#""expires_in": "1e19""#, latest),
            (#""expires_in": "1e400""#, assumed),  // Double("1e400") is infinite
            (#""expires_in": "inf""#, assumed),
            (#""expires_in": "nan""#, assumed),
            (#""expires_in": "-inf""#, assumed),
            (#""expires_in": -5"#, assumed),
            (#""expires_in": 3600"#, now.addingTimeInterval(3600)),
        ]
        for (field, expected) in cases {
            let parsed = try ProviderResponses.parseTokens(
                response(200, #"{"access_token": "opaque", \#(field)}"#), now: now)
            #expect(parsed.expiresAt == expected, "\(field)")
            // What the daemon then does with it: a lifetime (a `Duration`) and a countdown.
            _ = Duration.seconds(parsed.expiresAt.timeIntervalSince(now))
            _ = Int(parsed.expiresAt.timeIntervalSince(now))
        }
        for (exp, expected) in [(1e300, latest), (-1e300, earliest), (1_800_000_060.0, now.addingTimeInterval(60))] {
            let jwt = TokenFactory.token(TokenFactory.claims(["exp": exp]))
            let parsed = try ProviderResponses.parseTokens(response(200, #"{"access_token": "\#(jwt)"}"#), now: now)
            #expect(parsed.expiresAt == expected, "exp \(exp)")
            _ = Duration.seconds(parsed.expiresAt.timeIntervalSince(now))
        }
    }

    @Test func deviceAuthorization_absurdNumbers_areBounded_notATrap() throws {
        func parse(_ numbers: String) throws -> DeviceAuthorization {
            try ProviderResponses.deviceAuthorization(
                response(
                    200,
                    #"{"device_code": "d", "user_code": "ABCD-EFGH", "verification_uri": "https://idp.example/device", "#
                        + numbers + "}"))
        }
        var parsed = try parse(#""expires_in": 1e19, "interval": 1e19"#)
        #expect(parsed.expiresIn == .seconds(86_400) && parsed.interval == .seconds(600))
        parsed = try parse(#""expires_in": "1e19", "interval": "inf""#)
        #expect(parsed.expiresIn == .seconds(86_400) && parsed.interval == .seconds(5))
        parsed = try parse(#""expires_in": 900, "interval": "nan""#)
        #expect(parsed.expiresIn == .seconds(900) && parsed.interval == .seconds(5))
        parsed = try parse(#""expires_in": 900, "interval": 0.2"#)
        #expect(parsed.interval == .seconds(1))
        parsed = try parse(#""expires_in": 900"#)
        #expect(parsed.interval == .seconds(5))
        for bad in [#""expires_in": "inf""#, #""expires_in": "nan""#, #""expires_in": 0"#, #""interval": 5"#] {
            #expect {
                _ = try parse(bad)
            } throws: { ($0 as? IdentityError)?.code == .invalidResponse }
        }
    }

    @Test func tokenResponse_malformed_isInvalidResponse() {
        for body in [#"{"token_type": "Bearer"}"#, #"{"access_token": "a", "token_type": "DPoP"}"#, "[]", "not json"] {
            #expect {
                _ = try ProviderResponses.parseTokens(response(200, body), now: Date())
            } throws: { ($0 as? IdentityError)?.code == .invalidResponse }
        }
    }

    @Test func formEncoding_escapesReservedBytes() {
        #expect(FormEncoding.escape("a b&c=d/é~") == "a+b%26c%3Dd%2F%C3%A9%7E")
    }

    // MARK: Supabase Auth (no runnable server here: documented shapes only)

    let supabase = SupabaseRequests(apiKey: CredentialSecret("anon-key"))
    let supabaseEndpoints = SupabaseRequests.endpoints(project: URL(string: "https://abcd.supabase.co")!)

    @Test func supabaseDialect_documentedShapes_endpointsAndIssuer() {
        #expect(supabaseEndpoints.issuer == "https://abcd.supabase.co/auth/v1")
        #expect(supabaseEndpoints.token.absoluteString == "https://abcd.supabase.co/auth/v1/token")
        #expect(supabaseEndpoints.jwks?.absoluteString == "https://abcd.supabase.co/auth/v1/.well-known/jwks.json")
        #expect(supabaseEndpoints.logout?.absoluteString == "https://abcd.supabase.co/auth/v1/logout")
    }

    @Test func supabaseDialect_documentedShapes_passwordGrantRequest() throws {
        let request = try supabase.password(supabaseEndpoints, email: "sarah@clinic.example", password: "pw \"x\"")
        #expect(request.method == "POST")
        #expect(request.url.absoluteString == "https://abcd.supabase.co/auth/v1/token?grant_type=password")
        #expect(request.headers["apikey"] == "anon-key")
        #expect(request.headers["Content-Type"] == "application/json")
        #expect(request.headers["Authorization"] == nil)
        #expect(json(request) == ["email": "sarah@clinic.example", "password": "pw \"x\""])
    }

    @Test func supabaseDialect_documentedShapes_refreshGrantRequest() throws {
        let request = try supabase.refresh(supabaseEndpoints, refreshToken: OAuthToken("v1.refresh"))
        #expect(request.url.absoluteString == "https://abcd.supabase.co/auth/v1/token?grant_type=refresh_token")
        #expect(request.headers["apikey"] == "anon-key")
        #expect(json(request) == ["refresh_token": "v1.refresh"])
    }

    @Test func supabaseDialect_documentedShapes_logoutRequest() throws {
        let request = try supabase.logout(supabaseEndpoints, accessToken: OAuthToken("eyJ.access"))
        #expect(request.method == "POST")
        #expect(request.url.absoluteString == "https://abcd.supabase.co/auth/v1/logout?scope=local")
        #expect(request.headers["Authorization"] == "Bearer eyJ.access")
        #expect(request.headers["apikey"] == "anon-key")
        #expect(request.body == nil)
    }

    @Test func supabaseDialect_documentedShapes_passwordErrors() {
        // GoTrue's OAuthError shape (older versions, and still some paths).
        #expect(
            code(
                400, #"{"error":"invalid_grant","error_description":"Invalid login credentials"}"#, .password, .supabase
            ) == .invalidCredentials)
        // GoTrue's HTTPError shape: numeric code, error_code, msg.
        #expect(
            code(
                400, #"{"code":400,"error_code":"invalid_credentials","msg":"Invalid login credentials"}"#, .password,
                .supabase) == .invalidCredentials)
        #expect(
            code(
                400, #"{"code":400,"error_code":"email_not_confirmed","msg":"Email not confirmed"}"#, .password,
                .supabase) == .invalidCredentials)
        // API version 2024-01-01: string code, message.
        #expect(
            code(400, #"{"code":"invalid_credentials","message":"Invalid login credentials"}"#, .password, .supabase)
                == .invalidCredentials)
        // HTTPError without error_code (before error codes existed).
        #expect(
            code(400, #"{"code":400,"msg":"Invalid login credentials"}"#, .password, .supabase) == .invalidCredentials)
        #expect(
            code(
                400, #"{"code":400,"error_code":"validation_failed","msg":"missing email or phone"}"#, .password,
                .supabase) == .requestRejected)
    }

    @Test func supabaseDialect_documentedShapes_refreshErrors() {
        #expect(
            code(
                400, #"{"error":"invalid_grant","error_description":"Invalid Refresh Token: Already Used"}"#, .refresh,
                .supabase) == .refreshRejected)
        #expect(
            code(
                400,
                #"{"code":400,"error_code":"refresh_token_already_used","msg":"Invalid Refresh Token: Already Used"}"#,
                .refresh, .supabase) == .refreshRejected)
        #expect(
            code(
                400,
                #"{"code":400,"error_code":"refresh_token_not_found","msg":"Invalid Refresh Token: Refresh Token Not Found"}"#,
                .refresh, .supabase) == .refreshRejected)
        #expect(
            code(400, #"{"code":"session_expired","message":"Session Expired"}"#, .refresh, .supabase)
                == .refreshRejected)
        #expect(
            code(400, #"{"code":400,"msg":"Invalid Refresh Token: Refresh Token Not Found"}"#, .refresh, .supabase)
                == .refreshRejected)
        // Transient failures are never mistaken for a revocation.
        #expect(
            code(
                429, #"{"code":429,"error_code":"over_request_rate_limit","msg":"Request rate limit reached"}"#,
                .refresh, .supabase) == .serverError)
        #expect(
            code(
                500, #"{"code":500,"error_code":"unexpected_failure","msg":"Database error","error_id":"x"}"#, .refresh,
                .supabase) == .serverError)
        #expect(
            code(504, #"{"code":"request_timeout","message":"Processing this request timed out"}"#, .refresh, .supabase)
                == .serverError)
        // The API gateway's answer to a wrong apikey.
        #expect(
            code(
                401,
                #"{"message":"Invalid API key","hint":"Double check your Supabase `anon` or `service_role` API key."}"#,
                .refresh, .supabase) == .clientRejected)
    }

    @Test func supabaseDialect_documentedShapes_tokenResponseWithUser() throws {
        let body = #"""
            {"access_token":"eyJhbGciOiJIUzI1NiJ9.e30.sig","token_type":"bearer","expires_in":3600,"expires_at":1800003600,
             "refresh_token":"y2bq3ad5klb7","user":{"id":"8f0c2b5e-1111-2222-3333-444455556666","aud":"authenticated",
             "role":"authenticated","email":"sarah@clinic.example","email_confirmed_at":"2026-01-01T00:00:00Z",
             "app_metadata":{"provider":"email","providers":["email"],"kioskauth_role":"coordinator","groups":["ward-3"]},
             "user_metadata":{}}}
            """#
        let parsed = try ProviderResponses.parseTokens(response(200, body), now: Date(timeIntervalSince1970: 0))
        #expect(parsed.expiresAt == Date(timeIntervalSince1970: 3600))
        #expect(parsed.refreshToken == OAuthToken("y2bq3ad5klb7"))
        let claims = try IdentityExtraction.supabaseUserClaims(
            parsed.object, issuer: supabaseEndpoints.issuer, roleClaim: "app_metadata.kioskauth_role",
            groupsClaim: "app_metadata.groups")
        #expect(claims.subject == "8f0c2b5e-1111-2222-3333-444455556666")
        #expect(claims.email == "sarah@clinic.example")
        #expect(claims.isEmailVerified == true)
        #expect(claims.roles == ["coordinator"])
        #expect(claims.groups == ["ward-3"])
    }

    @Test func supabaseDialect_documentedShapes_hs256AccessToken() async throws {
        // The claims GoTrue puts in a user access token (iss = {project}/auth/v1, aud =
        // "authenticated", role = the Postgres role), signed with the project's JWT secret.
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        let access = TokenFactory.token(
            [
                "iss": supabaseEndpoints.issuer, "aud": "authenticated", "sub": "8f0c2b5e", "role": "authenticated",
                "email": "sarah@clinic.example", "exp": now.timeIntervalSince1970 + 3600,
                "iat": now.timeIntervalSince1970, "session_id": "s1", "aal": "aal1",
                "app_metadata": ["provider": "email", "kioskauth_role": "family"],
            ], signer: .hmac(TestKeys.hmacSecret), kid: nil)
        let validator = TokenValidator(keySource: .sharedSecret(CredentialSecret(TestKeys.hmacSecret)))
        let validated = try await validator.validate(
            OAuthToken(access),
            expecting: .accessToken(
                issuer: supabaseEndpoints.issuer, audience: "authenticated", clockSkew: .seconds(60)),
            now: now)
        let claims = try IdentityExtraction.claims(
            from: validated, roleClaim: "app_metadata.kioskauth_role", groupsClaim: "groups")
        #expect(claims.roles == ["family"])
        #expect(claims.subject == "8f0c2b5e")
    }

    @Test func supabaseDialect_hasNoDeviceGrant() async throws {
        let configuration = IdentityProviderConfiguration(
            dialect: .supabase, endpoints: .supabaseProject(URL(string: "https://abcd.supabase.co")!),
            clientID: "unused",
            clientSecret: nil, admission: .emailDomains(["clinic.example"]),
            supabase: .init(apiKey: CredentialSecret("anon-key"), tokenVerification: .onlineOnly))
        let client = try IdentityProviderClient(configuration: configuration, logger: .init(label: "test"))
        await #expect {
            _ = try await client.startDeviceAuthorization()
        } throws: { ($0 as? IdentityError)?.code == .unsupported }
    }
}
