import Foundation
import Testing

@testable import KioskAuthCore

@Suite struct HexTests {
    @Test func encodesEveryByteAsFormatWould() {
        let all = (0...255).map { UInt8($0) }
        #expect(Hex.encode(all) == all.map { String(format: "%02x", $0) }.joined())
        #expect(Hex.encode([UInt8]()) == "")
        #expect(Hex.encode([0x00, 0x0f, 0xf0, 0xff]) == "000ff0ff")
        #expect(Hex.encode(all[250...]) == "fafbfcfdfeff")
    }

    @Test func decodesEitherCaseAndRoundTrips() {
        let all = (0...255).map { UInt8($0) }
        #expect(Hex.decode(Hex.encode(all)) == all)
        #expect(Hex.decode("DEADbeef") == [0xde, 0xad, 0xbe, 0xef])
        #expect(Hex.decode("") == [])
    }

    @Test func refusesOddLengthsAndNonDigits() {
        for bad in ["a", "abc", "0g", "zz", "0x00", "é0", " 0"] {
            #expect(Hex.decode(bad) == nil, "\(bad)")
        }
    }
}
