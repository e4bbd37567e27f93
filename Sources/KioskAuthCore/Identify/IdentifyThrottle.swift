public import Foundation

/// The terminal-wide walk-up identify state, persisted so a restart does not lift a pause.
public struct IdentifyThrottleState: Codable, Sendable, Equatable {
    /// Unknown fingers in a row since the last identification or pause.
    public var unknownInARow: Int = 0
    /// Identify is paused until this instant.
    public var pausedUntil: Date? = nil

    /// A state with no unknown fingers and no pause.
    public init() {}
}

/// Whether one more touch may be scanned now.
public enum IdentifyAdmission: Sendable, Equatable {
    /// Scan it.
    case admit
    /// Wait: the touches already being scanned could, if all unknown, reach the pause; one may
    /// be scanned once one of them is recorded.
    case wait
    /// Fingerprint matching is paused until this instant.
    case paused(until: Date)
}

/// Fingerprint throttle (terminal-wide): N unknown or failed fingers in a row — walk-up identify
/// misses and failed 1:1 matches alike — pause fingerprint matching on the terminal for a while.
///
/// The pause bounds how fast anyone can try fingers against the whole roster (a false-match
/// attack). Verify, passcode and the other sign-in ways are not paused. Use per touch:
/// ``isPaused(_:now:)`` first, identify only when it returns `nil`, then
/// ``record(identified:in:now:)``.
public struct IdentifyThrottle: Sendable {
    /// Unknown fingers in a row that start a pause (default 5).
    public var unknownFingersBeforePause: Int = 5
    /// How long a pause lasts, in seconds (default 60).
    public var pause: TimeInterval = 60

    /// Makes a throttle; the defaults are docs/design.md's.
    public init(unknownFingersBeforePause: Int = 5, pause: TimeInterval = 60) {
        self.unknownFingersBeforePause = unknownFingersBeforePause
        self.pause = pause
    }

    /// The end of the pause if identify is paused at `now`, else `nil`. A pause ends at its
    /// instant.
    public func isPaused(_ s: IdentifyThrottleState, now: Date) -> Date? {
        guard let until = s.pausedUntil, now < until else { return nil }
        return until
    }

    /// May one more touch be scanned, with `inFlight` touches admitted and not yet recorded?
    /// Only while every touch in flight could turn out unknown without passing the limit, so that
    /// concurrent touches never outrun the count: N concurrent unknown fingers are exactly N
    /// scans before the pause, each with its own place in the run.
    public func admission(_ s: IdentifyThrottleState, inFlight: Int, now: Date) -> IdentifyAdmission {
        if let until = isPaused(s, now: now) { return .paused(until: until) }
        return s.unknownInARow + max(inFlight, 0) < unknownFingersBeforePause ? .admit : .wait
    }

    /// Records the result of one identify touch.
    ///
    /// An identification clears the run of unknown fingers. The Nth unknown finger in a row
    /// pauses identify for ``pause`` and starts a new run. A touch recorded during a pause
    /// changes nothing: it should not have been scanned.
    public func record(identified: Bool, in s: inout IdentifyThrottleState, now: Date) {
        if isPaused(s, now: now) != nil { return }
        s.pausedUntil = nil
        if identified {
            s.unknownInARow = 0
            return
        }
        s.unknownInARow += 1
        if s.unknownInARow >= unknownFingersBeforePause {
            s.unknownInARow = 0
            s.pausedUntil = now.addingTimeInterval(pause)
        }
    }
}
