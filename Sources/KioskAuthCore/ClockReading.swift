// The time model shared by the offline window, the refresh schedule and sessions.
//
// Why a reading has three parts: the wall clock (`CLOCK_REALTIME`) is what people and the
// identity provider mean by "time", but anyone with root — or a confused NTP server — can move it;
// the boot clock (`CLOCK_BOOTTIME`) only ever moves forward and keeps counting while the machine is
// suspended, but it restarts at zero with every boot, so a boot-clock value means nothing without
// the boot it belongs to (`/proc/sys/kernel/random/boot_id`). Decisions that must not be extended
// by setting the clock back measure elapsed time on the boot clock when both readings come from
// the same boot, and fall back to durable wall-clock bookkeeping across boots.
//
// Nothing in this module reads a clock: the daemon takes readings and passes them in, and tests
// construct them, so every rule can be exercised at an exact second.

public import FoundationEssentials

/// One observation of the terminal's clocks, taken by the daemon at a single moment.
///
/// The core never reads a clock itself; every decision is a function of the readings it is given.
public struct ClockReading: Sendable, Hashable, Codable {
    /// The wall-clock time (`CLOCK_REALTIME`); may jump in either direction.
    public var wall: Date
    /// Time since the kernel booted on `CLOCK_BOOTTIME`, which keeps counting during suspend and
    /// never goes backwards within one boot.
    public var sinceBoot: Duration
    /// The kernel's boot identifier; boot-clock values are comparable only when these are equal.
    public var bootID: String

    /// Creates a reading from its three parts.
    public init(wall: Date, sinceBoot: Duration, bootID: String) {
        self.wall = wall
        self.sinceBoot = sinceBoot
        self.bootID = bootID
    }

    /// Whether `other` was taken during the same boot, so that boot-clock values can be compared.
    public func isSameBoot(as other: ClockReading) -> Bool {
        bootID == other.bootID
    }

    /// The boot-clock time from `earlier` to this reading, or `nil` when they come from different
    /// boots; negative when `earlier` was in fact taken later.
    public func bootTimeElapsed(since earlier: ClockReading) -> Duration? {
        guard isSameBoot(as: earlier) else { return nil }
        return sinceBoot - earlier.sinceBoot
    }

    /// The reading taken `duration` later in the same boot, with both clocks advancing together.
    ///
    /// Useful for tests and for projecting deadlines; a real later reading may disagree.
    public func advanced(by duration: Duration) -> ClockReading {
        ClockReading(
            wall: ClockMath.date(wall, plus: duration), sinceBoot: sinceBoot + duration, bootID: bootID)
    }
}

/// Conversions between `Duration` and Foundation's `TimeInterval`, kept in one place so rounding
/// behaves the same everywhere.
enum ClockMath {
    /// `duration` as seconds.
    static func timeInterval(_ duration: Duration) -> TimeInterval {
        let parts = duration.components
        return TimeInterval(parts.seconds) + TimeInterval(parts.attoseconds) * 1e-18
    }

    /// The signed wall-clock time from `start` to `end`.
    static func duration(from start: Date, to end: Date) -> Duration {
        .seconds(end.timeIntervalSince(start))
    }

    /// `date` moved by `duration`.
    static func date(_ date: Date, plus duration: Duration) -> Date {
        date.addingTimeInterval(timeInterval(duration))
    }

}
