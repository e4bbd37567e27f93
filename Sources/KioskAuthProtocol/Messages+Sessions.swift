// Typed inputs and outputs of the identity-provider, connectivity and session methods of
// io.kioskauth. Field names are the interface description's; see io.kioskauth.varlink.

/// A session as the API shows it.
public struct SessionRecord: Codable, Sendable, Equatable {
    public var id: String
    public var name: String
    public var state: String
    public var service: String?
    public var tty: String?
    public var openedAt: String
    public var lastActivityAt: String
    public var lastAuthenticationAt: String?
    public var lockEpoch: Int
    public var overnightCutoff: String?
    public var endReason: String?
    public var endedAt: String?

    public init(
        id: String, name: String, state: String, service: String?, tty: String?, openedAt: String,
        lastActivityAt: String, lastAuthenticationAt: String?, lockEpoch: Int, overnightCutoff: String?,
        endReason: String?, endedAt: String?
    ) {
        self.id = id
        self.name = name
        self.state = state
        self.service = service
        self.tty = tty
        self.openedAt = openedAt
        self.lastActivityAt = lastActivityAt
        self.lastAuthenticationAt = lastAuthenticationAt
        self.lockEpoch = lockEpoch
        self.overnightCutoff = overnightCutoff
        self.endReason = endReason
        self.endedAt = endedAt
    }
}

/// Where one identity-provider person stands with the offline window.
public struct PersonConnectivity: Codable, Sendable, Equatable {
    public var name: String
    public var window: String
    public var windowSecondsLeft: Int?
    public var lastContactAt: String?
    public var suspendedReason: String?

    public init(name: String, window: String, windowSecondsLeft: Int?, lastContactAt: String?, suspendedReason: String?)
    {
        self.name = name
        self.window = window
        self.windowSecondsLeft = windowSecondsLeft
        self.lastContactAt = lastContactAt
        self.suspendedReason = suspendedReason
    }
}

/// How many identity-provider people are in each offline-window state.
public struct WindowCounts: Codable, Sendable, Equatable {
    public var open = 0
    public var expired = 0
    public var clockWentBackwards = 0
    public var suspended = 0
    public var never = 0

    public init() {}

    /// Counts one person in `window` (a ``PersonConnectivity/window`` value).
    public mutating func count(_ window: String) {
        switch window {
        case "open": open += 1
        case "expired": expired += 1
        case "clock-went-backwards": clockWentBackwards += 1
        case "suspended": suspended += 1
        default: never += 1
        }
    }
}

/// One event of the `Subscribe` stream.
public struct EventRecord: Codable, Sendable, Equatable {
    public var kind: String
    public var time: String
    public var session: String?
    public var name: String?
    public var reason: String?
    public var reader: String?

    public init(
        kind: String, time: String, session: String? = nil, name: String? = nil, reason: String? = nil,
        reader: String? = nil
    ) {
        self.kind = kind
        self.time = time
        self.session = session
        self.name = name
        self.reason = reason
        self.reader = reader
    }
}

/// What to show a person for a device login.
public struct DeviceLoginPrompt: Codable, Sendable, Equatable {
    public var userCode: String
    public var verificationUri: String
    public var verificationUriComplete: String?
    public var expiresIn: Int
    public var interval: Int

    public init(
        userCode: String, verificationUri: String, verificationUriComplete: String?, expiresIn: Int, interval: Int
    ) {
        self.userCode = userCode
        self.verificationUri = verificationUri
        self.verificationUriComplete = verificationUriComplete
        self.expiresIn = expiresIn
        self.interval = interval
    }
}

extension Message {
    public struct LoginWithPassword: Codable, Sendable {
        public var email: String
        public var password: String
        public var context: CallerContext?
        public init(email: String, password: String, context: CallerContext? = nil) {
            self.email = email
            self.password = password
            self.context = context
        }
    }

    /// The reply of an online login (password or, as its final reply, device).
    public struct OnlineLogin: Codable, Sendable {
        public var prompt: DeviceLoginPrompt?
        public var person: PersonRecord?
        public var created: Bool?
        public var offerFingerprint: Bool?
        public var ticket: String?
        public var ticketExpiresIn: Int?
        public init(
            prompt: DeviceLoginPrompt? = nil, person: PersonRecord? = nil, created: Bool? = nil,
            offerFingerprint: Bool? = nil,
            ticket: String? = nil, ticketExpiresIn: Int? = nil
        ) {
            self.prompt = prompt
            self.person = person
            self.created = created
            self.offerFingerprint = offerFingerprint
            self.ticket = ticket
            self.ticketExpiresIn = ticketExpiresIn
        }
    }

    public struct CheckOnlineLogin: Codable, Sendable {
        public var name: String?
        public var context: CallerContext?
        public init(name: String? = nil, context: CallerContext? = nil) {
            self.name = name
            self.context = context
        }
    }

    public struct OnlineLoginAllowed: Codable, Sendable {
        public var email: String?
        public init(email: String?) { self.email = email }
    }

    public struct StartDeviceLogin: Codable, Sendable {
        public var context: CallerContext?
        public init(context: CallerContext? = nil) { self.context = context }
    }

    public struct SetBiometricOffer: Codable, Sendable {
        public var name: String
        public var enabled: Bool
        public var ticket: String?
        public init(name: String, enabled: Bool, ticket: String? = nil) {
            self.name = name
            self.enabled = enabled
            self.ticket = ticket
        }
    }

    public struct GetConnectivity: Codable, Sendable {
        /// Include the per-person list.
        public var people: Bool?
        public init(people: Bool? = nil) { self.people = people }
    }

    public struct Connectivity: Codable, Sendable {
        public var identityProvider: Bool
        public var state: String
        public var since: String?
        public var lastContactAt: String?
        public var circuit: String
        public var offlineWindowSeconds: Int
        public var people: [PersonConnectivity]
        public var windows: WindowCounts?
        public var outboxPending: Int
        public var lastDeliveryAt: String?
        public var lastDeliveryError: String?
        public init(
            identityProvider: Bool, state: String, since: String?, lastContactAt: String?, circuit: String,
            offlineWindowSeconds: Int, people: [PersonConnectivity], windows: WindowCounts? = nil, outboxPending: Int,
            lastDeliveryAt: String?, lastDeliveryError: String?
        ) {
            self.windows = windows
            self.identityProvider = identityProvider
            self.state = state
            self.since = since
            self.lastContactAt = lastContactAt
            self.circuit = circuit
            self.offlineWindowSeconds = offlineWindowSeconds
            self.people = people
            self.outboxPending = outboxPending
            self.lastDeliveryAt = lastDeliveryAt
            self.lastDeliveryError = lastDeliveryError
        }
    }

    public struct OpenSession: Codable, Sendable {
        public var name: String
        public var context: CallerContext?
        public var ticket: String?
        public init(name: String, context: CallerContext? = nil, ticket: String? = nil) {
            self.name = name
            self.context = context
            self.ticket = ticket
        }
    }

    public struct SessionID: Codable, Sendable {
        public var id: String
        public init(id: String) { self.id = id }
    }

    public struct SessionReply: Codable, Sendable {
        public var session: SessionRecord
        public init(session: SessionRecord) { self.session = session }
    }

    public struct AuthenticateSession: Codable, Sendable {
        public var id: String
        public var ticket: String
        public init(id: String, ticket: String) {
            self.id = id
            self.ticket = ticket
        }
    }

    public struct StepUp: Codable, Sendable {
        public var id: String
        public var maxAgeSeconds: Int
        public init(id: String, maxAgeSeconds: Int) {
            self.id = id
            self.maxAgeSeconds = maxAgeSeconds
        }
    }

    public struct StepUpReply: Codable, Sendable {
        public var satisfied: Bool
        public var session: SessionRecord
        public init(satisfied: Bool, session: SessionRecord) {
            self.satisfied = satisfied
            self.session = session
        }
    }

    public struct ListSessions: Codable, Sendable {
        public var name: String?
        public init(name: String? = nil) { self.name = name }
    }

    public struct Sessions: Codable, Sendable {
        public var sessions: [SessionRecord]
        public init(sessions: [SessionRecord]) { self.sessions = sessions }
    }

    public struct EndedSessions: Codable, Sendable {
        public var ended: Int
        public init(ended: Int) { self.ended = ended }
    }

    public struct SessionToken: Codable, Sendable {
        public var accessToken: String
        public var expiresAt: String
        public var expiresIn: Int
        public init(accessToken: String, expiresAt: String, expiresIn: Int) {
            self.accessToken = accessToken
            self.expiresAt = expiresAt
            self.expiresIn = expiresIn
        }
    }

    public struct Event: Codable, Sendable {
        public var event: EventRecord
        public init(event: EventRecord) { self.event = event }
    }
}
