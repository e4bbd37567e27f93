import Foundation
import Testing

@testable import KioskAuthIdentity

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

/// The pure logic behind signing in with providers as organisations run them (issue #12):
/// roles without a role claim, scopes from discovery, errors a person can act on.
@Suite("Real provider shapes: roles, scopes, errors")
struct RealProviderShapeTests {
    func claims(roles: [String] = [], groups: [String] = [], email: String? = "a@example.com") -> IdentityClaims {
        IdentityClaims(issuer: "iss", subject: "1", email: email, isEmailVerified: nil, roles: roles, groups: groups)
    }

    let mappings = [
        GroupRoleMapping(group: "leads", role: "coordinator"), GroupRoleMapping(group: "nurses", role: "caregiver"),
    ]

    @Test func aRoleClaimWinsOverGroupsAndTheDefault() {
        let resolved = RoleResolution.resolve(
            claims(roles: ["family"], groups: ["leads"]), roleFromGroup: mappings, defaultRole: "caregiver")
        #expect(resolved.roles == ["family"] && resolved.roleSource == "claim")
    }

    @Test func theFirstMatchingGroupGivesTheRole() {
        let resolved = RoleResolution.resolve(
            claims(groups: ["nurses", "leads"]), roleFromGroup: mappings, defaultRole: "caregiver")
        #expect(resolved.roles == ["coordinator"] && resolved.roleSource == "group leads")
    }

    @Test func theDefaultRoleServesWhenNothingElseDoes() {
        let resolved = RoleResolution.resolve(
            claims(groups: ["other"]), roleFromGroup: mappings, defaultRole: "caregiver")
        #expect(resolved.roles == ["caregiver"] && resolved.roleSource == "default")
    }

    @Test func withoutADefaultNobodyGetsARoleAndTheRefusalSaysWhatToSet() throws {
        let resolved = RoleResolution.resolve(claims(), roleFromGroup: mappings, defaultRole: nil)
        #expect(resolved.roles.isEmpty)
        let error = #expect(throws: IdentityError.self) {
            try Admission.check(
                resolved, policy: .emailDomains(["example.com"]),
                acceptedRoles: IdentityProviderConfiguration.productRoles)
        }
        #expect(error?.code == .unknownRole && error?.message.contains("DefaultRole") == true)
    }

    @Test func anUnknownRoleValueStaysARefusal() {
        #expect(throws: IdentityError.self) {
            try Admission.check(
                claims(roles: ["janitor"]), policy: .emailDomains(["example.com"]),
                acceptedRoles: IdentityProviderConfiguration.productRoles)
        }
    }

    @Test func aRefreshWithoutAnEmailIsNotRefusedForIt() throws {
        try Admission.check(
            claims(roles: ["caregiver"], email: nil), policy: .emailDomains(["example.com"]),
            acceptedRoles: IdentityProviderConfiguration.productRoles, emailRequired: false)
        #expect(throws: IdentityError.self) {
            try Admission.check(
                claims(roles: ["caregiver"], email: nil), policy: .emailDomains(["example.com"]),
                acceptedRoles: IdentityProviderConfiguration.productRoles)
        }
    }

    @Test func onlyScopesDiscoveryListsAreRequested() {
        let chosen = ScopeSelection.select(configured: ["openid", "email", "profile"], supported: ["openid", "email"])
        #expect(chosen.requested == ["openid", "email"] && chosen.dropped == ["profile"])
        let unlisted = ScopeSelection.select(configured: ["openid", "email", "profile"], supported: nil)
        #expect(unlisted.requested == ["openid", "email", "profile"] && unlisted.dropped.isEmpty)
        #expect(ScopeSelection.select(configured: ["openid"], supported: []).requested == ["openid"])
    }

    func providerError(_ body: String, status: Int = 400, context: GrantContext = .password) -> IdentityError {
        ProviderResponses.error(
            for: HTTPResponse(status: status, body: Data(body.utf8), headers: [:]), context: context, dialect: .oidc)
    }

    @Test func theOAuthErrorAndItsDescriptionAreInTheMessageOnce() {
        let bare = providerError(#"{"error": "invalid_scope"}"#)
        #expect(bare.message == "the identity provider refused the request: invalid_scope (HTTP 400)")
        let described = providerError(#"{"error": "invalid_request", "error_description": "Missing scope"}"#)
        #expect(
            described.message == "the identity provider refused the request: invalid_request (Missing scope) (HTTP 400)"
        )
        #expect(providerError("", status: 400).message == "the identity provider refused the request (HTTP 400)")
    }

    @Test func accessDeniedOnThePasswordGrantIsWrongCredentials() {
        // django-oidc-provider's answer to a wrong password.
        let denied =
            #"{"error": "access_denied", "error_description": "The resource owner or authorization server denied the request."}"#
        #expect(providerError(denied, status: 403).code == .invalidCredentials)
        #expect(providerError(denied, status: 400, context: .devicePoll).code == .authorizationDenied)
    }

    @Test func transportFailuresAreWordsNotNumbers() {
        #expect(HTTPTransport.reason(.cannotConnectToHost) == "connection refused")
        #expect(HTTPTransport.reason(.timedOut) == "timed out")
        #expect(HTTPTransport.reason(.cannotFindHost) == "name not found")
        #expect(HTTPTransport.reason(.dnsLookupFailed) == "name not found")
        #expect(HTTPTransport.reason(.serverCertificateUntrusted) == "TLS failure")
        #expect(HTTPTransport.reason(.secureConnectionFailed) == "TLS failure")
        #expect(!HTTPTransport.reason(.unknown).contains("-"))
    }

    @Test func aClosedPortIsConnectionRefusedInWords() async throws {
        let transport = HTTPTransport()
        let error = await #expect(throws: IdentityError.self) {
            _ = try await transport.send(.get(URL(string: "http://127.0.0.1:9/")!), timeout: .seconds(5))
        }
        #expect(error?.message == "cannot reach the identity provider (connection refused)")
    }

    /// The refusal comes at once; this task runs again only after the timeout has passed (a busy
    /// machine). What the exchange ended with is still what the caller hears.
    @Test func aRefusalHeardLateIsStillARefusal() async throws {
        let transport = HTTPTransport(lateResumeForTesting: .milliseconds(800))
        let error = await #expect(throws: IdentityError.self) {
            _ = try await transport.send(.get(URL(string: "http://127.0.0.1:9/")!), timeout: .milliseconds(300))
        }
        #expect(error?.message == "cannot reach the identity provider (connection refused)")
    }
}
