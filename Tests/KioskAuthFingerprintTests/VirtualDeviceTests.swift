import Foundation
import KioskAuthFingerprint
import Testing

/// All tests that start a reader. libfprint reads its configuration from the process environment
/// and drives GLib's process-wide default main context, so these run one at a time.
@Suite(.serialized, .timeLimit(.minutes(3)))
struct FingerprintReaderTests {}

extension FingerprintReaderTests {
    /// `virtual_device`: a verify-only reader without storage.
    @Suite("virtual_device")
    struct VirtualDevice {
        @Test func start_findsTheReader_andReplaysItToNewSubscribers() async throws {
            try await withReader(.device) { harness in
                let readers = await harness.reader.readers
                #expect(readers.count == 1)
                let info = try #require(readers.first)
                #expect(info.driver == "virtual_device")
                #expect(!info.canIdentify)
                #expect(!info.hasStorage)
                #expect(info.enrollStages == 5)
                #expect(["press", "swipe"].contains(info.scanType))
                var events = harness.reader.events.makeAsyncIterator()
                #expect(await events.next() == .added(info))
            }
        }

        @Test func enroll_streamsFiveStages_thenTheTemplate() async throws {
            try await withReader(.device) { harness in
                let (events, template) = try await enroll(harness.reader) { event in
                    if event.wantsTouch { try harness.device.scan("sarah-right-index") }
                }
                #expect(events.compactMap(\.stage) == [0, 1, 2, 3, 4, 5])
                #expect(events.allSatisfy { $0.hint == nil })
                #expect(!template.isEmpty)
            }
        }

        @Test func enroll_retryKeepsTheStage_andSaysWhatToDo() async throws {
            try await withReader(.device) { harness in
                var retried: Set<Int> = []
                let (events, _) = try await enroll(harness.reader) { event in
                    guard event.wantsTouch else { return }
                    // At stage 2 the first touch is off-centre, at stage 3 too short.
                    let stage = event.stage!
                    if [2, 3].contains(stage), retried.insert(stage).inserted {
                        try harness.device.send(stage == 2 ? "RETRY 2" : "RETRY 1")
                    } else {
                        try harness.device.scan("finger")
                    }
                }
                let progress = events.compactMap { event -> (Int, String?)? in
                    event.stage.map { ($0, event.hint) }
                }
                #expect(progress.map(\.0) == [0, 1, 2, 2, 3, 3, 4, 5])
                #expect(progress[3].1 == "centre your finger on the reader")
                #expect(progress[5].1 == "swipe too short, please try again")
                #expect(progress.filter { $0.1 != nil }.count == 2)
            }
        }

        @Test func verify_matchesTheEnrolledFinger_andRejectsAnother() async throws {
            try await withReader(.device) { harness in
                let template = try await enrollVirtual(harness, id: "alice")
                try harness.device.scan("alice")
                #expect(try await harness.reader.verify(template: template))
                try harness.device.scan("bob")
                #expect(try await harness.reader.verify(template: template) == false)
            }
        }

        @Test func verify_retryIsReportedWithAHint() async throws {
            try await withReader(.device) { harness in
                let template = try await enrollVirtual(harness, id: "alice")
                try harness.device.send("RETRY 3")
                do {
                    _ = try await harness.reader.verify(template: template)
                    Issue.record("verify succeeded despite RETRY")
                } catch let error as FingerprintError {
                    #expect(error.code == .retry)
                    #expect(error.message == "remove your finger and try again")
                }
            }
        }

        @Test(
            arguments: [
                (0, FingerprintError.Code.deviceFailure),  // FP_DEVICE_ERROR_GENERAL
                (4, .busy),  // FP_DEVICE_ERROR_BUSY
                (5, .deviceFailure),  // FP_DEVICE_ERROR_PROTO
                (8, .dataFull),  // FP_DEVICE_ERROR_DATA_FULL
                (0x101, .tooHot),  // FP_DEVICE_ERROR_TOO_HOT
            ])
        func verify_deviceErrorsAreMappedToTypedErrors(
            libfprintCode: Int, expected: FingerprintError.Code
        )
            async throws
        {
            try await withReader(.device) { harness in
                let template = try await enrollVirtual(harness, id: "alice")
                try harness.device.send("ERROR \(libfprintCode)")
                #expect(await failureCode { try await harness.reader.verify(template: template) } == expected)
                // The reader keeps working after a device error.
                try harness.device.scan("alice")
                #expect(try await harness.reader.verify(template: template))
            }
        }

        @Test func unplugMidScan_endsTheScanWithRemoved_andLaterCallsFailFast() async throws {
            try await withReader(.device) { harness in
                let template = try await enrollVirtual(harness, id: "alice")
                let id = try #require(await harness.reader.readers.first?.id)
                var events = harness.reader.events.makeAsyncIterator()
                #expect(await events.next() == .added(await harness.reader.readers[0]))
                let reader = harness.reader
                let scan = Task { try await reader.verify(template: template) }
                try await Task.sleep(for: .milliseconds(300))  // let the scan start waiting for a finger
                try harness.device.send("UNPLUG")
                #expect(await failureCode { try await within(.seconds(5)) { try await scan.value } } == .removed)
                #expect(await events.next() == .removed(id: id))
                #expect(await harness.reader.readers.isEmpty)
                let clock = ContinuousClock()
                let start = clock.now
                #expect(await failureCode { try await harness.reader.verify(template: template) } == .noReader)
                #expect(clock.now - start < .seconds(2))  // at once, not after a scan timeout (30 s)
            }
        }

        @Test func cancellingTheAwaitingTask_cancelsTheScan() async throws {
            try await withReader(.device) { harness in
                let template = try await enrollVirtual(harness, id: "alice")
                let reader = harness.reader
                let scan = Task { try await reader.verify(template: template) }
                try await Task.sleep(for: .milliseconds(300))
                scan.cancel()
                let clock = ContinuousClock()
                let start = clock.now
                #expect(await failureCode { try await within(.seconds(5)) { try await scan.value } } == .cancelled)
                #expect(clock.now - start < .seconds(2))
                // Had the scan kept running it would consume this touch; the next scan gets it.
                try harness.device.scan("alice")
                #expect(try await within(.seconds(5)) { try await reader.verify(template: template) })
            }
        }

        @Test func secondCaller_waitsForTheFirst_andCanBeCancelledWhileWaiting() async throws {
            try await withReader(.device) { harness in
                let alice = try await enrollVirtual(harness, id: "alice")
                let reader = harness.reader
                let first = Task { try await reader.verify(template: alice) }
                try await Task.sleep(for: .milliseconds(200))
                let second = Task { try await reader.verify(template: alice) }
                let third = Task { try await reader.verify(template: alice) }
                try await Task.sleep(for: .milliseconds(200))
                second.cancel()
                #expect(await failureCode { try await within(.seconds(2)) { try await second.value } } == .cancelled)
                // The first caller owns the reader: the first touch is its; the next is the third's.
                try harness.device.scan("alice")
                #expect(try await within(.seconds(5)) { try await first.value })
                try harness.device.scan("bob")
                #expect(try await within(.seconds(5)) { try await third.value } == false)
            }
        }

        @Test func noFingerWithinTheScanTimeout_endsWithTimeout() async throws {
            try await withReader(.device, scanTimeout: .milliseconds(700)) { harness in
                let template = try await enrollVirtual(harness, id: "alice")
                let clock = ContinuousClock()
                let start = clock.now
                #expect(await failureCode { try await harness.reader.verify(template: template) } == .timeout)
                let elapsed = clock.now - start
                #expect(elapsed >= .milliseconds(600) && elapsed < .seconds(5))
                try harness.device.scan("alice")
                #expect(try await harness.reader.verify(template: template))
            }
        }

        @Test func fingerAlreadyOnTheSensor_isNotAFreshTouch() async throws {
            try await withReader(.device) { harness in
                let template = try await enrollVirtual(harness, id: "alice")
                // The finger rests on the sensor before the scan starts.
                try harness.device.send("FINGER 1")
                try harness.device.scan("alice")
                #expect(
                    await failureCode { try await harness.reader.verify(template: template) } == .fingerAlreadyPresent)
                // A touch made after the scan began is accepted.
                let reader = harness.reader
                let scan = Task { try await reader.verify(template: template) }
                try await Task.sleep(for: .milliseconds(200))
                try harness.device.send("FINGER 1")
                try harness.device.scan("alice")
                #expect(try await within(.seconds(5)) { try await scan.value })
            }
        }

        @Test func verifyOnlyReader_saysDuplicatesCannotBeChecked() async throws {
            try await withReader(.device) { harness in
                let alice = try await enrollVirtual(harness, id: "alice")
                let (events, _) = try await enroll(
                    harness.reader, gallery: [GalleryEntry(id: "alice/right-index", template: alice)]
                ) { event in
                    if event.wantsTouch { try harness.device.scan("alice") }
                }
                #expect(events.first?.hint == EnrollHint.duplicatesNotChecked)
                #expect(events.compactMap(\.stage) == [0, 0, 1, 2, 3, 4, 5])
            }
        }

        @Test func storageOperations_onAReaderWithoutStorage() async throws {
            try await withReader(.device) { harness in
                let alice = try await enrollVirtual(harness, id: "alice")
                #expect(try await harness.reader.sensorPrints().isEmpty)
                try await harness.reader.deleteFromSensor(template: alice)
                #expect(await failureCode { try await harness.reader.identify(gallery: []) } == .notSupported)
            }
        }

        @Test func undecodableTemplate_isRejectedWithoutAScan() async throws {
            try await withReader(.device) { harness in
                for garbage: [UInt8] in [
                    [], [1, 2, 3], Array("FP3".utf8), Array("FP3garbage".utf8), Array("XYZW".utf8),
                ] {
                    #expect(
                        await failureCode { try await harness.reader.verify(template: garbage) } == .invalidTemplate)
                }
                #expect(await harness.reader.isSamePrint([], [1]) == false)
            }
        }
    }

    /// No reader attached: everything that needs one fails fast with `.noReader`; nothing else
    /// breaks.
    @Suite("no reader")
    struct NoReader {
        @Test func everyOperation_failsFastWithNoReader() async throws {
            try await withReader(nil) { harness in
                let reader = harness.reader
                #expect(await reader.readers.isEmpty)
                try await within(.seconds(1)) {
                    #expect(await failureCode { try await reader.verify(template: [1]) } == .noReader)
                    #expect(await failureCode { try await reader.identify(gallery: []) } == .noReader)
                    #expect(await failureCode { try await reader.sensorPrints() } == .noReader)
                    #expect(await failureCode { try await reader.deleteFromSensor(template: [1]) } == .noReader)
                    let stream = reader.enroll(finger: .leftThumb, username: "sam", duplicateGallery: [])
                    #expect(await failureCode { for try await _ in stream {} } == .noReader)
                }
            }
        }

        @Test func beforeStartAndAfterShutdown_operationsFailWithNoReader() async throws {
            let environment = try VirtualEnvironment(.device)
            let reader = FingerprintReader(configuration: .init(), logger: .init(label: "test"))
            #expect(await failureCode { try await reader.verify(template: [1]) } == .noReader)
            try await reader.start()
            #expect(await reader.readers.count == 1)
            var events = reader.events.makeAsyncIterator()
            await reader.shutdown()
            #expect(await failureCode { try await reader.verify(template: [1]) } == .noReader)
            #expect(await reader.readers.isEmpty)
            // The stream replays the reader, reports its removal at shutdown, then finishes.
            #expect(await events.next() != nil)
            while await events.next() != nil {}
            await reader.shutdown()  // idempotent
            withExtendedLifetime(environment) {}
        }

        @Test func shutdownWhileStarting_waitsForTheStart_thenStops() async throws {
            // libfprint is loaded and the readers opened by start(); a shutdown() that comes
            // meanwhile must neither reach the half-started loop nor be lost.
            // A shutdown() that wins the race stops the reader before it starts: start() is then
            // refused as for any stopped reader (.busy), and nothing runs.
            let environment = try VirtualEnvironment(.device)
            for delay in [0, 0, 200, 500, 1000, 2000] {
                let reader = FingerprintReader(configuration: .init(), logger: .init(label: "test"))
                let starting = Task { try await reader.start() }
                try await Task.sleep(for: .microseconds(delay))
                try await within(.seconds(10)) { await reader.shutdown() }
                let started = try await within(.seconds(10)) { await failureCode { try await starting.value } }
                #expect(started == nil || started == .busy)
                #expect(await reader.readers.isEmpty)
                #expect(await failureCode { try await reader.verify(template: [1]) } == .noReader)
                #expect(await reader.readerIDs(of: [[1]]) == [nil])
            }
            withExtendedLifetime(environment) {}
        }

        @Test func shutdown_cancelsARunningScan() async throws {
            let environment = try VirtualEnvironment(.device)
            let reader = FingerprintReader(configuration: .init(), logger: .init(label: "test"))
            try await reader.start()
            let alice = try await enrollVirtual(
                Harness(reader: reader, environment: environment), id: "alice")
            let scan = Task { try await reader.verify(template: alice) }
            try await Task.sleep(for: .milliseconds(200))
            try await within(.seconds(5)) { await reader.shutdown() }
            #expect(await failureCode { try await scan.value } == .cancelled)
        }
    }
}
