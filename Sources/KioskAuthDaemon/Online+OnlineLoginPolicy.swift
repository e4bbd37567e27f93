import Foundation
import KioskAuthCore
import KioskAuthIdentity
import KioskAuthProtocol
import KioskAuthStore

// Where an online login may happen, and how often it may fail. An online login takes the
// organisation's password, so it is held to the passcode rules of the login being served (the
// same PAM service allow-list, the switch-user rule, never remote) before the provider is
// contacted, and wrong passwords are throttled per terminal, so that the terminal cannot become a
// way to guess the organisation's passwords.

extension OnlineAuthority {
    static let onlineLoginLimiterKey = "online-login-rate-limit"

    /// What an online login is checked against before the provider is asked.
    struct OnlineLoginGate {
        /// For a switch-user service (su, sudo): the person bound to the invoking user, the only
        /// one who may sign in there.
        var invokingPerson: StoredPerson?
        var limiter: ActivationRateLimiter
    }

    /// Why an online login may not happen in this context, if it may not. `name`: the person the
    /// login is for, when the caller knows it. Services are checked against PasscodeServices
    /// (an online login is the keyboard fallback the passcode is, and lifts its hard lock); a
    /// switch-user service allows only the person bound to the invoking user's real uid.
    func onlineLoginRefusal(
        _ context: CallerContext?, name: LoginName?
    ) throws(APIError) -> (reason: String?, invoking: StoredPerson?) {
        switch loginPolicy.onlineLoginRule(context?.loginContext) {
        case .allowed: return (nil, nil)
        case .refused(let reason): return (reason, nil)
        case .invokingUserOnly(let ruid, let service):
            let bound =
                try ruid.flatMap { ruid throws(APIError) in
                    try withStore(nil, action: .idpLogin) { () throws(StoreError) in try store.person(boundTo: ruid) }
                }
            guard let bound, bound.origin == .idp, access.boundUID(bound) == ruid, name == nil || name == bound.name
            else {
                return ("\(service) accepts an online login only for the invoking user", nil)
            }
            return (nil, bound)
        }
    }

    /// Checks everything but the credential: an authenticator, a configured provider, a context
    /// that allows it, and the terminal not paused after too many wrong passwords. Every refusal
    /// is audited and is one named error.
    func openOnlineLoginGate(
        _ caller: Caller, context: CallerContext?, name: LoginName?, method: String
    ) throws(APIError) -> OnlineLoginGate {
        let service = context?.service
        guard groups.isAuthenticator(caller) else {
            audit(
                caller, action: .idpLogin, result: .refused, method: method, service: service,
                detail: "caller is not an authenticator")
            throw APIError.permissionDenied(
                "online login needs root or membership in \(configuration.access.authenticatorGroup)")
        }
        guard services.provider != nil else { throw Self.notConfigured }
        let (reason, invoking) = try onlineLoginRefusal(context, name: name)
        if let reason {
            audit(
                caller, action: .idpLogin, result: .refused, person: name?.rawValue, method: method,
                service: service, detail: reason)
            throw APIError.own("OnlineLoginNotAllowed", ["reason": .string(reason)])
        }
        let limiter = try onlineLoginLimiter(caller)
        let at = steadyNow()
        if let until = limiter.pausedUntil(now: at) {
            audit(
                caller, action: .idpLogin, result: .refused, person: name?.rawValue, method: method,
                service: service, detail: "paused after too many wrong passwords")
            throw APIError.own(
                "OnlineLoginPaused",
                [
                    "message": .string("Too many wrong passwords on this terminal."),
                    "retryAfterSeconds": .number(max(1, until.timeIntervalSince(at).rounded(.up))),
                ])
        }
        return OnlineLoginGate(invokingPerson: invoking, limiter: limiter)
    }

    func onlineLoginLimiter(_ caller: Caller?) throws(APIError) -> ActivationRateLimiter {
        try terminalValue(
            ActivationRateLimiter.self, forKey: Self.onlineLoginLimiterKey, caller: caller, action: .idpLogin)
            ?? ActivationRateLimiter(
                maxFailures: configuration.identityProvider.loginMaxFailures,
                window: configuration.identityProvider.loginFailureWindow)
    }

    /// Takes a wrong-password slot on the terminal before the provider is asked (the gate checked
    /// it is not paused, with no await since): each concurrent attempt takes its own, so at most
    /// LoginMaxFailures passwords reach the provider per window. Returns when it was taken.
    func reserveOnlineLoginSlot(_ caller: Caller) throws(APIError) -> Date {
        var limiter = try onlineLoginLimiter(caller)
        let at = steadyNow()
        _ = limiter.reserve(now: at)
        saveTerminalValue(limiter, forKey: Self.onlineLoginLimiterKey, action: .idpLogin, caller: caller)
        return at
    }

    /// Settles a slot: a wrong password keeps it; anything else gives it back.
    func settleOnlineLoginSlot(reservedAt: Date, error: (any Error)?) {
        if let error, (error as? IdentityError)?.code == .invalidCredentials { return }
        guard var limiter = try? onlineLoginLimiter(nil) else { return }
        limiter.release(reservedAt: reservedAt)
        saveTerminalValue(limiter, forKey: Self.onlineLoginLimiterKey, action: .idpLogin)
    }

    /// CheckOnlineLogin: may an online login happen here, for `name`? Never contacts the provider;
    /// the person's recorded email only to a context that may sign them in.
    func checkOnlineLogin(
        _ caller: Caller, _ input: Message.CheckOnlineLogin
    ) throws(APIError)
        -> Message.OnlineLoginAllowed
    {
        let name = try input.name.map { text throws(APIError) in try loginName(text) }
        _ = try openOnlineLoginGate(caller, context: input.context, name: name, method: "idp-check")
        guard let name,
            let person = try withStore(
                caller, action: .idpLogin, { () throws(StoreError) in try store.person(named: name) }),
            person.origin == .idp,
            let profile = try? store.identityProviderProfile(of: person)
        else { return Message.OnlineLoginAllowed(email: nil) }
        return Message.OnlineLoginAllowed(email: profile.email)
    }
}
