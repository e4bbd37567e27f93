import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

/// Options every subcommand shares.
struct GlobalOptions: ParsableArguments {
    @Option(help: "The daemon's socket (default: $KIOSKAUTH_SOCKET, else /run/kioskauth/io.kioskauth).")
    var socket: String?

    @Flag(help: "Print the daemon's replies as JSON.")
    var json = false

    var socketPath: String { Self.socketPath(socket) }

    /// `given` (--socket), else $KIOSKAUTH_SOCKET, else the system socket.
    static func socketPath(_ given: String?) -> String {
        given ?? ProcessInfo.processInfo.environment["KIOSKAUTH_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
            ?? "/run/kioskauth/io.kioskauth"
    }

    func connect() throws -> VarlinkClient {
        try VarlinkClient(socketPath: socketPath)
    }

    /// Calls `method` and prints the reply as JSON when asked to.
    @discardableResult
    func call<Input, Output>(_ method: VarlinkMethod<Input, Output>, _ input: Input) throws -> Output {
        let client = try connect()
        let parameters = try VarlinkCoding.encode(input)
        let reply = try client.call(method.qualifiedName, parameters: parameters)
        if json { printJSON(reply) }
        return try VarlinkCoding.decode(Output.self, from: reply)
    }
}

func printJSON(_ value: some Encodable) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
    if let data = try? encoder.encode(value) {
        // The encoder escapes C0 controls; C1 controls and bidirectional overrides it leaves raw,
        // so they become JSON escapes here: the same JSON, nothing a terminal acts on.
        var text = ""
        for scalar in String(decoding: data, as: UTF8.self).unicodeScalars {
            if scalar.value >= 0x7F, SafeText.isForbidden(scalar) {
                text += "\\u" + hex4(scalar.value)
            } else {
                text.unicodeScalars.append(scalar)
            }
        }
        Swift.print(text)
    }
}

/// Stored text (names, display names, services, audit details) as it is safe to show on a
/// terminal: control and bidirectional-override characters escaped (`\x1B`, `\u{202E}`).
func safe(_ text: String) -> String { SafeText.escaped(text) }
func safe(_ text: String?) -> String? { text.map(SafeText.escaped) }

/// Every line this tool prints goes through here: whatever a stored string holds, no control or
/// bidirectional-override character reaches the terminal raw (tabs and line ends the tool
/// writes itself are kept; the fields that could hold them are escaped with `safe` first).
func print(_ items: Any..., separator: String = " ", terminator: String = "\n") {
    let text = items.map { "\($0)" }.joined(separator: separator)
    let lines = text.split(separator: "\n", omittingEmptySubsequences: false).map { line in
        line.split(separator: "\t", omittingEmptySubsequences: false).map { SafeText.escaped(String($0)) }
            .joined(separator: "\t")
    }
    Swift.print(lines.joined(separator: "\n"), terminator: terminator)
}

/// Reads one secret line: without echo from a terminal, else a plain line from stdin.
func readSecret(prompt: String) throws -> String {
    if isatty(STDIN_FILENO) != 0 {
        writeStandardError(prompt)
        var saved = termios()
        tcgetattr(STDIN_FILENO, &saved)
        var silent = saved
        silent.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(STDIN_FILENO, TCSAFLUSH, &silent)
        defer {
            tcsetattr(STDIN_FILENO, TCSAFLUSH, &saved)
            writeStandardError("\n")
        }
        guard let line = Swift.readLine(strippingNewline: true) else { throw CleanExit.message("no input") }
        return line
    }
    guard let line = Swift.readLine(strippingNewline: true) else {
        throw ValidationError("expected the passcode on standard input")
    }
    return line
}

func iso(_ text: String?) -> String { text ?? "-" }

/// Writes to standard error, unbuffered (the tool uses no Foundation file handles).
func writeStandardError(_ text: String) { writeAll(STDERR_FILENO, text) }

/// Writes to standard output byte for byte (no escaping: for the metrics exposition).
func writeStandardOutput(_ text: String) { writeAll(STDOUT_FILENO, text) }

/// Writes all of `text` to `fd`, retrying on EINTR; stops quietly on any other error.
func writeAll(_ fd: Int32, _ text: String) {
    var bytes = Array(text.utf8)[...]
    while !bytes.isEmpty {
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if written < 0 && errno == EINTR { continue }
        if written <= 0 { return }
        bytes = bytes.dropFirst(written)
    }
}

/// Four lowercase hex digits (a `\u` escape's).
func hex4(_ value: UInt32) -> String {
    let digits = String(value, radix: 16)
    return String(repeating: "0", count: max(0, 4 - digits.count)) + digits
}

/// `seconds` rounded to one decimal, as "1.5".
func oneDecimal(_ seconds: Double) -> String {
    let tenths = Int((max(0, seconds) * 10).rounded())
    return "\(tenths / 10).\(tenths % 10)"
}

/// `text` padded with spaces to `width` characters (never cut: widths are the column's longest).
func padded(_ text: String, to width: Int) -> String {
    text + String(repeating: " ", count: max(0, width - text.count))
}
