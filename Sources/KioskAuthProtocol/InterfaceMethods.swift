/// One method of io.kioskauth: its name, the types of its input and output, and the errors it may
/// return besides those any call may get (`KioskAuthError.anyCall`). The daemon routes calls by
/// these, the CLI calls through them, and a test checks every one against `io.kioskauth.varlink`.
public struct VarlinkMethod<Input: Codable & Sendable, Output: Codable & Sendable>: Sendable {
    /// The method's name within the interface, e.g. `AddPerson`.
    public let name: String
    /// The errors this method may return besides `KioskAuthError.anyCall`.
    public let errors: [VarlinkErrorDescriptor]
    /// Fields of `Output` this method never sends, because the type is shared with methods that do
    /// (`Message.ScanReply`); the interface description does not list them for this method.
    public let unsentOutputFields: [String]

    public init(_ name: String, errors: [VarlinkErrorDescriptor], unsentOutputFields: [String] = []) {
        self.name = name
        self.errors = errors
        self.unsentOutputFields = unsentOutputFields
    }

    /// The fully qualified name a call carries, e.g. `io.kioskauth.AddPerson`.
    public var qualifiedName: String { KioskAuthInterface.name + "." + name }

    /// The method with its types erased, for listing.
    public var erased: AnyVarlinkMethod {
        AnyVarlinkMethod(
            name: name, input: Input.self, output: Output.self, errors: errors, unsentOutputFields: unsentOutputFields)
    }
}

/// A method with its input and output types erased.
public struct AnyVarlinkMethod: Sendable {
    public let name: String
    public let input: any (Codable & Sendable).Type
    public let output: any (Codable & Sendable).Type
    public let errors: [VarlinkErrorDescriptor]
    public let unsentOutputFields: [String]
}

/// Every method of io.kioskauth.
public enum KioskAuthMethod {
    private typealias E = KioskAuthError

    // The daemon and people.
    public static let getStatus = VarlinkMethod<Message.GetStatus, Message.Status>(
        "GetStatus", errors: [E.storeIntegrity])
    public static let getMetrics = VarlinkMethod<Message.Empty, Message.Metrics>(
        "GetMetrics", errors: [E.permissionDenied])
    public static let addPerson = VarlinkMethod<Message.AddPerson, Message.PersonAdded>(
        "AddPerson", errors: [E.permissionDenied, E.personExists, E.bindingRefused, E.storeIntegrity])
    public static let listPeople = VarlinkMethod<Message.Empty, Message.People>(
        "ListPeople", errors: [E.permissionDenied, E.storeIntegrity])
    public static let bindAccount = VarlinkMethod<Message.BindAccount, Message.PersonReply>(
        "BindAccount", errors: [E.permissionDenied, E.noSuchPerson, E.personExists, E.bindingRefused, E.storeIntegrity])
    public static let suspendPerson = VarlinkMethod<Message.SuspendPerson, Message.PersonReply>(
        "SuspendPerson", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let resumePerson = VarlinkMethod<Message.Name, Message.PersonReply>(
        "ResumePerson", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let getPerson = VarlinkMethod<Message.Name, Message.PersonReply>(
        "GetPerson", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let removePerson = VarlinkMethod<Message.Name, Message.Empty>(
        "RemovePerson", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])

    // Passcodes.
    public static let setPasscode = VarlinkMethod<Message.SetPasscode, Message.PersonReply>(
        "SetPasscode",
        errors: [
            E.busy,
            E.permissionDenied, E.noSuchPerson, E.ticketInvalid, E.weakPasscode, E.passcodeNotAllowed,
            E.storeIntegrity,
        ])
    public static let verifyPasscode = VarlinkMethod<Message.VerifyPasscode, Message.PasscodeVerified>(
        "VerifyPasscode",
        errors: [
            E.busy,
            E.permissionDenied, E.noSuchPerson, E.accountNotAllowed, E.wrongPasscode, E.passcodeLocked,
            E.noPasscode, E.personNotActive, E.passcodeNotAllowed, E.offlineWindowExpired, E.onlineLoginRequired,
            E.storeIntegrity,
        ])
    public static let resetLockout = VarlinkMethod<Message.Name, Message.PersonReply>(
        "ResetLockout", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])

    // The audit trail.
    public static let getAudit = VarlinkMethod<Message.GetAudit, Message.AuditEvents>(
        "GetAudit", errors: [E.permissionDenied, E.storeIntegrity])
    public static let verifyAudit = VarlinkMethod<Message.VerifyAudit, Message.AuditVerification>(
        "VerifyAudit", errors: [E.permissionDenied, E.storeIntegrity])

    // Fingerprints.
    public static let getReaders = VarlinkMethod<Message.Empty, Message.Readers>("GetReaders", errors: [])
    public static let enrollFinger = VarlinkMethod<Message.EnrollFinger, Message.ScanReply>(
        "EnrollFinger",
        errors: [
            E.permissionDenied, E.noSuchPerson, E.ticketInvalid, E.personNotActive, E.fingerprintNotAllowed,
            E.noReader, E.readerUnavailable, E.readerRemoved, E.readerFull, E.fingerAlreadyEnrolled,
            E.tooManyFingers, E.scanRetry, E.scanTimeout, E.scanCancelled, E.storeIntegrity,
        ],
        unsentOutputFields: ["rosterSize"])
    public static let listFingers = VarlinkMethod<Message.Name, Message.Fingers>(
        "ListFingers", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let removeFinger = VarlinkMethod<Message.RemoveFinger, Message.Removed>(
        "RemoveFinger", errors: [E.permissionDenied, E.noSuchPerson, E.noFingers, E.storeIntegrity])
    public static let verifyFinger = VarlinkMethod<Message.VerifyFinger, Message.ScanReply>(
        "VerifyFinger",
        errors: [
            E.permissionDenied, E.noSuchPerson, E.accountNotAllowed, E.personNotActive, E.noFingers,
            E.fingerprintNotRecognized, E.fallbackRequired, E.fingerprintPaused, E.fingerprintNotAllowed,
            E.offlineWindowExpired, E.onlineLoginRequired, E.noReader, E.readerUnavailable, E.readerRemoved,
            E.scanRetry, E.scanTimeout, E.scanCancelled, E.storeIntegrity,
        ],
        unsentOutputFields: ["finger", "duplicateChecked", "rosterSize"])
    public static let identify = VarlinkMethod<Message.Identify, Message.ScanReply>(
        "Identify",
        errors: [
            E.permissionDenied, E.accountNotAllowed, E.notIdentified, E.identifyPaused, E.fingerprintNotAllowed,
            E.fallbackRequired, E.offlineWindowExpired, E.onlineLoginRequired, E.noReader, E.readerUnavailable,
            E.readerRemoved, E.scanRetry, E.scanTimeout, E.scanCancelled, E.storeIntegrity,
        ],
        unsentOutputFields: ["finger", "duplicateChecked"])

    // Activation.
    public static let issueActivationCode = VarlinkMethod<Message.Name, Message.ActivationCodeIssued>(
        "IssueActivationCode", errors: [E.permissionDenied, E.noSuchPerson, E.alreadyActive, E.storeIntegrity])
    public static let revokeActivationCode = VarlinkMethod<Message.Name, Message.Revoked>(
        "RevokeActivationCode", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let checkActivationCode = VarlinkMethod<Message.CheckActivationCode, Message.Verified>(
        "CheckActivationCode",
        errors: [
            E.permissionDenied, E.activationCodeWrong, E.activationCodeExpired, E.activationCodeUsed,
            E.activationCodeRevoked, E.activationPaused, E.alreadyActive, E.accountNotAllowed, E.storeIntegrity,
        ])
    public static let completeActivation = VarlinkMethod<Message.CompleteActivation, Message.Activated>(
        "CompleteActivation",
        errors: [
            E.busy,
            E.permissionDenied, E.ticketInvalid, E.weakPasscode, E.activationCodeExpired, E.activationCodeUsed,
            E.activationCodeRevoked, E.alreadyActive, E.storeIntegrity,
        ])
    public static let exportPerson = VarlinkMethod<Message.Name, Message.PersonExport>(
        "ExportPerson", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let checkAccount = VarlinkMethod<Message.CheckAccount, Message.AccountStatus>(
        "CheckAccount", errors: [E.permissionDenied, E.noSuchPerson, E.accountNotAllowed, E.storeIntegrity])

    // Online logins and connectivity.
    public static let checkOnlineLogin = VarlinkMethod<Message.CheckOnlineLogin, Message.OnlineLoginAllowed>(
        "CheckOnlineLogin",
        errors: [
            E.permissionDenied, E.identityProviderNotConfigured, E.onlineLoginNotAllowed, E.onlineLoginPaused,
            E.storeIntegrity,
        ])
    public static let loginWithPassword = VarlinkMethod<Message.LoginWithPassword, Message.OnlineLogin>(
        "LoginWithPassword", errors: onlineLoginErrors + [E.wrongCredentials])
    public static let startDeviceLogin = VarlinkMethod<Message.StartDeviceLogin, Message.OnlineLogin>(
        "StartDeviceLogin",
        errors: onlineLoginErrors + [VarlinkServiceError.expectedMore, E.deviceLoginDenied, E.deviceLoginExpired])
    public static let setBiometricOffer = VarlinkMethod<Message.SetBiometricOffer, Message.PersonReply>(
        "SetBiometricOffer", errors: [E.permissionDenied, E.noSuchPerson, E.ticketInvalid, E.storeIntegrity])
    public static let getConnectivity = VarlinkMethod<Message.GetConnectivity, Message.Connectivity>(
        "GetConnectivity", errors: [E.storeIntegrity])

    // Sessions.
    public static let openSession = VarlinkMethod<Message.OpenSession, Message.SessionReply>(
        "OpenSession",
        errors: [
            E.permissionDenied, E.noSuchPerson, E.ticketInvalid, E.accountNotAllowed, E.personNotActive,
            E.offlineWindowExpired, E.onlineLoginRequired, E.storeIntegrity,
        ])
    public static let closeSession = VarlinkMethod<Message.SessionID, Message.Empty>(
        "CloseSession", errors: sessionErrors)
    public static let lockSession = VarlinkMethod<Message.SessionID, Message.SessionReply>(
        "LockSession", errors: sessionErrors)
    public static let reportActivity = VarlinkMethod<Message.SessionID, Message.SessionReply>(
        "ReportActivity", errors: sessionErrors + [E.sessionLocked])
    public static let authenticateSession = VarlinkMethod<Message.AuthenticateSession, Message.SessionReply>(
        "AuthenticateSession", errors: sessionErrors + [E.ticketInvalid, E.staleAuthentication])
    public static let stepUp = VarlinkMethod<Message.StepUp, Message.StepUpReply>(
        "StepUp", errors: sessionErrors + [E.sessionLocked])
    public static let listSessions = VarlinkMethod<Message.ListSessions, Message.Sessions>(
        "ListSessions", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let endSessions = VarlinkMethod<Message.Name, Message.EndedSessions>(
        "EndSessions", errors: [E.permissionDenied, E.noSuchPerson, E.storeIntegrity])
    public static let getSessionToken = VarlinkMethod<Message.SessionID, Message.SessionToken>(
        "GetSessionToken",
        errors: sessionErrors + [
            E.sessionLocked, E.sessionNotAuthenticated, E.noAccessToken, E.identityProviderUnavailable,
            E.identityProviderRefused, E.subjectChanged,
        ])
    public static let subscribe = VarlinkMethod<Message.Empty, Message.Event>(
        "Subscribe", errors: [VarlinkServiceError.expectedMore])

    // Fleet.
    public static let fleetMigrate = VarlinkMethod<Message.FleetMigrate, Message.FleetMigrated>(
        "FleetMigrate", errors: [E.permissionDenied, E.fleetUnreachable, E.fleetPermissionDenied, E.fleetError])
    public static let fleetCreate = VarlinkMethod<Message.FleetCreate, Message.FleetCreated>(
        "FleetCreate",
        errors: [E.permissionDenied, E.fleetAlreadyMember, E.fleetUnreachable, E.fleetPermissionDenied, E.fleetError])
    public static let fleetIssueJoinToken = VarlinkMethod<Message.FleetIssueJoinToken, Message.FleetJoinToken>(
        "FleetIssueJoinToken",
        errors: [
            E.permissionDenied, E.fleetNotConfigured, E.fleetRemoved, E.fleetUnreachable, E.fleetPermissionDenied,
            E.fleetError,
        ])
    public static let fleetJoin = VarlinkMethod<Message.FleetJoin, Message.FleetJoined>(
        "FleetJoin",
        errors: [
            E.permissionDenied, E.fleetAlreadyMember, E.fleetUnreachable, E.fleetTokenInvalid, E.fleetPermissionDenied,
            E.fleetError,
        ])
    public static let fleetStatus = VarlinkMethod<Message.Empty, Message.FleetStatus>(
        "FleetStatus", errors: [E.permissionDenied, E.storeIntegrity])
    public static let fleetSync = VarlinkMethod<Message.Empty, Message.Empty>(
        "FleetSync",
        errors: [
            E.permissionDenied, E.fleetNotConfigured, E.fleetRemoved, E.fleetUnreachable, E.fleetPermissionDenied,
            E.fleetError,
        ])
    public static let fleetTerminals = VarlinkMethod<Message.Empty, Message.FleetTerminals>(
        "FleetTerminals",
        errors: [
            E.permissionDenied, E.fleetNotConfigured, E.fleetRemoved, E.fleetUnreachable, E.fleetPermissionDenied,
            E.fleetError,
        ])
    public static let fleetRemoveTerminal = VarlinkMethod<Message.FleetRemoveTerminal, Message.FleetTerminalRemoved>(
        "FleetRemoveTerminal",
        errors: [
            E.permissionDenied, E.invalidInput, E.fleetNotConfigured, E.fleetRemoved, E.fleetTerminalNotFound,
            E.fleetUnreachable, E.fleetPermissionDenied, E.fleetError,
        ])
    public static let fleetLeave = VarlinkMethod<Message.Empty, Message.Empty>(
        "FleetLeave",
        errors: [E.permissionDenied, E.fleetNotConfigured, E.fleetUnreachable, E.fleetPermissionDenied, E.fleetError])

    /// What an online login may be refused with, by the context rules or the provider.
    private static let onlineLoginErrors: [VarlinkErrorDescriptor] = [
        E.permissionDenied, E.identityProviderNotConfigured, E.onlineLoginNotAllowed, E.onlineLoginPaused,
        E.identityProviderUnavailable, E.identityProviderRefused, E.notAdmitted, E.unknownRole, E.subjectChanged,
        E.personNotActive, E.storeIntegrity,
    ]

    /// What a call about one open session may be refused with.
    private static let sessionErrors: [VarlinkErrorDescriptor] = [
        E.permissionDenied, E.noSuchSession, E.sessionEnded, E.storeIntegrity,
    ]

    /// Every method, in the order of `io.kioskauth.varlink`.
    public static let all: [AnyVarlinkMethod] = [
        getStatus.erased, getMetrics.erased, addPerson.erased, listPeople.erased, bindAccount.erased,
        suspendPerson.erased,
        resumePerson.erased, getPerson.erased, removePerson.erased, setPasscode.erased, verifyPasscode.erased,
        resetLockout.erased, getAudit.erased, verifyAudit.erased, getReaders.erased, enrollFinger.erased,
        listFingers.erased, removeFinger.erased, verifyFinger.erased, identify.erased, issueActivationCode.erased,
        revokeActivationCode.erased, checkActivationCode.erased, completeActivation.erased, exportPerson.erased,
        checkAccount.erased, checkOnlineLogin.erased, loginWithPassword.erased, startDeviceLogin.erased,
        setBiometricOffer.erased, getConnectivity.erased, openSession.erased, closeSession.erased,
        lockSession.erased, reportActivity.erased, authenticateSession.erased, stepUp.erased, listSessions.erased,
        endSessions.erased, getSessionToken.erased, subscribe.erased, fleetMigrate.erased,
        fleetCreate.erased, fleetIssueJoinToken.erased, fleetJoin.erased, fleetStatus.erased, fleetSync.erased,
        fleetTerminals.erased, fleetRemoveTerminal.erased, fleetLeave.erased,
    ]
}
