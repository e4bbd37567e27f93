import Foundation
import KioskAuthCore
import Testing

@testable import KioskAuthStore

@Suite("Commit durability and prepared statements")
struct DurabilityTests {
    private func record(_ result: String) -> AuditRecord {
        AuditRecord(action: "passcode.verify", result: result, person: "sarah", method: "passcode", callerUID: 0)
    }

    private func synchronousSetting(_ store: Store) throws -> Int? {
        try store.locked { try store.connection.query("PRAGMA synchronous").first?["synchronous"].int }
    }

    @Test func failureThenSuccess_bothSurviveAReopen_andTheConnectionStaysFullySynchronous() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            var failed = sarah.failures
            failed.passcodeFailures = 2
            _ = try store.recordAuthentication(
                of: sarah, failures: failed, unlockedAt: nil, audit: record("failure"), now: testNow)
            #expect(try synchronousSetting(store) == 2)  // FULL
            #expect(store.deferredSyncCommits == 0)  // a failure waits for fsync
            let current = try #require(try store.person(named: sarah.name))
            // A success that clears the counters: committed without waiting for fsync.
            _ = try store.recordAuthentication(
                of: current, failures: CredentialFailureState(), unlockedAt: testNow.addingTimeInterval(5),
                audit: record("success"), now: testNow.addingTimeInterval(5))
            #expect(store.deferredSyncCommits == 1)
            #expect(try synchronousSetting(store) == 2)  // back to FULL for everything after it
        }
        try fixture.withStore { store throws in
            let sarah = try #require(try store.person(named: try LoginName("sarah")))
            #expect(sarah.failures == CredentialFailureState())
            #expect(sarah.lastUnlockAt == testNow.addingTimeInterval(5))
            let results = try store.auditEntries().filter { $0.record.action == "passcode.verify" }.map(\.record.result)
            #expect(results == ["failure", "success"])
            #expect(try store.verifyAudit().isValid)
        }
    }

    @Test func aSuccessThatWouldTightenTheCounters_isNotTreatedAsHarmlessToLose() throws {
        // An unlock that raises a counter (a caller's mistake, or a future policy) must still be
        // durable: the deferral is only for writes that relax state.
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            var raised = sarah.failures
            raised.fingerprintFailures = 1
            _ = try store.recordAuthentication(
                of: sarah, failures: raised, unlockedAt: testNow, audit: record("success"), now: testNow)
            #expect(store.deferredSyncCommits == 0)
        }
        try fixture.withStore { store throws in
            #expect(try store.person(named: try LoginName("sarah"))?.failures.fingerprintFailures == 1)
        }
    }

    @Test func repeatedQueries_reuseOneStatement_andTheCacheIsBounded() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try store.addTestPerson("sarah")
            let before = store.connection.cachedStatementCount
            for _ in 0..<50 { _ = try store.person(named: try LoginName("sarah")) }
            #expect(store.connection.cachedStatementCount <= before + 1)
            for index in 0..<(SQLiteConnection.statementCacheLimit * 2 + 3) {
                _ = try store.locked { try store.connection.query("SELECT \(index) AS n") }
            }
            #expect(store.connection.cachedStatementCount <= SQLiteConnection.statementCacheLimit)
            // Still correct after the cache was flushed.
            #expect(try store.person(named: try LoginName("sarah"))?.name.rawValue == "sarah")
        }
    }

    @Test func aFailedStatement_leavesNoTransactionOpen() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try store.addTestPerson("sarah")
            #expect(throws: (any Error).self) {
                try store.locked { try store.connection.query("INSERT INTO people (id) VALUES (NULL)") }
            }
            // A second person can still be added (the failed statement was reset).
            _ = try store.addTestPerson("noor")
            #expect(try store.peopleCount() == 2)
        }
    }
}
