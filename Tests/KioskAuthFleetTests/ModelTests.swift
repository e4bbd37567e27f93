import Foundation
import Testing

@testable import KioskAuthFleet

/// The fleet's model module, which the daemon uses without the database client: what it reads
/// out of a pulled change, and the directory address, without Foundation's JSONSerialization or
/// CharacterSet (the module imports FoundationEssentials only).
@Suite struct ModelTests {
    @Test func aChangesFields_keepIntegersExact_andReadOtherValuesAsBefore() {
        let body = """
            {"name": "sarah", "version": 9223372036854775000, "uid": 1001, "generation": 3, \
            "match_on_chip": true, "off": false, "ratio": 1.5, "removed_at": null, \
            "roles": ["a"], "nested": {"k": 1}}
            """
        let change = FleetChange(id: 1, entity: "people", key: "k", isDeletion: false, body: body)
        #expect(
            change.fields == [
                "name": "sarah", "version": "9223372036854775000", "uid": "1001", "generation": "3",
                "match_on_chip": "1", "off": "0", "ratio": "1.5",
            ])
        // What is not a JSON object has no fields.
        for junk in [nil, "", "[1]", "{\"name\":", "\"text\""] {
            #expect(FleetChange(id: 1, entity: "people", key: "k", isDeletion: false, body: junk).fields == [:])
        }
    }

    @Test func anIPv6DirectoryHost_losesItsBrackets() throws {
        let endpoint = try FleetEndpoint(url: "postgresql://terminal@[::1]:5433/fleet?sslmode=disable")
        #expect(endpoint.transport == .tcp(host: "::1", port: 5433))
    }

    @Test func joinTokens_roundTripThroughTheirBase64URLText() throws {
        for _ in 0..<64 {
            let token = JoinToken(id: UUID(), secret: (0..<32).map { _ in UInt8.random(in: 0...255) })
            let text = token.text
            #expect(!text.contains("+") && !text.contains("/") && !text.contains("="))
            #expect(try JoinToken(text: text) == token)
        }
    }
}
