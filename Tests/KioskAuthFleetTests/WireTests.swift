import Foundation
import NIOCore
import NIOEmbedded
import Testing

@testable import KioskAuthFleet

/// The messages between kioskauthd and its fleet helper (`FleetWire`): what crosses arrives
/// unchanged, frames survive any split of the byte stream, and what is malformed is refused.
@Suite struct WireTests {
    static let terminal = TerminalRegistration(
        id: UUID(), name: "ward-3 \u{1F642}", publicKey: Array(repeating: 7, count: 32), readerDriver: "virtual_image",
        readerDeviceType: nil, isMatchOnChip: false)

    /// Through a frame and the decoder, as the other side reads it.
    static func roundTrip<Value: Codable>(_ value: Value) throws -> Value {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(FleetWireFrameDecoder()))
        try channel.writeInbound(try FleetWire.frame(value, allocator: channel.allocator))
        let body = try #require(try channel.readInbound(as: ByteBuffer.self))
        #expect(try channel.readInbound(as: ByteBuffer.self) == nil)
        return try FleetWire.decode(Value.self, from: body)
    }

    @Test func everyCall_crossesUnchanged() throws {
        let key = FleetDataKey.random(generation: 3)
        let token = JoinToken(id: UUID(), secret: Array(repeating: 9, count: 32))
        let endpoint = try FleetEndpoint(url: "postgres://kt_a@[::1]:5433/fleet?sslmode=disable")
        let batch = PushBatch(
            idempotencyKey: UUID(), terminal: UUID(),
            writes: [
                .person(id: UUID(), name: "sarah", role: "caregiver", uid: nil, state: "active"),
                .verifier(person: UUID(), sealed: SealedBlob(generation: 3, bytes: [1, 2, 3])),
                .audit(
                    key: UUID(), sequence: Int64.max, occurredAt: Date(timeIntervalSinceReferenceDate: 123.456_789),
                    person: nil, action: "verify", result: "success"),
            ])
        let calls: [FleetWire.Call] = [
            .connect(endpoint: endpoint, password: "pässword\n"), .close, .migrate, .sessionRole,
            .bootstrap(
                terminal: Self.terminal, dataKey: FleetWire.DataKey(key),
                wrapped: WrappedDataKey(terminalID: UUID(), generation: 1, encapsulatedKey: [1], ciphertext: [2])),
            .issueJoinToken(issuer: UUID(), lifetime: .seconds(600)), .join(token: token, terminal: Self.terminal),
            .admit(token: token, dataKeys: [FleetWire.DataKey(key)]), .removeTerminal(UUID()), .rotationDue,
            .rotateDataKeyIfDue(member: UUID(), publicKey: Data([1, 2]), excluding: [UUID()]),
            .vouchForSelf(terminal: UUID(), publicKey: Data([3])), .keyDelivery(terminal: UUID()),
            .standing(terminal: UUID()), .terminals, .push(batch), .pull(after: -1, limit: 1000),
            .recordCursor(Int64.max, terminal: UUID()), .feedPosition(terminal: UUID()),
            .useKeyring([FleetWire.DataKey(key)]),
            .rememberRowVersions([FleetRowVersion(version: Int64.max - 1, entity: "people", key: "k")]),
            .listen, .unlisten,
        ]
        for call in calls {
            let request = FleetWire.Request(id: 42, connection: 7, call: call)
            let crossed = try Self.roundTrip(request)
            #expect(crossed.id == 42 && crossed.connection == 7)
            #expect(crossed.call.name == call.name)
            // Encoding is deterministic enough to compare what crossed with what was sent.
            let encoder = JSONEncoder()
            encoder.outputFormatting = .sortedKeys
            #expect(try encoder.encode(crossed) == encoder.encode(request), "\(call.name)")
        }
    }

    @Test func aDataKey_crossesWhole_andOpensWhatTheOriginalSealed() throws {
        let key = FleetDataKey.random(generation: 5)
        let binding = FleetSealBinding.verifier(person: UUID())
        let sealed = try FleetKeyring([key]).seal(Array("secret".utf8), binding: binding)
        let crossed = try Self.roundTrip(FleetWire.DataKey(key)).dataKey()
        #expect(crossed.generation == 5)
        #expect(try FleetKeyring([crossed]).open(sealed, binding: binding) == Array("secret".utf8))
        // Anything but 32 bytes is refused, not used as a shorter key.
        for size in [0, 16, 31, 33, 64] {
            var bad = FleetWire.DataKey(key)
            bad.key = Data(repeating: 1, count: size)
            #expect(throws: FleetError.self) { try bad.dataKey() }
        }
    }

    @Test func pulledChanges_crossWithTheirIntegrityAndExactVersions() throws {
        var verified = FleetChange(
            id: 9, entity: "people", key: "k", isDeletion: false,
            body: #"{"version": 9223372036854775000, "name": "a\"b\\x00"}"#)
        verified.integrity = .verified
        verified.rowVersion = 9_223_372_036_854_775_000
        var forged = FleetChange(id: 10, entity: "templates", key: "t", isDeletion: false, body: nil)
        forged.integrity = .forged("the row MAC does not match")
        let deleted = FleetChange(id: 11, entity: "people", key: "k", isDeletion: true, body: nil)
        let reply = try Self.roundTrip(FleetWire.Reply.changes([verified, forged, deleted]))
        guard case .changes(let changes) = reply else {
            Issue.record("reply \(reply)")
            return
        }
        #expect(changes == [verified, forged, deleted])
        #expect(changes.map(\.isTrusted) == [true, false, true])
        #expect(changes[0].fields["version"] == "9223372036854775000")
    }

    @Test func keyDelivery_keepsItsAdmissionOrItsAbsence() throws {
        let wrapped = WrappedDataKey(terminalID: UUID(), generation: 2, encapsulatedKey: [1, 2], ciphertext: [3])
        for admission in [(mac: Data([9, 9]), through: Int32(2)), nil] {
            let delivery = FleetKeyDelivery(
                wrapped: [wrapped], chainMACs: [2: Data([5]), 3: Data([6])], admission: admission)
            let crossed = try Self.roundTrip(FleetWire.KeyDelivery(delivery)).delivery
            #expect(crossed.wrapped == [wrapped])
            #expect(crossed.chainMACs == [2: Data([5]), 3: Data([6])])
            #expect(crossed.admission?.mac == admission?.mac && crossed.admission?.through == admission?.through)
        }
    }

    @Test func errors_crossWithTheirCodeText_andWhetherAnythingWasSent() throws {
        let errors = [
            FleetError(.connectionClosed), FleetError(.directoryUnavailable("refused")),
            FleetError(.futureSchema(found: 9, supported: 5)), FleetError(.outdatedSchema(found: 3, needed: 4, "x")),
            FleetError(.permissionDenied("42501")), FleetError(.integrity("forged")),
        ]
        for error in errors {
            let reply = try Self.roundTrip(FleetWire.Message.answer(id: 1, reply: .failed(error), sent: false))
            guard case .answer(_, .failed(let crossed), let sent) = reply else {
                Issue.record("reply \(reply)")
                continue
            }
            #expect(!sent)
            #expect(crossed.code == error.code)
            #expect(crossed.description == error.description)
            #expect(crossed.isClosedBeforeSending == error.isClosedBeforeSending)
            #expect(crossed.file == error.file && crossed.line == error.line)
        }
    }

    @Test func sealedBytes_crossAsBase64_notAsAnArrayOfNumbers() throws {
        let blob = SealedBlob(generation: 1, bytes: (0..<30_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        let frame = try FleetWire.frame(blob, allocator: ByteBufferAllocator())
        #expect(frame.readableBytes < 30_000 * 4 / 3 + 100)
        #expect(try Self.roundTrip(blob) == blob)
    }

    @Test func frames_surviveAnySplitOfTheStream() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(FleetWireFrameDecoder()))
        var stream = channel.allocator.buffer(capacity: 0)
        for id in 1...3 {
            var frame = try FleetWire.frame(
                FleetWire.Message.wake(connection: UInt64(id)), allocator: channel.allocator)
            stream.writeBuffer(&frame)
        }
        // One byte at a time: nothing is delivered before its last byte, everything once it is.
        var delivered: [UInt64] = []
        while let byte = stream.readSlice(length: 1) {
            try channel.writeInbound(byte)
            while let body = try channel.readInbound(as: ByteBuffer.self) {
                guard case .wake(let connection) = try FleetWire.decode(FleetWire.Message.self, from: body) else {
                    Issue.record("not a wake-up")
                    continue
                }
                delivered.append(connection)
            }
        }
        #expect(delivered == [1, 2, 3])
    }

    @Test func aFrameLongerThanAnyMessage_isRefused_beforeItsBodyArrives() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(FleetWireFrameDecoder()))
        var header = channel.allocator.buffer(capacity: 4)
        header.writeInteger(UInt32(FleetWire.maximumFrame + 1))
        #expect(throws: FleetWire.FrameError.self) { try channel.writeInbound(header) }
        // The largest allowed length only waits for its body.
        let other = EmbeddedChannel(handler: ByteToMessageHandler(FleetWireFrameDecoder()))
        var largest = other.allocator.buffer(capacity: 4)
        largest.writeInteger(UInt32(FleetWire.maximumFrame))
        try other.writeInbound(largest)
        #expect(try other.readInbound(as: ByteBuffer.self) == nil)
    }

    @Test func aPullPage_thatTheFeedCannotHaveProduced_isRefused() throws {
        func page(_ ids: [Int64]) -> [FleetChange] {
            ids.map { FleetChange(id: $0, entity: "people", key: "k\($0)", isDeletion: false, body: nil) }
        }
        try FleetChange.checkPage(page([]), after: 10, limit: 3)
        try FleetChange.checkPage(page([11, 15, 99]), after: 10, limit: 3)
        for (ids, cursor, limit) in [
            ([Int64(11), 12, 13, 14], Int64(10), 3),  // more than asked for
            ([10, 11], 10, 3),  // not after the cursor
            ([5], 10, 3),  // behind it: the cursor would move back
            ([12, 12], 10, 3),  // a repeat
            ([13, 12], 10, 3),  // out of order
        ] {
            #expect(throws: FleetError.self, "\(ids) after \(cursor)") {
                try FleetChange.checkPage(page(ids), after: cursor, limit: limit)
            }
        }
    }

    @Test func aBodyThatIsNotAMessage_failsToDecode() {
        for junk in ["", "{}", "[1]", #"{"wake":{"connection":-1}}"#, #"{"answer":{"id":1}}"#] {
            let buffer = ByteBuffer(string: junk)
            #expect(throws: (any Error).self) { try FleetWire.decode(FleetWire.Message.self, from: buffer) }
        }
    }
}
