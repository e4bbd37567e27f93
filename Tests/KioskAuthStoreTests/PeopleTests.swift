import Foundation
import KioskAuthCore
import KioskAuthStore
import Testing

@Suite("People in the store")
struct StoredPeopleTests {
    @Test func person_roundTripsEveryField_acrossAReopen() throws {
        let fixture = try StoreFixture()
        let roles = RoleSet(primary: .coordinator, others: [.family, .caregiver])
        let added = try fixture.withStore { store throws in
            try store.addPerson(
                name: LoginName("sarah.k@clinic"), displayName: "Sarah Kowalski", roles: roles, origin: .idp,
                state: .pendingActivation, uid: 1042, now: testNow)
        }
        #expect(added.name.rawValue == "sarah.k@clinic")
        #expect(added.id > 0)

        let read = try fixture.withStore { store throws in try store.person(named: LoginName("sarah.k@clinic")) }
        let person = try #require(read)
        #expect(person == added)
        #expect(person.displayName == "Sarah Kowalski")
        #expect(person.roles == roles)
        #expect(person.roles.primary == .coordinator)
        #expect(person.roles.all == [.coordinator, .family, .caregiver])
        #expect(person.origin == .idp)
        #expect(person.state == .pendingActivation)
        #expect(person.uid == 1042)
        #expect(person.createdAt == testNow)
        #expect(person.lastUnlockAt == nil)
        #expect(person.failures == CredentialFailureState())
        #expect(!person.hasPasscode)
        #expect(person.fingers.isEmpty)
    }

    @Test func statusFigures_followEveryWrite_includingAnotherProcesses() throws {
        let fixture = try StoreFixture()
        let store = try fixture.open()
        defer { store.close() }
        #expect(try store.statusFigures().people == 0)
        _ = try store.addTestPerson("ben")
        let entry = try store.appendAudit(AuditRecord(action: "person.add", result: "success"), now: testNow)
        var figures = try store.statusFigures()
        #expect(figures.people == 1)
        #expect(figures.auditEvents == entry.sequence)
        #expect(figures.auditHead == entry.mac)
        #expect(try store.statusFigures() == figures)
        // Written behind the store's back, by another connection: seen at the next call.
        try fixture.raw().query("DELETE FROM people")
        figures = try store.statusFigures()
        #expect(figures.people == 0)
    }

    @Test func person_withoutAUid_isFoundByName_butByNoUid() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let ben = try store.addTestPerson("ben")
            #expect(ben.uid == nil)
            #expect(try store.person(named: LoginName("ben")) == ben)
            #expect(try store.person(boundTo: 0) == nil)
        }
    }

    @Test func personBoundToAUid_isFoundByThatUid() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah", uid: 1001)
            _ = try store.addTestPerson("ben", uid: 1002)
            #expect(try store.person(boundTo: 1001) == sarah)
            #expect(try store.person(boundTo: 1003) == nil)
        }
    }

    @Test func people_areListedByName_andCounted() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            for name in ["zoe", "ben", "maria"] { _ = try store.addTestPerson(name) }
            #expect(try store.people().map(\.name.rawValue) == ["ben", "maria", "zoe"])
            #expect(try store.peopleCount() == 3)
        }
    }

    @Test func secondPersonWithTheSameName_isRefused() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try store.addTestPerson("sarah", uid: 1001)
            #expect(storeErrorCode { _ = try store.addTestPerson("sarah", uid: 1002) } == .personExists)
            #expect(try store.peopleCount() == 1)
        }
    }

    @Test func secondPersonBoundToTheSameUid_isRefused() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try store.addTestPerson("sarah", uid: 1001)
            #expect(storeErrorCode { _ = try store.addTestPerson("ben", uid: 1001) } == .personExists)
            #expect(try store.person(named: LoginName("ben")) == nil)
        }
    }

    @Test func stateChanges_andUnlocks_persist() throws {
        let fixture = try StoreFixture()
        let unlockedAt = testNow.addingTimeInterval(3600)
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setState(.suspended, for: sarah, now: testNow)
            try store.recordUnlock(of: sarah, now: unlockedAt)
        }
        let sarah = try #require(try fixture.withStore { try $0.person(named: LoginName("sarah")) })
        #expect(sarah.state == .suspended)
        #expect(sarah.lastUnlockAt == unlockedAt)
    }

    @Test func failureCounters_persistAcrossCloseAndReopen() throws {
        let fixture = try StoreFixture()
        let lockedUntil = testNow.addingTimeInterval(15 * 60)
        let failures = CredentialFailureState(
            passcodeFailures: 9, passcodeLockedUntil: lockedUntil, passcodeHardLocked: true, fingerprintFailures: 2)
        try fixture.withStore { store throws in
            try store.saveFailures(failures, for: try store.addTestPerson("sarah"), now: testNow)
        }
        let sarah = try #require(try fixture.withStore { try $0.person(named: LoginName("sarah")) })
        #expect(sarah.failures == failures)

        // And clearing them persists too.
        try fixture.withStore { store throws in
            try store.saveFailures(CredentialFailureState(), for: sarah, now: testNow)
        }
        let cleared = try #require(try fixture.withStore { try $0.person(named: LoginName("sarah")) })
        #expect(cleared.failures == CredentialFailureState())
    }

    @Test func savingFailures_forSomeoneRemoved_isNoSuchPerson() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.removePerson(sarah)
            #expect(
                storeErrorCode { try store.saveFailures(CredentialFailureState(), for: sarah, now: testNow) }
                    == .noSuchPerson)
            #expect(storeErrorCode { try store.removePerson(sarah) } == .noSuchPerson)
        }
    }

    @Test func terminalValue_roundTrips_isReplaced_andPersists() throws {
        struct Throttle: Codable, Equatable {
            var attempts: Int
            var windowStart: Date
            var note: String?
        }
        let fixture = try StoreFixture()
        let first = Throttle(attempts: 3, windowStart: testNow, note: "walk-up")
        let second = Throttle(attempts: 4, windowStart: testNow.addingTimeInterval(60), note: nil)
        try fixture.withStore { store throws in
            #expect(try store.terminalValue(Throttle.self, forKey: "identify-throttle") == nil)
            try store.setTerminalValue(first, forKey: "identify-throttle")
            #expect(try store.terminalValue(Throttle.self, forKey: "identify-throttle") == first)
            try store.setTerminalValue(second, forKey: "identify-throttle")
            try store.setTerminalValue(first, forKey: "another-key")
        }
        try fixture.withStore { store throws in
            #expect(try store.terminalValue(Throttle.self, forKey: "identify-throttle") == second)
            #expect(try store.terminalValue(Throttle.self, forKey: "another-key") == first)
            #expect(try store.terminalValue(Throttle.self, forKey: "never-set") == nil)
        }
    }
}
