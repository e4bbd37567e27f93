public import FoundationEssentials

/// Terminal steady time: the clock every lockout delay, pause, limiter window and ticket lifetime
/// runs on.
///
/// Within one boot it advances only with the boot clock (`CLOCK_BOOTTIME`, which cannot be set and
/// counts suspend), so moving the wall clock forward skips no delay and setting it back extends
/// none. At a new boot the boot clock restarts, and steady time resumes from the larger of the
/// wall clock and the last steady time recorded (a wall-clock high-water mark), so a reboot with
/// the wall clock set back does not rewind it either. Values are `Date`s on the wall clock's scale:
/// equal to the wall clock at the first reading of a boot, apart from it by however far the wall
/// clock was moved since. Pure: the daemon passes readings in and persists the value.
public struct SteadyClock: Codable, Sendable, Hashable {
    /// A reading of the current boot, and the steady time at it.
    public private(set) var anchor: ClockReading
    /// The steady time at `anchor`.
    public private(set) var anchorTime: Date

    /// Starts steady time at the wall clock of `first`.
    public init(first: ClockReading) {
        anchor = first
        anchorTime = first.wall
    }

    /// The steady time at `reading`. A reading from another boot re-anchors the clock, from the
    /// larger of its wall clock and the last steady time recorded; a reading earlier than the
    /// anchor in the same boot (readings raced) never goes back before it.
    public mutating func time(at reading: ClockReading) -> Date {
        if let elapsed = reading.bootTimeElapsed(since: anchor) {
            return ClockMath.date(anchorTime, plus: max(elapsed, .zero))
        }
        anchorTime = max(reading.wall, anchorTime)
        anchor = reading
        return anchorTime
    }

    /// Moves the anchor to `reading` (same boot), so that the value persisted carries a recent
    /// high-water mark into the next boot.
    public mutating func checkpoint(_ reading: ClockReading) {
        let now = time(at: reading)
        guard reading.bootTimeElapsed(since: anchor).map({ $0 >= .zero }) ?? true else { return }
        anchor = reading
        anchorTime = now
    }
}
