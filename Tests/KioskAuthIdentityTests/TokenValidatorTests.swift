import Foundation
import Testing

@testable import KioskAuthIdentity

@Suite("Token validation (keys generated in the test)")
struct TokenValidatorTests {
    let source = JWKSSource(
        TokenFactory.jwks([
            TokenFactory.jwk(rsa: TestKeys.rsa.publicKey, kid: "rsa-1"),
            TokenFactory.jwk(p256: TestKeys.p256.publicKey, kid: "ec-1"),
        ]))
    let expectations = TokenExpectations.idToken(
        issuer: TokenFactory.issuer, clientID: TokenFactory.clientID, clockSkew: .seconds(60))

    func validate(
        _ token: String, now: Date = TokenFactory.now, expecting: TokenExpectations? = nil,
        validator: TokenValidator? = nil
    ) async throws -> ValidatedToken {
        let validator = validator ?? TokenValidator(keySource: source.keySource)
        return try await validator.validate(OAuthToken(token), expecting: expecting ?? expectations, now: now)
    }

    func expectInvalid(_ token: String, now: Date = TokenFactory.now, expecting: TokenExpectations? = nil) async {
        await #expect {
            _ = try await validate(token, now: now, expecting: expecting)
        } throws: { error in
            (error as? IdentityError)?.code == .invalidToken
        }
    }

    @Test func rs256_signedByTheProvider_isAccepted() async throws {
        let validated = try await validate(TokenFactory.token())
        #expect(validated.subject == "user-42")
        #expect(validated.string("kioskauth_role") == "caregiver")
        #expect(validated.strings("groups") == ["nurses"])
        #expect(source.fetches == 1)
    }

    @Test func es256_signedByTheProvider_isAccepted() async throws {
        let validated = try await validate(TokenFactory.token(signer: .p256(TestKeys.p256), kid: "ec-1"))
        #expect(validated.algorithm == "ES256")
    }

    @Test func tamperedPayload_isRejected() async {
        let token = TokenFactory.token()
        let parts = token.split(separator: ".")
        let forged = TokenFactory.encode(TokenFactory.claims(["kioskauth_role": "coordinator"]))
        await expectInvalid("\(parts[0]).\(forged).\(parts[2])")
    }

    @Test func tamperedSignature_isRejected() async {
        let token = TokenFactory.token()
        var signature = Base64URL.decode(token.split(separator: ".")[2])!
        signature[signature.startIndex + 10] ^= 0x01
        let parts = token.split(separator: ".")
        await expectInvalid("\(parts[0]).\(parts[1]).\(Base64URL.encode(signature))")
    }

    @Test func signatureByAnotherKeyWithTheSameKid_isRejected() async {
        await expectInvalid(TokenFactory.token(signer: .rsa(TestKeys.rotatedRSA)))
    }

    @Test func expiredBeyondClockSkew_isRejected() async {
        let exp = TokenFactory.now.timeIntervalSince1970 - 61
        await expectInvalid(TokenFactory.token(TokenFactory.claims(["exp": exp])))
    }

    @Test func expiredWithinClockSkew_isAccepted() async throws {
        let exp = TokenFactory.now.timeIntervalSince1970 - 59
        _ = try await validate(TokenFactory.token(TokenFactory.claims(["exp": exp])))
    }

    @Test func missingExp_isRejected() async {
        await expectInvalid(TokenFactory.token(TokenFactory.claims(removing: ["exp"])))
    }

    @Test func notYetValid_isRejected() async {
        let nbf = TokenFactory.now.timeIntervalSince1970 + 120
        await expectInvalid(TokenFactory.token(TokenFactory.claims(["nbf": nbf])))
    }

    @Test func issuedInTheFuture_isRejected() async {
        let iat = TokenFactory.now.timeIntervalSince1970 + 120
        await expectInvalid(TokenFactory.token(TokenFactory.claims(["iat": iat])))
    }

    @Test func wrongAudience_isRejected() async {
        await expectInvalid(TokenFactory.token(TokenFactory.claims(["aud": "some-other-app"])))
    }

    @Test func audienceList_containingTheClient_isAccepted_unlessAnotherPartyIsAuthorized() async throws {
        _ = try await validate(TokenFactory.token(TokenFactory.claims(["aud": ["api", TokenFactory.clientID]])))
        await expectInvalid(
            TokenFactory.token(TokenFactory.claims(["aud": ["api", TokenFactory.clientID], "azp": "api"])))
    }

    @Test func wrongIssuer_isRejected() async {
        await expectInvalid(TokenFactory.token(TokenFactory.claims(["iss": "https://evil.example"])))
    }

    @Test func wrongType_isRejected_missingType_isAccepted() async throws {
        await expectInvalid(TokenFactory.token(typ: "at+jwt"))
        _ = try await validate(TokenFactory.token(typ: nil))
        _ = try await validate(TokenFactory.token(typ: "application/JWT"))
    }

    @Test func accessTokenExpectations_acceptAtJWT() async throws {
        let access = TokenExpectations.accessToken(
            issuer: TokenFactory.issuer, audience: TokenFactory.clientID, clockSkew: .zero)
        _ = try await validate(TokenFactory.token(typ: "at+jwt"), expecting: access)
        await expectInvalid(TokenFactory.token(typ: "dpop+jwt"), expecting: access)
    }

    @Test func algNone_isRejected() async {
        await expectInvalid(TokenFactory.token(signer: .unsigned))
    }

    @Test func hs256AgainstAJWKS_isRejected_noAlgorithmConfusion() async {
        // An attacker signs HS256 with something public (here: the RSA modulus). With a JWKS as
        // key source no HMAC key exists, so the token cannot verify.
        let modulus = try! TestKeys.rsa.publicKey.getKeyPrimitives().modulus
        await expectInvalid(TokenFactory.token(signer: .hmac(String(decoding: modulus, as: UTF8.self)), kid: "rsa-1"))
    }

    @Test func criticalHeader_isRejected() async {
        await expectInvalid(TokenFactory.token(extraHeader: ["crit": ["exp"]]))
    }

    @Test func malformedTokens_areRejected() async {
        await expectInvalid("only.two")
        await expectInvalid("a.b.c.d.e")
        await expectInvalid("!!!.???.***")
        await expectInvalid(String(repeating: "a", count: 20_000))
    }

    @Test func unknownKid_triggersOneRefetch_andAcceptsTheRotatedKey() async throws {
        let validator = TokenValidator(keySource: source.keySource, minimumRefetchInterval: .seconds(60))
        _ = try await validate(TokenFactory.token(), validator: validator)
        #expect(source.fetches == 1)
        source.replace(with: TokenFactory.jwks([TokenFactory.jwk(rsa: TestKeys.rotatedRSA.publicKey, kid: "rsa-2")]))
        let rotated = TokenFactory.token(signer: .rsa(TestKeys.rotatedRSA), kid: "rsa-2")
        let later = TokenFactory.now.addingTimeInterval(61)
        _ = try await validate(rotated, now: later, validator: validator)
        #expect(source.fetches == 2)
        // Cached now: no further fetch.
        _ = try await validate(rotated, now: later, validator: validator)
        #expect(source.fetches == 2)
    }

    @Test func unknownKid_withinTheMinimumInterval_isNotRefetched() async throws {
        let validator = TokenValidator(keySource: source.keySource, minimumRefetchInterval: .seconds(60))
        _ = try await validate(TokenFactory.token(), validator: validator)
        let forged = TokenFactory.token(kid: "no-such-key")
        for second in [1.0, 10, 59] {
            await #expect(throws: IdentityError.self) {
                _ = try await validator.validate(
                    OAuthToken(forged), expecting: expectations, now: TokenFactory.now.addingTimeInterval(second))
            }
        }
        #expect(source.fetches == 1)
        await #expect(throws: IdentityError.self) {
            _ = try await validator.validate(
                OAuthToken(forged), expecting: expectations, now: TokenFactory.now.addingTimeInterval(60))
        }
        #expect(source.fetches == 2)
    }

    @Test func rsaKeysShorterThan2048Bits_areIgnored() async {
        let weak = JWKSSource(TokenFactory.jwks([TokenFactory.jwk(rsa: TestKeys.weakRSA.publicKey, kid: "weak")]))
        let validator = TokenValidator(keySource: weak.keySource)
        await #expect {
            _ = try await validator.validate(
                OAuthToken(TokenFactory.token(signer: .rsa(TestKeys.weakRSA), kid: "weak")), expecting: expectations,
                now: TokenFactory.now)
        } throws: { ($0 as? IdentityError)?.code == .invalidToken }
    }

    @Test func jwksFetchFailure_isReportedAsTheFetchError() async {
        let validator = TokenValidator(
            keySource: .jwks(fetch: { throw IdentityError(.unreachable, "test: no network") }))
        await #expect {
            _ = try await validator.validate(
                OAuthToken(TokenFactory.token()), expecting: expectations, now: TokenFactory.now)
        } throws: { ($0 as? IdentityError)?.code == .unreachable }
    }

    @Test func hs256WithTheSharedSecret_isAccepted_otherwiseRejected() async throws {
        let validator = TokenValidator(keySource: .sharedSecret(CredentialSecret(TestKeys.hmacSecret)))
        let good = TokenFactory.token(signer: .hmac(TestKeys.hmacSecret), kid: nil)
        _ = try await validator.validate(OAuthToken(good), expecting: expectations, now: TokenFactory.now)
        for bad in [
            TokenFactory.token(signer: .hmac("a-different-secret-of-reasonable-length"), kid: nil),
            TokenFactory.token(signer: .rsa(TestKeys.rsa)),
        ] {
            await #expect {
                _ = try await validator.validate(OAuthToken(bad), expecting: expectations, now: TokenFactory.now)
            } throws: { ($0 as? IdentityError)?.code == .invalidToken }
        }
    }

    @Test func credentialSecret_dropsOneTrailingNewline_only() throws {
        let secret = CredentialSecret(credentialBytes: Data("s3cret \n".utf8))
        #expect(try secret.withText { $0 } == "s3cret ")
        #expect("\(secret)" == "CredentialSecret(<redacted>)")
        #expect("\(OAuthToken("abc"))" == "OAuthToken(<redacted>)")
    }
}
