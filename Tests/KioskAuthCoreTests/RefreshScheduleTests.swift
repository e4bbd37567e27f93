import Foundation
import KioskAuthCore
import Testing

/// A generator that always returns the same word, so jitter is exactly predictable:
/// `.lowest` gives 0, `.middle` gives 0.5, `.highest` gives just under 1.
private struct ConstantRandom: RandomNumberGenerator {
    static var lowest: ConstantRandom { ConstantRandom(word: 0) }
    static var middle: ConstantRandom { ConstantRandom(word: 1 << 63) }
    static var highest: ConstantRandom { ConstantRandom(word: .max) }
    let word: UInt64
    mutating func next() -> UInt64 { word }
}

private let t0 = Date(timeIntervalSince1970: 1_750_000_000)
private func at(_ seconds: Double) -> Date { t0.addingTimeInterval(seconds) }

/// A one-hour access token obtained `seconds` after `t0`.
private func token(obtained seconds: Double = 0, lifetime: Double = 3600) -> AccessTokenLifetime {
    AccessTokenLifetime(obtainedAt: at(seconds), expiresAt: at(seconds + lifetime))
}

private typealias Schedule = RefreshSchedule<String>

/// A schedule tracking `people`, all with a token obtained at `t0` (renewal at 2700 s).
private func scheduleTracking(
    _ people: [String], policy: RefreshPolicy = RefreshPolicy()
) -> Schedule {
    var schedule = Schedule(policy: policy)
    var random = ConstantRandom.lowest
    for person in people { _ = schedule.track(person, token: token(), at: t0, using: &random) }
    return schedule
}

/// Drives `person` from scheduled to a completed refresh with `outcome` at `seconds`.
private func refresh(
    _ person: String, in schedule: inout Schedule, at seconds: Double, outcome: RefreshOutcome
) -> [Schedule.Action] {
    var random = ConstantRandom.lowest
    let started = schedule.requestRefresh(for: person, at: at(seconds))
    #expect(started.contains(.startRefresh(person)))
    return schedule.complete(outcome, for: person, at: at(seconds), using: &random)
}

@Suite("RefreshSchedule")
struct RefreshScheduleTests {
    // MARK: Renewal point and jitter

    @Test func track_schedulesRenewalAt75PercentWithTheLowestJitter() {
        var schedule = Schedule()
        var random = ConstantRandom.lowest
        let actions = schedule.track("sarah", token: token(), at: t0, using: &random)
        #expect(
            actions == [
                .persist("sarah", RefreshRecord(token: token())), .refresh("sarah", at: at(2700)),
            ])
        #expect(schedule.phase(of: "sarah") == .scheduled(at: at(2700), isRetry: false))
    }

    @Test func renewalJitter_staysBetween75And80PercentOfTheLifetime() {
        var middle = ConstantRandom.middle
        var highest = ConstantRandom.highest
        var schedule = Schedule()
        #expect(
            schedule.track("a", token: token(), at: t0, using: &middle).last
                == .refresh("a", at: at(2790)))
        guard
            case .refresh(_, let latest) = schedule.track("b", token: token(), at: t0, using: &highest)
                .last
        else {
            Issue.record("no refresh scheduled")
            return
        }
        #expect(latest > at(2879.99) && latest <= at(2880))
    }

    @Test func renewalPoint_isConfigurable() {
        var schedule = Schedule(policy: RefreshPolicy(renewalPoint: 0.5...0.5))
        var random = ConstantRandom.highest
        #expect(
            schedule.track("a", token: token(), at: t0, using: &random).last
                == .refresh("a", at: at(1800)))
    }

    // MARK: One refresh in flight

    @Test func requestRefresh_recordsTheRequestInFlightBeforeSendingIt() {
        var schedule = scheduleTracking(["sarah"])
        let actions = schedule.requestRefresh(for: "sarah", at: at(2700))
        let inFlight = RefreshRecord(token: token(), refreshStartedAt: at(2700))
        #expect(actions == [.persist("sarah", inFlight), .startRefresh("sarah")])
        #expect(schedule.phase(of: "sarah") == .inFlight(since: at(2700)))
        #expect(schedule.record(for: "sarah")?.isRefreshInFlight == true)
    }

    @Test func secondRequestWhileInFlight_doesNothing() {
        var schedule = scheduleTracking(["sarah"])
        _ = schedule.requestRefresh(for: "sarah", at: at(2700))
        #expect(schedule.requestRefresh(for: "sarah", at: at(2701)).isEmpty)
        #expect(schedule.phase(of: "sarah") == .inFlight(since: at(2700)))
    }

    @Test func unknownPeopleAndStrayCompletions_areIgnored() {
        var schedule = scheduleTracking(["sarah"])
        var random = ConstantRandom.lowest
        #expect(schedule.requestRefresh(for: "nobody", at: t0).isEmpty)
        #expect(schedule.complete(.invalidGrant, for: "sarah", at: t0, using: &random).isEmpty)
        #expect(schedule.phase(of: "sarah") == .scheduled(at: at(2700), isRetry: false))
    }

    @Test func onDemandRequest_mayRenewEarly() {
        var schedule = scheduleTracking(["sarah"])
        #expect(schedule.requestRefresh(for: "sarah", at: at(60)).contains(.startRefresh("sarah")))
    }

    // MARK: Outcomes

    @Test func success_storesTheRotatedTokenAndSchedulesTheNextRenewal() {
        var schedule = scheduleTracking(["sarah"])
        let next = token(obtained: 2700)
        let actions = refresh("sarah", in: &schedule, at: 2700, outcome: .succeeded(next))
        #expect(
            actions == [
                .persist("sarah", RefreshRecord(token: next)), .refresh("sarah", at: at(2700 + 2700)),
            ])
        #expect(schedule.record(for: "sarah")?.isRefreshInFlight == false)
    }

    @Test func invalidGrant_suspendsThePersonAndStopsScheduling() {
        var schedule = scheduleTracking(["sarah"])
        let actions = refresh("sarah", in: &schedule, at: 2700, outcome: .invalidGrant)
        let suspended = RefreshRecord(token: token(), suspension: .refreshTokenRejected)
        #expect(
            actions == [
                .persist("sarah", suspended), .cancelRefresh("sarah"),
                .suspend("sarah", .refreshTokenRejected),
                .audit(.refreshTokenRejected("sarah")),
            ])
        #expect(schedule.phase(of: "sarah") == .suspended(.refreshTokenRejected))
        #expect(schedule.requestRefresh(for: "sarah", at: at(9000)).isEmpty)
    }

    @Test func onlineLoginAfterSuspension_resumesScheduling() {
        var schedule = scheduleTracking(["sarah"])
        _ = refresh("sarah", in: &schedule, at: 2700, outcome: .invalidGrant)
        var random = ConstantRandom.lowest
        let actions = schedule.track(
            "sarah", token: token(obtained: 5000), at: at(5000), using: &random)
        #expect(actions.last == .refresh("sarah", at: at(5000 + 2700)))
        #expect(schedule.record(for: "sarah")?.suspension == nil)
    }

    @Test func lostResponse_isRetriedSoonWithTheSameToken_notTreatedAsRevocation() {
        var schedule = scheduleTracking(["sarah"])
        let actions = refresh("sarah", in: &schedule, at: 2700, outcome: .responseLost)
        let doubtful = RefreshRecord(token: token(), tokenMayHaveRotated: true)
        #expect(actions == [.persist("sarah", doubtful), .refresh("sarah", at: at(2702))])
        #expect(!actions.contains { if case .suspend = $0 { true } else { false } })

        // The retry (same token) succeeds: the IdP's reuse grace returned the rotated token.
        let next = token(obtained: 2702)
        let retried = refresh("sarah", in: &schedule, at: 2702, outcome: .succeeded(next))
        #expect(retried.first == .persist("sarah", RefreshRecord(token: next)))
        #expect(schedule.record(for: "sarah")?.tokenMayHaveRotated == false)
    }

    @Test func invalidGrantAfterALostResponse_suspendsButIsAuditedAsPossibleReuse() {
        var schedule = scheduleTracking(["sarah"])
        _ = refresh("sarah", in: &schedule, at: 2700, outcome: .responseLost)
        let actions = refresh("sarah", in: &schedule, at: 2702, outcome: .invalidGrant)
        #expect(actions.contains(.suspend("sarah", .refreshTokenRejectedAfterLostResponse)))
        #expect(actions.contains(.audit(.refreshTokenRejectedAfterLostResponse("sarah"))))
        #expect(!actions.contains(.audit(.refreshTokenRejected("sarah"))))
        #expect(schedule.record(for: "sarah")?.suspension == .refreshTokenRejectedAfterLostResponse)
    }

    @Test func timeout_backsOffAndLeavesRotationInDoubt() {
        var schedule = scheduleTracking(["sarah"])
        let actions = refresh("sarah", in: &schedule, at: 2700, outcome: .timedOut)
        #expect(actions.last == .refresh("sarah", at: at(2705)))
        #expect(schedule.record(for: "sarah")?.tokenMayHaveRotated == true)
        let rejected = refresh("sarah", in: &schedule, at: 2705, outcome: .invalidGrant)
        #expect(rejected.contains(.suspend("sarah", .refreshTokenRejectedAfterLostResponse)))
    }

    @Test func unreachable_doesNotLeaveRotationInDoubt() {
        var schedule = scheduleTracking(["sarah"])
        _ = refresh("sarah", in: &schedule, at: 2700, outcome: .unreachable)
        let rejected = refresh("sarah", in: &schedule, at: 2705, outcome: .invalidGrant)
        #expect(rejected.contains(.suspend("sarah", .refreshTokenRejected)))
    }

    // MARK: Backoff

    @Test func networkFailures_backOffExponentiallyUpToTheCap() {
        let policy = RefreshPolicy(
            initialBackoff: .seconds(5), maximumBackoff: .seconds(60), circuitBreakerThreshold: 100)
        var schedule = scheduleTracking(["sarah"], policy: policy)
        var now = 2700.0
        var delays: [Double] = []
        for _ in 0..<6 {
            let actions = refresh("sarah", in: &schedule, at: now, outcome: .unreachable)
            guard case .refresh(_, let next) = actions.last else {
                Issue.record("no retry scheduled")
                return
            }
            delays.append(next.timeIntervalSince(at(now)))
            now = next.timeIntervalSince(t0)
        }
        #expect(delays == [5, 10, 20, 40, 60, 60])
    }

    @Test func backoffJitter_onlyShortensTheDelayByTheConfiguredFraction() {
        var schedule = scheduleTracking(["sarah"], policy: RefreshPolicy(backoffJitter: 0.2))
        var random = ConstantRandom.highest
        _ = schedule.requestRefresh(for: "sarah", at: at(2700))
        guard
            case .refresh(_, let next) = schedule.complete(
                .unreachable, for: "sarah", at: at(2700), using: &random
            ).last
        else {
            Issue.record("no retry scheduled")
            return
        }
        let delay = next.timeIntervalSince(at(2700))
        #expect(abs(delay - 4.0) < 0.001)  // 5 s shortened by (almost) the full 20 %
    }

    @Test func backoff_isNotCutShortByOnDemandRequests() {
        var schedule = scheduleTracking(["sarah"])
        _ = refresh("sarah", in: &schedule, at: 2700, outcome: .unreachable)
        #expect(schedule.requestRefresh(for: "sarah", at: at(2704)).isEmpty)
        #expect(schedule.requestRefresh(for: "sarah", at: at(2705)).contains(.startRefresh("sarah")))
    }

    @Test func serverError_honoursRetryAfter() {
        var schedule = scheduleTracking(["sarah"])
        let actions = refresh(
            "sarah", in: &schedule, at: 2700, outcome: .serverError(retryAfter: .seconds(120)))
        #expect(actions.last == .refresh("sarah", at: at(2820)))
    }

    @Test func repeatedLostResponses_fallBackToBackoff() {
        var schedule = scheduleTracking(["sarah"])
        _ = refresh("sarah", in: &schedule, at: 2700, outcome: .responseLost)
        let second = refresh("sarah", in: &schedule, at: 2702, outcome: .responseLost)
        #expect(second.last == .refresh("sarah", at: at(2712)))
    }

    // MARK: Circuit breaker

    private var breakerPolicy: RefreshPolicy {
        RefreshPolicy(
            circuitBreakerThreshold: 3, circuitCoolDown: .seconds(30),
            maximumCircuitCoolDown: .seconds(100))
    }

    /// Three people whose refreshes all fail at 2700: the third failure opens the breaker.
    private func openBreaker() -> (Schedule, [Schedule.Action]) {
        var schedule = scheduleTracking(["a", "b", "c"], policy: breakerPolicy)
        _ = refresh("a", in: &schedule, at: 2700, outcome: .unreachable)
        _ = refresh("b", in: &schedule, at: 2700, outcome: .timedOut)
        let opened = refresh("c", in: &schedule, at: 2700, outcome: .serverError(retryAfter: nil))
        return (schedule, opened)
    }

    @Test func breaker_opensAfterNConsecutiveUnavailableOutcomesAcrossPeople() {
        let (schedule, actions) = openBreaker()
        #expect(actions.contains(.audit(.circuitOpened(until: at(2730), consecutiveFailures: 3))))
        #expect(actions.contains(.wakeCircuitBreaker(at: at(2730))))
        #expect(!actions.contains { if case .refresh = $0 { true } else { false } })
        #expect(schedule.circuit == .open(until: at(2730)))
        #expect(schedule.phase(of: "c") == .waitingForCircuit)
    }

    @Test func breaker_belowTheThreshold_staysClosed() {
        var schedule = scheduleTracking(["a", "b"], policy: breakerPolicy)
        _ = refresh("a", in: &schedule, at: 2700, outcome: .unreachable)
        _ = refresh("b", in: &schedule, at: 2700, outcome: .unreachable)
        #expect(schedule.circuit == .closed)
        #expect(schedule.consecutiveUnavailable == 2)
    }

    @Test func breaker_countsOnlyConsecutiveFailures() {
        var schedule = scheduleTracking(["a", "b", "c"], policy: breakerPolicy)
        _ = refresh("a", in: &schedule, at: 2700, outcome: .unreachable)
        _ = refresh("b", in: &schedule, at: 2700, outcome: .unreachable)
        _ = refresh("c", in: &schedule, at: 2700, outcome: .succeeded(token(obtained: 2700)))
        _ = refresh("a", in: &schedule, at: 2705, outcome: .unreachable)
        #expect(schedule.circuit == .closed)
        #expect(schedule.consecutiveUnavailable == 1)
    }

    @Test func breaker_ignoresLostResponses() {
        var schedule = scheduleTracking(["a", "b", "c"], policy: breakerPolicy)
        for person in ["a", "b", "c"] {
            _ = refresh(person, in: &schedule, at: 2700, outcome: .responseLost)
        }
        #expect(schedule.circuit == .closed)
        #expect(schedule.consecutiveUnavailable == 0)
    }

    @Test func openBreaker_holdsBackDueRefreshes() {
        var (schedule, _) = openBreaker()
        // a's backoff timer fires during the cool-down.
        #expect(schedule.requestRefresh(for: "a", at: at(2710)).isEmpty)
        #expect(schedule.phase(of: "a") == .waitingForCircuit)
    }

    @Test func breakerTimer_withTheWallClockSetBack_probesInsteadOfStayingOpen() {
        var (schedule, _) = openBreaker()
        // The breaker opened at 2700 until 2730; the wall clock is then set back two hours.
        let probe = schedule.circuitTimerFired(at: at(2730 - 7200))
        #expect(probe.contains(.startRefresh("c")))
        #expect(schedule.circuit == .halfOpen(probe: "c"))
    }

    @Test func breakerTimer_firingEarly_isRearmed() {
        var (schedule, _) = openBreaker()
        #expect(schedule.circuitTimerFired(at: at(2720)) == [.wakeCircuitBreaker(at: at(2730))])
    }

    @Test func halfOpen_letsExactlyOneProbeThrough() {
        var (schedule, _) = openBreaker()
        let probe = schedule.circuitTimerFired(at: at(2730))
        #expect(probe.contains(.startRefresh("c")))
        #expect(schedule.circuit == .halfOpen(probe: "c"))
        #expect(schedule.requestRefresh(for: "a", at: at(2731)).isEmpty)
        #expect(schedule.phase(of: "a") == .waitingForCircuit)
    }

    @Test func failedProbe_reopensWithADoubledCoolDownUpToTheCap() {
        var (schedule, _) = openBreaker()
        var random = ConstantRandom.lowest
        _ = schedule.circuitTimerFired(at: at(2730))
        let first = schedule.complete(.unreachable, for: "c", at: at(2730), using: &random)
        #expect(first.contains(.wakeCircuitBreaker(at: at(2790))))
        #expect(schedule.phase(of: "c") == .waitingForCircuit)

        _ = schedule.circuitTimerFired(at: at(2790))
        let second = schedule.complete(.unreachable, for: "c", at: at(2790), using: &random)
        #expect(second.contains(.wakeCircuitBreaker(at: at(2890))))  // 120 s capped at 100 s
    }

    @Test func successfulProbe_closesTheBreakerAndReleasesEveryoneHeldBack() {
        var (schedule, _) = openBreaker()
        var random = ConstantRandom.lowest
        _ = schedule.requestRefresh(for: "a", at: at(2710))
        _ = schedule.requestRefresh(for: "b", at: at(2715))
        _ = schedule.circuitTimerFired(at: at(2730))
        let actions = schedule.complete(
            .succeeded(token(obtained: 2730)), for: "c", at: at(2730), using: &random)
        #expect(actions.contains(.audit(.circuitClosed)))
        #expect(actions.contains(.refresh("a", at: at(2730))))
        #expect(actions.contains(.refresh("b", at: at(2730))))
        #expect(schedule.circuit == .closed)
        #expect(schedule.phase(of: "a") == .scheduled(at: at(2730), isRetry: false))
    }

    @Test func invalidGrant_provesTheIdPReachable_andClosesTheBreaker() {
        var (schedule, _) = openBreaker()
        var random = ConstantRandom.lowest
        _ = schedule.circuitTimerFired(at: at(2730))
        let actions = schedule.complete(.invalidGrant, for: "c", at: at(2730), using: &random)
        #expect(actions.contains(.audit(.circuitClosed)))
        #expect(schedule.circuit == .closed)
    }

    @Test func connectivityChange_endsTheCoolDownEarly() {
        var (schedule, _) = openBreaker()
        let actions = schedule.connectivityChanged(at: at(2705))
        #expect(actions.contains(.startRefresh("c")))
        #expect(schedule.circuit == .halfOpen(probe: "c"))
    }

    @Test func removingTheProbe_handsTheProbeToSomeoneElse() {
        var (schedule, _) = openBreaker()
        _ = schedule.requestRefresh(for: "a", at: at(2710))
        _ = schedule.circuitTimerFired(at: at(2730))
        #expect(
            schedule.stopTracking("c", at: at(2731)) == [
                .cancelRefresh("c"), .wakeCircuitBreaker(at: at(2731)),
            ])
        #expect(schedule.circuitTimerFired(at: at(2731)).contains(.startRefresh("a")))
        #expect(!schedule.people.contains("c"))
    }

    @Test func onlineLogin_closesTheBreaker() {
        var (schedule, _) = openBreaker()
        var random = ConstantRandom.lowest
        let actions = schedule.track("d", token: token(obtained: 2710), at: at(2710), using: &random)
        #expect(actions.contains(.audit(.circuitClosed)))
        #expect(schedule.circuit == .closed)
    }

    // MARK: Restart

    @Test func restore_rebuildsTheScheduleFromTheRecord() {
        var schedule = Schedule()
        var random = ConstantRandom.lowest
        let actions = schedule.restore(
            "sarah", from: RefreshRecord(token: token()), at: at(100), using: &random)
        #expect(actions == [.refresh("sarah", at: at(2700))])
    }

    @Test func restore_afterTheRenewalPoint_refreshesWithinTheReleaseSpread() {
        var schedule = Schedule(policy: RefreshPolicy(releaseSpread: .seconds(10)))
        var random = ConstantRandom.middle
        let actions = schedule.restore(
            "sarah", from: RefreshRecord(token: token()), at: at(7200), using: &random)
        #expect(actions == [.refresh("sarah", at: at(7205))])
    }

    @Test func restore_ofASuspendedPerson_schedulesNothing() {
        var schedule = Schedule()
        var random = ConstantRandom.lowest
        let record = RefreshRecord(token: token(), suspension: .refreshTokenRejected)
        #expect(schedule.restore("sarah", from: record, at: at(100), using: &random).isEmpty)
        #expect(schedule.phase(of: "sarah") == .suspended(.refreshTokenRejected))
    }

    @Test func restore_withTheInFlightMarker_treatsTheRequestAsALostResponse() {
        var schedule = Schedule()
        var random = ConstantRandom.lowest
        let record = RefreshRecord(token: token(), refreshStartedAt: at(2700))
        let actions = schedule.restore("sarah", from: record, at: at(2800), using: &random)
        #expect(
            actions == [
                .persist("sarah", RefreshRecord(token: token(), tokenMayHaveRotated: true)),
                .audit(.refreshInterruptedByRestart("sarah")),
                .refresh("sarah", at: at(2802)),
            ])
        let rejected = refresh("sarah", in: &schedule, at: 2802, outcome: .invalidGrant)
        #expect(rejected.contains(.suspend("sarah", .refreshTokenRejectedAfterLostResponse)))
    }

    @Test func record_roundTripsThroughCodable() throws {
        let record = RefreshRecord(
            token: token(), refreshStartedAt: at(5), tokenMayHaveRotated: true,
            suspension: .refreshTokenRejectedAfterLostResponse)
        let decoded = try JSONDecoder().decode(RefreshRecord.self, from: JSONEncoder().encode(record))
        #expect(decoded == record)
    }

    @Test func tokenLifetime_isNeverNegative() {
        #expect(AccessTokenLifetime(obtainedAt: at(10), expiresAt: at(0)).duration == .zero)
        var schedule = Schedule(policy: RefreshPolicy(releaseSpread: .seconds(4)))
        var random = ConstantRandom.middle
        // The IdP's clock is behind ours: renew right away (within the spread), not never.
        let actions = schedule.track(
            "sarah", token: AccessTokenLifetime(obtainedAt: at(10), expiresAt: at(0)), at: at(10),
            using: &random)
        #expect(actions.last == .refresh("sarah", at: at(12)))
    }
}
