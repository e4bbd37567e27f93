import Foundation
import Synchronization
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
#if canImport(Glibc)
    import Glibc
#endif

/// `tests/idp/server.py` (django-oauth-toolkit on loopback) run as a child process.
///
/// The server exits by itself after its lifetime and when its stdin closes, so a crashed test
/// run leaves nothing behind; ``stop()`` ends it at once (SIGTERM, then SIGKILL).
final class TestIdentityServer: Sendable {
    /// The interpreter: `KIOSKAUTH_PYTHON`, default `python3`.
    static let python = ProcessInfo.processInfo.environment["KIOSKAUTH_PYTHON"] ?? "python3"

    /// The server script, found from this file's path.
    static let script: URL = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("tests/idp/server.py")

    /// Whether Django and django-oauth-toolkit can be imported; integration tests are skipped
    /// (with this reason shown) when they cannot.
    static let isAvailable: Bool = {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [python, "-c", "import django, oauth2_provider, jwcrypto"]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do {
            try process.run()
            process.waitUntilExit()
            return process.terminationStatus == 0
        } catch {
            return false
        }
    }()

    static let unavailableReason: Comment =
        "Django / django-oauth-toolkit are not importable by \(python) (pip install django-oauth-toolkit)"

    let issuer: URL
    let port: Int
    let clientID: String
    let clientSecret: String
    let pid: pid_t
    private let process: Process
    private let stdinPipe: Pipe
    private let exitFlag: ExitFlag

    /// Starts a server and waits for its ready line.
    static func start(
        users: [String], lifetimeSeconds: Int = 180, accessTokenSeconds: Int = 30, refreshTokenSeconds: Int = 600,
        extraArguments: [String] = []
    ) async throws -> TestIdentityServer {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        var arguments = [
            python, script.path, "--port", "0", "--lifetime-seconds", "\(lifetimeSeconds)",
            "--access-token-seconds", "\(accessTokenSeconds)", "--refresh-token-seconds", "\(refreshTokenSeconds)",
            "--test-controls", "--exit-on-stdin-eof",
        ]
        for user in users { arguments += ["--user", user] }
        process.arguments = arguments + extraArguments
        let stdout = Pipe()
        let stdin = Pipe()
        process.standardOutput = stdout
        process.standardInput = stdin
        let exitFlag = ExitFlag()
        process.terminationHandler = { _ in exitFlag.set() }
        try process.run()
        let line = try await readLine(from: stdout.fileHandleForReading, timeout: .seconds(120))
        guard let data = line.data(using: .utf8),
            let ready = try JSONSerialization.jsonObject(with: data) as? [String: Any],
            let issuerText = ready["issuer"] as? String, let issuer = URL(string: issuerText),
            let port = ready["port"] as? Int, let clientID = ready["client_id"] as? String,
            let secret = ready["client_secret"] as? String
        else {
            process.terminate()
            throw ServerError.badReadyLine(line)
        }
        return TestIdentityServer(
            issuer: issuer, port: port, clientID: clientID, clientSecret: secret, process: process, stdinPipe: stdin,
            exitFlag: exitFlag)
    }

    private init(
        issuer: URL, port: Int, clientID: String, clientSecret: String, process: Process, stdinPipe: Pipe,
        exitFlag: ExitFlag
    ) {
        self.issuer = issuer
        self.port = port
        self.clientID = clientID
        self.clientSecret = clientSecret
        self.pid = process.processIdentifier
        self.process = process
        self.stdinPipe = stdinPipe
        self.exitFlag = exitFlag
    }

    enum ServerError: Error {
        case badReadyLine(String)
        case noReadyLine
        case controlFailed(Int, String)
    }

    /// Ends the server: SIGCONT (in case a test stopped it), SIGTERM, and SIGKILL if it has not
    /// exited after five seconds.
    func stop() async {
        kill(pid, SIGCONT)
        kill(pid, SIGTERM)
        try? stdinPipe.fileHandleForWriting.close()
        if await !exitFlag.wait(timeout: .seconds(5)) {
            kill(pid, SIGKILL)
            _ = await exitFlag.wait(timeout: .seconds(5))
        }
    }

    /// Kills the server at once (SIGKILL) and waits until it is gone: its port then refuses.
    func kill9() async {
        kill(pid, SIGKILL)
        _ = await exitFlag.wait(timeout: .seconds(10))
    }

    /// Freezes the server (SIGSTOP): the kernel still accepts connections, nobody answers.
    func suspend() { kill(pid, SIGSTOP) }

    /// Thaws a suspended server.
    func resume() { kill(pid, SIGCONT) }

    /// Calls a test control (`POST /test/<action>` with a JSON body).
    @discardableResult
    func control(_ action: String, _ body: [String: any Sendable]) async throws -> [String: Any] {
        var request = URLRequest(url: issuer.appendingPathComponent("test").appendingPathComponent(action))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONSerialization.data(withJSONObject: body)
        request.timeoutInterval = 30
        let (data, response) = try await URLSession.shared.data(for: request)
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard status == 200 else {
            throw ServerError.controlFailed(status, String(decoding: data, as: UTF8.self))
        }
        return (try JSONSerialization.jsonObject(with: data) as? [String: Any]) ?? [:]
    }

    private static func readLine(from handle: FileHandle, timeout: Duration) async throws -> String {
        try await withThrowingTaskGroup(of: String.self) { group in
            group.addTask {
                try await withCheckedThrowingContinuation { continuation in
                    Thread.detachNewThread {
                        var buffer = Data()
                        while true {
                            let chunk = handle.availableData
                            if chunk.isEmpty {
                                continuation.resume(throwing: ServerError.noReadyLine)
                                return
                            }
                            buffer.append(chunk)
                            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                                continuation.resume(returning: String(decoding: buffer[..<newline], as: UTF8.self))
                                return
                            }
                        }
                    }
                }
            }
            group.addTask {
                try await Task.sleep(for: timeout)
                throw ServerError.noReadyLine
            }
            let line = try await group.next()!
            group.cancelAll()
            return line
        }
    }
}

/// Set by a child's termination handler; polled by async code.
final class ExitFlag: Sendable {
    private let exited = Mutex(false)

    func set() { exited.withLock { $0 = true } }

    /// Returns whether the process exited within `timeout`.
    func wait(timeout: Duration) async -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if exited.withLock({ $0 }) { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return exited.withLock { $0 }
    }
}
