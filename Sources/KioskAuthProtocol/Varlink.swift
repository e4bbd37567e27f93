public import FoundationEssentials

/// Limits of the socket API, shared by the daemon (which enforces them) and clients.
public enum VarlinkLimits {
    /// Largest message, in bytes, excluding the terminating NUL. Nothing on this API comes near
    /// it: templates and tokens never cross the socket.
    public static let maximumMessageSize = 64 * 1024
}

/// A call as a client sends it.
public struct VarlinkCall: Sendable, Codable {
    /// Fully qualified method name, `interface.Method`.
    public var method: String
    /// The method's input; absent means `{}`.
    public var parameters: JSONValue?
    /// The client accepts several replies, each but the last with `continues: true`.
    public var more: Bool?
    /// The client wants no reply.
    public var oneway: Bool?
    /// Protocol upgrade; not supported by this API.
    public var upgrade: Bool?

    public init(method: String, parameters: JSONValue? = nil, more: Bool? = nil, oneway: Bool? = nil) {
        self.method = method
        self.parameters = parameters
        self.more = more
        self.oneway = oneway
    }
}

/// A reply as the server sends it.
public struct VarlinkReply: Sendable, Codable {
    /// The method's output, or the error's parameters.
    public var parameters: JSONValue?
    /// More replies to the same call follow.
    public var continues: Bool?
    /// Fully qualified error name, when the call failed.
    public var error: String?

    public init(parameters: JSONValue? = nil, continues: Bool? = nil, error: String? = nil) {
        self.parameters = parameters
        self.continues = continues
        self.error = error
    }
}

/// Encoding and decoding of NUL-terminated varlink JSON messages.
public enum VarlinkCoding {
    /// Encodes a value as one message, NUL terminator included.
    public static func frame(_ value: some Encodable) throws -> [UInt8] {
        var bytes = try JSONValueEncoder().encode(value).serialized()
        bytes.append(0)
        return bytes
    }

    /// Decodes one message (without its NUL) as `type`.
    public static func message<T: Decodable>(_ type: T.Type, from bytes: some Sequence<UInt8>) throws -> T {
        try JSONValueDecoder().decode(type, from: try JSONValue.parse(bytes))
    }

    /// Decodes the typed parameters of a call or reply; a missing object decodes as `{}`.
    public static func decode<T: Decodable>(_ type: T.Type, from parameters: JSONValue?) throws -> T {
        try JSONValueDecoder().decode(type, from: parameters ?? .object([:]))
    }

    /// Encodes typed parameters as a JSON value.
    public static func encode(_ value: some Encodable) throws -> JSONValue {
        try JSONValueEncoder().encode(value)
    }

    /// The first parameter a decoding error is about, as varlink's `InvalidParameter` names it.
    public static func parameterName(of error: any Error) -> String {
        guard let error = error as? DecodingError else { return "parameters" }
        let path: [any CodingKey]
        switch error {
        case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
            path = context.codingPath
        case .keyNotFound(let key, let context):
            path = context.codingPath + [key]
        @unknown default:
            path = []
        }
        return path.first?.stringValue ?? "parameters"
    }
}

/// Standard varlink error names and this interface's own.
public enum VarlinkErrorName {
    public static let interfaceNotFound = VarlinkServiceError.interfaceNotFound.qualifiedName
    public static let methodNotFound = VarlinkServiceError.methodNotFound.qualifiedName
    public static let methodNotImplemented = VarlinkServiceError.methodNotImplemented.qualifiedName
    public static let invalidParameter = VarlinkServiceError.invalidParameter.qualifiedName
    public static let permissionDenied = VarlinkServiceError.permissionDenied.qualifiedName
    public static let expectedMore = VarlinkServiceError.expectedMore.qualifiedName

    /// A name in the io.kioskauth interface, e.g. `own("NoSuchPerson")`.
    public static func own(_ name: String) -> String { "\(KioskAuthInterface.name).\(name)" }
}
