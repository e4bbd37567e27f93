import KioskAuthFingerprint
import Testing

extension FingerprintReaderTests {
    /// `virtual_device_storage`: a match-on-chip reader that identifies and keeps prints on the
    /// sensor.
    @Suite("virtual_device_storage")
    struct VirtualDeviceStorage {
        @Test func start_reportsIdentifyAndStorage() async throws {
            try await withReader(.storage) { harness in
                let info = try #require(await harness.reader.readers.first)
                #expect(info.driver == "virtual_device_storage")
                #expect(info.canIdentify)
                #expect(info.hasStorage)
            }
        }

        @Test func identify_findsWhoTouched_amongTheGallery() async throws {
            try await withReader(.storage) { harness in
                let alice = try await enrollVirtual(harness, id: "alice")
                let bob = try await enrollVirtual(harness, id: "bob")
                let gallery = [GalleryEntry(id: "alice", template: alice), GalleryEntry(id: "bob", template: bob)]
                try harness.device.scan("bob")
                #expect(try await harness.reader.identify(gallery: gallery) == .match(id: "bob"))
                try harness.device.scan("alice")
                #expect(try await harness.reader.identify(gallery: gallery) == .match(id: "alice"))
                // A finger the sensor does not hold, and a stored finger left out of the gallery.
                try harness.device.scan("carol")
                #expect(try await harness.reader.identify(gallery: gallery) == .noMatch)
                try harness.device.scan("bob")
                #expect(try await harness.reader.identify(gallery: [gallery[0]]) == .noMatch)
            }
        }

        @Test func enroll_refusesAFingerAlreadyEnrolled() async throws {
            try await withReader(.storage) { harness in
                let alice = try await enrollVirtual(harness, id: "alice")
                let gallery = [GalleryEntry(id: "alice/right-index", template: alice)]
                var events: [EnrollEvent] = []
                do {
                    for try await event in harness.reader.enroll(
                        finger: .leftIndex, username: "mallory", duplicateGallery: gallery)
                    {
                        events.append(event)
                        if event.wantsTouch { try harness.device.scan("alice") }
                    }
                    Issue.record("enrolment of a duplicate finger succeeded")
                } catch let error as FingerprintError {
                    #expect(error.code == .duplicate)
                }
                #expect(events.count == 1)
                #expect(events.first?.hint == EnrollHint.checkingForDuplicates)
                #expect(try harness.device.storedIDs() == ["alice"])

                // A new finger passes the check touch and is enrolled.
                let (newEvents, _) = try await enroll(harness.reader, gallery: gallery) { event in
                    if event.wantsTouch { try harness.device.scan("bob") }
                }
                #expect(newEvents.first?.hint == EnrollHint.checkingForDuplicates)
                #expect(newEvents.compactMap(\.stage) == [0, 0, 1, 2, 3, 4, 5])
                #expect(try harness.device.storedIDs() == ["alice", "bob"])
            }
        }

        @Test func deleteFromSensor_removesTheOnSensorPrint() async throws {
            try await withReader(.storage) { harness in
                let alice = try await enrollVirtual(harness, id: "alice")
                _ = try await enrollVirtual(harness, id: "bob")
                #expect(try harness.device.storedIDs() == ["alice", "bob"])
                try await harness.reader.deleteFromSensor(template: alice)
                #expect(try harness.device.storedIDs() == ["bob"])
                // Deleting again is not an error: the print is gone either way.
                try await harness.reader.deleteFromSensor(template: alice)
                try harness.device.scan("alice")
                #expect(try await harness.reader.verify(template: alice) == false)
            }
        }

        @Test func sensorPrints_listsEveryStoredPrint_forReconciliation() async throws {
            try await withReader(.storage) { harness in
                let alice = try await enrollVirtual(harness, id: "alice")
                let bob = try await enrollVirtual(harness, id: "bob")
                // A print another host left on the sensor: an orphan for reconciliation.
                try harness.device.send("INSERT orphan")
                let listed = try await harness.reader.sensorPrints()
                #expect(listed.count == 3)
                var aliceMatches = 0
                var bobMatches = 0
                for print in listed {
                    if await harness.reader.isSamePrint(print, alice) { aliceMatches += 1 }
                    if await harness.reader.isSamePrint(print, bob) { bobMatches += 1 }
                }
                #expect(aliceMatches == 1)
                #expect(bobMatches == 1)
                #expect(await harness.reader.isSamePrint(alice, bob) == false)
                // The listed templates are usable: delete the orphan through its listed template.
                for print in listed {
                    let isAlice = await harness.reader.isSamePrint(print, alice)
                    let isBob = await harness.reader.isSamePrint(print, bob)
                    if !isAlice && !isBob { try await harness.reader.deleteFromSensor(template: print) }
                }
                #expect(try harness.device.storedIDs() == ["alice", "bob"])
            }
        }
    }
}
