import Foundation
import KioskAuthProtocol
import Testing

@testable import KioskAuthIdentity

/// Tokens and provider responses go through the socket's strict JSON parser: what it refuses in
/// a varlink message, a token or a response cannot smuggle in either.
@Suite("Identity-provider JSON is parsed strictly")
struct StrictJSONTests {
    private func token(header: [UInt8], payload: [UInt8]) -> String {
        Base64URL.encode(Data(header)) + "." + Base64URL.encode(Data(payload)) + "." + Base64URL.encode(Data([1, 2]))
    }

    private let header = Array(#"{"alg":"RS256","typ":"JWT"}"#.utf8)

    @Test func wellFormedToken_parses() throws {
        let parsed = try JSONWebToken(
            parsing: token(header: header, payload: Array(#"{"sub":"a","n":[1,{"x":null}]}"#.utf8)))
        #expect(parsed.claims["sub"]?.stringValue == "a")
        #expect(parsed.algorithm == "RS256")
    }

    @Test func duplicateClaim_isRefused() {
        // Which "sub" a lenient parser keeps is up to it; a strict one keeps neither.
        #expect(throws: IdentityError.self) {
            try JSONWebToken(parsing: token(header: header, payload: Array(#"{"sub":"alice","sub":"mallory"}"#.utf8)))
        }
        #expect(JSONValue.parseObject(Data(#"{"a":1,"a":1}"#.utf8)) == nil)
    }

    @Test func duplicateHeaderMember_isRefused() {
        let doubled = Array(#"{"alg":"RS256","alg":"none"}"#.utf8)
        #expect(throws: IdentityError.self) {
            try JSONWebToken(parsing: token(header: doubled, payload: Array(#"{"sub":"a"}"#.utf8)))
        }
    }

    @Test func invalidUTF8_isRefused() {
        let payload: [UInt8] = Array(#"{"sub":""#.utf8) + [0xC3, 0x28] + Array(#""}"#.utf8)
        #expect(throws: IdentityError.self) { try JSONWebToken(parsing: token(header: header, payload: payload)) }
    }

    @Test func deepNesting_isRefused() {
        let deep = Array(
            (#"{"a":"# + String(repeating: "[", count: 200) + String(repeating: "]", count: 200) + "}").utf8)
        #expect(JSONValue.parseObject(Data(deep)) == nil)
        let shallow = Array(
            (#"{"a":"# + String(repeating: "[", count: 20) + String(repeating: "]", count: 20) + "}").utf8)
        #expect(JSONValue.parseObject(Data(shallow)) != nil)
    }

    @Test func trailingData_andNonObjects_areRefused() {
        #expect(JSONValue.parseObject(Data(#"{"a":1} {"b":2}"#.utf8)) == nil)
        #expect(JSONValue.parseObject(Data(#"[1]"#.utf8)) == nil)
        #expect(JSONValue.parseObject(Data(#"{"keys":[]}"#.utf8))?["keys"] == .array([]))
    }
}
