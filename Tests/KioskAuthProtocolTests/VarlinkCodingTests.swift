import Foundation
import KioskAuthProtocol
import Testing

private func encodedText(_ value: JSONValue) throws -> String {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return String(decoding: try encoder.encode(value), as: UTF8.self)
}

private func decoded(_ text: String) throws -> JSONValue {
    try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8))
}

@Suite("JSON values")
struct JSONValueTests {
    @Test func nestedValue_roundTripsThroughJSON() throws {
        let value: JSONValue = .object([
            "name": .string("sarah"),
            "uid": .number(1001),
            "ratio": .number(0.25),
            "negative": .number(-7),
            "active": .bool(true),
            "locked": .bool(false),
            "until": .null,
            "roles": .array([.string("caregiver"), .string("family")]),
            "context": .object(["service": .string("login"), "tty": .string("tty1")]),
            "empty": .object([:]),
            "none": .array([]),
            "text": .string("ünïcödé \"quoted\" \\ and a NUL \u{0}"),
        ])
        #expect(try JSONDecoder().decode(JSONValue.self, from: JSONEncoder().encode(value)) == value)
    }

    @Test(arguments: [(1001.0, "1001"), (0.0, "0"), (-7.0, "-7"), (4_294_967_296.0, "4294967296")])
    func wholeNumber_isWrittenAsAnInteger(number: Double, text: String) throws {
        #expect(try encodedText(.number(number)) == text)
        #expect(try encodedText(.object(["n": .number(number)])) == #"{"n":\#(text)}"#)
    }

    @Test func fractionalNumber_keepsItsFraction() throws {
        #expect(try encodedText(.number(2.5)) == "2.5")
        #expect(try decoded("2.5") == .number(2.5))
    }

    @Test func booleans_andNumbers_decodeAsWhatTheyAre() throws {
        #expect(try decoded("true") == .bool(true))
        #expect(try decoded("false") == .bool(false))
        #expect(try decoded("1") == .number(1))
        #expect(try decoded("0") == .number(0))
        #expect(try decoded("null") == .null)
        #expect(try decoded(#""1""#) == .string("1"))
        #expect(try decoded(#"{"a":[1,true,null]}"#) == .object(["a": .array([.number(1), .bool(true), .null])]))
    }

    @Test func subscriptAndStringValue_readObjectsAndStrings() {
        let value: JSONValue = .object(["name": .string("sarah"), "uid": .number(1)])
        #expect(value["name"]?.stringValue == "sarah")
        #expect(value["uid"]?.stringValue == nil)
        #expect(value["missing"] == nil)
        #expect(JSONValue.string("x")["name"] == nil)
    }
}

@Suite("Varlink framing and coding")
struct VarlinkCodingTests {
    @Test func frame_endsWithExactlyOneNUL_andHasNoOther() throws {
        let call = VarlinkCall(
            method: "io.kioskauth.VerifyPasscode",
            parameters: .object(["name": .string("sar\u{0}ah"), "passcode": .string("480213")]), more: true)
        let bytes = try VarlinkCoding.frame(call)
        #expect(bytes.last == 0)
        #expect(bytes.filter { $0 == 0 }.count == 1)

        let back = try JSONDecoder().decode(VarlinkCall.self, from: Data(bytes.dropLast()))
        #expect(back.method == call.method)
        #expect(back.parameters == call.parameters)
        #expect(back.more == true)
        #expect(back.oneway == nil)
    }

    @Test func frame_leavesOutAbsentOptionalFields() throws {
        let bytes = try VarlinkCoding.frame(VarlinkReply(parameters: .object(["ok": .bool(true)])))
        let text = String(decoding: bytes.dropLast(), as: UTF8.self)
        #expect(text == #"{"parameters":{"ok":true}}"#)
    }

    private struct PasscodeInput: Codable, Equatable {
        var name: String
        var passcode: String
        var uid: Int?
        var context: Context?

        struct Context: Codable, Equatable {
            var service: String
        }
    }

    @Test func typedParameters_roundTrip_andMissingParametersDecodeAsAnEmptyObject() throws {
        let input = PasscodeInput(name: "sarah", passcode: "480213", uid: 1001, context: .init(service: "login"))
        let value = try VarlinkCoding.encode(input)
        #expect(value["uid"] == .number(1001))
        #expect(try VarlinkCoding.decode(PasscodeInput.self, from: value) == input)

        struct Nothing: Decodable {}
        _ = try VarlinkCoding.decode(Nothing.self, from: nil)
    }

    private func decodingError(_ parameters: JSONValue?) -> (any Error)? {
        do {
            _ = try VarlinkCoding.decode(PasscodeInput.self, from: parameters)
            return nil
        } catch {
            return error
        }
    }

    @Test func parameterName_namesTheKeyOfTheWrongType() throws {
        let error = try #require(decodingError(.object(["name": .number(5), "passcode": .string("480213")])))
        #expect(VarlinkCoding.parameterName(of: error) == "name")
        let uidError = try #require(
            decodingError(.object(["name": .string("s"), "passcode": .string("1"), "uid": .string("x")])))
        #expect(VarlinkCoding.parameterName(of: uidError) == "uid")
    }

    @Test func parameterName_namesTheMissingKey() throws {
        let error = try #require(decodingError(.object(["name": .string("sarah")])))
        #expect(VarlinkCoding.parameterName(of: error) == "passcode")
    }

    @Test func parameterName_namesTheTopLevelKeyOfANestedProblem() throws {
        let error = try #require(
            decodingError(
                .object(["name": .string("s"), "passcode": .string("1"), "context": .object(["service": .bool(true)])]))
        )
        #expect(VarlinkCoding.parameterName(of: error) == "context")
    }

    @Test func parameterName_ofAnythingButADecodingError_isParameters() throws {
        struct Other: Error {}
        #expect(VarlinkCoding.parameterName(of: Other()) == "parameters")
        let error = try #require(decodingError(.string("not an object")))
        #expect(VarlinkCoding.parameterName(of: error) == "parameters")
    }
}
