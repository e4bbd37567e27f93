import Crypto
import Foundation
import Logging
import Testing

@testable import KioskAuthFleet
@testable import KioskAuthFleetDirectory

/// Attacks on the directory's authority (docs/fleet.md §2, §3, §8): a terminal acting for
/// another, a terminal role writing or reading what it may not, and a directory writer forging
/// or replaying rows. Each runs against the real PostgreSQL the tests start.
@Suite(.serialized, requiresPostgres) struct FleetAuthorityTests {
    /// Terminal B, logged in as its own role, pushes (and records a cursor, and issues a token)
    /// with terminal A's id: refused as `permissionDenied`, and nothing of it is stored.
    @Test func terminalPushingWithAnotherTerminalsId_isRefused() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let victim = UUID()
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(victim)]))
            let pushesBefore = try server.psql("SELECT count(*) FROM applied_pushes")

            for writes: [FleetWrite] in [
                [.passcodeReset(person: victim)], [.passcodeFailures(person: victim, count: 5)],
                [person(victim, state: "suspended")],
                [.audit(key: UUID(), sequence: 1, occurredAt: Date(), person: nil, action: "x", result: "ok")],
            ] {
                let error = await #expect(throws: FleetError.self) {
                    try await b.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: writes))
                }
                #expect(error?.code == .permissionDenied)
            }
            let cursorError = await #expect(throws: FleetError.self) {
                try await b.directory.recordCursor(99, for: a.id)
            }
            #expect(cursorError?.code == .permissionDenied)
            let tokenError = await #expect(throws: FleetError.self) {
                _ = try await b.directory.issueJoinToken(by: a.id, lifetime: .seconds(60))
            }
            #expect(tokenError?.code == .permissionDenied)

            #expect(try server.psql("SELECT count(*) FROM applied_pushes") == pushesBefore)
            #expect(try server.psql("SELECT state FROM people WHERE person_id = '\(victim.fleetText)'") == "active\n")
            #expect(try await a.directory.auditEventCount(terminal: a.id) == 0)
            #expect(try await a.directory.feedPosition(for: a.id).cursor == 0)
            // The control: B pushing as itself is applied.
            try await b.directory.push(
                PushBatch(idempotencyKey: UUID(), terminal: b.id, writes: [.passcodeFailures(person: victim, count: 1)])
            )
            #expect(try await a.directory.fleetPasscodeFailures(person: victim) == 1)
            // A role that is no terminal's at all (made by the owner, never joined) is refused too.
            let stranger = try await server.makeTerminalRole("stranger")
            let strangerDirectory = try await server.connect(as: stranger)
            await strangerDirectory.useKeyring(try await a.keyring())
            let strangerError = await #expect(throws: FleetError.self) {
                try await strangerDirectory.push(
                    PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(victim, state: "removed")]))
            }
            #expect(strangerError?.code == .permissionDenied)
            await strangerDirectory.close()
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A terminal role has no INSERT, UPDATE or DELETE on any table, and may not call the
    /// directory's internal functions: every attempt is "permission denied".
    @Test func terminalRole_cannotWriteTablesDirectly() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let victim = UUID()
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(victim)]))
            let attacks = [
                "INSERT INTO people (person_id, name, role, state) VALUES ('\(UUID().fleetText)', 'mallory', 'admin', 'active')",
                "UPDATE people SET state = 'suspended' WHERE person_id = '\(victim.fleetText)'",
                "DELETE FROM people",
                "UPDATE terminals SET state = 'member', public_key = public_key",
                "INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext) VALUES ('\(b.id.fleetText)', 1, '\\x00', '\\x00')",
                "DELETE FROM passcode_failures",
                "UPDATE person_lockout SET fleet_failures = 0",
                "INSERT INTO changes (entity, entity_key, body) VALUES ('people', 'x', '{}')",
                "UPDATE change_clock SET last_id = 0",
                "INSERT INTO audit_events (idempotency_key, terminal_id, terminal_sequence, occurred_at, action, result) VALUES ('\(UUID().fleetText)', '\(a.id.fleetText)', 1, now(), 'x', 'y')",
                "UPDATE terminal_sync SET cursor = 0",
                "INSERT INTO data_keys (generation, reason) VALUES (7, 'x')",
                "TRUNCATE templates",
                "SELECT fleet_next_change_id()",
                "SELECT fleet_create_terminal_role('kt_more', NULL)",
                "SELECT fleet_check_terminal('\(a.id.fleetText)', true)",
                "CREATE TABLE people_copy (id int)",
            ]
            for sql in attacks {
                do {
                    try server.psql(sql, as: b.role)
                    Issue.record("a terminal role was allowed: \(sql)")
                } catch let error as TestPostgresError {
                    #expect(error.description.contains("permission denied"), "\(sql): \(error)")
                }
            }
            // The same through the library's own connection: a named error.
            let error = await #expect(throws: FleetError.self) {
                try await b.directory.exclusive { connection, logger in
                    try await connection.query("UPDATE people SET role = 'admin'", logger: logger)
                }
            }
            #expect(error?.code == .permissionDenied)
            // Nothing changed.
            #expect(try server.psql("SELECT state, role FROM people") == "active|user\n")
            #expect(try server.psql("SELECT count(*) FROM terminals WHERE state = 'member'") == "2\n")
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// Join token hashes and the applied-push log are not readable by terminals; per-terminal
    /// rows (wrapped keys, cursors, audit) are readable only by their own terminal.
    @Test func terminalRole_cannotReadTokenHashes_andReadsOnlyItsOwnRows() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            _ = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            try await a.directory.push(
                PushBatch(
                    idempotencyKey: UUID(), terminal: a.id,
                    writes: [
                        .audit(key: UUID(), sequence: 1, occurredAt: Date(), person: nil, action: "a", result: "ok")
                    ]
                ))
            try await a.directory.recordCursor(5, for: a.id)
            try await b.directory.recordCursor(6, for: b.id)
            for sql in [
                "SELECT secret_hash FROM join_tokens", "SELECT count(*) FROM join_tokens",
                "SELECT * FROM applied_pushes",
            ] {
                do {
                    try server.psql(sql, as: b.role)
                    Issue.record("\(sql) was allowed to a terminal role")
                } catch let error as TestPostgresError {
                    #expect(error.description.contains("permission denied"), "\(sql): \(error)")
                }
            }
            // Row-level security: B sees its own wrapped key, cursor and audit only.
            #expect(try server.psql("SELECT count(*) FROM wrapped_keys") == "2\n")
            #expect(try server.psql("SELECT terminal_id FROM wrapped_keys", as: b.role) == "\(b.id.fleetText)\n")
            #expect(try server.psql("SELECT cursor FROM terminal_sync", as: b.role) == "6\n")
            #expect(try server.psql("SELECT count(*) FROM audit_events", as: b.role) == "0\n")
            #expect(try server.psql("SELECT count(*) FROM audit_events", as: a.role) == "1\n")
            #expect(try await b.directory.wrappedDataKeys(for: a.id).isEmpty)
            #expect(try await b.directory.feedPosition(for: a.id).cursor == 0)
            // What a pull needs stays readable.
            #expect(try server.psql("SELECT count(*) > 0 FROM changes", as: b.role) == "t\n")
            // A terminal's temporary table named like a directory table does not fool the
            // SECURITY DEFINER functions (their search path puts pg_temp last).
            do {
                try server.psql(
                    """
                    CREATE TEMP TABLE terminals AS SELECT * FROM public.terminals;
                    UPDATE terminals SET db_role = session_user;
                    SELECT fleet_record_cursor('\(a.id.fleetText)', 77);
                    """, as: b.role)
                Issue.record("a temporary table shadowed the directory's terminals")
            } catch let error as TestPostgresError {
                #expect(error.description.contains("does not belong to role"), "\(error)")
            }
            #expect(try await a.directory.feedPosition(for: a.id).cursor == 5)
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A directory writer (here the superuser) flips a person's state, role and uid, or invents
    /// a person: a member's pull reports each such row as forged, withholds it, and the honest
    /// rows around it still arrive.
    @Test func forgedPeopleRows_areReportedAndNotApplied() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let nurse = UUID()
            let doctor = UUID()
            try await a.directory.push(
                PushBatch(
                    idempotencyKey: UUID(), terminal: a.id,
                    writes: [
                        .person(id: nurse, name: "nurse.jones", role: "user", uid: 1001, state: "suspended"),
                        .person(id: doctor, name: "dr.who", role: "user", uid: 1002, state: "active"),
                    ]))
            let honest = try await b.directory.pull(after: 0).filter { $0.entity == "people" }
            #expect(honest.map(\.integrity) == [.verified, .verified])
            let cursor = honest.last!.id

            // The forgeries: a state flip, a role and uid swap, a copy of another row's MAC,
            // and a person who was never pushed.
            try server.psql("UPDATE people SET state = 'active' WHERE person_id = '\(nurse.fleetText)'")
            try server.psql("UPDATE people SET role = 'admin', uid = 0 WHERE person_id = '\(doctor.fleetText)'")
            try server.psql(
                """
                UPDATE people SET (generation, version, mac) =
                    (SELECT generation, version, mac FROM people WHERE person_id = '\(doctor.fleetText)')
                WHERE person_id = '\(nurse.fleetText)'
                """)
            let invented = UUID()
            try server.psql(
                """
                INSERT INTO people (person_id, name, role, uid, state, generation, version, mac)
                VALUES ('\(invented.fleetText)', 'mallory', 'admin', 0, 'active', 1, 1, '\\x\(hex(Array(repeating: 1, count: 32)))')
                """)
            let legit = UUID()
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(legit)]))

            let pulled = try await b.directory.pull(after: cursor).filter { $0.entity == "people" }
            #expect(pulled.map(\.key) == [nurse, doctor, nurse, invented, legit].map(\.fleetText))
            for forged in pulled.prefix(4) {
                guard case .forged = forged.integrity else {
                    Issue.record("change \(forged.id) of \(forged.key) is \(forged.integrity), not forged")
                    continue
                }
                #expect(!forged.isTrusted)
                // Withheld: a caller that forgets to look finds nothing to apply.
                #expect(forged.body == nil && forged.fields.isEmpty)
            }
            #expect(pulled.last?.integrity == .verified)
            #expect(pulled.last?.fields["name"] == "p-\(legit.uuidString.prefix(13))")
            // A terminal without the data key cannot vouch for anything: unverifiable, withheld.
            let keyless = try await server.connect(as: b.role)
            let unchecked = try await keyless.pull(after: 0).filter { $0.entity == "people" }
            #expect(unchecked.allSatisfy { !$0.isTrusted && $0.body == nil })
            if case .unverifiable = unchecked.first?.integrity {} else { Issue.record("\(unchecked.first!)") }
            await keyless.close()
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A member gone bad (it holds the data key, so its row MACs are valid) writes a version near
    /// Int64.max. Taken as the newest, it made the next versions overflow: each terminal that
    /// pulled it trapped at its next writes of the row. It is refused as forged, and writing goes on.
    @Test func aVersionNearInt64Max_isRefused_andTheRowCanStillBeWritten() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let nurse = UUID()
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(nurse)]))
            let cursor = try await b.directory.pull(after: 0).last!.id
            // A, gone bad, writes her suspended at version Int64.max - 1, with a valid row MAC.
            let keyring = try await a.keyring()
            let write = person(nurse, state: "suspended")
            let (table, row, fields) = try #require(FleetRowMAC.content(of: write))
            let generation = keyring.currentGeneration
            let input = FleetRowMAC.input(
                table: table, row: row, generation: generation, version: Int64.max - 1, fields: fields)
            let mac = try #require(keyring.rowMAC(input, generation: generation))
            try server.psql(
                """
                UPDATE people SET state = 'suspended', generation = \(generation), version = \(Int64.max - 1),
                    mac = '\\x\(hex(Array(mac)))' WHERE person_id = '\(nurse.fleetText)'
                """)
            let pulled = try await b.directory.pull(after: cursor).filter { $0.entity == "people" }
            guard case .forged(let why)? = pulled.last?.integrity else {
                Issue.record("\(String(describing: pulled.last?.integrity)), not forged")
                return
            }
            #expect(why.contains("beyond any clock") && pulled.last?.body == nil)
            // B writes the row twice, and so does A: nothing overflows. (The directory keeps the
            // highest version, so the bad row stays there, republished and refused at each pull:
            // refusing such versions in the directory itself needs a schema change; see
            // docs/fleet.md.)
            for writer in [b, b, a, a] {
                try await writer.directory.push(
                    PushBatch(idempotencyKey: UUID(), terminal: writer.id, writes: [person(nurse)]))
            }
            let again = try await b.directory.pull(after: pulled.last!.id).filter { $0.entity == "people" }
            #expect(!again.isEmpty && again.allSatisfy { !$0.isTrusted })
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// The other rows that decide an unlock: a writer who moves one person's verifier (with its
    /// MAC) onto another person, or retags a template for another reader, is caught too; and a
    /// member cannot admit with a join token another member issued.
    @Test func forgedVerifierAndTemplateRows_andAdmittingWithAnotherMembersToken_areRefused() async throws {
        try await TestPostgres.with { server in
            let (fleet, dataKey) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let keyring = try await a.keyring()
            let (nurse, doctor, template) = (UUID(), UUID(), UUID())
            try await a.directory.push(
                PushBatch(
                    idempotencyKey: UUID(), terminal: a.id,
                    writes: [
                        person(nurse), person(doctor),
                        .verifier(
                            person: nurse, sealed: try keyring.seal(Array("n".utf8), binding: .verifier(person: nurse))),
                        .verifier(
                            person: doctor,
                            sealed: try keyring.seal(Array("d".utf8), binding: .verifier(person: doctor))),
                        .template(
                            id: template, person: nurse, finger: "right-index", driver: "virtual_image",
                            deviceType: "image",
                            sealed: try keyring.seal(Array("print".utf8), binding: .template(template, person: nurse))),
                    ]))
            let cursor = try await b.directory.pull(after: 0).last!.id
            try server.psql(
                """
                UPDATE passcode_verifiers SET (sealed, version, mac) =
                    (SELECT sealed, version, mac FROM passcode_verifiers WHERE person_id = '\(nurse.fleetText)')
                WHERE person_id = '\(doctor.fleetText)'
                """)
            try server.psql("UPDATE templates SET driver = 'goodixmoc', device_type = 'press'")
            let pulled = try await b.directory.pull(after: cursor)
            #expect(pulled.map(\.entity) == ["passcode_verifiers", "templates"])
            for change in pulled {
                if case .forged = change.integrity {} else { Issue.record("\(change.entity): \(change.integrity)") }
                #expect(change.sealedBlob == nil)
            }

            // B did not issue A's token: it may not admit the terminal that used it, even
            // holding the secret.
            let token = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            let c = try await Terminal.make("c", on: server)
            try await c.directory.join(with: token, as: c.registration)
            let error = await #expect(throws: FleetError.self) {
                _ = try await b.directory.admit(joinedWith: token, dataKey: dataKey)
            }
            #expect(error?.code == .permissionDenied)
            #expect(
                try server.psql("SELECT state FROM terminals WHERE terminal_id = '\(c.id.fleetText)'") == "pending\n")
            #expect(try await a.directory.admit(joinedWith: token, dataKey: dataKey) == c.id)
            for terminal in fleet + [c] { await terminal.directory.close() }
        }
    }

    /// A directory writer puts back an older, genuinely MACed version of a row (a person's
    /// earlier state, an earlier passcode verifier, a removed template): refused as replayed by
    /// a terminal that saw the newer version, in this session or (told by its store) before.
    @Test func replayedOlderRows_areRefused() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let keyring = try await a.keyring()
            let nurse = UUID()
            let template = UUID()
            let oldVerifier = try keyring.seal(Array("old passcode".utf8), binding: .verifier(person: nurse))
            let sealedTemplate = try keyring.seal(Array("print".utf8), binding: .template(template, person: nurse))
            try await a.directory.push(
                PushBatch(
                    idempotencyKey: UUID(), terminal: a.id,
                    writes: [
                        person(nurse, name: "nurse.jones"), .verifier(person: nurse, sealed: oldVerifier),
                        .template(
                            id: template, person: nurse, finger: "right-index", driver: "virtual_image",
                            deviceType: "image", sealed: sealedTemplate),
                    ]))
            let rowsV1 = try server.psql(
                "SELECT version || '|' || encode(mac, 'hex') FROM people WHERE person_id = '\(nurse.fleetText)'")
            let verifierV1 = try server.psql(
                "SELECT version || '|' || encode(sealed, 'hex') || '|' || encode(mac, 'hex') FROM passcode_verifiers")
            let templateRow = try server.psql(
                "SELECT version || '|' || encode(sealed, 'hex') || '|' || encode(mac, 'hex') FROM templates")
            // Later: she is suspended, her passcode changed, her template removed.
            try await a.directory.push(
                PushBatch(
                    idempotencyKey: UUID(), terminal: a.id,
                    writes: [
                        person(nurse, name: "nurse.jones", state: "suspended"),
                        .verifier(
                            person: nurse,
                            sealed: try keyring.seal(Array("new passcode".utf8), binding: .verifier(person: nurse))),
                        .removeTemplate(id: template),
                    ]))
            var cursor: Int64 = 0
            let seen = try await b.directory.pull(after: cursor)
            #expect(seen.allSatisfy { $0.isTrusted })
            cursor = seen.last!.id

            // The writer restores every old row exactly as the member wrote it.
            let (personVersion, personMAC) = split2(rowsV1)
            try server.psql(
                """
                UPDATE people SET state = 'active', version = \(personVersion), mac = '\\x\(personMAC)'
                WHERE person_id = '\(nurse.fleetText)'
                """)
            let verifier = verifierV1.trimmingCharacters(in: .newlines).split(separator: "|").map(String.init)
            try server.psql(
                """
                UPDATE passcode_verifiers SET version = \(verifier[0]), sealed = '\\x\(verifier[1])', mac = '\\x\(verifier[2])'
                """)
            let old = templateRow.trimmingCharacters(in: .newlines).split(separator: "|").map(String.init)
            try server.psql(
                """
                INSERT INTO templates (template_id, person_id, finger, driver, device_type, generation, sealed, version, mac)
                VALUES ('\(template.fleetText)', '\(nurse.fleetText)', 'right-index', 'virtual_image', 'image', 1,
                        '\\x\(old[1])', \(old[0]), '\\x\(old[2])')
                """)
            let replayed = try await b.directory.pull(after: cursor)
            #expect(replayed.map(\.entity) == ["people", "passcode_verifiers", "templates"])
            for change in replayed {
                guard case .replayed = change.integrity else {
                    Issue.record("\(change.entity) \(change.key): \(change.integrity), not replayed")
                    continue
                }
                #expect(change.body == nil)
            }
            // After a restart the terminal tells the directory what its store holds: the
            // replay is still refused.
            let restarted = try await b.connectAgain(on: server)
            let newest = seen.filter { $0.entity == "people" }.last!
            await restarted.rememberRowVersion(newest.rowVersion!, entity: "people", key: nurse.fleetText)
            let afterRestart = try await restarted.pull(after: cursor).first { $0.entity == "people" }
            if case .replayed = afterRestart?.integrity {} else { Issue.record("\(String(describing: afterRestart))") }
            await restarted.close()
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// Two members change the same person; the write with the older version reaches the
    /// directory last. The directory keeps the newer row (the newest version wins) and
    /// republishes it, so the stale writer's next pull corrects its copy.
    @Test func staleWrite_doesNotRollARowBack_andTheNewerRowIsRepublished() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let nurse = UUID()
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(nurse)]))
            // A's suspension is made (versioned and MACed) first but sent last.
            let stale = try await a.directory.authenticatedRecord(person(nurse, state: "suspended"))
            try await Task.sleep(for: .milliseconds(5))
            try await b.directory.push(
                PushBatch(idempotencyKey: UUID(), terminal: b.id, writes: [person(nurse, state: "removed")]))
            let cursor = try await a.directory.pull(after: 0).last!.id
            let operations = String(decoding: try JSONSerialization.data(withJSONObject: [stale]), as: UTF8.self)
            try await a.directory.exclusive { connection, logger in
                try await connection.query(
                    "SELECT fleet_apply_push(\(UUID()), \(a.id), \(operations)::jsonb)", logger: logger
                ).collect()
            }
            #expect(try server.psql("SELECT state FROM people WHERE person_id = '\(nurse.fleetText)'") == "removed\n")
            let republished = try await a.directory.pull(after: cursor)
            #expect(republished.count == 1)
            #expect(republished.first?.integrity == .verified)
            #expect(republished.first?.fields["state"] == "removed")
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// Pushing people, verifiers or templates needs the data key (to MAC them): a directory
    /// connection that was given none refuses before sending anything.
    @Test func pushWithoutTheDataKey_isRefusedLocally() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(1, on: server)
            let a = fleet[0]
            let keyless = try await server.connect(as: a.role)
            let error = await #expect(throws: FleetError.self) {
                try await keyless.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person()]))
            }
            #expect(error?.code == .keyUnavailable)
            // Sent by hand without a MAC, the directory refuses it too.
            do {
                try server.psql(
                    """
                    SELECT fleet_apply_push(gen_random_uuid(), '\(a.id.fleetText)',
                        '[{"op": "person", "person": "\(UUID().fleetText)", "name": "m", "role": "admin", "state": "active"}]')
                    """, as: a.role)
                Issue.record("a person row without a MAC was accepted")
            } catch let error as TestPostgresError {
                #expect(error.description.contains("carries no row MAC"), "\(error)")
            }
            #expect(try server.psql("SELECT count(*) FROM people") == "0\n")
            await keyless.close()
            await a.directory.close()
        }
    }
}

private func split2(_ text: String) -> (String, String) {
    let parts = text.trimmingCharacters(in: .newlines).split(separator: "|").map(String.init)
    return (parts[0], parts[1])
}
