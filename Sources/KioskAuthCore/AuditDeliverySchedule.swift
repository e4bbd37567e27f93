// When to send the audit trail to the organisation's collector, and what each answer means.
//
// The trail itself is the queue: entries carry consecutive sequence numbers from 1, and a durable
// cursor ("delivered through N") records the last entry the endpoint acknowledged. Delivery is at
// least once: the cursor moves only after a 2xx answer to the batch that ends at it, so a crash, a
// timeout or a lost response can only make the same entries go out again, under the same ids, and
// never skip one.
//
// Design decisions worth knowing:
//
// - One batch at a time, in sequence order, each the entries right after the cursor. A failed
//   batch is re-sent as the same range, so the receiver sees the same body (and batch key) again.
// - Transient failures (no connection, no answer in time, a lost response, 5xx, 408, 429) back off
//   exponentially from `initialBackoff`, jittered downwards, capped at `maximumBackoff`, and never
//   sooner than a `Retry-After` the endpoint sent (itself capped).
// - A refusal (any other 4xx, a redirect, an unexpected status) is a configuration fault only an
//   administrator can fix (wrong URL, wrong token). Dropping the events would lose audit records,
//   so nothing is skipped: the batch is retried at the cap until the endpoint accepts it.
// - When the terminal comes back online (the identity provider answers again after an outage), a
//   transient backoff is cut short so queued events go out at once; a refusal's is not.
// - Instants are generic so the daemon can use a monotonic clock (backoff must not stretch or
//   shrink when the wall clock is set) and tests can name exact instants.

/// The tunables of audit delivery.
public struct AuditDeliveryPolicy: Sendable, Hashable {
    /// Most entries in one request.
    public var batchSize: Int
    /// The first backoff after a failure; it doubles with each consecutive failure.
    public var initialBackoff: Duration
    /// The longest backoff, and the pause after a refusal.
    public var maximumBackoff: Duration
    /// The fraction of a backoff that is randomised (0.2: between 80 % and 100 % of it).
    public var backoffJitter: Double

    /// Creates a policy; every parameter has a default.
    public init(
        batchSize: Int = 100, initialBackoff: Duration = .seconds(2), maximumBackoff: Duration = .seconds(300),
        backoffJitter: Double = 0.2
    ) {
        self.batchSize = max(batchSize, 1)
        self.initialBackoff = initialBackoff
        self.maximumBackoff = max(maximumBackoff, initialBackoff)
        self.backoffJitter = min(max(backoffJitter, 0), 1)
    }
}

/// How one batch ended.
public enum AuditDeliveryOutcome: Sendable, Hashable {
    /// The endpoint answered 2xx: every entry of the batch is acknowledged.
    case accepted
    /// Trying again later may succeed: no connection, no answer in time, a lost response, 5xx,
    /// 408 or 429. `retryAfter` is the endpoint's `Retry-After`, when it sent one.
    case failed(retryAfter: Duration?)
    /// The endpoint refused the batch (another 4xx, a redirect, an unexpected status).
    case refused
}

/// The audit-delivery schedule: one cursor, one batch in flight, and the backoff.
///
/// Call ``next(head:at:)`` whenever something may have changed (an entry was appended, a timer
/// fired); it returns what to do. After a ``Action/send(_:)``, report the answer with
/// ``complete(_:at:using:)`` and persist the cursor it returns before asking for more.
public struct AuditDeliverySchedule<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    /// What the daemon does next.
    public enum Action: Sendable, Hashable {
        /// Send the entries with these sequence numbers, in order, as one request.
        case send(ClosedRange<Int>)
        /// Nothing to do until `until` (a backoff), or, when nil, until new entries are appended.
        case wait(until: Instant?)
    }

    /// What a completed batch requires.
    public enum Completion: Sendable, Hashable {
        /// Persist this cursor (every entry through it is acknowledged), durably.
        case persistCursor(Int)
        /// The batch failed; the same range is retried at `at`, `after` from now.
        case retry(at: Instant, after: Duration)
    }

    /// Where delivery stands.
    public enum Phase: Sendable, Hashable {
        /// Nothing in flight and no backoff: the next call to ``next(head:at:)`` sends if anything
        /// is queued.
        case ready
        /// A batch is out.
        case sending(ClosedRange<Int>)
        /// The last batch failed; it goes out again at `until`. `afterRefusal` when the endpoint
        /// refused it rather than failed transiently.
        case backingOff(until: Instant, afterRefusal: Bool)
    }

    /// The rules in force.
    public let policy: AuditDeliveryPolicy
    /// The highest sequence number the endpoint acknowledged (0: none).
    public private(set) var deliveredThrough: Int
    /// Failed attempts since the last accepted batch.
    public private(set) var consecutiveFailures = 0
    /// Where delivery stands.
    public private(set) var phase = Phase.ready
    /// The range of the batch that failed, re-sent as is.
    private var failedRange: ClosedRange<Int>?

    /// Starts from the durable cursor (0 when nothing was ever acknowledged).
    public init(policy: AuditDeliveryPolicy, deliveredThrough: Int) {
        self.policy = policy
        self.deliveredThrough = max(deliveredThrough, 0)
    }

    /// Entries not yet acknowledged when the trail's newest entry is `head`.
    public func queued(head: Int) -> Int {
        max(head - deliveredThrough, 0)
    }

    /// What to do at `now`, when the trail's newest entry is `head`.
    public mutating func next(head: Int, at now: Instant) -> Action {
        switch phase {
        case .sending:
            // One batch at a time: its completion decides what follows.
            return .wait(until: nil)
        case .backingOff(let until, _) where now < until:
            return .wait(until: until)
        case .backingOff, .ready:
            break
        }
        guard head > deliveredThrough else {
            phase = .ready
            failedRange = nil
            return .wait(until: nil)
        }
        var range = (deliveredThrough + 1)...min(head, deliveredThrough + policy.batchSize)
        if let failed = failedRange, failed.lowerBound == range.lowerBound, failed.upperBound <= head {
            range = failed
        }
        phase = .sending(range)
        return .send(range)
    }

    /// Records how the batch in flight ended.
    public mutating func complete(
        _ outcome: AuditDeliveryOutcome, at now: Instant, using random: inout some RandomNumberGenerator
    ) -> Completion {
        guard case .sending(let range) = phase else {
            preconditionFailure("complete(_:at:using:) without a batch in flight")
        }
        switch outcome {
        case .accepted:
            deliveredThrough = max(deliveredThrough, range.upperBound)
            consecutiveFailures = 0
            failedRange = nil
            phase = .ready
            return .persistCursor(deliveredThrough)
        case .failed(let retryAfter):
            consecutiveFailures += 1
            failedRange = range
            let exponential = policy.initialBackoff * (1 << min(consecutiveFailures - 1, 30))
            var delay = jittered(min(exponential, policy.maximumBackoff), using: &random)
            if let retryAfter {
                delay = max(delay, min(retryAfter, policy.maximumBackoff))
            }
            let until = now.advanced(by: delay)
            phase = .backingOff(until: until, afterRefusal: false)
            return .retry(at: until, after: delay)
        case .refused:
            consecutiveFailures += 1
            failedRange = range
            let delay = jittered(policy.maximumBackoff, using: &random)
            let until = now.advanced(by: delay)
            phase = .backingOff(until: until, afterRefusal: true)
            return .retry(at: until, after: delay)
        }
    }

    /// The terminal is back online: a transient backoff ends now (the failure count stays, so a
    /// new failure backs off further). A refusal's backoff stays: reconnecting does not fix it.
    public mutating func networkAvailable() {
        if case .backingOff(_, afterRefusal: false) = phase {
            phase = .ready
        }
    }

    /// `delay` shortened by up to the jitter fraction, so terminals that failed together do not
    /// retry together.
    private func jittered(_ delay: Duration, using random: inout some RandomNumberGenerator) -> Duration {
        delay * (1 - policy.backoffJitter * (Double(random.next() >> 11) * 0x1p-53))
    }
}
