/// Why a call to the identity provider, or a token check, failed.
///
/// Callers branch on ``code``; new codes may be added without breaking them. Each code names one
/// outcome the daemon treats differently (suspend unlock, retry with backoff, refuse the login,
/// report a configuration fault), so each maps to exactly one named error of the socket API.
public struct IdentityError: Error, Sendable, CustomStringConvertible {
    /// The kind of failure.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Base: String, Hashable, Sendable {
            case invalidCredentials
            case refreshRejected
            case unreachable
            case timedOut
            case connectionLost
            case serverError
            case notAdmitted
            case unknownRole
            case invalidToken
            case clientRejected
            case requestRejected
            case invalidResponse
            case authorizationDenied
            case deviceCodeExpired
            case unsupported
            case misconfigured
        }

        fileprivate let base: Base

        /// The email/password pair was refused (`invalid_grant` on the password grant; a disabled
        /// account looks the same).
        public static let invalidCredentials = Code(base: .invalidCredentials)
        /// The refresh token was refused (`invalid_grant` on refresh): revoked, expired, reused
        /// after rotation, or its user disabled. The caller suspends local unlock until the
        /// person's next online login.
        public static let refreshRejected = Code(base: .refreshRejected)
        /// No connection could be made (refused, no route, name not found). The request never
        /// reached the provider.
        public static let unreachable = Code(base: .unreachable)
        /// No complete answer within the configured request timeout (a hung or stopped server).
        /// See ``IdentityError/isAmbiguous`` for whether the request may have been acted on.
        public static let timedOut = Code(base: .timedOut)
        /// The connection broke before an answer arrived. See ``IdentityError/isAmbiguous``.
        public static let connectionLost = Code(base: .connectionLost)
        /// The provider answered with a server error (5xx) or asked to slow down (429).
        public static let serverError = Code(base: .serverError)
        /// The provider authenticated the person, but the configuration does not admit them
        /// (email domain or group allow-list).
        public static let notAdmitted = Code(base: .notAdmitted)
        /// The role claim is missing or names a role this terminal does not know. Roles are
        /// never guessed.
        public static let unknownRole = Code(base: .unknownRole)
        /// A token failed validation: signature, issuer, audience, lifetime, type or format.
        public static let invalidToken = Code(base: .invalidToken)
        /// The provider refused this client (`invalid_client`, `unauthorized_client`): the
        /// client id or secret is wrong.
        public static let clientRejected = Code(base: .clientRejected)
        /// The provider refused the request as malformed or unsupported (`invalid_request`,
        /// `invalid_scope`, `unsupported_grant_type`, an unexpected status).
        public static let requestRejected = Code(base: .requestRejected)
        /// The provider's answer could not be understood (not JSON, missing fields, too large,
        /// a discovery document for another issuer).
        public static let invalidResponse = Code(base: .invalidResponse)
        /// The person declined the device authorization (`access_denied`).
        public static let authorizationDenied = Code(base: .authorizationDenied)
        /// The device code expired or is unknown; start a new device authorization.
        public static let deviceCodeExpired = Code(base: .deviceCodeExpired)
        /// The configured provider cannot do this: no such endpoint in discovery or
        /// configuration, or a grant the dialect lacks (Supabase has no device grant).
        public static let unsupported = Code(base: .unsupported)
        /// The configuration is inconsistent or unsafe (Supabase dialect without Supabase
        /// settings, a plain-HTTP endpoint that is not loopback, a secret that is not text).
        public static let misconfigured = Code(base: .misconfigured)

        /// The code's name, for logs.
        public var description: String { base.rawValue }
    }

    /// What went wrong.
    public let code: Code
    /// A sentence for logs. Never contains a token, password or secret.
    public let message: String
    /// Whether the request may have reached the provider and been acted on although no answer
    /// arrived: the request was handed to an established connection before the timeout or the
    /// connection loss. A refresh that fails ambiguously may have rotated the refresh token at
    /// the provider, so a later `invalid_grant` for the old token is not proof of revocation.
    public let isAmbiguous: Bool
    /// The OAuth `error` code or HTTP status the provider sent, when it sent one.
    public let providerError: String?
    /// The lower-level error, if any.
    public let underlying: (any Error)?
    /// Where the error was raised.
    public let fileID: String
    /// Where the error was raised.
    public let line: Int

    init(
        _ code: Code, _ message: String, isAmbiguous: Bool = false, providerError: String? = nil,
        underlying: (any Error)? = nil, fileID: String = #fileID, line: Int = #line
    ) {
        self.code = code
        self.message = message
        self.isAmbiguous = isAmbiguous
        self.providerError = providerError
        self.underlying = underlying
        self.fileID = fileID
        self.line = line
    }

    /// Whether trying again later may succeed without anyone changing anything: the provider
    /// was unreachable, slow or failing, not refusing.
    public var isTransient: Bool {
        switch code.base {
        case .unreachable, .timedOut, .connectionLost, .serverError: true
        default: false
        }
    }

    /// A refresh answered for another subject than the person's: a refusal.
    public static func subjectChanged(_ message: String) -> IdentityError {
        IdentityError(.notAdmitted, message)
    }

    /// A one-line summary for logs.
    public var description: String {
        var text = "IdentityError.\(code): \(message)"
        if let providerError { text += " [provider: \(providerError)]" }
        if isAmbiguous { text += " (ambiguous: the request may have been processed)" }
        return text
    }
}
