import Foundation
import KioskAuthProtocol
import Testing

@testable import KioskAuthDaemon

/// Who may call what, through the real dispatcher: for a representative set of methods, what an
/// unprivileged uid, the uid bound to a person, the kiosk-app (authenticator) group, the admin
/// group and root get, and the named error otherwise.
@Suite("Authorisation through the dispatcher")
struct AuthorisationTests {
    static let aliceUID = 1234
    static let passcode = "7391846"

    /// A fixture with alice, bound to `aliceUID`, active with a passcode.
    func fixtureWithAlice() async throws -> DispatcherFixture {
        let fixture = try DispatcherFixture()
        try await fixture.addPerson("alice", uid: Self.aliceUID)
        try await fixture.setPasscode("alice", Self.passcode)
        return fixture
    }

    @Test func status_isOpenToEveryone() async throws {
        let fixture = try await fixtureWithAlice()
        let alice = fixture.caller(uid: Self.aliceUID)
        for caller in [fixture.stranger, alice, fixture.kioskApp, fixture.admin, fixture.root] {
            #expect(await fixture.error("GetStatus", as: caller) == nil)
        }
    }

    @Test func adminMethods_needRootOrTheAdminGroup() async throws {
        let fixture = try await fixtureWithAlice()
        let alice = fixture.caller(uid: Self.aliceUID)
        let calls: [(String, [String: JSONValue])] = [
            ("ListPeople", [:]),
            ("GetAudit", [:]),
            ("VerifyAudit", [:]),
            ("ResetLockout", ["name": .string("alice")]),
            ("RevokeActivationCode", ["name": .string("alice")]),
            ("SuspendPerson", ["name": .string("alice")]),
        ]
        for (method, parameters) in calls {
            for caller in [fixture.stranger, alice, fixture.kioskApp] {
                #expect(
                    await fixture.error(method, parameters, as: caller) == "PermissionDenied",
                    "\(method) as uid \(caller.uid)")
            }
            #expect(await fixture.error(method, parameters, as: fixture.admin) == nil, "\(method) as admin")
            if method != "SuspendPerson" {
                #expect(await fixture.error(method, parameters, as: fixture.root) == nil, "\(method) as root")
            }
        }
    }

    @Test func addingPeople_needsAnAdmin() async throws {
        let fixture = try DispatcherFixture()
        for (index, caller) in [fixture.stranger, fixture.kioskApp].enumerated() {
            #expect(await fixture.error("AddPerson", ["name": .string("p\(index)")], as: caller) == "PermissionDenied")
        }
        #expect(await fixture.error("AddPerson", ["name": .string("bob")], as: fixture.admin) == nil)
        #expect(await fixture.error("AddPerson", ["name": .string("bob")], as: fixture.root) == "PersonExists")
        #expect(await fixture.error("ListPeople", as: fixture.root) == nil)
    }

    @Test func aPerson_isShownToAdminsAndToTheirOwnUidOnly() async throws {
        let fixture = try await fixtureWithAlice()
        let alice = ["name": JSONValue.string("alice")]
        let nobody = ["name": JSONValue.string("nobody")]
        #expect(await fixture.error("GetPerson", alice, as: fixture.caller(uid: Self.aliceUID)) == nil)
        #expect(await fixture.error("GetPerson", alice, as: fixture.admin) == nil)
        #expect(await fixture.error("GetPerson", alice, as: fixture.root) == nil)
        #expect(await fixture.error("GetPerson", alice, as: fixture.kioskApp) == "PermissionDenied")
        #expect(await fixture.error("GetPerson", alice, as: fixture.stranger) == "PermissionDenied")
        // Names cannot be enumerated: somebody else and nobody get the same answer.
        #expect(await fixture.error("GetPerson", nobody, as: fixture.stranger) == "PermissionDenied")
        #expect(await fixture.error("GetPerson", nobody, as: fixture.admin) == "NoSuchPerson")
    }

    @Test func verifyingAPasscode_needsTheKioskGroup_orThePersonThemself() async throws {
        let fixture = try await fixtureWithAlice()
        let input: [String: JSONValue] = ["name": .string("alice"), "passcode": .string(Self.passcode)]
        #expect(await fixture.error("VerifyPasscode", input, as: fixture.kioskApp) == nil)
        #expect(await fixture.error("VerifyPasscode", input, as: fixture.root) == nil)
        #expect(await fixture.error("VerifyPasscode", input, as: fixture.caller(uid: Self.aliceUID)) == nil)
        // An admin is not an authenticator.
        #expect(await fixture.error("VerifyPasscode", input, as: fixture.admin) == "PermissionDenied")
        #expect(await fixture.error("VerifyPasscode", input, as: fixture.stranger) == "PermissionDenied")
        var wrong = input
        wrong["passcode"] = .string("0000000")
        #expect(await fixture.error("VerifyPasscode", wrong, as: fixture.kioskApp) == "WrongPasscode")
        var nobody = input
        nobody["name"] = .string("nobody")
        #expect(await fixture.error("VerifyPasscode", nobody, as: fixture.stranger) == "PermissionDenied")
        #expect(await fixture.error("VerifyPasscode", nobody, as: fixture.kioskApp) == "NoSuchPerson")
    }

    @Test func activationAtTheTerminal_needsTheKioskGroup() async throws {
        let fixture = try await fixtureWithAlice()
        let input: [String: JSONValue] = ["code": .string("ABCD-EFGH-JKMN")]
        for caller in [fixture.stranger, fixture.caller(uid: Self.aliceUID), fixture.admin] {
            #expect(await fixture.error("CheckActivationCode", input, as: caller) == "PermissionDenied")
        }
        let kiosk = await fixture.error("CheckActivationCode", input, as: fixture.kioskApp)
        #expect(kiosk != "PermissionDenied" && kiosk != nil)
    }

    @Test func selfService_needsATicketFromThisConnection() async throws {
        let fixture = try await fixtureWithAlice()
        let alice = fixture.caller(uid: Self.aliceUID)
        let newCode = "5820417"
        var change: [String: JSONValue] = [
            "name": .string("alice"), "passcode": .string(newCode), "confirmation": .string(newCode),
        ]
        #expect(await fixture.error("SetPasscode", change, as: alice) == "TicketInvalid")
        #expect(await fixture.error("SetPasscode", change, as: fixture.stranger) == "PermissionDenied")

        let verified = try await fixture.call(
            "VerifyPasscode", ["name": .string("alice"), "passcode": .string(Self.passcode)], as: alice
        ).get()
        guard case .object(let members) = verified, case .string(let ticket)? = members["ticket"] else {
            Issue.record("no ticket in \(verified)")
            return
        }
        change["ticket"] = .string(ticket)
        // Another connection of the same uid may not use it.
        let otherConnection = fixture.caller(uid: Self.aliceUID)
        #expect(await fixture.error("SetPasscode", change, as: otherConnection) == "TicketInvalid")
        #expect(await fixture.error("SetPasscode", change, as: alice) == nil)
        // Single use.
        #expect(await fixture.error("SetPasscode", change, as: alice) == "TicketInvalid")
    }

    @Test func ticketsExpire_onTheTestClock() async throws {
        let fixture = try await fixtureWithAlice()
        let alice = fixture.caller(uid: Self.aliceUID)
        let verified = try await fixture.call(
            "VerifyPasscode", ["name": .string("alice"), "passcode": .string(Self.passcode)], as: alice
        ).get()
        guard case .object(let members) = verified, case .string(let ticket)? = members["ticket"] else {
            Issue.record("no ticket in \(verified)")
            return
        }
        fixture.clock.advance(121)
        let change: [String: JSONValue] = [
            "name": .string("alice"), "passcode": .string("5820417"), "confirmation": .string("5820417"),
            "ticket": .string(ticket),
        ]
        #expect(await fixture.error("SetPasscode", change, as: alice) == "TicketInvalid")
    }

    @Test func unknownMethods_areNamed() async throws {
        let fixture = try DispatcherFixture()
        #expect(await fixture.error("NoSuchMethod", as: fixture.root) == "MethodNotFound")
    }
}
