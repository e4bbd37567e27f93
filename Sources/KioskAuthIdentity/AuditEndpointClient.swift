public import FoundationEssentials

// The HTTP side of audit delivery: one POST of a JSON batch to the organisation's collector. It
// lives beside the identity provider client because this module owns the daemon's one HTTP
// transport (async-http-client with a hard deadline per request, and the knowledge of whether a request
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

    /// The longest `Retry-After` taken from an answer (a day); a longer one is read as this. The
    /// schedule caps the wait far lower anyway (`MaximumBackoffSec`), but the figure is shown
    /// and computed with first: an endpoint's `Retry-After: 9223372036854775807` trapped the
    /// daemon formatting it.
    static let longestRetryAfter: Int64 = 86_400

    /// `Retry-After` as delay-seconds or an HTTP date, at most `longestRetryAfter`; nil when
    /// absent or unreadable.
    static func retryAfter(_ value: String?, now: Date) -> Duration? {
        let blank: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let value = value.map({ String($0.drop(while: blank).reversed().drop(while: blank).reversed()) }),
            !value.isEmpty
        else { return nil }
        if value.utf8.allSatisfy({ (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }) {
            // Digits only, any number of them: too many for an Int is as long as the longest.
            return .seconds(Int64(value).map { min($0, longestRetryAfter) } ?? longestRetryAfter)
        }
        guard let date = httpDate(value) else { return nil }
        let wait = date.timeIntervalSince(now).rounded(.up)
        return .seconds(Int64(min(max(0, wait), Double(longestRetryAfter))))
    }

    /// An HTTP date in the preferred format of RFC 9110 (IMF-fixdate,
    /// `Sun, 06 Nov 1994 08:49:37 GMT`); nil for anything else.
    static func httpDate(_ text: String) -> Date? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: false)
        let days = ["Mon,", "Tue,", "Wed,", "Thu,", "Fri,", "Sat,", "Sun,"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        guard parts.count == 6, days.contains(String(parts[0])), parts[5] == "GMT",
            parts[1].count == 2, let day = Int(parts[1]), (1...31).contains(day),
            let monthIndex = months.firstIndex(of: String(parts[2])),
            parts[3].count == 4, let year = Int(parts[3]), year >= 1970
        else { return nil }
        let clock = parts[4].split(separator: ":", omittingEmptySubsequences: false)
        guard clock.count == 3, clock.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isASCII) }),
            let hour = Int(clock[0]), let minute = Int(clock[1]), let second = Int(clock[2]),
            (0..<24).contains(hour), (0..<60).contains(minute), (0...60).contains(second)
        else { return nil }
        // Days since 1970-01-01 in the proleptic Gregorian calendar (H. Hinnant's days_from_civil).
        let month = monthIndex + 1
        let shifted = month <= 2 ? year - 1 : year
        let era = shifted / 400
        let yearOfEra = shifted - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        let epochDays = era * 146_097 + dayOfEra - 719_468
        let seconds = ((epochDays * 24 + hour) * 60 + minute) * 60 + second
        return Date(timeIntervalSince1970: Double(seconds))
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
        guard let error = error as? TransportError else { return "the connection failed" }
        switch error.code {
        case .cannotConnectToHost: return "connection refused or not permitted"
        case .cannotFindHost, .dnsLookupFailed: return "host name not found"
        case .notConnectedToInternet: return "no network"
        case .networkConnectionLost: return "the connection was lost"
        case .timedOut: return "timed out"
        case .serverCertificateUntrusted: return "TLS failed (the endpoint's certificate is not trusted)"
        case .secureConnectionFailed: return "TLS failed (handshake)"
        case .badServerResponse: return "the answer was not HTTP"
        case .unknown: return "the connection failed"
        }
    }

    /// Seconds to a tenth ("2", "0.5"), in integers on the duration's parts: no duration, however
    /// long, traps in a conversion (`Int(Double)` did, at 2^63 s).
    private static func seconds(_ duration: Duration) -> String {
        let parts = duration.components
        let tenths = (abs(parts.attoseconds) + 50_000_000_000_000_000) / 100_000_000_000_000_000  // 0...10
        let whole = parts.seconds &+ tenths / 10
        return tenths % 10 == 0 ? "\(whole)" : "\(whole).\(tenths % 10)"
    }
}
