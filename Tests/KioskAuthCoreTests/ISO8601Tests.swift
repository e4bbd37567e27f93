import FoundationEssentials
import Testing

@testable import KioskAuthCore

@Suite struct ISO8601Tests {
    /// What the daemon wrote before, with Foundation's own formatter.
    private func foundation(_ date: Date, milliseconds: Bool) -> String {
        date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: milliseconds))
    }

    @Test func writesWhatFoundationWritesAtTheEdges() {
        let edges: [Double] = [
            0, 1, -1, 59, 60, 3599, 3600, 86_399, 86_400, -86_400, -86_401,
            951_782_400,  // 2000-02-29, a leap day of a century year
            4_107_456_000,  // 2100-02-28 (no leap day in 2100)
            4_107_542_400,  // 2100-03-01
            1_795_803_619,  // 2026-11-27T18:20:19Z
            253_402_300_799,  // 9999-12-31T23:59:59Z
            -12_219_292_800,  // 1582-10-15T00:00:00Z, the first Gregorian day
            0.999_9, 0.000_5, 0.999, 0.001, 1.5, -0.000_5, -0.999_9, -1.5,
            1_795_803_619.999_5, 1_795_803_619.000_4, 1_795_803_619.123_456,
        ]
        for seconds in edges {
            let date = Date(timeIntervalSince1970: seconds)
            for milliseconds in [false, true] {
                #expect(
                    ISO8601.string(date, milliseconds: milliseconds) == foundation(date, milliseconds: milliseconds),
                    "\(seconds) milliseconds: \(milliseconds)")
            }
        }
        #expect(ISO8601.string(Date(timeIntervalSince1970: 1_795_803_619.123_456)) == "2026-11-27T18:20:19Z")
        #expect(
            ISO8601.string(Date(timeIntervalSince1970: 1_795_803_619.123_456), milliseconds: true)
                == "2026-11-27T18:20:19.123Z")
        #expect(ISO8601.string(Date(timeIntervalSince1970: -1)) == "1969-12-31T23:59:59Z")
    }

    @Test func writesWhatFoundationWritesForAnyTimeOfTheseCenturies() {
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<20_000 {
            // 1900 to 2200, to the microsecond, as audit times are.
            let microseconds = Int64.random(in: -2_208_988_800_000_000...7_258_118_400_000_000, using: &generator)
            let date = Date(timeIntervalSince1970: Double(microseconds) / 1_000_000)
            for milliseconds in [false, true] {
                let ours = ISO8601.string(date, milliseconds: milliseconds)
                let theirs = foundation(date, milliseconds: milliseconds)
                #expect(ours == theirs, "\(microseconds) µs")
                if ours != theirs { return }
            }
        }
    }

    @Test func timesOutsideYearsOneTo9999AreClampedNotACrash() {
        let latest = "9999-12-31T23:59:59Z"
        let earliest = "0001-01-01T00:00:00Z"
        #expect(ISO8601.string(Date(timeIntervalSinceReferenceDate: .infinity)) == latest)
        #expect(ISO8601.string(Date(timeIntervalSinceReferenceDate: .greatestFiniteMagnitude)) == latest)
        #expect(
            ISO8601.string(Date(timeIntervalSinceReferenceDate: 1e300), milliseconds: true)
                == "9999-12-31T23:59:59.000Z")
        #expect(ISO8601.string(Date(timeIntervalSinceReferenceDate: -.infinity)) == earliest)
        #expect(ISO8601.string(Date(timeIntervalSinceReferenceDate: -1e300)) == earliest)
        #expect(ISO8601.string(Date(timeIntervalSinceReferenceDate: .nan)) == earliest)
        #expect(ISO8601.string(Date.distantFuture) == foundation(Date.distantFuture, milliseconds: false))
    }

    @Test func civilDatesRoundTheYear() {
        #expect(ISO8601.civilDate(daysSince1970: 0) == (1970, 1, 1))
        #expect(ISO8601.civilDate(daysSince1970: -1) == (1969, 12, 31))
        #expect(ISO8601.civilDate(daysSince1970: 11_016) == (2000, 2, 29))
        #expect(ISO8601.civilDate(daysSince1970: 47_540) == (2100, 2, 28))
        #expect(ISO8601.civilDate(daysSince1970: 47_541) == (2100, 3, 1))
    }
}
