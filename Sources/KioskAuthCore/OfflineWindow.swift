// The offline window: how long an IdP person may unlock locally after their last successful
// contact with the identity provider (default 8 h).
//
// Why it is built this way: the window is the only thing that bounds how long a revoked or
// disabled IdP account keeps opening a terminal, so nobody may be able to extend it by moving the
// clock. Three measures, each covering the gap the previous one leaves:
//
// 1. Within one boot, elapsed time is measured on the boot clock (`CLOCK_BOOTTIME`), which cannot
//    be set and keeps counting while the machine is suspended. The wall clock is ignored there, so
//    a wall clock that runs ahead (NTP correcting it forward) does not shorten anybody's window.
// 2. Across boots the boot clock restarts, so the state keeps a durable *terminal time*: a
//    wall-clock high-water mark that never decreases. Each observation advances it to the larger
//    of the wall clock and (previous mark + boot time elapsed since it, or + the whole current
//    boot when the mark is from an earlier boot). Contacts remember the terminal time at which
//    they happened, and elapsed time across boots is the difference on this scale. Setting the
//    wall clock back, or booting with it set back, therefore never makes a contact look younger.
//    What the mark cannot see is time the terminal spent powered off after its last persisted
//    observation — inherent without a trusted clock — so the daemon persists observations at
//    least every `recommendedObservationInterval` and at shutdown.
// 3. A wall clock that goes backwards (a reading earlier than the previous one, beyond a small
//    tolerance for NTP steps) ends every window that was open and is audited once. The state
//    carries a clock epoch that a backwards step bumps; a contact from an older epoch is void, so
//    the daemon need not rewrite every person and the window stays ended even after the wall clock
//    catches up again. A contact made after the step (an online login) starts a fresh window.
//
// Detection compares with the *previous* reading, not with the high-water mark, so that one
// backwards step is reported once rather than on every reading until the wall clock catches up.
// Local people have no window.

public import FoundationEssentials

/// Decides whether an IdP person may still unlock offline, in a way that setting the clock back
/// can never extend.
///
/// A value holds the policy and the terminal-wide durable state; every mutating method returns the
/// actions the daemon must perform (persist the new state, write audit events).
public struct OfflineWindow: Sendable, Hashable {
    /// How often the daemon should feed the window a reading (and persist the resulting state) even
    /// when nobody unlocks; this bounds how much uptime a reboot with the clock set back can hide.
    public static let recommendedObservationInterval: Duration = .seconds(60)

    /// The configurable rules of the window.
    public struct Policy: Sendable, Hashable, Codable {
        /// How long after their last successful IdP contact an IdP person may unlock offline.
        public var window: Duration
        /// How far a wall-clock reading may fall behind the previous one before it counts as the
        /// clock going backwards (small NTP steps are not an attack and must not end every window).
        public var backwardsTolerance: Duration

        /// Creates a policy; the defaults are docs/design.md's: an 8 h window and a 2 s tolerance.
        public init(window: Duration = .seconds(8 * 3600), backwardsTolerance: Duration = .seconds(2)) {
            self.window = window
            self.backwardsTolerance = backwardsTolerance
        }
    }

    /// The terminal-wide state the daemon persists durably and hands back after a restart.
    public struct State: Sendable, Hashable, Codable {
        /// The most recent reading observed, or `nil` on a fresh terminal.
        public fileprivate(set) var lastReading: ClockReading?
        /// The terminal time at `lastReading`: a wall-clock high-water mark that never decreases.
        public fileprivate(set) var highWater: Date?
        /// Bumped each time the wall clock goes backwards; contacts from older epochs are void.
        public fileprivate(set) var clockEpoch: UInt64

        /// The state of a terminal that has never observed its clock.
        public init() {
            lastReading = nil
            highWater = nil
            clockEpoch = 0
        }

        fileprivate init(lastReading: ClockReading?, highWater: Date?, clockEpoch: UInt64) {
            self.lastReading = lastReading
            self.highWater = highWater
            self.clockEpoch = clockEpoch
        }
    }

    /// A person's last successful contact with the IdP, as the daemon persists it per person.
    public struct Contact: Sendable, Hashable, Codable {
        /// The reading at the moment of contact.
        public let reading: ClockReading
        /// The terminal time at the moment of contact, used to measure across boots.
        public let terminalTime: Date
        /// The clock epoch at the moment of contact.
        public let clockEpoch: UInt64
    }

    /// Whom a decision is about.
    public enum Subject: Sendable, Hashable {
        /// A person provisioned on this terminal; no window applies.
        case local
        /// A person from the identity provider, with their last successful contact.
        case identityProvider(lastContact: Contact)
    }

    /// Whether a person may unlock offline now.
    public enum Decision: Sendable, Hashable {
        /// The person is local; the offline window does not apply.
        case notApplicable
        /// Unlock is allowed; the window closes after `remaining` more time.
        case allowed(remaining: Duration)
        /// The window closed `ago`; the person must log in online.
        case expired(ago: Duration)
        /// The wall clock went backwards since the contact, which ended the window; the person must
        /// log in online.
        case clockWentBackwards

        /// Whether the person may unlock locally.
        public var permitsUnlock: Bool {
            switch self {
            case .notApplicable, .allowed: true
            case .expired, .clockWentBackwards: false
            }
        }
    }

    /// Something that should be written to the audit trail.
    public enum AuditEvent: Sendable, Hashable {
        /// The wall clock read earlier than before; every open offline window was ended.
        case clockWentBackwards(previous: ClockReading, current: ClockReading)
    }

    /// Work the daemon performs, in order, after a call.
    public enum Action: Sendable, Hashable {
        /// Persist this terminal-wide state durably (it replaces the previous one).
        case persist(State)
        /// Append this event to the audit trail.
        case audit(AuditEvent)
    }

    /// The result of `evaluate(_:at:)`.
    public struct Evaluation: Sendable, Hashable {
        /// Whether the person may unlock.
        public let decision: Decision
        /// What the daemon must do, in order.
        public let actions: [Action]
    }

    /// The rules in force.
    public var policy: Policy
    /// The terminal-wide durable state.
    public private(set) var state: State

    /// Creates a window from its policy and the state persisted earlier (or a fresh state).
    public init(policy: Policy = Policy(), state: State = State()) {
        self.policy = policy
        self.state = state
    }

    /// Takes a reading into account: advances the high-water mark and detects the wall clock going
    /// backwards. Call it periodically (see `recommendedObservationInterval`) and at shutdown.
    public mutating func observe(_ now: ClockReading) -> [Action] {
        guard let last = state.lastReading, let highWater = state.highWater else {
            state = State(lastReading: now, highWater: now.wall, clockEpoch: state.clockEpoch)
            return [.persist(state)]
        }
        var audit: [Action] = []
        // A reading taken before the last one in the same boot (readings raced in the daemon) is
        // compared with where the wall clock stood at that earlier moment and does not move the mark.
        let bootDelta = now.bootTimeElapsed(since: last) ?? .zero
        let expectedFloor = ClockMath.date(last.wall, plus: min(bootDelta, .zero))
        if now.wall < ClockMath.date(expectedFloor, plus: .zero - policy.backwardsTolerance) {
            state.clockEpoch += 1
            audit.append(.audit(.clockWentBackwards(previous: last, current: now)))
        }
        let previous = state
        if bootDelta >= .zero {
            state = State(
                lastReading: now, highWater: terminalTime(at: now, last: last, highWater: highWater),
                clockEpoch: state.clockEpoch)
        }
        return (state != previous || !audit.isEmpty ? [.persist(state)] : []) + audit
    }

    /// Records a successful contact with the IdP at `now` (an online login or a refresh) and returns
    /// the contact to persist for that person, with the actions for the terminal-wide state.
    public mutating func recordContact(at now: ClockReading) -> (contact: Contact, actions: [Action]) {
        let actions = observe(now)
        let contact = Contact(
            reading: now, terminalTime: currentTerminalTime(at: now), clockEpoch: state.clockEpoch)
        return (contact, actions)
    }

    /// Decides whether `subject` may unlock offline at `now`, observing the reading first.
    public mutating func evaluate(_ subject: Subject, at now: ClockReading) -> Evaluation {
        let actions = observe(now)
        guard case .identityProvider(let contact) = subject else {
            return Evaluation(decision: .notApplicable, actions: actions)
        }
        guard contact.clockEpoch == state.clockEpoch else {
            return Evaluation(decision: .clockWentBackwards, actions: actions)
        }
        let elapsed: Duration
        if let bootElapsed = now.bootTimeElapsed(since: contact.reading) {
            elapsed = max(bootElapsed, .zero)
        } else {
            elapsed = max(
                ClockMath.duration(from: contact.terminalTime, to: currentTerminalTime(at: now)), .zero)
        }
        let decision: Decision =
            elapsed < policy.window
            ? .allowed(remaining: policy.window - elapsed) : .expired(ago: elapsed - policy.window)
        return Evaluation(decision: decision, actions: actions)
    }

    /// The terminal time at `now` given the current state (which already observed `now`, or a later
    /// reading when `now` is stale).
    private func currentTerminalTime(at now: ClockReading) -> Date {
        guard let last = state.lastReading, let highWater = state.highWater else { return now.wall }
        return terminalTime(at: now, last: last, highWater: highWater)
    }

    /// The larger of the wall clock and the high-water mark advanced by the time that has certainly
    /// passed since it: the boot-clock delta in the same boot, or the whole current boot otherwise
    /// (the previous boot ended before this one started).
    private func terminalTime(at now: ClockReading, last: ClockReading, highWater: Date) -> Date {
        let certainlyElapsed = now.bootTimeElapsed(since: last) ?? now.sinceBoot
        return max(now.wall, ClockMath.date(highWater, plus: certainlyElapsed))
    }
}
