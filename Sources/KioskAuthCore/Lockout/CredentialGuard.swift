public import FoundationEssentials

/// Whether a passcode attempt may be checked.
public enum PasscodeGate: Equatable, Sendable {
    /// Check the passcode.
    case allowed
    /// Refuse without checking until this instant; the refusal is not a failure.
    case delayed(until: Date)
    /// Refuse without checking until an admin reset or an online login.
    case hardLocked
}

/// What a checked passcode attempt led to.
public enum PasscodeOutcome: Equatable, Sendable {
    /// The passcode matched; the failure counts are cleared.
    case accepted
    /// The passcode was refused; `next` says whether and when the next attempt may be checked.
    case rejected(next: PasscodeGate)
}

/// The decision logic: pure functions over CredentialFailureState.
///
/// Only the passcode locks: a run of wrong passcodes delays and finally hard-locks the passcode,
/// but never the fingerprint, so nobody can lock a colleague out by typing wrong codes. Failed
/// fingerprint matches only require a fallback (the passcode, or the IdP login for a person
/// without one). A fingerprint match does not clear passcode failures: otherwise every unlock by
/// the owner would hand someone guessing their passcode a fresh budget of guesses.
///
/// Use per attempt: ``passcodeGate(_:now:)`` first, then verify the passcode only if it is
/// ``PasscodeGate/allowed``, then ``recordPasscode(matched:in:now:)``; persist the state durably
/// before answering the caller.
public struct CredentialGuard: Sendable {
    /// The schedule applied.
    public var policy: LockoutPolicy

    /// Makes a guard applying `policy`.
    public init(policy: LockoutPolicy = .default) {
        self.policy = policy
    }

    /// May a passcode attempt be checked now? Ask BEFORE verifying the hash, so an attempt on a
    /// locked code costs nothing.
    ///
    /// A delay ends at its instant: an attempt at exactly `passcodeLockedUntil` is allowed. A
    /// count at or beyond ``LockoutPolicy/hardLockAfter`` is hard-locked even without the flag,
    /// so lowering the limit in the config applies to people already past it.
    public func passcodeGate(_ state: CredentialFailureState, now: Date) -> PasscodeGate {
        if state.passcodeHardLocked || state.passcodeFailures >= policy.hardLockAfter {
            return .hardLocked
        }
        if let until = state.passcodeLockedUntil, now < until {
            return .delayed(until: until)
        }
        return .allowed
    }

    /// Records a passcode attempt that was checked. A success clears the passcode AND the
    /// fingerprint failure counts (the passcode is the fingerprint's fallback).
    ///
    /// An attempt the gate does not allow is rejected with the gate's answer and leaves `state`
    /// unchanged, whatever `matched` says: a refused attempt is not a failure, and a code that
    /// should not have been checked never unlocks.
    public func recordPasscode(
        matched: Bool, in state: inout CredentialFailureState, now: Date
    )
        -> PasscodeOutcome
    {
        let gate = passcodeGate(state, now: now)
        guard gate == .allowed else { return .rejected(next: gate) }
        if matched {
            state.passcodeFailures = 0
            state.passcodeLockedUntil = nil
            state.fingerprintFailures = 0
            return .accepted
        }
        state.passcodeFailures += 1
        if state.passcodeFailures >= policy.hardLockAfter {
            state.passcodeHardLocked = true
            state.passcodeLockedUntil = nil
            return .rejected(next: .hardLocked)
        }
        let delay = policy.delay(afterFailure: state.passcodeFailures)
        if delay > 0 {
            let until = now.addingTimeInterval(delay)
            state.passcodeLockedUntil = until
            return .rejected(next: .delayed(until: until))
        }
        state.passcodeLockedUntil = nil
        return .rejected(next: .allowed)
    }

    /// Whether a fingerprint attempt is refused in favour of the fallback: only after N
    /// consecutive failed matches. Only the passcode ever locks.
    public func fingerprintRequiresFallback(_ state: CredentialFailureState) -> Bool {
        state.fingerprintFailures >= policy.fingerprintFailuresBeforeFallback
    }

    /// Records a fingerprint match result; returns `true` when the fallback is now required.
    ///
    /// A match clears the fingerprint count (not the passcode count). While the fallback is
    /// required, a result changes nothing and `true` is returned: only the fallback clears it.
    @discardableResult
    public func recordFingerprint(matched: Bool, in state: inout CredentialFailureState) -> Bool {
        if fingerprintRequiresFallback(state) { return true }
        if matched {
            state.fingerprintFailures = 0
        } else {
            state.fingerprintFailures += 1
        }
        return fingerprintRequiresFallback(state)
    }

    /// Records a fallback that succeeded elsewhere (such as an IdP password login): clears the
    /// fingerprint count, and with an online login also the passcode hard lock.
    ///
    /// With `clearsPasscodeHardLock` the whole passcode state is cleared (count, delay and hard
    /// lock): an online login proves more than a passcode does.
    public func recordFallbackSuccess(
        in state: inout CredentialFailureState, clearsPasscodeHardLock: Bool
    ) {
        state.fingerprintFailures = 0
        if clearsPasscodeHardLock {
            state.passcodeFailures = 0
            state.passcodeLockedUntil = nil
            state.passcodeHardLocked = false
        }
    }

    /// Admin reset: clears everything.
    public func reset(_ state: inout CredentialFailureState) {
        state = CredentialFailureState()
    }
}
