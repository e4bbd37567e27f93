import FoundationEssentials
import KioskAuthProtocol

/// Which call an answer belongs to: the same provider error means different things in each
/// (`invalid_grant` is wrong credentials on login but a dead refresh token on refresh).
enum GrantContext: String, Sendable {
    case password
    case refresh
    case deviceStart
    case devicePoll
    case revocation
    case logout
    case discovery
    case jwks
    case probe
    case userinfo
}

/// A successful token response, before any token in it is trusted.
struct TokenResponse: Sendable {
    var accessToken: OAuthToken
    var refreshToken: OAuthToken?
    var idToken: OAuthToken?
    var expiresAt: Date
    /// The whole JSON object (Supabase puts the `user` here).
    var object: [String: JSONValue]

    /// Used when a provider sends neither `expires_in` nor a JWT access token.
    static let assumedLifetime: TimeInterval = 300
    /// The longest lifetime an answer is taken to give (366 days); a longer one is read as this.
    static let longestLifetime: TimeInterval = 366 * 86_400

    var tokens: TokenSet {
        TokenSet(
            accessToken: accessToken, accessTokenExpiresAt: expiresAt, refreshToken: refreshToken, idToken: idToken)
    }
}

/// A provider's error answer, in any of the shapes OAuth servers and Supabase Auth use.
struct ProviderErrorBody: Sendable, Equatable {
    /// The machine-readable code: OAuth `error`, GoTrue `error_code`, or the string `code` of
    /// GoTrue's 2024-01-01 API version.
    var code: String?
    /// The human-readable text: `error_description`, `msg` or `message`.
    var message: String?

    /// Reads `{"error", "error_description"}` (RFC 6749 §5.2 and GoTrue's OAuthError),
    /// `{"code": 400, "error_code", "msg"}` (GoTrue's HTTPError), and
    /// `{"code": "…", "message"}` (GoTrue with `X-Supabase-Api-Version: 2024-01-01`; also the
    /// API gateway's `{"message": "Invalid API key"}`).
    init(_ data: Data) {
        guard let object = JSONValue.parseObject(data) else { return }
        code = object["error"]?.stringValue ?? object["error_code"]?.stringValue ?? object["code"]?.stringValue
        message =
            object["error_description"]?.stringValue ?? object["msg"]?.stringValue ?? object["message"]?.stringValue
    }

    init(code: String?, message: String?) {
        self.code = code
        self.message = message
    }
}

enum ProviderResponses {
    /// Parses a 2xx token response.
    static func parseTokens(_ response: HTTPResponse, now: Date) throws -> TokenResponse {
        guard let object = JSONValue.parseObject(response.body) else {
            throw IdentityError(.invalidResponse, "the token response is not a JSON object")
        }
        guard let access = object["access_token"]?.stringValue, !access.isEmpty else {
            throw IdentityError(.invalidResponse, "the token response has no access_token")
        }
        if let type = object["token_type"]?.stringValue, type.lowercased() != "bearer" {
            throw IdentityError(.invalidResponse, "unsupported token type \(type)")
        }
        let expiresAt: Date
        if let seconds = seconds(object["expires_in"], atMost: TokenResponse.longestLifetime) {
            expiresAt = now.addingTimeInterval(seconds)
        } else if let exp = JSONWebToken.unverifiedClaims(of: access)?["exp"]?.doubleValue {
            // Finite (the JSON parser refuses anything else), and held to a lifetime either side
            // of now, like `expires_in`.
            let reach = TokenResponse.longestLifetime
            let latest = now.timeIntervalSince1970 + reach
            expiresAt = Date(timeIntervalSince1970: min(max(exp, latest - 2 * reach), latest))
        } else {
            expiresAt = now.addingTimeInterval(TokenResponse.assumedLifetime)
        }
        let refresh = object["refresh_token"]?.stringValue.flatMap { $0.isEmpty ? nil : OAuthToken($0) }
        let id = object["id_token"]?.stringValue.flatMap { $0.isEmpty ? nil : OAuthToken($0) }
        return TokenResponse(
            accessToken: OAuthToken(access), refreshToken: refresh, idToken: id, expiresAt: expiresAt, object: object)
    }

    /// Turns a non-2xx answer into the error the caller acts on.
    static func error(
        for response: HTTPResponse, context: GrantContext, dialect: IdentityProviderConfiguration.Dialect
    )
        -> IdentityError
    {
        let body = ProviderErrorBody(response.body)
        let provider = body.code ?? "HTTP \(response.status)"
        let code = classify(body, status: response.status, context: context, dialect: dialect)
        return IdentityError(code, message(code: code, body: body, status: response.status), providerError: provider)
    }

    /// "the identity provider refused the request: invalid_scope (The requested scope is
    /// invalid) (HTTP 400)": the summary, then the OAuth `error` and `error_description`.
    static func message(code: IdentityError.Code, body: ProviderErrorBody, status: Int) -> String {
        var text = summary(of: code)
        switch (body.code, body.message) {
        case (let error?, let description?) where description != error: text += ": \(error) (\(description))"
        case (let error?, _): text += ": \(error)"
        case (nil, let description?): text += ": \(description)"
        case (nil, nil): break
        }
        return text + " (HTTP \(status))"
    }

    static func classify(
        _ body: ProviderErrorBody, status: Int, context: GrantContext, dialect: IdentityProviderConfiguration.Dialect
    ) -> IdentityError.Code {
        if status >= 500 || status == 429 { return .serverError }
        switch body.code?.lowercased() {
        case "invalid_grant":
            switch context {
            case .password: return .invalidCredentials
            case .refresh: return .refreshRejected
            case .devicePoll: return .deviceCodeExpired
            default: return .requestRejected
            }
        case "invalid_client", "unauthorized_client":
            return .clientRejected
        case "expired_token", "device_not_found":
            return .deviceCodeExpired
        case "access_denied":
            // django-oidc-provider refuses wrong credentials on the password grant this way.
            return context == .password ? .invalidCredentials : .authorizationDenied
        case "temporarily_unavailable", "server_error", "unexpected_failure", "over_request_rate_limit",
            "request_timeout", "hook_timeout", "hook_timeout_after_retry":
            return .serverError
        default:
            break
        }
        if dialect == .supabase,
            let mapped = supabaseError(code: body.code?.lowercased(), message: body.message, context: context)
        {
            return mapped
        }
        if status == 401 || status == 403 { return .clientRejected }
        return .requestRejected
    }

    private static func summary(of code: IdentityError.Code) -> String {
        switch code {
        case .invalidCredentials: "wrong email or password"
        case .refreshRejected: "the refresh token was refused"
        case .serverError: "the identity provider failed or is rate limiting"
        case .clientRejected: "the identity provider refused this client"
        case .deviceCodeExpired: "the device code is no longer valid"
        case .authorizationDenied: "the person denied the authorization"
        default: "the identity provider refused the request"
        }
    }

    /// GoTrue's `error_code`s (internal/api/apierrors/errorcode.go), and the texts older
    /// versions send without a code.
    private static func supabaseError(
        code: String?, message: String?, context: GrantContext
    )
        -> IdentityError.Code?
    {
        switch context {
        case .password:
            if let code,
                ["invalid_credentials", "email_not_confirmed", "phone_not_confirmed", "user_banned", "user_not_found"]
                    .contains(code)
            {
                return .invalidCredentials
            }
            if code == nil, let message, message.lowercased().contains("invalid login credentials") {
                return .invalidCredentials
            }
        case .refresh:
            if let code,
                [
                    "refresh_token_not_found", "refresh_token_already_used", "session_not_found", "session_expired",
                    "user_banned", "user_not_found",
                ].contains(code)
            {
                return .refreshRejected
            }
            if code == nil, let message, message.lowercased().contains("invalid refresh token") {
                return .refreshRejected
            }
        default:
            break
        }
        return nil
    }

    /// A JSON number, or a string holding one (some providers quote `expires_in`).
    /// A number of seconds in an answer (`expires_in`, `interval`): nil when absent, unreadable,
    /// not finite or not positive, and at most `longest`. A provider may send the number as a
    /// string, and Double("inf") or a finite 1e19 would trap later, converted to an integer or a
    /// `Duration`: no answer from a provider may stop the daemon.
    static func seconds(_ value: JSONValue?, atMost longest: Double) -> Double? {
        guard let seconds = number(value), seconds.isFinite, seconds > 0 else { return nil }
        return min(seconds, longest)
    }

    /// Parses a 2xx device authorization response (RFC 8628 §3.2).
    static func deviceAuthorization(_ response: HTTPResponse) throws -> DeviceAuthorization {
        guard let object = JSONValue.parseObject(response.body),
            let deviceCode = object["device_code"]?.stringValue, let userCode = object["user_code"]?.stringValue,
            // `verification_url` is what Google sends.
            let uri = (object["verification_uri"] ?? object["verification_url"])?.stringValue.flatMap(
                URL.init(string:)),
            let expiresIn = seconds(object["expires_in"], atMost: DeviceAuthorization.longestValidity)
        else {
            throw IdentityError(.invalidResponse, "the device authorization response lacks required fields")
        }
        // At least the RFC's 1 s (and 5 s when absent), at most the longest back-off of a poll.
        let interval = max(seconds(object["interval"], atMost: DeviceAuthorization.longestInterval) ?? 5, 1)
        return DeviceAuthorization(
            userCode: userCode, verificationURI: uri,
            verificationURIComplete: object["verification_uri_complete"]?.stringValue.flatMap(URL.init(string:)),
            interval: .milliseconds(Int64(interval * 1000)), expiresIn: .milliseconds(Int64(expiresIn * 1000)),
            deviceCode: OAuthToken(deviceCode))
    }

    static func number(_ value: JSONValue?) -> Double? {
        switch value {
        case .number(let number)?: number
        case .string(let text)?: Double(text)
        default: nil
        }
    }
}
