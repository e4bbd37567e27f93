public import FoundationEssentials

#if canImport(Glibc)
    import Glibc
#endif

/// A failed call: the server's named error with its parameters, or a transport failure.
public struct VarlinkClientError: Error, CustomStringConvertible, Sendable {
    /// Fully qualified error name (`io.kioskauth.NoSuchPerson`), or a local one for transport
    /// failures (`io.kioskauth.client.Unreachable`).
    public var name: String
    /// The error's parameters.
    public var parameters: JSONValue?

    public init(name: String, parameters: JSONValue? = nil) {
        self.name = name
        self.parameters = parameters
    }

    /// The error name without its interface.
    public var shortName: String { String(name.split(separator: ".").last ?? Substring(name)) }

    public var description: String {
        if let parameters, case .object(let members) = parameters, !members.isEmpty,
            let data = try? JSONEncoder().encode(parameters), let text = String(data: data, encoding: .utf8)
        {
            return "\(name) \(text)"
        }
        return name
    }

    static let unreachable = "io.kioskauth.client.Unreachable"
    static let disconnected = "io.kioskauth.client.Disconnected"
    static let protocolViolation = "io.kioskauth.client.ProtocolViolation"
}

/// A blocking varlink client over a Unix stream socket: one connection, calls in order.
///
/// The CLI needs nothing more; the daemon's own server side is asynchronous.
public final class VarlinkClient {
    private let fd: Int32
    private var buffer: [UInt8] = []

    /// Connects to the socket at `path`.
    public init(socketPath path: String) throws(VarlinkClientError) {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            throw VarlinkClientError(
                name: VarlinkClientError.unreachable, parameters: .string(String(cString: strerror(errno))))
        }
        guard let result = UnixSocketAddress.with(path, { connect(fd, $0, $1) }) else {
            close(fd)
            throw VarlinkClientError(
                name: VarlinkClientError.unreachable, parameters: .string("socket path too long: \(path)"))
        }
        guard result == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw VarlinkClientError(name: VarlinkClientError.unreachable, parameters: .string("\(path): \(reason)"))
        }
        self.fd = fd
    }

    deinit { close(fd) }

    /// Calls `method` and returns its single reply's parameters, or throws its named error.
    public func call(_ method: String, parameters: JSONValue? = nil) throws(VarlinkClientError) -> JSONValue {
        try send(VarlinkCall(method: method, parameters: parameters))
        let reply = try receive()
        if let error = reply.error { throw VarlinkClientError(name: error, parameters: reply.parameters) }
        return reply.parameters ?? .object([:])
    }

    /// Calls `method` with typed input and output.
    public func call<Output: Decodable>(
        _ method: String, _ input: some Encodable, as output: Output.Type
    ) throws(VarlinkClientError) -> Output {
        let parameters: JSONValue
        do { parameters = try VarlinkCoding.encode(input) } catch {
            throw VarlinkClientError(name: VarlinkClientError.protocolViolation, parameters: .string("\(error)"))
        }
        let reply = try call(method, parameters: parameters)
        do { return try VarlinkCoding.decode(output, from: reply) } catch {
            throw VarlinkClientError(name: VarlinkClientError.protocolViolation, parameters: .string("\(error)"))
        }
    }

    /// Calls one of the interface's methods with its declared input, returning its declared output.
    public func call<Input, Output>(
        _ method: VarlinkMethod<Input, Output>, _ input: Input
    ) throws(VarlinkClientError) -> Output {
        try call(method.qualifiedName, input, as: Output.self)
    }

    /// Calls `method` with `more: true`, handing each reply to `body` until the last one.
    public func callMore(
        _ method: String, parameters: JSONValue?, _ body: (JSONValue) throws -> Void
    ) throws(VarlinkClientError) {
        try send(VarlinkCall(method: method, parameters: parameters, more: true))
        while true {
            let reply = try receive()
            if let error = reply.error { throw VarlinkClientError(name: error, parameters: reply.parameters) }
            do { try body(reply.parameters ?? .object([:])) } catch let error as VarlinkClientError {
                throw error
            } catch {
                throw VarlinkClientError(name: VarlinkClientError.protocolViolation, parameters: .string("\(error)"))
            }
            if reply.continues != true { return }
        }
    }

    private func send(_ call: VarlinkCall) throws(VarlinkClientError) {
        let bytes: [UInt8]
        do { bytes = try VarlinkCoding.frame(call) } catch {
            throw VarlinkClientError(name: VarlinkClientError.protocolViolation, parameters: .string("\(error)"))
        }
        var offset = 0
        while offset < bytes.count {
            // MSG_NOSIGNAL: a daemon that hung up (idle timeout, restart) is a Disconnected
            // error, not a SIGPIPE that kills the CLI without a word.
            let written = bytes[offset...].withUnsafeBytes {
                Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if written < 0 {
                if errno == EINTR { continue }
                throw VarlinkClientError(
                    name: VarlinkClientError.disconnected, parameters: .string(String(cString: strerror(errno))))
            }
            offset += written
        }
    }

    private func receive() throws(VarlinkClientError) -> VarlinkReply {
        while true {
            if let end = buffer.firstIndex(of: 0) {
                let message = buffer[..<end]
                defer { buffer.removeSubrange(...end) }
                do { return try VarlinkCoding.message(VarlinkReply.self, from: message) } catch {
                    throw VarlinkClientError(
                        name: VarlinkClientError.protocolViolation, parameters: .string("\(error)"))
                }
            }
            var chunk = [UInt8](repeating: 0, count: 16 * 1024)
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw VarlinkClientError(
                    name: VarlinkClientError.disconnected, parameters: .string(String(cString: strerror(errno))))
            }
            if count == 0 {
                throw VarlinkClientError(
                    name: VarlinkClientError.disconnected, parameters: .string("the daemon closed the connection"))
            }
            buffer.append(contentsOf: chunk[..<count])
            if buffer.count > 16 * VarlinkLimits.maximumMessageSize {
                throw VarlinkClientError(
                    name: VarlinkClientError.protocolViolation, parameters: .string("reply too large"))
            }
        }
    }
}
