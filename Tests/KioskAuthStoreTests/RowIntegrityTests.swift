import Foundation
import KioskAuthCore
import KioskAuthStore
import Testing

/// Every security-relevant column of a people row is bound to it by a MAC (issue #11 item 13).
@Suite("Row MACs")
struct RowIntegrityTests {
    /// One edit per covered column, as an attacker with the database file but not the key would.
    static let edits: [(column: String, sql: String)] = [
        ("name", "UPDATE people SET name = 'mallory'"),
        ("uid", "UPDATE people SET uid = 4243"),
        ("uid (to NULL)", "UPDATE people SET uid = NULL"),
        ("uid (as real)", "UPDATE people SET uid = 4242.5"),
        ("roles", "UPDATE people SET roles = 'admin'"),
        ("origin", "UPDATE people SET origin = 'idp'"),
        ("state", "UPDATE people SET state = 'active'"),
        ("passcode_failures", "UPDATE people SET passcode_failures = 0"),
        ("passcode_locked_until", "UPDATE people SET passcode_locked_until = NULL"),
        ("passcode_hard_locked", "UPDATE people SET passcode_hard_locked = 0"),
        ("fingerprint_failures", "UPDATE people SET fingerprint_failures = 0"),
        ("idp_subject", "UPDATE people SET idp_subject = 'someone-else'"),
        ("idp_contact", "UPDATE people SET idp_contact = '{}'"),
        ("suspended_reason", "UPDATE people SET suspended_reason = 'x'"),
        ("refresh_state", "UPDATE people SET refresh_state = '{}'"),
        ("biometric_offer", "UPDATE people SET biometric_offer = 'declined'"),
        ("bound_account", "UPDATE people SET bound_account = 'mallory'"),
        ("mac", "UPDATE people SET mac = NULL"),
    ]

    @Test(arguments: 0..<edits.count)
    func editedColumn_isAnIntegrityError_onEveryRead(_ index: Int) throws {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah", uid: 4242)
            try store.setState(.suspended, for: sarah, now: testNow)
            var failures = CredentialFailureState()
            failures.passcodeFailures = 5
            failures.passcodeHardLocked = true
            failures.fingerprintFailures = 3
            failures.passcodeLockedUntil = testNow.addingTimeInterval(60)
            try store.saveFailures(failures, for: sarah, now: testNow)
            return try #require(try store.person(id: sarah.id))
        }
        try fixture.raw().query(Self.edits[index].sql)
        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.person(id: sarah.id) } == .integrity)
            #expect(
                storeErrorCode { _ = try store.person(boundTo: 4242) } != nil
                    || (try? store.person(boundTo: 4242)) == nil)
            #expect(storeErrorCode { _ = try store.people() } == .integrity)
            #expect(storeErrorCode { _ = try store.identityProviderProfile(of: sarah) } == .integrity)
            // A write never launders the edit into a valid MAC.
            #expect(
                storeErrorCode { try store.saveFailures(CredentialFailureState(), for: sarah, now: testNow) }
                    == .integrity)
            #expect(storeErrorCode { try store.setState(.active, for: sarah, now: testNow) } == .integrity)
            #expect(storeErrorCode { _ = try store.person(id: sarah.id) } == .integrity)
        }
    }

    @Test func writes_keepTheRowValid_andAStoreFromBeforeRowMACsIsUpgraded() throws {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah", uid: 4242)
            try store.setRoles(RoleSet(primary: .coordinator), for: sarah, now: testNow)
            try store.setBiometricOffer(false, for: sarah, now: testNow)
            try store.suspend(sarah, reason: "refresh failed", refresh: nil, now: testNow)
            try store.setState(.active, for: sarah, now: testNow)
            try store.recordUnlock(of: sarah, now: testNow)
            return sarah
        }
        // Like a schema-2 store: no MACs yet.
        let raw = try fixture.raw()
        try raw.query("ALTER TABLE people DROP COLUMN mac")
        for (table, column) in [
            ("people", "bound_account"), ("people", "has_passcode"), ("activation_codes", "mac"), ("sessions", "mac"),
            ("terminal_state", "mac"),
        ] {
            try raw.query("ALTER TABLE \(table) DROP COLUMN \(column)")
        }
        try raw.query("PRAGMA user_version = 2")
        raw.close()
        try fixture.withStore { store throws in
            let read = try #require(try store.person(id: sarah.id))
            #expect(read.roles.primary == .coordinator)
            #expect(read.uid == 4242)
            #expect(try store.identityProviderProfile(of: read).suspendedReason == "refresh failed")
        }
    }

    @Test func sealedPasscodeRewrittenAsText_isAnIntegrityError_notNoPasscode() throws {
        let fixture = try StoreFixture()
        let sarah = try fixture.withStore { store throws in
            let sarah = try store.addTestPerson("sarah")
            try store.setTestPasscode("480213", for: sarah)
            return sarah
        }
        try fixture.raw().query("UPDATE secrets SET sealed = CAST(sealed AS TEXT)")
        try fixture.withStore { store throws in
            #expect(storeErrorCode { _ = try store.passcodeVerifier(for: sarah) } == .integrity)
        }
    }
}
