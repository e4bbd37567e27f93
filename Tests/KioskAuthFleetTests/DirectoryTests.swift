import Crypto
import Foundation
import Logging
import Testing

@testable import KioskAuthFleet
@testable import KioskAuthFleetDirectory

/// A terminal as the tests drive it: its key pair, registration and directory connection.
/// Each terminal logs in as a database role of its own, a member of `kioskauth_terminal`.
struct Terminal {
    let keys: TerminalKeyPair
    let registration: TerminalRegistration
    let role: String
    let directory: FleetDirectory
    var id: UUID { registration.id }

    static func make(
        _ name: String, on server: TestPostgres, driver: String? = "virtual_image"
    ) async throws -> Terminal {
        let keys = TerminalKeyPair.generate()
        let registration = TerminalRegistration(
            id: UUID(), name: name, publicKey: keys.publicKey, readerDriver: driver,
            readerDeviceType: driver == nil ? nil : "image", isMatchOnChip: false)
        let role = try await server.makeTerminalRole(name)
        return Terminal(
            keys: keys, registration: registration, role: role, directory: try await server.connect(as: role))
    }

    /// The data keys wrapped to this terminal, opened with its own key and authenticated (a
    /// newcomer's by its admission under the join secret of `token`); its directory uses them
    /// from now on.
    @discardableResult
    func keyring(joinedWith token: JoinToken? = nil) async throws -> FleetKeyring {
        try await directory.loadKeyring(for: id, keyPair: keys, joinSecret: token?.secret)
    }

    /// Another connection as this terminal (its role), with its keys.
    func connectAgain(on server: TestPostgres) async throws -> FleetDirectory {
        let directory = try await server.connect(as: role)
        await directory.useKeyring(try await keyring())
        return directory
    }
}

/// A fleet of `count` terminals: the first bootstraps, the others join with tokens it issues.
func makeFleet(_ count: Int, on server: TestPostgres) async throws -> (terminals: [Terminal], dataKey: FleetDataKey) {
    let first = try await Terminal.make("terminal-0", on: server)
    let dataKey = try await first.directory.bootstrap(first.registration)
    var terminals = [first]
    for index in 1..<max(count, 1) {
        let terminal = try await Terminal.make("terminal-\(index)", on: server)
        let token = try await first.directory.issueJoinToken(by: first.id, lifetime: .seconds(600))
        try await terminal.directory.join(with: try JoinToken(text: token.text), as: terminal.registration)
        #expect(try await first.directory.admit(joinedWith: token, dataKey: dataKey) == terminal.id)
        try await terminal.keyring(joinedWith: token)
        terminals.append(terminal)
    }
    return (terminals, dataKey)
}

func person(_ id: UUID = UUID(), name: String? = nil, state: String = "active") -> FleetWrite {
    .person(id: id, name: name ?? "p-\(id.uuidString.prefix(13))", role: "user", uid: nil, state: state)
}

@Suite(.serialized, requiresPostgres) struct DirectoryTests {
    @Test func migrate_isIdempotent_andRecordsItsVersion() async throws {
        try await TestPostgres.with { server in
            let directory = try await server.connect()
            #expect(try await directory.migrate() == FleetMigration.latestVersion)
            #expect(try server.psql("SELECT max(version) FROM fleet_schema") == "\(FleetMigration.latestVersion)\n")
            // A directory from a newer build is refused, never written to.
            try server.psql("INSERT INTO fleet_schema (version, summary) VALUES (999, 'future')")
            await #expect(throws: FleetError.self) { try await directory.migrate() }
            await directory.close()
        }
    }

    @Test func joinToken_isSingleUse_expires_andAdmitsOnlyWithItsProof() async throws {
        try await TestPostgres.with { server in
            let (fleet, dataKey) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            // B received the data key wrapped to it and opens what A sealed.
            let sealed = try FleetKeyring([dataKey]).seal(Array("v".utf8), binding: .verifier(person: a.id))
            #expect(try await b.keyring().open(sealed, binding: .verifier(person: a.id)) == Array("v".utf8))
            // The token is stored hashed only.
            #expect(try server.psql("SELECT count(*) FROM join_tokens WHERE used_at IS NOT NULL") == "1\n")

            // Replaying B's token (the one used) for another terminal is refused.
            let usedToken = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            let c = try await Terminal.make("c", on: server)
            try await c.directory.join(with: usedToken, as: c.registration)
            let d = try await Terminal.make("d", on: server)
            await #expect(throws: FleetError.self) { try await d.directory.join(with: usedToken, as: d.registration) }
            // A token with the right id and a guessed secret is refused.
            let guessed = try JoinToken(text: "kat1.\(usedToken.id.uuidString).\(Data(count: 32).base64URL)")
            await #expect(throws: FleetError.self) { try await d.directory.join(with: guessed, as: d.registration) }

            // An expired token is refused.
            let shortLived = try await a.directory.issueJoinToken(by: a.id, lifetime: .milliseconds(1))
            try await Task.sleep(for: .milliseconds(200))
            await #expect(throws: FleetError.self) { try await d.directory.join(with: shortLived, as: d.registration) }

            // Someone with write access to the directory swaps C's public key for their own
            // before A admits it: the proof no longer matches and A wraps nothing to it.
            let attacker = TerminalKeyPair.generate()
            try server.psql(
                "UPDATE terminals SET public_key = '\\x\(hex(attacker.publicKey))' WHERE terminal_id = '\(c.id.fleetText)'"
            )
            await #expect(throws: FleetError.self) {
                _ = try await a.directory.admit(joinedWith: usedToken, dataKey: dataKey)
            }
            // A row made up for a fresh token, without the token's secret, is refused too.
            let fresh = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            try server.psql(
                """
                INSERT INTO terminals (terminal_id, name, public_key, state, join_token_id, join_proof)
                VALUES ('\(UUID().uuidString)', 'forged', '\\x\(hex(attacker.publicKey))', 'pending',
                        '\(fresh.id.uuidString)', '\\x\(hex([UInt8](repeating: 7, count: 32)))')
                """)
            await #expect(throws: FleetError.self) {
                _ = try await a.directory.admit(joinedWith: fresh, dataKey: dataKey)
            }
            #expect(
                try server.psql(
                    "SELECT count(*) FROM wrapped_keys WHERE terminal_id NOT IN ('\(a.id.fleetText)', '\(b.id.fleetText)')"
                ) == "0\n")
            for terminal in fleet + [c, d] { await terminal.directory.close() }
        }
    }

    @Test func push_sameIdempotencyKeyTwice_isAppliedOnce() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(1, on: server)
            let a = fleet[0]
            let somebody = UUID()
            let batch = PushBatch(
                idempotencyKey: UUID(), terminal: a.id,
                writes: [
                    person(somebody), .passcodeFailures(person: somebody, count: 1),
                    .audit(
                        key: UUID(), sequence: 1, occurredAt: Date(), person: "p", action: "VerifyPasscode",
                        result: "wrong"),
                ])
            #expect(try await a.directory.push(batch) == .applied)
            #expect(try await a.directory.push(batch) == .alreadyApplied)
            #expect(try await a.directory.fleetPasscodeFailures(person: somebody) == 1)
            #expect(try await a.directory.auditEventCount(terminal: a.id) == 1)
            // The resend carried a newer version than the row the directory kept; the writer's own
            // row still comes back trusted, not as a replay.
            let people = try await a.directory.pull(after: 0).filter { $0.entity == "people" }
            #expect(people.count == 1)
            let trusted = people.allSatisfy { $0.isTrusted }
            #expect(trusted, "\(people.map(\.integrity))")

            // The same key sent at once over eight connections (a retry racing its original):
            // exactly one is applied.
            let racing = PushBatch(
                idempotencyKey: UUID(), terminal: a.id, writes: [.passcodeFailures(person: somebody, count: 1)])
            let connections = try await (0..<8).asyncMap { _ in try await a.connectAgain(on: server) }
            let outcomes = try await withThrowingTaskGroup(of: PushOutcome.self) { group in
                for connection in connections { group.addTask { try await connection.push(racing) } }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            #expect(outcomes.filter { $0 == .applied }.count == 1)
            #expect(try await a.directory.fleetPasscodeFailures(person: somebody) == 2)
            // An audit event resent inside a new batch is still stored once.
            let event = FleetWrite.audit(
                key: UUID(), sequence: 2, occurredAt: Date(), person: nil, action: "x", result: "ok")
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [event]))
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [event]))
            #expect(try await a.directory.auditEventCount(terminal: a.id) == 2)
            for connection in connections { await connection.close() }
            await a.directory.close()
        }
    }

    @Test func pull_returnsChangesAfterItsCursor_inOrder_andTracksLag() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(1, on: server)
            let a = fleet[0]
            let start = try await a.directory.pull(after: 0).last?.id ?? 0
            let people = (0..<5).map { _ in UUID() }
            for id in people {
                try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(id)]))
            }
            let changes = try await a.directory.pull(after: start)
            #expect(changes.map(\.key) == people.map(\.fleetText))
            #expect(changes.map(\.id) == changes.map(\.id).sorted())
            let (head, cursor) = try await a.directory.feedPosition(for: a.id)
            #expect(cursor == 0 && head == changes.last?.id)
            try await a.directory.recordCursor(changes[2].id, for: a.id)
            #expect(try await a.directory.pull(after: changes[2].id).map(\.key) == people.suffix(2).map(\.fleetText))
            #expect(try await a.directory.feedPosition(for: a.id).cursor == changes[2].id)
            // A limit pages through the rest.
            #expect(try await a.directory.pull(after: start, limit: 2).count == 2)
            await a.directory.close()
        }
    }

    @Test func notify_wakesAListeningTerminal() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(1, on: server)
            let a = fleet[0]
            let listener = try await server.connect()
            let woken = Task {
                try await listener.withChangeWakeups { wakeups in
                    var iterator = wakeups.makeAsyncIterator()
                    return try await iterator.next() != nil
                }
            }
            try await Task.sleep(for: .milliseconds(500))
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person()]))
            let timeout = Task {
                try await Task.sleep(for: .seconds(10))
                woken.cancel()
            }
            #expect(try await woken.value)
            timeout.cancel()
            await listener.close()
            await a.directory.close()
        }
    }

    /// The subtle case: a transaction that took its change id first commits last. A naive
    /// sequence would let the later one commit first; a puller would advance its cursor past the
    /// earlier id and never see it. Here the second writer waits for the first, so a pull made
    /// in between sees neither, and the cursor never passes an uncommitted change.
    @Test func pull_neverSkipsAChangeWhoseTransactionCommitsLate() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(1, on: server)
            let a = fleet[0]
            var cursor = try await a.directory.pull(after: 0).last?.id ?? 0
            let slow = try await a.connectAgain(on: server)
            let fast = try await a.connectAgain(on: server)
            let (first, second) = (UUID(), UUID())
            let firstRecord = try await slow.authenticatedRecord(person(first))
            let (pushed, pushedContinuation) = AsyncStream.makeStream(of: Void.self)
            let (release, releaseContinuation) = AsyncStream.makeStream(of: Void.self)
            let slowTask = Task {
                try await slow.transaction { connection, logger in
                    let operations = String(
                        decoding: try JSONSerialization.data(withJSONObject: [firstRecord]), as: UTF8.self)
                    try await connection.query(
                        "SELECT fleet_apply_push(\(UUID()), \(a.id), \(operations)::jsonb)", logger: logger)
                    pushedContinuation.yield()
                    for await _ in release { break }
                }
            }
            for await _ in pushed { break }
            let fastTask = Task {
                try await fast.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(second)]))
            }
            try await Task.sleep(for: .milliseconds(500))
            var seen = try await a.directory.pull(after: cursor)
            cursor = seen.last?.id ?? cursor
            releaseContinuation.yield()
            try await slowTask.value
            _ = try await fastTask.value
            seen += try await a.directory.pull(after: cursor)
            #expect(Set(seen.map(\.key)) == [first.fleetText, second.fleetText])
            #expect(seen.map(\.key) == [first.fleetText, second.fleetText])
            await slow.close()
            await fast.close()
            await a.directory.close()
        }
    }

    @Test func manyConcurrentPushers_aPullerNeverMissesAChange() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(1, on: server)
            let a = fleet[0]
            let pushers = 8
            let batchesEach = 25
            let puller = try await server.connect()
            let connections = try await (0..<pushers).asyncMap { _ in try await a.connectAgain(on: server) }
            let done = Flag()
            async let pulledByPuller = pullUntil(done, from: puller)
            let pushed = try await withThrowingTaskGroup(of: [String].self) { group in
                for connection in connections {
                    group.addTask {
                        var mine: [String] = []
                        for batch in 0..<batchesEach {
                            let ids = (0...(batch % 3)).map { _ in UUID() }
                            try await connection.push(
                                PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: ids.map { person($0) }))
                            mine += ids.map(\.fleetText)
                        }
                        return mine
                    }
                }
                return try await group.reduce(into: []) { $0 += $1 }
            }
            await done.set()
            let pulled = try await pulledByPuller
            let pulledPeople = pulled.filter { $0.entity == "people" }.map(\.key)
            #expect(pushed.count == pushers * 49)
            let missed = Set(pushed).subtracting(pulledPeople)
            #expect(missed.isEmpty, "the puller missed \(missed.count) of \(pushed.count) people")
            #expect(pulledPeople.count == pushed.count)
            #expect(pulled.map(\.id) == pulled.map(\.id).sorted())
            #expect(Set(pulled.map(\.id)).count == pulled.count)
            for connection in connections { await connection.close() }
            await puller.close()
            await a.directory.close()
        }
    }
}

actor Flag {
    private(set) var isSet = false
    func set() { isSet = true }
}

/// Pulls as a terminal does, cursor after cursor, until `done` is set and a pull after that
/// comes back empty.
func pullUntil(_ done: Flag, from directory: FleetDirectory) async throws -> [FleetChange] {
    var pulled: [FleetChange] = []
    var cursor: Int64 = 0
    while true {
        let finished = await done.isSet
        let batch = try await directory.pull(after: cursor, limit: 50)
        pulled += batch
        cursor = batch.last?.id ?? cursor
        if batch.isEmpty {
            if finished { return pulled }
            try await Task.sleep(for: .milliseconds(2))
        }
    }
}

func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

extension Sequence {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for element in self { results.append(try await transform(element)) }
        return results
    }
}
