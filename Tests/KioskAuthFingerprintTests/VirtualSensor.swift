import Foundation
import Glibc
import KioskAuthFingerprint
import Logging
import Synchronization
import Testing

// Drives libfprint's own virtual drivers from tests. Each test gets a fresh FpContext and device
// (a new FingerprintReader) and its own socket paths, so the drivers' overheating model, which
// accumulates per device, never trips.

/// The libfprint virtual drivers the tests use.
enum VirtualDriver: String, CaseIterable {
    case device = "virtual_device"
    case storage = "virtual_device_storage"
    case image = "virtual_image"

    /// The environment variable naming the driver's control socket.
    var socketVariable: String {
        switch self {
        case .device: "FP_VIRTUAL_DEVICE"
        case .storage: "FP_VIRTUAL_DEVICE_STORAGE"
        case .image: "FP_VIRTUAL_IMAGE"
        }
    }
}

/// A temporary directory holding the virtual driver's socket, and the environment pointing at it.
/// libfprint reads the environment when the reader starts, so tests run serialised.
final class VirtualEnvironment {
    let directory: URL
    let socketPath: String

    /// Prepares the environment so that exactly `driver` (or, for `nil`, no reader at all) is found.
    init(_ driver: VirtualDriver?) throws {
        let base = FileManager.default.temporaryDirectory.appendingPathComponent("kafp-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: true)
        directory = base
        socketPath = base.appendingPathComponent("sensor.sock").path
        for other in VirtualDriver.allCases { unsetenv(other.socketVariable) }
        unsetenv("FP_VIRTUAL_DEVICE_STORAGE_NO_LIST")
        // Allow only the virtual driver under test (both spellings: libfprint renamed the variable).
        let allowed = driver?.rawValue ?? VirtualDriver.device.rawValue
        setenv("FP_DRIVERS_WHITELIST", allowed, 1)
        setenv("FP_DRIVERS_ALLOWLIST", allowed, 1)
        if let driver { setenv(driver.socketVariable, socketPath, 1) }
    }

    deinit {
        for driver in VirtualDriver.allCases { unsetenv(driver.socketVariable) }
        try? FileManager.default.removeItem(at: directory)
    }
}

/// Errors of the test harness itself.
struct HarnessError: Error, CustomStringConvertible {
    var description: String
}

/// A blocking Unix stream socket with a receive timeout, so a test can never hang on it.
struct UnixSocket: ~Copyable {
    let descriptor: Int32

    init(connectingTo path: String) throws {
        descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw HarnessError(description: "socket: errno \(errno)") }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            close(descriptor)
            throw HarnessError(description: "socket path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else {
            let code = errno
            close(descriptor)
            throw HarnessError(description: "connect \(path): errno \(code)")
        }
    }

    deinit { close(descriptor) }

    func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes {
                send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            guard written > 0 else { throw HarnessError(description: "send: errno \(errno)") }
            offset += written
        }
    }

    func shutdownWriting() { shutdown(descriptor, Int32(SHUT_WR)) }

    func readToEnd() throws -> [UInt8] {
        var result: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 1024)
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count == 0 { return result }
            guard count > 0 else { throw HarnessError(description: "recv: errno \(errno)") }
            result += buffer[0..<count]
        }
    }
}

/// The command socket of `virtual_device` and `virtual_device_storage`: one command per
/// connection, answered (LIST) and closed by the driver once processed.
struct VirtualDeviceControl {
    let path: String

    @discardableResult
    func send(_ command: String) throws -> String {
        let socket = try UnixSocket(connectingTo: path)
        try socket.write(Array(command.utf8))
        socket.shutdownWriting()
        return String(decoding: try socket.readToEnd(), as: UTF8.self)
    }

    /// A touch with the finger called `id`.
    func scan(_ id: String) throws { try send("SCAN \(id)") }

    /// The ids of the prints in the driver's simulated sensor storage.
    func storedIDs() throws -> Set<String> {
        Set(try send("LIST").split(separator: "\n").map(String.init))
    }
}

/// A NIST example print as raw grey pixels (`NAME.WxH.gray`).
struct PrintImage: Sendable {
    let name: String
    let width: Int32
    let height: Int32
    let pixels: [UInt8]

    /// The prints directory: `$KIOSKAUTH_TESTDATA/prints`, else the repository's own copy in
    /// `tests/data/prints` (see its README for provenance).
    static let directory: URL? = {
        var candidates: [URL] = []
        if let root = ProcessInfo.processInfo.environment["KIOSKAUTH_TESTDATA"] {
            candidates.append(URL(fileURLWithPath: root).appendingPathComponent("prints"))
        }
        let packageRoot = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        candidates.append(packageRoot.appendingPathComponent("tests/data/prints"))
        return candidates.first { FileManager.default.fileExists(atPath: $0.path) }
    }()

    static func named(_ name: String) throws -> PrintImage {
        guard let directory else {
            throw HarnessError(description: "NIST prints not found: set KIOSKAUTH_TESTDATA to the testdata directory")
        }
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        guard let file = files.first(where: { $0.hasPrefix(name + ".") && $0.hasSuffix(".gray") }) else {
            throw HarnessError(description: "no print image \(name) in \(directory.path)")
        }
        let size = file.dropFirst(name.count + 1).dropLast(".gray".count).split(separator: "x")
        guard size.count == 2, let width = Int32(size[0]), let height = Int32(size[1]) else {
            throw HarnessError(description: "cannot read the size from \(file)")
        }
        let pixels = [UInt8](try Data(contentsOf: directory.appendingPathComponent(file)))
        guard pixels.count == Int(width) * Int(height) else {
            throw HarnessError(description: "\(file) has \(pixels.count) bytes")
        }
        return PrintImage(name: name, width: width, height: height, pixels: pixels)
    }
}

/// The image socket of `virtual_image`: one persistent connection; each message is two native
/// int32 (width, height) followed by the pixels, or a negative first int32 for a control message.
final class VirtualImageControl {
    private let socket: UnixSocket

    init(path: String) throws {
        socket = try UnixSocket(connectingTo: path)
    }

    func send(_ image: PrintImage) throws {
        try socket.write(Self.header(image.width, image.height) + image.pixels)
    }

    /// Simulates unplugging the reader.
    func unplug() throws { try socket.write(Self.header(-5, 0)) }

    /// Whether each image implies a finger placed before it and lifted after it (the default).
    func automaticFinger(_ enabled: Bool) throws { try socket.write(Self.header(-3, enabled ? 1 : 0)) }

    /// Reports a finger placed on (or lifted from) the sensor.
    func finger(present: Bool) throws { try socket.write(Self.header(-4, present ? 1 : 0)) }

    private static func header(_ first: Int32, _ second: Int32) -> [UInt8] {
        withUnsafeBytes(of: first) { Array($0) } + withUnsafeBytes(of: second) { Array($0) }
    }
}

/// A started reader on a fresh virtual device; shut down and cleaned up by `withReader`.
struct Harness {
    let reader: FingerprintReader
    let environment: VirtualEnvironment
    var socketPath: String { environment.socketPath }
    var device: VirtualDeviceControl { VirtualDeviceControl(path: environment.socketPath) }
}

/// Runs `body` with a freshly started reader on `driver` (or on no reader for `nil`).
func withReader(
    _ driver: VirtualDriver?, scanTimeout: Duration = .seconds(30),
    _ body: (Harness) async throws -> Void
) async throws {
    let environment = try VirtualEnvironment(driver)
    var logger = Logger(label: "kioskauth.fingerprint.tests")
    logger.logLevel = ProcessInfo.processInfo.environment["KIOSKAUTH_TEST_LOG"] != nil ? .trace : .warning
    let reader = FingerprintReader(configuration: .init(scanTimeout: scanTimeout), logger: logger)
    try await reader.start()
    do {
        try await body(Harness(reader: reader, environment: environment))
    } catch {
        await reader.shutdown()
        throw error
    }
    await reader.shutdown()
    withExtendedLifetime(environment) {}
}

/// Runs `operation`, failing once `limit` has passed even if the operation ignores cancellation
/// (a task group would wait for it).
func within<T: Sendable>(
    _ limit: Duration, _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    let outcome = Mutex<CheckedContinuation<T, any Error>?>(nil)
    let finish: @Sendable (Result<T, any Error>) -> Bool = { result in
        guard let continuation = outcome.withLock({ $0.take() }) else { return false }
        continuation.resume(with: result)
        return true
    }
    return try await withCheckedThrowingContinuation { continuation in
        outcome.withLock { $0 = continuation }
        let work = Task {
            do { _ = finish(.success(try await operation())) } catch { _ = finish(.failure(error)) }
        }
        Task {
            try? await Task.sleep(for: limit)
            if finish(.failure(HarnessError(description: "operation did not finish within \(limit)"))) {
                work.cancel()
            }
        }
    }
}

/// The error code an operation failed with, or nil if it succeeded.
func failureCode<T>(_ operation: () async throws -> T) async -> FingerprintError.Code? {
    do {
        _ = try await operation()
        return nil
    } catch let error as FingerprintError {
        return error.code
    } catch {
        Issue.record("unexpected error type: \(error)")
        return nil
    }
}

/// Enrols by answering every progress event with the next touch from `touch`, which receives
/// the event. Returns every event and the template.
func enroll(
    _ reader: FingerprintReader, finger: Finger = .rightIndex, gallery: [GalleryEntry] = [],
    touch: (EnrollEvent) throws -> Void
) async throws -> (events: [EnrollEvent], template: [UInt8]) {
    var events: [EnrollEvent] = []
    for try await event in reader.enroll(finger: finger, username: "sarah", duplicateGallery: gallery) {
        events.append(event)
        switch event {
        case .completed(let template): return (events, template)
        case .progress: try touch(event)
        }
    }
    throw HarnessError(description: "enrolment stream ended without a template")
}

/// Enrols finger `id` on a virtual device by sending `SCAN id` for every requested touch.
func enrollVirtual(_ harness: Harness, id: String, gallery: [GalleryEntry] = []) async throws -> [UInt8] {
    try await enroll(harness.reader, gallery: gallery) { event in
        if event.wantsTouch { try harness.device.scan(id) }
    }.template
}

extension EnrollEvent {
    /// Whether the reader waits for a touch after this event (the notice that duplicates cannot be
    /// checked is followed by the stage-0 event instead).
    var wantsTouch: Bool {
        guard case .progress(let stage, let of, let hint) = self else { return false }
        return stage < of && hint != EnrollHint.duplicatesNotChecked
    }
    var stage: Int? {
        if case .progress(let stage, _, _) = self { return stage }
        return nil
    }
    var hint: String? {
        if case .progress(_, _, let hint) = self { return hint }
        return nil
    }
}
