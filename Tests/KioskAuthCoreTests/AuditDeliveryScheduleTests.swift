import KioskAuthCore
import Testing

/// A monotonic instant the tests name exactly: seconds since an arbitrary start.
private struct Instant: InstantProtocol {
    var offset: Duration
    func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
    func duration(to other: Instant) -> Duration { other.offset - offset }
    static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
}

private func at(_ seconds: Double) -> Instant { Instant(offset: .seconds(seconds)) }

/// Always the same word: `.lowest` gives no jitter, `.highest` the most.
private struct ConstantRandom: RandomNumberGenerator {
    static var lowest: ConstantRandom { ConstantRandom(word: 0) }
    static var highest: ConstantRandom { ConstantRandom(word: .max) }
    let word: UInt64
    mutating func next() -> UInt64 { word }
}

private typealias Schedule = AuditDeliverySchedule<Instant>

private let policy = AuditDeliveryPolicy(
    batchSize: 10, initialBackoff: .seconds(2), maximumBackoff: .seconds(60), backoffJitter: 0.2)

/// Sends the next batch at `seconds` and completes it with `outcome`.
@discardableResult
private func attempt(
    _ schedule: inout Schedule, head: Int, at seconds: Double, _ outcome: AuditDeliveryOutcome,
    random: ConstantRandom = .lowest
) -> (range: ClosedRange<Int>?, completion: Schedule.Completion?) {
    guard case .send(let range) = schedule.next(head: head, at: at(seconds)) else { return (nil, nil) }
    var random = random
    return (range, schedule.complete(outcome, at: at(seconds), using: &random))
}

@Suite("Audit delivery schedule")
struct AuditDeliveryScheduleTests {
    @Test func emptyTrail_waitsForEntries() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        #expect(schedule.next(head: 0, at: at(0)) == .wait(until: nil))
        #expect(schedule.phase == .ready)
    }

    @Test func firstBatch_startsAfterTheCursor_andIsCappedAtTheBatchSize() {
        var fresh = Schedule(policy: policy, deliveredThrough: 0)
        #expect(fresh.next(head: 25, at: at(0)) == .send(1...10))
        var resumed = Schedule(policy: policy, deliveredThrough: 17)
        #expect(resumed.next(head: 25, at: at(0)) == .send(18...25))
        #expect(resumed.queued(head: 25) == 8)
    }

    @Test func batchInFlight_nothingElseIsSent() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        #expect(schedule.next(head: 3, at: at(0)) == .send(1...3))
        #expect(schedule.next(head: 9, at: at(1)) == .wait(until: nil))
        #expect(schedule.phase == .sending(1...3))
    }

    @Test func accepted_advancesTheCursorToTheBatchEnd_andTheNextBatchFollowsInOrder() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        var sent: [ClosedRange<Int>] = []
        while case .send(let range) = schedule.next(head: 23, at: at(0)) {
            sent.append(range)
            var random = ConstantRandom.lowest
            #expect(schedule.complete(.accepted, at: at(0), using: &random) == .persistCursor(range.upperBound))
        }
        #expect(sent == [1...10, 11...20, 21...23])
        #expect(schedule.deliveredThrough == 23)
        #expect(schedule.queued(head: 23) == 0)
    }

    @Test func transientFailures_backOffExponentially_upToTheCap_andKeepTheCursor() {
        var schedule = Schedule(policy: policy, deliveredThrough: 4)
        var delays: [Duration] = []
        var now = 0.0
        for _ in 0..<8 {
            let (range, completion) = attempt(&schedule, head: 9, at: now, .failed(retryAfter: nil))
            #expect(range == 5...9)
            guard case .retry(let until, let delay)? = completion else {
                Issue.record("expected a retry")
                return
            }
            // Not before the backoff ends.
            #expect(schedule.next(head: 9, at: at(now).advanced(by: delay - .milliseconds(1))) == .wait(until: until))
            delays.append(delay)
            now += Double(delay.components.seconds)
        }
        #expect(delays == [2, 4, 8, 16, 32, 60, 60, 60].map { Duration.seconds($0) })
        #expect(schedule.deliveredThrough == 4)
        #expect(schedule.consecutiveFailures == 8)
    }

    @Test func jitter_shortensABackoffByAtMostItsFraction() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        let (_, completion) = attempt(&schedule, head: 1, at: 0, .failed(retryAfter: nil), random: .highest)
        guard case .retry(_, let delay)? = completion else {
            Issue.record("expected a retry")
            return
        }
        #expect(delay < .seconds(2))
        #expect(delay > .seconds(1.599))
    }

    @Test func retryAfter_isHonoured_butNeverBeyondTheCap() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        let (_, first) = attempt(&schedule, head: 1, at: 0, .failed(retryAfter: .seconds(30)))
        #expect(first == .retry(at: at(30), after: .seconds(30)))
        var other = Schedule(policy: policy, deliveredThrough: 0)
        let (_, second) = attempt(&other, head: 1, at: 0, .failed(retryAfter: .seconds(3600)))
        #expect(second == .retry(at: at(60), after: .seconds(60)))
    }

    @Test func refused_isRetriedAtTheCap_withoutDroppingTheBatch() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        let (range, completion) = attempt(&schedule, head: 5, at: 0, .refused)
        #expect(range == 1...5)
        #expect(completion == .retry(at: at(60), after: .seconds(60)))
        #expect(schedule.phase == .backingOff(until: at(60), afterRefusal: true))
        #expect(schedule.next(head: 5, at: at(59)) == .wait(until: at(60)))
        #expect(schedule.next(head: 5, at: at(60)) == .send(1...5))
        #expect(schedule.deliveredThrough == 0)
    }

    @Test func aFailedBatch_isResentAsTheSameRange_evenWhenMoreEntriesArrived() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        attempt(&schedule, head: 3, at: 0, .failed(retryAfter: nil))
        #expect(schedule.next(head: 8, at: at(2)) == .send(1...3))
        var random = ConstantRandom.lowest
        #expect(schedule.complete(.accepted, at: at(2), using: &random) == .persistCursor(3))
        #expect(schedule.next(head: 8, at: at(2)) == .send(4...8))
    }

    @Test func success_afterFailures_resetsTheBackoff() {
        var schedule = Schedule(policy: policy, deliveredThrough: 0)
        attempt(&schedule, head: 1, at: 0, .failed(retryAfter: nil))
        attempt(&schedule, head: 1, at: 2, .failed(retryAfter: nil))
        attempt(&schedule, head: 1, at: 6, .accepted)
        #expect(schedule.consecutiveFailures == 0)
        let (_, completion) = attempt(&schedule, head: 2, at: 7, .failed(retryAfter: nil))
        #expect(completion == .retry(at: at(9), after: .seconds(2)))
    }

    @Test func networkAvailable_endsATransientBackoff_butNotARefusal() {
        var transient = Schedule(policy: policy, deliveredThrough: 0)
        attempt(&transient, head: 1, at: 0, .failed(retryAfter: nil))
        attempt(&transient, head: 1, at: 2, .failed(retryAfter: nil))
        transient.networkAvailable()
        #expect(transient.next(head: 1, at: at(3)) == .send(1...1))
        #expect(transient.consecutiveFailures == 2)

        var refused = Schedule(policy: policy, deliveredThrough: 0)
        attempt(&refused, head: 1, at: 0, .refused)
        refused.networkAvailable()
        #expect(refused.next(head: 1, at: at(1)) == .wait(until: at(60)))
    }

    @Test func aCursorAheadOfTheTrail_sendsNothing() {
        var schedule = Schedule(policy: policy, deliveredThrough: 12)
        #expect(schedule.next(head: 10, at: at(0)) == .wait(until: nil))
        #expect(schedule.queued(head: 10) == 0)
    }

    @Test func policy_clampsNonsense() {
        let clamped = AuditDeliveryPolicy(
            batchSize: 0, initialBackoff: .seconds(10), maximumBackoff: .seconds(1), backoffJitter: 7)
        #expect(clamped.batchSize == 1)
        #expect(clamped.maximumBackoff == .seconds(10))
        #expect(clamped.backoffJitter == 1)
    }
}
