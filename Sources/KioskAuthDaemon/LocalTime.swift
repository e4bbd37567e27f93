public import FoundationEssentials

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Local wall-clock time from the C library's time zone (`TZ`, else `/etc/localtime`, from the
/// system's tz database).
///
/// FoundationEssentials knows only GMT: its `TimeZone.current` ignores the system's zone without
/// the ICU-backed FoundationInternationalization, which the daemon does not load
/// (docs/footprint.md). The overnight session cut-off ("04:00 local") is found here instead, with
/// `localtime_r(3)` and `mktime(3)`, by the rules `Calendar.nextDate(…, matchingPolicy:
/// .nextTime, repeatedTimePolicy: .first)` follows.
public enum LocalTime {
    /// The first instant strictly after `after` at which the local clock shows `hour`:`minute`:00.
    /// A time skipped on a DST night resolves to the first instant after the gap; a time that
    /// occurs twice resolves to its first occurrence.
    public static func next(after: Date, hour: Int, minute: Int) -> Date? {
        tzset()
        let start = time_t(after.timeIntervalSince1970.rounded(.down))
        guard var day = broken(start) else { return nil }
        // Today, tomorrow and (past a skipped day, which some zones have had) the day after.
        for _ in 0..<3 {
            if let found = occurrence(on: day, hour: hour, minute: minute, after: start) {
                return Date(timeIntervalSince1970: Double(found))
            }
            // Noon of the next day: away from any transition.
            var next = day
            next.tm_mday += 1
            next.tm_hour = 12
            next.tm_min = 0
            next.tm_sec = 0
            next.tm_isdst = -1
            let noon = mktime(&next)
            guard noon != -1, let following = broken(noon) else { return nil }
            day = following
        }
        return nil
    }

    /// The first instant after `after` on the local date of `day` showing `hour`:`minute`:00 (the
    /// second occurrence when `after` lies between the two), or the end of the gap when the clock
    /// skips that time.
    private static func occurrence(on day: tm, hour: Int, minute: Int, after: time_t) -> time_t? {
        var candidates: [time_t] = []
        // Each reading of the time (standard, daylight, either): mktime normalises a reading
        // that does not apply, so only those that show the asked time on the asked date count.
        for isDST: Int32 in [-1, 0, 1] {
            var wanted = day
            wanted.tm_hour = Int32(hour)
            wanted.tm_min = Int32(minute)
            wanted.tm_sec = 0
            wanted.tm_isdst = isDST
            let instant = mktime(&wanted)
            guard instant != -1, let shown = broken(instant) else { continue }
            if shown.tm_year == day.tm_year, shown.tm_yday == day.tm_yday, shown.tm_hour == Int32(hour),
                shown.tm_min == Int32(minute), shown.tm_sec == 0
            {
                candidates.append(instant)
            }
        }
        if !candidates.isEmpty { return candidates.filter { $0 > after }.min() }
        // Skipped: the first instant of that date whose local time of day is past the asked one
        // (the moment the clock jumps), found by bisection over the day.
        var noon = day
        noon.tm_hour = 12
        noon.tm_min = 0
        noon.tm_sec = 0
        noon.tm_isdst = -1
        let middle = mktime(&noon)
        guard middle != -1 else { return nil }
        let target = Int32(hour * 3600 + minute * 60)
        func isPast(_ instant: time_t) -> Bool {
            guard let shown = broken(instant) else { return false }
            if shown.tm_yday != day.tm_yday || shown.tm_year != day.tm_year {
                return shown.tm_year > day.tm_year || (shown.tm_year == day.tm_year && shown.tm_yday > day.tm_yday)
            }
            return shown.tm_hour * 3600 + shown.tm_min * 60 + shown.tm_sec >= target
        }
        var low = middle - 36 * 3600
        var high = middle + 36 * 3600
        guard !isPast(low), isPast(high) else { return nil }
        while high - low > 1 {
            let probe = low + (high - low) / 2
            if isPast(probe) { high = probe } else { low = probe }
        }
        return high > after ? high : nil
    }

    private static func broken(_ instant: time_t) -> tm? {
        var seconds = instant
        var result = tm()
        return localtime_r(&seconds, &result) == nil ? nil : result
    }
}
