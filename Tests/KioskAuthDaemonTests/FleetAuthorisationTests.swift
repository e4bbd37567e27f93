import Foundation
import KioskAuthProtocol
import KioskAuthStore
import Testing

@testable import KioskAuthDaemon

/// The Fleet methods are for root and the admin group only: an unprivileged uid, the uid bound
/// to a person and the kiosk-app group are refused `PermissionDenied` (audited), before anything
/// reaches the directory; admins and root get the fleet's own answers.
@Suite("Fleet methods: authorisation")
struct FleetAuthorisationTests {
    static let aliceUID = 1234

    static let calls: [(String, [String: JSONValue])] = [
        ("FleetStatus", [:]),
        ("FleetSync", [:]),
        ("FleetLeave", [:]),
        ("FleetTerminals", [:]),
        ("FleetRemoveTerminal", ["terminal": .string("terminal-b")]),
        ("FleetIssueJoinToken", ["validSeconds": .number(60)]),
        ("FleetCreate", ["directory": .string("postgres://kiosk@/fleet?host=/nonexistent")]),
        (
            "FleetJoin",
            [
                "directory": .string("postgres://kiosk@/fleet?host=/nonexistent"),
                "token": .string("kat1.00000000-0000-4000-8000-000000000000.AAAA"),
            ]
        ),
        (
            "FleetMigrate",
            [
                "directory": .string("postgres://owner@/fleet?host=/nonexistent"),
                "password": .string("owner-secret"),
            ]
        ),
    ]

    static func call(_ method: String) -> [String: JSONValue] { calls.first { $0.0 == method }!.1 }

    @Test func everyoneButRootAndAdmins_isRefused_andTheRefusalIsAudited() async throws {
        let fixture = try DispatcherFixture()
        try await fixture.addPerson("alice", uid: Self.aliceUID)
        let alice = fixture.caller(uid: Self.aliceUID)
        for (method, parameters) in Self.calls {
            for caller in [fixture.stranger, alice, fixture.kioskApp] {
                #expect(
                    await fixture.error(method, parameters, as: caller) == "PermissionDenied",
                    "\(method) as uid \(caller.uid)")
            }
        }
        // The kiosk app is privileged for unlocks, so its refusals are audited one by one.
        let refused = try fixture.store.auditEntries().filter {
            $0.record.action.hasPrefix("fleet.") && $0.record.result == "refused"
        }
        #expect(refused.count == Self.calls.count)
        #expect(try fixture.store.fleetMembership() == nil)
    }

    @Test func rootAndAdmins_getTheFleetsAnswers() async throws {
        let fixture = try DispatcherFixture()
        for caller in [fixture.admin, fixture.root] {
            #expect(await fixture.error("FleetStatus", as: caller) == nil)
            #expect(await fixture.error("FleetSync", as: caller) == "FleetNotConfigured")
            #expect(await fixture.error("FleetLeave", as: caller) == "FleetNotConfigured")
            #expect(await fixture.error("FleetTerminals", as: caller) == "FleetNotConfigured")
            #expect(
                await fixture.error("FleetRemoveTerminal", ["terminal": .string("terminal-b")], as: caller)
                    == "FleetNotConfigured")
            #expect(
                await fixture.error("FleetIssueJoinToken", ["validSeconds": .number(60)], as: caller)
                    == "FleetNotConfigured")
            // No kioskauth.fleet-key credential: refused before any connection is made.
            #expect(await fixture.error("FleetCreate", Self.call("FleetCreate"), as: caller) == "FleetError")
            #expect(await fixture.error("FleetJoin", Self.call("FleetJoin"), as: caller) == "FleetTokenInvalid")
            // The owner's URL is tried once; nothing of it is kept, and its password is never audited.
            #expect(await fixture.error("FleetMigrate", Self.call("FleetMigrate"), as: caller) == "FleetUnreachable")
        }
        let trail = try fixture.store.auditEntries()
        #expect(trail.contains { $0.record.action == "fleet.migrate" && $0.record.result == "failure" })
        #expect(!trail.contains { "\($0.record)".contains("owner-secret") })
        let status = try await fixture.call("FleetStatus", [:], as: fixture.admin).get()
        guard case .object(let fields) = status else {
            Issue.record("FleetStatus did not answer an object")
            return
        }
        #expect(fields["configured"] == .bool(false))
        #expect(try fixture.store.fleetMembership() == nil)
    }

    @Test func aTerminalToRemove_thatIsNoName_isInvalidInput() async throws {
        let fixture = try DispatcherFixture()
        for named in ["", "   ", "a\nb", String(repeating: "x", count: 257)] {
            #expect(
                await fixture.error("FleetRemoveTerminal", ["terminal": .string(named)], as: fixture.admin)
                    == "InvalidInput", "\(named.debugDescription)")
        }
    }

    @Test func aTokenLifetime_outsideItsRange_isInvalidInput() async throws {
        let fixture = try DispatcherFixture()
        for seconds in [0, -5, 8 * 86400] {
            #expect(
                await fixture.error(
                    "FleetIssueJoinToken", ["validSeconds": .number(Double(seconds))], as: fixture.admin)
                    == "InvalidInput")
        }
    }
}
