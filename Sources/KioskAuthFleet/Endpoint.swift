import FoundationEssentials

/// Where the directory is and how to reach it. TLS is required unless the server is on this
/// machine (a Unix socket, or a loopback address), so a directory password, templates and
/// verifiers never cross a network in the clear, and a man in the middle cannot downgrade.
public struct FleetEndpoint: Sendable, Equatable, Codable {
    /// How the connection is made.
    public enum Transport: Sendable, Equatable, Codable {
        /// A Unix socket: the full path of the `.s.PGSQL.<port>` file.
        case unixSocket(path: String)
        /// TCP to a host name or address.
        case tcp(host: String, port: Int)
    }

    /// Whether TLS is used.
    public enum Security: Sendable, Equatable, Codable {
        /// TLS with the server's certificate checked against the system's roots, or against
        /// the CA file given (PEM), and its name against the host.
        case tls(rootCertificatePath: String?)
        /// No TLS: allowed only to this machine.
        case plaintext
    }

    public let transport: Transport
    public let security: Security
    public let username: String
    public let database: String

    /// Makes an endpoint; plain text to anything but this machine is refused here, before
    /// any connection is attempted.
    public init(transport: Transport, security: Security, username: String, database: String) throws(FleetError) {
        if case .plaintext = security, !transport.isLocal {
            throw FleetError(.badEndpoint("plain text is allowed only to a Unix socket or a loopback address"))
        }
        if case .unixSocket = transport, case .tls = security {
            throw FleetError(.badEndpoint("TLS over a Unix socket is not supported; use plain text locally"))
        }
        guard !username.isEmpty, !database.isEmpty else {
            throw FleetError(.badEndpoint("a user and a database are required"))
        }
        self.transport = transport
        self.security = security
        self.username = username
        self.database = database
    }

    /// Parses `postgres://USER@HOST[:PORT]/DATABASE[?sslmode=require|disable][&sslrootcert=PATH]`,
    /// or `postgres://USER@/DATABASE?host=SOCKET_DIRECTORY[&port=PORT]` for a Unix socket. A
    /// password in the address is refused: it comes from a systemd credential. TLS is the
    /// default; `sslmode=disable` is accepted only for this machine.
    public init(url string: String) throws(FleetError) {
        guard let components = URLComponents(string: string),
            components.scheme == "postgres" || components.scheme == "postgresql"
        else {
            throw FleetError(.badEndpoint("expected postgres://USER@HOST[:PORT]/DATABASE"))
        }
        guard components.password == nil else {
            throw FleetError(.badEndpoint("no password in the address; it comes from a credential"))
        }
        var query: [String: String] = [:]
        for item in components.queryItems ?? [] { query[item.name] = item.value ?? "" }
        let database = String(components.path.drop(while: { $0 == "/" }))
        let port = Int(query["port"] ?? "") ?? components.port ?? 5432
        let transport: Transport
        if let socketDirectory = query["host"], socketDirectory.hasPrefix("/") {
            transport = .unixSocket(path: "\(socketDirectory)/.s.PGSQL.\(port)")
        } else if let host = components.host, !host.isEmpty {
            // An IPv6 literal comes bracketed ("[::1]"): the brackets are not the address.
            let unbracketed = host.drop(while: { $0 == "[" || $0 == "]" }).reversed().drop(while: {
                $0 == "[" || $0 == "]"
            })
            transport = .tcp(host: String(unbracketed.reversed()), port: port)
        } else {
            throw FleetError(.badEndpoint("no host and no socket directory"))
        }
        let security: Security
        switch query["sslmode"] ?? "require" {
        case "disable": security = .plaintext
        case "require", "verify-full": security = .tls(rootCertificatePath: query["sslrootcert"])
        case let other: throw FleetError(.badEndpoint("sslmode \(other) is not supported (require or disable)"))
        }
        if case .unixSocket = transport, case .tls = security, query["sslmode"] == nil {
            try self.init(
                transport: transport, security: .plaintext, username: components.user ?? "", database: database)
        } else {
            try self.init(transport: transport, security: security, username: components.user ?? "", database: database)
        }
    }
}

extension FleetEndpoint.Transport {
    /// A Unix socket, `localhost`, 127.0.0.0/8 or ::1.
    public var isLocal: Bool {
        switch self {
        case .unixSocket: return true
        case .tcp(let host, _):
            if host == "localhost" || host == "::1" { return true }
            let octets = host.split(separator: ".", omittingEmptySubsequences: false)
            return octets.count == 4 && octets[0] == "127" && octets.allSatisfy { UInt8($0) != nil }
        }
    }
}
