import Foundation
import Logging
import Testing

@testable import KioskAuthIdentity

#if canImport(Glibc)
    import Glibc
#endif

/// Against a real OAuth 2.0 / OIDC server: django-oauth-toolkit from PyPI, started from
/// `tests/idp/server.py` on a private loopback port for each test.
@Suite(
    "Identity provider client against django-oauth-toolkit",
    .serialized,
    .enabled(if: TestIdentityServer.isAvailable, TestIdentityServer.unavailableReason)
)
struct IdentityProviderIntegrationTests {
    static let sarah = (email: "sarah@clinic.example", password: "correct horse battery")
    static let users = [
        "\(sarah.email):\(sarah.password):caregiver:nurses,night",
        "bob@elsewhere.example:pw:caregiver:nurses",
        "jan@clinic.example:pw:janitor:nurses",
        "noor@clinic.example:pw::nurses",
    ]

    /// `timeout` is the client's request timeout. The tests of timeouts set their own; the others
    /// get 15 s, as a real deployment would: Django's password hashing alone can take seconds
    /// on a CI machine busy with the rest of the parallel run, and a flow test is not a test of
    /// the machine's speed.
    func withServer(
        extraArguments: [String] = [], timeout: Duration = .seconds(15), logs: CollectedLogs = CollectedLogs(),
        configure: (inout IdentityProviderConfiguration, TestIdentityServer) -> Void = { _, _ in },
        _ body: (IdentityProviderClient, TestIdentityServer) async throws -> Void
    ) async throws {
        let server = try await TestIdentityServer.start(users: Self.users, extraArguments: extraArguments)
        do {
            var configuration = IdentityProviderConfiguration(
                endpoints: .discovery(issuer: server.issuer), clientID: server.clientID,
                clientSecret: CredentialSecret(server.clientSecret), admission: .emailDomains(["clinic.example"]),
                requestTimeout: timeout)
            configure(&configuration, server)
            let client = try IdentityProviderClient(configuration: configuration, logger: logs.logger())
            try await body(client, server)
        } catch {
            await server.stop()
            throw error
        }
        await server.stop()
    }

    @discardableResult
    func expectCode(_ code: IdentityError.Code, _ body: () async throws -> Void) async -> IdentityError? {
        do {
            try await body()
            Issue.record("expected \(code), but the call succeeded")
            return nil
        } catch let error as IdentityError {
            #expect(error.code == code, "\(error)")
            return error
        } catch {
            Issue.record("expected IdentityError.\(code), got \(error)")
            return nil
        }
    }

    @Test func passwordLogin_rightPassword_returnsValidatedIdentityAndTokens() async throws {
        try await withServer { client, server in
            let before = Date()
            let result = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            #expect(result.identity.email == Self.sarah.email)
            #expect(result.identity.roles == ["caregiver"])
            #expect(result.identity.groups == ["night", "nurses"])
            #expect(result.identity.issuer == server.issuer.absoluteString)
            #expect(!result.identity.subject.isEmpty)
            #expect(result.tokens.refreshToken != nil)
            #expect(result.tokens.idToken != nil)
            let lifetime = result.tokens.accessTokenExpiresAt.timeIntervalSince(before)
            #expect(lifetime > 25 && lifetime < 35)
        }
    }

    @Test func logs_neverContainPasswordsTokensOrTheClientSecret() async throws {
        let logs = CollectedLogs()
        var secrets: [String] = [Self.sarah.password]
        try await withServer(logs: logs) { client, server in
            secrets.append(server.clientSecret)
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            let refreshed = try await client.refresh(refreshToken: login.tokens.refreshToken!)
            try await client.revoke(refreshToken: refreshed.tokens.refreshToken!)
            _ = try? await client.passwordLogin(email: Self.sarah.email, password: "wrong-\(Self.sarah.password)")
            for tokens in [login.tokens, refreshed.tokens] {
                secrets += [tokens.accessToken.rawValue, tokens.refreshToken!.rawValue, tokens.idToken!.rawValue]
            }
        }
        #expect(logs.all.count >= 5)
        for line in logs.all {
            for secret in secrets {
                #expect(!line.contains(secret), "a log line contains a secret: \(line)")
            }
        }
    }

    @Test func passwordLogin_wrongPassword_isInvalidCredentials() async throws {
        try await withServer { client, _ in
            let error = await expectCode(.invalidCredentials) {
                _ = try await client.passwordLogin(email: Self.sarah.email, password: "wrong")
            }
            #expect(error?.providerError == "invalid_grant")
            #expect(error?.isTransient == false)
            await expectCode(.invalidCredentials) {
                _ = try await client.passwordLogin(email: "nobody@clinic.example", password: "pw")
            }
        }
    }

    @Test func passwordLogin_domainNotAllowListed_isNotAdmitted() async throws {
        try await withServer { client, _ in
            await expectCode(.notAdmitted) {
                _ = try await client.passwordLogin(email: "bob@elsewhere.example", password: "pw")
            }
        }
    }

    @Test func passwordLogin_requiredGroupMissing_isNotAdmitted() async throws {
        try await withServer(configure: { configuration, _ in configuration.admission = .group("pharmacy") }) {
            client, _ in
            await expectCode(.notAdmitted) {
                _ = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            }
        }
    }

    @Test func passwordLogin_unknownOrMissingRoleClaim_isRefused() async throws {
        try await withServer { client, _ in
            await expectCode(.unknownRole) {
                _ = try await client.passwordLogin(email: "jan@clinic.example", password: "pw")
            }
            await expectCode(.unknownRole) {
                _ = try await client.passwordLogin(email: "noor@clinic.example", password: "pw")
            }
        }
    }

    @Test func refresh_rotatesTheRefreshToken_andReusingTheOldOneRevokesTheFamily() async throws {
        try await withServer { client, _ in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            let first = try #require(login.tokens.refreshToken)
            let refreshed = try await client.refresh(refreshToken: first)
            let second = try #require(refreshed.tokens.refreshToken)
            #expect(second != first)
            #expect(refreshed.identity?.subject == login.identity.subject)
            #expect(refreshed.policyViolation == nil)
            #expect(refreshed.tokens.accessToken != login.tokens.accessToken)

            // Reuse of the rotated-out token: refused, and the whole family dies with it.
            await expectCode(.refreshRejected) { _ = try await client.refresh(refreshToken: first) }
            await expectCode(.refreshRejected) { _ = try await client.refresh(refreshToken: second) }
        }
    }

    @Test func revoke_thenRefresh_isRefreshRejected() async throws {
        try await withServer { client, _ in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            let token = try #require(login.tokens.refreshToken)
            try await client.revoke(refreshToken: token)
            await expectCode(.refreshRejected) { _ = try await client.refresh(refreshToken: token) }
            // Revoking again (or revoking a token the provider never issued) is not an error.
            try await client.revoke(refreshToken: token)
            try await client.revoke(refreshToken: OAuthToken("never-issued"))
        }
    }

    @Test func revocationByTheAdmin_andDisabledUsers_areRefreshRejected() async throws {
        try await withServer { client, server in
            let a = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            try await server.control("revoke-user-tokens", ["email": Self.sarah.email])
            await expectCode(.refreshRejected) { _ = try await client.refresh(refreshToken: a.tokens.refreshToken!) }

            let b = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            try await server.control("update-user", ["email": Self.sarah.email, "active": false])
            await expectCode(.refreshRejected) { _ = try await client.refresh(refreshToken: b.tokens.refreshToken!) }
            await expectCode(.invalidCredentials) {
                _ = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            }
        }
    }

    @Test func refresh_afterTheRoleChangedToAnUnknownOne_reportsThePolicyViolation_andKeepsTheTokens() async throws {
        try await withServer { client, server in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            try await server.control("update-user", ["email": Self.sarah.email, "role": "janitor"])
            let refreshed = try await client.refresh(refreshToken: login.tokens.refreshToken!)
            #expect(refreshed.policyViolation?.code == .unknownRole)
            #expect(refreshed.identity?.roles == ["janitor"])
            #expect(refreshed.tokens.refreshToken != nil)
        }
    }

    @Test func deviceFlow_approvedThroughTheTestControl_logsIn() async throws {
        try await withServer { client, server in
            let authorization = try await client.startDeviceAuthorization()
            #expect(authorization.verificationURI.absoluteString == server.issuer.absoluteString + "/device/")
            #expect(authorization.verificationURIComplete?.absoluteString.contains(authorization.userCode) == true)
            #expect(authorization.interval == .seconds(1))
            #expect(authorization.expiresIn > .seconds(60))
            guard case .pending = try await client.pollDeviceAuthorization(authorization) else {
                Issue.record("expected authorization_pending before approval")
                return
            }
            try await server.control(
                "approve-device", ["user_code": authorization.userCode, "email": Self.sarah.email])
            let result = try await client.waitForDeviceAuthorization(authorization)
            #expect(result.identity.email == Self.sarah.email)
            #expect(result.identity.roles == ["caregiver"])
            #expect(result.tokens.refreshToken != nil)
            // A device code buys one login.
            await expectCode(.deviceCodeExpired) { _ = try await client.pollDeviceAuthorization(authorization) }
        }
    }

    @Test func deviceFlow_denied_isAuthorizationDenied() async throws {
        try await withServer { client, server in
            let authorization = try await client.startDeviceAuthorization()
            try await server.control(
                "approve-device", ["user_code": authorization.userCode, "email": Self.sarah.email, "deny": true])
            await expectCode(.authorizationDenied) { _ = try await client.pollDeviceAuthorization(authorization) }
        }
    }

    @Test func deviceFlow_personOutsideTheAllowList_isNotAdmitted() async throws {
        try await withServer { client, server in
            let authorization = try await client.startDeviceAuthorization()
            try await server.control(
                "approve-device", ["user_code": authorization.userCode, "email": "bob@elsewhere.example"])
            await expectCode(.notAdmitted) { _ = try await client.pollDeviceAuthorization(authorization) }
        }
    }

    @Test func discoveryWithoutRevocationEndpoint_needsTheOverride() async throws {
        try await withServer(extraArguments: ["--plain-discovery"]) { client, _ in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            await expectCode(.unsupported) { try await client.revoke(refreshToken: login.tokens.refreshToken!) }
            await expectCode(.unsupported) { _ = try await client.startDeviceAuthorization() }
        }
        try await withServer(
            extraArguments: ["--plain-discovery"],
            configure: { configuration, server in
                configuration.revocationEndpoint = server.issuer.appendingPathComponent("revoke_token/")
            }
        ) { client, _ in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            try await client.revoke(refreshToken: login.tokens.refreshToken!)
            await expectCode(.refreshRejected) {
                _ = try await client.refresh(refreshToken: login.tokens.refreshToken!)
            }
        }
    }

    @Test func serverError_isServerError_andTransient() async throws {
        try await withServer { client, server in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            try await server.control("fault", ["kind": "status", "status": 503])
            let error = await expectCode(.serverError) {
                _ = try await client.refresh(refreshToken: login.tokens.refreshToken!)
            }
            #expect(error?.isTransient == true)
            #expect(error?.isAmbiguous == false)
            // The refused request changed nothing: the same refresh token still works.
            _ = try await client.refresh(refreshToken: login.tokens.refreshToken!)
        }
    }

    @Test func serverKilled_connectionRefused_isUnreachable_fast() async throws {
        try await withServer(timeout: .seconds(5)) { client, server in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            await server.kill9()
            let started = ContinuousClock.now
            let error = await expectCode(.unreachable) {
                _ = try await client.refresh(refreshToken: login.tokens.refreshToken!)
            }
            let elapsed = ContinuousClock.now - started
            // Bounds are generous on purpose: the point is that nothing waits for a network timeout
            // (minutes), not how precise the deadline is on a loaded machine.
            #expect(elapsed < .seconds(5), "connection refused took \(elapsed)")
            #expect(error?.isAmbiguous == false)
            #expect(error?.isTransient == true)
        }
    }

    @Test func serverStopped_hangs_isTimedOut_withinTheConfiguredTimeout() async throws {
        let timeout = Duration.milliseconds(1500)
        try await withServer(timeout: timeout) { client, server in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            server.suspend()
            let started = ContinuousClock.now
            let error = await expectCode(.timedOut) {
                _ = try await client.refresh(refreshToken: login.tokens.refreshToken!)
            }
            let elapsed = ContinuousClock.now - started
            server.resume()
            #expect(elapsed >= timeout - .milliseconds(50), "gave up after \(elapsed)")
            #expect(elapsed < timeout + .seconds(5), "took \(elapsed) for a \(timeout) timeout")
            // The kernel accepted the connection and the request, so the stopped server might
            // still act on it: ambiguous.
            #expect(error?.isAmbiguous == true)
            #expect(error?.isTransient == true)
        }
    }

    @Test func answerLostAfterTheProviderRotated_isAmbiguous_andExplainsTheLaterRejection() async throws {
        try await withServer(timeout: .milliseconds(1500)) { client, server in
            let login = try await client.passwordLogin(email: Self.sarah.email, password: Self.sarah.password)
            let token = try #require(login.tokens.refreshToken)
            // The provider processes the refresh (rotating the token) and answers too late.
            try await server.control("fault", ["kind": "stall-after", "seconds": 4])
            let error = await expectCode(.timedOut) { _ = try await client.refresh(refreshToken: token) }
            #expect(error?.isAmbiguous == true)
            // The old token was rotated out by the lost exchange: a retry meets reuse detection.
            // Only the ambiguity above lets the caller tell this from an admin's revocation.
            await expectCode(.refreshRejected) { _ = try await client.refresh(refreshToken: token) }
        }
    }
}

/// A TCP socket listening on 127.0.0.1 at a port the kernel chose, and its address.
private func loopbackListener(backlog: Int32) throws -> (Int32, sockaddr_in) {
    let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(listener, pointer, length) == 0 && listen(listener, backlog) == 0
                && getsockname(listener, pointer, &length) == 0
        }
    }
    guard bound else {
        close(listener)
        throw POSIXError(.EADDRNOTAVAIL)
    }
    return (listener, address)
}

/// A loopback port whose accept queue is full, so new connections hang in SYN-SENT: the
/// request never leaves the client.
final class UnacceptingListener {
    let port: UInt16
    private var descriptors: [Int32] = []

    init() throws {
        let (listener, address) = try loopbackListener(backlog: 0)
        let length = socklen_t(MemoryLayout<sockaddr_in>.size)
        port = UInt16(bigEndian: address.sin_port)
        descriptors.append(listener)
        // Fill the accept queue (backlog 0 holds one connection); later SYNs are dropped.
        for _ in 0..<2 {
            let filler = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            _ = withUnsafePointer(to: address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(filler, $0, length) }
            }
            descriptors.append(filler)
        }
        usleep(100_000)
    }

    deinit {
        for descriptor in descriptors { close(descriptor) }
    }
}

/// A loopback port that answers one request with `response`, from a thread of its own.
final class AnsweringListener: @unchecked Sendable {
    let port: UInt16
    private let listener: Int32

    init(response: String) throws {
        let (listener, address) = try loopbackListener(backlog: 1)
        self.listener = listener
        port = UInt16(bigEndian: address.sin_port)
        Thread.detachNewThread {
            let connection = accept(listener, nil, nil)
            guard connection >= 0 else { return }
            var request: [UInt8] = []
            var buffer = [UInt8](repeating: 0, count: 4096)
            while !request.suffix(4).elementsEqual("\r\n\r\n".utf8) {
                let count = read(connection, &buffer, buffer.count)
                guard count > 0 else { break }
                request += buffer[0..<count]
            }
            let bytes = Array(response.utf8)
            _ = bytes.withUnsafeBytes { write(connection, $0.baseAddress, $0.count) }
            close(connection)
        }
    }

    deinit {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
    }
}

@Suite("Transport deadlines without a server")
struct TransportDeadlineTests {
    /// The answer comes at once; the caller's task runs again only after the timeout has passed
    /// (a busy machine). The answer is what the caller gets, not a timeout: from a token
    /// endpoint it may carry the only copy of a rotated refresh token.
    @Test func anAnswerHeardLateIsStillTheAnswer() async throws {
        let server = try AnsweringListener(
            response: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n"
                + "Connection: close\r\n\r\n{\"rotated\":true}")
        let transport = HTTPTransport(lateResumeForTesting: .milliseconds(800))
        let response = try await transport.send(
            .get(URL(string: "http://127.0.0.1:\(server.port)/token")!), timeout: .milliseconds(300))
        #expect(response.status == 200)
        #expect(String(decoding: response.body, as: UTF8.self) == "{\"rotated\":true}")
        withExtendedLifetime(server) {}
    }

    @Test func connectionNeverEstablished_isTimedOut_andNotAmbiguous() async throws {
        let listener = try UnacceptingListener()
        let base = URL(string: "http://127.0.0.1:\(listener.port)")!
        let configuration = IdentityProviderConfiguration(
            endpoints: .explicit(
                .init(
                    issuer: base.absoluteString, token: base.appendingPathComponent("token"),
                    jwks: base.appendingPathComponent("jwks"))),
            clientID: "kiosk", clientSecret: CredentialSecret("s"), admission: .group("nurses"),
            requestTimeout: .milliseconds(800))
        let client = try IdentityProviderClient(configuration: configuration, logger: CollectedLogs().logger())
        let started = ContinuousClock.now
        let error = await #expect(throws: IdentityError.self) {
            _ = try await client.refresh(refreshToken: OAuthToken("rt"))
        }
        let elapsed = ContinuousClock.now - started
        #expect(error?.code == .timedOut, "\(String(describing: error))")
        // A hung connect would take minutes; 30 s leaves room for a loaded CI machine.
        #expect(elapsed < .seconds(30), "took \(elapsed)")
        // Nothing was sent, so nothing can have happened at the provider: safe to retry.
        #expect(error?.isAmbiguous == false)
        withExtendedLifetime(listener) {}
    }
}
