import Foundation
import KioskAuthCore
import Testing

/// Limiters whose check awaits something (the reader, the identity provider) take their slot
/// before the await and settle it after: concurrent attempts never share one (issue #11, item 7).
@Suite("Slots reserved before the await")
struct ConcurrentSlotTests {
    let throttle = IdentifyThrottle()

    @Test func tenConcurrentUnknownTouches_exactlyFiveAreScannedBeforeThePause() {
        var state = IdentifyThrottleState()
        var inFlight = 0
        var waiting = 10
        var scanned = 0
        var positions: [Int] = []
        // Admit whoever may go; then the reader finishes one (unknown); repeat.
        while waiting > 0 {
            while waiting > 0, throttle.admission(state, inFlight: inFlight, now: testStart) == .admit {
                inFlight += 1
                waiting -= 1
            }
            if case .paused = throttle.admission(state, inFlight: inFlight, now: testStart) { break }
            guard inFlight > 0 else { break }
            inFlight -= 1
            scanned += 1
            positions.append(state.unknownInARow + 1)
            throttle.record(identified: false, in: &state, now: testStart)
        }
        while inFlight > 0 {
            inFlight -= 1
            scanned += 1
            throttle.record(identified: false, in: &state, now: testStart)
        }
        #expect(scanned == 5)
        #expect(positions == [1, 2, 3, 4, 5])
        #expect(waiting == 5)
        #expect(throttle.admission(state, inFlight: 0, now: testStart.plus(59)) == .paused(until: testStart.plus(60)))
    }

    @Test func touchesInFlight_makeTheNextWaitNotPause() {
        var state = IdentifyThrottleState()
        for _ in 0..<3 { throttle.record(identified: false, in: &state, now: testStart) }
        #expect(throttle.admission(state, inFlight: 1, now: testStart) == .admit)
        #expect(throttle.admission(state, inFlight: 2, now: testStart) == .wait)
        // One of them matched: the run is cleared and the next may go.
        throttle.record(identified: true, in: &state, now: testStart)
        #expect(throttle.admission(state, inFlight: 1, now: testStart) == .admit)
    }

    @Test func loginLimiter_admitsExactlyMaxFailuresConcurrentAttempts() {
        var limiter = ActivationRateLimiter(maxFailures: 10, window: 300)
        let admitted = (0..<15).filter { _ in limiter.reserve(now: testStart) }.count
        #expect(admitted == 10)
        #expect(limiter.pausedUntil(now: testStart) == testStart.plus(300))
    }

    @Test func loginLimiter_aReleasedSlotIsFreeAgain() {
        var limiter = ActivationRateLimiter(maxFailures: 2, window: 300)
        let first = limiter.reserve(now: testStart)
        let second = limiter.reserve(now: testStart.plus(1))
        let third = limiter.reserve(now: testStart.plus(2))
        #expect(first && second && !third)
        limiter.release(reservedAt: testStart.plus(1))
        let again = limiter.reserve(now: testStart.plus(2))
        #expect(again)
    }
}

/// Timers on the boot clock with a wall-clock high-water mark (issue #11, item 14).
@Suite("Steady time")
struct SteadyClockTests {
    let boot = ClockReading(wall: testStart, sinceBoot: .seconds(100), bootID: "boot-1")

    @Test func wallClockMovedForward_skipsNoLockoutDelay() {
        var clock = SteadyClock(first: boot)
        let guardian = CredentialGuard()
        var state = CredentialFailureState()
        // Three wrong passcodes: the third imposes a 60 s delay.
        for _ in 0..<3 {
            _ = guardian.recordPasscode(matched: false, in: &state, now: clock.time(at: boot))
        }
        // Ten seconds later on the boot clock, with the wall clock moved a day ahead.
        var later = boot.advanced(by: .seconds(10))
        later.wall = later.wall.addingTimeInterval(86400)
        #expect(guardian.passcodeGate(state, now: clock.time(at: later)) == .delayed(until: testStart.plus(60)))
        // The delay ends after 60 s on the boot clock, whatever the wall clock says.
        var after = boot.advanced(by: .seconds(60))
        after.wall = testStart.plus(-3600)
        #expect(guardian.passcodeGate(state, now: clock.time(at: after)) == .allowed)
    }

    @Test func aRebootWithTheWallClockSetBack_doesNotRewindSteadyTime() {
        var clock = SteadyClock(first: boot)
        clock.checkpoint(boot.advanced(by: .seconds(500)))
        let rebooted = ClockReading(wall: testStart.plus(-7200), sinceBoot: .seconds(5), bootID: "boot-2")
        #expect(clock.time(at: rebooted) == testStart.plus(500))
        #expect(clock.time(at: rebooted.advanced(by: .seconds(30))) == testStart.plus(530))
        // A reboot with the wall clock ahead resumes from the wall clock.
        let ahead = ClockReading(wall: testStart.plus(9000), sinceBoot: .seconds(3), bootID: "boot-3")
        #expect(clock.time(at: ahead) == testStart.plus(9000))
    }

    @Test func aPauseOnSteadyTime_endsOnTheBootClockWithTheWallClockSetBack() {
        var clock = SteadyClock(first: boot)
        let throttle = IdentifyThrottle()
        var state = IdentifyThrottleState()
        for _ in 0..<5 { throttle.record(identified: false, in: &state, now: clock.time(at: boot)) }
        #expect(throttle.isPaused(state, now: clock.time(at: boot)) != nil)
        var after = boot.advanced(by: .seconds(61))
        after.wall = testStart.plus(-86400)
        #expect(throttle.isPaused(state, now: clock.time(at: after)) == nil)
    }
}
