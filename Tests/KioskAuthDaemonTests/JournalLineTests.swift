import Logging
import Testing

@testable import KioskAuthDaemon

/// The log lines `JournalLogHandler` writes to standard error: one event is one line, whatever
/// the message and the values hold.
@Suite struct JournalLineTests {
    static func line(_ message: String, _ metadata: Logger.Metadata = [:], toJournal: Bool = true) -> String {
        JournalLogHandler.line(
            level: .info, label: "kioskauthd", message: message, metadata: metadata, toJournal: toJournal,
            timestamp: { "2026-11-29T21:00:00+0000" })
    }

    @Test func aLine_hasThePriorityOrTheTimestamp_theMessage_andTheValuesSortedByKey() {
        #expect(
            Self.line("ready", ["version": "1.0", "a": "x y", "b": ""]) == "<6>ready a=\"x y\" b=\"\" version=1.0\n")
        #expect(Self.line("ready", toJournal: false) == "2026-11-29T21:00:00+0000 info kioskauthd: ready\n")
    }

    /// A message or a value that carries line breaks (CR LF too, which Swift counts as one
    /// Character) must not start a line of its own, such as a forged one with a priority of its own.
    @Test func lineBreaksInTheMessageAndTheValues_stayInsideTheOneLine() {
        let forged = "refused\r\n<3>kioskauthd: audit chain verified\nfine\rover"
        let text = Self.line(forged, ["reason": .string("bad\r\n<2>forged"), "other": .string("a\nb")])
        #expect(text.utf8.filter { $0 == 0x0A }.count == 1)
        #expect(text.utf8.last == 0x0A)
        #expect(!text.utf8.contains(0x0D))
        #expect(
            text
                == "<6>refused\\r\\n<3>kioskauthd: audit chain verified\\nfine\\rover other=\"a\\nb\" reason=\"bad\\r\\n<2>forged\"\n"
        )
    }

    /// journald's stream ends a line at a NUL too.
    @Test func nulsInTheMessageAndTheValues_stayInsideTheOneLine() {
        let text = Self.line("refused\0<3>forged", ["reason": .string("x\0<2>y")])
        #expect(!text.utf8.contains(0))
        #expect(text == "<6>refused\\0<3>forged reason=\"x\\0<2>y\"\n")
    }

    /// A quote, a space or `=` followed by a combining mark is one Character, which the quoting
    /// before this looked at whole and let through; it is quoted (and escaped) now.
    @Test func aQuoteOrSpaceFollowedByACombiningMark_isQuoted() {
        #expect(JournalLogHandler.quoted("a \u{301}b") == "\"a \u{301}b\"")
        #expect(JournalLogHandler.quoted("\"\u{301}") == "\"\\\"\u{301}\"")
        #expect(JournalLogHandler.quoted("k=\u{301}v") == "\"k=\u{301}v\"")
    }

    /// What the Character-based quoting before it did, for every value without CR, LF, NUL, or a
    /// quote, space or `=` followed by a combining mark.
    static func reference(_ value: String) -> String {
        guard value.isEmpty || value.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" || $0.isNewline }) else {
            return value
        }
        var out = "\""
        for character in value {
            switch character {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            default: out.append(character)
            }
        }
        return out + "\""
    }

    @Test func quoting_isWhatItWas_forValuesWithoutCarriageReturnsOrLineFeeds() {
        let samples = [
            "", "a", "a b", "a=b", "a\"b", "a\\b", "\\", "é", "e\u{0301}", "\u{85}x", "x\u{2028}", "y\u{2029}",
            "\u{0B}", "\u{0C}", "\t", "ü ber", "日本語", "a\u{0C}b", "sha256:0f", "/run/kioskauth/io.kioskauth",
            "\u{200B}", "a\u{00A0}b", "\"", "=", " ", "x\u{7F}y", "\u{1}",
        ]
        for sample in samples {
            #expect(JournalLogHandler.quoted(sample) == Self.reference(sample), "\(Array(sample.unicodeScalars))")
        }
    }

    /// Every code point, alone and between letters.
    @Test func quoting_matchesTheReference_forEveryCodePoint() {
        var differing: [UInt32] = []
        for value in UInt32(1)...0x10FFFF where value != 0x0A && value != 0x0D {
            guard let scalar = Unicode.Scalar(value) else { continue }
            for text in ["\(scalar)", "a\(scalar)b"]
            where JournalLogHandler.quoted(text) != Self.reference(text) {
                differing.append(value)
            }
        }
        #expect(differing.isEmpty, "\(differing.prefix(20).map { String($0, radix: 16) })")
    }
}
