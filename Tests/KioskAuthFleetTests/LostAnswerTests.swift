import Crypto
import Foundation
import Synchronization
import Testing

@testable import KioskAuthFleet
@testable import KioskAuthFleetDirectory

/// `fleet create` and `fleet join` whose statement committed but whose answer never reached the
/// terminal (or whose terminal stopped before recording it): the same terminal asking again
/// finds its own earlier attempt; nobody else's row passes for it (docs/fleet.md §6.1).
@Suite(.serialized, requiresPostgres) struct LostAnswerTests {
    @Test func aBootstrapAskedAgainWithItsOwnWrappedKey_resumes_andNoOtherKeyOrTerminalDoes() async throws {
        try await TestPostgres.with { server in
            let a = try await Terminal.make("a", on: server)
            let dataKey = FleetDataKey.random(generation: 1)
            let sent = try WrappedDataKey.wrap(dataKey, to: a.keys.publicKey, terminalID: a.id)
            #expect(try await a.directory.bootstrap(a.registration, dataKey: dataKey, wrapped: sent) == .applied)

            // The answer was lost: a new connection asks again with the same bytes.
            let again = try await server.connect(as: a.role)
            // (Failures are recorded rather than thrown, so every connection is closed at the end.)
            let resumed = try? await again.bootstrap(a.registration, dataKey: dataKey, wrapped: sent)
            #expect(resumed == .resumed)
            // It holds the fleet's key: it opens what the first connection seals.
            let sealed = try FleetKeyring([dataKey]).seal(Array("v".utf8), binding: .verifier(person: a.id))
            #expect(try await a.keyring().open(sealed, binding: .verifier(person: a.id)) == Array("v".utf8))

            // The same terminal with another key (a later attempt's, or one a directory writer
            // wrapped to its public key) is not the fleet's creator.
            let other = FleetDataKey.random(generation: 1)
            let otherSent = try WrappedDataKey.wrap(other, to: a.keys.publicKey, terminalID: a.id)
            let refused = await #expect(throws: FleetError.self) {
                try await again.bootstrap(a.registration, dataKey: other, wrapped: otherSent)
            }
            #expect(refused?.code == .conflict)

            // Another terminal's role sending A's very registration and bytes is refused too.
            let b = try await Terminal.make("b", on: server)
            let impostor = await #expect(throws: FleetError.self) {
                try await b.directory.bootstrap(a.registration, dataKey: dataKey, wrapped: sent)
            }
            #expect(impostor?.code == .conflict)

            // A directory writer who replaced A's wrapped key (with one of their own, to A's
            // public key) does not get A's retry to take it.
            try server.psql(
                """
                UPDATE wrapped_keys SET encapsulated_key = '\\x\(hex(otherSent.encapsulatedKey))',
                                        ciphertext = '\\x\(hex(otherSent.ciphertext))'
                WHERE terminal_id = '\(a.id.fleetText)'
                """)
            let swapped = await #expect(throws: FleetError.self) {
                try await again.bootstrap(a.registration, dataKey: dataKey, wrapped: sent)
            }
            #expect(swapped?.code == .conflict)
            #expect(try server.psql("SELECT count(*) FROM terminals") == "1\n")
            for directory in [a.directory, b.directory, again] { await directory.close() }
        }
    }

    @Test func aJoinAskedAgainByTheSameTerminalWithTheSameToken_resumes_andNoOtherDoes() async throws {
        try await TestPostgres.with { server in
            let (fleet, dataKey) = try await makeFleet(1, on: server)
            let a = fleet[0]
            let token = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            let c = try await Terminal.make("c", on: server)
            let first = try await c.directory.join(with: token, as: c.registration)
            #expect(first.outcome == .applied && first.state == "pending")

            // The answer was lost: C asks again, on a new connection, with the same id and token.
            let again = try await server.connect(as: c.role)
            // (Failures are recorded rather than thrown, so every connection is closed at the end.)
            let resumed = try? await again.join(with: token, as: c.registration)
            #expect(resumed?.outcome == .resumed && resumed?.state == "pending")
            // Admitted meanwhile: asking again finds it a member.
            #expect(try await a.directory.admit(joinedWith: token, dataKey: dataKey) == c.id)
            let admitted = try? await again.join(with: token, as: c.registration)
            #expect(admitted?.outcome == .resumed && admitted?.state == "member")

            // The same role under another terminal id: refused (the role has its terminal).
            var renamed = c.registration
            renamed.id = UUID()
            let otherID = await #expect(throws: FleetError.self) { try await again.join(with: token, as: renamed) }
            #expect(otherID?.code == .conflict)
            // Another terminal (its own role) with C's token and C's registration: the token is used.
            let d = try await Terminal.make("d", on: server)
            let otherRole = await #expect(throws: FleetError.self) {
                try await d.directory.join(with: token, as: c.registration)
            }
            #expect(otherRole?.code == .joinRefused)
            // C again with another token of A's: refused, and the token stays unused.
            let second = try await a.directory.issueJoinToken(by: a.id, lifetime: .seconds(600))
            let otherToken = await #expect(throws: FleetError.self) {
                try await again.join(with: second, as: c.registration)
            }
            #expect(otherToken?.code == .conflict)
            let unused =
                "SELECT count(*) FROM join_tokens WHERE token_id = '\(second.id.fleetText)' AND used_at IS NULL"
            #expect(try server.psql(unused) == "1\n")
            for directory in [a.directory, c.directory, d.directory, again] { await directory.close() }
        }
    }

    /// A call made on a connection the server has closed fails at once, saying nothing was sent,
    /// instead of waiting for an answer that never comes: PostgresNIO drops a statement written
    /// to a closed connection, and the terminal would wait out its whole deadline.
    @Test func aCallOnAConnectionTheServerClosed_failsAtOnce_havingSentNothing() async throws {
        try await TestPostgres.with { server in
            let a = try await Terminal.make("a", on: server)
            try server.psql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '\(a.role)'")
            let deadline = ContinuousClock.now + .seconds(10)
            while !a.directory.isClosed, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
            #expect(a.directory.isClosed)

            let probe = FleetSendProbe()
            let started = ContinuousClock.now
            // Not awaited: without the check, this call would never end.
            let ended = Mutex<FleetError??>(nil)
            Task {
                let error = await FleetSendProbe.$current.withValue(probe) { () async -> FleetError? in
                    do {
                        _ = try await a.directory.terminals()
                        return nil
                    } catch { return error as? FleetError }
                }
                ended.withLock { $0 = .some(error) }
            }
            while ended.withLock({ $0 == nil }), ContinuousClock.now - started < .seconds(5) {
                try await Task.sleep(for: .milliseconds(20))
            }
            let outcome = ended.withLock { $0 } ?? nil
            #expect(outcome?.isClosedBeforeSending == true, "no error within 5 s: the call hangs")
            #expect(outcome?.code == .directoryUnavailable)
            #expect(!probe.anySent)
            #expect(ContinuousClock.now - started < .seconds(5))
            await a.directory.close()
        }
    }
}
