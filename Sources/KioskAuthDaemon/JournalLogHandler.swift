public import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// Log lines for systemd's journal: when standard error is the journal stream (`JOURNAL_STREAM`
/// names its device and inode), each line starts with its syslog priority (`<6>`), so journald
/// files it at the right level, and carries no timestamp of its own (the journal adds one).
/// Otherwise lines look like swift-log's stream handler: a timestamp, the level, the label.
///
/// One `write(2)` per line, so lines from several threads never interleave.
///
/// With a `JournalSocket` (see `JournalSocket.fromEnvironment`), each event is instead one
/// datagram in journald's native protocol, so its metadata become journal fields that admins
/// filter on (`journalctl MESSAGE_ID=…`, `KIOSKAUTH_PERSON_ID=…`); if a datagram cannot be sent
/// the line goes to standard error as above.
public struct JournalLogHandler: LogHandler {
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level = .info
    public var metadataProvider: Logger.MetadataProvider?
    private let label: String
    private let toJournal: Bool
    private let native: JournalSocket?

    public init(
        label: String, toJournal: Bool = JournalLogHandler.standardErrorIsJournal(), native: JournalSocket? = nil
    ) {
        self.label = label
        self.toJournal = toJournal
        self.native = native
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    /// Whether standard error is connected to the journal (systemd sets `JOURNAL_STREAM` to
    /// `DEVICE:INODE` of the stream it gave the service).
    public static func standardErrorIsJournal() -> Bool {
        guard let value = getenv("JOURNAL_STREAM").map({ String(cString: $0) }) else { return false }
        let parts = value.split(separator: ":")
        guard parts.count == 2, let device = UInt64(parts[0]), let inode = UInt64(parts[1]) else { return false }
        var status = stat()
        guard fstat(2, &status) == 0 else { return false }
        return UInt64(status.st_dev) == device && UInt64(status.st_ino) == inode
    }

    /// The syslog priority of a level.
    public static func priority(of level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: return 7
        case .info: return 6
        case .notice: return 5
        case .warning: return 4
        case .error: return 3
        case .critical: return 2
        }
    }

    /// One line, newline included. What ends a line for journald's stream (LF, and NUL) and CR
    /// inside the message and the values are written as `\n`, `\0` and `\r`, so one event is
    /// always one line: a value from outside (a reason an identity provider gave, say) cannot
    /// start a line of its own, with a priority prefix of its own.
    ///
    /// Built from bytes: the daemon logs on every audited call and at every start, and the
    /// Character-based replacing and quoting this replaced cost tens of microseconds a line.
    public static func line(
        level: Logger.Level, label: String, message: String, metadata: Logger.Metadata, toJournal: Bool,
        timestamp: () -> String
    ) -> String {
        var text = toJournal ? "<\(priority(of: level))>" : "\(timestamp()) \(level) \(label): "
        text += singleLine(message)
        for key in metadata.keys.sorted() {
            text += " "
            text += key
            text += "="
            text += quoted(metadata[key]!.description)
        }
        text += "\n"
        return text
    }

    /// `message` with its line feeds, carriage returns and NULs written as `\n`, `\r` and `\0`.
    static func singleLine(_ message: String) -> String {
        guard message.utf8.contains(where: { $0 == 0x0A || $0 == 0x0D || $0 == 0 }) else { return message }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(message.utf8.count + 8)
        for byte in message.utf8 {
            switch byte {
            case 0x0A: bytes += [0x5C, 0x6E]
            case 0x0D: bytes += [0x5C, 0x72]
            case 0x00: bytes += [0x5C, 0x30]
            default: bytes.append(byte)
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// A metadata value as one token: quoted when it is empty or has spaces, quotes, `=`, NULs or
    /// line breaks (any of Unicode's: LF, VT, FF, CR, NEL, LS, PS); inside the quotes `"` and `\`
    /// are escaped, and LF, CR and NUL written as `\n`, `\r` and `\0`. Scalar by scalar: a quote
    /// or a space followed by a combining mark is quoted too (the Character-based quoting before
    /// it saw one Character there, neither a quote nor a space, and let it through).
    static func quoted(_ value: String) -> String {
        // Printable ASCII other than space, quote and `=`: most values, taken as they are.
        if !value.isEmpty,
            value.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") && $0 != UInt8(ascii: "=") })
        {
            return value
        }
        let needsQuotes =
            value.isEmpty
            || value.unicodeScalars.contains {
                $0 == " " || $0 == "\"" || $0 == "=" || $0 == "\0" || ("\n"..."\r").contains($0) || $0 == "\u{85}"
                    || $0 == "\u{2028}" || $0 == "\u{2029}"
            }
        guard needsQuotes else { return value }
        var out = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\0": out += "\\0"
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
        return out
    }

    public func log(event: LogEvent) {
        var merged = metadata
        if let provided = metadataProvider?.get() { merged.merge(provided) { $1 } }
        if let extra = event.metadata { merged.merge(extra) { $1 } }
        if let native,
            native.send(
                JournalSocket.datagram(
                    level: event.level, identifier: label, message: "\(event.message)", metadata: merged))
        {
            return
        }
        let text = Self.line(
            level: event.level, label: label, message: "\(event.message)", metadata: merged, toJournal: toJournal,
            timestamp: Self.timestamp)
        var bytes = Array(text.utf8)
        bytes.withUnsafeMutableBytes { buffer in
            var offset = 0
            while offset < buffer.count {
                let written = write(2, buffer.baseAddress! + offset, buffer.count - offset)
                if written < 0 {
                    if errno == EINTR { continue }
                    return
                }
                offset += written
            }
        }
    }

    private static func timestamp() -> String {
        var now = time(nil)
        var parts = tm()
        localtime_r(&now, &parts)
        var buffer = [CChar](repeating: 0, count: 32)
        let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%S%z", &parts)
        return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
