import CKioskAuthSystem
import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// journald's native protocol (the datagrams `sd_journal_send` writes): one datagram per log
/// event, `FIELD=value` lines, so structured fields reach the journal without libsystemd.
///
/// The daemon uses it when standard error is the journal stream and journald's socket exists,
/// or when `KIOSKAUTH_JOURNAL_SOCKET` names another socket (tests bind one to read what the
/// daemon sends; a container may forward one). Thread-safe: `sendto(2)` on a datagram socket.
public final class JournalSocket: Sendable {
    /// journald's socket for native messages.
    public static let systemPath = "/run/systemd/journal/socket"
    /// Names a socket to send native journal datagrams to instead (tests, containers).
    public static let environmentOverride = "KIOSKAUTH_JOURNAL_SOCKET"

    private let fd: Int32
    /// Where the datagrams go.
    public let path: String

    /// A socket for sending to `path`; nil when no datagram socket can be made.
    public init?(path: String) {
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return nil }
        self.fd = fd
        self.path = path
    }

    deinit { close(fd) }

    /// The socket the daemon logs to natively, or nil to write lines to standard error: the
    /// override when set, else journald's socket when standard error is the journal stream.
    public static func fromEnvironment() -> JournalSocket? {
        if let value = getenv(environmentOverride).map({ String(cString: $0) }), !value.isEmpty {
            return JournalSocket(path: value)
        }
        guard JournalLogHandler.standardErrorIsJournal(), access(systemPath, W_OK) == 0 else { return nil }
        return JournalSocket(path: systemPath)
    }

    /// Sends one datagram without waiting; false when it could not be sent, also when the
    /// journal's queue is full (the caller falls back to a line on standard error, so a stalled
    /// journal never stalls an unlock).
    func send(_ datagram: [UInt8]) -> Bool {
        datagram.withUnsafeBytes { buffer in
            kioskauth_send_datagram(fd, path, buffer.baseAddress, buffer.count) == 0
        }
    }

    /// A metadata key as a journal field name: uppercase letters, digits and underscores, not
    /// starting with an underscore (those are journald's trusted fields) or a digit.
    static func fieldName(_ key: String) -> String? {
        var name = ""
        for scalar in key.unicodeScalars.prefix(64) {
            switch scalar {
            case "A"..."Z", "0"..."9", "_": name.unicodeScalars.append(scalar)
            case "a"..."z": name.unicodeScalars.append(Unicode.Scalar(scalar.value - 32)!)
            default: name += "_"
            }
        }
        guard let first = name.unicodeScalars.first, first != "_", !("0"..."9").contains(first) else { return nil }
        return name
    }

    /// One event as a native-protocol datagram: MESSAGE, PRIORITY, SYSLOG_IDENTIFIER and each
    /// metadata key as a field. Values with a newline use the binary form (name, newline,
    /// little-endian 64-bit length, value, newline).
    static func datagram(
        level: Logger.Level, identifier: String, message: String, metadata: Logger.Metadata
    )
        -> [UInt8]
    {
        var bytes: [UInt8] = []
        func append(_ name: String, _ value: String) {
            bytes += Array(name.utf8)
            let utf8 = Array(value.utf8)
            if utf8.contains(UInt8(ascii: "\n")) {
                bytes.append(UInt8(ascii: "\n"))
                withUnsafeBytes(of: UInt64(utf8.count).littleEndian) { bytes += $0 }
            } else {
                bytes.append(UInt8(ascii: "="))
            }
            bytes += utf8
            bytes.append(UInt8(ascii: "\n"))
        }
        append("MESSAGE", message)
        append("PRIORITY", "\(JournalLogHandler.priority(of: level))")
        append("SYSLOG_IDENTIFIER", identifier)
        var seen: Set<String> = ["MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER"]
        for key in metadata.keys.sorted() {
            guard let name = fieldName(key), seen.insert(name).inserted else { continue }
            append(name, "\(metadata[key]!)")
        }
        return bytes
    }
}
