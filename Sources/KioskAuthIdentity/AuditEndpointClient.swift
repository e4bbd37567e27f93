public import Foundation

// The HTTP side of audit delivery: one POST of a JSON batch to the organisation's collector. It
// lives beside the identity provider client because this module owns the daemon's one HTTP
// transport (URLSession with a hard deadline per request, and the knowledge of whether a request
// body left before the connection broke). Decisions about retrying are the daemon's
// (AuditDeliverySchedule); this client only says how one request ended.

/// How one POST to the audit endpoint failed.
public struct AuditEndpointFailure: Error, Sendable, Hashable, CustomStringConvertible {
    /// The kind of failure.
    public enum Kind: String, Sendable, Hashable {
        /// No connection could be made (refused, not permitted, no route, name not found, TLS).
        /// The batch did not leave.
        case unreachable
        /// No answer within the request timeout (a hanging endpoint).
        case timedOut
        /// The connection broke after the batch was sent: the endpoint may have stored it.
        case responseLost
        /// A 5xx answer.
        case serverError
        /// 408 or 429: the endpoint asks to try again later.
        case throttled
        /// Any other answer that is not 2xx (4xx, a redirect): the endpoint refuses the batch as
        /// configured, and only an administrator can change that.
        case refused
    }

    /// The kind of failure.
    public let kind: Kind
    /// The HTTP status, when an answer arrived.
    public let status: Int?
    /// How long the endpoint asked to wait (`Retry-After`), when it did.
    public let retryAfter: Duration?
    /// One line for the journal and `kioskauthctl status`; never contains the token.
    public let message: String

    /// Creates a failure.
    public init(_ kind: Kind, status: Int? = nil, retryAfter: Duration? = nil, message: String) {
        self.kind = kind
        self.status = status
        self.retryAfter = retryAfter
        self.message = message
    }

    /// Whether the endpoint refused the batch (as opposed to failing in a way that may pass).
    public var isRefusal: Bool { kind == .refused }

    /// The message.
    public var description: String { message }
}

/// Posts audit batches to the configured endpoint over HTTPS (plain HTTP only to loopback).
public final class AuditEndpointClient: Sendable {
    /// What the client needs.
    public struct Configuration: Sendable {
        /// Where batches are POSTed.
        public var url: URL
        /// Sent as `Authorization: Bearer …` when set (read from a systemd credential).
        public var bearerToken: CredentialSecret?
        /// The longest one request may take, connection included.
        public var requestTimeout: Duration

        /// Creates a configuration.
        public init(url: URL, bearerToken: CredentialSecret?, requestTimeout: Duration) {
            self.url = url
            self.bearerToken = bearerToken
            self.requestTimeout = requestTimeout
        }
    }

    private let configuration: Configuration
    private let authorization: String?
    private let transport = HTTPTransport()

    /// Whether `url` may receive audit events: HTTPS anywhere, HTTP only on loopback.
    public static func isAcceptable(_ url: URL) -> Bool {
        IdentityProviderClient.isAcceptable(url) && url.host?.isEmpty == false && url.user == nil
            && url.password == nil
    }

    /// Checks the configuration: an acceptable URL without credentials in it, and a token that
    /// can go in a header.
    ///
    /// - Throws: ``IdentityError`` with code `misconfigured`, saying what is wrong.
    public init(configuration: Configuration) throws(IdentityError) {
        let url = configuration.url
        if url.user != nil || url.password != nil {
            throw IdentityError(
                .misconfigured, "the endpoint URL must not contain credentials; use a bearer token credential")
        }
        guard Self.isAcceptable(url) else {
            throw IdentityError(
                .misconfigured,
                "\(url.absoluteString) is neither https:// nor http:// on loopback (127.0.0.1, ::1, localhost)")
        }
        self.configuration = configuration
        if let token = configuration.bearerToken {
            let text: String
            do { text = try token.withText { $0 } } catch {
                throw IdentityError(.misconfigured, "the bearer token is not valid UTF-8 text")
            }
            // Visible ASCII only: anything else could split or forge header lines.
            guard !text.isEmpty, text.utf8.allSatisfy({ (0x21...0x7e).contains($0) }) else {
                throw IdentityError(
                    .misconfigured, "the bearer token must be one line of visible ASCII characters without spaces")
            }
            authorization = "Bearer " + text
        } else {
            authorization = nil
        }
    }

    /// The endpoint's host, with the port when one is given: what an administrator needs to
    /// recognise it, without its path or query.
    public var endpointHost: String {
        let host = configuration.url.host ?? ""
        return configuration.url.port.map { "\(host):\($0)" } ?? host
    }

    /// POSTs one batch. `key` goes in the `Idempotency-Key` header.
    ///
    /// - Returns: the 2xx status, or how the request failed.
    /// - Throws: `CancellationError` only, when the calling task is cancelled.
    public func post(
        _ body: Data, key: String, now: @Sendable () -> Date = { Date() }
    ) async throws -> Result<
        Int, AuditEndpointFailure
    > {
        var headers = [
            "Content-Type": "application/json", "Accept": "application/json", "Idempotency-Key": key,
            "User-Agent": "kioskauthd-audit-delivery",
        ]
        if let authorization { headers["Authorization"] = authorization }
        let request = HTTPRequest(method: "POST", url: configuration.url, headers: headers, body: body)
        do {
            let response = try await transport.send(request, timeout: configuration.requestTimeout)
            return Self.result(of: response, now: now())
        } catch is CancellationError {
            throw CancellationError()
        } catch let error as IdentityError {
            return .failure(Self.failure(from: error, timeout: configuration.requestTimeout))
        } catch {
            return .failure(AuditEndpointFailure(.unreachable, message: "the request failed: \(type(of: error))"))
        }
    }

    /// What an answer means.
    static func result(of response: HTTPResponse, now: Date) -> Result<Int, AuditEndpointFailure> {
        let status = response.status
        let wait = retryAfter(response.headers["retry-after"], now: now)
        switch status {
        case 200..<300:
            return .success(status)
        case 408, 429:
            return .failure(
                AuditEndpointFailure(
                    .throttled, status: status, retryAfter: wait,
                    message:
                        "the endpoint answered HTTP \(status)\(wait.map { ", retry after \(seconds($0)) s" } ?? "")"))
        case 500..<600:
            return .failure(
                AuditEndpointFailure(
                    .serverError, status: status, retryAfter: wait,
                    message: "the endpoint answered HTTP \(status) (server error)"))
        case 300..<400:
            return .failure(
                AuditEndpointFailure(
                    .refused, status: status,
                    message:
                        "the endpoint answered HTTP \(status) (a redirect, which is not followed): set Endpoint= to the final URL"
                ))
        case 401, 403:
            return .failure(
                AuditEndpointFailure(
                    .refused, status: status,
                    message:
                        "the endpoint answered HTTP \(status): it does not accept the bearer token (TokenCredential=)"))
        default:
            return .failure(
                AuditEndpointFailure(
                    .refused, status: status,
                    message: "the endpoint refused the batch with HTTP \(status); it is retried, nothing is dropped"))
        }
    }

    /// `Retry-After` as delay-seconds or an HTTP date; nil when absent or unreadable.
    static func retryAfter(_ value: String?, now: Date) -> Duration? {
        guard let value = value?.trimmingCharacters(in: .whitespaces), !value.isEmpty else { return nil }
        if let seconds = Int(value), seconds >= 0 { return .seconds(seconds) }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.timeZone = TimeZone(identifier: "GMT")
        formatter.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        guard let date = formatter.date(from: value) else { return nil }
        return .seconds(max(0, date.timeIntervalSince(now).rounded(.up)))
    }

    /// A transport failure in the audit endpoint's words (the transport's own speak of the
    /// identity provider).
    static func failure(from error: IdentityError, timeout: Duration) -> AuditEndpointFailure {
        switch error.code {
        case .timedOut:
            return AuditEndpointFailure(
                .timedOut,
                message: error.isAmbiguous
                    ? "no answer within \(seconds(timeout)) s (the batch was sent; it is re-sent under the same ids)"
                    : "no connection within \(seconds(timeout)) s")
        case .connectionLost where error.isAmbiguous, .invalidResponse:
            return AuditEndpointFailure(
                .responseLost,
                message:
                    "the connection closed before an answer (the batch may have been stored; it is re-sent under the same ids)"
            )
        default:
            return AuditEndpointFailure(.unreachable, message: "cannot connect: \(reason(error.underlying))")
        }
    }

    private static func reason(_ error: (any Error)?) -> String {
        guard let error = error as? URLError else { return "the connection failed" }
        switch error.code {
        case .cannotConnectToHost: return "connection refused or not permitted"
        case .cannotFindHost, .dnsLookupFailed: return "host name not found"
        case .notConnectedToInternet: return "no network"
        case .networkConnectionLost: return "the connection was lost"
        case .timedOut: return "timed out"
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate,
            .serverCertificateNotYetValid, .serverCertificateHasUnknownRoot, .clientCertificateRejected,
            .clientCertificateRequired:
            return "TLS failed (certificate or protocol; URLError \(error.code.rawValue))"
        default: return "URLError \(error.code.rawValue)"
        }
    }

    private static func seconds(_ duration: Duration) -> String {
        let parts = duration.components
        let value = Double(parts.seconds) + Double(parts.attoseconds) * 1e-18
        return value == value.rounded() ? String(Int(value)) : String(format: "%.1f", value)
    }
}
