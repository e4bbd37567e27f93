import AsyncHTTPClient
import FoundationEssentials
import KioskAuthProtocol
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// One HTTP request to the provider.
struct HTTPRequest: Sendable {
    var method: String
    var url: URL
    var headers: [String: String]
    var body: Data?

    static func get(_ url: URL, headers: [String: String] = [:]) -> HTTPRequest {
        HTTPRequest(
            method: "GET", url: url, headers: headers.merging(["Accept": "application/json"]) { a, _ in a }, body: nil)
    }

    static func postForm(_ url: URL, _ fields: [(String, String)], headers: [String: String] = [:]) -> HTTPRequest {
        var all = headers
        all["Content-Type"] = "application/x-www-form-urlencoded"
        all["Accept"] = "application/json"
        return HTTPRequest(method: "POST", url: url, headers: all, body: Data(FormEncoding.encode(fields).utf8))
    }

    static func postJSON(_ url: URL, _ object: [String: String], headers: [String: String] = [:]) -> HTTPRequest {
        var all = headers
        all["Content-Type"] = "application/json"
        all["Accept"] = "application/json"
        // Sorted keys: the body is deterministic, which the request-shape tests rely on. Strings
        // are always finite, so writing cannot fail.
        let body = try! JSONValue.object(object.mapValues { .string($0) }).serialized()
        return HTTPRequest(method: "POST", url: url, headers: all, body: Data(body))
    }
}

/// The provider's answer.
struct HTTPResponse: Sendable {
    var status: Int
    var body: Data
    /// Header fields, names lowercased.
    var headers: [String: String] = [:]
}

/// `application/x-www-form-urlencoded` (the WHATWG serialisation: unreserved bytes as is,
/// space as `+`, everything else percent-encoded).
enum FormEncoding {
    static func encode(_ fields: [(String, String)]) -> String {
        fields.map { "\(escape($0.0))=\(escape($0.1))" }.joined(separator: "&")
    }

    static func escape(_ text: String) -> String {
        var out = ""
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "*"):
                out.unicodeScalars.append(UnicodeScalar(byte))
            case UInt8(ascii: " "):
                out += "+"
            default:
                let digits = Array("0123456789ABCDEF".unicodeScalars)
                out.unicodeScalars.append("%")
                out.unicodeScalars.append(digits[Int(byte >> 4)])
                out.unicodeScalars.append(digits[Int(byte & 0x0F)])
            }
        }
        return out
    }
}

/// How a request failed below HTTP: the transport's own codes, so that nothing above it
/// depends on the client library's error types.
struct TransportError: Error, Sendable, Hashable, CustomStringConvertible {
    enum Code: Sendable, Hashable {
        /// The connection was refused or not permitted.
        case cannotConnectToHost
        /// No answer in time (the connection, the TLS handshake or the answer).
        case timedOut
        /// The host name did not resolve.
        case cannotFindHost
        /// The resolver failed.
        case dnsLookupFailed
        /// No route to the host or network.
        case notConnectedToInternet
        /// The TLS handshake failed for another reason than the certificate.
        case secureConnectionFailed
        /// The server's certificate is not trusted (chain, name or dates).
        case serverCertificateUntrusted
        /// The connection closed or broke during the exchange.
        case networkConnectionLost
        /// The answer was not HTTP.
        case badServerResponse
        /// Anything else.
        case unknown
    }

    let code: Code
    /// The library's words, for the journal; never shown without the code's own words.
    let detail: String

    init(_ code: Code, detail: String = "") {
        self.code = code
        self.detail = detail
    }

    var description: String { detail.isEmpty ? HTTPTransport.reason(code) : "\(HTTPTransport.reason(code)): \(detail)" }
}

/// HTTP/1.1 over async-http-client (SwiftNIO, with TLS from swift-nio-ssl's BoringSSL against
/// the system's trust roots) with a hard deadline per request.
///
/// Requests go through a response delegate rather than the collected-response API because only
/// the delegate learns when the request was written to an established connection
/// (`didSendRequest`); that is what tells a lost answer (ambiguous: the provider may have acted)
/// from a request that never left (safe to retry). Each request gets its own connection: a
/// pooled connection that the server closed while idle would turn a POST that never reached it
/// into an ambiguous one.
final class HTTPTransport: Sendable {
    /// Words for a transport failure; never a platform error number.
    static func reason(_ code: TransportError.Code) -> String {
        switch code {
        case .cannotConnectToHost: "connection refused"
        case .timedOut: "timed out"
        case .cannotFindHost, .dnsLookupFailed: "name not found"
        case .notConnectedToInternet: "no network"
        case .secureConnectionFailed, .serverCertificateUntrusted: "TLS failure"
        case .networkConnectionLost: "connection lost"
        case .badServerResponse: "the answer was not HTTP"
        case .unknown: "network failure"
        }
    }

    /// Answers larger than this are cut off and refused.
    static let maximumResponseSize = 1 << 20

    /// One event-loop thread for all HTTP in the process, made on first use (a daemon without
    /// an identity provider or audit endpoint never starts it).
    private static let eventLoops = MultiThreadedEventLoopGroup(numberOfThreads: 1)

    /// The process's one client; never shut down (it lives as long as the process).
    private static let client: HTTPClient = {
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: TLSConfiguration.makeClientConfiguration(),
            // Token and revocation endpoints never redirect; a redirect is answered as received.
            redirectConfiguration: .disallow,
            // The per-request deadline below is the real limit; these are backstops.
            timeout: .init(connect: .seconds(120), read: nil),
            proxy: nil,
            decompression: .disabled)
        configuration.connectionPool.idleTimeout = .seconds(1)
        configuration.maximumUsesPerConnection = 1
        // A refused connection is an answer: say so at once rather than retry until the deadline.
        configuration.connectionPool.retryConnectionEstablishment = false
        configuration.httpVersion = .http1Only
        return HTTPClient(eventLoopGroup: eventLoops, configuration: configuration)
    }()

    /// Tests only: how long the caller's task takes to run again once the exchange has ended,
    /// as on a machine so busy that the answer waits for a thread.
    private let lateResume: Duration

    init(lateResumeForTesting lateResume: Duration = .zero) {
        self.lateResume = lateResume
    }

    /// Sends `request`; the whole exchange (connection, request, answer) must finish within
    /// `timeout`.
    func send(_ request: HTTPRequest, timeout: Duration) async throws -> HTTPResponse {
        var headers = HTTPHeaders()
        for (name, value) in request.headers.sorted(by: { $0.key < $1.key }) {
            headers.add(name: name, value: value)
        }
        let clientRequest: HTTPClient.Request
        do {
            clientRequest = try HTTPClient.Request(
                url: request.url, method: HTTPMethod(rawValue: request.method), headers: headers,
                body: request.body.map { .bytes(Array($0)) })
        } catch {
            throw IdentityError(.misconfigured, "cannot make a request to \(request.url.absoluteString): \(error)")
        }
        let exchange = Exchange(hasBody: request.body != nil)
        try Task.checkCancellation()
        let eventLoop = Self.eventLoops.next()
        let delegate = ResponseDelegate(exchange)
        // A backstop only: the scheduled cut below ends the exchange first.
        let task = Self.client.execute(
            request: clientRequest, delegate: delegate, eventLoop: .delegate(on: eventLoop),
            deadline: .now() + TimeAmount(timeout) + .seconds(1))
        let cut = eventLoop.scheduleTask(in: TimeAmount(timeout)) {
            if exchange.markTimedOut() { task.cancel() }
        }
        // The outcome is settled on the event loop the moment the client's task ends, in order
        // with the cut above: an answer (or a refusal) that came within the timeout stays what it
        // was however late this task runs again. Settled here when this task resumed, a token
        // endpoint's answer, with a rotated refresh token in it, could be thrown away as a
        // timeout on a busy machine.
        let settled = task.futureResult
            .map { Result<HTTPResponse, any Error>.success($0) }
            .recover { .failure($0) }
            .map { exchange.outcome($0) }
        let lateResume = lateResume
        return try await withTaskCancellationHandler {
            let outcome = try await settled.get()
            if lateResume > .zero { try? await Task.sleep(for: lateResume) }
            cut.cancel()
            return try outcome.get()
        } onCancel: {
            exchange.markCancelled()
            task.cancel()
        }
    }
}

extension TimeAmount {
    fileprivate init(_ duration: Duration) {
        let parts = duration.components
        self = .nanoseconds(parts.seconds * 1_000_000_000 + parts.attoseconds / 1_000_000_000)
    }
}

/// The state of one request, shared between the caller and the event loop.
private final class Exchange: Sendable {
    private struct State {
        var status: Int?
        var headers: [String: String] = [:]
        var body = Data()
        var isBodySent = false
        var isTimedOut = false
        var isCancelled = false
        var isTooLarge = false
        var isFinished = false
    }

    private let state = Mutex(State())
    private let hasBody: Bool

    init(hasBody: Bool) {
        self.hasBody = hasBody
    }

    /// Returns whether the task still needs cancelling.
    func markTimedOut() -> Bool {
        state.withLock { state in
            guard !state.isFinished else { return false }
            state.isTimedOut = true
            return true
        }
    }

    func markCancelled() {
        state.withLock { $0.isCancelled = true }
    }

    func didSendRequest() {
        state.withLock { $0.isBodySent = true }
    }

    func didReceive(_ head: HTTPResponseHead) {
        var headers: [String: String] = [:]
        for (name, value) in head.headers {
            let key = name.lowercased()
            headers[key] = headers[key].map { "\($0), \(value)" } ?? value
        }
        state.withLock { state in
            state.status = Int(head.status.code)
            state.headers = headers
        }
    }

    /// Returns `false` once the answer grew too large (the caller then cancels the task).
    func didReceive(_ buffer: ByteBuffer) -> Bool {
        state.withLock { state in
            guard state.body.count + buffer.readableBytes <= HTTPTransport.maximumResponseSize else {
                state.isTooLarge = true
                return false
            }
            buffer.withUnsafeReadableBytes { state.body.append(contentsOf: $0) }
            return true
        }
    }

    /// The collected answer, when the exchange completed.
    func response() throws -> HTTPResponse {
        try state.withLock { state in
            guard let status = state.status else { throw TransportError(.badServerResponse) }
            return HTTPResponse(status: status, body: state.body, headers: state.headers)
        }
    }

    /// What the caller gets, given how the client's task ended.
    func outcome(_ result: Result<HTTPResponse, any Error>) -> Result<HTTPResponse, any Error> {
        state.withLock { state in
            state.isFinished = true
            return Self.outcome(of: state, result: result, hasBody: hasBody)
        }
    }

    private static func outcome(
        of state: State, result: Result<HTTPResponse, any Error>, hasBody: Bool
    ) -> Result<HTTPResponse, any Error> {
        let sent = hasBody && state.isBodySent
        if state.isTooLarge {
            return .failure(
                IdentityError(.invalidResponse, "the answer is larger than \(HTTPTransport.maximumResponseSize) bytes"))
        }
        if state.isTimedOut {
            let message =
                sent
                ? "cannot reach the identity provider (timed out: no answer within the request timeout; the request was sent)"
                : hasBody
                    ? "cannot reach the identity provider (timed out: no connection within the request timeout)"
                    : "cannot reach the identity provider (timed out: no answer within the request timeout)"
            return .failure(IdentityError(.timedOut, message, isAmbiguous: sent))
        }
        if state.isCancelled {
            return .failure(CancellationError())
        }
        switch result {
        case .success(let response):
            return .success(response)
        case .failure(let error):
            return .failure(classify(TransportError(error), sent: sent))
        }
    }

    private static func classify(_ error: TransportError, sent: Bool) -> IdentityError {
        let reason = HTTPTransport.reason(error.code)
        switch error.code {
        case .timedOut:
            return IdentityError(
                .timedOut, "cannot reach the identity provider (timed out)", isAmbiguous: sent, underlying: error)
        case .cannotConnectToHost, .cannotFindHost, .dnsLookupFailed, .notConnectedToInternet, .secureConnectionFailed,
            .serverCertificateUntrusted:
            return IdentityError(.unreachable, "cannot reach the identity provider (\(reason))", underlying: error)
        case .networkConnectionLost, .badServerResponse, .unknown:
            if sent {
                return IdentityError(
                    .connectionLost,
                    "the connection to the identity provider broke after the request was sent (\(reason))",
                    isAmbiguous: true, underlying: error)
            }
            return IdentityError(.unreachable, "cannot reach the identity provider (\(reason))", underlying: error)
        }
    }
}

extension TransportError {
    /// The transport's code for an error from async-http-client, SwiftNIO or swift-nio-ssl.
    init(_ error: any Error) {
        switch error {
        case let error as TransportError:
            self = error
        case let error as NIOConnectionError:
            // Every address failed: by the first connection error, or by the resolver when no
            // address was found.
            if let first = error.connectionErrors.first {
                self = TransportError(first.error)
            } else if error.dnsAError != nil || error.dnsAAAAError != nil {
                self.init(.cannotFindHost, detail: "\(error)")
            } else {
                self.init(.cannotFindHost, detail: "no address for \(error.host)")
            }
        case let error as IOError:
            switch error.errnoCode {
            case ECONNREFUSED, EACCES, EPERM: self.init(.cannotConnectToHost, detail: "\(error)")
            case ENETUNREACH, EHOSTUNREACH, ENETDOWN, EHOSTDOWN, EADDRNOTAVAIL:
                self.init(.notConnectedToInternet, detail: "\(error)")
            case ETIMEDOUT: self.init(.timedOut, detail: "\(error)")
            default: self.init(.networkConnectionLost, detail: "\(error)")
            }
        case let error as HTTPClientError:
            switch error {
            case .connectTimeout, .readTimeout, .writeTimeout, .deadlineExceeded, .tlsHandshakeTimeout,
                .getConnectionFromPoolTimeout:
                self.init(.timedOut, detail: "\(error)")
            case .remoteConnectionClosed, .uncleanShutdown, .cancelled:
                self.init(.networkConnectionLost, detail: "\(error)")
            case .invalidURL, .emptyHost, .emptyScheme:
                self.init(.cannotFindHost, detail: "\(error)")
            default:
                self.init(.badServerResponse, detail: "\(error)")
            }
        case let error as NIOSSLError:
            switch error {
            case .handshakeFailed(let inner):
                let words = "\(inner)"
                self.init(
                    words.contains("CERTIFICATE") ? .serverCertificateUntrusted : .secureConnectionFailed,
                    detail: words)
            case .uncleanShutdown:
                self.init(.networkConnectionLost, detail: "\(error)")
            default:
                self.init(.secureConnectionFailed, detail: "\(error)")
            }
        case let error as NIOSSLExtraError:
            self.init(.serverCertificateUntrusted, detail: "\(error)")
        case is HTTPParserError:
            self.init(.badServerResponse, detail: "\(error)")
        case let error as ChannelError:
            switch error {
            case .connectTimeout: self.init(.timedOut, detail: "\(error)")
            default: self.init(.networkConnectionLost, detail: "\(error)")
            }
        default:
            self.init(.unknown, detail: "\(error)")
        }
    }
}

/// Feeds async-http-client's callbacks for one request into its ``Exchange``.
private final class ResponseDelegate: HTTPClientResponseDelegate {
    typealias Response = HTTPResponse

    private let exchange: Exchange

    init(_ exchange: Exchange) {
        self.exchange = exchange
    }

    func didSendRequest(task: HTTPClient.Task<HTTPResponse>) {
        exchange.didSendRequest()
    }

    func didReceiveHead(task: HTTPClient.Task<HTTPResponse>, _ head: HTTPResponseHead) -> EventLoopFuture<Void> {
        exchange.didReceive(head)
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didReceiveBodyPart(task: HTTPClient.Task<HTTPResponse>, _ buffer: ByteBuffer) -> EventLoopFuture<Void> {
        if !exchange.didReceive(buffer) {
            task.cancel()
        }
        return task.eventLoop.makeSucceededVoidFuture()
    }

    func didFinishRequest(task: HTTPClient.Task<HTTPResponse>) throws -> HTTPResponse {
        try exchange.response()
    }
}
