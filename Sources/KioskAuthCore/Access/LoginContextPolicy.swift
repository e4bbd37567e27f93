public import FoundationEssentials

/// What the PAM module says about a login, reduced to the facts the login-context rules read.
public struct LoginContext: Sendable, Equatable {
    /// The PAM service (`login`, `sudo`, a greeter's service ...).
    public var service: String?
    /// The invoking user's real uid.
    public var ruid: Int?
    /// The uid of the account PAM_USER names.
    public var targetUID: Int?
    /// PAM_RHOST.
    public var remoteHost: String?
    /// Whether the module found the session remote.
    public var remote: Bool?
    /// What logind knows about the session (`remote` for a remote one).
    public var logind: String?

    public init(
        service: String? = nil, ruid: Int? = nil, targetUID: Int? = nil, remoteHost: String? = nil,
        remote: Bool? = nil, logind: String? = nil
    ) {
        self.service = service
        self.ruid = ruid
        self.targetUID = targetUID
        self.remoteHost = remoteHost
        self.remote = remote
        self.logind = logind
    }

    /// Whether the login is remote: PAM_RHOST names a remote host, or the module found (through
    /// logind, where it runs) that the caller's session is remote.
    public var isRemote: Bool {
        remote == true || (remoteHost.map { !$0.isEmpty } ?? false) || logind == "remote"
    }
}

/// The rules about where a credential may be used: never over a remote session, only from the
/// PAM services allowed keyboard credentials, and from a switch-user service (su, sudo) only for
/// the invoking user. Also the rules of the single-use tickets an authentication earns, and how
/// an identity-provider person's display name is derived. Pure: no I/O, no clock.
public struct LoginContextPolicy: Sendable {
    /// The credentials the context rules are asked about.
    public enum Credential: Sendable {
        case passcode, fingerprint, onlineLogin, activation

        var remoteRefusal: String {
            switch self {
            case .passcode: "passcodes are not accepted over remote sessions"
            case .fingerprint: "fingerprints are not accepted over remote sessions"
            case .onlineLogin: "online logins are not accepted over remote sessions"
            case .activation: "activation is only possible at the terminal itself"
            }
        }
    }

    /// How a PAM service is treated.
    public enum ServiceClass: Sendable, Equatable {
        /// The invoking user is somebody else than the target (su, sudo): only they may use a
        /// keyboard credential there.
        case switchUser
        /// Allowed keyboard credentials (passcodes, online logins, activation).
        case keyboard
        /// Not allowed keyboard credentials.
        case refused
    }

    /// What an online login's context allows.
    public enum OnlineLoginRule: Sendable, Equatable {
        case allowed
        /// Only the person bound to this real uid (nil: nobody), from this switch-user service.
        case invokingUserOnly(ruid: Int?, service: String)
        case refused(String)
    }

    /// Services that may take a passcode (and an online login, and activation).
    public var passcodeServices: Set<String>
    /// Services where the invoking user differs from the target account.
    public var switchUserServices: Set<String>
    /// How long a ticket stays valid after the authentication that earned it.
    public var ticketLifetime: TimeInterval

    public init(passcodeServices: Set<String>, switchUserServices: Set<String>, ticketLifetime: TimeInterval) {
        self.passcodeServices = passcodeServices
        self.switchUserServices = switchUserServices
        self.ticketLifetime = ticketLifetime
    }

    /// The service allow-list: a switch-user service first, whatever else it is listed as.
    public func serviceClass(_ service: String) -> ServiceClass {
        if switchUserServices.contains(service) { return .switchUser }
        return passcodeServices.contains(service) ? .keyboard : .refused
    }

    /// Why `credential` is refused over this login because it is remote, or nil.
    public func remoteRefusal(_ context: LoginContext, for credential: Credential) -> String? {
        context.isRemote ? credential.remoteRefusal : nil
    }

    /// Why a passcode may not be used for this login of the person bound to `personUID`, or nil.
    public func passcodeRefusal(_ context: LoginContext?, personUID: Int?) -> String? {
        guard let context else { return nil }
        if let reason = remoteRefusal(context, for: .passcode) { return reason }
        guard let service = context.service else { return nil }
        switch serviceClass(service) {
        case .switchUser:
            guard let ruid = context.ruid, let personUID, ruid == personUID else {
                return "\(service) accepts a passcode only for the invoking user"
            }
            return nil
        case .keyboard: return nil
        case .refused: return "the PAM service \(service) is not allowed to use passcodes"
        }
    }

    /// Why a fingerprint may not be used for this login, or nil.
    public func fingerprintRefusal(_ context: LoginContext?) -> String? {
        context.flatMap { remoteRefusal($0, for: .fingerprint) }
    }

    /// What an online login's context allows. Services are checked against the passcode
    /// services: an online login is the keyboard fallback the passcode is.
    public func onlineLoginRule(_ context: LoginContext?) -> OnlineLoginRule {
        guard let context else { return .allowed }
        if let reason = remoteRefusal(context, for: .onlineLogin) { return .refused(reason) }
        guard let service = context.service else { return .allowed }
        switch serviceClass(service) {
        case .switchUser: return .invokingUserOnly(ruid: context.ruid, service: service)
        case .keyboard: return .allowed
        case .refused: return .refused("the PAM service \(service) is not allowed online logins")
        }
    }

    /// Whether a PAM service may activate accounts: the passcode services except the
    /// switch-user ones, where the invoking user is somebody else.
    public func mayActivate(service: String) -> Bool {
        serviceClass(service) == .keyboard
    }

    /// Why a login from a switch-user service may not go to this account, or nil: the target
    /// account must be the invoking user's.
    public func switchUserTargetRefusal(_ context: LoginContext?) -> String? {
        guard let context, let service = context.service, serviceClass(service) == .switchUser,
            let target = context.targetUID, context.ruid != target
        else { return nil }
        return "not allowed on this account: \(service) to an account other than the invoking user's"
    }

    // MARK: Tickets

    /// When a ticket issued at steady time `now` expires.
    public func ticketExpiry(issuedAt now: Date) -> Date { now.addingTimeInterval(ticketLifetime) }

    // MARK: Names

    /// A display name for a new identity-provider person:
    /// "sarah.jones@clinic.example" → "Sarah Jones".
    public static func displayName(email: String?) -> String {
        guard let email, let local = email.split(separator: "@").first, !local.isEmpty else { return "IdP user" }
        let words = local.split(whereSeparator: { ".-_+".contains($0) }).map {
            $0.prefix(1).uppercased() + $0.dropFirst()
        }
        let name = words.joined(separator: " ")
        return name.isEmpty || name.count > 128 ? String(email.prefix(128)) : name
    }
}

/// What a ticket may be used for.
public enum TicketPurpose: Sendable, Equatable {
    /// Self-service after a fresh authentication (change passcode, enrol a finger).
    case selfService
    /// Completing activation with the code it was issued for.
    case activation(codeID: Int64)
}

/// A single-use ticket an authentication earned: bound to the person and to the connection that
/// earned it, valid until `expires` on the terminal's steady time.
public struct LoginTicket: Sendable, Equatable {
    public var personID: Int64
    public var connectionID: UInt64
    /// On steady time.
    public var expires: Date
    public var purpose: TicketPurpose
    /// When the authentication that earned it began (a session lock after this voids it).
    public var startedAt: ClockReading
    /// When it succeeded.
    public var issuedAt: ClockReading

    public init(
        personID: Int64, connectionID: UInt64, expires: Date, purpose: TicketPurpose, startedAt: ClockReading,
        issuedAt: ClockReading
    ) {
        self.personID = personID
        self.connectionID = connectionID
        self.expires = expires
        self.purpose = purpose
        self.startedAt = startedAt
        self.issuedAt = issuedAt
    }

    /// Whether the ticket is still valid at steady time `now`.
    public func isLive(at now: Date) -> Bool { expires > now }

    /// Whether this is a valid self-service ticket for `personID` on `connectionID` at `now`.
    public func admitsSelfService(personID: Int64, connectionID: UInt64, at now: Date) -> Bool {
        purpose == .selfService && self.personID == personID && self.connectionID == connectionID && isLive(at: now)
    }

    /// The person and code of a valid activation ticket on `connectionID` at `now`, or nil.
    public func activation(connectionID: UInt64, at now: Date) -> (personID: Int64, codeID: Int64)? {
        guard self.connectionID == connectionID, isLive(at: now), case .activation(let codeID) = purpose else {
            return nil
        }
        return (personID, codeID)
    }
}
