public import KioskAuthProtocol
import KioskAuthStore

/// A named error of the socket API: exactly one varlink error per case, with its parameters.
public struct APIError: Error, CustomStringConvertible, Sendable {
    /// Fully qualified varlink error name.
    public let name: String
    /// The error's parameters, as the interface description declares them.
    public let parameters: JSONValue
    /// Whether the connection is closed after the reply (protocol violations).
    public let closesConnection: Bool

    init(_ name: String, _ parameters: [String: JSONValue] = [:], closesConnection: Bool = false) {
        self.name = name
        self.parameters = .object(parameters)
        self.closesConnection = closesConnection
    }

    public var description: String { "\(name) \(parameters)" }

    /// An error the interface declares, with parameters among those it declares.
    init(
        _ error: VarlinkErrorDescriptor, _ parameters: [String: JSONValue] = [:], closesConnection: Bool = false
    ) {
        assert(parameters.keys.allSatisfy(error.fields.contains), "\(error) declares no such parameter")
        self.init(error.qualifiedName, parameters, closesConnection: closesConnection)
    }

    /// An error of io.kioskauth by its name, which the interface must declare.
    static func own(_ name: String, _ parameters: [String: JSONValue] = [:], closesConnection: Bool = false) -> APIError
    {
        guard let error = KioskAuthError.named[name] else {
            assertionFailure("io.kioskauth declares no error \(name)")
            return APIError(VarlinkErrorName.own(name), parameters, closesConnection: closesConnection)
        }
        return APIError(error, parameters, closesConnection: closesConnection)
    }

    static func noSuchPerson(_ name: String) -> APIError {
        APIError(KioskAuthError.noSuchPerson, ["name": .string(name)])
    }
    static func personExists(_ name: String) -> APIError {
        APIError(KioskAuthError.personExists, ["name": .string(name)])
    }
    static func permissionDenied(_ reason: String) -> APIError {
        APIError(KioskAuthError.permissionDenied, ["reason": .string(reason)])
    }
    static func invalidInput(_ field: String, _ message: String) -> APIError {
        APIError(KioskAuthError.invalidInput, ["field": .string(field), "message": .string(message)])
    }
    static func invalidParameter(_ parameter: String) -> APIError {
        APIError(VarlinkServiceError.invalidParameter, ["parameter": .string(parameter)])
    }
    static func methodNotFound(_ method: String) -> APIError {
        APIError(VarlinkServiceError.methodNotFound, ["method": .string(method)])
    }
    static func interfaceNotFound(_ interface: String) -> APIError {
        APIError(VarlinkServiceError.interfaceNotFound, ["interface": .string(interface)])
    }
    static func malformed(_ reason: String) -> APIError {
        APIError(KioskAuthError.malformedMessage, ["reason": .string(reason)], closesConnection: true)
    }
    static func tooLarge(_ limit: Int) -> APIError {
        APIError(KioskAuthError.messageTooLarge, ["limit": .number(Double(limit))], closesConnection: true)
    }
    static func tooManyConnections(_ limit: Int) -> APIError {
        APIError(KioskAuthError.tooManyConnections, ["limit": .number(Double(limit))], closesConnection: true)
    }
    static func idleTimeout(_ seconds: Int) -> APIError {
        APIError(KioskAuthError.idleTimeout, ["seconds": .number(Double(seconds))], closesConnection: true)
    }
    static func rateLimited(_ limit: Int, retryAfter: Double) -> APIError {
        APIError(
            KioskAuthError.rateLimited,
            ["limit": .number(Double(limit)), "retryAfter": .number((retryAfter * 1000).rounded(.up) / 1000)])
    }
    static func internalError(_ reason: String) -> APIError {
        APIError(KioskAuthError.internalError, ["reason": .string(reason)])
    }
    static let shuttingDown = APIError(KioskAuthError.shuttingDown, closesConnection: true)
    static let ticketInvalid = APIError(KioskAuthError.ticketInvalid)
    static let expectedMore = APIError(VarlinkServiceError.expectedMore)
    static func busy(pending: Int, retryAfter: Double) -> APIError {
        APIError(KioskAuthError.busy, ["pending": .number(Double(pending)), "retryAfter": .number(retryAfter)])
    }

    /// The store's failures as API errors. Database failures say nothing about the data.
    static func store(_ error: StoreError) -> APIError {
        switch error.code {
        case .noSuchPerson: noSuchPerson("")
        case .personExists: personExists("")
        case .integrity, .wrongKey, .rollback:
            APIError(KioskAuthError.storeIntegrity, ["reason": .string(error.message)])
        case .keyUnavailable, .futureSchema, .database, .readOnly: internalError("the store failed; see the journal")
        }
    }
}
