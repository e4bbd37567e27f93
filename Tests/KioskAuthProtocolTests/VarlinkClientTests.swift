import Foundation
import KioskAuthProtocol
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// A one-connection varlink server on a Unix socket in a temporary directory, run on its own
/// thread from a script. It accepts one client, and for each step reads one NUL-terminated
/// request, then answers with the step's raw messages or hangs up. It gives up by itself when
/// nobody connects or sends within a few seconds.
final class ScriptedVarlinkServer: @unchecked Sendable {
    enum Step {
        /// Read one request, then send each message (NUL-terminated), in one write when `together`.
        case reply([String], together: Bool = false)
        /// Read one request, then close the connection.
        case hangUpAfterRequest
        /// Close the connection without reading anything.
        case hangUpAtOnce
    }

    let socketPath: String
    private let directory: String
    private let listener: Int32
    private let lock = NSLock()
    private var requests: [String] = []
    private var failure: String?
    private let finished = DispatchSemaphore(value: 0)
    private let hungUp = DispatchSemaphore(value: 0)
    private static let patience: Int32 = 5000

    init(script: [Step]) throws {
        directory =
            FileManager.default.temporaryDirectory.appendingPathComponent("kv-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        socketPath = directory + "/s"
        listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: Array(socketPath.utf8)) }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(listener, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard bound == 0, listen(listener, 1) == 0 else {
            close(listener)
            throw POSIXError(.init(rawValue: errno) ?? .EIO)
        }
        let thread = Thread { [self] in
            serve(script)
            finished.signal()
        }
        thread.start()
    }

    deinit {
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Waits for the script to end and returns the requests it read, as JSON text.
    func finish() -> [String] {
        if finished.wait(timeout: .now() + 10) == .timedOut { Issue.record("the scripted server did not finish") }
        return lock.withLock {
            if let failure { Issue.record("scripted server: \(failure)") }
            return requests
        }
    }

    /// Waits until the server has hung up on the client (for `hangUpAtOnce`).
    func waitUntilHungUp() -> Bool { hungUp.wait(timeout: .now() + 10) == .success }

    private func fail(_ message: String) { lock.withLock { failure = message } }

    private func waitReadable(_ fd: Int32) -> Bool {
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        return poll(&descriptor, 1, Self.patience) == 1
    }

    private func serve(_ script: [Step]) {
        defer { close(listener) }
        guard waitReadable(listener) else { return fail("nobody connected") }
        let connection = accept(listener, nil, nil)
        guard connection >= 0 else { return fail("accept failed") }
        defer {
            close(connection)
            hungUp.signal()
        }
        var buffer: [UInt8] = []
        for step in script {
            if case .hangUpAtOnce = step { return }
            // Read one request.
            while !buffer.contains(0) {
                guard waitReadable(connection) else { return fail("no request arrived") }
                var chunk = [UInt8](repeating: 0, count: 4096)
                let count = chunk.withUnsafeMutableBytes { read(connection, $0.baseAddress, $0.count) }
                guard count > 0 else { return fail("the client hung up early") }
                buffer += chunk[..<count]
            }
            let end = buffer.firstIndex(of: 0)!
            let request = String(decoding: buffer[..<end], as: UTF8.self)
            buffer.removeSubrange(...end)
            lock.withLock { requests.append(request) }
            switch step {
            case .reply(let messages, let together):
                let frames = messages.map { Array($0.utf8) + [0] }
                for chunk in together ? [frames.flatMap { $0 }] : frames {
                    guard sendAll(chunk, to: connection) else { return fail("send failed") }
                }
            case .hangUpAfterRequest, .hangUpAtOnce:
                return
            }
        }
    }

    private func sendAll(_ bytes: [UInt8], to fd: Int32) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent < 0, errno == EINTR { continue }
            guard sent > 0 else { return false }
            offset += sent
        }
        return true
    }
}

/// Decodes a request the server read.
private func call(_ text: String) throws -> VarlinkCall {
    try JSONDecoder().decode(VarlinkCall.self, from: Data(text.utf8))
}

/// Runs `body` and returns the client error's name, or nil when it did not throw one.
private func clientErrorName(_ body: () throws -> Void) -> String? {
    do {
        try body()
        return nil
    } catch let error as VarlinkClientError {
        return error.name
    } catch {
        return nil
    }
}

@Suite("The blocking varlink client")
struct VarlinkClientTests {
    @Test func call_sendsTheMethodAndParameters_andReturnsTheReplysParameters() throws {
        let server = try ScriptedVarlinkServer(script: [
            .reply([#"{"parameters":{"person":{"name":"sarah","uid":1001}}}"#])
        ])
        let client = try VarlinkClient(socketPath: server.socketPath)
        let reply = try client.call("io.kioskauth.GetPerson", parameters: .object(["name": .string("sarah")]))

        #expect(reply == .object(["person": .object(["name": .string("sarah"), "uid": .number(1001)])]))
        let requests = server.finish()
        #expect(requests.count == 1)
        let sent = try call(try #require(requests.first))
        #expect(sent.method == "io.kioskauth.GetPerson")
        #expect(sent.parameters == .object(["name": .string("sarah")]))
        #expect(sent.more == nil)
    }

    @Test func replyWithoutParameters_isAnEmptyObject() throws {
        let server = try ScriptedVarlinkServer(script: [.reply(["{}"])])
        let client = try VarlinkClient(socketPath: server.socketPath)
        #expect(
            try client.call("io.kioskauth.RemovePerson", parameters: .object(["name": .string("ben")])) == .object([:]))
        _ = server.finish()
    }

    @Test func callsOnOneConnection_getTheirRepliesInOrder() throws {
        let server = try ScriptedVarlinkServer(script: [
            .reply([#"{"parameters":{"n":1}}"#]), .reply([#"{"parameters":{"n":2}}"#]),
        ])
        let client = try VarlinkClient(socketPath: server.socketPath)
        #expect(try client.call("io.kioskauth.GetStatus")["n"] == .number(1))
        #expect(try client.call("io.kioskauth.GetStatus")["n"] == .number(2))
        #expect(server.finish().count == 2)
    }

    @Test func typedCall_encodesTheInput_andDecodesTheOutput() throws {
        struct Input: Encodable { var name: String }
        struct Output: Decodable, Equatable { var valid: Bool }
        let server = try ScriptedVarlinkServer(script: [.reply([#"{"parameters":{"valid":true}}"#])])
        let client = try VarlinkClient(socketPath: server.socketPath)
        #expect(try client.call("io.kioskauth.VerifyAudit", Input(name: "x"), as: Output.self) == Output(valid: true))
        #expect(try call(#require(server.finish().first)).parameters == .object(["name": .string("x")]))
    }

    @Test func namedError_throwsWithItsNameAndParameters() throws {
        let server = try ScriptedVarlinkServer(script: [
            .reply([#"{"error":"io.kioskauth.NoSuchPerson","parameters":{"name":"zoe"}}"#])
        ])
        let client = try VarlinkClient(socketPath: server.socketPath)
        let error = #expect(throws: VarlinkClientError.self) {
            _ = try client.call("io.kioskauth.GetPerson", parameters: .object(["name": .string("zoe")]))
        }
        #expect(error?.name == "io.kioskauth.NoSuchPerson")
        #expect(error?.shortName == "NoSuchPerson")
        #expect(error?.parameters?["name"] == .string("zoe"))
        #expect(error?.description.hasPrefix("io.kioskauth.NoSuchPerson") == true)
        _ = server.finish()
    }

    @Test func replyThatIsNotJSON_isAProtocolViolation() throws {
        let server = try ScriptedVarlinkServer(script: [.reply(["this is not json"])])
        let client = try VarlinkClient(socketPath: server.socketPath)
        #expect(
            clientErrorName { _ = try client.call("io.kioskauth.GetStatus") } == "io.kioskauth.client.ProtocolViolation"
        )
        _ = server.finish()
    }

    @Test(arguments: [false, true])
    func callMore_deliversEveryReply_untilOneWithoutContinues(together: Bool) throws {
        let server = try ScriptedVarlinkServer(script: [
            .reply(
                [
                    #"{"parameters":{"step":1},"continues":true}"#,
                    #"{"parameters":{"step":2},"continues":true}"#,
                    #"{"parameters":{"step":3}}"#,
                ], together: together),
            .reply([#"{"parameters":{"after":true}}"#]),
        ])
        let client = try VarlinkClient(socketPath: server.socketPath)
        var delivered: [JSONValue] = []
        try client.callMore("io.kioskauth.Enroll", parameters: .object(["name": .string("sarah")])) {
            delivered.append($0)
        }
        #expect(delivered.map { $0["step"] } == [.number(1), .number(2), .number(3)])
        // The connection is in step with the server: the next call gets its own reply.
        #expect(try client.call("io.kioskauth.GetStatus") == .object(["after": .bool(true)]))

        let requests = server.finish()
        #expect(try call(#require(requests.first)).more == true)
    }

    @Test func callMore_stopsAtANamedError_afterDeliveringWhatCameBefore() throws {
        let server = try ScriptedVarlinkServer(script: [
            .reply([
                #"{"parameters":{"step":1},"continues":true}"#,
                #"{"error":"io.kioskauth.InternalError","parameters":{"reason":"reader gone"}}"#,
            ])
        ])
        let client = try VarlinkClient(socketPath: server.socketPath)
        var delivered: [JSONValue] = []
        let name = clientErrorName {
            try client.callMore("io.kioskauth.Enroll", parameters: nil) { delivered.append($0) }
        }
        #expect(name == "io.kioskauth.InternalError")
        #expect(delivered == [.object(["step": .number(1)])])
        _ = server.finish()
    }

    @Test func callMore_whenTheHandlerThrows_isAProtocolViolation() throws {
        struct Refused: Error {}
        let server = try ScriptedVarlinkServer(script: [.reply([#"{"parameters":{"step":1},"continues":true}"#])])
        let client = try VarlinkClient(socketPath: server.socketPath)
        let name = clientErrorName {
            try client.callMore("io.kioskauth.Enroll", parameters: nil) { _ in throw Refused() }
        }
        #expect(name == "io.kioskauth.client.ProtocolViolation")
        _ = server.finish()
    }

    @Test func serverThatHangsUpBeforeReplying_givesDisconnected() throws {
        let server = try ScriptedVarlinkServer(script: [.hangUpAfterRequest])
        let client = try VarlinkClient(socketPath: server.socketPath)
        #expect(clientErrorName { _ = try client.call("io.kioskauth.GetStatus") } == "io.kioskauth.client.Disconnected")
        #expect(server.finish().count == 1)
    }

    @Test func serverThatHangsUpMidStream_givesDisconnected() throws {
        let server = try ScriptedVarlinkServer(script: [
            .reply([#"{"parameters":{"step":1},"continues":true}"#]), .hangUpAtOnce,
        ])
        let client = try VarlinkClient(socketPath: server.socketPath)
        var delivered = 0
        let name = clientErrorName {
            try client.callMore("io.kioskauth.Enroll", parameters: nil) { _ in delivered += 1 }
        }
        #expect(name == "io.kioskauth.client.Disconnected")
        #expect(delivered == 1)
        _ = server.finish()
    }

    /// A daemon closes idle connections; the next call must fail with a named error, not kill
    /// the caller with SIGPIPE.
    @Test func callOnAConnectionTheServerAlreadyClosed_givesDisconnected() throws {
        let server = try ScriptedVarlinkServer(script: [.hangUpAtOnce])
        let client = try VarlinkClient(socketPath: server.socketPath)
        #expect(server.waitUntilHungUp())
        // Two calls: the first write may still land in the socket buffer, the second cannot.
        #expect(clientErrorName { _ = try client.call("io.kioskauth.GetStatus") } == "io.kioskauth.client.Disconnected")
        #expect(clientErrorName { _ = try client.call("io.kioskauth.GetStatus") } == "io.kioskauth.client.Disconnected")
        _ = server.finish()
    }

    @Test func missingSocket_givesUnreachable() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("absent-\(UUID().uuidString)").path
        let error = #expect(throws: VarlinkClientError.self) { _ = try VarlinkClient(socketPath: path) }
        #expect(error?.name == "io.kioskauth.client.Unreachable")
        #expect(error?.parameters?.stringValue?.contains(path) == true)
    }

    @Test func socketPathTooLongForAUnixSocket_givesUnreachable() {
        let path = "/" + String(repeating: "x", count: 200)
        #expect(clientErrorName { _ = try VarlinkClient(socketPath: path) } == "io.kioskauth.client.Unreachable")
    }
}
