import Foundation
import KioskAuthCore
import KioskAuthStore
import Testing

@Suite("Opening the store")
struct StoreOpeningTests {
    @Test func opening_inAnEmptyDirectory_createsTheDatabaseFile() throws {
        let fixture = try StoreFixture()
        #expect(!FileManager.default.fileExists(atPath: fixture.path))
        let store = try fixture.open()
        store.close()
        #expect(FileManager.default.fileExists(atPath: fixture.path))
    }

    @Test func newStore_recordsItsSchemaVersion_andUsesWriteAheadLogging() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in #expect(store.openSchemaVersion == Store.schemaVersion) }
        let raw = try fixture.raw()
        #expect(try raw.scalar("PRAGMA user_version") == .integer(Int64(Store.schemaVersion)))
        #expect(try raw.scalar("PRAGMA journal_mode") == .text("wal"))
    }

    @Test func reopening_withTheSameKey_seesWhatWasWritten() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in _ = try store.addTestPerson("sarah") }
        try fixture.withStore { store throws in
            #expect(try store.people().map(\.name.rawValue) == ["sarah"])
        }
    }

    @Test func storeFromAFutureSchema_isRefused_andLeftByteForByte() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in _ = try store.addTestPerson("sarah") }
        try fixture.raw().query("PRAGMA user_version = \(Store.schemaVersion + 1)")
        let before = try fixture.databaseBytes()

        #expect(storeErrorCode { _ = try fixture.open() } == .futureSchema)

        #expect(try fixture.databaseBytes() == before)
        #expect(try fixture.raw().scalar("PRAGMA user_version") == .integer(Int64(Store.schemaVersion + 1)))
    }

    /// A newer daemon, or a copy made with other tools, may leave the file in rollback-journal
    /// mode; switching it to WAL would write to a file this daemon must not touch.
    @Test func storeFromAFutureSchema_inRollbackJournalMode_isNotSwitchedToWriteAheadLogging() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in _ = try store.addTestPerson("sarah") }
        do {
            let raw = try fixture.raw()
            try raw.query("PRAGMA journal_mode = DELETE")
            try raw.query("PRAGMA user_version = \(Store.schemaVersion + 1)")
        }
        let before = try fixture.databaseBytes()

        #expect(storeErrorCode { _ = try fixture.open() } == .futureSchema)

        #expect(try fixture.databaseBytes() == before)
        #expect(try fixture.raw().scalar("PRAGMA journal_mode") == .text("delete"))
    }

    @Test func storeFromAFutureSchema_errorMessage_namesBothVersions() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { _ in }
        let future = Store.schemaVersion + 2
        try fixture.raw().query("PRAGMA user_version = \(future)")
        let error = #expect(throws: StoreError.self) { _ = try fixture.open() }
        #expect(error?.message.contains("\(future)") == true)
        #expect(error?.message.contains("(\(Store.schemaVersion))") == true)
    }

    @Test func wrongKey_isRefused_andLeavesTheFileUnchanged() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
        }
        let before = try fixture.databaseBytes()

        #expect(storeErrorCode { _ = try fixture.open(with: .random()) } == .wrongKey)

        #expect(try fixture.databaseBytes() == before)
        // The right key still opens it afterwards: nothing was rewritten under the wrong one.
        try fixture.withStore { store throws in
            let sarah = try #require(try store.person(named: LoginName("sarah")))
            #expect(try store.passcodeVerifier(for: sarah)?.matches("480213") == true)
        }
    }

    @Test func wrongKey_onARollbackJournalStore_doesNotSwitchItToWriteAheadLogging() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in _ = try store.addTestPerson("sarah") }
        try fixture.raw().query("PRAGMA journal_mode = DELETE")
        let before = try fixture.databaseBytes()

        #expect(storeErrorCode { _ = try fixture.open(with: .random()) } == .wrongKey)

        #expect(try fixture.databaseBytes() == before)
    }

    @Test func fileThatIsNotADatabase_isRefusedAsAnIntegrityFailure() throws {
        let fixture = try StoreFixture()
        try Data(repeating: 0x5a, count: 8192).write(to: URL(fileURLWithPath: fixture.path))
        #expect(storeErrorCode { _ = try fixture.open() } == .integrity)
    }

    @Test func storeKey_ofAnySizeButThirtyTwoBytes_isRefused() {
        for size in [0, 16, 31, 33, 64] {
            #expect(storeErrorCode { _ = try StoreKey(bytes: [UInt8](repeating: 1, count: size)) } == .keyUnavailable)
        }
        #expect(storeErrorCode { _ = try StoreKey(bytes: [UInt8](repeating: 1, count: 32)) } == nil)
    }
}
