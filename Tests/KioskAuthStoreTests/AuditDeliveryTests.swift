import Foundation
import KioskAuthCore
import KioskAuthStore
import Testing

private let endpoint = "https://audit.example/v1/events"

/// Appends `count` records one second apart and returns them.
private func appendRecords(_ count: Int, to store: Store, from start: Int = 0) throws -> [AuditEntry] {
    var entries: [AuditEntry] = []
    for index in start..<(start + count) {
        let failed = index % 2 == 1
        let record = AuditRecord(
            action: "passcode.verify", result: failed ? "failure" : "success", person: "sarah", method: "passcode",
            callerUID: 0, callerPID: 100 + index, service: "kioskauth", detail: failed ? "failures=1" : nil)
        entries.append(try store.appendAudit(record, now: testNow.addingTimeInterval(Double(index) + 0.123456)))
    }
    return entries
}

/// The JSON object a batch encodes to.
private func decode(_ batch: AuditBatch) throws -> [String: Any] {
    try #require(JSONSerialization.jsonObject(with: batch.encoded()) as? [String: Any])
}

@Suite("Audit delivery: cursor and batches")
struct AuditDeliveryTests {
    @Test func progress_ofANewStore_startsAtTheBeginning() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let progress = try store.auditDeliveryProgress(endpoint: endpoint)
            #expect(progress == AuditDeliveryProgress(endpoint: endpoint, deliveredThrough: 0, lastDeliveryAt: nil))
        }
    }

    @Test func recordedDelivery_survivesReopening() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try appendRecords(5, to: store)
            try store.recordAuditDelivery(through: 3, endpoint: endpoint, at: testNow)
        }
        let progress = try fixture.withStore { try $0.auditDeliveryProgress(endpoint: endpoint) }
        #expect(progress.deliveredThrough == 3)
        #expect(progress.lastDeliveryAt == testNow)
    }

    @Test func cursor_neverMovesBackwards_butTheDeliveryTimeDoes() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try appendRecords(5, to: store)
            try store.recordAuditDelivery(through: 4, endpoint: endpoint, at: testNow)
            try store.recordAuditDelivery(through: 2, endpoint: endpoint, at: testNow.addingTimeInterval(10))
            let progress = try store.auditDeliveryProgress(endpoint: endpoint)
            #expect(progress.deliveredThrough == 4)
            #expect(progress.lastDeliveryAt == testNow.addingTimeInterval(10))
        }
    }

    @Test func cursor_pastTheTrail_isRefusedAsAnIntegrityError() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try appendRecords(2, to: store)
            let code = storeErrorCode { try store.recordAuditDelivery(through: 3, endpoint: endpoint, at: testNow) }
            #expect(code == .integrity)
            #expect(try store.auditDeliveryProgress(endpoint: endpoint).deliveredThrough == 0)
        }
    }

    @Test func anotherEndpoint_startsFromTheBeginning() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            _ = try appendRecords(3, to: store)
            try store.recordAuditDelivery(through: 3, endpoint: endpoint, at: testNow)
            #expect(try store.auditDeliveryProgress(endpoint: "https://other.example/").deliveredThrough == 0)
            // The new endpoint's acknowledgement replaces the old record.
            try store.recordAuditDelivery(through: 1, endpoint: "https://other.example/", at: testNow)
            #expect(try store.auditDeliveryProgress(endpoint: "https://other.example/").deliveredThrough == 1)
            #expect(try store.auditDeliveryProgress(endpoint: endpoint).deliveredThrough == 0)
        }
    }

    @Test func entriesInRange_areThoseSequenceNumbers() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let all = try appendRecords(6, to: store)
            #expect(try store.auditEntries(in: 2...4) == Array(all[1...3]))
            #expect(try store.auditEntries(in: 6...6) == [all[5]])
        }
    }

    @Test func entriesInRange_withADeletedEntry_leaveTheGapVisible() throws {
        let fixture = try StoreFixture()
        _ = try fixture.withStore { try appendRecords(5, to: $0) }
        try fixture.raw().query("DELETE FROM audit WHERE seq = 3")
        let entries = try fixture.withStore { try $0.auditEntries(in: 2...4) }
        #expect(entries.map(\.sequence) == [2, 4])
    }

    @Test func streamID_isStableForAStore_andDiffersBetweenStores() throws {
        let fixture = try StoreFixture()
        let first = try fixture.withStore { $0.auditStreamID }
        let again = try fixture.withStore { $0.auditStreamID }
        let other = try StoreFixture().withStore { $0.auditStreamID }
        #expect(first.count == 32)
        let isHex = first.allSatisfy { $0.isHexDigit }
        #expect(isHex)
        #expect(first == again)
        #expect(first != other)
    }

    @Test func batch_carriesEveryFieldOfEachEntry_inOrder() throws {
        let fixture = try StoreFixture()
        let entries = try fixture.withStore { try appendRecords(2, to: $0) }
        let batch = AuditBatch(stream: "00ff", terminal: "ward-3", entries: entries)
        let body = try decode(batch)
        #expect(body["format"] as? String == "io.kioskauth.audit.v1")
        #expect(body["terminal"] as? [String: String] == ["stream": "00ff", "hostname": "ward-3"])
        let events = try #require(body["events"] as? [[String: Any]])
        #expect(events.count == 2)
        for (event, entry) in zip(events, entries) {
            #expect(event["id"] as? String == "00ff-\(entry.sequence)-\(entry.macHex.prefix(16))")
            #expect(event["sequence"] as? Int == entry.sequence)
            #expect((event["timeMicroseconds"] as? NSNumber)?.int64Value == entry.timeMicroseconds)
            #expect(event["action"] as? String == entry.record.action)
            #expect(event["result"] as? String == entry.record.result)
            #expect(event["person"] as? String == entry.record.person)
            #expect(event["method"] as? String == entry.record.method)
            #expect(event["callerUid"] as? Int == entry.record.callerUID)
            #expect(event["callerPid"] as? Int == entry.record.callerPID)
            #expect(event["service"] as? String == entry.record.service)
            #expect(event["detail"] as? String == entry.record.detail)
            #expect(event["mac"] as? String == entry.macHex)
            let time = try #require(event["time"] as? String)
            let parsed = try Date(time, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true))
            #expect(abs(parsed.timeIntervalSince(entry.time)) < 0.001)
        }
        #expect(events[0]["detail"] == nil)  // absent optionals are left out
        #expect(events[1]["detail"] as? String == "failures=1")
    }

    @Test func batch_isTheSameBytesEveryTime_andItsKeyNamesTheRange() throws {
        let fixture = try StoreFixture()
        let entries = try fixture.withStore { try appendRecords(3, to: $0) }
        let reread = try fixture.withStore { try $0.auditEntries(in: 1...3) }
        let batch = AuditBatch(stream: "ab", terminal: "t", entries: entries)
        #expect(batch.encoded() == AuditBatch(stream: "ab", terminal: "t", entries: reread).encoded())
        #expect(batch.key == "ab-1-3-\(entries[2].macHex.prefix(16))")
        #expect(AuditBatch(stream: "ab", terminal: "t", entries: Array(entries[0...1])).key != batch.key)
    }

    @Test func eventIDs_differForTheSameSequenceInARestoredStore() throws {
        // A store restored from a backup reuses sequence numbers for new events; their ids must
        // not collide with the ones the collector already holds, or it would drop them as repeats.
        let fixture = try StoreFixture()
        _ = try fixture.withStore { try appendRecords(2, to: $0) }
        let backup = try fixture.databaseBytes()  // closing checkpointed everything into the file
        let original = try fixture.withStore { try appendRecords(1, to: $0, from: 2) }[0]
        try Data(backup).write(to: URL(fileURLWithPath: fixture.path))
        try? FileManager.default.removeItem(atPath: fixture.path + "-wal")
        // The restore is a rollback the anchor sees; an admin accepts it.
        let restored = try Store(
            path: fixture.path, key: fixture.key, logger: quietLogger, now: testNow, acceptRollback: true)
        restored.close()
        let reused = try fixture.withStore { try appendRecords(1, to: $0, from: 7) }[0]
        // The acceptance took the restored sequence: the next event reuses the one after it.
        #expect(reused.sequence == original.sequence + 1)
        let stream = try fixture.withStore { $0.auditStreamID }
        #expect(
            AuditBatch.eventID(stream: stream, entry: reused) != AuditBatch.eventID(stream: stream, entry: original))
    }
}
