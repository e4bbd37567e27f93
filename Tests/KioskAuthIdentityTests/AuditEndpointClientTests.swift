import Foundation
import Testing

@testable import KioskAuthIdentity

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

private let now = Date(timeIntervalSince1970: 1_750_000_000)

private func answer(_ status: Int, _ headers: [String: String] = [:]) -> Result<Int, AuditEndpointFailure> {
    AuditEndpointClient.result(of: HTTPResponse(status: status, body: Data(), headers: headers), now: now)
}

private func kind(_ result: Result<Int, AuditEndpointFailure>) -> AuditEndpointFailure.Kind? {
    if case .failure(let failure) = result { return failure.kind }
    return nil
}

private func configuration(_ url: String, token: String? = nil) -> AuditEndpointClient.Configuration {
    AuditEndpointClient.Configuration(
        url: URL(string: url)!, bearerToken: token.map { CredentialSecret($0) }, requestTimeout: .seconds(5))
}

private func misconfiguration(_ configuration: AuditEndpointClient.Configuration) -> String? {
    do {
        _ = try AuditEndpointClient(configuration: configuration)
        return nil
    } catch {
        return error.code == .misconfigured ? error.message : "wrong code \(error.code)"
    }
}

@Suite("Audit endpoint client")
struct AuditEndpointClientTests {
    @Test(arguments: [200, 201, 202, 204, 299])
    func status2xx_isAccepted(status: Int) {
        #expect(answer(status) == .success(status))
    }

    @Test(arguments: [500, 502, 503, 504])
    func status5xx_isATransientServerError(status: Int) {
        #expect(kind(answer(status)) == .serverError)
    }

    @Test(arguments: [408, 429])
    func status408And429_areThrottling_notRefusals(status: Int) {
        #expect(kind(answer(status)) == .throttled)
    }

    @Test(arguments: [400, 401, 403, 404, 409, 410, 413, 422, 301, 302, 307, 100])
    func otherStatuses_areRefusals(status: Int) throws {
        let result = answer(status)
        #expect(kind(result) == .refused)
        if case .failure(let failure) = result {
            #expect(failure.isRefusal)
            #expect(failure.status == status)
            #expect(failure.message.contains("HTTP \(status)"))
        }
    }

    @Test func unauthorized_namesTheTokenCredential() {
        guard case .failure(let failure) = answer(401) else {
            Issue.record("401 accepted")
            return
        }
        #expect(failure.message.contains("TokenCredential="))
    }

    @Test func retryAfter_inSeconds_andAsAnHTTPDate() {
        guard case .failure(let seconds) = answer(429, ["retry-after": "120"]),
            case .failure(let date) = answer(503, ["retry-after": "Sun, 15 Jun 2025 15:07:00 GMT"]),
            case .failure(let junk) = answer(503, ["retry-after": "soon"])
        else {
            Issue.record("expected failures")
            return
        }
        #expect(seconds.retryAfter == .seconds(120))
        // 1_750_000_000 is 2025-06-15 15:06:40 UTC.
        #expect(date.retryAfter == .seconds(20))
        #expect(junk.retryAfter == nil)
        #expect(AuditEndpointClient.retryAfter("Sun, 15 Jun 2025 15:00:00 GMT", now: now) == .zero)
    }

    /// An endpoint (or anything posing as it) decides the header: no value may trap the daemon.
    /// `Retry-After: 9223372036854775807` did, formatting the wait for the message.
    @Test func retryAfter_ofAnyLength_isBoundedToADay_andSaidInWords() {
        let day = Duration.seconds(AuditEndpointClient.longestRetryAfter)
        for huge in ["9223372036854775807", "9223372036854775296", "99999999999999999999999999", "86401"] {
            guard case .failure(let failure) = answer(429, ["retry-after": huge]) else {
                Issue.record("expected a failure")
                return
            }
            #expect(failure.retryAfter == day, "\(huge)")
            #expect(failure.message == "the endpoint answered HTTP 429, retry after 86400 s", "\(huge)")
        }
        #expect(AuditEndpointClient.retryAfter("Fri, 31 Dec 9999 23:59:59 GMT", now: now) == day)
        #expect(AuditEndpointClient.retryAfter("0", now: now) == .zero)
        // delay-seconds is digits only (RFC 9110 §10.2.3): no sign, no fraction.
        for junk in ["+5", "-5", "1.5", "1e3", "٣"] {
            #expect(AuditEndpointClient.retryAfter(junk, now: now) == nil, "\(junk)")
        }
    }

    @Test func transportFailures_sayWhetherTheBatchMayHaveBeenStored() {
        let timeout = Duration.seconds(2)
        let hanging = AuditEndpointClient.failure(
            from: IdentityError(.timedOut, "x", isAmbiguous: true), timeout: timeout)
        #expect(hanging.kind == .timedOut)
        #expect(hanging.message.contains("the batch was sent"))
        let noConnection = AuditEndpointClient.failure(from: IdentityError(.timedOut, "x"), timeout: timeout)
        #expect(noConnection.message == "no connection within 2 s")
        let lost = AuditEndpointClient.failure(
            from: IdentityError(.connectionLost, "x", isAmbiguous: true), timeout: timeout)
        #expect(lost.kind == .responseLost)
        let refused = AuditEndpointClient.failure(
            from: IdentityError(.unreachable, "x", underlying: TransportError(.cannotConnectToHost)), timeout: timeout)
        #expect(refused.kind == .unreachable)
        #expect(refused.message == "cannot connect: connection refused or not permitted")
        // The transport's wording is about the identity provider; none of it leaks through.
        #expect(!refused.message.contains("identity provider"))
    }

    @Test func configuration_requiresHTTPSExceptOnLoopback() {
        #expect(misconfiguration(configuration("https://audit.example/v1")) == nil)
        #expect(misconfiguration(configuration("http://127.0.0.1:8080/in")) == nil)
        #expect(misconfiguration(configuration("http://[::1]:8080/in")) == nil)
        #expect(misconfiguration(configuration("http://localhost/in")) == nil)
        #expect(misconfiguration(configuration("http://audit.example/v1"))?.contains("neither https://") == true)
        #expect(misconfiguration(configuration("http://10.0.0.1/v1")) != nil)
        #expect(misconfiguration(configuration("ftp://audit.example/")) != nil)
    }

    @Test func configuration_refusesCredentialsInTheURL() {
        let message = misconfiguration(configuration("https://user:secret@audit.example/"))
        #expect(message?.contains("must not contain credentials") == true)
        #expect(message?.contains("secret") == false)
    }

    @Test func configuration_refusesATokenThatCouldForgeHeaders() {
        #expect(misconfiguration(configuration("https://a.example/", token: "abc.DEF-123_~+/=")) == nil)
        #expect(misconfiguration(configuration("https://a.example/", token: "abc\r\nX-Evil: 1")) != nil)
        #expect(misconfiguration(configuration("https://a.example/", token: "two words")) != nil)
        #expect(misconfiguration(configuration("https://a.example/", token: "")) != nil)
    }

    @Test func endpointHost_isTheHostAndAnExplicitPort_withoutPathOrQuery() throws {
        let plain = try AuditEndpointClient(configuration: configuration("https://audit.example/v1?tenant=7"))
        #expect(plain.endpointHost == "audit.example")
        let withPort = try AuditEndpointClient(configuration: configuration("http://127.0.0.1:8443/in"))
        #expect(withPort.endpointHost == "127.0.0.1:8443")
    }
}
