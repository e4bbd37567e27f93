public import FoundationEssentials

/// The terminal-wide walk-up identify state, persisted so a restart does not lift a pause.
public struct IdentifyThrottleState: Codable, Sendable, Equatable {
    /// Unknown fingers in a row since the last identification or pause.
    public var unknownInARow: Int = 0
    /// Identify is paused until this instant.
    public var pausedUntil: Date? = nil
    /// When the failed or unknown touches of the last window happened (oldest first), whatever
    /// came between them: a match does not clear these. Optional so that a state saved before
    /// the window existed still decodes.
    public var recentFailures: [Date]? = nil

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
    /// Failed or unknown touches within ``failureWindow`` that start a pause even when matches
    /// came between them (default 10). Without it, one genuine touch after every few guesses
    /// would reset the run and give unlimited guesses at a colleague's finger.
    public var failuresInWindow: Int = 10
    /// The sliding window for ``failuresInWindow``, in seconds (default 600).
    public var failureWindow: TimeInterval = 600

    /// Makes a throttle; the defaults are docs/design.md's.
    public init(
        unknownFingersBeforePause: Int = 5, pause: TimeInterval = 60, failuresInWindow: Int = 10,
        failureWindow: TimeInterval = 600
    ) {
        self.unknownFingersBeforePause = unknownFingersBeforePause
        self.pause = pause
        self.failuresInWindow = failuresInWindow
        self.failureWindow = failureWindow
    }

    /// The failures still inside the window at `now`.
    func failures(in s: IdentifyThrottleState, now: Date) -> [Date] {
        (s.recentFailures ?? []).filter { now.timeIntervalSince($0) < failureWindow && $0 <= now }
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
        let inFlight = max(inFlight, 0)
        let fitsRun = s.unknownInARow + inFlight < unknownFingersBeforePause
        let fitsWindow = failures(in: s, now: now).count + inFlight < failuresInWindow
        return fitsRun && fitsWindow ? .admit : .wait
    }

    /// Records the result of one identify touch.
    ///
    /// An identification clears the run of unknown fingers, not the window. The Nth unknown
    /// finger in a row, or the ``failuresInWindow``th failure within ``failureWindow``, pauses
    /// matching for ``pause``. A pause from the run starts a new run; a pause from the window
    /// forgets only the oldest failure, so while the window is full each further failure pauses
    /// again: at most one guess per pause. A touch recorded during a pause changes nothing: it
    /// should not have been scanned.
    public func record(identified: Bool, in s: inout IdentifyThrottleState, now: Date) {
        if isPaused(s, now: now) != nil { return }
        s.pausedUntil = nil
        var window = failures(in: s, now: now)
        defer { s.recentFailures = window.isEmpty ? nil : window }
        if identified {
            s.unknownInARow = 0
            return
        }
        s.unknownInARow += 1
        window.append(now)
        if s.unknownInARow >= unknownFingersBeforePause {
            s.unknownInARow = 0
            s.pausedUntil = now.addingTimeInterval(pause)
        }
        if window.count >= failuresInWindow {
            window.removeFirst(window.count - (failuresInWindow - 1))
            s.pausedUntil = now.addingTimeInterval(pause)
        }
    }
}
