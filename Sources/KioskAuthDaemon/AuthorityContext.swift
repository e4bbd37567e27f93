import FoundationEssentials
import KioskAuthCore
import KioskAuthFingerprint
import KioskAuthStore
import Logging
import NIOPosix

/// What the authority's parts share: the store, the configuration, the clocks and services, and
/// the three collaborators — access control (`AccessControl`), the audit trail (`AuditTrail`) and
/// the ticket book (`TicketBook`). It also owns the two pieces of state more than one part reads:
/// the terminal's steady clock and the fingers a storage reader was missing at its last
/// reconciliation (written by credential work, shown on every person record).
@AuthorityActor
final class AuthorityContext {
    let store: Store
    let configuration: DaemonConfiguration
    let logger: Logger
    let now: @Sendable () -> Date
    let hashingPool: HashingPool
    let startedAt: Date
    let isSocketActivated: Bool
    let usesDevelopmentKey: Bool
    /// The fingerprint reader service; nil when fingerprints are disabled or libfprint could not
    /// be started. The daemon attaches it once its start finished (`Authority.attach(reader:)`),
    /// before anything is served.
    private(set) var reader: FingerprintReader?
    /// The clock, the identity provider, the event hub and audit delivery.
    let services: OnlineServices
    let access: AccessControl
    let trail: AuditTrail
    let tickets = TicketBook()

    /// The steady clock, loaded at first use (see `steadyNow`).
    var steadyClock: SteadyClock?
    /// Per person, the enrolled fingers a storage reader did not hold at its last reconciliation
    /// (`reconcileSensor`); shown on the person and by ListFingers until enrolled again.
    var fingersMissingFromSensor: [Int64: Set<String>] = [:]

    nonisolated init(
        store: Store, configuration: DaemonConfiguration, access: AccessControl, hashingPool: HashingPool,
        isSocketActivated: Bool, usesDevelopmentKey: Bool, reader: FingerprintReader?, logger: Logger,
        services: OnlineServices, now: @escaping @Sendable () -> Date
    ) {
        self.store = store
        self.configuration = configuration
        self.access = access
        self.hashingPool = hashingPool
        self.isSocketActivated = isSocketActivated
        self.usesDevelopmentKey = usesDevelopmentKey
        self.reader = reader
        self.logger = logger
        self.services = services
        self.now = now
        self.startedAt = now()
        self.trail = AuditTrail(
            store: store, logger: logger, now: now, access: access, auditDelivery: services.auditDelivery,
            metrics: services.metrics,
            refusalSummaryInterval: configuration.access.refusalSummaryInterval)
    }

    func attach(reader: FingerprintReader?) { self.reader = reader }

    // MARK: Steady time

    static let steadyClockKey = "steady-clock"

    /// Terminal steady time (see `SteadyClock`): what lockout delays, pauses, limiter windows and
    /// ticket lifetimes are measured on, so that moving the wall clock skips or extends none.
    func steadyNow(_ given: ClockReading? = nil) -> Date {
        let reading = given ?? services.clock.reading()
        let loaded = steadyClock
        var clock =
            loaded
            ?? ((try? terminalValue(SteadyClock.self, forKey: Self.steadyClockKey, caller: nil, action: .clock)) ?? nil)
            ?? SteadyClock(first: reading)
        let bootBefore = clock.anchor.bootID
        let time = clock.time(at: reading)
        steadyClock = clock
        if loaded == nil || clock.anchor.bootID != bootBefore {
            saveTerminalValue(clock, forKey: Self.steadyClockKey, action: .clock)
        }
        return time
    }

    /// Persists a recent steady time: the high-water mark the next boot resumes from.
    func checkpointSteadyClock(_ reading: ClockReading) {
        _ = steadyNow(reading)
        guard var clock = steadyClock else { return }
        clock.checkpoint(reading)
        steadyClock = clock
        saveTerminalValue(clock, forKey: Self.steadyClockKey, action: .clock)
    }

    /// The wall-clock instant a steady-time instant corresponds to now, for display.
    func wallTime(ofSteady time: Date) -> Date {
        let reading = services.clock.reading()
        return reading.wall.addingTimeInterval(time.timeIntervalSince(steadyNow(reading)))
    }

    // MARK: Terminal-wide values

    /// A terminal-wide value (a limiter, the identify throttle, the offline window, the steady
    /// clock). One changed behind the store's back is `StoreIntegrity`, logged and audited, never
    /// silently replaced by a fresh default.
    func terminalValue<T: Decodable>(
        _ type: T.Type, forKey key: String, caller: Caller?, action: AuditAction
    ) throws(APIError) -> T? {
        try trail.withStore(caller, action: action) { () throws(StoreError) in
            try store.terminalValue(type, forKey: key)
        }
    }

    /// Stores a terminal-wide value; a failure (a row changed behind the store's back is not
    /// overwritten) is logged, and audited when it is an integrity failure.
    func saveTerminalValue(_ value: some Encodable, forKey key: String, action: AuditAction, caller: Caller? = nil) {
        _ = try? trail.withStore(caller, action: action) { () throws(StoreError) in
            try store.setTerminalValue(value, forKey: key)
        }
    }
}
