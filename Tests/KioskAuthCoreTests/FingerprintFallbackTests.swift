import Foundation
import KioskAuthCore
import Testing

@Suite("Fingerprint fallback")
struct FingerprintFallbackTests {
    let credentialGuard = CredentialGuard()

    @Test func thirdFailedMatchInARow_requiresTheFallback() {
        var state = CredentialFailureState()
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
        #expect(credentialGuard.recordFingerprint(matched: false, in: &state) == false)
        #expect(credentialGuard.recordFingerprint(matched: false, in: &state) == false)
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
        #expect(credentialGuard.recordFingerprint(matched: false, in: &state) == true)
        #expect(credentialGuard.fingerprintRequiresFallback(state))
        #expect(state.fingerprintFailures == 3)
    }

    @Test func matchBeforeTheThirdFailure_startsTheCountAgain() {
        var state = CredentialFailureState()
        credentialGuard.recordFingerprint(matched: false, in: &state)
        credentialGuard.recordFingerprint(matched: false, in: &state)
        #expect(credentialGuard.recordFingerprint(matched: true, in: &state) == false)
        #expect(state.fingerprintFailures == 0)
        credentialGuard.recordFingerprint(matched: false, in: &state)
        #expect(credentialGuard.recordFingerprint(matched: false, in: &state) == false)
    }

    @Test func whileTheFallbackIsRequired_aMatchChangesNothing() {
        var state = CredentialFailureState()
        for _ in 0..<3 { credentialGuard.recordFingerprint(matched: false, in: &state) }
        #expect(credentialGuard.recordFingerprint(matched: true, in: &state) == true)
        #expect(credentialGuard.recordFingerprint(matched: false, in: &state) == true)
        #expect(state.fingerprintFailures == 3)
    }

    @Test func passcodeFallbackSuccess_clearsTheFingerprintCount() {
        var state = CredentialFailureState()
        for _ in 0..<3 { credentialGuard.recordFingerprint(matched: false, in: &state) }
        #expect(
            credentialGuard.recordPasscode(matched: true, in: &state, now: testStart) == .accepted)
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
        #expect(state.fingerprintFailures == 0)
    }

    @Test func identityProviderFallbackSuccess_clearsTheFingerprintCount() {
        var state = CredentialFailureState()
        for _ in 0..<3 { credentialGuard.recordFingerprint(matched: false, in: &state) }
        credentialGuard.recordFallbackSuccess(in: &state, clearsPasscodeHardLock: true)
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
    }

    @Test func failedPasscodeFallback_keepsTheFallbackRequired() {
        var state = CredentialFailureState()
        for _ in 0..<3 { credentialGuard.recordFingerprint(matched: false, in: &state) }
        _ = credentialGuard.recordPasscode(matched: false, in: &state, now: testStart)
        #expect(credentialGuard.fingerprintRequiresFallback(state))
    }

    @Test func fingerprint_staysAvailableWhileThePasscodeIsHardLocked() {
        var state = CredentialFailureState()
        var now = testStart
        for _ in 0..<10 {
            if case .rejected(.delayed(let until)) = credentialGuard.recordPasscode(
                matched: false, in: &state, now: now)
            {
                now = until
            }
        }
        #expect(credentialGuard.passcodeGate(state, now: now) == .hardLocked)
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
        #expect(credentialGuard.recordFingerprint(matched: true, in: &state) == false)
    }

    @Test func fingerprintMatch_doesNotRefillThePasscodeGuessBudget() {
        var state = CredentialFailureState()
        for _ in 0..<2 {
            _ = credentialGuard.recordPasscode(matched: false, in: &state, now: testStart)
        }
        credentialGuard.recordFingerprint(matched: true, in: &state)
        #expect(state.passcodeFailures == 2)
        #expect(
            credentialGuard.recordPasscode(matched: false, in: &state, now: testStart)
                == .rejected(next: .delayed(until: testStart.plus(60))))
    }

    @Test func fallbackThreshold_isConfigurable() {
        let lenient = CredentialGuard(policy: LockoutPolicy(fingerprintFailuresBeforeFallback: 5))
        var state = CredentialFailureState()
        for _ in 0..<4 { #expect(lenient.recordFingerprint(matched: false, in: &state) == false) }
        #expect(lenient.recordFingerprint(matched: false, in: &state) == true)
    }
}
