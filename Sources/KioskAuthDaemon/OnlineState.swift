import FoundationEssentials
import KioskAuthCore
public import KioskAuthIdentity
import KioskAuthProtocol
import KioskAuthStore

/// What the online features share with the services and the socket handlers: the clock, the
/// identity provider client (nil when none is configured), the event hub and the wake-ups of
/// the two timer services. All of it is safe to use from anywhere.
public struct OnlineServices: Sendable {
    /// The daemon's clock.
    public let clock: DaemonClock
    /// The identity provider; nil when `[IdentityProvider] Issuer` is empty.
    public let provider: (any IdentityProvider)?
    let events = EventHub()
    let refreshWakeup = Wakeup()
    let sessionWakeup = Wakeup()
    /// Audit delivery's status and wake-ups; nil when `[AuditDelivery] Endpoint` is empty.
    let auditDelivery: AuditDeliveryMonitor?
    /// Counters and histograms (see Metrics.swift).
    let metrics: DaemonMetrics

    /// Bundles the clock and the provider.
    public init(clock: DaemonClock = .system(), provider: (any IdentityProvider)? = nil) {
        self.init(clock: clock, provider: provider, auditDelivery: nil)
    }

    init(
        clock: DaemonClock, provider: (any IdentityProvider)?, auditDelivery: AuditDeliveryMonitor?,
        metrics: DaemonMetrics = DaemonMetrics()
    ) {
        self.clock = clock
        self.provider = provider
        self.auditDelivery = auditDelivery
        self.metrics = metrics
    }
}

/// An access token kept in memory for `GetSessionToken`; never persisted, never logged.
struct CachedAccessToken {
    var token: OAuthToken
    var obtainedAt: Date
    var expiresAt: Date
}

/// The terminal's view of the identity provider's reachability, from the outcomes of the
/// requests the daemon makes anyway (logins, refreshes, revocations) and of its reachability
/// probes (`ReachabilityProbeSchedule`), which fill the gaps when nothing else talks to it.
struct ProviderReachability {
    enum State: String { case unknown, online, offline }
    var state = State.unknown
    var since: Date?
    /// The last time the provider answered anything, a probe included. Terminal-wide; it is
    /// not anybody's contact for the offline window.
    var lastAnswer: Date?
}

/// A refresh the refresh service must send: the person, the sealed token opened, and a
/// generation so that a result that arrives after a newer login is discarded.
struct RefreshJob: Sendable {
    var personID: Int64
    var name: LoginName
    var generation: UInt64
    var refreshToken: OAuthToken
}

/// How a refresh request ended, as the refresh service saw it.
enum RefreshJobResult: Sendable {
    /// Tokens arrived; `receivedAt` is the real wall clock when they did (the client computed
    /// the expiry against it).
    case refreshed(RefreshResult, receivedAt: Date)
    /// The client failed.
    case failed(IdentityError)
}

/// A queued delivery the refresh service must send.
struct DeliveryJob: Sendable {
    var id: Int64
    var kind: String
    var person: String?
    var token: OAuthToken
    var attempts: Int
}

/// A session as the daemon persists it: the state machine and when it was last locked (a ticket
/// whose authentication started before that does not unlock it).
struct PersistedSession: Codable {
    var machine: SessionStateMachine
    var lastLockedAt: ClockReading?
}

/// One open session in memory.
struct SessionEntry {
    var id: String
    var personID: Int64
    var name: LoginName
    var service: String?
    var tty: String?
    var state: PersistedSession
    /// The connection that presented the session's latest authentication (OpenSession's ticket
    /// or AuthenticateSession): the only one the access token is released to. Cleared by a lock;
    /// never persisted (a restart closes every connection).
    var tokenConnection: UInt64? = nil
}

/// The mutable state of the online features. It belongs to `OnlineAuthority` (on the
/// `AuthorityActor`): nothing else touches it.
@AuthorityActor
final class OnlineState {
    /// The terminal-wide offline-window state, loaded from the store at start.
    var offlineWindow: OfflineWindow
    /// Background refresh schedule, keyed by person row id.
    var schedule: RefreshSchedule<Int64>
    /// Login names of the people the schedule tracks.
    var names: [Int64: LoginName] = [:]
    /// Armed refresh timers (wall clock).
    var refreshTimers: [Int64: Date] = [:]
    /// The circuit breaker's timer (steady time, `AuthorityContext.steadyNow()`).
    var breakerWake: Date?
    /// Refreshes to hand to the refresh service.
    var pendingJobs: [RefreshJob] = []
    /// Current job generation per person.
    var generations: [Int64: UInt64] = [:]
    var nextGeneration: UInt64 = 1
    /// Access tokens from the last login or refresh.
    var accessTokens: [Int64: CachedAccessToken] = [:]
    /// Outbox items being delivered now.
    var deliveriesInFlight: Set<Int64> = []
    var reachability = ProviderReachability()
    /// When to probe the provider's reachability.
    var probe: ReachabilityProbeSchedule
    /// The provider came back: send the queued revocations now, whatever their backoff says.
    var outboxRetryNow = false
    /// Open sessions by id.
    var sessions: [String: SessionEntry] = [:]
    /// When the offline window last took an observation (boot clock).
    var lastObservation: ClockReading?

    nonisolated init(configuration: DaemonConfiguration) {
        let idp = configuration.identityProvider
        probe = ReachabilityProbeSchedule(
            policy: .init(interval: idp.probeInterval > 0 ? .milliseconds(Int64(idp.probeInterval * 1000)) : nil))
        offlineWindow = OfflineWindow(policy: .init(window: .milliseconds(Int64(idp.offlineWindow * 1000))))
        schedule = RefreshSchedule(
            policy: RefreshPolicy(
                initialBackoff: .milliseconds(Int64(idp.refreshInitialBackoff * 1000)),
                maximumBackoff: .milliseconds(Int64(idp.refreshMaximumBackoff * 1000)),
                circuitBreakerThreshold: idp.circuitBreakerThreshold,
                circuitCoolDown: .milliseconds(Int64(idp.circuitCoolDown * 1000)),
                maximumCircuitCoolDown: .milliseconds(Int64(max(idp.circuitCoolDown, 600) * 1000))))
    }

    /// A new job generation for `person`; results of older generations are discarded.
    func bumpGeneration(of person: Int64) -> UInt64 {
        let generation = nextGeneration
        nextGeneration += 1
        generations[person] = generation
        return generation
    }
}
