import KioskAuthCore
import Testing

@testable import KioskAuthStore

/// A pass over every row (the sweep after start-up, the whole audit chain's verification) fills
/// SQLite's page cache, up to 2 MiB that the connection would hold for the rest of the daemon's
/// life; each pass gives it back when it ends, so an idle daemon's memory does not grow with
/// the people or the trail.
@Suite("Page cache")
struct PageCacheTests {
    /// Below what either pass reads here (about 300 KiB of people, 1.5 MiB of trail).
    static let bound = 64 * 1024

    @Test func theSweepOfEveryRow_leavesNoPagesCached() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let names = try (0..<2000).map { try LoginName("person\($0)") }
            try store.transaction(now: testNow) { _ throws(StoreError) in
                for name in names {
                    _ = try store.addPerson(
                        name: name, displayName: name.rawValue, roles: RoleSet(primary: .caregiver), origin: .local,
                        state: .active, uid: nil, now: testNow)
                }
            }
            store.releaseCacheMemory()
            _ = try store.people()  // reads them all: the cache holds them until released
            #expect(store.pageCacheBytes > Self.bound)
            #expect(try store.verifyRows() == 2000)
            #expect(store.pageCacheBytes < Self.bound)
        }
    }

    @Test func verifyingTheWholeChain_leavesNoPagesCached() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            try store.transaction(now: testNow) { tx throws(StoreError) in
                for index in 0..<5000 {
                    _ = try tx.appendAudit(
                        AuditRecord(
                            action: "passcode.verify", result: "success", person: "person\(index % 50)",
                            method: "passcode", service: "login", detail: String(repeating: "x", count: 200)))
                }
            }
            store.releaseCacheMemory()
            #expect(try store.verifyAudit().isValid)
            #expect(store.pageCacheBytes < Self.bound)
            _ = try store.auditEntries(after: 0, limit: 5000)  // the same reads, not released
            #expect(store.pageCacheBytes > Self.bound)
        }
    }
}
