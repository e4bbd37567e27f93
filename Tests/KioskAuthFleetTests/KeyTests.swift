import Foundation
import KioskAuthFleet
import Testing

@Suite struct KeyTests {
    @Test func wrappedDataKey_opensOnlyWithItsTerminalsKey() throws {
        let mine = TerminalKeyPair.generate()
        let other = TerminalKeyPair.generate()
        let terminal = UUID()
        let dataKey = FleetDataKey.random(generation: 1)
        let wrapped = try WrappedDataKey.wrap(dataKey, to: mine.publicKey, terminalID: terminal)

        let opened = try wrapped.unwrap(with: mine)
        #expect(opened.generation == 1)
        // What the key seals, the unwrapped key opens: it is the same key.
        let sealed = try FleetKeyring([dataKey]).seal(Array("print".utf8), binding: .verifier(person: terminal))
        #expect(try FleetKeyring([opened]).open(sealed, binding: .verifier(person: terminal)) == Array("print".utf8))

        // Another terminal's private key does not open it.
        #expect(throws: FleetError.self) { try wrapped.unwrap(with: other) }
        // Nor does the row relabelled as the other terminal's, or as another generation.
        var relabelled = wrapped
        relabelled.terminalID = UUID()
        #expect(throws: FleetError.self) { try relabelled.unwrap(with: mine) }
        relabelled = wrapped
        relabelled.generation = 2
        #expect(throws: FleetError.self) { try relabelled.unwrap(with: mine) }
    }

    @Test func terminalKey_roundTripsThroughItsCredentialBytes() throws {
        let pair = TerminalKeyPair.generate()
        let reread = try TerminalKeyPair(credential: pair.credentialBytes)
        #expect(reread.publicKey == pair.publicKey)
        #expect(throws: FleetError.self) { try TerminalKeyPair(credential: [UInt8](repeating: 1, count: 31)) }
    }

    @Test func sealedTemplate_opensOnlyInItsOwnCellUnderItsGeneration() throws {
        let person = UUID()
        let template = UUID()
        let plaintext = Array("template bytes".utf8)
        let generation1 = FleetDataKey.random(generation: 1)
        let keyring = FleetKeyring([generation1])
        let sealed = try keyring.seal(plaintext, binding: .template(template, person: person))
        #expect(sealed.generation == 1)
        #expect(try keyring.open(sealed, binding: .template(template, person: person)) == plaintext)

        // Copied to another person's row or another template: refused.
        #expect(throws: FleetError.self) { try keyring.open(sealed, binding: .template(template, person: UUID())) }
        #expect(throws: FleetError.self) { try keyring.open(sealed, binding: .template(UUID(), person: person)) }
        #expect(throws: FleetError.self) { try keyring.open(sealed, binding: .verifier(person: person)) }
        // One byte edited: refused.
        var edited = sealed
        edited.bytes[20] ^= 1
        #expect(throws: FleetError.self) { try keyring.open(edited, binding: .template(template, person: person)) }
        // Relabelled as another generation: refused, even by a keyring that holds both.
        var both = keyring
        both.add(FleetDataKey.random(generation: 2))
        var relabelled = sealed
        relabelled.generation = 2
        #expect(throws: FleetError.self) { try both.open(relabelled, binding: .template(template, person: person)) }
        // A keyring without generation 1 (a terminal removed before it) cannot open it.
        let later = FleetKeyring([FleetDataKey.random(generation: 2)])
        #expect(throws: FleetError.self) { try later.open(sealed, binding: .template(template, person: person)) }
        // After rotation new values are sealed under the newest generation.
        #expect(try both.seal(plaintext, binding: .verifier(person: person)).generation == 2)
    }

    @Test func passcodeBudget_worstCaseFormulas() {
        let budget = FleetPasscodeBudget()
        #expect(budget.attemptsWithoutWaiting == 3)
        #expect(budget.worstCaseGuessesPartitioned(terminals: 3) == 30)
        #expect(budget.worstCaseGuessesConnected(terminals: 3, propagationSeconds: 5) == 19)
        // A propagation slower than the first wait gives no better bound than partition.
        #expect(budget.worstCaseGuessesConnected(terminals: 3, propagationSeconds: 60) == 30)
        #expect(budget.worstCaseGuessesConnected(terminals: 1, propagationSeconds: 5) == 10)
        #expect(budget.mayAttempt(fleetSum: 7, unpushedLocal: 2))
        #expect(!budget.mayAttempt(fleetSum: 7, unpushedLocal: 3))
        #expect(budget.delay(afterFailures: 3) == 60)
        #expect(budget.delay(afterFailures: 40) == 1800)
    }
}

@Suite struct EndpointTests {
    @Test func plaintextToAnotherHost_isRefusedBeforeConnecting() throws {
        #expect(throws: FleetError.self) {
            try FleetEndpoint(url: "postgres://kiosk@directory.clinic.example/fleet?sslmode=disable")
        }
        #expect(throws: FleetError.self) { try FleetEndpoint(url: "postgres://kiosk@10.0.0.5/fleet?sslmode=disable") }
        #expect(throws: FleetError.self) {
            try FleetEndpoint(url: "postgres://kiosk@127.0.0.1.example/fleet?sslmode=disable")
        }
        #expect(throws: FleetError.self) {
            try FleetEndpoint(
                transport: .tcp(host: "192.0.2.1", port: 5432), security: .plaintext, username: "kiosk",
                database: "fleet")
        }
    }

    @Test func tlsIsTheDefault_andPlaintextOnlyLocally() throws {
        let remote = try FleetEndpoint(url: "postgres://kiosk@directory.clinic.example:6432/fleet")
        #expect(remote.transport == .tcp(host: "directory.clinic.example", port: 6432))
        #expect(remote.security == .tls(rootCertificatePath: nil))
        let loopback = try FleetEndpoint(url: "postgres://kiosk@127.0.0.1/fleet?sslmode=disable")
        #expect(loopback.security == .plaintext)
        let socket = try FleetEndpoint(url: "postgres://kiosk@/fleet?host=/run/postgresql")
        #expect(socket.transport == .unixSocket(path: "/run/postgresql/.s.PGSQL.5432"))
        #expect(socket.security == .plaintext)
        #expect(throws: FleetError.self) { try FleetEndpoint(url: "postgres://kiosk:secret@127.0.0.1/fleet") }
        #expect(throws: FleetError.self) { try FleetEndpoint(url: "postgres://kiosk@127.0.0.1/fleet?sslmode=allow") }
    }

    @Test func joinToken_textRoundTrips_andNeverPrintsItsSecret() throws {
        #expect(throws: FleetError.self) { try JoinToken(text: "kat1.not-a-uuid.abc") }
        #expect(throws: FleetError.self) { try JoinToken(text: "kat2.\(UUID().uuidString).AAAA") }
    }
}
