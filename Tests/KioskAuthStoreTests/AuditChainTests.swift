import Foundation
import KioskAuthCore
import KioskAuthStore
import Testing

/// Five varied records: optional fields both present and absent.
private let sampleRecords: [AuditRecord] = [
    AuditRecord(action: "person.add", result: "success", person: "sarah", callerUID: 0, callerPID: 812),
    AuditRecord(
        action: "passcode.verify", result: "failure", person: "sarah", method: "passcode", callerUID: 0, callerPID: 901,
        service: "login", detail: "failures 1"),
    AuditRecord(action: "passcode.verify", result: "success", person: "sarah", method: "passcode", service: "login"),
    AuditRecord(action: "lockout.reset", result: "success", person: "sarah", callerUID: 0),
    AuditRecord(action: "person.remove", result: "success", person: "sarah", detail: "erased"),
]

/// Appends the sample records one second apart and returns the entries.
private func appendSamples(to store: Store) throws -> [AuditEntry] {
    try sampleRecords.enumerated().map { index, record in
        try store.appendAudit(record, now: testNow.addingTimeInterval(Double(index)))
    }
}

/// The recorded head as the store writes it: the sequence in decimal, a NUL, the MAC.
private func recordedHead(sequence: Int, mac: [UInt8]) -> [UInt8] { Array(String(sequence).utf8) + [0] + mac }

@Suite("Audit chain")
struct AuditChainTests {
    @Test func emptyChain_isValid() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let verification = try store.verifyAudit()
            #expect(verification.isValid)
            #expect(verification.events == 0)
            #expect(verification.brokenAt == nil)
        }
    }

    @Test func appendedEntries_verify_andReadBackAsWritten() throws {
        let fixture = try StoreFixture()
        let entries = try fixture.withStore { try appendSamples(to: $0) }
        #expect(entries.map(\.sequence) == [1, 2, 3, 4, 5])
        #expect(Set(entries.map(\.mac)).count == 5)

        try fixture.withStore { store throws in
            let verification = try store.verifyAudit()
            #expect(verification.isValid)
            #expect(verification.events == 5)
            #expect(verification.headHex == entries.last?.macHex)
            #expect(verification.brokenAt == nil)
            #expect(verification.reason == nil)
            let head = try store.auditHead()
            #expect(head.events == 5)
            #expect(Hex.encode(head.mac) == entries.last?.macHex)
            #expect(try store.auditEntries() == entries)
            #expect(try store.auditEntries(after: 2, limit: 2).map(\.sequence) == [3, 4])
            #expect(try store.auditEntries().map(\.record) == sampleRecords)
        }
    }

    @Test func chunkedVerification_joinsUpAndFindsAnEditBeforeTheCheckpoint() throws {
        let fixture = try StoreFixture()
        let entries = try fixture.withStore { store throws in
            try (0..<11).map { index in
                try store.appendAudit(
                    sampleRecords[index % sampleRecords.count], now: testNow.addingTimeInterval(Double(index)))
            }
        }
        try fixture.withStore { store throws in
            for chunkSize in [1, 2, 3, 10, 11, 12, 2048] {
                let verification = try store.verifyAudit(trustedHead: nil, chunkSize: chunkSize)
                #expect(verification.isValid, "chunk \(chunkSize)")
                #expect(verification.events == 11)
                #expect(verification.head == entries.last?.mac)
            }
        }
        // Entry 4 lies before the checkpoint (the anchor holds entry 11): the check before serving
        // passes, the full verification finds it whatever the chunk size.
        try fixture.raw().query("UPDATE audit SET detail = 'edited' WHERE seq = 4")
        try fixture.withStore { store throws in
            #expect(try store.verifyAtStart().checkedFrom == 11)
            for chunkSize in [1, 3, 4, 2048] {
                let verification = try store.verifyAudit(trustedHead: nil, chunkSize: chunkSize)
                #expect(!verification.isValid)
                #expect(verification.brokenAt == 4, "chunk \(chunkSize)")
                #expect(verification.events == 3)
            }
        }
    }

    @Test(
        "An edited field breaks the chain at that entry",
        arguments: [
            "action = 'person.add'", "result = 'success'", "person = 'ben'", "person = NULL", "method = 'fingerprint'",
            "caller_uid = 1000", "caller_pid = NULL", "service = 'sudo'", "detail = 'failures 0'",
            "time_us = time_us + 1",
        ])
    func editedField_breaksTheChainAtThatEntry(assignment: String) throws {
        let fixture = try StoreFixture()
        _ = try fixture.withStore { try appendSamples(to: $0) }
        try fixture.raw().query("UPDATE audit SET \(assignment) WHERE seq = 2")

        let verification = try fixture.withStore { try $0.verifyAudit() }
        #expect(!verification.isValid)
        #expect(verification.brokenAt == 2)
        #expect(verification.events == 1)
        #expect(verification.reason != nil)
    }

    @Test func deletedLastEntry_isCaughtByTheRecordedHead() throws {
        let fixture = try StoreFixture()
        // Tampered with while the store is open: reopening is refused outright (StoreFaultTests).
        let store = try fixture.open()
        defer { store.close() }
        _ = try appendSamples(to: store)
        try fixture.raw().query("DELETE FROM audit WHERE seq = 5")

        let verification = try store.verifyAudit()
        #expect(!verification.isValid)
        #expect(verification.events == 4)
        #expect(verification.brokenAt == 5)
    }

    @Test func deletedMiddleEntry_breaksTheChainWhereItWas() throws {
        let fixture = try StoreFixture()
        _ = try fixture.withStore { try appendSamples(to: $0) }
        try fixture.raw().query("DELETE FROM audit WHERE seq = 3")

        let verification = try fixture.withStore { try $0.verifyAudit() }
        #expect(!verification.isValid)
        #expect(verification.brokenAt == 3)
    }

    @Test func deletedRecordedHead_isCaught() throws {
        let fixture = try StoreFixture()
        _ = try fixture.withStore { try appendSamples(to: $0) }
        try fixture.raw().query("DELETE FROM meta WHERE key = 'audit_head'")

        let verification = try fixture.withStore { try $0.verifyAudit() }
        #expect(!verification.isValid)
    }

    @Test func chainRecomputedUnderAnotherKey_isCaughtAtTheFirstEntry() throws {
        // The attacker builds a whole chain with a key of their own, for this very store's
        // identity and with the same records, and puts it in place of the real one.
        let victim = try StoreFixture()
        let victimStore = try victim.open()
        defer { victimStore.close() }
        let real = try appendSamples(to: victimStore)
        let forger = try StoreFixture()
        try forger.withStore { _ in }
        let storeID = try victim.raw().scalar("SELECT value FROM meta WHERE key = 'store_id'")
        try forger.raw().query("UPDATE meta SET value = ? WHERE key = 'store_id'", [storeID])
        // The forger's own store now has another id than its anchor: they accept that.
        let forgerStore = try Store(
            path: forger.path, key: forger.key, logger: quietLogger, now: testNow, acceptRollback: true)
        _ = try appendSamples(to: forgerStore)
        // Its chain starts with that acceptance; the first five entries stand in for the real five.
        let forged = Array(try forgerStore.auditEntries(after: 0).prefix(5))
        forgerStore.close()
        #expect(forged.map(\.mac) != real.map(\.mac))

        let raw = try victim.raw()
        for entry in forged {
            try raw.query(
                "UPDATE audit SET mac = ? WHERE seq = ?", [.blob(entry.mac), .integer(Int64(entry.sequence))])
        }
        let head = recordedHead(sequence: 5, mac: forged[4].mac)
        try raw.query("UPDATE meta SET value = ? WHERE key = 'audit_head'", [.blob(head)])
        raw.close()

        let verification = try victimStore.verifyAudit()
        #expect(!verification.isValid)
        #expect(verification.brokenAt == 1)
    }

    @Test func chainCopiedFromAnotherStoreWithTheSameKey_isCaughtAtTheFirstEntry() throws {
        let key = StoreKey.random()
        let first = try StoreFixture(key: key)
        let second = try StoreFixture(key: key)
        let firstStore = try first.open()
        defer { firstStore.close() }
        _ = try appendSamples(to: firstStore)
        let copied = try second.withStore { try appendSamples(to: $0) }

        let raw = try first.raw()
        for entry in copied {
            try raw.query(
                "UPDATE audit SET mac = ? WHERE seq = ?", [.blob(entry.mac), .integer(Int64(entry.sequence))])
        }
        try raw.query(
            "UPDATE meta SET value = ? WHERE key = 'audit_head'", [.blob(recordedHead(sequence: 5, mac: copied[4].mac))]
        )
        raw.close()

        let verification = try firstStore.verifyAudit()
        #expect(!verification.isValid)
        #expect(verification.brokenAt == 1)
    }

    @Test func truncationWithARewrittenHead_isCaughtByTheAnchor_andByTheJournalHead() throws {
        let fixture = try StoreFixture()
        let store = try fixture.open()
        defer { store.close() }
        let entries = try appendSamples(to: store)
        let journalHead = (sequence: 5, macHex: entries[4].macHex)
        let raw = try fixture.raw()
        try raw.query("DELETE FROM audit WHERE seq > 3")
        try raw.query(
            "UPDATE meta SET value = ? WHERE key = 'audit_head'",
            [.blob(recordedHead(sequence: 3, mac: entries[2].mac))])
        raw.close()

        do {
            // Inside the database the truncated chain is consistent: the anchor knows better.
            let anchored = try store.verifyAudit()
            #expect(!anchored.isValid)
            #expect(anchored.brokenAt == 4)
            #expect(anchored.reason?.contains("anchor") == true)
            let verification = try store.verifyAudit(expectedHead: journalHead)
            #expect(!verification.isValid)
            #expect(verification.events == 3)
            #expect(verification.brokenAt == 4)
        }
    }

    @Test func journalHead_thatMatchesOrIsOlder_isAccepted_butAMismatchedMacIsNot() throws {
        let fixture = try StoreFixture()
        let entries = try fixture.withStore { try appendSamples(to: $0) }
        try fixture.withStore { store throws in
            #expect(try store.verifyAudit(expectedHead: (5, entries[4].macHex)).isValid)
            #expect(try store.verifyAudit(expectedHead: (3, entries[2].macHex)).isValid)
            #expect(try !store.verifyAudit(expectedHead: (5, entries[3].macHex)).isValid)
            #expect(try !store.verifyAudit(expectedHead: (6, entries[4].macHex)).isValid)
        }
    }

    @Test func chain_continuesAcrossAReopen() throws {
        let fixture = try StoreFixture()
        _ = try fixture.withStore { try appendSamples(to: $0) }
        let sixth = try fixture.withStore { store throws in
            try store.appendAudit(AuditRecord(action: "daemon.start", result: "success"), now: testNow)
        }
        #expect(sixth.sequence == 6)
        let verification = try fixture.withStore { try $0.verifyAudit() }
        #expect(verification.isValid)
        #expect(verification.events == 6)
        #expect(verification.headHex == sixth.macHex)
    }

    /// A NUL inside an audited string is stored and read back whole: the MAC covers the same
    /// bytes that are stored, so the chain stays intact (it was cut at the NUL once, and every
    /// later verification reported the chain broken there).
    @Test func nulBearingFields_roundTripExactly_andTheChainStaysIntact() throws {
        let fixture = try StoreFixture()
        let record = AuditRecord(
            action: "passcode.verify", result: "fail\u{0}ure", person: "sa\u{0}rah", method: "pass\u{0}code",
            callerUID: 65534, callerPID: 1, service: "login\u{0}evil", detail: "\u{0}x\u{0}")
        let entry = try fixture.withStore { store throws in
            try store.appendAudit(record, now: testNow)
            return try store.appendAudit(AuditRecord(action: "after", result: "", detail: ""), now: testNow)
        }
        try fixture.withStore { store throws in
            let entries = try store.auditEntries()
            #expect(entries.first?.record == record)
            #expect(entries.last?.record.result == "")
            #expect(entries.last?.record.detail == "")
            let verification = try store.verifyAudit()
            #expect(verification.isValid, "\(verification.reason ?? "")")
            #expect(verification.headHex == entry.macHex)
        }
        // Stored with every byte: the NUL and what follows it are in the row.
        let service = try fixture.raw().scalar("SELECT hex(service) FROM audit WHERE seq = 1")
        #expect(service == .text("6C6F67696E006576696C"))
    }

    /// Issue #11 item 8: deleting the newest entries and the recorded head was reported once,
    /// and one new entry later the chain said "intact". The anchor outside the table keeps it
    /// broken however many entries follow.
    @Test func truncation_staysCaught_afterNewEntries() throws {
        let fixture = try StoreFixture()
        let store = try fixture.open()
        defer { store.close() }
        let entries = try appendSamples(to: store)
        let raw = try fixture.raw()
        try raw.query("DELETE FROM audit WHERE seq > 2")
        try raw.query(
            "UPDATE meta SET value = ? WHERE key = 'audit_head'",
            [.blob(recordedHead(sequence: 2, mac: entries[1].mac))])
        raw.close()
        for round in 0..<4 {
            do {
                try store.appendAudit(AuditRecord(action: "daemon.start", result: "success"), now: testNow)
                let verification = try store.verifyAudit()
                #expect(!verification.isValid, "round \(round)")
                #expect(verification.reason?.contains("anchor") == true)
            }
        }
    }

    @Test func anchor_missingOrEdited_isAFinding_andAnOlderTrustedHeadOnTheChainIsAccepted() throws {
        let fixture = try StoreFixture()
        let store = try fixture.open()
        defer { store.close() }
        let entries = try appendSamples(to: store)
        let anchorPath = fixture.directory.file("audit-head")
        do {
            #expect(try store.verifyAudit().isValid)
            #expect(try store.verifyAudit(trustedHead: AuditHeadMark(sequence: 2, mac: entries[1].mac)).isValid)
            #expect(try !store.verifyAudit(trustedHead: AuditHeadMark(sequence: 2, mac: entries[2].mac)).isValid)
            #expect(try !store.verifyAudit(trustedHead: AuditHeadMark(sequence: 6, mac: entries[4].mac)).isValid)
        }
        #expect(AuditHeadMark(parsing: "5:\(entries[4].macHex)") == AuditHeadMark(sequence: 5, mac: entries[4].mac))
        #expect(AuditHeadMark(parsing: "5:zz") == nil)
        #expect(AuditHeadMark(parsing: "5") == nil)

        // Edited: the head's sequence raised without the key.
        let original = try Data(contentsOf: URL(fileURLWithPath: anchorPath))
        var edited = [UInt8](original)
        if let index = edited.firstIndex(of: UInt8(ascii: "5")) { edited[index] = UInt8(ascii: "4") }
        try Data(edited).write(to: URL(fileURLWithPath: anchorPath))
        do {
            // The other slot (entry 4) still checks out and is on the chain.
            #expect(try store.verifyAudit().isValid)
        }
        try Data(repeating: 0x20, count: original.count).write(to: URL(fileURLWithPath: anchorPath))
        do {
            let verification = try store.verifyAudit()
            #expect(!verification.isValid)
            #expect(verification.reason?.contains("does not check out") == true)
        }
        try FileManager.default.removeItem(atPath: anchorPath)
        do {
            let verification = try store.verifyAudit()
            #expect(!verification.isValid)
            #expect(verification.reason?.contains("missing") == true)
        }
    }

    @Test func anchor_followsTheHead_includingCommitsThatSkipTheFsyncWait() throws {
        let fixture = try StoreFixture()
        let anchorPath = fixture.directory.file("audit-head")
        #expect(try fixture.withStore { try $0.verifyAudit().isValid })
        #expect(FileManager.default.fileExists(atPath: anchorPath))
        let entries = try fixture.withStore { try appendSamples(to: $0) }
        let text = try String(contentsOfFile: anchorPath, encoding: .utf8)
        #expect(text.contains(" 5 \(entries[4].macHex) "))
        #expect(text.contains(" 4 \(entries[3].macHex) "))
    }
}
