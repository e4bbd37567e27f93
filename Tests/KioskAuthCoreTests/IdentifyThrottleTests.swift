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
