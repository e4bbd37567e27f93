import FoundationEssentials
import Logging

#if canImport(Glibc)
    import Glibc
#endif

#if DEBUG
    /// Test-only delays, in debug builds only: when the environment variable `variable` holds a
    /// number of seconds, waits that long (or until the task is cancelled), after a warning that
    /// says what is being held back. Release builds have neither this function nor its callers.
    func testHookDelay(_ variable: String, logger: Logger, _ what: String) async {
        guard let delay = testHookSeconds(variable) else { return }
        logger.warning("TEST HOOK ACTIVE: \(what) \(delay) s late (debug build, tests only)")
        try? await Task.sleep(for: .seconds(delay))
    }

    /// The same for code that cannot await: blocks the calling thread (at most a minute).
    func testHookPause(_ variable: String) {
        guard let delay = testHookSeconds(variable), delay > 0 else { return }
        usleep(UInt32(min(delay, 60) * 1_000_000))
    }

    /// The seconds the environment variable `variable` holds, if it holds a number.
    func testHookSeconds(_ variable: String) -> Double? {
        ProcessInfo.processInfo.environment[variable].flatMap(Double.init)
    }
#endif
