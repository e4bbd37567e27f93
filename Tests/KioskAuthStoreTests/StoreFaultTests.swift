import Foundation
import KioskAuthCore
import KioskAuthStore
import Testing

/// Row MACs beyond people (activation codes, sessions, terminal state, the passcode's
/// existence), the anchor as the record that a store exists and how far it got, and the check
/// before serving (issues #11 item 13, #13 items 2 and 3).
@Suite("Store faults")
struct StoreFaultTests {
    struct Throttle: Codable, Equatable { var unknownInARow: Int }

    /// A store with a person, a passcode, an activation code, a session and a terminal value.
    static func populated() throws -> (StoreFixture, StoredPerson) {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
            try store.issueActivationCode("ABCDEFGH", for: sarah, lifetime: 3600, now: testNow)
            try store.insertSession(
                StoredSession(
                    id: "s1", personID: sarah.id, personName: sarah.name, state: "{}", service: "login", tty: "tty1",
                    openedAt: testNow))
            try store.setTerminalValue(Throttle(unknownInARow: 4), forKey: "identify-throttle")
            try store.appendAudit(AuditRecord(action: "person.add", result: "success", person: "sarah"), now: testNow)
            return try #require(try store.person(id: sarah.id))
        }
        return (fixture, sarah)
    }

    static let codeEdits = [
        "UPDATE activation_codes SET failures = 3", "UPDATE activation_codes SET expires_at = expires_at + 86400",
        "UPDATE activation_codes SET used_at = 1", "UPDATE activation_codes SET revoked_at = 1",
        "UPDATE activation_codes SET issued_at = issued_at + 1", "UPDATE activation_codes SET person_id = 99",
        "UPDATE activation_codes SET code_mac = X'00'", "UPDATE activation_codes SET mac = NULL",
    ]

    @Test(arguments: 0..<codeEdits.count)
    func editedActivationCode_isAnIntegrityError(_ index: Int) throws {
        let (fixture, sarah) = try Self.populated()
        try fixture.raw().query(Self.codeEdits[index])
        try fixture.withStore { store throws in
            // Every read that finds the row refuses it (a rewritten code MAC or owner finds none).
            if !Self.codeEdits[index].contains("code_mac") {
                #expect(storeErrorCode { _ = try store.activationCode(matching: "ABCDEFGH") } == .integrity)
            }
            if !Self.codeEdits[index].contains("person_id") {
                #expect(storeErrorCode { _ = try store.activationCodes(of: sarah) } == .integrity)
            }
            #expect(storeErrorCode { _ = try store.verifyAtStart() } == .integrity)
        }
    }

    static let sessionEdits = [
        "UPDATE sessions SET state = '{\"x\":1}'", "UPDATE sessions SET person_id = person_id",
        "UPDATE sessions SET service = 'sshd'", "UPDATE sessions SET tty = NULL",
        "UPDATE sessions SET opened_at = 1", "UPDATE sessions SET end_reason = 'x'", "UPDATE sessions SET mac = NULL",
    ]

    @Test(arguments: 0..<sessionEdits.count)
    func editedSession_isAnIntegrityError(_ index: Int) throws {
        let (fixture, _) = try Self.populated()
        try fixture.raw().query(Self.sessionEdits[index])
        try fixture.withStore { store throws in
            // person_id rewritten to itself changes nothing: the MAC still checks out.
            if index == 1 {
                #expect(try store.openSessions().count == 1)
                return
            }
            #expect(storeErrorCode { _ = try store.openSessions() } == .integrity)
            #expect(
                storeErrorCode { try store.updateSession(id: "s1", state: "{}", endedAt: nil, endReason: nil) }
                    == .integrity)
            #expect(storeErrorCode { _ = try store.verifyAtStart() } == .integrity)
        }
    }

    @Test func editedTerminalValue_isAnIntegrityError_notAReset() throws {
        let (fixture, _) = try Self.populated()
        try fixture.raw().query("UPDATE terminal_state SET value = '{\"unknownInARow\":0}'")
        try fixture.withStore { store throws in
            #expect(
                storeErrorCode { _ = try store.terminalValue(Throttle.self, forKey: "identify-throttle") } == .integrity
            )
            // A write does not launder it either.
            #expect(
                storeErrorCode { try store.setTerminalValue(Throttle(unknownInARow: 0), forKey: "identify-throttle") }
                    == .integrity)
            #expect(storeErrorCode { _ = try store.verifyAtStart() } == .integrity)
        }
    }

    @Test func validWrites_keepEveryRowValid() throws {
        let (fixture, sarah) = try Self.populated()
        try fixture.withStore { store throws in
            let code = try #require(try store.activationCode(matching: "ABCDEFGH"))
            let failed = try store.recordActivationFailure(code, maxFailures: 2, now: testNow)
            #expect(failed.failures == 1 && failed.revokedAt == nil)
            try store.issueActivationCode("HGFEDCBA", for: sarah, lifetime: 60, now: testNow)
            #expect(try store.activationCodes(of: sarah).count == 2)
            try store.updateSession(id: "s1", state: "{\"a\":1}", endedAt: testNow, endReason: "logout")
            try store.setTerminalValue(Throttle(unknownInARow: 5), forKey: "identify-throttle")
            #expect(try store.terminalValue(Throttle.self, forKey: "identify-throttle") == Throttle(unknownInARow: 5))
            _ = try store.verifyAtStart()
        }
    }

    @Test func deletedPasscodeRow_isAnIntegrityError_notNoPasscode() throws {
        let (fixture, sarah) = try Self.populated()
        try fixture.raw().query("DELETE FROM secrets WHERE kind = 'passcode'")
        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.person(id: sarah.id) } == .integrity)
            #expect(storeErrorCode { _ = try store.passcodeVerifier(for: sarah) } == .integrity)
            #expect(storeErrorCode { _ = try store.verifyAtStart() } == .integrity)
        }
        // Clearing the flag as well is an edit of the MAC'd row.
        try fixture.raw().query("UPDATE people SET has_passcode = 0")
        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.person(id: sarah.id) } == .integrity)
        }
    }

    @Test func upgradeFromSchema4_recordsNoAccount_andFindsAnEarlierEdit() throws {
        let (fixture, sarah) = try Self.populated()
        try fixture.withStore { store throws in try store.setUID(4242, account: nil, for: sarah, now: testNow) }
        let raw = try fixture.raw()
        try raw.query("ALTER TABLE people DROP COLUMN bound_account")
        try raw.query("PRAGMA user_version = 4")
        raw.close()
        // The people MACs were computed over bound_account too, so schema 4 rejects them: an
        // earlier edit found at the upgrade.
        #expect(storeErrorCode { _ = try fixture.open() } == .integrity)
        // From schema 2 (no MACs to check) the upgrade keeps every row and records no account.
        let raw2 = try fixture.raw()
        for (table, column) in [
            ("people", "mac"), ("people", "has_passcode"), ("activation_codes", "mac"), ("sessions", "mac"),
            ("terminal_state", "mac"),
        ] {
            try raw2.query("ALTER TABLE \(table) DROP COLUMN \(column)")
        }
        try raw2.query("PRAGMA user_version = 2")
        raw2.close()
        try fixture.withStore { store throws in
            let read = try #require(try store.person(id: sarah.id))
            #expect(read.uid == 4242 && read.boundAccount == nil)
            #expect(try store.peopleWithUnrecordedAccounts().map(\.id) == [sarah.id])
            try store.recordBoundAccount("sarah", for: read, now: testNow)
            #expect(try store.person(id: sarah.id)?.boundAccount == "sarah")
            #expect(try store.peopleWithUnrecordedAccounts().isEmpty)
        }
        // The recorded account is under the row MAC: pointing it at another account is found.
        try fixture.raw().query("UPDATE people SET bound_account = 'mallory'")
        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.person(id: sarah.id) } == .integrity)
        }
    }

    @Test func upgradeFromSchema3_keepsEverythingReadable_andFindsAnEarlierEdit() throws {
        let (fixture, sarah) = try Self.populated()
        let raw = try fixture.raw()
        for (table, column) in [
            ("people", "bound_account"), ("people", "has_passcode"), ("activation_codes", "mac"), ("sessions", "mac"),
            ("terminal_state", "mac"),
        ] {
            try raw.query("ALTER TABLE \(table) DROP COLUMN \(column)")
        }
        try raw.query("PRAGMA user_version = 3")
        raw.close()
        // The people MACs were computed over has_passcode too, so schema 3 rejects them: that is
        // exactly an earlier edit being found at the upgrade.
        #expect(storeErrorCode { _ = try fixture.open() } == .integrity)
        // From schema 2 (no people MACs to check) everything gets its MAC.
        let raw2 = try fixture.raw()
        try raw2.query("ALTER TABLE people DROP COLUMN mac")
        try raw2.query("PRAGMA user_version = 2")
        raw2.close()
        try fixture.withStore { store throws in
            #expect(try #require(try store.person(id: sarah.id)).hasPasscode)
            #expect(try store.activationCodes(of: sarah).count == 1)
            #expect(try store.openSessions().count == 1)
            #expect(try store.terminalValue(Throttle.self, forKey: "identify-throttle") == Throttle(unknownInARow: 4))
            _ = try store.verifyAtStart()
        }
    }

    // MARK: Rollback (#13 item 2)

    @Test func storeBehindItsAnchor_isRefused_unlessAccepted_andTheAcceptanceIsAudited() throws {
        let (fixture, _) = try Self.populated()
        let before = try fixture.databaseBytes()
        try fixture.withStore { store throws in
            for index in 0..<3 {
                _ = try store.addTestPerson("late\(index)")
                try store.appendAudit(AuditRecord(action: "person.add", result: "success"), now: testNow)
            }
        }
        // The database goes back to an earlier copy; the anchor beside it stays.
        try Data(before).write(to: URL(fileURLWithPath: fixture.path))
        try? FileManager.default.removeItem(atPath: fixture.path + "-wal")
        do {
            _ = try fixture.open()
            Issue.record("a rolled-back store opened")
        } catch let error as StoreError {
            #expect(error.code == .rollback)
            #expect(error.message.contains("behind its audit head anchor"))
        }
        let store = try Store(
            path: fixture.path, key: fixture.key, logger: quietLogger, now: testNow, acceptRollback: true)
        defer { store.close() }
        #expect(store.acceptedRollback?.contains("behind") == true)
        let last = try #require(try store.auditEntries(after: 0, limit: 10_000).last)
        #expect(last.record.action == "store.rollback.accepted")
        #expect(try store.verifyAudit().isValid)
        _ = try store.verifyAtStart()
    }

    @Test func missingOrEmptyDatabase_withItsAnchor_isRefused() throws {
        let (fixture, _) = try Self.populated()
        try FileManager.default.removeItem(atPath: fixture.path)
        try? FileManager.default.removeItem(atPath: fixture.path + "-wal")
        try? FileManager.default.removeItem(atPath: fixture.path + "-shm")
        #expect(storeErrorCode { _ = try fixture.open() } == .rollback)
        // Nothing was created by the refusal.
        #expect(!FileManager.default.fileExists(atPath: fixture.path))
        FileManager.default.createFile(atPath: fixture.path, contents: Data())
        do {
            _ = try fixture.open()
            Issue.record("an emptied store opened")
        } catch let error as StoreError {
            #expect(
                error.code == .rollback && error.message.contains("empty") && error.message.contains("records store"))
        }
        let store = try Store(
            path: fixture.path, key: fixture.key, logger: quietLogger, now: testNow, acceptRollback: true)
        #expect(try store.peopleCount() == 0)
        store.close()
        // Accepted once: the new store and its fresh anchor open normally.
        try fixture.withStore { store throws in _ = try store.verifyAtStart() }
    }

    @Test func deletedAnchorAndMetaRow_isRefused() throws {
        let (fixture, _) = try Self.populated()
        try fixture.raw().query("DELETE FROM meta WHERE key = 'audit_anchor'")
        try FileManager.default.removeItem(atPath: fixture.directory.file("audit-head"))
        #expect(storeErrorCode { _ = try fixture.open() } == .rollback)
    }

    @Test func chainAheadOfItsAnchor_isFine() throws {
        let (fixture, _) = try Self.populated()
        let anchorPath = fixture.directory.file("audit-head")
        let older = try Data(contentsOf: URL(fileURLWithPath: anchorPath))
        try fixture.withStore { store throws in
            try store.appendAudit(AuditRecord(action: "person.add", result: "success", person: "omar"), now: testNow)
        }
        // As after a kill -9 before the background sync wrote the newer head.
        try older.write(to: URL(fileURLWithPath: anchorPath))
        try fixture.withStore { store throws in
            let check = try store.verifyAtStart()
            #expect(check.checkedFrom < check.events)
        }
    }

    // MARK: Check before serving (#13 item 3)

    @Test func editedAnchoredAuditEntry_andMismatchedRecordedHead_areFoundAtStart() throws {
        let (fixture, _) = try Self.populated()
        try fixture.raw().query("UPDATE audit SET detail = 'edited' WHERE seq = (SELECT MAX(seq) FROM audit)")
        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.verifyAtStart() } == .integrity)
        }
    }

    @Test func flippedByteInPeopleOrSecrets_isFoundAtStart() throws {
        // A byte of a live value in the people and secrets pages, and the people page's header.
        for target in ["SELECT mac FROM people", "SELECT sealed FROM secrets", "people-header"] {
            let (fixture, _) = try Self.populated()
            let raw = try fixture.raw()
            let value = try raw.query(target == "people-header" ? "SELECT X'00' AS v" : target).first?.first?.blob ?? []
            let page = try #require(
                try raw.query("SELECT rootpage FROM sqlite_schema WHERE name = 'people'").first?.first?.integer)
            raw.close()
            var bytes = try fixture.databaseBytes()
            let offset: Int
            if target == "people-header" {
                offset = (Int(page) - 1) * 4096  // the b-tree page type byte
            } else {
                offset = try #require(firstIndex(of: value, in: bytes)) + value.count / 2
            }
            bytes[offset] ^= 0x5a
            try Data(bytes).write(to: URL(fileURLWithPath: fixture.path))
            let code = storeErrorCode {
                let store = try fixture.open()
                defer { store.close() }
                _ = try store.verifyAtStart()
            }
            #expect(code == .integrity, "\(target)")
        }
    }
}

/// Where `needle` first occurs in `haystack`.
func firstIndex(of needle: [UInt8], in haystack: [UInt8]) -> Int? {
    guard !needle.isEmpty, haystack.count >= needle.count else { return nil }
    for index in 0...(haystack.count - needle.count)
    where haystack[index] == needle[0] && haystack[index..<(index + needle.count)].elementsEqual(needle) {
        return index
    }
    return nil
}
