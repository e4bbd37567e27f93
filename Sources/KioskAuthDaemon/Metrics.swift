import CoreMetrics
import FoundationEssentials
import Prometheus

/// The daemon's counters, histograms and gauges, recorded through swift-metrics into a
/// Prometheus registry the daemon owns (no process-wide `MetricsSystem.bootstrap`, so tests and
/// libraries cannot pollute it), and rendered in the Prometheus text exposition format by
/// `GetMetrics`, `kioskauthctl metrics` and the optional textfile for node_exporter.
///
/// Label values come only from the fixed sets below: a metric never carries a person's name,
/// uid, id, email or anything a caller typed, so the exposition can go to a fleet's monitoring
/// without widening who learns who works where. Anything outside a set is counted as `other`.
public final class DaemonMetrics: Sendable {
    /// Every metric name, for the docs and the tests.
    public enum Name {
        public static let unlocks = "kioskauth_unlocks_total"
        public static let identifyDuration = "kioskauth_identify_duration_seconds"
        public static let verifyDuration = "kioskauth_verify_duration_seconds"
        public static let passcodeLockouts = "kioskauth_passcode_lockouts_total"
        public static let offline = "kioskauth_offline"
        public static let offlineWindowPeople = "kioskauth_offline_window_people"
        public static let offlineWindowRemaining = "kioskauth_offline_window_min_remaining_seconds"
        public static let refreshes = "kioskauth_token_refreshes_total"
        public static let auditQueued = "kioskauth_audit_delivery_queued_events"
        public static let auditLag = "kioskauth_audit_delivery_lag_seconds"
        public static let readers = "kioskauth_readers_present"
        public static let readerErrors = "kioskauth_reader_errors_total"
        public static let connections = "kioskauth_socket_connections_total"
        public static let refusals = "kioskauth_socket_refusals_total"
        public static let people = "kioskauth_people"
        public static let lockedOut = "kioskauth_people_passcode_locked"
    }

    /// The audit actions that are an attempt to unlock (authenticate a person).
    static let unlockActions: Set<String> = ["passcode.verify", "finger.verify", "finger.identify", "idp.login"]
    /// Unlock methods, as the audit trail names them.
    static let methods: Set<String> = ["passcode", "fingerprint", "idp-password", "idp-device"]
    /// Outcomes, as the audit trail names them.
    static let results: Set<String> = ["success", "failure", "refused"]
    /// Errors of a scan that say the reader, not the person, failed.
    static let readerErrorNames: [String: String] = [
        "io.kioskauth.ReaderUnavailable": "unavailable", "io.kioskauth.ReaderRemoved": "removed",
        "io.kioskauth.ReaderFull": "full", "io.kioskauth.ScanTimeout": "scan_timeout",
    ]
    /// Socket-level refusals by varlink error.
    static let refusalNames: [String: String] = [
        "io.kioskauth.TooManyConnections": "too_many_connections", "io.kioskauth.ShuttingDown": "shutting_down",
        "io.kioskauth.RateLimited": "rate_limited", "io.kioskauth.MessageTooLarge": "message_too_large",
        "io.kioskauth.MalformedMessage": "malformed", "io.kioskauth.PermissionDenied": "permission_denied",
        "org.varlink.service.PermissionDenied": "permission_denied",
    ]
    /// Offline-window states (`GetConnectivity`'s `window`).
    static let windowStates = ["open", "expired", "never", "suspended", "clock-went-backwards"]
    /// Refresh outcomes.
    static let refreshOutcomes = [
        "success", "invalid_grant", "response_lost", "unreachable", "timed_out", "server_error",
    ]

    let registry = PrometheusCollectorRegistry()
    private let factory: PrometheusMetricsFactory

    public init() {
        var factory = PrometheusMetricsFactory(registry: registry)
        // A passcode check is an Argon2 hash (tenths of a second); a fingerprint call includes
        // the wait for the finger, so the buckets reach a scan timeout.
        let buckets: [Duration] = [
            .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
            .milliseconds(2500), .seconds(5), .seconds(10), .seconds(30),
        ]
        factory.durationHistogramBuckets = [Name.identifyDuration: buckets, Name.verifyDuration: buckets]
        self.factory = factory
        // Series that exist from the start, so a dashboard sees 0 rather than no data.
        for method in ["passcode", "fingerprint"] {
            for result in ["success", "failure"] {
                _ = CoreMetrics.Counter(
                    label: Name.unlocks, dimensions: [("method", method), ("result", result)], factory: factory)
            }
        }
        for result in ["success", "failure"] {
            _ = CoreMetrics.Timer(label: Name.identifyDuration, dimensions: [("result", result)], factory: factory)
            for method in ["passcode", "fingerprint"] {
                _ = CoreMetrics.Timer(
                    label: Name.verifyDuration, dimensions: [("method", method), ("result", result)], factory: factory)
            }
        }
        for kind in ["delay", "hard"] {
            _ = CoreMetrics.Counter(label: Name.passcodeLockouts, dimensions: [("kind", kind)], factory: factory)
        }
        for outcome in Self.refreshOutcomes {
            _ = CoreMetrics.Counter(label: Name.refreshes, dimensions: [("outcome", outcome)], factory: factory)
        }
        for kind in Set(Self.readerErrorNames.values) {
            _ = CoreMetrics.Counter(label: Name.readerErrors, dimensions: [("error", kind)], factory: factory)
        }
        for reason in Set(Self.refusalNames.values) {
            _ = CoreMetrics.Counter(label: Name.refusals, dimensions: [("reason", reason)], factory: factory)
        }
        _ = CoreMetrics.Counter(label: Name.connections, factory: factory)
    }

    private static func label(_ value: String?, in set: Set<String>) -> String {
        guard let value, set.contains(value) else { return "other" }
        return value
    }

    // MARK: Events

    /// One audit entry: counts unlock attempts by method and result.
    func observeAudit(action: String, result: String, method: String?) {
        guard Self.unlockActions.contains(action) else { return }
        let method = Self.label(method ?? (action.hasPrefix("finger.") ? "fingerprint" : nil), in: Self.methods)
        Counter(
            label: Name.unlocks, dimensions: [("method", method), ("result", Self.label(result, in: Self.results))],
            factory: factory
        ).increment()
    }

    /// A failed passcode put the person into a delay (`hard: false`) or the hard lock.
    func passcodeLockedOut(hard: Bool) {
        CoreMetrics.Counter(
            label: Name.passcodeLockouts, dimensions: [("kind", hard ? "hard" : "delay")], factory: factory
        )
        .increment()
    }

    /// A background token refresh finished (`outcome` one of `refreshOutcomes`).
    func refreshCompleted(outcome: String) {
        let outcome = Self.refreshOutcomes.contains(outcome) ? outcome : "other"
        CoreMetrics.Counter(label: Name.refreshes, dimensions: [("outcome", outcome)], factory: factory).increment()
    }

    /// A connection was admitted.
    func connectionAccepted() {
        CoreMetrics.Counter(label: Name.connections, factory: factory).increment()
    }

    /// The socket refused a connection or a message, or a call was refused for lack of
    /// permission; `error` is the varlink error name sent.
    func refused(error: String) {
        guard let reason = Self.refusalNames[error] else { return }
        CoreMetrics.Counter(label: Name.refusals, dimensions: [("reason", reason)], factory: factory).increment()
    }

    /// A call finished after `duration`, with the varlink error `error` or none: times identify
    /// and verify calls, and counts reader failures and permission refusals.
    func callFinished(method: String, duration: Duration, error: String?) {
        let result = error == nil ? "success" : "failure"
        let nanoseconds = duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000
        switch method {
        case "io.kioskauth.Identify":
            CoreMetrics.Timer(label: Name.identifyDuration, dimensions: [("result", result)], factory: factory)
                .recordNanoseconds(nanoseconds)
        case "io.kioskauth.VerifyFinger", "io.kioskauth.VerifyPasscode":
            let kind = method == "io.kioskauth.VerifyPasscode" ? "passcode" : "fingerprint"
            CoreMetrics.Timer(
                label: Name.verifyDuration, dimensions: [("method", kind), ("result", result)], factory: factory
            )
            .recordNanoseconds(nanoseconds)
        default: break
        }
        guard let error else { return }
        if let kind = Self.readerErrorNames[error] {
            CoreMetrics.Counter(label: Name.readerErrors, dimensions: [("error", kind)], factory: factory).increment()
        }
        if Self.refusalNames[error] == "permission_denied" { refused(error: error) }
    }

    // MARK: Exposition

    /// The state gauges are read when the metrics are, from this.
    struct Snapshot: Sendable {
        var people = 0
        var peoplePasscodeLocked = 0
        var readers = 0
        var identityProviderConfigured = false
        var offline = false
        var windows: [String: Int] = [:]
        var minimumWindowSecondsLeft: Int?
        var auditQueued = 0
        var auditLagSeconds = 0.0
    }

    /// The Prometheus text exposition, with the gauges set from `snapshot`.
    func exposition(_ snapshot: Snapshot) -> String {
        func gauge(_ name: String, _ value: Double, _ dimensions: [(String, String)] = []) {
            CoreMetrics.Gauge(label: name, dimensions: dimensions, factory: factory).record(value)
        }
        gauge(Name.people, Double(snapshot.people))
        gauge(Name.lockedOut, Double(snapshot.peoplePasscodeLocked))
        gauge(Name.readers, Double(snapshot.readers))
        gauge(Name.offline, snapshot.identityProviderConfigured && snapshot.offline ? 1 : 0)
        for state in Self.windowStates {
            gauge(Name.offlineWindowPeople, Double(snapshot.windows[state] ?? 0), [("state", state)])
        }
        gauge(Name.offlineWindowRemaining, Double(snapshot.minimumWindowSecondsLeft ?? 0))
        gauge(Name.auditQueued, Double(snapshot.auditQueued))
        gauge(Name.auditLag, snapshot.auditLagSeconds)
        return registry.emitToString()
    }
}
