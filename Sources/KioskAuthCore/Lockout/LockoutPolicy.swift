public import FoundationEssentials

/// How consecutive credential failures are answered (docs/design.md, §3.1 "Passcodes and
/// lockout" and §3.2 "Fingerprints").
public struct LockoutPolicy: Sendable, Equatable {
    /// Delay imposed after the Nth consecutive failure (index 0 = 1st failure).
    /// Default `[0, 0, 60, 300, 900, 1800, 1800, 1800, 1800]`.
    ///
    /// Failures beyond the end of the list (but before ``hardLockAfter``) reuse the last entry;
    /// an empty list means no delays. Negative entries count as no delay.
    public var delays: [TimeInterval]
    /// The consecutive passcode failure that hard-locks the passcode (default the 10th).
    public var hardLockAfter: Int = 10
    /// Consecutive failed fingerprint matches after which a fallback is required (default 3).
    public var fingerprintFailuresBeforeFallback: Int = 3

    /// docs/design.md's schedule: failures 1–2 no delay; 3rd 1 min; 4th 5 min; 5th 15 min; 6th–9th
    /// 30 min each; 10th hard lock; fallback after 3 failed fingerprint matches.
    public static let `default` = LockoutPolicy()

    /// Makes a policy; the defaults are docs/design.md's.
    public init(
        delays: [TimeInterval] = [0, 0, 60, 300, 900, 1800, 1800, 1800, 1800],
        hardLockAfter: Int = 10,
        fingerprintFailuresBeforeFallback: Int = 3
    ) {
        self.delays = delays
        self.hardLockAfter = hardLockAfter
        self.fingerprintFailuresBeforeFallback = fingerprintFailuresBeforeFallback
    }

    /// The delay after the `failure`th consecutive failure (1-based), ignoring the hard lock.
    public func delay(afterFailure failure: Int) -> TimeInterval {
        guard failure >= 1, let last = delays.last else { return 0 }
        let delay = failure <= delays.count ? delays[failure - 1] : last
        return max(delay, 0)
    }
}
