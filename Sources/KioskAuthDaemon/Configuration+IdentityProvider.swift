public import FoundationEssentials
public import KioskAuthCore
public import KioskAuthIdentity

extension DaemonConfiguration {
    /// The organisation's identity provider. Off while `issuer` is empty: then only local people
    /// exist and nothing on the terminal talks to the network.
    public struct IdentityProvider: Sendable {
        /// OIDC issuer URL (discovery at `{issuer}/.well-known/openid-configuration`), or the
        /// Supabase project URL for the `supabase` dialect. Empty: no identity provider.
        public var issuer = ""
        /// OAuth client id (the expected `aud` of ID tokens).
        public var clientID = ""
        /// Name of the file in `$CREDENTIALS_DIRECTORY` holding the client secret; empty for a
        /// public client.
        public var clientSecretCredential = ""
        /// Scopes requested at login.
        public var scopes = ["openid", "email", "profile"]
        /// The claim carrying the person's role(s); dotted paths reach into objects.
        public var roleClaim = "kioskauth_role"
        /// The claim carrying the person's groups.
        public var groupsClaim = "groups"
        /// The role of people whose token has no role claim and no mapped group; empty: refused.
        public var defaultRole = ""
        /// `RoleFromGroup=GROUP:ROLE` rules, in the order given.
        public var roleFromGroup: [GroupRoleMapping] = []
        /// Email domains admitted; empty: no domain condition.
        public var allowedEmailDomains: [String] = []
        /// A group the person must be in; empty: no group condition.
        public var requiredGroup = ""
        /// Admit everyone the provider authenticates (only for a provider holding nobody but this
        /// organisation's staff). Without it, one of the two conditions above is required.
        public var admitEveryone = false
        /// RFC 7009 revocation endpoint, where discovery lacks it.
        public var revocationEndpoint = ""
        /// RFC 8628 device authorization endpoint, where discovery lacks it.
        public var deviceAuthorizationEndpoint = ""
        /// `oidc` or `supabase`.
        public var dialect = IdentityProviderConfiguration.Dialect.oidc
        /// Supabase: file in `$CREDENTIALS_DIRECTORY` holding the project's API key.
        public var supabaseAPIKeyCredential = ""
        /// Supabase: file in `$CREDENTIALS_DIRECTORY` holding the legacy HS256 JWT secret; when
        /// empty, tokens are checked against the project's JWKS.
        public var supabaseJWTSecretCredential = ""
        /// The longest one request to the provider may take.
        public var requestTimeout: TimeInterval = 10
        /// How long an IdP person may unlock locally after their last successful contact.
        public var offlineWindow: TimeInterval = 8 * 3600
        /// Offer fingerprint enrolment after an online login (reader present, no finger yet, not
        /// declined).
        public var offerFingerprint = true
        /// First backoff after a failed refresh; doubles up to `refreshMaximumBackoff`.
        public var refreshInitialBackoff: TimeInterval = 5
        /// Longest backoff between refresh attempts.
        public var refreshMaximumBackoff: TimeInterval = 600
        /// Consecutive "provider unavailable" outcomes that open the circuit breaker.
        public var circuitBreakerThreshold = 5
        /// How long the circuit breaker stays open at first; doubles per failed probe.
        public var circuitCoolDown: TimeInterval = 30
        /// Probe the provider's reachability when nothing has talked to it for this long (and
        /// once at the start); 0: never probe.
        public var probeInterval: TimeInterval = 300
        /// The longest a reachability probe may take (never longer than `requestTimeout`).
        public var probeTimeout: TimeInterval = 5
        /// Wrong passwords within `loginFailureWindow` that pause online logins on this terminal.
        public var loginMaxFailures = 10
        /// The window of the online-login throttle.
        public var loginFailureWindow: TimeInterval = 900

        /// Whether an identity provider is configured.
        public var isEnabled: Bool { !issuer.isEmpty }
    }

    /// Session rules.
    public struct Session: Sendable {
        /// A session with no reported activity for this long ends.
        public var idleTimeout: TimeInterval = 30 * 60
        /// Sessions end at this local time every day; nil: no cut-off.
        public var overnightCutoff: SessionStateMachine.TimeOfDay? = SessionStateMachine.TimeOfDay(hour: 4)
        /// Sessions end after this long at most; 0: no limit.
        public var maximumAge: TimeInterval = 12 * 3600

        /// The state machine's policy.
        var policy: SessionStateMachine.Policy {
            SessionStateMachine.Policy(
                idleTimeout: .milliseconds(Int64(idleTimeout * 1000)),
                maximumAge: maximumAge > 0 ? .milliseconds(Int64(maximumAge * 1000)) : nil,
                overnightCutoff: overnightCutoff)
        }
    }

    /// Sets one `[IdentityProvider]` or `[Session]` key; returns false when the key is unknown.
    mutating func setOnlineKey(section: String, key: String, value: String) throws -> Bool {
        func seconds(_ value: String, _ range: ClosedRange<Double>) throws -> TimeInterval {
            guard let number = Double(value), number.isFinite, range.contains(number) else {
                throw ValueError(
                    message: "expected a number of seconds in \(Int(range.lowerBound))...\(Int(range.upperBound))")
            }
            return number
        }
        func words(_ value: String) -> [String] {
            value.split(whereSeparator: { $0 == " " || $0 == "," || $0 == "\t" }).map(String.init)
        }
        func url(_ value: String) throws -> String {
            guard
                value.isEmpty
                    || (URL(string: value)?.scheme.map { ["https", "http"].contains($0.lowercased()) } ?? false)
            else { throw ValueError(message: "expected an https:// URL") }
            return value
        }
        func credentialName(_ value: String) throws -> String {
            guard !value.contains("/"), value != ".", value != ".." else {
                throw ValueError(message: "expected the name of a file in $CREDENTIALS_DIRECTORY, not a path")
            }
            return value
        }
        func bool(_ value: String) throws -> Bool {
            switch value.lowercased() {
            case "1", "yes", "true", "on": return true
            case "0", "no", "false", "off": return false
            default: throw ValueError(message: "expected yes or no")
            }
        }
        switch (section, key) {
        case ("IdentityProvider", "Issuer"): identityProvider.issuer = try url(value)
        case ("IdentityProvider", "ClientID"): identityProvider.clientID = value
        case ("IdentityProvider", "ClientSecretCredential"):
            identityProvider.clientSecretCredential = try credentialName(value)
        case ("IdentityProvider", "Scopes"): identityProvider.scopes = words(value)
        case ("IdentityProvider", "RoleClaim"):
            guard !value.isEmpty else { throw ValueError(message: "expected a claim name") }
            identityProvider.roleClaim = value
        case ("IdentityProvider", "GroupsClaim"):
            guard !value.isEmpty else { throw ValueError(message: "expected a claim name") }
            identityProvider.groupsClaim = value
        case ("IdentityProvider", "DefaultRole"):
            guard value.isEmpty || Role(rawValue: value) != nil else {
                throw ValueError(
                    message: "expected one of \(Role.allCases.map(\.rawValue).joined(separator: ", ")), or empty")
            }
            identityProvider.defaultRole = value
        case ("IdentityProvider", "RoleFromGroup"):
            // Repeatable; an empty value clears the list (systemd style).
            if value.isEmpty {
                identityProvider.roleFromGroup = []
            } else {
                guard let colon = value.lastIndex(of: ":"), colon != value.startIndex,
                    let role = Role(rawValue: String(value[value.index(after: colon)...]))
                else {
                    throw ValueError(
                        message:
                            "expected GROUP:ROLE with ROLE one of \(Role.allCases.map(\.rawValue).joined(separator: ", "))"
                    )
                }
                identityProvider.roleFromGroup.append(
                    GroupRoleMapping(group: String(value[..<colon]), role: role.rawValue))
            }
        case ("IdentityProvider", "AllowedEmailDomains"):
            identityProvider.allowedEmailDomains = words(value).map { $0.lowercased() }
        case ("IdentityProvider", "RequiredGroup"): identityProvider.requiredGroup = value
        case ("IdentityProvider", "AdmitEveryone"): identityProvider.admitEveryone = try bool(value)
        case ("IdentityProvider", "RevocationEndpoint"): identityProvider.revocationEndpoint = try url(value)
        case ("IdentityProvider", "DeviceAuthorizationEndpoint"):
            identityProvider.deviceAuthorizationEndpoint = try url(value)
        case ("IdentityProvider", "Dialect"):
            guard let dialect = IdentityProviderConfiguration.Dialect(rawValue: value) else {
                throw ValueError(message: "expected oidc or supabase")
            }
            identityProvider.dialect = dialect
        case ("IdentityProvider", "SupabaseAPIKeyCredential"):
            identityProvider.supabaseAPIKeyCredential = try credentialName(value)
        case ("IdentityProvider", "SupabaseJWTSecretCredential"):
            identityProvider.supabaseJWTSecretCredential = try credentialName(value)
        case ("IdentityProvider", "RequestTimeoutSec"): identityProvider.requestTimeout = try seconds(value, 0.1...300)
        case ("IdentityProvider", "OfflineWindowSec"):
            identityProvider.offlineWindow = try seconds(value, 1...(30 * 86400))
        case ("IdentityProvider", "OfferFingerprint"): identityProvider.offerFingerprint = try bool(value)
        case ("IdentityProvider", "RefreshInitialBackoffSec"):
            identityProvider.refreshInitialBackoff = try seconds(value, 0.1...3600)
        case ("IdentityProvider", "RefreshMaximumBackoffSec"):
            identityProvider.refreshMaximumBackoff = try seconds(value, 1...86400)
        case ("IdentityProvider", "CircuitBreakerThreshold"):
            guard let number = Int(value), (1...1000).contains(number) else {
                throw ValueError(message: "expected a whole number in 1...1000")
            }
            identityProvider.circuitBreakerThreshold = number
        case ("IdentityProvider", "CircuitCoolDownSec"):
            identityProvider.circuitCoolDown = try seconds(value, 1...86400)
        case ("IdentityProvider", "ProbeIntervalSec"):
            identityProvider.probeInterval = try seconds(value, 0...86400)
        case ("IdentityProvider", "ProbeTimeoutSec"):
            identityProvider.probeTimeout = try seconds(value, 0.1...300)
        case ("IdentityProvider", "LoginMaxFailures"):
            guard let number = Int(value), (1...1000).contains(number) else {
                throw ValueError(message: "expected a whole number in 1...1000")
            }
            identityProvider.loginMaxFailures = number
        case ("IdentityProvider", "LoginFailureWindowSec"):
            identityProvider.loginFailureWindow = try seconds(value, 1...86400)
        case ("Session", "IdleTimeoutSec"): session.idleTimeout = try seconds(value, 1...(7 * 86400))
        case ("Session", "MaxAgeSec"): session.maximumAge = try seconds(value, 0...(30 * 86400))
        case ("Session", "OvernightCutoff"):
            if ["", "off", "no", "none"].contains(value.lowercased()) {
                session.overnightCutoff = nil
            } else {
                let parts = value.split(separator: ":", omittingEmptySubsequences: false)
                guard parts.count == 2, parts.allSatisfy({ $0.count == 2 && $0.allSatisfy(\.isASCII) }),
                    let hour = Int(parts[0]), let minute = Int(parts[1]),
                    let time = SessionStateMachine.TimeOfDay(hour: hour, minute: minute)
                else { throw ValueError(message: "expected a local time HH:MM, or off") }
                session.overnightCutoff = time
            }
        default: return false
        }
        return true
    }

    /// Checks the `[IdentityProvider]` section as a whole; a problem is a start-up error.
    func checkIdentityProvider() throws(ValueError) {
        let idp = identityProvider
        guard idp.isEnabled else { return }
        guard !idp.clientID.isEmpty || idp.dialect == .supabase else {
            throw ValueError(message: "[IdentityProvider] Issuer is set but ClientID is empty")
        }
        guard idp.admitEveryone || !idp.allowedEmailDomains.isEmpty || !idp.requiredGroup.isEmpty else {
            throw ValueError(
                message:
                    "[IdentityProvider] admits nobody: set AllowedEmailDomains or RequiredGroup (or AdmitEveryone=yes for a provider that holds only this organisation's staff)"
            )
        }
        if idp.dialect == .supabase, idp.supabaseAPIKeyCredential.isEmpty {
            throw ValueError(message: "[IdentityProvider] Dialect=supabase needs SupabaseAPIKeyCredential")
        }
        if idp.refreshMaximumBackoff < idp.refreshInitialBackoff {
            throw ValueError(
                message: "[IdentityProvider] RefreshMaximumBackoffSec is shorter than RefreshInitialBackoffSec")
        }
    }

    /// Builds the identity provider client's configuration, reading secrets from systemd
    /// credentials. Nil when no provider is configured.
    func makeIdentityProviderConfiguration(
        credentialsDirectory: String?
    ) throws(ValueError)
        -> IdentityProviderConfiguration?
    {
        try checkIdentityProvider()
        let idp = identityProvider
        guard idp.isEnabled else { return nil }
        func secret(_ name: String, _ key: String) throws(ValueError) -> CredentialSecret? {
            guard !name.isEmpty else { return nil }
            guard let directory = credentialsDirectory else {
                throw ValueError(message: "[IdentityProvider] \(key)=\(name) but $CREDENTIALS_DIRECTORY is not set")
            }
            guard let data = FileManager.default.contents(atPath: directory + "/" + name) else {
                throw ValueError(message: "[IdentityProvider] \(key): cannot read credential \(name)")
            }
            return CredentialSecret(credentialBytes: data)
        }
        guard let issuer = URL(string: idp.issuer) else {
            throw ValueError(message: "[IdentityProvider] Issuer is not a URL")
        }
        let admission: AdmissionPolicy
        switch (idp.allowedEmailDomains.isEmpty, idp.requiredGroup.isEmpty) {
        case (false, false): admission = .emailDomains(Set(idp.allowedEmailDomains), andGroup: idp.requiredGroup)
        case (false, true): admission = .emailDomains(Set(idp.allowedEmailDomains))
        case (true, false): admission = .group(idp.requiredGroup)
        case (true, true): admission = .everyoneTheProviderAuthenticates
        }
        var supabase: IdentityProviderConfiguration.Supabase?
        if idp.dialect == .supabase, let apiKey = try secret(idp.supabaseAPIKeyCredential, "SupabaseAPIKeyCredential") {
            let verification: IdentityProviderConfiguration.SupabaseTokenVerification =
                try secret(idp.supabaseJWTSecretCredential, "SupabaseJWTSecretCredential").map { .sharedSecret($0) }
                ?? .jwks
            supabase = .init(apiKey: apiKey, tokenVerification: verification)
        }
        var made = IdentityProviderConfiguration(
            dialect: idp.dialect,
            endpoints: idp.dialect == .supabase ? .supabaseProject(issuer) : .discovery(issuer: issuer),
            clientID: idp.clientID,
            clientSecret: try secret(idp.clientSecretCredential, "ClientSecretCredential"),
            scopes: idp.scopes, roleClaim: idp.roleClaim, groupsClaim: idp.groupsClaim,
            acceptedRoles: Set(Role.allCases.map(\.rawValue)),
            admission: admission,
            revocationEndpoint: idp.revocationEndpoint.isEmpty ? nil : URL(string: idp.revocationEndpoint),
            deviceAuthorizationEndpoint: idp.deviceAuthorizationEndpoint.isEmpty
                ? nil : URL(string: idp.deviceAuthorizationEndpoint),
            requestTimeout: .milliseconds(Int64(idp.requestTimeout * 1000)),
            supabase: supabase)
        made.defaultRole = idp.defaultRole.isEmpty ? nil : idp.defaultRole
        made.roleFromGroup = idp.roleFromGroup
        return made
    }
}
