import Foundation
import KioskAuthCore
import Testing

@testable import KioskAuthStore

/// `Store.transaction(now:_:)`: a state change and its audit entry commit together or not at all
/// (issue #13 item 1).
@Suite("One transaction for a state change and its audit entry")
struct TransactionTests {
    private func record(_ action: String, _ person: String) -> AuditRecord {
        AuditRecord(action: action, result: "success", person: person, callerUID: 0)
    }

    /// Adds a person inside a typed-throwing transaction body.
    private func add(_ store: Store, _ name: LoginName) throws(StoreError) -> StoredPerson {
        try store.addPerson(
            name: name, displayName: name.rawValue, roles: RoleSet(primary: .caregiver), origin: .local,
            state: .active, uid: nil, now: testNow)
    }

    @Test func addPersonAndItsEntry_commitTogether_andTheAnchorFollowsTheCommit() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try LoginName("sarah")
            let entry = try store.transaction(now: testNow) { tx throws(StoreError) in
                _ = try add(store, sarah)
                return try tx.appendAudit(record("person.add", "sarah"))
            }
            #expect(try store.person(named: LoginName("sarah")) != nil)
            #expect(try store.auditEntries().last == entry)
            #expect(store.anchor.lastHead == AuditHeadMark(sequence: entry.sequence, mac: entry.mac))
        }
        try fixture.withStore { store throws in
            #expect(try store.person(named: LoginName("sarah")) != nil)
            #expect(try store.verifyAudit().isValid)
        }
    }

    @Test func aFailingAuditAppend_rollsTheActionBack() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            store.failingAuditActions = ["person.add"]
            let head = try store.auditHead()
            let sarah = try LoginName("sarah")
            #expect(throws: StoreError.self) {
                try store.transaction(now: testNow) { tx throws(StoreError) in
                    _ = try add(store, sarah)
                    try tx.appendAudit(record("person.add", "sarah"))
                }
            }
            #expect(try store.person(named: LoginName("sarah")) == nil)
            #expect(try store.auditHead() == head)
        }
    }

    @Test func anErrorAfterTheAppend_rollsBackBothSteps_andLeavesTheAnchorAlone() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            let anchored = store.anchor.lastHead
            let verifier = try PasscodeVerifier.make(passcode: "482913", parameters: testHashParameters)
            #expect(throws: StoreError.self) {
                try store.transaction(now: testNow) { tx throws(StoreError) in
                    try store.setPasscodeVerifier(verifier, for: sarah, now: testNow)
                    try store.setState(.suspended, for: sarah, now: testNow)
                    try tx.appendAudit(record("passcode.set", "sarah"))
                    throw StoreError(.noSuchPerson("sarah"))
                }
            }
            let after = try #require(try store.person(named: sarah.name))
            #expect(!after.hasPasscode && after.state == .active)
            #expect(try store.auditEntries().isEmpty)
            #expect(store.anchor.lastHead == anchored)
            // The store works normally afterwards.
            let entry = try store.appendAudit(record("passcode.set", "sarah"), now: testNow)
            #expect(entry.sequence == 1)
            #expect(try store.verifyAudit().isValid)
        }
    }

    @Test func aFailedStepCaughtInside_undoesOnlyItself() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            let omar = try LoginName("omar")
            try store.transaction(now: testNow) { tx throws(StoreError) in
                _ = try add(store, omar)
                // A duplicate fails; the transaction goes on without it.
                #expect(throws: StoreError.self) { _ = try add(store, sarah.name) }
                try tx.appendAudit(record("person.add", "omar"))
            }
            #expect(try store.peopleCount() == 2)
            #expect(try store.auditEntries().map(\.record.person) == ["omar"])
        }
    }

    @Test func removingAPersonInside_checkpointsAfterTheCommit() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("482913", for: sarah)
            try store.transaction(now: testNow) { tx throws(StoreError) in
                try store.removePerson(sarah)
                try tx.appendAudit(record("person.remove", "sarah"))
            }
            #expect(try store.person(named: sarah.name) == nil)
            #expect(fixture.walBytes().isEmpty)  // truncated once the transaction had committed
        }
    }

    @Test func anotherThread_waitsForTheWholeTransaction() async throws {
        let fixture = try StoreFixture()
        let store = try fixture.open()
        defer { store.close() }
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let sarah = try LoginName("sarah")
        let writer = Thread {
            _ = try? store.transaction(now: testNow) { tx throws(StoreError) in
                _ = try add(store, sarah)
                entered.signal()
                release.wait()
                try tx.appendAudit(record("person.add", "sarah"))
            }
        }
        writer.start()
        entered.wait()
        let reader = Task.detached { try store.auditHead().events }
        try await Task.sleep(for: .milliseconds(100))
        release.signal()
        // The reader waited for the commit.
        #expect(try await reader.value == 1)
    }
}
