import Foundation
import KioskAuthCore
import Testing

/// A fixed origin with whole seconds, so that wall-clock arithmetic in the tests is exact.
private let origin = Date(timeIntervalSince1970: 1_750_000_000)
private let hour = 3600

/// A reading `wall` seconds after `origin`, `boot` seconds into boot `id`.
private func reading(wall: Int, boot: Int, _ id: String = "boot-a") -> ClockReading {
    ClockReading(
        wall: origin.addingTimeInterval(TimeInterval(wall)), sinceBoot: .seconds(boot), bootID: id)
}

/// A window whose person made contact at `contactReading`, plus that contact.
private func windowWithContact(
    at contactReading: ClockReading, policy: OfflineWindow.Policy = .init()
) -> (OfflineWindow, OfflineWindow.Contact) {
    var window = OfflineWindow(policy: policy)
    let contact = window.recordContact(at: contactReading).contact
    return (window, contact)
}

@Suite("ClockReading")
struct OfflineClockReadingTests {
    @Test func bootTimeElapsed_isMeasuredOnlyWithinOneBoot() {
        let a = reading(wall: 0, boot: 100)
        #expect(reading(wall: -86_400, boot: 160).bootTimeElapsed(since: a) == .seconds(60))
        #expect(reading(wall: 60, boot: 40).bootTimeElapsed(since: a) == .seconds(-60))
        #expect(reading(wall: 60, boot: 160, "boot-b").bootTimeElapsed(since: a) == nil)
    }

    @Test func advanced_movesBothClocksTogetherInTheSameBoot() {
        let later = reading(wall: 10, boot: 100).advanced(by: .seconds(90))
        #expect(later == reading(wall: 100, boot: 190))
    }
}

@Suite("OfflineWindow")
struct OfflineWindowTests {
    @Test func localPeople_haveNoWindow() {
        var window = OfflineWindow()
        let evaluation = window.evaluate(.local, at: reading(wall: 365 * 24 * hour, boot: 10))
        #expect(evaluation.decision == .notApplicable)
        #expect(evaluation.decision.permitsUnlock)
    }

    @Test func defaults_areAnEightHourWindowAndATwoSecondTolerance() {
        #expect(OfflineWindow.Policy().window == .seconds(8 * hour))
        #expect(OfflineWindow.Policy().backwardsTolerance == .seconds(2))
        #expect(OfflineWindow.recommendedObservationInterval == .seconds(60))
    }

    @Test func window_isHonouredToTheSecond() {
        let contactReading = reading(wall: 0, boot: 100)
        var (window, contact) = windowWithContact(at: contactReading)
        let subject = OfflineWindow.Subject.identityProvider(lastContact: contact)

        let twoHours = window.evaluate(subject, at: contactReading.advanced(by: .seconds(2 * hour)))
        #expect(twoHours.decision == .allowed(remaining: .seconds(6 * hour)))

        let lastSecond = window.evaluate(
            subject, at: contactReading.advanced(by: .seconds(8 * hour - 1)))
        #expect(lastSecond.decision == .allowed(remaining: .seconds(1)))
        #expect(lastSecond.decision.permitsUnlock)

        let atTheEnd = window.evaluate(subject, at: contactReading.advanced(by: .seconds(8 * hour)))
        #expect(atTheEnd.decision == .expired(ago: .zero))
        #expect(!atTheEnd.decision.permitsUnlock)

        let after = window.evaluate(subject, at: contactReading.advanced(by: .seconds(8 * hour + 1)))
        #expect(after.decision == .expired(ago: .seconds(1)))
    }

    @Test func window_length_isConfigurable() {
        let contactReading = reading(wall: 0, boot: 100)
        var (window, contact) = windowWithContact(
            at: contactReading, policy: .init(window: .seconds(90)))
        let subject = OfflineWindow.Subject.identityProvider(lastContact: contact)
        #expect(
            window.evaluate(subject, at: contactReading.advanced(by: .seconds(89))).decision
                == .allowed(remaining: .seconds(1)))
        #expect(
            window.evaluate(subject, at: contactReading.advanced(by: .seconds(90))).decision
                == .expired(ago: .zero))
    }

    @Test func clockSetBackByADayWhileOffline_endsTheWindowAndIsAuditedOnce() {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100))
        let subject = OfflineWindow.Subject.identityProvider(lastContact: contact)
        #expect(
            window.evaluate(subject, at: reading(wall: hour, boot: 100 + hour)).decision
                == .allowed(remaining: .seconds(7 * hour)))

        // Someone sets the clock back by a day, one second later.
        let previous = reading(wall: hour, boot: 100 + hour)
        let setBack = reading(wall: hour + 1 - 86_400, boot: 100 + hour + 1)
        let evaluation = window.evaluate(subject, at: setBack)
        #expect(evaluation.decision == .clockWentBackwards)
        #expect(!evaluation.decision.permitsUnlock)
        #expect(
            evaluation.actions.contains(.audit(.clockWentBackwards(previous: previous, current: setBack)))
        )
        #expect(evaluation.actions.contains(.persist(window.state)))
        #expect(window.state.clockEpoch == 1)

        // Later readings continue from the set-back time: still ended, not audited again.
        let later = window.evaluate(subject, at: reading(wall: 2 * hour - 86_400, boot: 100 + 2 * hour))
        #expect(later.decision == .clockWentBackwards)
        #expect(!later.actions.contains { if case .audit = $0 { true } else { false } })

        // Even once the wall clock is put right again the window stays ended.
        let putRight = window.evaluate(
            subject, at: reading(wall: 2 * hour + 60, boot: 100 + 2 * hour + 60))
        #expect(putRight.decision == .clockWentBackwards)
    }

    @Test func contactAfterTheClockWentBackwards_opensAFreshWindow() {
        var (window, _) = windowWithContact(at: reading(wall: 0, boot: 100))
        _ = window.observe(reading(wall: -86_400, boot: 200))
        let (contact, _) = window.recordContact(at: reading(wall: -86_400 + 100, boot: 300))
        let evaluation = window.evaluate(
            .identityProvider(lastContact: contact),
            at: reading(wall: -86_400 + 100 + hour, boot: 300 + hour))
        #expect(evaluation.decision == .allowed(remaining: .seconds(7 * hour)))
    }

    @Test func smallBackwardStepWithinTolerance_neitherEndsNorExtendsTheWindow() {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100))
        let subject = OfflineWindow.Subject.identityProvider(lastContact: contact)
        _ = window.observe(reading(wall: hour, boot: 100 + hour))
        // NTP steps the wall clock back by 2 s (the tolerance): not an attack, not audited.
        let stepped = window.evaluate(subject, at: reading(wall: hour - 2, boot: 100 + hour))
        #expect(stepped.decision == .allowed(remaining: .seconds(7 * hour)))
        #expect(window.state.clockEpoch == 0)
        // Beyond the tolerance it counts.
        let beyond = window.evaluate(subject, at: reading(wall: hour - 5, boot: 100 + hour + 1))
        #expect(beyond.decision == .clockWentBackwards)
    }

    @Test func rebootWithTheWallClockSetBack_endsTheWindow() {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100, "boot-a"))
        _ = window.observe(reading(wall: 2 * hour, boot: 100 + 2 * hour, "boot-a"))

        let afterReboot = reading(wall: -86_400, boot: 30, "boot-b")
        let evaluation = window.evaluate(.identityProvider(lastContact: contact), at: afterReboot)
        #expect(evaluation.decision == .clockWentBackwards)
        #expect(
            evaluation.actions.contains(
                .audit(
                    .clockWentBackwards(
                        previous: reading(wall: 2 * hour, boot: 100 + 2 * hour, "boot-a"), current: afterReboot)
                )))
    }

    @Test func rebootWithNormalTime_measuresOnTheWallClockAboveTheHighWaterMark() {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100, "boot-a"))
        let subject = OfflineWindow.Subject.identityProvider(lastContact: contact)
        _ = window.observe(reading(wall: hour, boot: 100 + hour, "boot-a"))

        // Switched off for an hour and a half, booted 60 s ago.
        let evaluation = window.evaluate(subject, at: reading(wall: 3 * hour, boot: 60, "boot-b"))
        #expect(evaluation.decision == .allowed(remaining: .seconds(5 * hour)))
        #expect(evaluation.actions.allSatisfy { if case .audit = $0 { false } else { true } })
        #expect(
            window.evaluate(subject, at: reading(wall: 8 * hour - 1, boot: 5 * hour, "boot-b")).decision
                == .allowed(remaining: .seconds(1)))
        #expect(
            window.evaluate(subject, at: reading(wall: 8 * hour, boot: 5 * hour + 1, "boot-b")).decision
                == .expired(ago: .zero))
    }

    @Test func acrossBoots_theWholeCurrentBootCountsEvenIfTheWallClockLags() {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100, "boot-a"))
        let subject = OfflineWindow.Subject.identityProvider(lastContact: contact)
        _ = window.observe(reading(wall: 5 * hour, boot: 100 + 5 * hour, "boot-a"))

        // The new boot's wall clock starts just after the last observation (no backwards step), but
        // the terminal has been up for 2 h since: at least 7 h have passed.
        let lagging = reading(wall: 5 * hour + 10, boot: 2 * hour, "boot-b")
        #expect(
            window.evaluate(subject, at: lagging).decision == .allowed(remaining: .seconds(hour)))
        #expect(
            window.evaluate(subject, at: reading(wall: 5 * hour + 20, boot: 3 * hour, "boot-b")).decision
                == .expired(ago: .zero))
    }

    @Test func poweredOffTime_isInvisibleWithoutATrustedClock_butUptimeAlwaysCounts() {
        // The accepted limit: time spent switched off after the last observation cannot be seen when
        // the wall clock is set to just after that observation. Everything observed still counts.
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100, "boot-a"))
        _ = window.observe(reading(wall: 2 * hour, boot: 100 + 2 * hour, "boot-a"))
        let evaluation = window.evaluate(
            .identityProvider(lastContact: contact), at: reading(wall: 2 * hour + 60, boot: 60, "boot-b"))
        #expect(evaluation.decision == .allowed(remaining: .seconds(6 * hour - 60)))
    }

    @Test func suspend_bootClockAheadOfWallClock_theBootClockWins() {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100))
        // Suspended for 9 h: the boot clock counted it, the wall clock (a dead RTC) only advanced 1 h.
        let resumed = reading(wall: hour, boot: 100 + 9 * hour)
        let evaluation = window.evaluate(.identityProvider(lastContact: contact), at: resumed)
        #expect(evaluation.decision == .expired(ago: .seconds(hour)))
        #expect(window.state.clockEpoch == 0)
    }

    @Test func wallClockAheadOfBootClock_withinABoot_doesNotShortenTheWindow() {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100))
        let subject = OfflineWindow.Subject.identityProvider(lastContact: contact)
        // NTP steps the wall clock 8 h forward; an hour has really passed.
        let evaluation = window.evaluate(subject, at: reading(wall: 9 * hour, boot: 100 + hour))
        #expect(evaluation.decision == .allowed(remaining: .seconds(7 * hour)))
        // Across a reboot the forward jump is part of the high-water mark: fail closed.
        #expect(
            window.evaluate(subject, at: reading(wall: 9 * hour + 60, boot: 30, "boot-b")).decision
                == .expired(ago: .seconds(hour + 60)))
    }

    @Test func contactMadeWhileTheWallClockLags_isMeasuredCorrectlyAcrossAReboot() {
        // After a backwards step the terminal time runs ahead of the wall clock; a contact made then
        // must not look a day old after the next reboot.
        var window = OfflineWindow()
        _ = window.observe(reading(wall: 0, boot: 100, "boot-a"))
        _ = window.observe(reading(wall: -86_400, boot: 160, "boot-a"))
        let (contact, _) = window.recordContact(at: reading(wall: -86_400 + 40, boot: 200, "boot-a"))
        _ = window.observe(reading(wall: -86_400 + 40 + hour, boot: 200 + hour, "boot-a"))
        let evaluation = window.evaluate(
            .identityProvider(lastContact: contact),
            at: reading(wall: -86_400 + 40 + hour + 120, boot: 60, "boot-b"))
        #expect(evaluation.decision == .allowed(remaining: .seconds(7 * hour - 60)))
    }

    @Test func staleReading_isNotMistakenForTheClockGoingBackwards() {
        var window = OfflineWindow()
        _ = window.observe(reading(wall: 100, boot: 200))
        let stateBefore = window.state
        // Taken 50 s before the last reading, delivered after it.
        let actions = window.observe(reading(wall: 50, boot: 150))
        #expect(actions.isEmpty)
        #expect(window.state == stateBefore)
    }

    @Test func observe_persistsTheHighWaterMark_whichNeverDecreases() throws {
        var window = OfflineWindow()
        let first = window.observe(reading(wall: 0, boot: 10))
        #expect(first == [.persist(window.state)])
        #expect(window.state.highWater == origin)
        _ = window.observe(reading(wall: 600, boot: 610))
        #expect(window.state.highWater == origin.addingTimeInterval(600))
        _ = window.observe(reading(wall: 0, boot: 620))
        #expect(window.state.highWater == origin.addingTimeInterval(610))
    }

    @Test func stateAndContact_surviveARestartThroughCodable() throws {
        var (window, contact) = windowWithContact(at: reading(wall: 0, boot: 100))
        _ = window.observe(reading(wall: hour, boot: 100 + hour))
        let stateData = try JSONEncoder().encode(window.state)
        let contactData = try JSONEncoder().encode(contact)

        var restored = OfflineWindow(
            state: try JSONDecoder().decode(OfflineWindow.State.self, from: stateData))
        let restoredContact = try JSONDecoder().decode(OfflineWindow.Contact.self, from: contactData)
        #expect(restored.state == window.state)
        #expect(restoredContact == contact)
        #expect(
            restored.evaluate(
                .identityProvider(lastContact: restoredContact),
                at: reading(wall: 2 * hour, boot: 100 + 2 * hour)
            )
            .decision == .allowed(remaining: .seconds(6 * hour)))
    }
}
