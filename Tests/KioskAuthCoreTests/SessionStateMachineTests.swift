import Foundation
import KioskAuthCore
import Testing

private typealias Session = SessionStateMachine

private let minute = 60
private let hour = 3600

/// A calendar for a time zone with DST (Europe/Berlin: CET/CEST).
private var berlin: Calendar {
    var calendar = Calendar(identifier: .gregorian)
    calendar.timeZone = TimeZone(identifier: "Europe/Berlin")!
    return calendar
}

private func date(_ iso: String) -> Date {
    ISO8601DateFormatter().date(from: iso)!
}

/// A reading at wall time `iso`, `boot` seconds into boot `id`.
private func reading(_ iso: String, boot: Int, _ id: String = "boot-a") -> ClockReading {
    ClockReading(wall: date(iso), sinceBoot: .seconds(boot), bootID: id)
}

/// Opened at 10:00 CEST, authenticated at opening, 1000 s into the boot.
private let opening = reading("2025-06-02T08:00:00Z", boot: 1000)

/// `seconds` after `opening`, both clocks advancing together.
private func after(_ seconds: Int) -> ClockReading {
    opening.advanced(by: .seconds(seconds))
}

private func openSession(
    _ policy: Session.Policy = .init(), at reading: ClockReading = opening
)
    -> Session
{
    Session(openedAt: reading, authenticatedAt: reading, policy: policy, calendar: berlin)
}

/// A policy where only the overnight cut-off can end a session within a day.
private func overnightOnly(_ cutoff: Session.TimeOfDay = .init(hour: 4)!) -> Session.Policy {
    Session.Policy(idleTimeout: .seconds(48 * hour), maximumAge: nil, overnightCutoff: cutoff)
}

@Suite("SessionStateMachine")
struct SessionStateMachineTests {
    // MARK: Idle

    @Test func idleTimeout_endsTheSessionAtExactly30Minutes() {
        var session = openSession()
        #expect(
            session.check(at: after(30 * minute - 1)) == [
                .rescheduleTimeout(deadline: .seconds(1000 + 30 * minute))
            ])
        #expect(!session.isEnded)
        #expect(session.check(at: after(30 * minute)) == [.emit(.ended(.idle)), .cancelTimeout])
        #expect(session.phase == .ended(.idle, at: after(30 * minute)))
        #expect(session.check(at: after(31 * minute)).isEmpty)
        #expect(session.nextDeadline == nil)
    }

    @Test func activity_postponesTheIdleTimeout() {
        var session = openSession()
        #expect(
            session.recordActivity(at: after(20 * minute))
                == [.rescheduleTimeout(deadline: .seconds(1000 + 50 * minute))])
        _ = session.check(at: after(50 * minute - 1))
        #expect(!session.isEnded)
        _ = session.check(at: after(50 * minute))
        #expect(session.endReason(at: after(50 * minute)) == .idle)
    }

    @Test func activityAfterTheIdleTimeout_doesNotReviveTheSession() {
        var session = openSession()
        #expect(
            session.recordActivity(at: after(31 * minute)) == [.emit(.ended(.idle)), .cancelTimeout])
        #expect(session.isEnded)
    }

    @Test func activityInALockedSession_doesNotCount() {
        var session = openSession()
        _ = session.lock(at: after(5 * minute))
        _ = session.recordActivity(at: after(20 * minute))
        #expect(session.lastActivity == opening)
        #expect(session.check(at: after(30 * minute)) == [.emit(.ended(.idle)), .cancelTimeout])
    }

    @Test func idleTimeout_isConfigurable() {
        var session = openSession(Session.Policy(idleTimeout: .seconds(90)))
        _ = session.check(at: after(89))
        #expect(!session.isEnded)
        _ = session.check(at: after(90))
        #expect(session.phase == .ended(.idle, at: after(90)))
    }

    // MARK: Overnight cut-off

    @Test func overnightCutoff_endsTheSessionAt0400Local() {
        let open = reading("2025-06-02T20:00:00Z", boot: 1000)  // 22:00 CEST
        var session = openSession(overnightOnly(), at: open)
        #expect(session.overnightCutoff == date("2025-06-03T02:00:00Z"))
        #expect(session.nextDeadline == .seconds(1000 + 6 * hour))
        _ = session.check(at: open.advanced(by: .seconds(6 * hour - 1)))
        #expect(!session.isEnded)
        #expect(
            session.check(at: open.advanced(by: .seconds(6 * hour))) == [
                .emit(.ended(.overnight)), .cancelTimeout,
            ])
    }

    @Test func overnightCutoff_isTheFirstStrictlyAfterOpening() {
        let atCutoff = openSession(overnightOnly(), at: reading("2025-06-02T02:00:00Z", boot: 10))
        #expect(atCutoff.overnightCutoff == date("2025-06-03T02:00:00Z"))
        let secondBefore = openSession(overnightOnly(), at: reading("2025-06-02T01:59:59Z", boot: 10))
        #expect(secondBefore.overnightCutoff == date("2025-06-02T02:00:00Z"))
        #expect(secondBefore.nextDeadline == .seconds(11))
    }

    @Test func overnightCutoff_onTheShortDSTNight_comesAfterFiveHours() {
        // 22:00 CET on 29 March 2025; clocks jump from 02:00 to 03:00.
        let open = reading("2025-03-29T21:00:00Z", boot: 0)
        let session = openSession(overnightOnly(), at: open)
        #expect(session.overnightCutoff == date("2025-03-30T02:00:00Z"))  // 04:00 CEST
        #expect(session.nextDeadline == .seconds(5 * hour))
    }

    @Test func overnightCutoff_onTheLongDSTNight_comesAfterSevenHours() {
        // 22:00 CEST on 25 October 2025; clocks fall back from 03:00 to 02:00.
        let open = reading("2025-10-25T20:00:00Z", boot: 0)
        let session = openSession(overnightOnly(), at: open)
        #expect(session.overnightCutoff == date("2025-10-26T03:00:00Z"))  // 04:00 CET
        #expect(session.nextDeadline == .seconds(7 * hour))
    }

    @Test func overnightCutoff_thatDoesNotExist_resolvesToTheNextExistingTime() {
        // 02:30 does not exist on 30 March 2025 in Berlin: the cut-off is 03:00 CEST.
        let session = openSession(
            overnightOnly(.init(hour: 2, minute: 30)!), at: reading("2025-03-29T21:00:00Z", boot: 0))
        #expect(session.overnightCutoff == date("2025-03-30T01:00:00Z"))
    }

    @Test func overnightCutoff_thatOccursTwice_resolvesToTheFirst() {
        // 02:30 happens twice on 26 October 2025 in Berlin: the first is 02:30 CEST.
        let session = openSession(
            overnightOnly(.init(hour: 2, minute: 30)!), at: reading("2025-10-25T20:00:00Z", boot: 0))
        #expect(session.overnightCutoff == date("2025-10-26T00:30:00Z"))
    }

    @Test func overnightCutoff_cannotBePostponedBySettingTheClockBack() {
        let open = reading("2025-06-02T20:00:00Z", boot: 1000)
        var session = openSession(overnightOnly(), at: open)
        // Six hours later on the boot clock, the wall clock was set back to 22:00.
        let setBack = reading("2025-06-02T20:00:00Z", boot: 1000 + 6 * hour)
        #expect(session.check(at: setBack) == [.emit(.ended(.overnight)), .cancelTimeout])
    }

    @Test func overnightCutoff_isReachedByTheWallClockToo() {
        let open = reading("2025-06-02T20:00:00Z", boot: 1000)
        var session = openSession(overnightOnly(), at: open)
        // The wall clock was corrected forward past 04:00 after only one hour of uptime.
        let corrected = reading("2025-06-03T02:00:00Z", boot: 1000 + hour)
        #expect(session.check(at: corrected) == [.emit(.ended(.overnight)), .cancelTimeout])
    }

    @Test func overnightCutoff_canBeDisabled() {
        let policy = Session.Policy(
            idleTimeout: .seconds(48 * hour), maximumAge: nil, overnightCutoff: nil)
        var session = openSession(policy)
        #expect(session.overnightCutoff == nil)
        _ = session.check(at: after(30 * hour))
        #expect(!session.isEnded)
    }

    @Test func timeOfDay_rejectsImpossibleTimes() {
        #expect(Session.TimeOfDay(hour: 24) == nil)
        #expect(Session.TimeOfDay(hour: 4, minute: 60) == nil)
        #expect(Session.TimeOfDay(hour: -1) == nil)
        #expect(Session.TimeOfDay(hour: 23, minute: 59) != nil)
    }

    // MARK: Maximum age

    @Test func maximumAge_endsTheSessionToTheSecond() {
        let policy = Session.Policy(
            idleTimeout: .seconds(48 * hour), maximumAge: .seconds(12 * hour), overnightCutoff: nil)
        var session = openSession(policy)
        _ = session.recordActivity(at: after(12 * hour - 10))
        _ = session.check(at: after(12 * hour - 1))
        #expect(!session.isEnded)
        #expect(session.check(at: after(12 * hour)) == [.emit(.ended(.maximumAge)), .cancelTimeout])
    }

    @Test func nextDeadline_isTheEarliestRule() {
        // Opened 10:00 CEST: idle at +30 min comes before the 12 h maximum age and 04:00.
        let session = openSession()
        #expect(session.nextDeadline == .seconds(1000 + 30 * minute))
        let policy = Session.Policy(idleTimeout: .seconds(48 * hour), maximumAge: .seconds(12 * hour))
        #expect(openSession(policy).nextDeadline == .seconds(1000 + 12 * hour))
    }

    // MARK: Suspend and reboot

    @Test func resumeAfterSuspend_reportsTheRuleThatExpiredFirst() {
        // Timers did not run while suspended; on resume every rule has passed.
        var idleFirst = openSession()
        #expect(idleFirst.check(at: after(20 * hour)) == [.emit(.ended(.idle)), .cancelTimeout])

        let open = reading("2025-06-02T18:00:00Z", boot: 1000)  // 20:00 CEST
        let policy = Session.Policy(idleTimeout: .seconds(48 * hour), maximumAge: .seconds(12 * hour))
        var overnightFirst = openSession(policy, at: open)
        #expect(
            overnightFirst.check(at: open.advanced(by: .seconds(13 * hour)))
                == [.emit(.ended(.overnight)), .cancelTimeout])
    }

    @Test func sessionFromAnEarlierBoot_hasEnded() {
        var session = openSession()
        let afterReboot = reading("2025-06-02T08:05:00Z", boot: 30, "boot-b")
        #expect(session.check(at: afterReboot) == [.emit(.ended(.rebooted)), .cancelTimeout])
    }

    // MARK: Locking and the lock epoch

    @Test func lock_bumpsTheEpochOnceAndIsStreamed() {
        var session = openSession()
        #expect(
            session.lock(at: after(60)) == [
                .emit(.locked), .rescheduleTimeout(deadline: .seconds(1000 + 30 * minute)),
            ])
        #expect(session.lockEpoch == 1)
        #expect(session.isLocked)
        #expect(
            session.lock(at: after(70)) == [.rescheduleTimeout(deadline: .seconds(1000 + 30 * minute))])
        #expect(session.lockEpoch == 1)
    }

    @Test func authenticationStartedBeforeTheLock_neverUnlocksAfterIt() {
        var session = openSession()
        let epochAtScanStart = session.lockEpoch
        _ = session.lock(at: after(60))
        let stale = session.recordAuthentication(at: after(61), startedInLockEpoch: epochAtScanStart)
        #expect(stale.result == .staleLockEpoch)
        #expect(!stale.actions.contains(.emit(.unlocked)))
        #expect(session.isLocked)

        let fresh = session.recordAuthentication(at: after(90), startedInLockEpoch: session.lockEpoch)
        #expect(fresh.result == .accepted)
        #expect(
            fresh.actions == [
                .emit(.unlocked), .rescheduleTimeout(deadline: .seconds(1000 + 90 + 30 * minute)),
            ])
        #expect(!session.isLocked)
    }

    // MARK: Step-up

    @Test func stepUp_acceptsAnAuthenticationExactlyNSecondsOld() {
        var session = openSession()
        _ = session.recordActivity(at: after(200))
        #expect(session.stepUp(maximumAge: .seconds(300), at: after(300)) == .satisfied)
        #expect(session.stepUp(maximumAge: .seconds(300), at: after(301)) == .needsAuthentication)
    }

    @Test func stepUp_neverAcceptsAnAuthenticationFromBeforeTheLastLock() {
        var session = openSession()
        _ = session.lock(at: after(10))
        #expect(session.stepUp(maximumAge: .seconds(3600), at: after(11)) == .needsAuthentication)
        _ = session.recordAuthentication(at: after(20), startedInLockEpoch: session.lockEpoch)
        #expect(session.stepUp(maximumAge: .seconds(3600), at: after(21)) == .satisfied)
        #expect(session.lastAuthentication?.lockEpoch == 1)
    }

    @Test func stepUp_withoutAnyAuthentication_needsOne() {
        let session = Session(openedAt: opening, authenticatedAt: nil, calendar: berlin)
        #expect(session.stepUp(maximumAge: .seconds(3600), at: after(1)) == .needsAuthentication)
    }

    @Test func stepUp_reExaminesExpiryAtTheRequest() {
        let session = openSession()
        // No timer ran (suspend); the request itself finds the session over.
        #expect(
            session.stepUp(maximumAge: .seconds(3600), at: after(30 * minute)) == .sessionEnded(.idle))
    }

    // MARK: Ending from outside

    @Test func explicitEnd_isStreamedOnceAndFinal() {
        var session = openSession()
        #expect(
            session.end(.securityLogout, at: after(5)) == [
                .emit(.ended(.securityLogout)), .cancelTimeout,
            ])
        #expect(session.end(.loggedOut, at: after(6)).isEmpty)
        #expect(session.phase == .ended(.securityLogout, at: after(5)))
        let late = session.recordAuthentication(at: after(7), startedInLockEpoch: session.lockEpoch)
        #expect(late.result == .sessionEnded(.securityLogout))
        #expect(late.actions.isEmpty)
        #expect(
            session.stepUp(maximumAge: .seconds(60), at: after(8)) == .sessionEnded(.securityLogout))
    }

    @Test func recordAuthentication_onAnExpiredSession_reportsTheEnd() {
        var session = openSession()
        let late = session.recordAuthentication(at: after(31 * minute), startedInLockEpoch: 0)
        #expect(late.result == .sessionEnded(.idle))
        #expect(late.actions == [.emit(.ended(.idle)), .cancelTimeout])
    }

    // MARK: Persistence

    @Test func session_survivesADaemonRestartThroughCodable() throws {
        var session = openSession()
        _ = session.lock(at: after(60))
        let data = try JSONEncoder().encode(session)
        var restored = try JSONDecoder().decode(Session.self, from: data)
        #expect(restored == session)
        #expect(restored.nextDeadline == session.nextDeadline)
        #expect(
            restored.recordAuthentication(at: after(70), startedInLockEpoch: 0).result == .staleLockEpoch)
        #expect(restored.check(at: after(30 * minute)) == [.emit(.ended(.idle)), .cancelTimeout])
    }
}
