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

    static func own(_ name: String, _ parameters: [String: JSONValue] = [:], closesConnection: Bool = false) -> APIError
    {
        APIError(VarlinkErrorName.own(name), parameters, closesConnection: closesConnection)
    }

    static func noSuchPerson(_ name: String) -> APIError { own("NoSuchPerson", ["name": .string(name)]) }
    static func personExists(_ name: String) -> APIError { own("PersonExists", ["name": .string(name)]) }
    static func permissionDenied(_ reason: String) -> APIError { own("PermissionDenied", ["reason": .string(reason)]) }
    static func invalidInput(_ field: String, _ message: String) -> APIError {
        own("InvalidInput", ["field": .string(field), "message": .string(message)])
    }
    static func invalidParameter(_ parameter: String) -> APIError {
        APIError(VarlinkErrorName.invalidParameter, ["parameter": .string(parameter)])
    }
    static func methodNotFound(_ method: String) -> APIError {
        APIError(VarlinkErrorName.methodNotFound, ["method": .string(method)])
    }
    static func interfaceNotFound(_ interface: String) -> APIError {
        APIError(VarlinkErrorName.interfaceNotFound, ["interface": .string(interface)])
    }
    static func malformed(_ reason: String) -> APIError {
        own("MalformedMessage", ["reason": .string(reason)], closesConnection: true)
    }
    static func tooLarge(_ limit: Int) -> APIError {
        own("MessageTooLarge", ["limit": .number(Double(limit))], closesConnection: true)
    }
    static func tooManyConnections(_ limit: Int) -> APIError {
        own("TooManyConnections", ["limit": .number(Double(limit))], closesConnection: true)
    }
    static func idleTimeout(_ seconds: Int) -> APIError {
        own("IdleTimeout", ["seconds": .number(Double(seconds))], closesConnection: true)
    }
    static func rateLimited(_ limit: Int, retryAfter: Double) -> APIError {
        own(
            "RateLimited",
            ["limit": .number(Double(limit)), "retryAfter": .number((retryAfter * 1000).rounded(.up) / 1000)])
    }
    static let shuttingDown = own("ShuttingDown", closesConnection: true)
    static func busy(pending: Int, retryAfter: Double) -> APIError {
        own("Busy", ["pending": .number(Double(pending)), "retryAfter": .number(retryAfter)])
    }
    static let ticketInvalid = own("TicketInvalid")

    /// The store's failures as API errors. Database failures say nothing about the data.
    static func store(_ error: StoreError) -> APIError {
        switch error.code {
        case .noSuchPerson: own("NoSuchPerson", ["name": .string("")])
        case .personExists: own("PersonExists", ["name": .string("")])
        case .integrity, .wrongKey, .rollback: own("StoreIntegrity", ["reason": .string(error.message)])
        case .keyUnavailable, .futureSchema, .database, .readOnly:
            own("InternalError", ["reason": .string("the store failed; see the journal")])
        }
    }
}
