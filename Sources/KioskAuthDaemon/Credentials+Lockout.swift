import KioskAuthCore

extension CredentialAuthority {
    /// Counts a passcode lockout when a failure moved a person into a delay or the hard lock.
    func countLockout(from before: CredentialFailureState, to after: CredentialFailureState) {
        if after.passcodeHardLocked && !before.passcodeHardLocked {
            services.metrics.passcodeLockedOut(hard: true)
        } else if let until = after.passcodeLockedUntil, until != before.passcodeLockedUntil,
            after.passcodeFailures > before.passcodeFailures
        {
            services.metrics.passcodeLockedOut(hard: false)
        }
    }
}
