import Foundation
import KioskAuthCore
import Testing

@testable import KioskAuthStore

/// The fleet queue (schema 6): a local write and the push that reports it commit in one SQLite
/// transaction, in order; changes pulled from the directory are not queued back.
@Suite("Fleet queue in the writing transaction")
struct FleetQueueTests {
    private func member(_ store: Store) throws {
        try store.beginFleetMembership(
            FleetMembership(
                directory: "postgres://kiosk@/fleet?host=/run/test", terminalID: UUID().uuidString.lowercased(),
                name: "a", state: "member", joinedAt: testNow))
    }

    private func kinds(_ batches: [FleetOutboxBatch]) -> [[String]] {
        batches.map { batch in
            batch.operations.map { operation in
                switch operation {
                case .person(_, _, _, _, let state): "person:\(state)"
                case .verifier: "verifier"
                case .passcodeFailures(_, let count): "failures:\(count)"
                case .passcodeReset: "reset"
                case .template(_, let finger, _): "template:\(finger)"
                case .removeTemplate(_, let finger): "remove-template:\(finger)"
                }
            }
        }
    }

    /// Acknowledges every queued batch, as a directory that applied them would.
    private func acknowledgeAll(_ store: Store) throws {
        for batch in try store.fleetOutbox(limit: 100) { try store.acknowledgeFleetBatch(batch) }
    }

    /// Whether a reset of `person` waits in the queue (in its window or not).
    private func queued(_ store: Store, _ person: StoredPerson) throws -> Bool {
        try !store.connection.query(
            """
            SELECT 1 FROM fleet_queued_resets r JOIN fleet_people p ON p.fleet_id = r.fleet_id
            WHERE p.person_id = ?
            """,
            [.integer(person.id)]
        ).isEmpty
    }

    /// The directory person id `person` is pushed under.
    private func fleetID(_ store: Store, _ person: StoredPerson) throws -> String {
        try #require(
            try store.connection.query("SELECT fleet_id FROM fleet_people WHERE person_id = ?", [.integer(person.id)])
                .first?["fleet_id"].string)
    }

    /// Queues a failure and the reset of a success for `person`.
    private func failThenSucceed(_ store: Store, _ person: StoredPerson) throws {
        var failures = CredentialFailureState()
        failures.passcodeFailures = 1
        try store.saveFailures(failures, for: person, now: testNow)
        try store.saveFailures(CredentialFailureState(), for: person, now: testNow)
    }

    /// Moves the queued resets of `person` `seconds` into the past.
    private func age(_ store: Store, _ person: StoredPerson, by seconds: Double) throws {
        try store.connection.query(
            """
            UPDATE fleet_queued_resets SET queued_at = queued_at - ?
            WHERE fleet_id = (SELECT fleet_id FROM fleet_people WHERE person_id = ?)
            """,
            [.real(seconds), .integer(person.id)])
    }

    /// A pulled sum is set aside only within the window of a queued reset; a reset seen past
    /// its window stays expired (a clock set back does not reopen it), and the end of a window
    /// that set a sum aside is reported, with the sum last pulled, until it is counted again.
    @Test func aQueuedReset_setsTheSumAsideForItsWindowOnly_andItsEndIsCountedOnce() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let sarah = try store.addTestPerson("sarah")
            let tom = try store.addTestPerson("tom")
            #expect(!(try store.setsAsideFleetSum(fleetID: try fleetID(store, sarah), window: 60)))
            try failThenSucceed(store, sarah)
            try failThenSucceed(store, tom)
            #expect(try store.endedFleetResetWindows(window: 60).isEmpty)
            #expect(try store.setsAsideFleetSum(fleetID: try fleetID(store, sarah), window: 60))
            try store.setFleetFailureSum(7, of: sarah)
            #expect(try store.endedFleetResetWindows(window: 60).isEmpty)
            // 61 s later: over for both; only Sarah had a sum set aside.
            try age(store, sarah, by: 61)
            try age(store, tom, by: 61)
            let ended = try store.endedFleetResetWindows(window: 60)
            #expect(ended.map { $0.0.name.rawValue } == ["sarah"] && ended.map { $0.1 } == [7])
            // Until her count is saved and her resets expired (a crash in between), she is named again.
            #expect(try store.endedFleetResetWindows(window: 60).map { $0.0.name.rawValue } == ["sarah"])
            try store.expireFleetResets(of: sarah, window: 60)
            #expect(try store.endedFleetResetWindows(window: 60).isEmpty)
            #expect(!(try store.setsAsideFleetSum(fleetID: try fleetID(store, sarah), window: 60)))
            // The clock set back an hour: the expired resets stay expired.
            try age(store, sarah, by: -3600)
            try age(store, tom, by: -3600)
            #expect(!(try store.setsAsideFleetSum(fleetID: try fleetID(store, sarah), window: 60)))
            #expect(!(try store.setsAsideFleetSum(fleetID: try fleetID(store, tom), window: 60)))
            #expect(try queued(store, sarah) && queued(store, tom))
            // A reset dated in the future does not set anything aside either.
            try failThenSucceed(store, sarah)
            try store.connection.query("UPDATE fleet_queued_resets SET queued_at = queued_at + 600 WHERE expired = 0")
            #expect(!(try store.setsAsideFleetSum(fleetID: try fleetID(store, sarah), window: 60)))
        }
    }

    /// Two resets queued: the older one's window ends while the newer one's runs; the set-aside
    /// goes on with the newer one and is reported when that one ends.
    @Test func aSetAsideOutlivingItsReset_isCarriedByTheNewerOne() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let sarah = try store.addTestPerson("sarah")
            try failThenSucceed(store, sarah)
            #expect(try store.setsAsideFleetSum(fleetID: try fleetID(store, sarah), window: 60))
            try age(store, sarah, by: 50)
            try failThenSucceed(store, sarah)
            try age(store, sarah, by: 20)  // the first is 70 s old, the second 20 s
            #expect(try store.endedFleetResetWindows(window: 60).isEmpty)
            try age(store, sarah, by: 41)
            #expect(try store.endedFleetResetWindows(window: 60).map { $0.0.name.rawValue } == ["sarah"])
        }
    }

    @Test func aPendingAttempt_survivesReopening_andBeginningOrEndingAMembershipForgetsIt() throws {
        let fixture = try StoreFixture()
        let attempt = FleetPendingAttempt(
            operation: .create, directory: "postgres://kiosk@/fleet?host=/run/test",
            terminalID: UUID().uuidString.lowercased(), wrappedKey: [0, 3, 1, 2, 3, 4, 5])
        try fixture.withStore { store in
            #expect(try store.fleetPendingAttempt() == nil)
            try store.setFleetPendingAttempt(attempt)
        }
        try fixture.withStore { store in
            #expect(try store.fleetPendingAttempt() == attempt)
            try member(store)
            #expect(try store.fleetPendingAttempt() == nil)
            let join = FleetPendingAttempt(
                operation: .join, directory: attempt.directory, terminalID: attempt.terminalID, tokenID: "t")
            try store.setFleetPendingAttempt(join)
            #expect(try store.fleetPendingAttempt() == join)
            try store.endFleetMembership()
            #expect(try store.fleetPendingAttempt() == nil)
        }
    }

    @Test func withoutMembership_nothingIsQueued() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("4711-2345", for: sarah)
            #expect(try store.fleetOutboxCount() == 0)
            #expect(try store.fleetMembership() == nil)
        }
    }

    @Test func committedWrites_eachHaveTheirBatch_inOrder_andSurviveReopening() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("4711-2345", for: sarah)
            let suspended = try #require(try store.person(named: LoginName("sarah")))
            try store.setSuspension("lost badge", for: suspended, now: testNow)
            try store.removePerson(try #require(try store.person(named: LoginName("sarah"))))
        }
        try fixture.withStore { store in
            let batches = try store.fleetOutbox(limit: 100)
            #expect(kinds(batches) == [["person:active"], ["verifier"], ["person:suspended"], ["person:removed"]])
            let ids = batches.compactMap { batch -> String? in
                if case .person(let id, _, _, _, _) = batch.operations[0] { return id }
                return nil
            }
            #expect(Set(ids).count == 1, "one directory id for the person throughout")
            #expect(Set(batches.map(\.idempotencyKey)).count == 4)
        }
    }

    @Test func aFailingWrite_leavesNoBatch() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            _ = try store.addTestPerson("sarah")
            let sarahName = try LoginName("sarah")
            let before = try store.fleetOutboxCount()
            // The audit append fails, so the suspension and its batch roll back together.
            store.failingAuditActions = ["person.suspend"]
            #expect(throws: StoreError.self) {
                try store.transaction(now: testNow) { tx throws(StoreError) in
                    guard let sarah = try store.person(named: sarahName) else { return }
                    try store.setSuspension("x", for: sarah, now: testNow)
                    try tx.appendAudit(AuditRecord(action: "person.suspend", result: "success"))
                }
            }
            #expect(try store.fleetOutboxCount() == before)
            #expect(try store.person(named: LoginName("sarah"))?.state == .active)
            // A duplicate person fails inside its transaction: no batch either.
            #expect(throws: StoreError.self) { try store.addTestPerson("sarah") }
            #expect(try store.fleetOutboxCount() == before)
        }
    }

    @Test func pendingPeople_stayLocal_untilActive() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let tom = try store.addPerson(
                name: LoginName("tom"), displayName: "Tom", roles: RoleSet(primary: .caregiver), origin: .local,
                state: .pendingActivation, uid: nil, now: testNow)
            #expect(try store.fleetOutboxCount() == 0)
            try store.transaction(now: testNow) { _ throws(StoreError) in
                try store.setTestPasscodeTyped("4711-2345", for: tom)
                try store.setState(.active, for: tom, now: testNow)
            }
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [["person:active", "verifier"]])
        }
    }

    @Test func failuresAndResets_areQueued_andAcknowledgementsTakeThemOff() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            var sarah = try store.addTestPerson("sarah")
            var failures = CredentialFailureState()
            failures.passcodeFailures = 1
            try store.saveFailures(failures, for: sarah, now: testNow)
            failures.passcodeFailures = 3
            try store.saveFailures(failures, for: sarah, now: testNow)
            sarah = try #require(try store.person(named: LoginName("sarah")))
            #expect(try store.unpushedFleetFailures(of: sarah) == 3)
            try store.saveFailures(CredentialFailureState(), for: sarah, now: testNow)
            let batches = try store.fleetOutbox(limit: 10)
            #expect(kinds(batches) == [["person:active"], ["failures:1"], ["failures:2"], ["reset"]])
            #expect(try store.unpushedFleetFailures(of: sarah) == 0)
            for batch in batches { try store.acknowledgeFleetBatch(batch) }
            #expect(try store.fleetOutboxCount() == 0)
        }
    }

    /// A passcode check as the daemon makes it: the attempt counted as a failure before its hash
    /// is checked (`saveFailuresOfUnfinishedCheck`), then its outcome.
    private func check(
        _ store: Store, _ name: String, matched: Bool, finish: Bool = true
    ) throws {
        let person = try #require(try store.person(named: LoginName(name)))
        var counted = person.failures
        counted.passcodeFailures += 1
        try store.saveFailuresOfUnfinishedCheck(counted, for: person, now: testNow)
        guard finish else { return }
        if matched {
            _ = try store.recordAuthentication(
                of: try #require(try store.person(named: LoginName(name))), failures: CredentialFailureState(),
                unlockedAt: testNow, audit: AuditRecord(action: "passcode.verify", result: "success"), now: testNow,
                finishingPasscodeCheck: true)
        } else {
            try store.finishPasscodeCheck(of: person)
        }
    }

    /// docs/fleet.md §9.6: a right passcode reports no failure to the directory. Counted as a
    /// failure while its hash is checked, it is reported only once the check ended: a wrong one
    /// as one failure, a right one as nothing (no failure before it) or a reset.
    @Test func aRightPasscode_reportsNoFailure_andAWrongOneIsReportedWhenItsCheckEnds() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let sarah = try store.addTestPerson("sarah")
            try acknowledgeAll(store)
            try check(store, "sarah", matched: true)
            try check(store, "sarah", matched: true)
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [])
            // While the check runs, the attempt is counted here and not reported.
            try check(store, "sarah", matched: false, finish: false)
            #expect(try store.person(named: LoginName("sarah"))?.failures.passcodeFailures == 1)
            #expect(try store.unfinishedPasscodeAttempts(of: sarah) == 1)
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [])
            try store.finishPasscodeCheck(of: sarah)
            #expect(try store.unfinishedPasscodeAttempts(of: sarah) == 0)
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [["failures:1"]])
            #expect(try store.unpushedFleetFailures(of: sarah) == 1)
            try check(store, "sarah", matched: false)
            try check(store, "sarah", matched: true)
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [["failures:1"], ["failures:1"], ["reset"]])
            #expect(try store.unpushedFleetFailures(of: sarah) == 0)
        }
    }

    /// A check under way when the daemon stopped (killed, a power cut) is found at the next
    /// open, still counted, and reported once it is ended as failed; two at once count two.
    @Test func anInterruptedCheck_isFoundAtTheNextOpen_andReportedAsAFailure() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            _ = try store.addTestPerson("sarah")
            _ = try store.addTestPerson("tom")
            try acknowledgeAll(store)
            try check(store, "sarah", matched: false, finish: false)
            try check(store, "sarah", matched: false, finish: false)
            try check(store, "tom", matched: true)
        }
        try fixture.withStore { store in
            let unfinished = try store.unfinishedPasscodeChecks()
            #expect(unfinished.map { "\($0.person.name.rawValue):\($0.attempts)" } == ["sarah:2"])
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [])
            let sarah = try #require(unfinished.first?.person)
            #expect(sarah.failures.passcodeFailures == 2)
            try store.finishPasscodeCheck(of: sarah, all: true)
            #expect(try store.unfinishedPasscodeChecks().isEmpty)
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [["failures:2"]])
        }
    }

    /// A fleet sum pulled while a check runs keeps the attempt counted here (the daemon counts
    /// the sum, the unpushed failures and the unfinished checks), and the attempt is still
    /// reported when its check ends as failed.
    @Test func aSumPulledWhileACheckRuns_keepsItCounted_andItIsReportedWhenItFails() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            _ = try store.addTestPerson("sarah")
            try acknowledgeAll(store)
            try check(store, "sarah", matched: false, finish: false)
            var sarah = try #require(try store.person(named: LoginName("sarah")))
            // Another terminal's 2 failures arrive: 2 pulled + 1 under way here.
            try store.applyingFleetChanges { () throws(StoreError) in
                var failures = sarah.failures
                failures.passcodeFailures = 2 + (try store.unfinishedPasscodeAttempts(of: sarah))
                try store.saveFailures(failures, for: sarah, now: testNow)
            }
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [])
            sarah = try #require(try store.person(named: LoginName("sarah")))
            #expect(sarah.failures.passcodeFailures == 3)
            try store.finishPasscodeCheck(of: sarah)
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [["failures:1"]])
        }
    }

    /// A failure, the right passcode, another failure: three batches. The reset forgave the
    /// first failure here at once, so its acknowledgement must not take the second one off the
    /// unpushed count (that would count one failure too few until the next pull).
    @Test func aFailureQueuedBeforeAReset_isNotTakenOffTheFailuresCountedSince() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            var sarah = try store.addTestPerson("sarah")
            try acknowledgeAll(store)
            var failures = CredentialFailureState()
            failures.passcodeFailures = 1
            try store.saveFailures(failures, for: sarah, now: testNow)
            #expect(!(try queued(store, sarah)))
            try store.saveFailures(CredentialFailureState(), for: sarah, now: testNow)
            try store.saveFailures(failures, for: sarah, now: testNow)
            sarah = try #require(try store.person(named: LoginName("sarah")))
            let batches = try store.fleetOutbox(limit: 10)
            #expect(kinds(batches) == [["failures:1"], ["reset"], ["failures:1"]])
            #expect(try store.unpushedFleetFailures(of: sarah) == 1)
            #expect(try queued(store, sarah))
            try store.acknowledgeFleetBatch(batches[0])
            #expect(try store.unpushedFleetFailures(of: sarah) == 1)
            #expect(try queued(store, sarah))
            try store.acknowledgeFleetBatch(batches[1])
            #expect(!(try queued(store, sarah)))
            try store.acknowledgeFleetBatch(batches[2])
            #expect(try store.unpushedFleetFailures(of: sarah) == 0)
        }
    }

    /// A store from schema 7 with a reset already queued knows it after the upgrade, dated
    /// when it was queued; a queued batch that does not open does not stop the upgrade.
    @Test func upgradeFromSchema7_findsTheResetsAlreadyQueued() throws {
        let fixture = try StoreFixture()
        let (sarah, tom) = try fixture.withStore { store throws -> (StoredPerson, StoredPerson) in
            try member(store)
            let sarah = try store.addTestPerson("sarah")
            let tom = try store.addTestPerson("tom")
            var failures = CredentialFailureState()
            failures.passcodeFailures = 2
            try store.saveFailures(failures, for: sarah, now: testNow)
            try store.saveFailures(CredentialFailureState(), for: sarah, now: testNow)
            try store.saveFailures(failures, for: tom, now: testNow)
            try store.saveFailures(CredentialFailureState(), for: tom, now: testNow)
            return (sarah, tom)
        }
        let raw = try fixture.raw()
        try raw.query("DROP TABLE fleet_queued_resets")
        // Tom's reset is in the newest batch; its sealed bytes are damaged.
        try raw.query(
            "UPDATE fleet_outbox SET sealed = zeroblob(64) WHERE id = (SELECT max(id) FROM fleet_outbox)")
        try raw.query("PRAGMA user_version = 7")
        raw.close()
        try fixture.withStore { store throws in
            #expect(try queued(store, sarah))
            #expect(!(try queued(store, tom)))
            // Acknowledged oldest first, up to and with Sarah's reset (the damaged batch is last).
            while try queued(store, sarah) {
                let oldest = try #require(try store.fleetOutbox(limit: 1).first)
                try store.acknowledgeFleetBatch(oldest)
            }
            #expect(try store.fleetOutboxCount() == 2)  // Tom's failures and his damaged reset
            // A terminal the directory removed forgets its queue, and with it the resets queued.
            var failures = CredentialFailureState()
            failures.passcodeFailures = 1
            try store.saveFailures(failures, for: sarah, now: testNow)
            try store.saveFailures(CredentialFailureState(), for: sarah, now: testNow)
            #expect(try queued(store, sarah))
            try store.markFleetRemoved(reason: "test")
            #expect(!(try queued(store, sarah)))
        }
    }

    @Test func appliedChanges_areNotPushedBack() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let sarahName = try LoginName("sarah")
            try store.applyingFleetChanges(now: testNow) { _ throws(StoreError) in
                let sarah = try store.addPerson(
                    name: sarahName, displayName: "Sarah", roles: RoleSet(primary: .caregiver),
                    origin: .local, state: .active, uid: nil, now: testNow)
                try store.linkFleetPerson(sarah, fleetID: "5a1f2b3c-0000-4000-8000-000000000001")
                try store.setSuspension("fleet", for: sarah, now: testNow)
            }
            #expect(try store.fleetOutboxCount() == 0)
            #expect(try store.person(fleetID: "5a1f2b3c-0000-4000-8000-000000000001")?.state == .suspended)
            // A later local change of the same person is pushed, under the directory's id.
            try store.setSuspension(nil, for: try #require(try store.person(named: LoginName("sarah"))), now: testNow)
            let batches = try store.fleetOutbox(limit: 10)
            #expect(
                batches.first?.operations.first
                    == .person(
                        fleetID: "5a1f2b3c-0000-4000-8000-000000000001", name: "sarah", roles: "caregiver", uid: nil,
                        state: "active"))
        }
    }

    @Test func theCreatingTerminal_queuesItsExistingPeople_inOneBatch() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("4711-2345", for: sarah)
            _ = try store.addTestPerson("tom")
            #expect(try store.fleetOutboxCount() == 0)
            try store.beginFleetMembership(
                FleetMembership(
                    directory: "postgres://kiosk@/fleet?host=/run/test", terminalID: UUID().uuidString.lowercased(),
                    name: "a", state: "member", joinedAt: testNow),
                firstKey: (1, Array(repeating: 7, count: 80)), bringLocalPeople: true, now: testNow)
            #expect(kinds(try store.fleetOutbox(limit: 10)) == [["person:active", "verifier", "person:active"]])
            #expect(try store.fleetKeys().map(\.generation) == [1])
        }
    }

    /// The creator's key, its membership and its people's batch are one transaction: a failure
    /// part-way (here the queue's insert, refused by a trigger, the last write of the three)
    /// keeps none of them, and the terminal is in no fleet. Written as three transactions, a
    /// crash between them kept a member whose people were never pushed.
    @Test func theCreatorsKeyMembershipAndPeople_areKeptTogether_orNotAtAll() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            _ = try store.addTestPerson("sarah")
            let raw = try fixture.raw()
            _ = try raw.query(
                "CREATE TRIGGER refuse_queue BEFORE INSERT ON fleet_outbox BEGIN SELECT RAISE(ABORT, 'injected'); END")
            raw.close()
            let membership = FleetMembership(
                directory: "postgres://kiosk@/fleet?host=/run/test", terminalID: UUID().uuidString.lowercased(),
                name: "a", state: "member", joinedAt: testNow)
            #expect(throws: StoreError.self) {
                try store.beginFleetMembership(
                    membership, firstKey: (1, Array(repeating: 7, count: 80)), bringLocalPeople: true, now: testNow)
            }
            #expect(try store.fleetMembership() == nil)
            #expect(try store.fleetKeys().isEmpty)
            #expect(!store.isInFleet)
            let again = try fixture.raw()
            _ = try again.query("DROP TRIGGER refuse_queue")
            again.close()
            try store.beginFleetMembership(
                membership, firstKey: (1, Array(repeating: 7, count: 80)), bringLocalPeople: true, now: testNow)
            #expect(try store.fleetOutboxCount() == 1)
            #expect(store.isInFleet)
        }
    }

    /// A joining terminal keeps its join secret sealed until its first keys are taken, which
    /// erase it; keys already held are never replaced.
    @Test func theJoinSecret_isSealed_untilTheFirstKeysAreTaken_andHeldKeysAreNeverReplaced() throws {
        let fixture = try StoreFixture()
        let secret = Array("a join secret of thirty-two bytes".utf8.prefix(32))
        try fixture.withStore { store in
            try store.beginFleetMembership(
                FleetMembership(
                    directory: "postgres://kiosk@/fleet?host=/run/test", terminalID: UUID().uuidString.lowercased(),
                    name: "c", state: "pending", joinedAt: testNow),
                joinSecret: secret, now: testNow)
            #expect(try store.fleetJoinSecret() == secret)
        }
        #expect(!bytes(try fixture.databaseBytes() + fixture.walBytes(), contain: secret))
        try fixture.withStore { store in
            #expect(try store.fleetJoinSecret() == secret)
            try store.acceptFleetKeys([(1, [1, 1, 1])], becomeMember: true, now: testNow)
            #expect(try store.fleetJoinSecret() == nil)
            #expect(try store.fleetMembership()?.state == "member")
            try store.acceptFleetKeys([(1, [2, 2, 2]), (2, [3, 3, 3])], becomeMember: false, now: testNow)
            #expect(try store.fleetKeys().map(\.wrapped) == [[1, 1, 1], [3, 3, 3]])
        }
    }

    @Test func concurrentWriters_eachGetTheirBatch_inCommitOrder() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let writers = 8
            let perWriter = 10
            DispatchQueue.concurrentPerform(iterations: writers) { writer in
                for index in 0..<perWriter {
                    _ = try? store.addTestPerson("w\(writer)x\(index)")
                }
            }
            let batches = try store.fleetOutbox(limit: 1000)
            #expect(batches.count == writers * perWriter)
            // The queue's order is the order the people rows were committed in.
            let names = batches.compactMap { batch -> String? in
                if case .person(_, let name, _, _, _) = batch.operations[0] { return name }
                return nil
            }
            let committed = try store.people().sorted { $0.id < $1.id }.map(\.name.rawValue)
            #expect(names == committed)
        }
    }

    @Test func enrolmentsAndRemovals_areQueued_withTheTemplate() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            let sarah = try store.addTestPerson("sarah")
            try store.addFinger("right-index", template: [1, 2, 3], for: sarah, now: testNow)
            try store.removeFingers("right-index", of: sarah)
            let batches = try store.fleetOutbox(limit: 10)
            #expect(kinds(batches) == [["person:active"], ["template:right-index"], ["remove-template:right-index"]])
            if case .template(_, _, let template) = batches[1].operations[0] { #expect(template == [1, 2, 3]) }
        }
    }

    @Test func keysAndTokens_areSealed_andTheMembershipEnds() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            try store.acceptFleetKeys([(1, Array(repeating: 7, count: 80))], becomeMember: false, now: testNow)
            try store.addFleetJoinToken(id: "t1", token: Array("kat1.secret".utf8), expiresAt: testNow, now: testNow)
            #expect(try store.fleetKeys().map(\.generation) == [1])
            #expect(try store.fleetJoinToken(id: "t1") == Array("kat1.secret".utf8))
            try store.markFleetJoinTokenUsed(id: "t1", terminal: "b", now: testNow)
            #expect(try store.fleetJoinToken(id: "t1") == nil)
            #expect(throws: StoreError.self) { try member(store) }
            try store.endFleetMembership()
            #expect(try store.fleetMembership() == nil)
            #expect(try store.fleetKeys().isEmpty)
        }
        #expect(try !fixture.databaseBytes().contains(subsequence: Array("kat1.secret".utf8)))
    }

    /// Schema 7: the versions of trusted directory rows only ever rise and survive reopening;
    /// refused changes are counted with the last reason; leaving forgets both.
    @Test func rowVersions_onlyRise_surviveReopening_andRefusalsAreCounted() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store in
            try member(store)
            try store.setFleetRowVersion(20, entity: "people", key: "p1")
            try store.setFleetRowVersion(10, entity: "people", key: "p1")
            try store.setFleetRowVersion(Int64.max, entity: "templates", key: "t1")
            try store.recordFleetRejection("change 7 (people p1) refused, forged")
            try store.recordFleetRejection("change 9 (people p1) refused, replayed")
        }
        try fixture.withStore { store in
            let versions = try store.fleetRowVersions().sorted { $0.key < $1.key }
            #expect(versions.map(\.key) == ["p1", "t1"])
            #expect(versions.map(\.version) == [20, Int64.max])
            let membership = try #require(try store.fleetMembership())
            #expect(membership.rejectedChanges == 2)
            #expect(membership.lastRejection?.hasSuffix("replayed") == true)
            try store.endFleetMembership()
            #expect(try store.fleetRowVersions().isEmpty)
            try member(store)
            #expect(try store.fleetMembership()?.rejectedChanges == 0)
        }
    }
}

extension Store {
    fileprivate func setTestPasscodeTyped(_ passcode: String, for person: StoredPerson) throws(StoreError) {
        try setPasscodeVerifier(
            PasscodeVerifier.make(passcode: passcode, parameters: testHashParameters), for: person, now: testNow)
    }
}

extension Array where Element == UInt8 {
    fileprivate func contains(subsequence: [UInt8]) -> Bool {
        guard subsequence.count <= count else { return false }
        for start in 0...(count - subsequence.count)
        where self[start..<start + subsequence.count].elementsEqual(subsequence) {
            return true
        }
        return false
    }
}
