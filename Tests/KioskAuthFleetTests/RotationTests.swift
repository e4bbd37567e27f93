import Crypto
import Foundation
import Logging
import Testing

@testable import KioskAuthFleet
@testable import KioskAuthFleetDirectory

/// Removal and rotation (docs/fleet.md §3, §9.8): removing a terminal that held the data key
/// owes the fleet a new generation; exactly one member publishes it; a terminal admitted later
/// is given every generation, so the rows written before it joined stay verifiable and open.
@Suite(.serialized, requiresPostgres) struct RotationTests {
    /// The rows a member pushes for one person: the person and a sealed verifier.
    func pushPerson(_ terminal: Terminal, _ id: UUID, verifier: String) async throws -> SealedBlob {
        let sealed = try await terminal.keyring().seal(Array(verifier.utf8), binding: .verifier(person: id))
        try await terminal.directory.push(
            PushBatch(
                idempotencyKey: UUID(), terminal: terminal.id,
                writes: [person(id), .verifier(person: id, sealed: sealed)]))
        return sealed
    }

    /// `rotationDue` as "owed/newest", for comparing.
    func owed(_ terminal: Terminal) async throws -> String {
        let (due, newest) = try await terminal.directory.rotationDue()
        return "\(due)/\(newest)"
    }

    @Test func removingAMember_owesARotation_andOfTwoRacingMembersExactlyOnePublishesIt() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let (a, b, c) = (fleet[0], fleet[1], fleet[2])
            #expect(try await owed(a) == "false/1")
            // Nothing owed, nothing published.
            #expect(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)?.generation == nil)

            // What c holds when it is removed (a thief's copy).
            let stolen = try await c.keyring()
            try await a.directory.removeTerminal(c.id)
            #expect(try await owed(b) == "true/1")
            // A and B both notice and race to pay the debt: one generation 2, never a 3.
            async let fromA = a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)
            async let fromB = b.directory.rotateDataKeyIfDue(by: b.id, publicKey: b.keys.publicKey)
            let published = [try await fromA, try await fromB].compactMap { $0 }
            #expect(published.count == 1)
            #expect(published.first?.generation == 2)
            #expect(
                try server.psql("SELECT string_agg(generation::text, ',' ORDER BY generation) FROM data_keys")
                    == "1,2\n")
            #expect(try await owed(a) == "false/2")

            // Both remaining members hold generation 2, and open each other's new secrets; the
            // removed terminal has no wrapped key left and cannot open them with what it kept.
            #expect(try await a.keyring().currentGeneration == 2)
            #expect(try await b.keyring().currentGeneration == 2)
            let nurse = UUID()
            let sealed = try await pushPerson(a, nurse, verifier: "after the removal")
            #expect(sealed.generation == 2)
            #expect(
                try await b.keyring().open(sealed, binding: .verifier(person: nurse)) == Array("after the removal".utf8)
            )
            #expect(throws: FleetError.self) { try stolen.open(sealed, binding: .verifier(person: nurse)) }
            #expect(try await c.directory.wrappedDataKeys(for: c.id).isEmpty)
            // Pulled as c still could (its role can SELECT until dropped), the rows written
            // after the removal are not verifiable with what it held.
            let seenByC = try await c.directory.pull(after: 0).filter { $0.key == nurse.fleetText }
            #expect(!seenByC.isEmpty)
            #expect(seenByC.allSatisfy { !$0.isTrusted })
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    @Test func aTerminalAdmittedAfterARotation_holdsEveryGeneration_andTrustsTheOlderRows() async throws {
        try await TestPostgres.with { server in
            let (fleet, firstKey) = try await makeFleet(3, on: server)
            let (a, c) = (fleet[0], fleet[2])
            let before = UUID()
            let sealedBefore = try await pushPerson(a, before, verifier: "before")
            try await a.directory.removeTerminal(c.id)
            let second = try #require(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey))
                .key
            let after = UUID()
            let sealedAfter = try await pushPerson(a, after, verifier: "after")
            #expect(sealedBefore.generation == 1)
            #expect(sealedAfter.generation == 2)

            let d = try await Terminal.make("d", on: server)
            let token = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            try await d.directory.join(with: token, as: d.registration)
            // A member that would wrap only some generations is refused: the directory insists
            // on exactly the fleet's generations, so no member is made without the older ones.
            await #expect(throws: FleetError.self) {
                _ = try await a.directory.admit(joinedWith: token, dataKey: second)
            }
            await #expect(throws: FleetError.self) {
                _ = try await a.directory.admit(joinedWith: token, dataKey: firstKey)
            }
            #expect(
                try server.psql("SELECT state FROM terminals WHERE terminal_id = '\(d.id.fleetText)'") == "pending\n")
            #expect(try await a.directory.admit(joinedWith: token, dataKeys: [firstKey, second]) == d.id)

            let keyring = try await d.keyring(joinedWith: token)
            #expect(try await d.directory.wrappedDataKeys(for: d.id).map(\.generation) == [1, 2])
            #expect(try keyring.open(sealedBefore, binding: .verifier(person: before)) == Array("before".utf8))
            #expect(try keyring.open(sealedAfter, binding: .verifier(person: after)) == Array("after".utf8))
            // Every people and verifier row in the feed, from before and after the rotation,
            // verifies at the newcomer.
            let rows = try await d.directory.pull(after: 0).filter {
                ["people", "passcode_verifiers"].contains($0.entity) && !$0.isDeletion
            }
            #expect(rows.count == 4)
            #expect(rows.allSatisfy { if case .verified = $0.integrity { true } else { false } })
            for terminal in fleet + [d] { await terminal.directory.close() }
        }
    }

    @Test func removal_ofAPendingOrRemovedTerminal_owesNothing_andAnUnknownOneIsNotFound() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let pending = try await Terminal.make("pending", on: server)
            let token = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            try await pending.directory.join(with: token, as: pending.registration)
            // A pending terminal never held a data key: removing it owes no rotation.
            try await a.directory.removeTerminal(pending.id)
            #expect(try await owed(a) == "false/1")
            // B leaves (removes itself): owed. Removing it again changes nothing.
            try await b.directory.removeTerminal(b.id)
            #expect(try await owed(a) == "true/1")
            let removedAt = try server.psql("SELECT removed_at FROM terminals WHERE terminal_id = '\(b.id.fleetText)'")
            try await a.directory.removeTerminal(b.id)
            #expect(
                try server.psql("SELECT removed_at FROM terminals WHERE terminal_id = '\(b.id.fleetText)'") == removedAt
            )
            do {
                try await a.directory.removeTerminal(UUID())
                Issue.record("removing an unknown terminal succeeded")
            } catch let error as FleetError {
                #expect(error.code == .notFound)
            }
            // A removed terminal may remove nobody, and cannot pay the debt itself.
            await #expect(throws: FleetError.self) { try await b.directory.removeTerminal(a.id) }
            await #expect(throws: FleetError.self) {
                _ = try await b.directory.rotateDataKeyIfDue(by: b.id, publicKey: b.keys.publicKey)
            }
            #expect(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)?.generation == 2)
            let terminals = try await a.directory.terminals()
            #expect(terminals.map(\.state) == ["member", "removed", "removed"])
            #expect(terminals.first?.lastSeenAt == nil && terminals[1].removedAt != nil)
            for terminal in fleet + [pending] { await terminal.directory.close() }
        }
    }

    /// `CREATE OR REPLACE FUNCTION` resets SECURITY DEFINER and SET: after every migration, each
    /// function a terminal role may call still runs as the owner with its search path pinned,
    /// and a role outside kioskauth_terminal may call none of them.
    @Test func everyFunctionATerminalMayCall_runsAsTheOwner_withItsSearchPathPinned() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(1, on: server)
            try server.psql("CREATE ROLE outsider LOGIN")
            let rows = try server.psql(
                """
                SELECT p.proname, p.prosecdef, coalesce(array_to_string(p.proconfig, ','), ''),
                       has_function_privilege('outsider', p.oid, 'EXECUTE')
                FROM pg_proc p
                WHERE p.proname LIKE 'fleet\\_%' AND has_function_privilege('kioskauth_terminal', p.oid, 'EXECUTE')
                ORDER BY p.proname
                """
            ).split(separator: "\n").map { $0.split(separator: "|", omittingEmptySubsequences: false).map(String.init) }
            #expect(
                rows.map { $0[0] } == [
                    // Two of three: migration 4's signature, and the earlier one that now refuses.
                    "fleet_admit", "fleet_admit_keys", "fleet_admit_keys", "fleet_apply_push", "fleet_bootstrap",
                    "fleet_bootstrap", "fleet_issue_join_token", "fleet_join", "fleet_record_cursor",
                    "fleet_remove_terminal", "fleet_rotate_data_key", "fleet_rotate_data_key", "fleet_vouch",
                ])
            for row in rows {
                #expect(row[1] == "t", "\(row[0]) is not SECURITY DEFINER")
                #expect(row[2].hasPrefix("search_path="), "\(row[0]) has no pinned search path")
                #expect(row[3] == "f", "\(row[0]) is callable by a role outside kioskauth_terminal")
            }
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// The race the review found: terminal S, being removed, holds the change feed with an open
    /// push, so the admin's removal of S waits inside its trigger with S's row already marked;
    /// S then asks to publish the generation its own removal owes, with a key it chose. The
    /// rotation takes the lock before it checks its caller, so once the removal commits S is
    /// no member and is refused; the debt stays for an honest member.
    @Test func aTerminalRemovedWhileItsRotationWaits_cannotPublishTheGenerationItsRemovalOwes() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let (a, b, s) = (fleet[0], fleet[1], fleet[2])
            let nurse = UUID()
            try await a.directory.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(nurse)]))
            let wrap = #"{"encapsulated":"AQ==","ciphertext":"Ag=="}"#
            let holdingTheFeed = Task.detached {
                try server.psql(
                    [
                        "BEGIN",
                        """
                        SELECT fleet_apply_push(gen_random_uuid(), '\(s.id.fleetText)',
                          '[{"op":"passcode_failures","person":"\(nurse.fleetText)","count":1}]'::jsonb)
                        """,
                        "SELECT pg_sleep(3)", "COMMIT",
                    ], as: s.role)
            }
            try await Task.sleep(for: .milliseconds(700))
            let removal = Task { try await a.directory.removeTerminal(s.id) }
            try await Task.sleep(for: .milliseconds(700))
            let sRotates = Task.detached {
                try server.psql(
                    [
                        """
                        SELECT fleet_rotate_data_key(2, '\(s.id.fleetText)', 'chosen by the thief',
                          '{"\(a.id.fleetText)": \(wrap), "\(b.id.fleetText)": \(wrap), "\(s.id.fleetText)": \(wrap)}'::jsonb,
                          '\\x\(String(repeating: "00", count: 32))', '[]'::jsonb)
                        """
                    ], as: s.role)
            }
            _ = try await holdingTheFeed.value
            try await removal.value
            await #expect(throws: (any Error).self) { _ = try await sRotates.value }
            #expect(try server.psql("SELECT count(*) FROM data_keys") == "1\n")
            #expect(try await owed(a) == "true/1")
            #expect(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)?.generation == 2)
            #expect(try server.psql("SELECT created_by FROM data_keys WHERE generation = 2") == "\(a.id.fleetText)\n")
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A removed terminal's unused join tokens die with it: nobody could admit with them.
    @Test func aRemovedTerminalsUnusedJoinTokens_areRefused() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let token = try await b.directory.issueJoinToken(by: b.id, lifetime: .seconds(600))
            try await a.directory.removeTerminal(b.id)
            let joiner = try await Terminal.make("joiner", on: server)
            await #expect(throws: FleetError.self) {
                try await joiner.directory.join(with: token, as: joiner.registration)
            }
            #expect(try server.psql("SELECT count(*) FROM terminals WHERE state = 'pending'") == "0\n")
            for terminal in fleet + [joiner] { await terminal.directory.close() }
        }
    }

    /// Publishing a generation out of turn (a skipped or repeated number) is refused, so
    /// generations stay dense and "every generation" is well defined for admission.
    @Test func aGenerationOutOfTurn_isRefused() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let a = fleet[0]
            // The directory refuses it, whatever the caller sends...
            let wrap = #"{"encapsulated":"AQ==","ciphertext":"Ag=="}"#
            let members = fleet.map { "\"\($0.id.fleetText)\": \(wrap)" }.joined(separator: ", ")
            for generation in [1, 3] {
                do {
                    try server.psql(
                        [
                            """
                            SELECT fleet_rotate_data_key(\(generation), '\(a.id.fleetText)', 'test', '{\(members)}'::jsonb,
                              '\\x\(String(repeating: "00", count: 32))', '[]'::jsonb)
                            """
                        ], as: a.role)
                    Issue.record("generation \(generation) was published out of turn")
                } catch {
                    #expect("\(error)".contains("is not the next one"), "\(error)")
                }
            }
            // ... and a member does not make one: it has no generation before it to MAC it with.
            for generation: Int32 in [1, 3] {
                await #expect(throws: FleetError.self) {
                    try await a.directory.rotateDataKey(
                        to: .random(generation: generation), by: a.id, publicKey: a.keys.publicKey, reason: "test")
                }
            }
            #expect(try server.psql("SELECT count(*) FROM data_keys") == "1\n")
            // Version 2's single-generation admission refuses since migration 4, naming the upgrade.
            do {
                try server.psql(
                    "SELECT fleet_admit(gen_random_uuid(), gen_random_uuid(), '\\x00', 1, '\\x00', '\\x00')",
                    as: a.role)
                Issue.record("fleet_admit admitted without an admission MAC")
            } catch {
                #expect("\(error)".contains("upgrade it"), "\(error)")
            }
            for terminal in fleet { await terminal.directory.close() }
        }
    }
}
