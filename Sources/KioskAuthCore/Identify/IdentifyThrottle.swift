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

/// Walk-up identify throttle (terminal-wide): N unknown fingers in a row pause identify for a
/// while.
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
