public import FoundationEssentials
public import KioskAuthCore

#if canImport(Glibc)
    import Glibc
#endif

/// The daemon's one source of time: every decision about the offline window, refreshes and
/// sessions takes a `ClockReading` from here, and the authority's `now` is its wall clock.
///
/// A reading is the wall clock (`CLOCK_REALTIME`), the boot clock (`CLOCK_BOOTTIME`, which
/// counts suspend and cannot be set) and the kernel's boot id, taken together.
///
/// Test-only: debug builds honour `KIOSKAUTH_TEST_CLOCK_FILE`, the path of a JSON file
/// `{"wallOffsetSeconds": N, "bootOffsetSeconds": N, "bootID": "..."}` (every member optional)
/// re-read at every reading and added to the real clocks, so end-to-end tests can move time by
/// hours, set the wall clock back, or pretend the terminal rebooted. Release builds do not
/// contain this code, whatever the environment says.
public struct DaemonClock: Sendable {
    /// The kernel's boot id; constant for the life of the process.
    public let bootID: String
    #if DEBUG
        /// The test clock file, when one was given (debug builds only).
        public let testClockFile: String?
    #endif
    /// Where readings come from instead of the system clocks, for in-process tests.
    var source: (@Sendable () -> ClockReading)? = nil

    /// The system clocks.
    public static func system(environment: [String: String]? = nil) -> DaemonClock {
        let bootID = (try? TextFile.read("/proc/sys/kernel/random/boot_id"))?.trimmingWhitespace() ?? ""
        #if DEBUG
            let file = EnvironmentLookup(environment)["KIOSKAUTH_TEST_CLOCK_FILE"].flatMap { $0.isEmpty ? nil : $0 }
            return DaemonClock(bootID: bootID.isEmpty ? "unknown-boot" : bootID, testClockFile: file)
        #else
            return DaemonClock(bootID: bootID.isEmpty ? "unknown-boot" : bootID)
        #endif
    }

    /// Whether readings are shifted by a test clock file (debug builds only).
    public var isTestClock: Bool {
        #if DEBUG
            return testClockFile != nil
        #else
            return false
        #endif
    }

    /// Whether readings are the system clocks themselves: neither shifted by a test clock file
    /// nor taken from an in-process test's source, so that time passes only as it really does.
    var followsSystemClocks: Bool { source == nil && !isTestClock }

    /// A clock whose readings all come from `source` (for in-process tests).
    static func readings(bootID: String, _ source: @escaping @Sendable () -> ClockReading) -> DaemonClock {
        #if DEBUG
            DaemonClock(bootID: bootID, testClockFile: nil, source: source)
        #else
            DaemonClock(bootID: bootID, source: source)
        #endif
    }

    /// Reads all three clocks now.
    public func reading() -> ClockReading {
        if let source { return source() }
        var boot = timespec()
        clock_gettime(CLOCK_BOOTTIME, &boot)
        var reading = ClockReading(
            wall: Date(), sinceBoot: .seconds(Int64(boot.tv_sec)) + .nanoseconds(Int64(boot.tv_nsec)), bootID: bootID)
        #if DEBUG
            if let testClockFile, let shift = TestClockShift.load(testClockFile) {
                reading.wall = reading.wall.addingTimeInterval(shift.wallOffsetSeconds ?? 0)
                reading.sinceBoot += .milliseconds(Int64(((shift.bootOffsetSeconds ?? 0) * 1000).rounded()))
                if let id = shift.bootID, !id.isEmpty { reading.bootID = id }
            }
        #endif
        return reading
    }

    /// The wall clock.
    public func now() -> Date { reading().wall }
}

#if DEBUG
    /// The test clock file's contents (debug builds only).
    struct TestClockShift: Decodable {
        var wallOffsetSeconds: Double?
        var bootOffsetSeconds: Double?
        var bootID: String?

        static func load(_ path: String) -> TestClockShift? {
            guard let data = FileManager.default.contents(atPath: path) else { return nil }
            return try? JSONDecoder().decode(TestClockShift.self, from: data)
        }
    }
#endif
