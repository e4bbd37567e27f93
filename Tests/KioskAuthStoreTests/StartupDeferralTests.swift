import KioskAuthCore
import Testing

@testable import KioskAuthStore

/// From `holdSyncsUntilServing()` to `serving()`, every commit is made without waiting for its
/// own fsync (the WAL sync queue syncs it, then anchors its audit head); afterwards commits are
/// durable before they return again.
@Suite("Start-up deferral")
struct StartupDeferralTests {
    @Test func commitsBeforeServing_waitForNoSync_andCommitsAfterDo() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let before = store.deferredSyncCommits
            store.holdSyncsUntilServing()
            let sarah = try store.addTestPerson("sarah")
            _ = try store.appendAudit(AuditRecord(action: "daemon.start", result: "success"), now: testNow)
            // Nested: one commit, deferred once.
            try store.transaction(now: testNow) { tx throws(StoreError) in
                try store.setTerminalValue(7, forKey: "steady-clock")
                _ = try tx.appendAudit(AuditRecord(action: "clock", result: "success"))
            }
            #expect(store.deferredSyncCommits == before + 3)
            store.serving()
            try store.setTerminalValue(8, forKey: "steady-clock")
            _ = try store.appendAudit(AuditRecord(action: "passcode.verify", result: "failure"), now: testNow)
            #expect(store.deferredSyncCommits == before + 3)
            #expect(try store.person(id: sarah.id)?.name.rawValue == "sarah")
            #expect(try store.verifyAudit().isValid)
        }
        // Closed before anything synced them on purpose: reopened, everything is there and the
        // chain and its anchor agree.
        try fixture.withStore { store throws in
            #expect(try store.terminalValue(Int.self, forKey: "steady-clock") == 8)
            #expect(try store.verifyAudit().isValid)
            _ = try store.verifyAtStart()
        }
    }
}
