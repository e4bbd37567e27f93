import Crypto
import Foundation
import Testing

@testable import KioskAuthFleet
@testable import KioskAuthFleetDirectory

/// docs/fleet.md §6.2: a directory writer (here the test's superuser, who can write any row)
/// cannot make members take a data key it knows, nor get a rotation wrapped to itself. Each
/// attack is what the review described; each succeeded before migration 4.
@Suite(.serialized, requiresPostgres) struct KeyAuthenticationTests {
    /// Inserts `key` as a generation, wrapped to each of `terminals`, the way a writer with
    /// the members' public keys (they are in the directory) would.
    func forge(_ key: FleetDataKey, to terminals: [Terminal], on server: TestPostgres, chainMAC: Data? = nil) throws {
        var statements = [
            """
            INSERT INTO data_keys (generation, created_by, reason, chain_mac)
            VALUES (\(key.generation), NULL, 'made by a directory writer', \(chainMAC.map { "'\\x\(hex(Array($0)))'" } ?? "NULL"))
            """
        ]
        for terminal in terminals {
            let wrapped = try WrappedDataKey.wrap(key, to: terminal.keys.publicKey, terminalID: terminal.id)
            statements.append(
                """
                INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                VALUES ('\(terminal.id.fleetText)', \(key.generation), '\\x\(hex(wrapped.encapsulatedKey))',
                        '\\x\(hex(wrapped.ciphertext))')
                """)
        }
        _ = try server.psql(statements, as: TestPostgres.superuser)
    }

    @Test func aGenerationTheDirectoryWrapsToEveryMember_isRefused_andRowsMACedUnderItAreNotTrusted() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let forged = FleetDataKey.random(generation: 2)
            // With a chain MAC too, made under a key the writer knows (not generation 1).
            try forge(
                forged, to: [a, b], on: server,
                chainMAC: FleetKeyAuthentication.chainMAC(of: forged, under: .random(generation: 1)))

            let refused = await #expect(throws: FleetError.self) { try await b.keyring() }
            #expect(refused?.code == .integrity)
            #expect("\(refused.map { "\($0)" } ?? "")".contains("generation 2"))
            // What the daemon runs on each delivery: generation 1 stays, 2 is refused.
            let delivery = try await b.directory.keyDelivery(for: b.id)
            let acceptance = FleetKeyAuthentication.accept(
                delivery, keyPair: b.keys, terminal: b.id, held: [try #require(try await heldKey(b, 1))],
                joinSecret: nil)
            #expect(acceptance.accepted.isEmpty)
            #expect(acceptance.keys.map(\.generation) == [1])
            #expect(acceptance.refused.map(\.generation) == [2])

            // The writer MACs a people row under its generation (through a member's role, as a
            // superuser can): B does not trust it.
            let writer = try await server.connect(as: a.role)
            await writer.useKeyring(FleetKeyring([forged]))
            let intruder = UUID()
            try await writer.push(PushBatch(idempotencyKey: UUID(), terminal: a.id, writes: [person(intruder)]))
            let row = try #require(try await b.directory.pull(after: 0).last { $0.key == intruder.fleetText })
            #expect(!row.isTrusted)
            for directory in [a.directory, b.directory, writer] { await directory.close() }
        }
    }

    /// The key this terminal holds for generation `generation`, from its directory's keyring.
    func heldKey(_ terminal: Terminal, _ generation: Int32) async throws -> FleetDataKey? {
        await terminal.directory.heldKey(generation: generation)
    }

    @Test func aHeldGenerationTheDirectoryRewraps_isRefused_andTheHeldKeyKept() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let b = fleet[1]
            let sealed = try await b.keyring().seal(Array("kept".utf8), binding: .verifier(person: b.id))
            let replacement = try WrappedDataKey.wrap(
                .random(generation: 1), to: b.keys.publicKey, terminalID: b.id)
            try server.psql(
                """
                UPDATE wrapped_keys SET encapsulated_key = '\\x\(hex(replacement.encapsulatedKey))',
                       ciphertext = '\\x\(hex(replacement.ciphertext))'
                WHERE terminal_id = '\(b.id.fleetText)' AND generation = 1
                """)
            await #expect(throws: FleetError.self) { try await b.keyring() }
            // The directory's keyring is still the held one.
            let held = try #require(try await heldKey(b, 1))
            #expect(try FleetKeyring([held]).open(sealed, binding: .verifier(person: b.id)) == Array("kept".utf8))
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A held generation above 1, listed with another key that even carries a genuine chain MAC
    /// (the test knows generation 1, as a member gone bad would): refused, because the
    /// generation is held. And a generation the writer deletes is not minted again: the member
    /// refuses to rotate while the directory's newest is below what it holds (it would have
    /// MACed its own rows under a key no other member has).
    @Test func aHeldGenerationWithAGenuineChainMAC_isStillRefused_andALostGenerationIsNotMintedAgain() async throws {
        try await TestPostgres.with { server in
            let (fleet, firstKey) = try await makeFleet(3, on: server)
            let (a, b, c) = (fleet[0], fleet[1], fleet[2])
            try await a.directory.removeTerminal(c.id)
            #expect(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)?.generation == 2)
            #expect(try await b.keyring().currentGeneration == 2)
            let other = FleetDataKey.random(generation: 2)
            let rewrapped = try WrappedDataKey.wrap(other, to: b.keys.publicKey, terminalID: b.id)
            let chain = FleetKeyAuthentication.chainMAC(of: other, under: firstKey)
            try server.psql(
                """
                UPDATE data_keys SET chain_mac = '\\x\(hex(Array(chain)))' WHERE generation = 2;
                UPDATE wrapped_keys SET encapsulated_key = '\\x\(hex(rewrapped.encapsulatedKey))',
                       ciphertext = '\\x\(hex(rewrapped.ciphertext))'
                WHERE terminal_id = '\(b.id.fleetText)' AND generation = 2
                """)
            let refused = await #expect(throws: FleetError.self) { try await b.keyring() }
            #expect("\(refused.map { "\($0)" } ?? "")".contains("another key for generation 2"))

            try server.psql(
                """
                DELETE FROM wrapped_keys WHERE generation = 2; DELETE FROM data_keys WHERE generation = 2;
                UPDATE terminals SET rekey_due = true WHERE terminal_id = '\(c.id.fleetText)'
                """)
            let notAgain = await #expect(throws: FleetError.self) {
                _ = try await b.directory.rotateDataKeyIfDue(by: b.id, publicKey: b.keys.publicKey)
            }
            #expect(notAgain?.code == .integrity)
            #expect(try server.psql("SELECT max(generation) FROM data_keys") == "1\n")
            #expect(await b.directory.heldKey(generation: 2) != nil)
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A removed terminal's vouch, put back by a writer with its row, is worth nothing: the
    /// member that removed it leaves it out of the rotation it owes whatever the directory says,
    /// and any later rotation counts only vouches under the newest generation (each rotation
    /// renews the vouches of the members it wraps to).
    @Test func aRemovedTerminalsVouchPutBack_getsNoRotation() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let (a, b, c) = (fleet[0], fleet[1], fleet[2])
            let saved = try server.psql(
                "SELECT vouch_generation || ' ' || encode(vouch_mac, 'hex') FROM terminals WHERE terminal_id = '\(c.id.fleetText)'"
            ).split(separator: " ").map { String($0).trimmingCharacters(in: .whitespacesAndNewlines) }
            let putBack = """
                UPDATE terminals SET state = 'member', rekey_due = true, vouch_generation = \(saved[0]),
                       vouch_mac = '\\x\(saved[1])'
                WHERE terminal_id = '\(c.id.fleetText)'
                """
            try await a.directory.removeTerminal(c.id)
            // Before the rotation the removal owes: the remover leaves it out all the same.
            try server.psql(putBack)
            let first = try #require(
                try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey, excluding: [c.id]))
            #expect(first.unvouched == [c.id])
            #expect(try await c.directory.wrappedDataKeys(for: c.id).isEmpty)
            // Later, for another member's rotation: its vouch is under generation 1, no longer
            // the newest.
            try server.psql(putBack)
            #expect(try await b.keyring().currentGeneration == 2)
            let second = try #require(try await b.directory.rotateDataKeyIfDue(by: b.id, publicKey: b.keys.publicKey))
            #expect(second.generation == 3)
            #expect(second.unvouched == [c.id])
            #expect(try await c.directory.wrappedDataKeys(for: c.id).isEmpty)
            // A, whose vouch its own rotation to 2 renewed, is given generation 3.
            #expect(try await a.keyring().currentGeneration == 3)
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    @Test func aForgedAdmission_leavesTheNewcomerWithoutKeys_andOnlyTheRightSecretOpensARealOne() async throws {
        try await TestPostgres.with { server in
            let (fleet, dataKey) = try await makeFleet(1, on: server)
            let a = fleet[0]
            let token = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            let c = try await Terminal.make("c", on: server)
            try await c.directory.join(with: token, as: c.registration)
            // The writer admits C itself, with a generation 1 of its own and a made-up MAC.
            let own = FleetDataKey.random(generation: 1)
            let wrapped = try WrappedDataKey.wrap(own, to: c.keys.publicKey, terminalID: c.id)
            try server.psql(
                """
                UPDATE terminals SET state = 'member', admitted_through = 1,
                       admission_mac = '\\x\(hex(Array(SHA256.hash(data: Data("made up".utf8)))))'
                WHERE terminal_id = '\(c.id.fleetText)';
                INSERT INTO wrapped_keys (terminal_id, generation, encapsulated_key, ciphertext)
                VALUES ('\(c.id.fleetText)', 1, '\\x\(hex(wrapped.encapsulatedKey))', '\\x\(hex(wrapped.ciphertext))')
                """)
            let forgedAdmission = await #expect(throws: FleetError.self) { try await c.keyring(joinedWith: token) }
            #expect(forgedAdmission?.code == .integrity)
            // Even a MAC the writer computes right, but without the secret, is refused.
            try server.psql(
                """
                UPDATE terminals SET admission_mac = '\\x\(hex(Array(FleetKeyAuthentication.admissionMAC(joinSecret: Array(repeating: 0, count: 32), terminal: c.id, publicKey: c.keys.publicKey, keys: [own]))))'
                WHERE terminal_id = '\(c.id.fleetText)'
                """)
            await #expect(throws: FleetError.self) { try await c.keyring(joinedWith: token) }
            #expect(await c.directory.heldKey(generation: 1) == nil)

            // A real admission: the admitting member's MAC opens with the token's secret, and
            // with no other.
            try server.psql(
                """
                DELETE FROM wrapped_keys WHERE terminal_id = '\(c.id.fleetText)';
                UPDATE terminals SET state = 'pending', admission_mac = NULL, admitted_through = NULL
                WHERE terminal_id = '\(c.id.fleetText)'
                """)
            #expect(try await a.directory.admit(joinedWith: token, dataKey: dataKey) == c.id)
            let other = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            await #expect(throws: FleetError.self) { try await c.keyring(joinedWith: other) }
            await #expect(throws: FleetError.self) { try await c.keyring() }
            #expect(try await c.keyring(joinedWith: token).currentGeneration == 1)
            for directory in [a.directory, c.directory] { await directory.close() }
        }
    }

    @Test func aMemberRowTheDirectoryAdds_andAMemberWhoseKeyItSwaps_areLeftOutOfTheNextRotation() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(4, on: server)
            let (a, b, c, d) = (fleet[0], fleet[1], fleet[2], fleet[3])
            let writersKey = TerminalKeyPair.generate()
            let stranger = UUID()
            try server.psql(
                """
                INSERT INTO terminals (terminal_id, name, public_key, state, db_role, vouch_generation, vouch_mac)
                VALUES ('\(stranger.fleetText)', 'stranger', '\\x\(hex(writersKey.publicKey))', 'member', 'nobody', 1,
                        '\\x\(hex(Array(SHA256.hash(data: Data("made up".utf8)))))');
                UPDATE terminals SET public_key = '\\x\(hex(writersKey.publicKey))' WHERE terminal_id = '\(b.id.fleetText)'
                """)
            try await a.directory.removeTerminal(c.id)
            let rotation = try #require(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey))
            #expect(Set(rotation.unvouched) == [stranger, b.id])
            let wrappedTo = try server.psql(
                "SELECT terminal_id FROM wrapped_keys WHERE generation = 2 ORDER BY terminal_id::text")
            #expect(wrappedTo == [a.id, d.id].map(\.fleetText).sorted().map { $0 + "\n" }.joined())
            // D, vouched for when it was admitted, takes the new generation by its chain MAC.
            #expect(try await d.keyring().currentGeneration == 2)

            // The directory checks that a rotation names every member, given the key or left out.
            try await a.directory.removeTerminal(d.id)
            let wrap = #"{"encapsulated":"AQ==","ciphertext":"Ag=="}"#
            let forgotten = Result {
                try server.psql(
                    [
                        """
                        SELECT fleet_rotate_data_key(3, '\(a.id.fleetText)', 'test',
                          '{"\(a.id.fleetText)": \(wrap)}'::jsonb, '\\x\(String(repeating: "00", count: 32))',
                          '["\(stranger.fleetText)"]'::jsonb)
                        """
                    ], as: a.role)
            }
            #expect(throws: (any Error).self) { try forgotten.get() }
            if case .failure(let error) = forgotten { #expect("\(error)".contains("members changed"), "\(error)") }
            // The signature older daemons call refuses, naming the upgrade.
            let old = Result {
                try server.psql(
                    ["SELECT fleet_rotate_data_key(3, '\(a.id.fleetText)', 'test', '{}'::jsonb)"], as: a.role)
            }
            #expect(throws: (any Error).self) { try old.get() }
            #expect(try server.psql("SELECT max(generation) FROM data_keys") == "2\n")
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    @Test func aMemberRowWithoutAVouch_vouchesForItself_andNotForAKeyThatIsNotItsOwn() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let (a, b, c) = (fleet[0], fleet[1], fleet[2])
            // As a row from before migration 4.
            try server.psql(
                "UPDATE terminals SET vouch_generation = NULL, vouch_mac = NULL WHERE terminal_id = '\(b.id.fleetText)'"
            )
            #expect(try await b.directory.vouchForSelf(b.id, publicKey: b.keys.publicKey))
            // Nothing to do while the vouch opens; a vouch the writer clears is made again.
            #expect(try await !b.directory.vouchForSelf(b.id, publicKey: b.keys.publicKey))
            try server.psql("UPDATE terminals SET vouch_mac = NULL WHERE terminal_id = '\(b.id.fleetText)'")
            #expect(try await b.directory.vouchForSelf(b.id, publicKey: b.keys.publicKey))
            try await a.directory.removeTerminal(c.id)
            let rotation = try #require(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey))
            #expect(rotation.unvouched.isEmpty)
            #expect(try await b.keyring().currentGeneration == 2)

            // A row whose public key the directory swapped: the terminal refuses to vouch for it.
            let again = try await server.connect(as: b.role)
            await again.useKeyring(try await b.keyring())
            try server.psql(
                """
                UPDATE terminals SET public_key = '\\x\(hex(TerminalKeyPair.generate().publicKey))',
                       vouch_generation = NULL, vouch_mac = NULL
                WHERE terminal_id = '\(b.id.fleetText)'
                """)
            let swapped = await #expect(throws: FleetError.self) {
                try await again.vouchForSelf(b.id, publicKey: b.keys.publicKey)
            }
            #expect(swapped?.code == .integrity)
            for directory in [a.directory, b.directory, c.directory, again] { await directory.close() }
        }
    }

    /// The review's attack on the first version: the writer swaps the *rotating* member's own
    /// public key. The rotation used to be wrapped to whatever the directory listed for the
    /// rotator itself, with a genuine chain MAC that every other member then took. Now the
    /// rotator refuses to rotate; once its key is back, the rotation is made.
    @Test func theRotatorsOwnRowWithAnotherPublicKey_getsNoRotation() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let (a, b, c) = (fleet[0], fleet[1], fleet[2])
            let writersKey = TerminalKeyPair.generate()
            try await a.directory.removeTerminal(c.id)
            #expect(
                try server.psql("SELECT vouch_mac IS NULL FROM terminals WHERE terminal_id = '\(c.id.fleetText)'")
                    == "t\n")
            try server.psql(
                "UPDATE terminals SET public_key = '\\x\(hex(writersKey.publicKey))' WHERE terminal_id = '\(a.id.fleetText)'"
            )
            let refused = await #expect(throws: FleetError.self) {
                _ = try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)
            }
            #expect(refused?.code == .integrity)
            #expect(try server.psql("SELECT max(generation) FROM data_keys") == "1\n")
            #expect(await a.directory.heldKey(generation: 2) == nil)
            try server.psql(
                "UPDATE terminals SET public_key = '\\x\(hex(a.keys.publicKey))' WHERE terminal_id = '\(a.id.fleetText)'"
            )
            #expect(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)?.generation == 2)
            #expect(try await b.keyring().currentGeneration == 2)
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A wrapped key at a generation below 1 (the owner can drop the CHECK) is refused, and
    /// refusing it does no arithmetic that traps: `Int32.min - 1` used to stop the daemon at
    /// every sync.
    @Test func aWrappedKeyAtGenerationZeroOrInt32Min_isRefused_withoutATrap() throws {
        let keys = TerminalKeyPair.generate()
        let terminal = UUID()
        let held = FleetDataKey.random(generation: 1)
        var wrapped: [WrappedDataKey] = []
        for generation in [Int32.min, -1, 0] {
            wrapped.append(
                try WrappedDataKey.wrap(.random(generation: generation), to: keys.publicKey, terminalID: terminal))
        }
        for admission in [nil, (mac: Data(repeating: 0, count: 32), through: Int32(1))] {
            let acceptance = FleetKeyAuthentication.accept(
                FleetKeyDelivery(wrapped: wrapped, chainMACs: [:], admission: admission), keyPair: keys,
                terminal: terminal, held: admission == nil ? [held] : [], joinSecret: Array(repeating: 1, count: 32))
            #expect(acceptance.accepted.isEmpty)
            #expect(acceptance.refused.map(\.generation) == [Int32.min, -1, 0])
        }
    }

    /// The admission MAC binds the newcomer's id and public key: one made for another terminal
    /// (or another key) with the same secret and keys is refused.
    @Test func anAdmissionMACForAnotherTerminalOrKey_isRefused() throws {
        let keys = TerminalKeyPair.generate()
        let terminal = UUID()
        let secret = Array(repeating: UInt8(7), count: 32)
        let generation1 = FleetDataKey.random(generation: 1)
        let wrapped = try WrappedDataKey.wrap(generation1, to: keys.publicKey, terminalID: terminal)
        func accept(_ mac: Data) -> FleetKeyAcceptance {
            FleetKeyAuthentication.accept(
                FleetKeyDelivery(wrapped: [wrapped], chainMACs: [:], admission: (mac, 1)), keyPair: keys,
                terminal: terminal, held: [], joinSecret: secret)
        }
        let right = FleetKeyAuthentication.admissionMAC(
            joinSecret: secret, terminal: terminal, publicKey: keys.publicKey, keys: [generation1])
        #expect(accept(right).keys.map(\.generation) == [1])
        let otherTerminal = FleetKeyAuthentication.admissionMAC(
            joinSecret: secret, terminal: UUID(), publicKey: keys.publicKey, keys: [generation1])
        let otherKey = FleetKeyAuthentication.admissionMAC(
            joinSecret: secret, terminal: terminal, publicKey: TerminalKeyPair.generate().publicKey, keys: [generation1]
        )
        for mac in [otherTerminal, otherKey] {
            #expect(accept(mac).keys.isEmpty)
            #expect(accept(mac).refused.map(\.generation) == [1])
        }
    }

    /// A delivery listing one generation twice takes it from neither row, not even from the one
    /// its chain MAC covers: which row the directory meant is not for it to say.
    @Test func aGenerationListedTwice_isTakenFromNeitherRow() throws {
        let keys = TerminalKeyPair.generate()
        let terminal = UUID()
        let held = FleetDataKey.random(generation: 1)
        let next = FleetDataKey.random(generation: 2)
        let decoy = FleetDataKey.random(generation: 2)
        let wraps = try [next, decoy].map { try WrappedDataKey.wrap($0, to: keys.publicKey, terminalID: terminal) }
        let acceptance = FleetKeyAuthentication.accept(
            FleetKeyDelivery(
                wrapped: wraps, chainMACs: [2: FleetKeyAuthentication.chainMAC(of: decoy, under: held)], admission: nil),
            keyPair: keys, terminal: terminal, held: [held], joinSecret: nil)
        #expect(acceptance.accepted.isEmpty)
        #expect(acceptance.keys.map(\.generation) == [1])
        // Also when the other row does not open (wrapped to another key): still neither.
        let unopenable = try WrappedDataKey.wrap(decoy, to: TerminalKeyPair.generate().publicKey, terminalID: terminal)
        let withUnopenable = FleetKeyAuthentication.accept(
            FleetKeyDelivery(
                wrapped: [unopenable, wraps[1]],
                chainMACs: [2: FleetKeyAuthentication.chainMAC(of: decoy, under: held)],
                admission: nil),
            keyPair: keys, terminal: terminal, held: [held], joinSecret: nil)
        #expect(withUnopenable.keys.map(\.generation) == [1])
        // The row whose key the chain MAC covers, listed alone, is taken by it.
        let once = FleetKeyAuthentication.accept(
            FleetKeyDelivery(
                wrapped: [wraps[1]], chainMACs: [2: FleetKeyAuthentication.chainMAC(of: decoy, under: held)],
                admission: nil),
            keyPair: keys, terminal: terminal, held: [held], joinSecret: nil)
        #expect(once.keys.map(\.generation) == [1, 2])
    }

    /// A member that has not yet taken the generation a rotation just made keeps the vouch
    /// that rotation renewed for it: it does not write one under its older newest generation
    /// (which would have left it out of the next rotation), and the directory refuses a vouch
    /// under any generation but the newest.
    @Test func aMemberBehindARotation_keepsTheVouchTheRotationRenewed() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let (a, b, c) = (fleet[0], fleet[1], fleet[2])
            try await a.directory.removeTerminal(c.id)
            #expect(try await a.directory.rotateDataKeyIfDue(by: a.id, publicKey: a.keys.publicKey)?.generation == 2)
            let vouch = "SELECT vouch_generation FROM terminals WHERE terminal_id = '\(b.id.fleetText)'"
            #expect(try server.psql(vouch) == "2\n")
            // B still holds generation 1 only.
            #expect(await b.directory.heldKey(generation: 2) == nil)
            #expect(try await !b.directory.vouchForSelf(b.id, publicKey: b.keys.publicKey))
            #expect(try server.psql(vouch) == "2\n")
            let older = FleetKeyAuthentication.vouchMAC(
                terminal: b.id, publicKey: b.keys.publicKey,
                under: try #require(await b.directory.heldKey(generation: 1)))
            #expect(throws: (any Error).self) {
                try server.psql(
                    ["SELECT fleet_vouch('\(b.id.fleetText)', 1, '\\x\(hex(Array(older)))')"], as: b.role)
            }
            #expect(try server.psql(vouch) == "2\n")
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// `fleet_vouch` is for a terminal's own row: B's role vouching for A, a pending terminal
    /// vouching for itself, and a role outside kioskauth_terminal are each refused, and A's
    /// vouch is unchanged.
    @Test func fleetVouch_isOnlyForAMembersOwnRow() async throws {
        try await TestPostgres.with { server in
            let (fleet, dataKey) = try await makeFleet(2, on: server)
            let (a, b) = (fleet[0], fleet[1])
            let vouchOfA = "SELECT encode(vouch_mac, 'hex') FROM terminals WHERE terminal_id = '\(a.id.fleetText)'"
            let before = try server.psql(vouchOfA)
            let forA = FleetKeyAuthentication.vouchMAC(terminal: a.id, publicKey: b.keys.publicKey, under: dataKey)
            let asB = Result {
                try server.psql(["SELECT fleet_vouch('\(a.id.fleetText)', 1, '\\x\(hex(Array(forA)))')"], as: b.role)
            }
            if case .failure(let error) = asB {
                #expect("\(error)".contains("does not belong to role"), "\(error)")
            } else {
                Issue.record("B's role vouched for A")
            }
            let token = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            let c = try await Terminal.make("c", on: server)
            try await c.directory.join(with: token, as: c.registration)
            let forC = FleetKeyAuthentication.vouchMAC(terminal: c.id, publicKey: c.keys.publicKey, under: dataKey)
            let pending = Result {
                try server.psql(["SELECT fleet_vouch('\(c.id.fleetText)', 1, '\\x\(hex(Array(forC)))')"], as: c.role)
            }
            if case .failure(let error) = pending {
                #expect("\(error)".contains("not a fleet member"), "\(error)")
            } else {
                Issue.record("a pending terminal vouched for itself")
            }
            try server.psql("CREATE ROLE vouch_outsider LOGIN")
            #expect(throws: (any Error).self) {
                try server.psql(
                    ["SELECT fleet_vouch('\(a.id.fleetText)', 1, '\\x\(hex(Array(forA)))')"], as: "vouch_outsider")
            }
            #expect(try server.psql(vouchOfA) == before)
            for directory in [a.directory, b.directory, c.directory] { await directory.close() }
        }
    }
}
