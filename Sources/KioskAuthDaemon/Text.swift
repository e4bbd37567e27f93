// Small text helpers in place of Foundation's `NSString` and `CharacterSet` methods (the daemon
// does not load Foundation; docs/footprint.md).

extension StringProtocol {
    /// The text without leading and trailing white space: what Foundation's
    /// `trimmingCharacters(in: .whitespacesAndNewlines)` removes (Unicode White_Space), or with
    /// `newlines: false` what `.whitespaces` removes (space separators and tab).
    func trimmingWhitespace(newlines: Bool = true) -> String {
        // Foundation's sets also hold U+200B ZERO WIDTH SPACE, which Unicode does not count as
        // white space.
        let isBlank: (Unicode.Scalar) -> Bool =
            newlines
            ? { $0.properties.isWhitespace || $0 == "\u{200B}" }
            : { $0 == "\t" || $0 == "\u{200B}" || $0.properties.generalCategory == .spaceSeparator }
        let scalars = unicodeScalars
        guard let first = scalars.firstIndex(where: { !isBlank($0) }),
            let last = scalars.lastIndex(where: { !isBlank($0) })
        else { return "" }
        var text = ""
        text.unicodeScalars.append(contentsOf: scalars[first...last])
        return text
    }

    /// The text without leading and trailing line breaks: what Foundation's
    /// `trimmingCharacters(in: .newlines)` removes (LF, VT, FF, CR, NEL, LS, PS).
    func trimmingNewlines() -> String {
        guard let first = firstIndex(where: { !$0.isNewline }), let last = lastIndex(where: { !$0.isNewline }) else {
            return ""
        }
        return String(self[first...last])
    }
}
