import Crypto
import Foundation
import Logging
import Testing

@testable import KioskAuthFleet
@testable import KioskAuthFleetDirectory

@Suite(.serialized, requiresPostgres) struct FleetSecurityTests {
    /// A thief with a pg_dump of the directory finds ciphertext only: neither the template's
    /// bytes nor the verifier's, in raw, hex or base64 form.
    @Test func stolenDump_holdsNoTemplateOrVerifierPlaintext() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(2, on: server)
            let a = fleet[0]
            let keyring = try await a.keyring()
            let nurse = UUID()
            let template = UUID()
            let templateBytes = Array("FP3\u{1}".utf8) + (0..<512).map { _ in UInt8.random(in: 0...255) }
            let verifierBytes = Array(
                "$argon2id$v=19$m=65536,t=3,p=1$\(Data((0..<16).map { _ in UInt8.random(in: 0...255) }).base64EncodedString())$\(Data((0..<32).map { _ in UInt8.random(in: 0...255) }).base64EncodedString())"
                    .utf8)
            let sealedTemplate = try keyring.seal(templateBytes, binding: .template(template, person: nurse))
            let sealedVerifier = try keyring.seal(verifierBytes, binding: .verifier(person: nurse))
            try await a.directory.push(
                PushBatch(
                    idempotencyKey: UUID(), terminal: a.id,
                    writes: [
                        person(nurse, name: "nurse.jones"), .verifier(person: nurse, sealed: sealedVerifier),
                        .template(
                            id: template, person: nurse, finger: "right-index", driver: "virtual_image",
                            deviceType: "image", sealed: sealedTemplate),
                    ]))

            let dump = try server.dump()
            let text = String(decoding: dump, as: UTF8.self)
            // The control: the dump is the real thing, with the person and the ciphertexts in it.
            #expect(text.contains("nurse.jones"))
            #expect(text.contains(hex(sealedTemplate.bytes)))
            #expect(text.contains(hex(sealedVerifier.bytes)))
            for secret in [templateBytes, verifierBytes] {
                #expect(dump.range(of: Data(secret)) == nil)
                #expect(!text.contains(hex(secret)))
                #expect(!text.contains(Data(secret).base64EncodedString()))
                // Not even a 16-byte stretch of it.
                #expect(!text.contains(hex(Array(secret[(secret.count / 2)..<(secret.count / 2 + 16)]))))
            }
            // The verifier's distinctive prefix is sealed too.
            #expect(!text.contains("argon2id"))

            // A member terminal, with its own key, does open what it pulls.
            let b = fleet[1]
            let pulled = try await b.directory.pull(after: 0)
            let templateChange = try #require(pulled.first { $0.entity == "templates" })
            #expect(templateChange.fields["driver"] == "virtual_image")
            let opened = try await b.keyring().open(
                try #require(templateChange.sealedBlob), binding: .template(template, person: nurse))
            #expect(opened == templateBytes)
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// Guesses spread over three terminals: synced before each guess they stop at the policy's
    /// hard lock (10) fleet-wide; cut off, each has only its local budget (3 × 10), and once
    /// they reconnect every terminal sees the person locked.
    @Test func passcodeGuessesOverThreeTerminals_stopAtTheFleetWideBound() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let budget = FleetPasscodeBudget()
            let target = UUID()
            try await fleet[0].directory.push(
                PushBatch(idempotencyKey: UUID(), terminal: fleet[0].id, writes: [person(target)]))

            // Connected: each guess is at the next terminal, which reads the fleet sum first.
            var guesses = 0
            var refusedInARow = 0
            var turn = 0
            while refusedInARow < fleet.count {
                let terminal = fleet[turn % fleet.count]
                turn += 1
                let sum = try await terminal.directory.fleetPasscodeFailures(person: target)
                guard budget.mayAttempt(fleetSum: sum, unpushedLocal: 0) else {
                    refusedInARow += 1
                    continue
                }
                refusedInARow = 0
                guesses += 1
                try await terminal.directory.push(
                    PushBatch(
                        idempotencyKey: UUID(), terminal: terminal.id,
                        writes: [.passcodeFailures(person: target, count: 1)]))
            }
            #expect(guesses == budget.hardLockAfter)
            #expect(try await fleet[2].directory.fleetPasscodeFailures(person: target) == 10)
            // The lockout row reaches every terminal through the feed.
            let lockout = try await fleet[1].directory.pull(after: 0).last { $0.entity == "person_lockout" }
            #expect(lockout?.fields["fleet_failures"] == "10")

            // A reset (a successful passcode, an admin) clears the count everywhere.
            try await fleet[0].directory.push(
                PushBatch(idempotencyKey: UUID(), terminal: fleet[0].id, writes: [.passcodeReset(person: target)]))
            #expect(try await fleet[1].directory.fleetPasscodeFailures(person: target) == 0)

            // Partitioned: each terminal counts locally only, from the sum it last knew (0).
            var queued: [UUID: Int] = [:]
            for terminal in fleet {
                while budget.mayAttempt(fleetSum: 0, unpushedLocal: queued[terminal.id, default: 0]) {
                    queued[terminal.id, default: 0] += 1
                }
            }
            #expect(queued.values.reduce(0, +) == budget.worstCaseGuessesPartitioned(terminals: 3))
            // Reconnected: the queued failures are pushed, and every terminal is locked.
            for terminal in fleet {
                try await terminal.directory.push(
                    PushBatch(
                        idempotencyKey: UUID(), terminal: terminal.id,
                        writes: [.passcodeFailures(person: target, count: Int32(queued[terminal.id]!))]))
            }
            for terminal in fleet {
                let sum = try await terminal.directory.fleetPasscodeFailures(person: target)
                #expect(sum == 30)
                #expect(!budget.mayAttempt(fleetSum: sum, unpushedLocal: 0))
            }
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// A removed terminal cannot push, loses its wrapped keys, and cannot open what is sealed
    /// after the rotation; the remaining members can.
    @Test func removedTerminal_isLockedOutOfWhatIsWrittenAfter() async throws {
        try await TestPostgres.with { server in
            let (fleet, _) = try await makeFleet(3, on: server)
            let (a, b, c) = (fleet[0], fleet[1], fleet[2])
            let stolenKeyring = try await c.keyring()
            try await a.directory.removeTerminal(c.id)
            try await a.directory.rotateDataKey(
                to: .random(generation: 2), by: a.id, publicKey: a.keys.publicKey, reason: "terminal removed")
            await #expect(throws: FleetError.self) {
                try await c.directory.push(PushBatch(idempotencyKey: UUID(), terminal: c.id, writes: [person()]))
            }
            #expect(try await c.directory.wrappedDataKeys(for: c.id).isEmpty)
            let keyring = try await a.keyring()
            #expect(keyring.currentGeneration == 2)
            let nurse = UUID()
            let sealed = try keyring.seal(Array("new verifier".utf8), binding: .verifier(person: nurse))
            #expect(sealed.generation == 2)
            #expect(try await b.keyring().open(sealed, binding: .verifier(person: nurse)) == Array("new verifier".utf8))
            #expect(throws: FleetError.self) { try stolenKeyring.open(sealed, binding: .verifier(person: nurse)) }
            for terminal in fleet { await terminal.directory.close() }
        }
    }

    /// TLS required means required: a server that does not speak TLS gets no plain-text
    /// session, even on loopback; plain text to loopback works when asked for.
    @Test func requiredTLS_isNotDowngradedByAServerWithoutIt() async throws {
        try await TestPostgres.with { server in
            let tls = try FleetEndpoint(
                transport: .tcp(host: "127.0.0.1", port: server.port), security: .tls(rootCertificatePath: nil),
                username: TestPostgres.superuser, database: "postgres")
            await #expect(throws: FleetError.self) {
                _ = try await FleetDirectory.connect(to: tls, password: nil, logger: testLogger)
            }
            let plain = try FleetEndpoint(
                url: "postgres://\(TestPostgres.superuser)@127.0.0.1:\(server.port)/postgres?sslmode=disable")
            let directory = try await FleetDirectory.connect(to: plain, password: nil, logger: testLogger)
            #expect(try await directory.migrate() == FleetMigration.latestVersion)
            await directory.close()
        }
    }
}
