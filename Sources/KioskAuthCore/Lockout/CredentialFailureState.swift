public import FoundationEssentials

/// Consecutive-failure state of one person's credentials, persisted by the store as plain columns.
///
/// It changes only through ``CredentialGuard``; the store writes it durably after every change so
/// the counters survive restarts.
public struct CredentialFailureState: Codable, Sendable, Equatable {
    /// Consecutive failed passcode attempts.
    public var passcodeFailures: Int = 0
    /// No passcode attempt is accepted before this instant.
    public var passcodeLockedUntil: Date? = nil
    /// Set at the hard-lock failure (the 10th by default): no passcode attempt is accepted until
    /// an admin reset or an online login.
    public var passcodeHardLocked: Bool = false
    /// Consecutive failed fingerprint matches.
    public var fingerprintFailures: Int = 0

    /// A state with no failures.
    public init() {}

    /// A state with the given values, as read back from the store.
    public init(
        passcodeFailures: Int, passcodeLockedUntil: Date?, passcodeHardLocked: Bool,
        fingerprintFailures: Int
    ) {
        self.passcodeFailures = passcodeFailures
        self.passcodeLockedUntil = passcodeLockedUntil
        self.passcodeHardLocked = passcodeHardLocked
        self.fingerprintFailures = fingerprintFailures
    }
}
