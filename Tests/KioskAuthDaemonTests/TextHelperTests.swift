import Foundation
import Testing

@testable import KioskAuthDaemon

/// The daemon's own text helpers (Text.swift) against the Foundation methods they replace: the
/// same result on every edge the daemon's inputs can have.
@Suite struct TextHelperTests {
    static let samples = [
        "", "\n", "secret", "secret\n", "\r\nsecret\r\n", "\u{0B}\u{0C}secret\u{85}", "\u{2028}se cret\u{2029}",
        " secret \n", "\tsecret\t", "se\ncret", "\n\n\n", "\u{00A0}secret\u{3000}", "é\u{0301}\n",
        "kiosk-01\u{200B}", "\u{200B}\u{2060}\u{FEFF}kiosk\u{180E}",
    ]

    @Test func trimmingNewlines_isWhatFoundationTrims() {
        for text in Self.samples {
            #expect(text.trimmingNewlines() == text.trimmingCharacters(in: .newlines), "\(Array(text.unicodeScalars))")
        }
    }

    /// Every code point, alone at both ends of a word.
    @Test func everyCodePoint_isTrimmedAsFoundationTrimsIt() {
        var differing: [UInt32] = []
        for value in UInt32(0)...0x10FFFF {
            guard let scalar = Unicode.Scalar(value) else { continue }
            let text = "\(scalar)x\(scalar)"
            if text.trimmingNewlines() != text.trimmingCharacters(in: .newlines)
                || text.trimmingWhitespace() != text.trimmingCharacters(in: .whitespacesAndNewlines)
                || text.trimmingWhitespace(newlines: false) != text.trimmingCharacters(in: .whitespaces)
            {
                differing.append(value)
            }
        }
        #expect(differing.isEmpty, "\(differing.prefix(20).map { String($0, radix: 16) })")
    }

    @Test func trimmingWhitespace_isWhatFoundationTrims() {
        for text in Self.samples {
            #expect(text.trimmingWhitespace() == text.trimmingCharacters(in: .whitespacesAndNewlines))
            #expect(text.trimmingWhitespace(newlines: false) == text.trimmingCharacters(in: .whitespaces))
        }
    }

    /// On a Substring that starts inside its string (a configuration value after `Key=`): the
    /// indices the trimming finds are the base string's.
    @Test func trimmingWhitespace_ofASubstring_isWhatFoundationTrims() {
        for text in Self.samples {
            let line = "Kéy=" + text + "\u{2003}tail"
            let value = line[line.index(line.startIndex, offsetBy: 4)..<line.index(line.endIndex, offsetBy: -5)]
            #expect(value.trimmingWhitespace() == value.trimmingCharacters(in: .whitespacesAndNewlines))
            #expect(value.trimmingWhitespace(newlines: false) == value.trimmingCharacters(in: .whitespaces))
        }
    }
}
