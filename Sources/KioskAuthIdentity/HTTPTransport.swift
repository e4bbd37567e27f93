import Dispatch
import Foundation
import Synchronization

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

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
        // Sorted keys: the body is deterministic, which the request-shape tests rely on.
        let body = try! JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        return HTTPRequest(method: "POST", url: url, headers: all, body: body)
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
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }
}

/// HTTP over Foundation's `URLSession` with a hard deadline per request.
///
/// Tasks are driven through a session delegate rather than completion handlers because only
/// the delegate learns when the request body was handed to an established connection
/// (`didSendBodyData`); that is what tells a lost answer (ambiguous: the provider may have
/// acted) from a request that never left (safe to retry).
final class HTTPTransport: Sendable {
    /// Words for a transport failure; never a platform error number.
    static func reason(_ code: URLError.Code) -> String {
        switch code {
        case .cannotConnectToHost: "connection refused"
        case .timedOut: "timed out"
        case .cannotFindHost, .dnsLookupFailed: "name not found"
        case .notConnectedToInternet, .dataNotAllowed, .internationalRoamingOff, .callIsActive: "no network"
        case .secureConnectionFailed, .serverCertificateUntrusted, .serverCertificateHasBadDate,
            .serverCertificateNotYetValid, .serverCertificateHasUnknownRoot, .clientCertificateRejected,
            .clientCertificateRequired, .appTransportSecurityRequiresSecureConnection:
            "TLS failure"
        case .networkConnectionLost: "connection lost"
        case .badServerResponse, .cannotParseResponse: "the answer was not HTTP"
        default: "network failure"
        }
    }

    /// Answers larger than this are cut off and refused.
    static let maximumResponseSize = 1 << 20

    private let session: URLSession
    private let router: SessionDelegate

    init() {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpCookieStorage = nil
        configuration.httpShouldSetCookies = false
        configuration.urlCache = nil
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        let queue = OperationQueue()
        queue.maxConcurrentOperationCount = 1
        queue.name = "KioskAuthIdentity.HTTPTransport"
        router = SessionDelegate()
        session = URLSession(configuration: configuration, delegate: router, delegateQueue: queue)
    }

    deinit {
        session.invalidateAndCancel()
    }

    /// Sends `request`; the whole exchange (connection, request, answer) must finish within
    /// `timeout`.
    func send(_ request: HTTPRequest, timeout: Duration) async throws -> HTTPResponse {
        var urlRequest = URLRequest(url: request.url)
        urlRequest.httpMethod = request.method
        // URLSession's own timeout is an idle timeout; the deadline below is the real limit,
        // so this one is only a backstop.
        urlRequest.timeoutInterval = timeout.timeInterval + 1
        for (name, value) in request.headers {
            urlRequest.setValue(value, forHTTPHeaderField: name)
        }
        let task: URLSessionTask =
            if let body = request.body {
                session.uploadTask(with: urlRequest, from: body)
            } else {
                session.dataTask(with: urlRequest)
            }
        let exchange = Exchange(hasBody: request.body != nil)
        try Task.checkCancellation()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                exchange.begin(continuation)
                router.register(exchange, for: task.taskIdentifier)
                DispatchQueue.global().asyncAfter(deadline: .now() + timeout.timeInterval) {
                    if exchange.markTimedOut() { task.cancel() }
                }
                task.resume()
            }
        } onCancel: {
            exchange.markCancelled()
            task.cancel()
        }
    }
}

/// The state of one request, shared between the caller and the delegate queue.
private final class Exchange: Sendable {
    private struct State {
        var continuation: CheckedContinuation<HTTPResponse, any Error>?
        var response: HTTPURLResponse?
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

    func begin(_ continuation: CheckedContinuation<HTTPResponse, any Error>) {
        state.withLock { $0.continuation = continuation }
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

    func didSendBody() {
        state.withLock { $0.isBodySent = true }
    }

    func didReceive(_ response: URLResponse) {
        state.withLock { $0.response = response as? HTTPURLResponse }
    }

    /// Returns `false` once the answer grew too large (the caller then cancels the task).
    func didReceive(_ data: Data) -> Bool {
        state.withLock { state in
            guard state.body.count + data.count <= HTTPTransport.maximumResponseSize else {
                state.isTooLarge = true
                return false
            }
            state.body.append(data)
            return true
        }
    }

    func finish(error: (any Error)?) {
        let (continuation, result): (CheckedContinuation<HTTPResponse, any Error>?, Result<HTTPResponse, any Error>) =
            state.withLock { state in
                state.isFinished = true
                let continuation = state.continuation
                state.continuation = nil
                return (continuation, Self.outcome(of: state, error: error, hasBody: hasBody))
            }
        continuation?.resume(with: result)
    }

    private static func outcome(of state: State, error: (any Error)?, hasBody: Bool) -> Result<HTTPResponse, any Error>
    {
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
        if let error {
            return .failure(classify(error, sent: sent))
        }
        guard let response = state.response else {
            return .failure(
                IdentityError(.connectionLost, "the connection closed without an answer", isAmbiguous: sent))
        }
        var headers: [String: String] = [:]
        for case (let name as String, let value as String) in response.allHeaderFields {
            headers[name.lowercased()] = value
        }
        return .success(HTTPResponse(status: response.statusCode, body: state.body, headers: headers))
    }

    private static func classify(_ error: any Error, sent: Bool) -> IdentityError {
        guard let urlError = error as? URLError else {
            return IdentityError(
                sent ? .connectionLost : .unreachable, "the request failed: \(error)", isAmbiguous: sent,
                underlying: error)
        }
        let reason = HTTPTransport.reason(urlError.code)
        switch urlError.code {
        case .timedOut:
            return IdentityError(
                .timedOut, "cannot reach the identity provider (timed out)", isAmbiguous: sent, underlying: error)
        case .cannotConnectToHost, .cannotFindHost, .dnsLookupFailed, .notConnectedToInternet, .cannotLoadFromNetwork,
            .internationalRoamingOff, .dataNotAllowed, .callIsActive, .secureConnectionFailed,
            .serverCertificateUntrusted, .serverCertificateHasBadDate, .serverCertificateNotYetValid,
            .serverCertificateHasUnknownRoot, .clientCertificateRejected, .clientCertificateRequired,
            .appTransportSecurityRequiresSecureConnection:
            return IdentityError(.unreachable, "cannot reach the identity provider (\(reason))", underlying: error)
        default:
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

/// Routes the session's delegate calls to each task's ``Exchange``.
private final class SessionDelegate: NSObject, URLSessionDataDelegate, Sendable {
    private let exchanges = Mutex<[Int: Exchange]>([:])

    func register(_ exchange: Exchange, for taskIdentifier: Int) {
        exchanges.withLock { $0[taskIdentifier] = exchange }
    }

    private func exchange(for task: URLSessionTask) -> Exchange? {
        exchanges.withLock { $0[task.taskIdentifier] }
    }

    func urlSession(
        _ session: URLSession, task: URLSessionTask, didSendBodyData bytesSent: Int64, totalBytesSent: Int64,
        totalBytesExpectedToSend: Int64
    ) {
        exchange(for: task)?.didSendBody()
    }

    func urlSession(
        _ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
        completionHandler: @escaping (URLSession.ResponseDisposition) -> Void
    ) {
        exchange(for: dataTask)?.didReceive(response)
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        if exchange(for: dataTask)?.didReceive(data) == false {
            dataTask.cancel()
        }
    }

    func urlSession(
        _ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
        newRequest request: URLRequest, completionHandler: @escaping (URLRequest?) -> Void
    ) {
        // Token and revocation endpoints never redirect; a redirect is answered as received.
        completionHandler(nil)
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        let exchange = exchanges.withLock { $0.removeValue(forKey: task.taskIdentifier) }
        exchange?.finish(error: error)
    }
}
