public import FoundationEssentials

/// Per-terminal activation attempt limit: 5 wrong codes in 15 min pause activation.
///
/// A sliding window: activation is paused while ``maxFailures`` wrong codes lie within the last
/// ``window`` seconds, that is until the oldest of them is ``window`` old. Callers check
/// ``pausedUntil(now:)`` before checking a code, and record every wrong code they checked.
public struct ActivationRateLimiter: Sendable, Codable, Equatable {
    /// Wrong codes within ``window`` that pause activation (default 5).
    public var maxFailures: Int = 5
    /// The window, in seconds (default 900).
    public var window: TimeInterval = 900
    /// The instants of the most recent wrong codes, oldest first; at most ``maxFailures`` are
    /// kept, and none older than ``window`` at the last recording.
    public private(set) var failures: [Date] = []

    /// Makes a limiter with no failures; the defaults are docs/design.md's.
    public init(maxFailures: Int = 5, window: TimeInterval = 900) {
        self.maxFailures = maxFailures
        self.window = window
    }

    /// When activation may resume, if it is paused at `now`; `nil` if it is not paused.
    ///
    /// Failures dated after `now` (the clock was set back) still count, so setting the clock
    /// back never lifts a pause early.
    public func pausedUntil(now: Date) -> Date? {
        guard maxFailures >= 1 else { return nil }
        let recent = failures.filter { now.timeIntervalSince($0) < window }
        guard recent.count >= maxFailures else { return nil }
        let until = recent[recent.count - maxFailures].addingTimeInterval(window)
        return until > now ? until : nil
    }

    /// Takes a failure slot at `now` before an attempt whose check awaits (the identity
    /// provider): counted as a failure from now on, so concurrent attempts never share a slot.
    /// Returns `false`, taking nothing, while paused. Settle with ``release(reservedAt:)`` when the
    /// attempt turns out not to be a failure.
    public mutating func reserve(now: Date) -> Bool {
        guard pausedUntil(now: now) == nil else { return false }
        recordFailure(now: now)
        return true
    }

    /// Gives back a slot taken by ``reserve(now:)`` at `reservedAt`.
    public mutating func release(reservedAt: Date) {
        if let index = failures.lastIndex(of: reservedAt) { failures.remove(at: index) }
    }

    /// Records a wrong code checked at `now`.
    public mutating func recordFailure(now: Date) {
        failures.append(now)
        failures.sort()
        failures.removeAll { now.timeIntervalSince($0) >= window }
        if failures.count > maxFailures {
            failures.removeFirst(failures.count - max(maxFailures, 0))
        }
    }
}
