/// What an audit entry records, one value per kind of action. The raw values are the audit
/// trail's format — stored entries, audit delivery, the journal and tests read them — so a raw
/// value never changes once shipped; a new action is a new static member.
///
/// Each action is declared once, below: the place for anything else that belongs to one kind of
/// action (for example the journal MESSAGE_ID its entries are logged with).
public struct AuditAction: Sendable, Hashable, CustomStringConvertible {
    /// The action as stored, e.g. `person.add`.
    public let rawValue: String

    init(_ rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }

    static let accessRefusedSummary = AuditAction("access.refused.summary")

    static let accountCheck = AuditAction("account.check")

    static let activationCheck = AuditAction("activation.check")
    static let activationComplete = AuditAction("activation.complete")
    static let activationIssue = AuditAction("activation.issue")
    static let activationRevoke = AuditAction("activation.revoke")

    static let auditRead = AuditAction("audit.read")
    static let auditVerify = AuditAction("audit.verify")

    static let clockBackwards = AuditAction("clock.backwards")

    static let daemonStart = AuditAction("daemon.start")
    static let daemonStop = AuditAction("daemon.stop")

    static let fingerEnroll = AuditAction("finger.enroll")
    static let fingerIdentify = AuditAction("finger.identify")
    static let fingerList = AuditAction("finger.list")
    static let fingerRemove = AuditAction("finger.remove")
    static let fingerThrottle = AuditAction("finger.throttle")
    static let fingerVerify = AuditAction("finger.verify")

    static let idpCircuit = AuditAction("idp.circuit")
    static let idpLogin = AuditAction("idp.login")
    static let idpRefresh = AuditAction("idp.refresh")
    static let idpRevoke = AuditAction("idp.revoke")
    static let idpRoles = AuditAction("idp.roles")

    static let lockoutReset = AuditAction("lockout.reset")

    static let metrics = AuditAction("metrics")

    static let passcodeBusy = AuditAction("passcode.busy")
    static let passcodeSet = AuditAction("passcode.set")
    static let passcodeVerify = AuditAction("passcode.verify")

    static let personAdd = AuditAction("person.add")
    static let personBind = AuditAction("person.bind")
    static let personBiometricOffer = AuditAction("person.biometric-offer")
    static let personExport = AuditAction("person.export")
    static let personList = AuditAction("person.list")
    static let personRemove = AuditAction("person.remove")
    static let personResume = AuditAction("person.resume")
    static let personShow = AuditAction("person.show")
    static let personSuspend = AuditAction("person.suspend")

    static let readerAdded = AuditAction("reader.added")
    static let readerReconcile = AuditAction("reader.reconcile")
    static let readerRemoved = AuditAction("reader.removed")

    static let sessionActivity = AuditAction("session.activity")
    static let sessionAuthenticate = AuditAction("session.authenticate")
    static let sessionClose = AuditAction("session.close")
    static let sessionEnd = AuditAction("session.end")
    static let sessionList = AuditAction("session.list")
    static let sessionLock = AuditAction("session.lock")
    static let sessionOpen = AuditAction("session.open")
    static let sessionSecurityLogout = AuditAction("session.security-logout")
    static let sessionStepUp = AuditAction("session.step-up")
    static let sessionToken = AuditAction("session.token")

    static let storeIntegrity = AuditAction("store.integrity")

    static let fleetApply = AuditAction("fleet.apply")
    static let fleetCreate = AuditAction("fleet.create")
    static let fleetJoin = AuditAction("fleet.join")
    static let fleetLeave = AuditAction("fleet.leave")
    static let fleetMigrate = AuditAction("fleet.migrate")
    static let fleetReject = AuditAction("fleet.reject")
    /// An admin removed another terminal from the fleet (`FleetRemoveTerminal`).
    static let fleetRemove = AuditAction("fleet.remove")
    /// The directory says this terminal was removed; it forgot its data keys and its queue.
    static let fleetRemoved = AuditAction("fleet.removed")
    /// This terminal published the data-key generation a removal owed.
    static let fleetRotate = AuditAction("fleet.rotate")
    static let fleetTerminals = AuditAction("fleet.terminals")
    static let fleetStatus = AuditAction("fleet.status")
    static let fleetSync = AuditAction("fleet.sync")
    static let fleetToken = AuditAction("fleet.token")

    static let status = AuditAction("status")

    static let clock = AuditAction("clock")
    static let connectivity = AuditAction("connectivity")
    static let offlineWindow = AuditAction("offline-window")
    static let rateLimited = AuditAction("rate-limited")
}

/// How an audited action ended, as stored.
public enum AuditResult: String, Sendable {
    case success, failure, refused
}
