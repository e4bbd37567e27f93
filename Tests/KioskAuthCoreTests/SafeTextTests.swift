import Testing

@testable import KioskAuthCore

@Suite struct SafeTextTests {
    @Test func refusesControlAndBidiCharacters() {
        for bad in [
            "login\u{0}evil", "a\u{1B}[31mred", "tab\there", "line\nbreak", "del\u{7F}", "c1\u{9B}31m",
            "\u{202E}gpj.exe", "iso\u{2066}late", "x\u{202A}", "pop\u{2069}",
            "line\u{2028}forged", "para\u{2029}",
        ] {
            #expect(SafeText.firstForbidden(in: bad) != nil, "\(bad.debugDescription)")
            #expect(throws: InvalidInputError.self) { try SafeText.check(bad, field: "context.service") }
        }
    }

    @Test func acceptsOrdinaryText() throws {
        for good in ["Sarah Kowalski", "Zoë Ødegård", "محمد", "李小龍", "gdm-password", "a\u{200F}b", ""] {
            try SafeText.check(good, field: "displayName")
        }
    }

    @Test func errorNamesTheFieldAndTheCharacter() {
        do {
            try SafeText.check("login\u{0}evil", field: "context.service")
            Issue.record("accepted a NUL")
        } catch {
            #expect(error.field == "context.service")
            #expect(error.message.contains("U+0000"))
        }
    }

    @Test func escapesForTerminals() {
        #expect(SafeText.escaped("a\u{1B}[2Jb") == "a\\x1B[2Jb")
        #expect(SafeText.escaped("\u{202E}evil") == "\\u{202E}evil")
        #expect(SafeText.escaped("nul\u{0}") == "nul\\x00")
        #expect(SafeText.escaped("plain \\ text") == "plain \\ text")
        #expect(SafeText.escaped("x\u{9B}y").unicodeScalars.allSatisfy { !SafeText.isForbidden($0) })
    }
}

@Suite struct RequestRateLimitTests {
    @Test func exactlyTheRatePassesInABurst() {
        var limit = RequestRateLimit(rate: 5)
        var passed = 0
        for _ in 0..<50 where limit.take(uid: 1000, now: 10) == nil { passed += 1 }
        #expect(passed == 5)
        // Another uid has its own bucket.
        let other = limit.take(uid: 1001, now: 10)
        #expect(other == nil)
    }

    @Test func refillsAtTheRateAndSaysWhenToRetry() throws {
        var limit = RequestRateLimit(rate: 4)
        for _ in 0..<4 {
            let taken = limit.take(uid: 7, now: 0)
            #expect(taken == nil)
        }
        let denied = limit.take(uid: 7, now: 0)
        let retry = try #require(denied)
        #expect(abs(retry - 0.25) < 1e-9)
        let refilled = limit.take(uid: 7, now: 0.25)
        #expect(refilled == nil)
        let again = limit.take(uid: 7, now: 0.25)
        #expect(again != nil)
        // A quiet second refills the bucket, never beyond one second's worth.
        var passed = 0
        for _ in 0..<20 where limit.take(uid: 7, now: 100) == nil { passed += 1 }
        #expect(passed == 4)
    }

    @Test func forgetsQuietUIDsBeyondTheBound() {
        var limit = RequestRateLimit(rate: 1)
        for uid in 0..<(RequestRateLimit.trackedUIDs * 3) { _ = limit.take(uid: uid, now: Double(uid)) }
        // uid 0 has long refilled: it is not held to its old (empty) bucket.
        let old = limit.take(uid: 0, now: Double(RequestRateLimit.trackedUIDs * 3))
        #expect(old == nil)
    }
}
