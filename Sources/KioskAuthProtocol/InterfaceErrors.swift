/// One error of a varlink interface: its name and the names of its parameters, as the interface
/// description declares them. The daemon's error factories build their errors from these, and a
/// test checks every one against `io.kioskauth.varlink`.
public struct VarlinkErrorDescriptor: Sendable, Hashable, CustomStringConvertible {
    /// The interface that declares the error.
    public let interface: String
    /// The error's name within its interface, e.g. `NoSuchPerson`.
    public let name: String
    /// The names of its parameters, in declaration order.
    public let fields: [String]

    public init(interface: String, name: String, fields: [String]) {
        self.interface = interface
        self.name = name
        self.fields = fields
    }

    /// An error of io.kioskauth.
    init(own name: String, _ fields: [String]) {
        self.init(interface: KioskAuthInterface.name, name: name, fields: fields)
    }

    /// An error every varlink service declares (`org.varlink.service`).
    init(service name: String, _ fields: [String]) {
        self.init(interface: "org.varlink.service", name: name, fields: fields)
    }

    /// The fully qualified name a reply carries, e.g. `io.kioskauth.NoSuchPerson`.
    public var qualifiedName: String { interface + "." + name }

    public var description: String { qualifiedName }
}

/// The errors of `org.varlink.service` this daemon returns.
public enum VarlinkServiceError {
    public static let interfaceNotFound = VarlinkErrorDescriptor(service: "InterfaceNotFound", ["interface"])
    public static let methodNotFound = VarlinkErrorDescriptor(service: "MethodNotFound", ["method"])
    public static let methodNotImplemented = VarlinkErrorDescriptor(service: "MethodNotImplemented", ["method"])
    public static let invalidParameter = VarlinkErrorDescriptor(service: "InvalidParameter", ["parameter"])
    public static let permissionDenied = VarlinkErrorDescriptor(service: "PermissionDenied", [])
    public static let expectedMore = VarlinkErrorDescriptor(service: "ExpectedMore", [])
}

/// Every error io.kioskauth declares, in the order of `io.kioskauth.varlink`.
public enum KioskAuthError {
    // People and passcodes.
    public static let noSuchPerson = VarlinkErrorDescriptor(own: "NoSuchPerson", ["name"])
    public static let personExists = VarlinkErrorDescriptor(own: "PersonExists", ["name"])
    public static let bindingRefused = VarlinkErrorDescriptor(own: "BindingRefused", ["name", "reason"])
    public static let accountNotAllowed = VarlinkErrorDescriptor(own: "AccountNotAllowed", ["name", "reason"])
    public static let permissionDenied = VarlinkErrorDescriptor(own: "PermissionDenied", ["reason"])
    public static let invalidInput = VarlinkErrorDescriptor(own: "InvalidInput", ["field", "message"])
    public static let weakPasscode = VarlinkErrorDescriptor(own: "WeakPasscode", ["reason", "message"])
    public static let wrongPasscode = VarlinkErrorDescriptor(
        own: "WrongPasscode", ["failures", "until", "retryAfterSeconds"])
    public static let passcodeLocked = VarlinkErrorDescriptor(
        own: "PasscodeLocked", ["until", "retryAfterSeconds", "hardLocked"])
    public static let noPasscode = VarlinkErrorDescriptor(own: "NoPasscode", ["name"])
    public static let personNotActive = VarlinkErrorDescriptor(own: "PersonNotActive", ["name", "state"])
    public static let passcodeNotAllowed = VarlinkErrorDescriptor(own: "PasscodeNotAllowed", ["reason"])
    public static let ticketInvalid = VarlinkErrorDescriptor(own: "TicketInvalid", [])
    public static let storeIntegrity = VarlinkErrorDescriptor(own: "StoreIntegrity", ["reason"])

    // The connection.
    public static let messageTooLarge = VarlinkErrorDescriptor(own: "MessageTooLarge", ["limit"])
    public static let malformedMessage = VarlinkErrorDescriptor(own: "MalformedMessage", ["reason"])
    public static let tooManyConnections = VarlinkErrorDescriptor(own: "TooManyConnections", ["limit"])
    public static let rateLimited = VarlinkErrorDescriptor(own: "RateLimited", ["limit", "retryAfter"])
    public static let busy = VarlinkErrorDescriptor(own: "Busy", ["pending", "retryAfter"])
    public static let idleTimeout = VarlinkErrorDescriptor(own: "IdleTimeout", ["seconds"])

    // Fingerprints.
    public static let noReader = VarlinkErrorDescriptor(own: "NoReader", [])
    public static let fingerprintNotRecognized = VarlinkErrorDescriptor(
        own: "FingerprintNotRecognized", ["failures", "fallbackRequired", "fallback"])
    public static let fallbackRequired = VarlinkErrorDescriptor(own: "FallbackRequired", ["name", "fallback"])
    public static let notIdentified = VarlinkErrorDescriptor(own: "NotIdentified", ["unknownInARow", "askForName"])
    public static let identifyPaused = VarlinkErrorDescriptor(own: "IdentifyPaused", ["retryAfterSeconds"])
    public static let fingerprintPaused = VarlinkErrorDescriptor(own: "FingerprintPaused", ["retryAfterSeconds"])
    public static let noFingers = VarlinkErrorDescriptor(own: "NoFingers", ["name"])
    public static let fingerAlreadyEnrolled = VarlinkErrorDescriptor(own: "FingerAlreadyEnrolled", ["finger", "name"])
    public static let tooManyFingers = VarlinkErrorDescriptor(own: "TooManyFingers", ["max"])
    public static let scanRetry = VarlinkErrorDescriptor(own: "ScanRetry", ["hint"])
    public static let scanTimeout = VarlinkErrorDescriptor(own: "ScanTimeout", ["seconds"])
    public static let readerRemoved = VarlinkErrorDescriptor(own: "ReaderRemoved", [])
    public static let readerUnavailable = VarlinkErrorDescriptor(own: "ReaderUnavailable", ["reason"])
    public static let readerFull = VarlinkErrorDescriptor(own: "ReaderFull", [])
    public static let scanCancelled = VarlinkErrorDescriptor(own: "ScanCancelled", [])
    public static let fingerprintNotAllowed = VarlinkErrorDescriptor(own: "FingerprintNotAllowed", ["reason"])

    // Activation.
    public static let activationCodeWrong = VarlinkErrorDescriptor(
        own: "ActivationCodeWrong", ["message", "remainingTries"])
    public static let activationCodeExpired = VarlinkErrorDescriptor(own: "ActivationCodeExpired", ["message"])
    public static let activationCodeUsed = VarlinkErrorDescriptor(own: "ActivationCodeUsed", ["message"])
    public static let activationCodeRevoked = VarlinkErrorDescriptor(own: "ActivationCodeRevoked", ["message"])
    public static let activationPaused = VarlinkErrorDescriptor(
        own: "ActivationPaused", ["message", "retryAfterSeconds"])
    public static let alreadyActive = VarlinkErrorDescriptor(own: "AlreadyActive", ["name"])

    // The daemon.
    public static let shuttingDown = VarlinkErrorDescriptor(own: "ShuttingDown", [])
    public static let internalError = VarlinkErrorDescriptor(own: "InternalError", ["reason"])

    // The identity provider.
    public static let identityProviderNotConfigured = VarlinkErrorDescriptor(own: "IdentityProviderNotConfigured", [])
    public static let wrongCredentials = VarlinkErrorDescriptor(own: "WrongCredentials", [])
    public static let notAdmitted = VarlinkErrorDescriptor(own: "NotAdmitted", ["reason"])
    public static let unknownRole = VarlinkErrorDescriptor(own: "UnknownRole", ["reason"])
    public static let identityProviderUnavailable = VarlinkErrorDescriptor(
        own: "IdentityProviderUnavailable", ["reason"])
    public static let subjectChanged = VarlinkErrorDescriptor(own: "SubjectChanged", ["name", "reason"])
    public static let identityProviderRefused = VarlinkErrorDescriptor(own: "IdentityProviderRefused", ["reason"])
    public static let deviceLoginDenied = VarlinkErrorDescriptor(own: "DeviceLoginDenied", [])
    public static let deviceLoginExpired = VarlinkErrorDescriptor(own: "DeviceLoginExpired", [])
    public static let offlineWindowExpired = VarlinkErrorDescriptor(own: "OfflineWindowExpired", ["name", "message"])
    public static let onlineLoginRequired = VarlinkErrorDescriptor(
        own: "OnlineLoginRequired", ["name", "reason", "message"])

    // Sessions.
    public static let noSuchSession = VarlinkErrorDescriptor(own: "NoSuchSession", ["id"])
    public static let sessionEnded = VarlinkErrorDescriptor(own: "SessionEnded", ["id", "reason"])
    public static let sessionLocked = VarlinkErrorDescriptor(own: "SessionLocked", ["id"])
    public static let sessionNotAuthenticated = VarlinkErrorDescriptor(own: "SessionNotAuthenticated", ["id"])
    public static let staleAuthentication = VarlinkErrorDescriptor(own: "StaleAuthentication", ["id"])
    public static let noAccessToken = VarlinkErrorDescriptor(own: "NoAccessToken", ["reason"])
    public static let onlineLoginNotAllowed = VarlinkErrorDescriptor(own: "OnlineLoginNotAllowed", ["reason"])
    public static let onlineLoginPaused = VarlinkErrorDescriptor(
        own: "OnlineLoginPaused", ["message", "retryAfterSeconds"])

    /// Every error of the interface.
    // Fleet.
    public static let fleetNotConfigured = VarlinkErrorDescriptor(own: "FleetNotConfigured", [])
    public static let fleetUnreachable = VarlinkErrorDescriptor(own: "FleetUnreachable", ["reason"])
    public static let fleetTokenInvalid = VarlinkErrorDescriptor(own: "FleetTokenInvalid", ["reason"])
    public static let fleetAlreadyMember = VarlinkErrorDescriptor(own: "FleetAlreadyMember", ["directory"])
    public static let fleetError = VarlinkErrorDescriptor(own: "FleetError", ["reason"])
    public static let fleetPermissionDenied = VarlinkErrorDescriptor(own: "FleetPermissionDenied", ["reason"])
    public static let fleetRemoved = VarlinkErrorDescriptor(own: "FleetRemoved", ["reason"])
    public static let fleetTerminalNotFound = VarlinkErrorDescriptor(own: "FleetTerminalNotFound", ["terminal"])

    public static let all: [VarlinkErrorDescriptor] = [
        noSuchPerson, personExists, bindingRefused, accountNotAllowed, permissionDenied, invalidInput, weakPasscode,
        wrongPasscode, passcodeLocked, noPasscode, personNotActive, passcodeNotAllowed, ticketInvalid, storeIntegrity,
        messageTooLarge, malformedMessage, tooManyConnections, rateLimited, busy, idleTimeout,
        noReader, fingerprintNotRecognized, fallbackRequired, notIdentified, identifyPaused, fingerprintPaused,
        noFingers, fingerAlreadyEnrolled, tooManyFingers, scanRetry, scanTimeout, readerRemoved, readerUnavailable,
        readerFull, scanCancelled, fingerprintNotAllowed,
        activationCodeWrong, activationCodeExpired, activationCodeUsed, activationCodeRevoked, activationPaused,
        alreadyActive, shuttingDown, internalError,
        identityProviderNotConfigured, wrongCredentials, notAdmitted, unknownRole, identityProviderUnavailable,
        subjectChanged, identityProviderRefused, deviceLoginDenied, deviceLoginExpired, offlineWindowExpired,
        onlineLoginRequired,
        noSuchSession, sessionEnded, sessionLocked, sessionNotAuthenticated, staleAuthentication, noAccessToken,
        onlineLoginNotAllowed, onlineLoginPaused,
        fleetNotConfigured, fleetUnreachable, fleetTokenInvalid, fleetAlreadyMember, fleetError,
        fleetPermissionDenied, fleetRemoved, fleetTerminalNotFound,
    ]

    /// Every error of the interface by its name within the interface.
    public static let named: [String: VarlinkErrorDescriptor] = Dictionary(
        uniqueKeysWithValues: all.map { ($0.name, $0) })

    /// The errors any call may get, whatever the method: the connection's limits and protocol
    /// violations, a parameter that does not decode or a string that is not safe text, and the
    /// daemon's own failures.
    public static let anyCall: [VarlinkErrorDescriptor] = [
        VarlinkServiceError.invalidParameter, invalidInput, messageTooLarge, malformedMessage, tooManyConnections,
        rateLimited, idleTimeout, shuttingDown, internalError,
    ]
}
