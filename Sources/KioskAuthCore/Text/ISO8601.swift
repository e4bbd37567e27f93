public import FoundationEssentials

/// ISO 8601 timestamps in UTC ("2026-11-27T18:20:19Z", or "…19.123Z" with milliseconds), the
/// one formatter for every time the daemon shows or sends: in replies, the audit trail and audit
/// delivery.
///
/// Plain integer arithmetic on the time since 2001, byte for byte what `Date.ISO8601FormatStyle`
/// writes in Swift 6.3 (the tests compare the two; milliseconds are truncated, as there: should
/// a later Foundation round them, the tests say so, and this keeps 6.3's text). Not that style itself: it builds a Gregorian calendar in
/// the current time zone first, and in a binary that links Foundation proper (postgres-nio
/// imports it) the zone comes from ICU's database. The first timestamp then loads ICU's zone
/// metadata, which kept about 1.3 MiB of ICU code and data resident in an idle daemon
/// (docs/footprint.md).
public enum ISO8601 {
    /// `date` in UTC, to the second or (with `milliseconds`) to the millisecond, truncated. Days
    /// are proleptic Gregorian, which Foundation's calendar also uses from 1582-10-15 on.
    public static func string(_ date: Date, milliseconds: Bool = false) -> String {
        // Foundation's arithmetic: the whole seconds and the nanoseconds of the time since 2001
        // (what a `Date` holds), the milliseconds truncated from those. Computed from 1970 instead,
        // the last digit would differ now and then: 0.884 s can be stored as 0.88399…
        let sinceReference = clamped(date.timeIntervalSinceReferenceDate)
        let whole = sinceReference.rounded(.down)
        let nanosecond = Int64((sinceReference - whole) * 1_000_000_000)
        let seconds = Int64(whole) + 978_307_200
        let millisecond = nanosecond / 1_000_000
        let (days, secondOfDay) = floorDivision(seconds, 86_400)
        let (year, month, day) = civilDate(daysSince1970: days)

        var text = ""
        text.reserveCapacity(24)
        if year < 0 { text.append("-") }
        append(abs(year), width: 4, to: &text)
        text.append("-")
        append(month, width: 2, to: &text)
        text.append("-")
        append(day, width: 2, to: &text)
        text.append("T")
        append(secondOfDay / 3600, width: 2, to: &text)
        text.append(":")
        append(secondOfDay / 60 % 60, width: 2, to: &text)
        text.append(":")
        append(secondOfDay % 60, width: 2, to: &text)
        if milliseconds {
            text.append(".")
            append(millisecond, width: 3, to: &text)
        }
        text.append("Z")
        return text
    }

    /// Seconds since 2001 within years 1 to 9999: a time read from a damaged record or a bad
    /// clock (even NaN or infinite) is shown as the nearest of those ends, never a crash in the
    /// conversion to integers.
    static func clamped(_ sinceReference: Double) -> Double {
        let first = -63_113_904_000.0  // 0001-01-01T00:00:00Z
        let last = 252_423_993_599.0  // 9999-12-31T23:59:59Z
        guard !sinceReference.isNaN else { return first }
        return min(max(sinceReference, first), last)
    }

    /// The proleptic Gregorian year, month and day of a day count from 1970-01-01 (Howard
    /// Hinnant's `civil_from_days`: 400-year eras of 146,097 days, years starting in March).
    static func civilDate(daysSince1970 days: Int64) -> (year: Int64, month: Int64, day: Int64) {
        let shifted = days + 719_468  // from 0000-03-01
        let (era, dayOfEra) = floorDivision(shifted, 146_097)
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let marchMonth = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * marchMonth + 2) / 5 + 1
        let month = marchMonth < 10 ? marchMonth + 3 : marchMonth - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        return (year, month, day)
    }

    private static func floorDivision(_ value: Int64, _ divisor: Int64) -> (quotient: Int64, remainder: Int64) {
        let remainder = value % divisor
        return remainder < 0 ? (value / divisor - 1, remainder + divisor) : (value / divisor, remainder)
    }

    private static func append(_ value: Int64, width: Int, to text: inout String) {
        let digits = String(value)
        if digits.utf8.count < width { text.append(String(repeating: "0", count: width - digits.utf8.count)) }
        text.append(digits)
    }
}
