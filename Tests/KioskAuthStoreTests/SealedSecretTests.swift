import Foundation
import KioskAuthCore
import KioskAuthStore
import Testing

@Suite("Passcode verifiers")
struct PasscodeVerifierTests {
    @Test func verifier_matchesTheRightCode_andNoOther() throws {
        let verifier = try PasscodeVerifier.make(passcode: "480213", parameters: testHashParameters)
        #expect(try verifier.matches("480213"))
        #expect(try !verifier.matches("480214"))
        #expect(try !verifier.matches("4802130"))
        #expect(try !verifier.matches(""))
        #expect(verifier.algorithm == "argon2id")
        #expect(verifier.parameters == testHashParameters)
    }

    @Test func sameCode_getsAFreshSalt_andSoADifferentHash() throws {
        let a = try PasscodeVerifier.make(passcode: "480213", parameters: testHashParameters)
        let b = try PasscodeVerifier.make(passcode: "480213", parameters: testHashParameters)
        #expect(a.salt != b.salt)
        #expect(a.hash != b.hash)
    }

    @Test func verifier_ofAnUnknownAlgorithm_isAnIntegrityFailure() throws {
        var verifier = try PasscodeVerifier.make(passcode: "480213", parameters: testHashParameters)
        verifier.algorithm = "md5"
        #expect(storeErrorCode { _ = try verifier.matches("480213") } == .integrity)
    }

    @Test func storedVerifier_roundTrips_andStillMatches() throws {
        let fixture = try StoreFixture()
        let made = try PasscodeVerifier.make(passcode: "480213", parameters: testHashParameters)
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            #expect(try store.passcodeVerifier(for: sarah) == nil)
            try store.setPasscodeVerifier(made, for: sarah, now: testNow)
        }
        try fixture.withStore { store throws in
            let sarah = try #require(try store.person(named: LoginName("sarah")))
            #expect(sarah.hasPasscode)
            let read = try #require(try store.passcodeVerifier(for: sarah))
            #expect(read == made)
            #expect(try read.matches("480213"))
            #expect(try !read.matches("480212"))
        }
    }

    @Test func verifierMadeWithOtherParameters_keepsThemAndStillVerifies() throws {
        let fixture = try StoreFixture()
        let stronger = PasscodeHashParameters(memoryKiB: 2048, iterations: 2, parallelism: 2)
        try fixture.withStore { store throws in
            try store.setTestPasscode("480213", for: try store.addTestPerson("sarah"))
            try store.setPasscodeVerifier(
                PasscodeVerifier.make(passcode: "917362", parameters: stronger), for: try store.addTestPerson("ben"),
                now: testNow)
        }
        try fixture.withStore { store throws in
            let sarahPerson = try #require(try store.person(named: LoginName("sarah")))
            let benPerson = try #require(try store.person(named: LoginName("ben")))
            let sarah = try #require(try store.passcodeVerifier(for: sarahPerson))
            let ben = try #require(try store.passcodeVerifier(for: benPerson))
            #expect(sarah.parameters == testHashParameters)
            #expect(ben.parameters == stronger)
            #expect(try sarah.matches("480213"))
            #expect(try ben.matches("917362"))
            #expect(try !ben.matches("480213"))
        }
    }

    @Test func settingAPasscodeAgain_replacesTheOldOne() throws {
        let fixture = try StoreFixture()
        try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
            try store.setTestPasscode("917362", for: sarah)
            let verifier = try #require(try store.passcodeVerifier(for: sarah))
            #expect(try verifier.matches("917362"))
            #expect(try !verifier.matches("480213"))
        }
    }
}

@Suite("Sealed secrets refuse tampering")
struct SealedSecretTamperingTests {
    /// Byte positions in a sealed value: format version, nonce, ciphertext, the tag's last byte.
    @Test(arguments: [0, 5, 20, -1])
    func flippedByteInASealedVerifier_isAnIntegrityFailure(position: Int) throws {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
            return sarah
        }
        let raw = try fixture.raw()
        var sealed = try #require(
            try raw.scalar("SELECT sealed FROM secrets WHERE person_id = ?", [.integer(sarah.id)]).blob)
        let index = position >= 0 ? position : sealed.count + position
        sealed[index] ^= 0x01
        try raw.query("UPDATE secrets SET sealed = ? WHERE person_id = ?", [.blob(sealed), .integer(sarah.id)])
        raw.close()

        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.passcodeVerifier(for: sarah) } == .integrity)
        }
    }

    @Test func sealedVerifiersSwappedBetweenTwoPeople_openForNeither() throws {
        let fixture = try StoreFixture()
        let (sarah, ben) = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            let ben = try store.addTestPerson("ben")
            try store.setTestPasscode("480213", for: sarah)
            try store.setTestPasscode("917362", for: ben)
            return (sarah, ben)
        }
        let raw = try fixture.raw()
        let select = "SELECT sealed FROM secrets WHERE person_id = ? AND kind = 'passcode'"
        let sarahSealed = try #require(try raw.scalar(select, [.integer(sarah.id)]).blob)
        let benSealed = try #require(try raw.scalar(select, [.integer(ben.id)]).blob)
        let update = "UPDATE secrets SET sealed = ? WHERE person_id = ? AND kind = 'passcode'"
        try raw.query(update, [.blob(benSealed), .integer(sarah.id)])
        try raw.query(update, [.blob(sarahSealed), .integer(ben.id)])
        raw.close()

        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.passcodeVerifier(for: sarah) } == .integrity)
            #expect(storeErrorCode { _ = try store.passcodeVerifier(for: ben) } == .integrity)
        }
    }

    @Test func sealedValueMovedToAnotherKind_isAnIntegrityFailure() throws {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
            try store.setSecret(Array("refresh-token-value".utf8), kind: "refresh-token", for: sarah, now: testNow)
            #expect(try store.secret(kind: "refresh-token", for: sarah) == Array("refresh-token-value".utf8))
            return sarah
        }
        let raw = try fixture.raw()
        try raw.query("DELETE FROM secrets WHERE person_id = ? AND kind = 'refresh-token'", [.integer(sarah.id)])
        try raw.query(
            "UPDATE secrets SET kind = 'refresh-token' WHERE person_id = ? AND kind = 'passcode'", [.integer(sarah.id)])
        raw.close()

        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.secret(kind: "refresh-token", for: sarah) } == .integrity)
        }
    }

    @Test func personRenamedInTheDatabase_cannotOpenTheirSecrets() throws {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
            return sarah
        }
        try fixture.raw().query("UPDATE people SET name = 'mallory' WHERE id = ?", [.integer(sarah.id)])

        try fixture.withStore { store throws in
            // The row MAC covers the name: the renamed row is refused before any secret is tried.
            #expect(storeErrorCode { _ = try store.person(named: LoginName("mallory")) } == .integrity)
        }
    }

    @Test func oldCiphertext_doesNotOpenForANewPersonWithTheSameName() throws {
        let fixture = try StoreFixture()
        let first = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
            return sarah
        }
        let oldSealed = try #require(
            try fixture.raw().scalar("SELECT sealed FROM secrets WHERE person_id = ?", [.integer(first.id)]).blob)
        let second = try fixture.withStore { store throws in
            try store.removePerson(first)
            return try store.addTestPerson("sarah")
        }
        #expect(second.id != first.id)
        try fixture.raw().query(
            "INSERT INTO secrets (person_id, kind, sealed, updated_at) VALUES (?, 'passcode', ?, 0)",
            [.integer(second.id), .blob(oldSealed)])

        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.passcodeVerifier(for: second) } == .integrity)
        }
    }

    @Test func truncatedSealedValue_isAnIntegrityFailure() throws {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setSecret([1, 2, 3], kind: "refresh-token", for: sarah, now: testNow)
            return sarah
        }
        try fixture.raw().query("UPDATE secrets SET sealed = substr(sealed, 1, 20)", [])
        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.secret(kind: "refresh-token", for: sarah) } == .integrity)
        }
    }
}

@Suite("Erasing a person")
struct ErasureTests {
    @Test func removingAPerson_deletesTheirRows_andTheirCiphertextFromTheFile() throws {
        let fixture = try StoreFixture()
        let displayName = "Zebediah Quillfeather-Oyelaran"
        let (sarah, ben) = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah", displayName: displayName)
            try store.setTestPasscode("480213", for: sarah)
            try store.setSecret(Array(repeating: 0xab, count: 200), kind: "refresh-token", for: sarah, now: testNow)
            let ben = try store.addTestPerson("ben")
            try store.setTestPasscode("917362", for: ben)
            return (sarah, ben)
        }
        let raw = try fixture.raw()
        let sealed = try raw.query("SELECT sealed FROM secrets WHERE person_id = ?", [.integer(sarah.id)]).compactMap {
            $0.first?.blob
        }
        raw.close()
        #expect(sealed.count == 2)
        // Before removal the ciphertexts are in the file, so their absence afterwards means something.
        let before = try fixture.databaseBytes()
        #expect(
            sealed.filter { bytes(before, contain: $0) }.count == 2, "the ciphertexts are in the file before removal")
        #expect(bytes(before, contain: Array(displayName.utf8)), "the display name is in the file before removal")

        try fixture.withStore { store throws in
            try store.removePerson(sarah)
            // Checked while the store is still open: the WAL was truncated, not just left behind.
            #expect(fixture.walBytes().count == 0, "the WAL is truncated once removePerson returns")
            let open = try fixture.databaseBytes()
            #expect(sealed.filter { bytes(open, contain: $0) }.count == 0, "ciphertexts left in the open store's file")
        }

        let after = try fixture.databaseBytes() + fixture.walBytes()
        #expect(sealed.filter { bytes(after, contain: $0) }.count == 0, "ciphertexts left in the closed store's files")
        #expect(!bytes(after, contain: Array(displayName.utf8)), "the display name is left in the closed store's files")
        let check = try fixture.raw()
        #expect(try check.scalar("SELECT COUNT(*) FROM people WHERE id = ?", [.integer(sarah.id)]) == .integer(0))
        #expect(
            try check.scalar("SELECT COUNT(*) FROM secrets WHERE person_id = ?", [.integer(sarah.id)]) == .integer(0))
        check.close()
        // Others are untouched.
        try fixture.withStore { store throws in
            #expect(try store.person(named: LoginName("sarah")) == nil)
            #expect(try store.passcodeVerifier(for: ben)?.matches("917362") == true)
        }
    }
}
