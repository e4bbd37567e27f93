/// A fleet failure. A struct over a private enum so new cases never break callers; `code` says
/// which named error it becomes once the daemon adopts the fleet.
public struct FleetError: Error, CustomStringConvertible, Sendable {
    /// What went wrong.
    public enum Code: String, Sendable {
        /// The directory address is malformed, or asks for plain text to a host that is not
        /// this machine.
        case badEndpoint
        /// The directory could not be reached or answered with an error.
        case directoryUnavailable
        /// The directory's schema is newer than this build.
        case futureSchema
        /// The directory's schema is older than what was asked needs: its owner migrates it
        /// (`kioskauthctl fleet migrate`).
        case outdatedSchema
        /// The join token is unknown, used, expired, or its proof does not open.
        case joinRefused
        /// A key is missing, malformed, or does not open what it should.
        case keyUnavailable
        /// A sealed value failed to open: wrong key, edited bytes, or moved to another row.
        case integrity
        /// The terminal is not a member of the fleet.
        case notMember
        /// The directory's state does not allow the request (e.g. a second bootstrap).
        case conflict
        /// The directory has no such terminal.
        case notFound
        /// The directory refused the request to this terminal's database role: acting for
        /// another terminal, or a privilege terminals do not have (SQLSTATE 42501).
        case permissionDenied
    }

    package enum Kind: Sendable, Codable {
        case badEndpoint(String)
        case directoryUnavailable(String)
        case connectionClosed
        case futureSchema(found: Int32, supported: Int32)
        case outdatedSchema(found: Int32, needed: Int32, String)
        case joinRefused(String)
        case keyUnavailable(String)
        case integrity(String)
        case notMember(String)
        case conflict(String)
        case notFound(String)
        case permissionDenied(String)
    }

    package let kind: Kind
    /// Where the error was raised.
    public let file: String
    public let line: Int

    package init(_ kind: Kind, file: String = #fileID, line: Int = #line) {
        self.kind = kind
        self.file = file
        self.line = line
    }

    /// The error's code.
    public var code: Code {
        switch kind {
        case .badEndpoint: .badEndpoint
        case .directoryUnavailable, .connectionClosed: .directoryUnavailable
        case .futureSchema: .futureSchema
        case .outdatedSchema: .outdatedSchema
        case .joinRefused: .joinRefused
        case .keyUnavailable: .keyUnavailable
        case .integrity: .integrity
        case .notMember: .notMember
        case .conflict: .conflict
        case .notFound: .notFound
        case .permissionDenied: .permissionDenied
        }
    }

    /// The connection had closed before the call was sent: the directory was asked nothing.
    public var isClosedBeforeSending: Bool {
        if case .connectionClosed = kind { return true }
        return false
    }

    public var description: String {
        switch kind {
        case .badEndpoint(let reason): "bad directory address: \(reason)"
        case .directoryUnavailable(let reason): "directory unavailable: \(reason)"
        case .connectionClosed: "directory unavailable: the connection had closed before the call was sent"
        case .futureSchema(let found, let supported):
            "the directory's schema is version \(found); this build knows up to \(supported)"
        case .outdatedSchema(let found, let needed, let what):
            "the directory's schema is version \(found); \(what) needs version \(needed): run kioskauthctl fleet migrate with the owner's URL"
        case .joinRefused(let reason): "join refused: \(reason)"
        case .keyUnavailable(let reason): "fleet key unavailable: \(reason)"
        case .integrity(let reason): "fleet integrity: \(reason)"
        case .notMember(let reason): "not a fleet member: \(reason)"
        case .conflict(let reason): "fleet conflict: \(reason)"
        case .notFound(let reason): "not found in the fleet: \(reason)"
        case .permissionDenied(let reason): "fleet permission denied: \(reason)"
        }
    }
}
