import Foundation
import KioskAuthProtocol
import Testing

private func parse(_ text: String) throws -> JSONValue { try JSONValue.parse(Array(text.utf8)) }

private func parseFails(_ bytes: [UInt8]) -> JSONSyntaxError? {
    do {
        _ = try JSONValue.parse(bytes)
        return nil
    } catch {
        return error
    }
}

@Suite("JSON parser")
struct JSONParserTests {
    @Test func documents_parseToTheSameValuesAsFoundation() throws {
        let documents = [
            #"{"method":"io.kioskauth.VerifyFinger","more":true,"parameters":{"name":"sarah"}}"#,
            #" [1, -2, 3.5, -0.25, 1e3, 2E-2, 0, -0, true, false, null, "", {}, []] "#,
            #"{"text":"tab\there \"q\" back\\slash \/ \u00e9 \ud83d\ude00 \b\f\n\r","n":12345678901234}"#,
            #""plain ünïcödé""#,
            "\t\r\n 42 \n",
        ]
        for text in documents {
            let expected = try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
            #expect(try parse(text) == expected, "\(text)")
        }
    }

    @Test(arguments: [
        "", " ", "{", "}", "[1,]", "[1 2]", #"{"a":1,}"#, #"{"a" 1}"#, #"{a:1}"#, "01", "1.", ".5", "-", "+1", "1e",
        "1e+", "NaN", "Infinity", "-Infinity", "tru", "nul", "truex", "1 2", #"{"a":1}x"#, #""unterminated"#,
        #""bad \x escape""#, #""\u12""#, #""\u12G4""#, #""\ud800""#, #""\ud800\u0041""#, #""\udc00""#, "1e400",
        #"{"a":1,"a":2}"#,
    ])
    func malformedDocuments_areRefused(text: String) {
        #expect(parseFails(Array(text.utf8)) != nil, "\(text)")
    }

    @Test func controlCharactersInStrings_andInvalidUTF8_areRefused() {
        #expect(parseFails(Array("\"a\u{1}b\"".utf8)) != nil)
        #expect(parseFails(Array("\"a\nb\"".utf8)) != nil)
        #expect(parseFails([0x22, 0xFF, 0x22]) != nil)
        #expect(parseFails([0x22, 0xC3, 0x22]) != nil)  // truncated sequence
        #expect(parseFails([0x22, 0x5C, 0x6E, 0xED, 0xA0, 0x80, 0x22]) != nil)  // encoded surrogate after an escape
    }

    @Test func nesting_isBounded() throws {
        let deep =
            String(repeating: "[", count: JSONValue.maximumNesting)
            + String(
                repeating: "]", count: JSONValue.maximumNesting)
        _ = try parse(deep)
        let tooDeep = "[" + deep + "]"
        let error = try #require(parseFails(Array(tooDeep.utf8)))
        #expect(error.reason == "nested too deeply")
        let objects = String(repeating: #"{"a":"#, count: 10_000) + "1" + String(repeating: "}", count: 10_000)
        #expect(parseFails(Array(objects.utf8))?.reason == "nested too deeply")
    }

    @Test func duplicateMember_isNamedInTheError() throws {
        let error = try #require(parseFails(Array(#"{"name":"a","name":"b"}"#.utf8)))
        #expect(error.reason == #"duplicate member "name""#)
    }
}

@Suite("JSON writer")
struct JSONWriterTests {
    @Test func output_isWhatFoundationWritesWithSortedKeys() throws {
        let value: JSONValue = .object([
            "zeta": .number(1), "alpha": .array([.number(2.5), .number(-7), .null, .bool(true)]),
            "text": .string("q\"b\\s/n\n\t\u{1}é😀"), "nested": .object(["b": .string(""), "a": .object([:])]),
        ])
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let foundation = try JSONDecoder().decode(JSONValue.self, from: encoder.encode(value))
        let ours = try value.serialized()
        #expect(try JSONDecoder().decode(JSONValue.self, from: Data(ours)) == foundation)
        #expect(try JSONValue.parse(ours) == value)
        let text = String(decoding: ours, as: UTF8.self)
        #expect(text.hasPrefix(#"{"alpha":[2.5,-7,null,true],"nested":{"a":{},"b":""},"text":"#))
        #expect(!text.contains("\\/"))
        #expect(text.contains("\\u0001"))
    }

    @Test func nonFiniteNumbers_areRefused() {
        #expect(throws: JSONWriteError.self) { try JSONValue.number(.nan).serialized() }
        #expect(throws: JSONWriteError.self) { try JSONValue.array([.number(.infinity)]).serialized() }
    }
}

@Suite("Codable to and from JSON values")
struct JSONValueCoderTests {
    struct Sample: Codable, Equatable {
        enum Kind: String, Codable { case one, two }
        struct Inner: Codable, Equatable {
            var flag: Bool
            var values: [Int]
        }
        var name: String
        var count: Int
        var ratio: Double
        var kind: Kind
        var optional: String?
        var absent: Int?
        var inner: Inner
        var list: [Inner]
        var map: [String: Int]
        var nestedOptional: [String?]
        var raw: JSONValue?
    }

    let sample = Sample(
        name: "sarah", count: -3, ratio: 0.5, kind: .two, optional: "x", absent: nil,
        inner: .init(flag: true, values: [1, 2]), list: [.init(flag: false, values: [])], map: ["a": 1, "b": 2],
        nestedOptional: ["a", nil], raw: .object(["k": .array([.null, .bool(false)])]))

    @Test func encoding_matchesFoundation() throws {
        let foundation = try JSONDecoder().decode(JSONValue.self, from: JSONEncoder().encode(sample))
        #expect(try JSONValueEncoder().encode(sample) == foundation)
    }

    @Test func decoding_roundTrips() throws {
        let value = try JSONValueEncoder().encode(sample)
        #expect(value["absent"] == nil)
        #expect(try JSONValueDecoder().decode(Sample.self, from: value) == sample)
    }

    @Test func integers_mustBeExact() throws {
        struct N: Decodable { var n: Int }
        struct Small: Decodable { var n: Int32 }
        #expect(try JSONValueDecoder().decode(N.self, from: .object(["n": .number(42)])).n == 42)
        #expect(throws: DecodingError.self) {
            try JSONValueDecoder().decode(N.self, from: .object(["n": .number(1.5)]))
        }
        #expect(throws: DecodingError.self) {
            try JSONValueDecoder().decode(N.self, from: .object(["n": .number(1e300)]))
        }
        #expect(throws: DecodingError.self) {
            try JSONValueDecoder().decode(Small.self, from: .object(["n": .number(4_294_967_296)]))
        }
        #expect(throws: DecodingError.self) {
            try JSONValueDecoder().decode(N.self, from: .object(["n": .string("1")]))
        }
    }

    @Test func nullForARequiredValue_isValueNotFound_andForAnOptionalIsAbsent() throws {
        struct R: Decodable {
            var a: String
            var b: String?
        }
        let decoded = try JSONValueDecoder().decode(R.self, from: .object(["a": .string("x"), "b": .null]))
        #expect(decoded.b == nil)
        do {
            _ = try JSONValueDecoder().decode(R.self, from: .object(["a": .null]))
            Issue.record("decoded a null required value")
        } catch DecodingError.valueNotFound(_, let context) {
            #expect(context.codingPath.first?.stringValue == "a")
        }
    }

    @Test func wrongEnumValue_failsWithThePath() throws {
        do {
            _ = try JSONValueDecoder().decode(
                Sample.Inner.self, from: .object(["flag": .bool(true), "values": .array([.number(1), .string("2")])]))
            Issue.record("decoded a string as an Int")
        } catch DecodingError.typeMismatch(_, let context) {
            #expect(context.codingPath.map(\.stringValue) == ["values", "Index 1"])
        }
    }
}
