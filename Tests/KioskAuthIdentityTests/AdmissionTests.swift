import Foundation
import Testing

@testable import KioskAuthIdentity

@Suite("Admission policy and role rules")
struct AdmissionTests {
    let roles = IdentityProviderConfiguration.productRoles

    func claims(
        email: String? = "sarah@clinic.example", verified: Bool? = true, roles: [String] = ["caregiver"],
        groups: [String] = ["nurses"]
    )
        -> IdentityClaims
    {
        IdentityClaims(
            issuer: "iss", subject: "42", email: email, isEmailVerified: verified, roles: roles, groups: groups)
    }

    func code(_ claims: IdentityClaims, _ policy: AdmissionPolicy) -> IdentityError.Code? {
        do {
            try Admission.check(claims, policy: policy, acceptedRoles: roles)
            return nil
        } catch {
            return (error as? IdentityError)?.code
        }
    }

    @Test func emailDomain_allowListed_isAdmitted_caseInsensitively() {
        #expect(code(claims(), .emailDomains(["clinic.example"])) == nil)
        #expect(code(claims(email: "Sarah@CLINIC.Example"), .emailDomains(["Clinic.example"])) == nil)
    }

    @Test func emailDomain_notListed_isNotAdmitted() {
        #expect(code(claims(email: "sarah@elsewhere.example"), .emailDomains(["clinic.example"])) == .notAdmitted)
        // No implied subdomains, no suffix tricks.
        #expect(code(claims(email: "sarah@evil-clinic.example"), .emailDomains(["clinic.example"])) == .notAdmitted)
        #expect(code(claims(email: "sarah@sub.clinic.example"), .emailDomains(["clinic.example"])) == .notAdmitted)
        #expect(code(claims(email: "clinic.example@evil.example"), .emailDomains(["clinic.example"])) == .notAdmitted)
    }

    @Test func emailDomain_withUnverifiedOrMissingEmail_isNotAdmitted() {
        #expect(code(claims(verified: false), .emailDomains(["clinic.example"])) == .notAdmitted)
        #expect(code(claims(email: nil), .emailDomains(["clinic.example"])) == .notAdmitted)
        // A provider that does not say is trusted to have verified it.
        #expect(code(claims(verified: nil), .emailDomains(["clinic.example"])) == nil)
    }

    @Test func requiredGroup_presentOrAbsent() {
        #expect(code(claims(), .group("nurses")) == nil)
        #expect(code(claims(groups: ["visitors"]), .group("nurses")) == .notAdmitted)
        #expect(code(claims(groups: []), .emailDomains(["clinic.example"], andGroup: "nurses")) == .notAdmitted)
        #expect(
            code(claims(email: "a@elsewhere.example"), .emailDomains(["clinic.example"], andGroup: "nurses"))
                == .notAdmitted)
    }

    @Test func unknownRole_isRefused_neverGuessed() {
        #expect(code(claims(roles: ["janitor"]), .everyoneTheProviderAuthenticates) == .unknownRole)
        #expect(code(claims(roles: ["caregiver", "superuser"]), .everyoneTheProviderAuthenticates) == .unknownRole)
        #expect(code(claims(roles: []), .everyoneTheProviderAuthenticates) == .unknownRole)
        #expect(code(claims(roles: ["Caregiver"]), .everyoneTheProviderAuthenticates) == .unknownRole)
    }

    @Test func severalKnownRoles_areAdmitted() {
        #expect(code(claims(roles: ["coordinator", "caregiver"]), .everyoneTheProviderAuthenticates) == nil)
    }

    @Test func admissionIsCheckedBeforeRoles() {
        #expect(
            code(claims(email: "x@elsewhere.example", roles: ["janitor"]), .emailDomains(["clinic.example"]))
                == .notAdmitted)
    }

    @Test func claimsFromAToken_followDottedPaths_andDeduplicate() async throws {
        let token = TokenFactory.token(
            TokenFactory.claims([
                "app_metadata": ["kioskauth_role": ["family", "caregiver", "family"], "teams": "ward-3"],
                "email_verified": "false",
            ]))
        let validator = TokenValidator(
            keySource: JWKSSource(TokenFactory.jwks([TokenFactory.jwk(rsa: TestKeys.rsa.publicKey, kid: "rsa-1")]))
                .keySource)
        let validated = try await validator.validate(
            OAuthToken(token),
            expecting: .idToken(issuer: TokenFactory.issuer, clientID: TokenFactory.clientID, clockSkew: .zero),
            now: TokenFactory.now)
        let claims = try IdentityExtraction.claims(
            from: validated, roleClaim: "app_metadata.kioskauth_role", groupsClaim: "app_metadata.teams")
        #expect(claims.roles == ["family", "caregiver"])
        #expect(claims.groups == ["ward-3"])
        #expect(claims.isEmailVerified == false)
        #expect(claims.subject == "user-42")
    }

    @Test func configuration_refusesPlainHTTPExceptLoopback_andInconsistentDialects() {
        func make(
            _ endpoints: IdentityProviderConfiguration.Endpoints, dialect: IdentityProviderConfiguration.Dialect = .oidc
        )
            -> IdentityError.Code?
        {
            let configuration = IdentityProviderConfiguration(
                dialect: dialect, endpoints: endpoints, clientID: "c", clientSecret: nil, admission: .group("g"))
            do {
                _ = try IdentityProviderClient(configuration: configuration, logger: .init(label: "test"))
                return nil
            } catch {
                return (error as? IdentityError)?.code
            }
        }
        #expect(make(.discovery(issuer: URL(string: "https://idp.example")!)) == nil)
        #expect(make(.discovery(issuer: URL(string: "http://127.0.0.1:9000")!)) == nil)
        #expect(make(.discovery(issuer: URL(string: "http://idp.example")!)) == .misconfigured)
        #expect(make(.supabaseProject(URL(string: "https://p.supabase.co")!), dialect: .supabase) == .misconfigured)
        #expect(make(.supabaseProject(URL(string: "https://p.supabase.co")!)) == .misconfigured)
    }
}
