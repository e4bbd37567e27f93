import Foundation
import KioskAuthCore
import Testing

/// Fails `count` passcode attempts, each at the first instant the gate allows it, starting at
/// `start`; returns the instant of the last attempt and its outcome.
@discardableResult
private func fail(
    _ count: Int, _ state: inout CredentialFailureState, guard credentialGuard: CredentialGuard,
    from start: Date
) -> (at: Date, outcome: PasscodeOutcome?) {
    var now = start
    var outcome: PasscodeOutcome?
    for _ in 0..<count {
        if case .delayed(let until) = credentialGuard.passcodeGate(state, now: now) { now = until }
        outcome = credentialGuard.recordPasscode(matched: false, in: &state, now: now)
    }
    return (now, outcome)
}

@Suite("Passcode lockout schedule")
struct PasscodeLockoutTests {
    let credentialGuard = CredentialGuard()

    @Test func freshState_allowsAPasscodeAttempt() {
        #expect(credentialGuard.passcodeGate(CredentialFailureState(), now: testStart) == .allowed)
    }

    @Test func defaultPolicy_isTheDesignSchedule() {
        let policy = LockoutPolicy.default
        #expect(policy.delays == [0, 0, 60, 300, 900, 1800, 1800, 1800, 1800])
        #expect(policy.hardLockAfter == 10)
        #expect(policy.fingerprintFailuresBeforeFallback == 3)
    }

    /// Walks failures 1 to 10, each at the first instant it is allowed, and checks every answer.
    @Test func consecutiveFailures_followTheScheduleToAHardLock() {
        var state = CredentialFailureState()
        var now = testStart
        let expected: [PasscodeOutcome] = [
            .rejected(next: .allowed),
            .rejected(next: .allowed),
            .rejected(next: .delayed(until: testStart.plus(60))),
            .rejected(next: .delayed(until: testStart.plus(60 + 300))),
            .rejected(next: .delayed(until: testStart.plus(60 + 300 + 900))),
            .rejected(next: .delayed(until: testStart.plus(60 + 300 + 900 + 1800))),
            .rejected(next: .delayed(until: testStart.plus(60 + 300 + 900 + 1800 * 2))),
            .rejected(next: .delayed(until: testStart.plus(60 + 300 + 900 + 1800 * 3))),
            .rejected(next: .delayed(until: testStart.plus(60 + 300 + 900 + 1800 * 4))),
            .rejected(next: .hardLocked),
        ]
        for (index, expectedOutcome) in expected.enumerated() {
            let outcome = credentialGuard.recordPasscode(matched: false, in: &state, now: now)
            #expect(outcome == expectedOutcome, "failure \(index + 1)")
            #expect(state.passcodeFailures == index + 1)
            if case .rejected(.delayed(let until)) = outcome { now = until }
        }
        #expect(state.passcodeHardLocked)
        #expect(state.passcodeLockedUntil == nil)
        #expect(credentialGuard.passcodeGate(state, now: now) == .hardLocked)
    }

    @Test(
        "The Nth failure delays the next attempt to the second",
        arguments: zip(1...9, [0, 0, 60, 300, 900, 1800, 1800, 1800, 1800] as [TimeInterval]))
    func nthFailure_delaysTheNextAttempt(failure: Int, delay: TimeInterval) {
        var state = CredentialFailureState()
        let (at, outcome) = fail(failure, &state, guard: credentialGuard, from: testStart)
        #expect(state.passcodeFailures == failure)
        #expect(!state.passcodeHardLocked)
        if delay == 0 {
            #expect(outcome == .rejected(next: .allowed))
            #expect(state.passcodeLockedUntil == nil)
            #expect(credentialGuard.passcodeGate(state, now: at) == .allowed)
        } else {
            let until = at.plus(delay)
            #expect(outcome == .rejected(next: .delayed(until: until)))
            #expect(state.passcodeLockedUntil == until)
            #expect(credentialGuard.passcodeGate(state, now: at) == .delayed(until: until))
            #expect(
                credentialGuard.passcodeGate(state, now: until.plus(-1)) == .delayed(until: until))
            #expect(credentialGuard.passcodeGate(state, now: until) == .allowed)
            #expect(credentialGuard.passcodeGate(state, now: until.plus(1)) == .allowed)
        }
    }

    @Test func attemptDuringADelay_isRefusedAndNotCounted() {
        var state = CredentialFailureState()
        fail(3, &state, guard: credentialGuard, from: testStart)
        let before = state
        let until = testStart.plus(60)

        let wrong = credentialGuard.recordPasscode(
            matched: false, in: &state, now: testStart.plus(30))
        #expect(wrong == .rejected(next: .delayed(until: until)))
        #expect(state == before)

        // Even the right code is refused while the delay runs: it should not have been checked.
        let right = credentialGuard.recordPasscode(matched: true, in: &state, now: until.plus(-1))
        #expect(right == .rejected(next: .delayed(until: until)))
        #expect(state == before)

        // When the delay ends, the next failure is the 4th, not a later one.
        let fourth = credentialGuard.recordPasscode(matched: false, in: &state, now: until)
        #expect(fourth == .rejected(next: .delayed(until: until.plus(300))))
        #expect(state.passcodeFailures == 4)
    }

    @Test func hardLock_outlastsAnyAmountOfTime() {
        var state = CredentialFailureState()
        let (at, _) = fail(10, &state, guard: credentialGuard, from: testStart)
        for later in [0, 1800, 86_400, 365 * 86_400, 100 * 365 * 86_400] as [TimeInterval] {
            #expect(credentialGuard.passcodeGate(state, now: at.plus(later)) == .hardLocked)
        }
        let right = credentialGuard.recordPasscode(
            matched: true, in: &state, now: at.plus(365 * 86_400))
        #expect(right == .rejected(next: .hardLocked))
        #expect(state.passcodeFailures == 10)
        #expect(state.passcodeHardLocked)
    }

    @Test func success_clearsPasscodeAndFingerprintFailures() {
        var state = CredentialFailureState()
        credentialGuard.recordFingerprint(matched: false, in: &state)
        credentialGuard.recordFingerprint(matched: false, in: &state)
        let (at, _) = fail(4, &state, guard: credentialGuard, from: testStart)
        let allowedAt = at.plus(300)

        #expect(
            credentialGuard.recordPasscode(matched: true, in: &state, now: allowedAt) == .accepted)
        #expect(state == CredentialFailureState())
    }

    @Test func success_restartsTheScheduleFromTheFirstFailure() {
        var state = CredentialFailureState()
        let (at, _) = fail(5, &state, guard: credentialGuard, from: testStart)
        let later = at.plus(900)
        #expect(credentialGuard.recordPasscode(matched: true, in: &state, now: later) == .accepted)
        #expect(
            credentialGuard.recordPasscode(matched: false, in: &state, now: later)
                == .rejected(next: .allowed))
        #expect(
            credentialGuard.recordPasscode(matched: false, in: &state, now: later)
                == .rejected(next: .allowed))
        #expect(
            credentialGuard.recordPasscode(matched: false, in: &state, now: later)
                == .rejected(next: .delayed(until: later.plus(60))))
    }

    @Test func fallbackSuccessWithoutOnlineLogin_clearsOnlyTheFingerprintCount() {
        var state = CredentialFailureState()
        credentialGuard.recordFingerprint(matched: false, in: &state)
        credentialGuard.recordFingerprint(matched: false, in: &state)
        credentialGuard.recordFingerprint(matched: false, in: &state)
        let (at, _) = fail(10, &state, guard: credentialGuard, from: testStart)

        credentialGuard.recordFallbackSuccess(in: &state, clearsPasscodeHardLock: false)
        #expect(state.fingerprintFailures == 0)
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
        #expect(state.passcodeHardLocked)
        #expect(state.passcodeFailures == 10)
        #expect(credentialGuard.passcodeGate(state, now: at) == .hardLocked)
    }

    @Test func fallbackSuccessWithoutOnlineLogin_keepsARunningDelay() {
        var state = CredentialFailureState()
        fail(3, &state, guard: credentialGuard, from: testStart)
        credentialGuard.recordFallbackSuccess(in: &state, clearsPasscodeHardLock: false)
        #expect(
            credentialGuard.passcodeGate(state, now: testStart.plus(59))
                == .delayed(until: testStart.plus(60)))
        #expect(state.passcodeFailures == 3)
    }

    @Test func onlineLogin_clearsAHardLock() {
        var state = CredentialFailureState()
        let (at, _) = fail(10, &state, guard: credentialGuard, from: testStart)
        credentialGuard.recordFingerprint(matched: false, in: &state)

        credentialGuard.recordFallbackSuccess(in: &state, clearsPasscodeHardLock: true)
        #expect(state == CredentialFailureState())
        #expect(credentialGuard.passcodeGate(state, now: at) == .allowed)
        #expect(credentialGuard.recordPasscode(matched: true, in: &state, now: at) == .accepted)
    }

    @Test func adminReset_clearsEverything() {
        var state = CredentialFailureState()
        let (at, _) = fail(10, &state, guard: credentialGuard, from: testStart)
        for _ in 0..<3 { credentialGuard.recordFingerprint(matched: false, in: &state) }

        credentialGuard.reset(&state)
        #expect(state == CredentialFailureState())
        #expect(credentialGuard.passcodeGate(state, now: at) == .allowed)
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
    }

    @Test func failedPasscodes_doNotTouchTheFingerprint() {
        var state = CredentialFailureState()
        fail(10, &state, guard: credentialGuard, from: testStart)
        #expect(state.fingerprintFailures == 0)
        #expect(!credentialGuard.fingerprintRequiresFallback(state))
        #expect(credentialGuard.recordFingerprint(matched: true, in: &state) == false)
    }

    @Test func storedCountAtTheLimit_isHardLockedEvenWithoutTheFlag() {
        var state = CredentialFailureState()
        state.passcodeFailures = 7
        let stricter = CredentialGuard(policy: LockoutPolicy(hardLockAfter: 5))
        #expect(stricter.passcodeGate(state, now: testStart) == .hardLocked)
        #expect(credentialGuard.passcodeGate(state, now: testStart) == .allowed)
    }

    @Test func shortDelayList_repeatsItsLastEntryUntilTheHardLock() {
        let policy = LockoutPolicy(delays: [0, 10], hardLockAfter: 5)
        #expect(policy.delay(afterFailure: 1) == 0)
        #expect(policy.delay(afterFailure: 2) == 10)
        #expect(policy.delay(afterFailure: 4) == 10)
        #expect(LockoutPolicy(delays: []).delay(afterFailure: 3) == 0)

        let shortGuard = CredentialGuard(policy: policy)
        var state = CredentialFailureState()
        let (at, outcome) = fail(4, &state, guard: shortGuard, from: testStart)
        #expect(outcome == .rejected(next: .delayed(until: at.plus(10))))
        #expect(
            shortGuard.recordPasscode(matched: false, in: &state, now: at.plus(10))
                == .rejected(next: .hardLocked))
    }

    @Test func failureState_survivesAnEncodingRoundTrip() throws {
        var state = CredentialFailureState()
        fail(4, &state, guard: credentialGuard, from: testStart)
        credentialGuard.recordFingerprint(matched: false, in: &state)
        let decoded = try JSONDecoder().decode(
            CredentialFailureState.self, from: JSONEncoder().encode(state))
        #expect(decoded == state)
    }
}
