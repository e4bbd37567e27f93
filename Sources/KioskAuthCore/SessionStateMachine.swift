// One session — opened by PAM `open_session` or the API — and the rules that end or lock it.
//
// Why it is built this way: a shared terminal's sessions must end when the person walks away
// (idle), at the daily overnight cut-off, and after a maximum age, and a lock must invalidate
// every authentication that happened before it. Timers do not run while the machine is suspended
// and may fire late, so a timer only prompts a re-check: every decision is computed from the
// readings the daemon passes in, on every request and on resume, and the machine tells the daemon
// the next boot-clock deadline to arm a timer for.
//
// Elapsed time (idle, maximum age, step-up freshness) is measured on the boot clock, which cannot
// be set and counts suspend, so moving the wall clock neither shortens nor extends a session. The
// overnight cut-off is a wall-clock notion ("04:00 local"), so it is computed once, when the
// session opens, as an absolute instant — the first cut-off strictly after opening, found with the
// caller's calendar and time zone so that DST nights (23 h or 25 h long) are handled by the
// calendar rather than by arithmetic. The session ends when the wall clock reaches that instant
// OR when the boot clock has advanced by the interval the instant was away at opening, so setting
// the clock back cannot postpone the cut-off either. A cut-off time that does not exist on a DST
// night resolves to the next existing time; one that occurs twice resolves to the first.
//
// The lock epoch is a counter that every lock bumps. Authentications remember the epoch they
// started in: a scan that began before a lock never unlocks after it, and step-up never accepts an
// authentication from before the last lock, however recent.

public import FoundationEssentials

/// The lifecycle of one session: idle timeout, overnight cut-off, maximum age, lock epoch and
/// step-up, decided from clock readings alone.
///
/// Every mutating method re-checks the end rules first, then applies its change, and returns the
/// actions to perform in order. Persist the value (it is `Codable`) if sessions must survive a
/// daemon restart.
public struct SessionStateMachine: Sendable, Hashable, Codable {
    /// A local time of day, such as the overnight cut-off.
    public struct TimeOfDay: Sendable, Hashable, Codable {
        /// The hour, 0–23.
        public var hour: Int
        /// The minute, 0–59.
        public var minute: Int

        /// Creates a time of day, or `nil` when `hour` is not in 0–23 or `minute` not in 0–59.
        public init?(hour: Int, minute: Int = 0) {
            guard (0..<24).contains(hour), (0..<60).contains(minute) else { return nil }
            self.hour = hour
            self.minute = minute
        }
    }

    /// The configurable rules.
    public struct Policy: Sendable, Hashable, Codable {
        /// How long without reported activity before the session ends.
        public var idleTimeout: Duration
        /// How long a session may last at most, or `nil` for no limit.
        public var maximumAge: Duration?
        /// The daily local time at which sessions end, or `nil` for none.
        public var overnightCutoff: TimeOfDay?

        /// Creates a policy; defaults: 30 min idle timeout, 12 h maximum age, cut-off at 04:00.
        public init(
            idleTimeout: Duration = .seconds(30 * 60), maximumAge: Duration? = .seconds(12 * 3600),
            overnightCutoff: TimeOfDay? = TimeOfDay(hour: 4)!
        ) {
            self.idleTimeout = idleTimeout
            self.maximumAge = maximumAge
            self.overnightCutoff = overnightCutoff
        }
    }

    /// Why a session ended.
    public enum EndReason: String, Sendable, Hashable, Codable {
        /// No activity was reported for the idle timeout.
        case idle
        /// The daily overnight cut-off passed.
        case overnight
        /// The session reached its maximum age.
        case maximumAge
        /// The person or the app closed the session.
        case loggedOut
        /// The person was removed from the terminal.
        case personRemoved
        /// An admin ended all of the person's sessions (`kioskauthctl session end NAME`).
        case securityLogout
        /// The terminal rebooted since the session opened.
        case rebooted
    }

    /// What subscribers of the event stream are told.
    public enum Event: Sendable, Hashable {
        /// The session was locked.
        case locked
        /// The session was unlocked by a fresh authentication.
        case unlocked
        /// The session ended.
        case ended(EndReason)
    }

    /// Work the daemon performs, in order, after a call.
    public enum Action: Sendable, Hashable {
        /// Publish this event to subscribers.
        case emit(Event)
        /// (Re)arm the session's timer for this instant on the boot clock (`CLOCK_BOOTTIME`, compare
        /// with `ClockReading.sinceBoot`); when it fires, call `check(at:)`.
        case rescheduleTimeout(deadline: Duration)
        /// The session has ended: disarm its timer.
        case cancelTimeout
    }

    /// Where the session stands.
    public enum Phase: Sendable, Hashable, Codable {
        /// Open and unlocked.
        case active
        /// Locked since the reading; only a fresh authentication unlocks it.
        case locked(since: ClockReading)
        /// Ended for the reason at the reading; it never reopens.
        case ended(EndReason, at: ClockReading)
    }

    /// A successful authentication in this session.
    public struct Authentication: Sendable, Hashable, Codable {
        /// When it happened.
        public let at: ClockReading
        /// The lock epoch it belongs to.
        public let lockEpoch: UInt64
    }

    /// How `recordAuthentication(at:startedInLockEpoch:)` went.
    public enum AuthenticationResult: Sendable, Hashable {
        /// Recorded; a locked session is now unlocked.
        case accepted
        /// The authentication began before the session was locked again: it does not count.
        case staleLockEpoch
        /// The session has ended; open a new one.
        case sessionEnded(EndReason)
    }

    /// The answer to a step-up request.
    public enum StepUpDecision: Sendable, Hashable {
        /// A recent enough authentication, after the last lock, exists.
        case satisfied
        /// The caller must authenticate the person again (and then record it).
        case needsAuthentication
        /// The session has ended.
        case sessionEnded(EndReason)
    }

    /// The rules this session was opened under.
    public let policy: Policy
    /// When the session opened.
    public let openedAt: ClockReading
    /// The wall-clock instant of the overnight cut-off that ends this session, if any.
    public let overnightCutoff: Date?
    /// The same cut-off on the boot clock of the opening boot, so that setting the wall clock back
    /// cannot postpone it.
    private let overnightBootDeadline: Duration?
    /// Where the session stands.
    public private(set) var phase: Phase
    /// The latest reported activity (or successful authentication).
    public private(set) var lastActivity: ClockReading
    /// The latest successful authentication, if any.
    public private(set) var lastAuthentication: Authentication?
    /// Bumped by every lock; pass it to `recordAuthentication` for a scan started now.
    public private(set) var lockEpoch: UInt64

    /// Opens a session at `openedAt`.
    ///
    /// - Parameters:
    ///   - openedAt: The reading when the session opened.
    ///   - authenticatedAt: When the authentication that opened it happened, if there was one; it
    ///     counts for step-up.
    ///   - policy: The rules.
    ///   - calendar: The calendar and time zone in which the overnight cut-off is a local time.
    ///
    /// Arm the session's timer for `nextDeadline` afterwards.
    public init(
        openedAt: ClockReading, authenticatedAt: ClockReading?, policy: Policy = Policy(),
        calendar: Calendar
    ) {
        self.init(openedAt: openedAt, authenticatedAt: authenticatedAt, policy: policy) { after, hour, minute in
            calendar.nextDate(
                after: after, matching: DateComponents(hour: hour, minute: minute, second: 0),
                matchingPolicy: .nextTime, repeatedTimePolicy: .first, direction: .forward)
        }
    }

    /// Opens a session at `openedAt`, with the overnight cut-off found by `nextLocalTime`: the
    /// first instant strictly after its first argument at which the local wall clock shows the
    /// hour and minute given (the next existing time when that one is skipped on a DST night,
    /// the first when it occurs twice). For callers without a `Calendar` that knows their time
    /// zone (FoundationEssentials alone knows only GMT).
    public init(
        openedAt: ClockReading, authenticatedAt: ClockReading?, policy: Policy = Policy(),
        nextLocalTime: (_ after: Date, _ hour: Int, _ minute: Int) -> Date?
    ) {
        self.policy = policy
        self.openedAt = openedAt
        phase = .active
        lastActivity = openedAt
        lockEpoch = 0
        lastAuthentication = authenticatedAt.map { Authentication(at: $0, lockEpoch: 0) }
        if let time = policy.overnightCutoff {
            let cutoff =
                nextLocalTime(openedAt.wall, time.hour, time.minute)
                // A calendar that finds no match cannot happen for a valid time of day; fail closed.
                ?? openedAt.wall
            overnightCutoff = cutoff
            overnightBootDeadline =
                openedAt.sinceBoot + max(ClockMath.duration(from: openedAt.wall, to: cutoff), .zero)
        } else {
            overnightCutoff = nil
            overnightBootDeadline = nil
        }
    }

    /// Whether the session has ended.
    public var isEnded: Bool {
        if case .ended = phase { return true }
        return false
    }

    /// Whether the session is locked.
    public var isLocked: Bool {
        if case .locked = phase { return true }
        return false
    }

    /// The next instant on the opening boot's boot clock at which a rule may end the session, or
    /// `nil` once it has ended.
    public var nextDeadline: Duration? {
        guard !isEnded else { return nil }
        return bootDeadlines.map(\.deadline).min()
    }

    /// The rule that ends the session at `now`, if any (or the reason it already ended).
    public func endReason(at now: ClockReading) -> EndReason? {
        if case .ended(let reason, _) = phase { return reason }
        guard now.isSameBoot(as: openedAt) else { return .rebooted }
        // The earliest deadline that has passed is the one that really ended the session (a resume
        // after a long suspend may find several passed).
        let passed = bootDeadlines.filter { now.sinceBoot >= $0.deadline }
        if let first = passed.min(by: { $0.deadline < $1.deadline }) { return first.reason }
        if let cutoff = overnightCutoff, now.wall >= cutoff { return .overnight }
        return nil
    }

    /// Re-checks the end rules at `now`: call it when the timer fires, on resume from suspend, when
    /// the wall clock is changed, and on every request about the session.
    public mutating func check(at now: ClockReading) -> [Action] {
        guard !isEnded else { return [] }
        if let reason = endReason(at: now) {
            phase = .ended(reason, at: now)
            return [.emit(.ended(reason)), .cancelTimeout]
        }
        return timerAction()
    }

    /// Records activity reported by the caller, which postpones the idle timeout. Activity in a
    /// locked session does not count: only an authentication unlocks it.
    public mutating func recordActivity(at now: ClockReading) -> [Action] {
        let checked = check(at: now)
        guard case .active = phase else { return checked }
        if now.sinceBoot > lastActivity.sinceBoot { lastActivity = now }
        return timerAction()
    }

    /// Locks the session, bumping the lock epoch so that nothing authenticated before the lock
    /// counts after it. Locking a locked session changes nothing.
    public mutating func lock(at now: ClockReading) -> [Action] {
        let checked = check(at: now)
        guard case .active = phase else { return checked }
        lockEpoch += 1
        phase = .locked(since: now)
        return [.emit(.locked)] + timerAction()
    }

    /// Records a successful authentication of the session's person that started in lock epoch
    /// `epoch`; it unlocks a locked session and counts as activity.
    public mutating func recordAuthentication(
        at now: ClockReading, startedInLockEpoch epoch: UInt64
    ) -> (result: AuthenticationResult, actions: [Action]) {
        let checked = check(at: now)
        if case .ended(let reason, _) = phase { return (.sessionEnded(reason), checked) }
        guard epoch == lockEpoch else { return (.staleLockEpoch, checked) }
        lastAuthentication = Authentication(at: now, lockEpoch: lockEpoch)
        if now.sinceBoot > lastActivity.sinceBoot { lastActivity = now }
        var actions: [Action] = []
        if case .locked = phase {
            phase = .active
            actions.append(.emit(.unlocked))
        }
        return (.accepted, actions + timerAction())
    }

    /// Ends the session for an outside reason (logout, removal, security logout).
    public mutating func end(_ reason: EndReason, at now: ClockReading) -> [Action] {
        guard !isEnded else { return [] }
        phase = .ended(reason, at: now)
        return [.emit(.ended(reason)), .cancelTimeout]
    }

    /// Whether an authentication no older than `maximumAge`, and not from before the last lock,
    /// exists at `now`. A locked session always needs a new authentication.
    public func stepUp(maximumAge: Duration, at now: ClockReading) -> StepUpDecision {
        if let reason = endReason(at: now) { return .sessionEnded(reason) }
        // The epoch comparison is defence in depth: only an authentication in the current epoch can
        // unlock, so an active session's last authentication is always from the current epoch.
        guard case .active = phase, let authentication = lastAuthentication,
            authentication.lockEpoch == lockEpoch,
            let age = now.bootTimeElapsed(since: authentication.at), age <= maximumAge
        else { return .needsAuthentication }
        return .satisfied
    }

    /// The boot-clock deadlines of the rules that measure elapsed time.
    private var bootDeadlines: [(deadline: Duration, reason: EndReason)] {
        // Order breaks ties: the overnight cut-off, then the maximum age, then idleness.
        var deadlines: [(deadline: Duration, reason: EndReason)] = []
        if let overnight = overnightBootDeadline { deadlines.append((overnight, .overnight)) }
        if let maximumAge = policy.maximumAge {
            deadlines.append((openedAt.sinceBoot + maximumAge, .maximumAge))
        }
        deadlines.append((lastActivity.sinceBoot + policy.idleTimeout, .idle))
        return deadlines
    }

    /// The timer instruction that matches the current state.
    private func timerAction() -> [Action] {
        guard let deadline = nextDeadline else { return [.cancelTimeout] }
        return [.rescheduleTimeout(deadline: deadline)]
    }
}
