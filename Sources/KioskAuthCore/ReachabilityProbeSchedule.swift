// When the daemon should ask the identity provider, with a cheap side-effect-free request,
// whether it answers.
//
// The daemon otherwise learns the provider's reachability only from requests it makes anyway
// (logins, refreshes, revocations), so after a start the state is "unknown" until somebody
// logs in, and with no refresh due it can stay stale for hours. A probe fills those gaps:
//
// - Right after the start, while the state is unknown: one probe at once.
// - Afterwards, whenever nothing has talked to the provider for a probe interval: any outcome of
//   any request (and the probe's own) restarts the interval. Every wait gets up to `jitter` of
//   the interval added, never taken away, so terminals that booted together spread out and the
//   provider sees at most one probe per interval from a terminal.
// - Never two probes at once, and none while the refresher's circuit breaker is open: then the
//   refresh path's own backoff decides when the provider is tried again, and a provider that is
//   down is not hammered from two sides.
//
// Time is the boot clock (`ClockReading.sinceBoot`): it counts suspend and cannot be set, so
// moving the wall clock neither delays nor hurries a probe.
//
// What a probe outcome means is the daemon's business, with one rule stated here because it is
// easy to get wrong: a successful probe proves the network and the provider, not a person. It
// must never count as anybody's "contact" for the offline window, which needs that person's own
// tokens refreshed.

/// Decides when to probe the identity provider's reachability. Pure: the daemon reports what
/// happened and sends the probe it is told to.
public struct ReachabilityProbeSchedule: Sendable {
    /// How often to probe.
    public struct Policy: Sendable, Hashable {
        /// Probe when nothing has talked to the provider for this long; nil: never probe (not
        /// even at the start).
        public var interval: Duration?
        /// Up to this fraction of the interval is added to every wait, at random.
        public var jitter: Double

        /// Creates a policy.
        public init(interval: Duration?, jitter: Double = 0.1) {
            self.interval = interval
            self.jitter = max(0, jitter)
        }
    }

    /// The schedule's answer.
    public enum Decision: Sendable, Hashable {
        /// Send a probe now (call ``probeStarted(at:)`` first).
        case probe
        /// Ask again at this boot-clock time at the latest.
        case wait(until: Duration)
        /// Nothing to do until something changes: a probe is in flight, the circuit breaker is
        /// open, or probing is off.
        case idle
    }

    public let policy: Policy
    /// Whether a probe is in flight.
    public private(set) var isProbing = false
    /// When the next probe is due (boot clock); nil before the first request or probe.
    public private(set) var due: Duration?

    /// Creates a schedule; nothing has happened yet.
    public init(policy: Policy) {
        self.policy = policy
    }

    /// Some request to the provider (a login, a refresh, a revocation, a probe) ended, with any
    /// outcome: the provider's reachability is fresh, so the next probe moves a jittered
    /// interval away.
    public mutating func noteTraffic(at now: Duration, using random: inout some RandomNumberGenerator) {
        guard let interval = policy.interval else { return }
        let extra = policy.jitter > 0 ? Double.random(in: 0..<policy.jitter, using: &random) : 0
        due = now + interval + interval * extra
    }

    /// Whether to probe now.
    ///
    /// - Parameter circuitOpen: whether the refresher's circuit breaker is open (its cool-down
    ///   running).
    public func decide(at now: Duration, circuitOpen: Bool) -> Decision {
        guard policy.interval != nil, !isProbing, !circuitOpen else { return .idle }
        // Nothing has talked to the provider since the start: the state is unknown, ask now.
        guard let due else { return .probe }
        return now >= due ? .probe : .wait(until: due)
    }

    /// The daemon sent the probe.
    public mutating func probeStarted(at now: Duration) {
        isProbing = true
    }

    /// The probe ended, however it ended (an answer, a failure, cancellation): the next one is
    /// a jittered interval away.
    public mutating func probeFinished(at now: Duration, using random: inout some RandomNumberGenerator) {
        isProbing = false
        noteTraffic(at: now, using: &random)
    }
}
