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
        // Only an integer literal reads as an integer: a decimal or an exponent stays as written,
        // so Int64() and a row MAC over it keep refusing it. Beyond Int64, digits as written.
        let spelt = FleetChange(
            id: 1, entity: "people", key: "k", isDeletion: false,
            body: #"{"uid": 1001.0, "version": 5.000, "g": 1e3, "big": 9223372036854775808, "neg": -7, "f": -0.5}"#)
        #expect(
            spelt.fields == [
                "uid": "1001.0", "version": "5.000", "g": "1e3", "big": "9223372036854775808", "neg": "-7", "f": "-0.5",
            ])
        #expect(spelt.fields["uid"].flatMap { Int($0) } == nil)
        // Strings, nested values and escaped names around the numbers do not throw the scan off.
        let tricky = FleetChange(
            id: 1, entity: "people", key: "k", isDeletion: false,
            body: #"{"s": "a\",\"n\": 1", "o": {"n": [1, {"x": "}"}]}, "n": 42, "e\u0073c": 3, "t": "2"}"#)
        #expect(tricky.fields == ["s": #"a","n": 1"#, "n": "42", "esc": "3", "t": "2"])
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
