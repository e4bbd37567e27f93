import Foundation
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore
import Testing

@testable import KioskAuthDaemon

/// A binding is to an account, not to a number: when the bound uid is given to another Unix
/// account (the old one deleted, its uid reused by `useradd`; or an account created with a uid
/// that had none at binding), the new account's processes are not the person, and logins into
/// it are not the person's, until an admin binds again.
@Suite("Stale bindings: a reused uid does not inherit a person")
struct StaleBindingTests {
    static let uid = 5001
    static let passcode = "7391846"

    /// alice bound to `uid`, which belongs to `account` (nil: to no account) at binding.
    func fixture(account: String?) async throws -> DispatcherFixture {
        let fixture = try DispatcherFixture()
        fixture.passwd.withLock { $0[Self.uid] = account }
        try await fixture.addPerson("alice", uid: Self.uid)
        try await fixture.setPasscode("alice", Self.passcode)
        return fixture
    }

    func person(_ fixture: DispatcherFixture) async throws -> [String: JSONValue] {
        let reply = try await fixture.call("GetPerson", ["name": .string("alice")], as: fixture.admin).get()
        guard case .object(let fields) = reply, case .object(let person)? = fields["person"] else {
            Issue.record("no person in \(reply)")
            return [:]
        }
        return person
    }

    func selfCalls(_ fixture: DispatcherFixture) async -> [String?] {
        let me = fixture.caller(uid: Self.uid)
        return [
            await fixture.error("GetPerson", ["name": .string("alice")], as: me),
            await fixture.error(
                "VerifyPasscode", ["name": .string("alice"), "passcode": .string(Self.passcode)], as: me),
        ]
    }

    func loginInto(_ fixture: DispatcherFixture) async -> String? {
        let context: JSONValue = .object(["service": .string("login"), "targetUid": .number(Double(Self.uid))])
        return await fixture.error(
            "VerifyPasscode",
            ["name": .string("alice"), "passcode": .string(Self.passcode), "context": context],
            as: fixture.kioskApp)
    }

    @Test func aUidReusedByANewAccount_isNotThePerson() async throws {
        let fixture = try await fixture(account: "alice")
        #expect(await selfCalls(fixture) == [nil, nil])
        #expect(await loginInto(fixture) == nil)
        #expect(try await person(fixture)["uid"] == .number(Double(Self.uid)))

        // userdel alice; useradd mallory, which gets alice's old uid.
        fixture.passwd.withLock { $0[Self.uid] = "mallory" }
        #expect(await selfCalls(fixture) == ["PermissionDenied", "PermissionDenied"])
        #expect(await loginInto(fixture) == "AccountNotAllowed")
        let record = try await person(fixture)
        #expect(record["uid"] == nil || record["uid"] == .null)
        guard case .string(let reason)? = record["staleBinding"] else {
            Issue.record("no staleBinding in \(record)")
            return
        }
        #expect(reason.contains("account alice") && reason.contains("mallory"))

        // An admin binds again, knowing whose uid it is now.
        _ = try await fixture.call(
            "BindAccount", ["name": .string("alice"), "uid": .number(Double(Self.uid))], as: fixture.admin
        ).get()
        #expect(await selfCalls(fixture) == [nil, nil])
        #expect(try await person(fixture)["staleBinding"] == nil)
    }

    @Test func anAccountCreatedOnABoundUidAfterBinding_isNotThePerson() async throws {
        let fixture = try await fixture(account: nil)
        #expect(await selfCalls(fixture) == [nil, nil])
        fixture.passwd.withLock { $0[Self.uid] = "eve" }
        #expect(await selfCalls(fixture) == ["PermissionDenied", "PermissionDenied"])
        #expect(await loginInto(fixture) == "AccountNotAllowed")
    }

    @Test func aDeletedAccount_leavesNoBinding() async throws {
        let fixture = try await fixture(account: "alice")
        fixture.passwd.withLock { $0[Self.uid] = nil }
        #expect(await selfCalls(fixture) == ["PermissionDenied", "PermissionDenied"])
        guard case .string(let reason)? = try await person(fixture)["staleBinding"] else {
            Issue.record("no staleBinding")
            return
        }
        #expect(reason.contains("no account has it now"))
    }

    @Test func theSameAccount_keepsItsBinding() async throws {
        let fixture = try await fixture(account: "alice")
        // Unrelated accounts come and go.
        fixture.passwd.withLock { $0[Self.uid + 1] = "bob" }
        #expect(await selfCalls(fixture) == [nil, nil])
        #expect(await loginInto(fixture) == nil)
    }

    @Test func aBindingFromBeforeAccountsWereRecorded_isRecordedAtStart_thenHeldToIt() async throws {
        let fixture = try await fixture(account: "alice")
        // As a schema-4 store left it: bound, account unknown.
        let stored = try #require(try fixture.store.person(named: LoginName("alice")))
        try fixture.store.setUID(Self.uid, account: nil, for: stored, now: Date())
        #expect(try fixture.store.peopleWithUnrecordedAccounts().map(\.id) == [stored.id])
        await fixture.authority.recordLegacyBindings()
        #expect(try fixture.store.person(named: LoginName("alice"))?.boundAccount == "alice")
        #expect(try fixture.store.peopleWithUnrecordedAccounts().isEmpty)
        let audit = try await fixture.call("GetAudit", [:], as: fixture.admin).get()
        #expect("\(audit)".contains("recorded account alice"))
        #expect(await selfCalls(fixture) == [nil, nil])
        fixture.passwd.withLock { $0[Self.uid] = "mallory" }
        #expect(await selfCalls(fixture) == ["PermissionDenied", "PermissionDenied"])
    }
}
