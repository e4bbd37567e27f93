import Foundation
import KioskAuthFleet
import Logging
import Testing

@testable import KioskAuthFleetDirectory

#if canImport(Glibc)
    import Glibc
#endif

/// A real PostgreSQL for one test: initdb into a fresh temporary directory, listening on a Unix
/// socket in it and on 127.0.0.1 at a free port, stopped and deleted at the end. Run as an
/// unprivileged user (`nobody`) when the tests run as root, since PostgreSQL refuses root.
struct TestPostgres {
    static let superuser = "fleet"

    let directory: URL
    let binDirectory: URL
    let port: Int
    let runAs: String?

    /// The directory with PostgreSQL's programs: KIOSKAUTH_PG_BIN, else the newest
    /// /usr/lib/postgresql/N/bin with an initdb.
    static var binaries: URL? {
        if let configured = ProcessInfo.processInfo.environment["KIOSKAUTH_PG_BIN"] {
            return URL(fileURLWithPath: configured)
        }
        let root = "/usr/lib/postgresql"
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: root)) ?? [])
            .compactMap(Int.init).sorted()
        for version in versions.reversed()
        where FileManager.default.isExecutableFile(atPath: "\(root)/\(version)/bin/initdb") {
            return URL(fileURLWithPath: "\(root)/\(version)/bin")
        }
        return nil
    }

    static var isAvailable: Bool { binaries != nil }

    /// Runs `body` with a fresh server, and always stops it.
    static func with<T>(_ body: (TestPostgres) async throws -> T) async throws -> T {
        let server = try start()
        do {
            let result = try await body(server)
            server.stop()
            return result
        } catch {
            server.stop()
            throw error
        }
    }

    static func start() throws -> TestPostgres {
        guard let bin = binaries else { throw TestPostgresError("PostgreSQL's initdb is not installed") }
        let base = FileManager.default.temporaryDirectory.appendingPathComponent(
            "kioskauth-fleet-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: base, withIntermediateDirectories: false)
        var runAs: String? = nil
        if getuid() == 0 {
            runAs = "nobody"
            guard let entry = getpwnam("nobody") else { throw TestPostgresError("no user nobody") }
            chown(base.path, entry.pointee.pw_uid, entry.pointee.pw_gid)
        }
        chmod(base.path, 0o700)
        let port = try freePort()
        let server = TestPostgres(directory: base, binDirectory: bin, port: port, runAs: runAs)
        try server.run(
            "initdb", ["-D", server.dataDirectory, "-U", superuser, "--auth=trust", "-E", "UTF8", "--no-sync"])
        try server.run(
            "pg_ctl",
            [
                "-D", server.dataDirectory, "-l", base.appendingPathComponent("server.log").path, "-w", "-t", "60",
                "-o", "-k \(base.path) -h 127.0.0.1 -p \(port) -F -c max_connections=200", "start",
            ])
        return server
    }

    var dataDirectory: String { directory.appendingPathComponent("data").path }

    /// The endpoint over the Unix socket.
    var socketEndpoint: FleetEndpoint {
        get throws { try endpoint(as: Self.superuser) }
    }

    /// The endpoint over the Unix socket for `role` (the server trusts every local role).
    func endpoint(as role: String) throws -> FleetEndpoint {
        try FleetEndpoint(
            transport: .unixSocket(path: "\(directory.path)/.s.PGSQL.\(port)"), security: .plaintext,
            username: role, database: "postgres")
    }

    /// A connected, migrated directory over the Unix socket, as the owner (the superuser), or
    /// as a terminal's role (for which migrating finds the schema current and does nothing).
    func connect(as role: String = superuser) async throws -> FleetDirectory {
        let directory = try await FleetDirectory.connect(to: try endpoint(as: role), password: nil, logger: testLogger)
        try await directory.migrate()
        return directory
    }

    /// A fresh login role for one terminal, made by the owner with the library's helper.
    func makeTerminalRole(_ hint: String) async throws -> String {
        let role =
            "kt_" + hint.lowercased().filter { $0.isLetter || $0.isNumber } + "_"
            + UUID().uuidString.prefix(8).lowercased()
        let owner = try await connect()
        do {
            try await owner.createTerminalRole(role, password: nil)
        } catch {
            await owner.close()
            throw error
        }
        await owner.close()
        return role
    }

    /// Runs one of PostgreSQL's programs (as the unprivileged user when root) and returns its
    /// standard output. posix_spawn and waitpid, not Foundation's Process, whose waitUntilExit
    /// can miss the exit of a child started from a test's task and wait forever.
    @discardableResult
    func run(_ program: String, _ arguments: [String]) throws -> Data {
        let path = binDirectory.appendingPathComponent(program).path
        var argv = [path] + arguments
        if let runAs {
            guard let entry = getpwnam(runAs) else { throw TestPostgresError("no user \(runAs)") }
            argv =
                [
                    "/usr/bin/setpriv", "--reuid=\(entry.pointee.pw_uid)", "--regid=\(entry.pointee.pw_gid)",
                    "--clear-groups",
                ] + argv
        }
        let outputPath = directory.appendingPathComponent("\(program)-\(UUID().uuidString).out").path
        let errorPath = outputPath + ".err"
        defer {
            unlink(outputPath)
            unlink(errorPath)
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, outputPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, errorPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        let environment = ["HOME=\(directory.path)", "LC_ALL=C", "PATH=/usr/bin:/bin"]
        var cArguments = argv.map { strdup($0) } + [nil]
        var cEnvironment = environment.map { strdup($0) } + [nil]
        defer {
            for pointer in cArguments { free(pointer) }
            for pointer in cEnvironment { free(pointer) }
        }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, argv[0], &actions, nil, &cArguments, &cEnvironment)
        guard spawned == 0 else { throw TestPostgresError("cannot start \(program): errno \(spawned)") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 {
            guard errno == EINTR else { throw TestPostgresError("waitpid failed for \(program)") }
        }
        let output = FileManager.default.contents(atPath: outputPath) ?? Data()
        guard status & 0x7f == 0, (status >> 8) & 0xff == 0 else {
            let errors = FileManager.default.contents(atPath: errorPath) ?? Data()
            throw TestPostgresError("\(program) failed (status \(status)): \(String(decoding: errors, as: UTF8.self))")
        }
        return output
    }

    func stop() {
        _ = try? run("pg_ctl", ["-D", dataDirectory, "-m", "fast", "-w", "stop"])
        try? FileManager.default.removeItem(at: directory)
    }

    /// A port on 127.0.0.1 nothing listens on right now.
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestPostgresError("socket failed") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
            }
        }
        guard bound else { throw TestPostgresError("bind failed") }
        return Int(UInt16(bigEndian: address.sin_port))
    }
}

struct TestPostgresError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

let testLogger: Logger = {
    var logger = Logger(label: "kioskauth.fleet.test")
    logger.logLevel = .warning
    return logger
}()

/// Skips with a clear message when PostgreSQL's programs are not installed.
let requiresPostgres = Testing.ConditionTrait.enabled(
    if: TestPostgres.isAvailable, "PostgreSQL (initdb, pg_ctl) is not installed: scripts/install-deps installs it")

extension TestPostgres {
    /// Runs SQL through psql as the superuser, as someone with write access to the directory
    /// (an attacker, in the tests that say so) would.
    @discardableResult
    func psql(_ sql: String, as role: String = superuser) throws -> String {
        try psql([sql], as: role)
    }

    /// Several statements in one psql session (one transaction when they say BEGIN … COMMIT).
    @discardableResult
    func psql(_ statements: [String], as role: String) throws -> String {
        let session = [
            "-h", directory.path, "-p", String(port), "-U", role, "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-At",
        ]
        return String(decoding: try run("psql", session + statements.flatMap { ["-c", $0] }), as: UTF8.self)
    }

    /// pg_dump of the whole directory, as a thief with a copy of the database would have it.
    func dump() throws -> Data {
        try run("pg_dump", ["-h", directory.path, "-p", String(port), "-U", Self.superuser, "postgres"])
    }
}
