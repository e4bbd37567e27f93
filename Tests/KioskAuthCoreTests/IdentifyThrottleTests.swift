import Foundation
import KioskAuthCore
import Testing

@Suite("Walk-up identify throttle")
struct IdentifyThrottleTests {
    let throttle = IdentifyThrottle()

    @Test func fifthUnknownFingerInARow_pausesIdentifyForAMinute() {
        var state = IdentifyThrottleState()
        for second in 0..<4 {
            throttle.record(
                identified: false, in: &state, now: testStart.plus(TimeInterval(second)))
            #expect(throttle.isPaused(state, now: testStart.plus(TimeInterval(second))) == nil)
        }
        let fifth = testStart.plus(4)
        throttle.record(identified: false, in: &state, now: fifth)
        #expect(throttle.isPaused(state, now: fifth) == fifth.plus(60))
        #expect(throttle.isPaused(state, now: fifth.plus(59)) == fifth.plus(60))
        #expect(throttle.isPaused(state, now: fifth.plus(60)) == nil)
    }

    @Test func identification_startsTheRunAgain() {
        var state = IdentifyThrottleState()
        for _ in 0..<4 { throttle.record(identified: false, in: &state, now: testStart) }
        throttle.record(identified: true, in: &state, now: testStart)
        #expect(state.unknownInARow == 0)
        for _ in 0..<4 { throttle.record(identified: false, in: &state, now: testStart) }
        #expect(throttle.isPaused(state, now: testStart) == nil)
        throttle.record(identified: false, in: &state, now: testStart)
        #expect(throttle.isPaused(state, now: testStart) == testStart.plus(60))
    }

    @Test func touchesDuringAPause_areNotCounted() {
        var state = IdentifyThrottleState()
        for _ in 0..<5 { throttle.record(identified: false, in: &state, now: testStart) }
        let paused = state
        throttle.record(identified: false, in: &state, now: testStart.plus(30))
        throttle.record(identified: true, in: &state, now: testStart.plus(30))
        #expect(state == paused)
    }

    @Test func afterAPause_anotherFullRunIsNeeded() {
        var state = IdentifyThrottleState()
        for _ in 0..<5 { throttle.record(identified: false, in: &state, now: testStart) }
        let resumed = testStart.plus(60)
        for _ in 0..<4 { throttle.record(identified: false, in: &state, now: resumed) }
        #expect(throttle.isPaused(state, now: resumed) == nil)
        #expect(state.pausedUntil == nil)
        throttle.record(identified: false, in: &state, now: resumed)
        #expect(throttle.isPaused(state, now: resumed) == resumed.plus(60))
    }

    @Test func limits_areConfigurable() {
        let strict = IdentifyThrottle(unknownFingersBeforePause: 2, pause: 300)
        var state = IdentifyThrottleState()
        strict.record(identified: false, in: &state, now: testStart)
        #expect(strict.isPaused(state, now: testStart) == nil)
        strict.record(identified: false, in: &state, now: testStart)
        #expect(strict.isPaused(state, now: testStart.plus(299)) == testStart.plus(300))
    }
}

@Suite("Fingerprint failures in a sliding window")
struct FingerFailureWindowTests {
    let throttle = IdentifyThrottle()

    /// The attack of the security review: four guesses at a colleague's finger, then one genuine
    /// touch of one's own to reset the run, again and again. The window stops it at its tenth
    /// failure, and from then on each further failure costs a whole pause.
    @Test func guessesBetweenGenuineTouches_areBoundedByTheWindow() {
        var state = IdentifyThrottleState()
        var now = testStart
        var guesses = 0
        while throttle.isPaused(state, now: now) == nil {
            for _ in 0..<4 where throttle.isPaused(state, now: now) == nil {
                #expect(throttle.admission(state, inFlight: 0, now: now) == .admit)
                throttle.record(identified: false, in: &state, now: now)
                guesses += 1
                now = now.plus(2)
            }
            if throttle.isPaused(state, now: now) == nil {
                throttle.record(identified: true, in: &state, now: now)
                now = now.plus(2)
            }
        }
        #expect(guesses == 10)
        // After the pause, one more failure pauses again: one guess per pause while the window is full.
        now = state.pausedUntil!
        #expect(throttle.admission(state, inFlight: 0, now: now) == .admit)
        throttle.record(identified: false, in: &state, now: now)
        #expect(throttle.isPaused(state, now: now) == now.plus(60))
    }

    @Test func failuresOlderThanTheWindow_areForgotten() {
        var state = IdentifyThrottleState()
        for second in 0..<9 {
            throttle.record(identified: second % 4 == 3, in: &state, now: testStart.plus(TimeInterval(second)))
        }
        // 7 failures in the first 9 s; 10 minutes later they no longer count.
        let later = testStart.plus(700)
        for _ in 0..<3 { throttle.record(identified: false, in: &state, now: later) }
        #expect(throttle.isPaused(state, now: later) == nil)
        #expect(state.recentFailures?.count == 3)
    }

    @Test func concurrentTouches_neverOutrunTheWindow() {
        var state = IdentifyThrottleState()
        for second in 0..<8 {
            throttle.record(identified: second % 4 == 3, in: &state, now: testStart.plus(TimeInterval(second)))
        }
        // 6 failures so far, run of 0 after the last match: 3 more may be in flight, not 4.
        let now = testStart.plus(10)
        #expect(throttle.admission(state, inFlight: 3, now: now) == .admit)
        #expect(throttle.admission(state, inFlight: 4, now: now) == .wait)
    }

    @Test func aStateSavedBeforeTheWindow_stillDecodes() throws {
        let old = Data(#"{"unknownInARow":2}"#.utf8)
        let state = try JSONDecoder().decode(IdentifyThrottleState.self, from: old)
        #expect(state.unknownInARow == 2 && state.recentFailures == nil)
    }
}
