import Foundation
import KioskAuthCore
import Testing

@Suite("Login names")
struct LoginNameTests {
    @Test(arguments: ["sarah", "s", "0day", "sarah.k", "a_b-c@d+e", "sarah@clinic.example"])
    func validName_isKeptAsTyped(name: String) throws {
        #expect(try LoginName(name).rawValue == name)
    }

    @Test func uppercaseLetters_areLowercased() throws {
        let name = try LoginName("Sarah.K@Clinic")
        #expect(name.rawValue == "sarah.k@clinic")
        #expect(name == (try LoginName("sarah.k@clinic")))
        #expect(name.description == "sarah.k@clinic")
    }

    @Test func sixtyFourCharacters_areAccepted_sixtyFiveAreNot() throws {
        #expect(try LoginName(String(repeating: "a", count: 64)).rawValue.count == 64)
        #expect(throws: InvalidInputError.self) {
            try LoginName(String(repeating: "a", count: 65))
        }
    }

    @Test(
        "Malformed names are refused",
        arguments: [
            "", ".sarah", "-sarah", "_sarah", "@sarah", "+sarah", "sa rah", "sarah ", "sarah!",
            "sarah/k", "zoë", "İlker", "ＳＡＲＡＨ", "sarah\u{0}", "sarah\n",
        ])
    func malformedName_isRefused(name: String) {
        #expect {
            try LoginName(name)
        } throws: { error in
            (error as? InvalidInputError)?.field == "login"
        }
    }

    @Test func codable_roundTripsAsAPlainString() throws {
        let name = try LoginName("sarah.k")
        let data = try JSONEncoder().encode([name])
        #expect(String(decoding: data, as: UTF8.self) == #"["sarah.k"]"#)
        #expect(try JSONDecoder().decode([LoginName].self, from: data) == [name])
    }

    @Test func decoding_validatesAndLowercases() throws {
        let decoded = try JSONDecoder().decode([LoginName].self, from: Data(#"["SARAH"]"#.utf8))
        #expect(decoded.map(\.rawValue) == ["sarah"])
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode([LoginName].self, from: Data(#"["not a name"]"#.utf8))
        }
    }
}

@Suite("Role sets")
struct RoleSetTests {
    @Test func primaryComesFirst_othersKeepTheirOrder_duplicatesDrop() {
        let roles = RoleSet(
            primary: .coordinator, others: [.family, .coordinator, .caregiver, .family])
        #expect(roles.primary == .coordinator)
        #expect(roles.all == [.coordinator, .family, .caregiver])
        #expect(Array(roles.others) == [.family, .caregiver])
        #expect(roles.contains(.caregiver))
    }

    @Test func singleRole_isItsOwnPrimary() {
        let roles = RoleSet(primary: .caregiver)
        #expect(roles.all == [.caregiver])
        #expect(!roles.contains(.family))
    }

    @Test func list_makesItsFirstRolePrimary() throws {
        let roles = try RoleSet([.family, .caregiver, .family])
        #expect(roles.primary == .family)
        #expect(roles.all == [.family, .caregiver])
    }

    @Test func emptyList_isRefused() {
        #expect(
            throws: InvalidInputError(field: "roles", message: "A person needs at least one role.")
        ) {
            try RoleSet([])
        }
    }

    @Test func codable_roundTrips() throws {
        let roles = RoleSet(primary: .caregiver, others: [.coordinator])
        let decoded = try JSONDecoder().decode(RoleSet.self, from: JSONEncoder().encode(roles))
        #expect(decoded == roles)
    }

    @Test func decoding_restoresTheInvariants() throws {
        let json = #"{"primary":"family","all":["caregiver","family","caregiver"]}"#
        let decoded = try JSONDecoder().decode(RoleSet.self, from: Data(json.utf8))
        #expect(decoded.primary == .family)
        #expect(decoded.all == [.family, .caregiver])
    }

    @Test func namesOnTheWire_areStable() throws {
        #expect(Role.allCases.map(\.rawValue) == ["caregiver", "coordinator", "family"])
        #expect(PersonState.pendingActivation.rawValue == "pending-activation")
        #expect(Origin.idp.rawValue == "idp")
        #expect(
            try JSONDecoder().decode(
                [PersonState].self, from: Data(#"["pending-activation"]"#.utf8)) == [
                    .pendingActivation
                ])
    }
}
