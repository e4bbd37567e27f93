/// Decides from libfprint's finger-status reports whether a scan came from a fresh touch.
///
/// A touch is fresh when the reader, while waiting for a finger (`NEEDED`), saw the sensor empty
/// before it saw a finger. A finger reported present at the start of the scan, or present before
/// the reader ever reported waiting with an empty sensor, was already there: the scan is not
/// accepted as a touch made for this request.
///
/// Drivers that never report finger status leave nothing to judge; their scans are accepted
/// (`reportsFingerStatus` stays false so callers can log that).
struct TouchFreshness: Sendable, Equatable {
    /// The `FpFingerStatusFlags` bits, spelled here so this type stays free of C.
    struct Status: OptionSet, Sendable, Equatable {
        let rawValue: UInt32
        static let needed = Status(rawValue: 1 << 0)
        static let present = Status(rawValue: 1 << 1)
    }

    private(set) var reportsFingerStatus = false
    private(set) var sawEmptySensorWhileWaiting = false
    private(set) var sawFingerBeforeEmptySensor = false

    /// Starts judging a scan; `initial` is the status when the scan begins.
    init(initial: Status) {
        observe(initial)
    }

    /// Records one finger-status report.
    mutating func observe(_ status: Status) {
        if !status.isEmpty { reportsFingerStatus = true }
        if status.contains(.needed) && !status.contains(.present) {
            sawEmptySensorWhileWaiting = true
        }
        if status.contains(.present) && !sawEmptySensorWhileWaiting {
            sawFingerBeforeEmptySensor = true
        }
    }

    /// Whether the scan may be accepted as a fresh touch.
    var isFresh: Bool { !sawFingerBeforeEmptySensor }
}
