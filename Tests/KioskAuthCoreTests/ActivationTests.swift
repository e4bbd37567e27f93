import Foundation
import KioskAuthCore
import Testing

/// SplitMix64: a deterministic generator so the random-code test is repeatable.
private struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite("Activation codes")
struct ActivationCodeTests {
    @Test(
        "What a person types is normalised",
        arguments: [
            ("ABCD-EFGH", "ABCDEFGH"),
            ("abcd-efgh", "ABCDEFGH"),
            ("AbCdEfGh", "ABCDEFGH"),
            ("abcd efgh", "ABCDEFGH"),
            ("  ab-cd ef-gh \t", "ABCDEFGH"),
            ("O0I1-L1oi", "00111101"),
            ("zzzz-zzzz", "ZZZZZZZZ"),
        ])
    func typedCode_isNormalised(typed: String, normalized: String) throws {
        let code = try ActivationCode(parsing: typed)
        #expect(code.normalized == normalized)
        #expect(code.description == "\(normalized.prefix(4))-\(normalized.suffix(4))")
    }

    @Test(
        "Characters outside Crockford's alphabet are refused",
        arguments: ["ABCD-EFGU", "ubcd-efgh", "ABCD_EFGH", "ABCD-EFG!", "ÀBCD-EFGH", "ABCD.EFGH"])
    func badCharacter_isRefused(typed: String) {
        #expect {
            try ActivationCode(parsing: typed)
        } throws: { error in
            (error as? InvalidInputError)?.field == "activationCode"
        }
    }

    @Test(
        "Codes of the wrong length are refused",
        arguments: [
            "", "----", "ABCD-EFG", "ABCD-EFGHJ", "ABCDEFGH" + String(repeating: " ", count: 60),
        ])
    func wrongLength_isRefused(typed: String) {
        #expect(throws: InvalidInputError.self) { try ActivationCode(parsing: typed) }
    }

    @Test func bytes_areReadBigEndianFiveBitsPerCharacter() {
        #expect(ActivationCode(randomBytes: [0, 0, 0, 0, 0]).normalized == "00000000")
        #expect(
            ActivationCode(randomBytes: [0xFF, 0xFF, 0xFF, 0xFF, 0xFF]).normalized == "ZZZZZZZZ")
        // 0x8421084210 is 10000 repeated eight times: value 16, "G".
        #expect(
            ActivationCode(randomBytes: [0x84, 0x21, 0x08, 0x42, 0x10]).normalized == "GGGGGGGG")
        #expect(
            ActivationCode(randomBytes: [0x01, 0x23, 0x45, 0x67, 0x89]).description == "04HM-ASW9")
    }

    @Test func generatedCodes_parseBackToThemselves() throws {
        var generator = SplitMix64(state: 42)
        var seen = Set<String>()
        for _ in 0..<500 {
            let code = ActivationCode.random(using: &generator)
            #expect(try ActivationCode(parsing: code.description) == code)
            #expect(try ActivationCode(parsing: code.normalized.lowercased()) == code)
            #expect(!code.normalized.contains { "ILOU".contains($0) })
            seen.insert(code.normalized)
        }
        #expect(seen.count == 500)
    }
}

@Suite("Activation rate limit")
struct ActivationRateLimiterTests {
    @Test func fourWrongCodes_doNotPause_theFifthPausesUntilTheFirstLeavesTheWindow() {
        var limiter = ActivationRateLimiter()
        for minute in 0..<4 {
            limiter.recordFailure(now: testStart.plus(TimeInterval(minute * 60)))
            #expect(limiter.pausedUntil(now: testStart.plus(TimeInterval(minute * 60))) == nil)
        }
        limiter.recordFailure(now: testStart.plus(240))
        let until = testStart.plus(900)
        #expect(limiter.pausedUntil(now: testStart.plus(240)) == until)
        #expect(limiter.pausedUntil(now: until.plus(-1)) == until)
        #expect(limiter.pausedUntil(now: until) == nil)
    }

    @Test func wrongCodesSpreadWiderThanTheWindow_neverPause() {
        var limiter = ActivationRateLimiter()
        for step in 0..<20 {
            let now = testStart.plus(TimeInterval(step * 226))  // five span 904 s > 900 s
            limiter.recordFailure(now: now)
            #expect(limiter.pausedUntil(now: now) == nil, "step \(step)")
        }
    }

    @Test func windowSlides_aWrongCodeRightAfterAPausePausesAgain() {
        var limiter = ActivationRateLimiter()
        for index in 0..<5 { limiter.recordFailure(now: testStart.plus(TimeInterval(index * 100))) }
        let resumed = testStart.plus(900)
        #expect(limiter.pausedUntil(now: resumed) == nil)
        limiter.recordFailure(now: resumed)
        #expect(limiter.pausedUntil(now: resumed) == testStart.plus(1000))
    }

    @Test func storedFailures_stayBounded() {
        var limiter = ActivationRateLimiter()
        for second in 0..<100 { limiter.recordFailure(now: testStart.plus(TimeInterval(second))) }
        #expect(limiter.failures.count == 5)
        #expect(limiter.failures.first == testStart.plus(95))
        limiter.recordFailure(now: testStart.plus(10_000))
        #expect(limiter.failures == [testStart.plus(10_000)])
    }

    @Test func settingTheClockBack_doesNotLiftAPause() {
        var limiter = ActivationRateLimiter()
        for index in 0..<5 { limiter.recordFailure(now: testStart.plus(TimeInterval(index))) }
        #expect(limiter.pausedUntil(now: testStart.plus(-3600)) == testStart.plus(900))
    }

    @Test func limits_areConfigurable_andSurviveEncoding() throws {
        var limiter = ActivationRateLimiter(maxFailures: 2, window: 60)
        limiter.recordFailure(now: testStart)
        limiter.recordFailure(now: testStart.plus(10))
        #expect(limiter.pausedUntil(now: testStart.plus(10)) == testStart.plus(60))
        let decoded = try JSONDecoder().decode(
            ActivationRateLimiter.self, from: JSONEncoder().encode(limiter))
        #expect(decoded == limiter)
        #expect(decoded.pausedUntil(now: testStart.plus(59)) == testStart.plus(60))
    }
}
