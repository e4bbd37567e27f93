// Small text helpers in place of Foundation's `NSString` and `CharacterSet` methods (the daemon
// does not load Foundation; docs/footprint.md).

#if canImport(Glibc)
    import Glibc
#endif

/// The process environment, one variable at a time (`getenv`), or the dictionary a test gives.
/// `ProcessInfo.environment` builds a dictionary of every variable on each use, and start-up
/// read it five times.
struct EnvironmentLookup: Sendable {
    private let given: [String: String]?

    init(_ given: [String: String]?) { self.given = given }

    subscript(_ name: String) -> String? {
        if let given { return given[name] }
        return getenv(name).map { String(cString: $0) }
    }
}

/// Reading a small text file with plain system calls: what start-up reads (the configuration,
/// login.defs) is read before anything else runs, and the first use of FoundationEssentials' file
/// reading costs a good part of a millisecond there.
enum TextFile {
    struct Failure: Error {
        /// `cannot read: <reason>`.
        var message: String
    }

    /// The whole of the file at `path`, which must be UTF-8; a leading byte-order mark is dropped
    /// (as systemd's own parser and FoundationEssentials' reading did).
    static func read(_ path: String) throws(Failure) -> String {
        var bytes = try self.bytes(path)
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { bytes.removeFirst(3) }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw Failure(message: "cannot read: not UTF-8 text")
        }
        return text
    }

    /// The whole of the file at `path`, as it is.
    static func bytes(_ path: String) throws(Failure) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw Failure(message: "cannot read: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16_384)
        while true {
            let count = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if count == 0 { break }
            guard count > 0 else {
                if errno == EINTR { continue }
                throw Failure(message: "cannot read: \(String(cString: strerror(errno)))")
            }
            bytes += chunk.prefix(count)
        }
        return bytes
    }
}

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
        // The kept scalars' bytes, copied whole: appending them scalar by scalar went through
        // unspecialised generic code, most of what reading the configuration cost.
        return String(decoding: utf8[first..<scalars.index(after: last)], as: UTF8.self)
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
