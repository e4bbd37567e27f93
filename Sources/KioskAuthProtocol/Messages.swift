// Typed inputs and outputs of io.kioskauth methods, shared by the daemon and its clients.
// Field names are the interface description's; see io.kioskauth.varlink for their meaning.

/// A person as the API shows it; never carries a secret.
public struct PersonRecord: Codable, Sendable, Equatable {
    public var name: String
    public var displayName: String
    public var primaryRole: String
    public var roles: [String]
    public var origin: String
    public var state: String
    public var uid: Int?
    /// Why the binding no longer stands (its uid now names another account); nil when it stands.
    public var staleBinding: String? = nil
    public var hasPasscode: Bool
    public var fingers: [String]
    /// Enrolled fingers the reader's on-sensor storage lacked at its last check; nil when none.
    public var fingersMissingFromSensor: [String]? = nil
    public var passcodeFailures: Int
    public var passcodeLockedUntil: String?
    public var passcodeHardLocked: Bool
    public var fingerprintFailures: Int
    public var createdAt: String
    public var lastUnlockAt: String?
    /// Identity-provider people: their email address.
    public var email: String? = nil
    /// Whether fingerprint enrolment is offered after an online login (false once declined).
    public var biometricOffer: Bool? = nil
    /// Why local unlock is suspended until the next online login, if it is.
    public var suspendedReason: String? = nil
    /// Identity-provider people: their last successful contact with the provider.
    public var lastOnlineContactAt: String? = nil

    public init(
        name: String, displayName: String, primaryRole: String, roles: [String], origin: String,
        state: String, uid: Int?, hasPasscode: Bool, fingers: [String], passcodeFailures: Int,
        passcodeLockedUntil: String?, passcodeHardLocked: Bool, fingerprintFailures: Int,
        createdAt: String, lastUnlockAt: String?
    ) {
        self.name = name
        self.displayName = displayName
        self.primaryRole = primaryRole
        self.roles = roles
        self.origin = origin
        self.state = state
        self.uid = uid
        self.hasPasscode = hasPasscode
        self.fingers = fingers
        self.passcodeFailures = passcodeFailures
        self.passcodeLockedUntil = passcodeLockedUntil
        self.passcodeHardLocked = passcodeHardLocked
        self.fingerprintFailures = fingerprintFailures
        self.createdAt = createdAt
        self.lastUnlockAt = lastUnlockAt
    }
}

/// What the PAM module tells the daemon about the login it serves.
public struct CallerContext: Codable, Sendable, Equatable {
    public var service: String?
    public var ruid: Int?
    public var tty: String?
    public var remoteHost: String?
    public var remote: Bool?
    /// The uid of the Unix account PAM_USER names, when it names one.
    public var targetUid: Int?
    /// What logind said about the caller's session: "local", "remote", or "unavailable" and why.
    public var logind: String?

    public init(
        service: String? = nil, ruid: Int? = nil, tty: String? = nil, remoteHost: String? = nil, remote: Bool? = nil,
        targetUid: Int? = nil, logind: String? = nil
    ) {
        self.service = service
        self.ruid = ruid
        self.tty = tty
        self.remoteHost = remoteHost
        self.remote = remote
        self.targetUid = targetUid
        self.logind = logind
    }
}

/// One audit trail entry as the API shows it.
public struct AuditEventRecord: Codable, Sendable, Equatable {
    public var sequence: Int
    public var time: String
    public var action: String
    public var result: String
    public var person: String?
    public var method: String?
    public var callerUid: Int?
    public var callerPid: Int?
    public var service: String?
    public var detail: String?
    public var mac: String

    public init(
        sequence: Int, time: String, action: String, result: String, person: String?, method: String?,
        callerUid: Int?, callerPid: Int?, service: String?, detail: String?, mac: String
    ) {
        self.sequence = sequence
        self.time = time
        self.action = action
        self.result = result
        self.person = person
        self.method = method
        self.callerUid = callerUid
        self.callerPid = callerPid
        self.service = service
        self.detail = detail
        self.mac = mac
    }
}

/// Messages of each method, named after it.
public enum Message {
    public struct Empty: Codable, Sendable { public init() {} }

    public struct GetStatus: Codable, Sendable {
        /// Admins: also list who is locked out and the last unlocks (reads every person).
        public var summary: Bool?
        public init(summary: Bool? = nil) { self.summary = summary }
    }

    public struct Status: Codable, Sendable, Equatable {
        public var version: String
        public var schemaVersion: Int
        public var people: Int
        public var socketActivated: Bool
        public var developmentKey: Bool
        public var uptimeSeconds: Int
        public var auditEvents: Int
        public var auditHead: String
        /// Absent only from daemons older than audit delivery.
        public var auditDelivery: AuditDeliveryStatus?
        /// Admins only: people whose passcode is locked now.
        public var lockedOut: [LockedOutPerson]?
        /// Admins only: the most recent unlocks, newest first.
        public var lastUnlocks: [RecentUnlock]?
        public init(
            version: String, schemaVersion: Int, people: Int, socketActivated: Bool, developmentKey: Bool,
            uptimeSeconds: Int, auditEvents: Int, auditHead: String, auditDelivery: AuditDeliveryStatus?
        ) {
            self.version = version
            self.schemaVersion = schemaVersion
            self.people = people
            self.socketActivated = socketActivated
            self.developmentKey = developmentKey
            self.uptimeSeconds = uptimeSeconds
            self.auditEvents = auditEvents
            self.auditHead = auditHead
            self.auditDelivery = auditDelivery
        }
    }

    public struct Name: Codable, Sendable {
        public var name: String
        public init(name: String) { self.name = name }
    }

    public struct AddPerson: Codable, Sendable {
        public var name: String
        public var displayName: String?
        public var roles: [String]?
        public var uid: Int?
        public init(name: String, displayName: String? = nil, roles: [String]? = nil, uid: Int? = nil) {
            self.name = name
            self.displayName = displayName
            self.roles = roles
            self.uid = uid
        }
    }

    public struct SuspendPerson: Codable, Sendable {
        public var name: String
        public var reason: String?
        public init(name: String, reason: String?) {
            self.name = name
            self.reason = reason
        }
    }

    public struct BindAccount: Codable, Sendable {
        public var name: String
        public var uid: Int?
        public init(name: String, uid: Int?) {
            self.name = name
            self.uid = uid
        }
    }

    public struct PersonReply: Codable, Sendable {
        public var person: PersonRecord
        public init(person: PersonRecord) { self.person = person }
    }

    public struct People: Codable, Sendable {
        public var people: [PersonRecord]
        public init(people: [PersonRecord]) { self.people = people }
    }

    public struct SetPasscode: Codable, Sendable {
        public var name: String
        public var passcode: String
        public var confirmation: String
        public var ticket: String?
        public init(name: String, passcode: String, confirmation: String, ticket: String? = nil) {
            self.name = name
            self.passcode = passcode
            self.confirmation = confirmation
            self.ticket = ticket
        }
    }

    public struct VerifyPasscode: Codable, Sendable {
        public var name: String
        public var passcode: String
        public var context: CallerContext?
        public init(name: String, passcode: String, context: CallerContext? = nil) {
            self.name = name
            self.passcode = passcode
            self.context = context
        }
    }

    public struct Verified: Codable, Sendable {
        public var person: PersonRecord
        public var ticket: String
        public var ticketExpiresIn: Int
        public init(person: PersonRecord, ticket: String, ticketExpiresIn: Int) {
            self.person = person
            self.ticket = ticket
            self.ticketExpiresIn = ticketExpiresIn
        }
    }

    /// `VerifyPasscode`'s reply: `Verified`, and whether to offer enrolment here.
    public struct PasscodeVerified: Codable, Sendable {
        public var person: PersonRecord
        public var ticket: String
        public var ticketExpiresIn: Int
        /// Offer fingerprint enrolment on this terminal now (once; see the interface).
        public var offerFingerprint: Bool?
        public init(person: PersonRecord, ticket: String, ticketExpiresIn: Int, offerFingerprint: Bool? = nil) {
            self.person = person
            self.ticket = ticket
            self.ticketExpiresIn = ticketExpiresIn
            self.offerFingerprint = offerFingerprint
        }
    }

    public struct GetAudit: Codable, Sendable {
        public var after: Int?
        public var limit: Int?
        /// The newest `limit` events rather than the oldest (still oldest first).
        public var newest: Bool?
        public init(after: Int? = nil, limit: Int? = nil, newest: Bool? = nil) {
            self.after = after
            self.limit = limit
            self.newest = newest
        }
    }

    public struct AuditEvents: Codable, Sendable {
        public var events: [AuditEventRecord]
        public init(events: [AuditEventRecord]) { self.events = events }
    }

    public struct VerifyAudit: Codable, Sendable {
        /// A trusted head, `SEQ:MAC`.
        public var head: String?
        public init(head: String? = nil) { self.head = head }
    }

    public struct AuditVerification: Codable, Sendable {
        public var valid: Bool
        public var events: Int
        public var head: String
        public var brokenAt: Int?
        public var reason: String?
        public init(valid: Bool, events: Int, head: String, brokenAt: Int?, reason: String?) {
            self.valid = valid
            self.events = events
            self.head = head
            self.brokenAt = brokenAt
            self.reason = reason
        }
    }
}

/// A fingerprint reader as the API shows it.
public struct ReaderRecord: Codable, Sendable, Equatable {
    public var id: String
    public var driver: String
    public var name: String
    public var canIdentify: Bool
    public var hasStorage: Bool
    public var enrollStages: Int
    public var scanType: String

    public init(
        id: String, driver: String, name: String, canIdentify: Bool, hasStorage: Bool, enrollStages: Int,
        scanType: String
    ) {
        self.id = id
        self.driver = driver
        self.name = name
        self.canIdentify = canIdentify
        self.hasStorage = hasStorage
        self.enrollStages = enrollStages
        self.scanType = scanType
    }
}

/// Progress of a scan, streamed to `more` callers.
public struct ScanProgress: Codable, Sendable, Equatable {
    public var state: String
    public var stage: Int?
    public var stages: Int?
    public var hint: String?

    public init(state: String, stage: Int? = nil, stages: Int? = nil, hint: String? = nil) {
        self.state = state
        self.stage = stage
        self.stages = stages
        self.hint = hint
    }
}

extension Message {
    public struct Readers: Codable, Sendable {
        public var readers: [ReaderRecord]
        public init(readers: [ReaderRecord]) { self.readers = readers }
    }

    public struct EnrollFinger: Codable, Sendable {
        public var name: String
        public var finger: String?
        public var ticket: String?
        public var reader: String?
        public init(name: String, finger: String? = nil, ticket: String? = nil, reader: String? = nil) {
            self.name = name
            self.finger = finger
            self.ticket = ticket
            self.reader = reader
        }
    }

    /// Each reply of a scanning method: progress while scanning, the result at the end.
    public struct ScanReply: Codable, Sendable {
        public var progress: ScanProgress?
        public var person: PersonRecord?
        public var finger: String?
        public var duplicateChecked: Bool?
        public var ticket: String?
        public var ticketExpiresIn: Int?
        public var rosterSize: Int?
        public init(
            progress: ScanProgress? = nil, person: PersonRecord? = nil, finger: String? = nil,
            duplicateChecked: Bool? = nil,
            ticket: String? = nil, ticketExpiresIn: Int? = nil, rosterSize: Int? = nil
        ) {
            self.progress = progress
            self.person = person
            self.finger = finger
            self.duplicateChecked = duplicateChecked
            self.ticket = ticket
            self.ticketExpiresIn = ticketExpiresIn
            self.rosterSize = rosterSize
        }
    }

    public struct Fingers: Codable, Sendable {
        public var fingers: [String]
        /// Those of `fingers` the reader's on-sensor storage lacks; nil when none.
        public var missingFromSensor: [String]?
        public init(fingers: [String], missingFromSensor: [String]? = nil) {
            self.fingers = fingers
            self.missingFromSensor = missingFromSensor
        }
    }

    public struct RemoveFinger: Codable, Sendable {
        public var name: String
        public var finger: String?
        public init(name: String, finger: String? = nil) {
            self.name = name
            self.finger = finger
        }
    }

    public struct Removed: Codable, Sendable {
        public var removed: [String]
        public init(removed: [String]) { self.removed = removed }
    }

    public struct VerifyFinger: Codable, Sendable {
        public var name: String
        public var context: CallerContext?
        public init(name: String, context: CallerContext? = nil) {
            self.name = name
            self.context = context
        }
    }

    public struct Identify: Codable, Sendable {
        public var context: CallerContext?
        public init(context: CallerContext? = nil) { self.context = context }
    }
}

extension Message {
    public struct PersonAdded: Codable, Sendable {
        public var person: PersonRecord
        public var activationCode: String?
        public var activationExpiresAt: String?
        public init(person: PersonRecord, activationCode: String?, activationExpiresAt: String?) {
            self.person = person
            self.activationCode = activationCode
            self.activationExpiresAt = activationExpiresAt
        }
    }

    public struct ActivationCodeIssued: Codable, Sendable {
        public var code: String
        public var expiresAt: String
        public init(code: String, expiresAt: String) {
            self.code = code
            self.expiresAt = expiresAt
        }
    }

    public struct Revoked: Codable, Sendable {
        public var revoked: Bool
        public init(revoked: Bool) { self.revoked = revoked }
    }

    public struct CheckActivationCode: Codable, Sendable {
        public var code: String
        public var name: String?
        public var context: CallerContext?
        public init(code: String, name: String? = nil, context: CallerContext? = nil) {
            self.code = code
            self.name = name
            self.context = context
        }
    }

    public struct CompleteActivation: Codable, Sendable {
        public var ticket: String
        public var passcode: String
        public var confirmation: String
        public init(ticket: String, passcode: String, confirmation: String) {
            self.ticket = ticket
            self.passcode = passcode
            self.confirmation = confirmation
        }
    }

    public struct Activated: Codable, Sendable {
        public var person: PersonRecord
        public var welcome: String
        public var roleDescription: String
        public var offerFingerprint: Bool
        public var ticket: String
        public var ticketExpiresIn: Int
        public init(
            person: PersonRecord, welcome: String, roleDescription: String, offerFingerprint: Bool, ticket: String,
            ticketExpiresIn: Int
        ) {
            self.person = person
            self.welcome = welcome
            self.roleDescription = roleDescription
            self.offerFingerprint = offerFingerprint
            self.ticket = ticket
            self.ticketExpiresIn = ticketExpiresIn
        }
    }

    public struct PersonExport: Codable, Sendable {
        public var person: PersonRecord
        public var audit: [AuditEventRecord]
        public var activationCodes: [JSONValue]
        public init(person: PersonRecord, audit: [AuditEventRecord], activationCodes: [JSONValue]) {
            self.person = person
            self.audit = audit
            self.activationCodes = activationCodes
        }
    }
}

extension Message {
    public struct CheckAccount: Codable, Sendable {
        public var name: String
        public var context: CallerContext?
        public init(name: String, context: CallerContext? = nil) {
            self.name = name
            self.context = context
        }
    }

    public struct AccountStatus: Codable, Sendable {
        public var allowed: Bool
        public var reason: String?
        public var person: PersonRecord
        public init(allowed: Bool, reason: String?, person: PersonRecord) {
            self.allowed = allowed
            self.reason = reason
            self.person = person
        }
    }
}

/// Where delivery of the audit trail to the organisation's HTTP endpoint stands. The fields after
/// `lastDeliveryAt` are filled for admins only.
public struct AuditDeliveryStatus: Codable, Sendable, Equatable {
    public var configured: Bool
    public var state: String
    public var queued: Int
    public var lastDeliveryAt: String?
    public var endpointHost: String?
    public var deliveredThrough: Int?
    public var lastError: String?
    public var lastErrorAt: String?
    public var consecutiveFailures: Int?
    public var nextAttemptAt: String?

    public init(
        configured: Bool, state: String, queued: Int, lastDeliveryAt: String?, endpointHost: String? = nil,
        deliveredThrough: Int? = nil, lastError: String? = nil, lastErrorAt: String? = nil,
        consecutiveFailures: Int? = nil, nextAttemptAt: String? = nil
    ) {
        self.configured = configured
        self.state = state
        self.queued = queued
        self.lastDeliveryAt = lastDeliveryAt
        self.endpointHost = endpointHost
        self.deliveredThrough = deliveredThrough
        self.lastError = lastError
        self.lastErrorAt = lastErrorAt
        self.consecutiveFailures = consecutiveFailures
        self.nextAttemptAt = nextAttemptAt
    }
}
