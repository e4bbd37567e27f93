import Foundation
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore
import Logging
import NIOPosix
import Synchronization

@testable import KioskAuthDaemon

/// A clock tests move by hand: every reading is the same until `advance`.
final class TestClock: Sendable {
    private let current: Mutex<ClockReading>

    init(start: Date = Date(timeIntervalSince1970: 1_750_000_000)) {
        current = Mutex(ClockReading(wall: start, sinceBoot: .seconds(1000), bootID: "test-boot"))
    }

    func reading() -> ClockReading { current.withLock { $0 } }

    func advance(_ seconds: Int64) {
        current.withLock {
            $0.wall = $0.wall.addingTimeInterval(TimeInterval(seconds))
            $0.sinceBoot += .seconds(seconds)
        }
    }
}

/// A password database a test edits: account names by uid.
final class PasswordTable: Sendable {
    private let entries = Mutex<[Int: String]>([:])

    func withLock<T>(_ body: (inout [Int: String]) -> T) -> T { entries.withLock { body(&$0) } }
}

/// The real dispatcher over a real authority and a real store in a temporary directory, called
/// in-process: no socket, no reader, a test clock (or, with `systemClock`, the system's clocks
/// for the authority's online part, as a deployed daemon has).
final class DispatcherFixture {
    static let adminGID = 2001
    static let kioskGID = 2002

    let directory: String
    let store: Store
    let pool: HashingPool
    let clock = TestClock()
    let authority: Authority
    let dispatcher: Dispatcher
    /// The system's accounts as the daemon sees them, by uid; tests change it to delete and
    /// create accounts.
    let passwd = PasswordTable()
    private var nextConnection: UInt64 = 1

    /// Audit delivery's status, when the fixture was made with an endpoint.
    let auditMonitor: AuditDeliveryMonitor?

    init(systemClock: Bool = false, auditEndpointHost: String? = nil) throws {
        directory =
            FileManager.default.temporaryDirectory.appendingPathComponent("kioskauth-daemon-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let logger = Logger(label: "kioskauth.tests") { _ in SwiftLogNoOpLogHandler() }
        let clock = self.clock
        let passwd = self.passwd
        let auditMonitor = auditEndpointHost.map { AuditDeliveryMonitor(endpointHost: $0) }
        self.auditMonitor = auditMonitor
        store = try Store(
            path: directory + "/" + Store.databaseFileName, key: .random(), logger: logger, now: clock.reading().wall)
        pool = HashingPool(workers: 1, queueLimit: 16)
        var configuration = DaemonConfiguration()
        configuration.store.passcodeHashMemoryKiB = 1024
        configuration.store.passcodeHashIterations = 1
        configuration.store.passcodeHashParallelism = 1
        configuration.fingerprint.enabled = false
        authority = Authority(
            store: store, configuration: configuration,
            groups: AccessGroups(admin: Self.adminGID, authenticator: Self.kioskGID), hashingPool: pool,
            isSocketActivated: false, usesDevelopmentKey: false, reader: nil, logger: logger,
            services: OnlineServices(
                clock: systemClock ? .system(environment: [:]) : .readings(bootID: "test-boot") { clock.reading() },
                provider: nil, auditDelivery: auditMonitor),
            accounts: SystemAccounts(
                uidOfAccount: { name in passwd.withLock { $0.first { $0.value == name }?.key } },
                accountOfUID: { uid in passwd.withLock { $0[uid] } }, systemUIDMax: 999),
            now: { clock.reading().wall })
        dispatcher = Dispatcher(authority: authority)
    }

    deinit {
        pool.shutdown()
        store.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A caller on a connection of its own.
    func caller(uid: Int, groups: Set<Int> = []) -> Caller {
        defer { nextConnection += 1 }
        return Caller(uid: uid, gid: 100, pid: 4242, groups: groups, connectionID: nextConnection)
    }

    var root: Caller { caller(uid: 0) }
    var admin: Caller { caller(uid: 1500, groups: [Self.adminGID]) }
    var kioskApp: Caller { caller(uid: 1600, groups: [Self.kioskGID]) }
    var stranger: Caller { caller(uid: 1700) }

    /// Calls `io.kioskauth.<method>`; the reply's parameters, or the named error.
    func call(
        _ method: String, _ parameters: [String: JSONValue] = [:], as caller: Caller
    ) async -> Result<
        JSONValue, APIError
    > {
        do {
            let reply = try await dispatcher.call(
                KioskAuthInterface.name + "." + method, caller: caller, parameters: .object(parameters),
                sink: ReplySink(send: { _ in }, wantsMore: false))
            return .success(reply)
        } catch {
            return .failure(error)
        }
    }

    /// The short name of the error `method` fails with for `caller`, or nil when it succeeds.
    func error(_ method: String, _ parameters: [String: JSONValue] = [:], as caller: Caller) async -> String? {
        switch await call(method, parameters, as: caller) {
        case .success: return nil
        case .failure(let error): return String(error.name.split(separator: ".").last ?? "")
        }
    }

    /// Adds a person as root, bound to `uid`.
    @discardableResult
    func addPerson(_ name: String, uid: Int? = nil) async throws -> JSONValue {
        var parameters: [String: JSONValue] = ["name": .string(name)]
        if let uid { parameters["uid"] = .number(Double(uid)) }
        return try await call("AddPerson", parameters, as: root).get()
    }

    /// Sets a person's passcode as root (which also activates them).
    func setPasscode(_ name: String, _ passcode: String) async throws {
        _ = try await call(
            "SetPasscode",
            ["name": .string(name), "passcode": .string(passcode), "confirmation": .string(passcode)], as: root
        ).get()
    }
}
