// When to refresh each IdP person's tokens, and what each outcome of a refresh means.
//
// Why a state machine: the refresher has to keep five promises at once — refresh ahead of
// expiry, never two requests for one person, back off when the IdP is unwell, stop hammering it
// when it is down for everybody, and never mistake a lost response for a revocation — and all of
// them must survive a restart. Keeping the decisions free of I/O and of clocks makes every
// promise testable at an exact second; the daemon performs the actions (arm a timer, persist a
// record, send a request, suspend a person) and reports back what happened.
//
// Design decisions worth knowing:
//
// - Renewal happens at a random point between 75 % and 80 % of the access token's lifetime
//   (configurable) so that terminals and people that logged in together do not refresh together.
// - Before a request goes out, the person's record is persisted with an in-flight marker. If the
//   daemon dies with the marker set, nobody knows whether the IdP processed the request, so the
//   restart treats it exactly like a lost response.
// - Ambiguous outcomes. A refresh whose response never arrived (connection reset after sending,
//   a timeout after the request was written) may have rotated the refresh token at the IdP while
//   the terminal still holds the old one. It is retried *soon* (default 2 s) with the same token:
//   IdPs with a reuse grace period (Supabase's refresh-token reuse interval, 10 s by default)
//   then return the rotated token again and nothing is lost. If instead the IdP answers
//   `invalid_grant` while such doubt is recorded, the rejection may be the IdP's reuse detection
//   reacting to our own retry rather than a revocation. The token is dead either way, so the person
//   is suspended just the same (an online login heals it), but the suspension reason and the audit
//   event say "rejected after a lost response" so that an admin does not read it as theft or
//   a deliberate revocation. A successful refresh clears the doubt.
// - The circuit breaker is terminal-wide and transient (a restart starts closed): after N
//   consecutive "IdP unavailable" outcomes (unreachable, timed out, 5xx/429) it opens for a
//   cool-down that doubles on each failed probe up to a cap; then one probe is let through
//   (half-open). People who come due meanwhile wait and are released, spread by jitter, when the
//   breaker closes. An answer from the IdP (a token, or `invalid_grant`) proves it reachable and
//   closes the breaker. A lost response is neutral: it neither counts as a failure nor closes it,
//   and its quick retry is allowed to be the probe.
// - An on-demand request (a kiosk app wants a fresh access token) may refresh early, but never
//   cuts a backoff short.
// - The schedule runs on wall-clock `Date`s because token expiry is the IdP's wall-clock notion.
//   Moving the clock only moves when refreshes happen; it cannot let anybody unlock for longer,
//   because the offline window (OfflineWindow.swift) is measured separately.

public import FoundationEssentials

/// When a person's current access token was obtained and when it expires.
public struct AccessTokenLifetime: Sendable, Hashable, Codable {
    /// When the token was obtained: the wall time of the successful IdP contact that produced it.
    public var obtainedAt: Date
    /// When the access token expires (its `exp` claim, or `expires_in` after `obtainedAt`).
    public var expiresAt: Date

    /// Creates a lifetime from when the token was obtained and when it expires.
    public init(obtainedAt: Date, expiresAt: Date) {
        self.obtainedAt = obtainedAt
        self.expiresAt = expiresAt
    }

    /// The access token's lifetime (zero when the IdP's `exp` is not after `obtainedAt`).
    public var duration: Duration {
        max(ClockMath.duration(from: obtainedAt, to: expiresAt), .zero)
    }
}

/// Why a person's local unlock was suspended by the refresher; it lasts until their next online
/// login.
public enum RefreshSuspension: String, Sendable, Hashable, Codable {
    /// The IdP answered `invalid_grant`: the refresh token was revoked, expired, or the account was
    /// disabled.
    case refreshTokenRejected
    /// The IdP answered `invalid_grant` after an earlier response was lost, so the token may have
    /// been rotated by that lost response and our retry looked like reuse to the IdP.
    case refreshTokenRejectedAfterLostResponse
}

/// What the daemon persists for each IdP person so that the schedule can be rebuilt after a
/// restart.
public struct RefreshRecord: Sendable, Hashable, Codable {
    /// The current access token's lifetime.
    public var token: AccessTokenLifetime
    /// Set while a refresh request is out; persisted before the request is sent.
    public var refreshStartedAt: Date?
    /// Whether an earlier refresh may have rotated the refresh token without our seeing the answer.
    public var tokenMayHaveRotated: Bool
    /// Set when the person's local unlock is suspended; no refresh is scheduled then.
    public var suspension: RefreshSuspension?

    /// Creates a record.
    public init(
        token: AccessTokenLifetime, refreshStartedAt: Date? = nil, tokenMayHaveRotated: Bool = false,
        suspension: RefreshSuspension? = nil
    ) {
        self.token = token
        self.refreshStartedAt = refreshStartedAt
        self.tokenMayHaveRotated = tokenMayHaveRotated
        self.suspension = suspension
    }

    /// Whether a refresh was in flight when this record was written.
    public var isRefreshInFlight: Bool { refreshStartedAt != nil }
}

/// How one refresh request ended, as the IdP client classifies it.
public enum RefreshOutcome: Sendable, Hashable {
    /// The IdP issued tokens; the (possibly rotated) refresh token has been stored.
    case succeeded(AccessTokenLifetime)
    /// The IdP answered `invalid_grant`.
    case invalidGrant
    /// The request may have reached the IdP but no usable answer came back (connection reset
    /// while reading the response, a malformed response).
    case responseLost
    /// The request certainly did not reach the IdP (DNS failure, connection refused, no route).
    case unreachable
    /// The request was sent but no answer came in time; it may have been processed.
    case timedOut
    /// The IdP answered with a 5xx or 429 status, optionally asking to wait (`Retry-After`).
    case serverError(retryAfter: Duration?)

    /// Whether the outcome shows that the IdP is unavailable, for the circuit breaker.
    var indicatesUnavailable: Bool {
        switch self {
        case .unreachable, .timedOut, .serverError: true
        case .succeeded, .invalidGrant, .responseLost: false
        }
    }

    /// Whether the IdP may have processed the request without our seeing its answer.
    var leavesRotationInDoubt: Bool {
        switch self {
        case .responseLost, .timedOut: true
        case .succeeded, .invalidGrant, .unreachable, .serverError: false
        }
    }
}

/// The refresher's tunables; the defaults suit an IdP issuing 1 h access tokens.
public struct RefreshPolicy: Sendable, Hashable, Codable {
    /// Where in the access token's lifetime a renewal happens, chosen at random in this range.
    public var renewalPoint: ClosedRange<Double>
    /// How soon a refresh whose response was lost is retried with the same token.
    public var ambiguousRetryDelay: Duration
    /// The first backoff after a failure; it doubles with each consecutive failure.
    public var initialBackoff: Duration
    /// The longest backoff.
    public var maximumBackoff: Duration
    /// The fraction of a backoff that is randomised (0.2: between 80 % and 100 % of it).
    public var backoffJitter: Double
    /// Consecutive "IdP unavailable" outcomes, across all people, that open the circuit breaker.
    public var circuitBreakerThreshold: Int
    /// How long the breaker stays open the first time; it doubles after each failed probe.
    public var circuitCoolDown: Duration
    /// The longest cool-down.
    public var maximumCircuitCoolDown: Duration
    /// Refreshes that become due together (after a restart, when the breaker closes) are spread
    /// at random over this long.
    public var releaseSpread: Duration

    /// Creates a policy; every parameter has a default.
    public init(
        renewalPoint: ClosedRange<Double> = 0.75...0.80,
        ambiguousRetryDelay: Duration = .seconds(2),
        initialBackoff: Duration = .seconds(5),
        maximumBackoff: Duration = .seconds(600),
        backoffJitter: Double = 0.2,
        circuitBreakerThreshold: Int = 5,
        circuitCoolDown: Duration = .seconds(30),
        maximumCircuitCoolDown: Duration = .seconds(600),
        releaseSpread: Duration = .seconds(5)
    ) {
        self.renewalPoint = renewalPoint
        self.ambiguousRetryDelay = ambiguousRetryDelay
        self.initialBackoff = initialBackoff
        self.maximumBackoff = maximumBackoff
        self.backoffJitter = backoffJitter
        self.circuitBreakerThreshold = circuitBreakerThreshold
        self.circuitCoolDown = circuitCoolDown
        self.maximumCircuitCoolDown = maximumCircuitCoolDown
        self.releaseSpread = releaseSpread
    }
}

/// The background-refresh schedule of every IdP person on the terminal, with the terminal-wide
/// circuit breaker.
///
/// `Person` is whatever identifies a person to the daemon. Each mutating method returns the
/// actions to perform, in order; an empty array means there is nothing to do.
public struct RefreshSchedule<Person: Hashable & Sendable>: Sendable {
    /// Work the daemon performs, in order, after a call.
    public enum Action: Sendable, Hashable {
        /// (Re)arm this person's refresh timer for `at`, replacing any earlier one; when it fires,
        /// call `requestRefresh(for:at:using:)`.
        case refresh(Person, at: Date)
        /// Persist this record for the person (atomically with a rotated refresh token, if any).
        case persist(Person, RefreshRecord)
        /// Send the refresh request now (the preceding `persist` recorded it as in flight) and report
        /// its outcome with `complete(_:for:at:using:)`.
        case startRefresh(Person)
        /// Disarm this person's refresh timer; nothing more is scheduled for them.
        case cancelRefresh(Person)
        /// Suspend the person's local unlock until their next online login.
        case suspend(Person, RefreshSuspension)
        /// Arm the circuit breaker's timer; when it fires, call `circuitTimerFired(at:using:)`.
        case wakeCircuitBreaker(at: Date)
        /// Append this event to the audit trail.
        case audit(AuditEvent)
    }

    /// Events for the audit trail.
    public enum AuditEvent: Sendable, Hashable {
        /// The IdP rejected the person's refresh token; local unlock is suspended.
        case refreshTokenRejected(Person)
        /// The IdP rejected a refresh token that a lost response may already have rotated; local
        /// unlock is suspended, but this is not necessarily a revocation or token theft.
        case refreshTokenRejectedAfterLostResponse(Person)
        /// The daemon restarted while a refresh was in flight; it is treated as a lost response.
        case refreshInterruptedByRestart(Person)
        /// Too many consecutive failures: refreshes pause until `until`.
        case circuitOpened(until: Date, consecutiveFailures: Int)
        /// The IdP answered again; refreshes resume.
        case circuitClosed
    }

    /// Where one person stands.
    public enum Phase: Sendable, Hashable {
        /// A refresh is due at `at`; `isRetry` when it is a backoff or a retry after a lost response.
        case scheduled(at: Date, isRetry: Bool)
        /// Due, but held back by the open (or probing) circuit breaker.
        case waitingForCircuit
        /// A request is out.
        case inFlight(since: Date)
        /// Local unlock is suspended; nothing is scheduled.
        case suspended(RefreshSuspension)
    }

    /// The circuit breaker, as the daemon may show it ("IdP unreachable since …").
    public enum Circuit: Sendable, Hashable {
        /// Refreshes flow.
        case closed
        /// Refreshes pause until `until`.
        case open(until: Date)
        /// One probe may go out (or is out, `probe` non-nil) to test whether the IdP is back.
        case halfOpen(probe: Person?)
    }

    private struct Entry: Sendable {
        var record: RefreshRecord
        var phase: Phase
        var consecutiveFailures: Int
    }

    /// The rules in force.
    public var policy: RefreshPolicy
    private var entries: [Person: Entry] = [:]
    /// People held back by the breaker, in the order they became due.
    private var waiting: [Person] = []
    /// The breaker's state.
    public private(set) var circuit: Circuit = .closed
    /// "IdP unavailable" outcomes since the IdP last answered, across all people.
    public private(set) var consecutiveUnavailable = 0
    /// How many times in a row the breaker has opened without closing; sets the cool-down.
    private var openings = 0
    /// When the breaker last opened (wall clock), to notice the wall clock set back since.
    private var openedAt: Date?

    /// An empty schedule; add people with `track` (after an online login) or `restore` (after a
    /// restart).
    public init(policy: RefreshPolicy = RefreshPolicy()) {
        self.policy = policy
    }

    /// The people being tracked, suspended ones included.
    public var people: Set<Person> {
        Set(entries.keys)
    }

    /// Where `person` stands, or `nil` when not tracked.
    public func phase(of person: Person) -> Phase? {
        entries[person]?.phase
    }

    /// The record the daemon should currently have persisted for `person`.
    public func record(for person: Person) -> RefreshRecord? {
        entries[person]?.record
    }

    /// Starts (or restarts) scheduling for `person` after a successful online login, clearing any
    /// suspension and any doubt about rotation. The login proves the IdP reachable, so it also
    /// closes the breaker. A refresh still in flight for the person is superseded: the daemon must
    /// discard its result (`complete` ignores it).
    public mutating func track(
        _ person: Person, token: AccessTokenLifetime, at now: Date,
        using random: inout some RandomNumberGenerator
    ) -> [Action] {
        waiting.removeAll { $0 == person }
        releaseProbe(held: person)
        let record = RefreshRecord(token: token)
        let at = renewalDate(for: token, at: now, using: &random)
        entries[person] = Entry(
            record: record, phase: .scheduled(at: at, isRetry: false), consecutiveFailures: 0)
        return [.persist(person, record), .refresh(person, at: at)]
            + closeCircuit(at: now, using: &random)
    }

    /// Rebuilds `person`'s schedule from the record persisted before a restart.
    ///
    /// A record with the in-flight marker set means the outcome of that request is unknown: it is
    /// handled as a lost response (quick retry with the same token, rotation in doubt).
    public mutating func restore(
        _ person: Person, from record: RefreshRecord, at now: Date,
        using random: inout some RandomNumberGenerator
    ) -> [Action] {
        waiting.removeAll { $0 == person }
        if let suspension = record.suspension {
            entries[person] = Entry(record: record, phase: .suspended(suspension), consecutiveFailures: 0)
            return []
        }
        if record.isRefreshInFlight {
            var updated = record
            updated.refreshStartedAt = nil
            updated.tokenMayHaveRotated = true
            let at = ClockMath.date(now, plus: policy.ambiguousRetryDelay)
            entries[person] = Entry(
                record: updated, phase: .scheduled(at: at, isRetry: true), consecutiveFailures: 1)
            return [
                .persist(person, updated), .audit(.refreshInterruptedByRestart(person)),
                .refresh(person, at: at),
            ]
        }
        let at = renewalDate(for: record.token, at: now, using: &random)
        entries[person] = Entry(
            record: record, phase: .scheduled(at: at, isRetry: false), consecutiveFailures: 0)
        return [.refresh(person, at: at)]
    }

    /// Stops scheduling for `person` (removed from the terminal). Revoking their tokens is the
    /// daemon's separate, queued job.
    public mutating func stopTracking(_ person: Person, at now: Date) -> [Action] {
        guard entries.removeValue(forKey: person) != nil else { return [] }
        waiting.removeAll { $0 == person }
        var actions: [Action] = [.cancelRefresh(person)]
        if releaseProbe(held: person), !waiting.isEmpty {
            actions.append(.wakeCircuitBreaker(at: now))
        }
        return actions
    }

    /// Asks for `person`'s refresh now: their timer fired, or a caller needs a fresh access token.
    ///
    /// Returns no actions when a refresh is already in flight, when a backoff is still running,
    /// when the person is suspended or unknown, or when the breaker holds them back (they are
    /// released when it closes).
    public mutating func requestRefresh(for person: Person, at now: Date) -> [Action] {
        guard var entry = entries[person] else { return [] }
        switch entry.phase {
        case .inFlight, .suspended, .waitingForCircuit:
            return []
        case .scheduled(let at, let isRetry):
            if isRetry && now < at { return [] }
        }
        switch circuit {
        case .closed:
            break
        case .open(let until) where now < until:
            entry.phase = .waitingForCircuit
            entries[person] = entry
            waiting.append(person)
            return []
        case .open:
            circuit = .halfOpen(probe: person)
        case .halfOpen(probe: .none):
            circuit = .halfOpen(probe: person)
        case .halfOpen(probe: .some):
            entry.phase = .waitingForCircuit
            entries[person] = entry
            waiting.append(person)
            return []
        }
        return start(person, at: now)
    }

    /// The breaker's timer fired (or it was asked to wake): when the cool-down is over, the first
    /// waiting person's refresh goes out as the probe.
    public mutating func circuitTimerFired(at now: Date) -> [Action] {
        switch circuit {
        case .closed, .halfOpen(probe: .some):
            return []
        case .open(let until) where now < until && !coolDownOutlived(until: until, at: now):
            return [.wakeCircuitBreaker(at: until)]
        case .open, .halfOpen(probe: .none):
            guard !waiting.isEmpty else {
                circuit = .halfOpen(probe: nil)
                return []
            }
            let person = waiting.removeFirst()
            circuit = .halfOpen(probe: person)
            return start(person, at: now)
        }
    }

    /// The network changed (a link came up): end an open breaker's cool-down now so that a probe
    /// can show at once whether the IdP is back.
    public mutating func connectivityChanged(at now: Date) -> [Action] {
        guard case .open = circuit else { return [] }
        circuit = .open(until: now)
        return circuitTimerFired(at: now)
    }

    /// Reports how `person`'s in-flight refresh ended.
    ///
    /// Ignored (no actions) when no refresh was in flight for the person.
    public mutating func complete(
        _ outcome: RefreshOutcome, for person: Person, at now: Date,
        using random: inout some RandomNumberGenerator
    ) -> [Action] {
        guard var entry = entries[person], case .inFlight = entry.phase else { return [] }
        var actions: [Action] = []
        let wasProbe = releaseProbe(held: person)
        entry.record.refreshStartedAt = nil

        switch outcome {
        case .succeeded(let token):
            entry.record = RefreshRecord(token: token)
            entry.consecutiveFailures = 0
            let at = renewalDate(for: token, at: now, using: &random)
            entry.phase = .scheduled(at: at, isRetry: false)
            entries[person] = entry
            actions += [.persist(person, entry.record), .refresh(person, at: at)]
            actions += closeCircuit(at: now, using: &random)

        case .invalidGrant:
            let reason: RefreshSuspension =
                entry.record.tokenMayHaveRotated
                ? .refreshTokenRejectedAfterLostResponse : .refreshTokenRejected
            entry.record.suspension = reason
            entry.phase = .suspended(reason)
            entries[person] = entry
            let event: AuditEvent =
                reason == .refreshTokenRejected
                ? .refreshTokenRejected(person) : .refreshTokenRejectedAfterLostResponse(person)
            actions += [
                .persist(person, entry.record), .cancelRefresh(person), .suspend(person, reason),
                .audit(event),
            ]
            actions += closeCircuit(at: now, using: &random)

        case .responseLost, .unreachable, .timedOut, .serverError:
            if outcome.leavesRotationInDoubt { entry.record.tokenMayHaveRotated = true }
            entry.consecutiveFailures += 1
            var breakerActions: [Action] = []
            if outcome.indicatesUnavailable {
                breakerActions = countUnavailable(wasProbe: wasProbe, at: now)
            }
            actions.append(.persist(person, entry.record))
            switch circuit {
            case .open:
                // Held back until the breaker's probe; the breaker's own timer drives it.
                entry.phase = .waitingForCircuit
                waiting.append(person)
            case .closed, .halfOpen:
                let at = retryDate(
                    after: outcome, failures: entry.consecutiveFailures, at: now, using: &random)
                entry.phase = .scheduled(at: at, isRetry: true)
                actions.append(.refresh(person, at: at))
            }
            entries[person] = entry
            actions += breakerActions
        }
        return actions
    }

    // MARK: - Internals

    /// Marks `person` in flight and asks the daemon to persist that, then send.
    private mutating func start(_ person: Person, at now: Date) -> [Action] {
        guard var entry = entries[person] else { return [] }
        entry.record.refreshStartedAt = now
        entry.phase = .inFlight(since: now)
        entries[person] = entry
        return [.persist(person, entry.record), .startRefresh(person)]
    }

    /// Frees the half-open probe slot if `person` holds it; returns whether it did.
    @discardableResult
    private mutating func releaseProbe(held person: Person) -> Bool {
        guard case .halfOpen(probe: .some(let probe)) = circuit, probe == person else { return false }
        circuit = .halfOpen(probe: nil)
        return true
    }

    /// The IdP answered: close the breaker and release everybody it held back.
    private mutating func closeCircuit(
        at now: Date, using random: inout some RandomNumberGenerator
    ) -> [Action] {
        consecutiveUnavailable = 0
        openings = 0
        guard circuit != .closed else { return [] }
        circuit = .closed
        var actions: [Action] = [.audit(.circuitClosed)]
        for person in waiting {
            guard var entry = entries[person] else { continue }
            let at = ClockMath.date(now, plus: policy.releaseSpread * unitRandom(&random))
            entry.phase = .scheduled(at: at, isRetry: false)
            entries[person] = entry
            actions.append(.refresh(person, at: at))
        }
        waiting.removeAll()
        return actions
    }

    /// Whether an open breaker's cool-down is over whatever `until` says: the wall clock was set
    /// back since it opened (before `openedAt`, or further from `until` than the longest
    /// cool-down). Setting the clock back never keeps the breaker open and all refreshes stopped.
    private func coolDownOutlived(until: Date, at now: Date) -> Bool {
        if let openedAt, now < openedAt { return true }
        return until > ClockMath.date(now, plus: policy.maximumCircuitCoolDown)
    }

    /// Counts an "IdP unavailable" outcome; opens the breaker at the threshold, or re-opens it with
    /// a longer cool-down when the probe failed.
    private mutating func countUnavailable(wasProbe: Bool, at now: Date) -> [Action] {
        consecutiveUnavailable += 1
        switch circuit {
        case .closed where consecutiveUnavailable >= policy.circuitBreakerThreshold:
            break
        case .halfOpen where wasProbe:
            break
        case .closed, .open, .halfOpen:
            return []
        }
        openings += 1
        let coolDown = min(
            policy.circuitCoolDown * (1 << min(openings - 1, 30)), policy.maximumCircuitCoolDown)
        let until = ClockMath.date(now, plus: coolDown)
        circuit = .open(until: until)
        openedAt = now
        return [
            .audit(.circuitOpened(until: until, consecutiveFailures: consecutiveUnavailable)),
            .wakeCircuitBreaker(at: until),
        ]
    }

    /// When to renew `token`: a random point in `policy.renewalPoint` of its lifetime, or within
    /// `releaseSpread` from now when that point has passed.
    private func renewalDate(
        for token: AccessTokenLifetime, at now: Date, using random: inout some RandomNumberGenerator
    ) -> Date {
        let range = policy.renewalPoint
        let fraction = range.lowerBound + (range.upperBound - range.lowerBound) * unitRandom(&random)
        let point = ClockMath.date(token.obtainedAt, plus: token.duration * fraction)
        if point > now { return point }
        return ClockMath.date(now, plus: policy.releaseSpread * unitRandom(&random))
    }

    /// When to retry after a failed attempt: soon after the first lost response, otherwise an
    /// exponential backoff (jittered downwards, capped), never sooner than the IdP's `Retry-After`.
    private func retryDate(
        after outcome: RefreshOutcome, failures: Int, at now: Date,
        using random: inout some RandomNumberGenerator
    ) -> Date {
        if case .responseLost = outcome, failures == 1 {
            return ClockMath.date(now, plus: policy.ambiguousRetryDelay)
        }
        let exponential = policy.initialBackoff * (1 << min(max(failures - 1, 0), 30))
        let capped = min(exponential, policy.maximumBackoff)
        var delay = capped * (1 - policy.backoffJitter * unitRandom(&random))
        if case .serverError(let retryAfter?) = outcome {
            delay = max(delay, min(retryAfter, policy.maximumBackoff))
        }
        return ClockMath.date(now, plus: delay)
    }

    /// A uniformly distributed number in [0, 1) from the injected generator (53 random bits).
    private func unitRandom(_ random: inout some RandomNumberGenerator) -> Double {
        Double(random.next() >> 11) * 0x1p-53
    }
}
