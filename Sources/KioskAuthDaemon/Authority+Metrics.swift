import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

#if canImport(Glibc)
    import Glibc
#endif

extension Authority {
    /// `GetMetrics`: the Prometheus text exposition. Root and the admin group only: the
    /// numbers name nobody, but they describe when and how the terminal is used, which is the
    /// organisation's business, like the audit trail. A refusal is audited as `metrics`.
    func metrics(_ caller: Caller) async throws(APIError) -> Message.Metrics {
        try terminal.requireAdmin(caller, action: .metrics)
        return Message.Metrics(text: await metricsExposition())
    }

    /// The exposition, for `GetMetrics` and the textfile; reading it changes nothing and audits
    /// nothing (a store failure leaves the affected gauges at 0).
    func metricsExposition() async -> String {
        services.metrics.exposition(await metricsSnapshot())
    }

    /// The state the gauges show, read as root would see it: the terminal's figures and the
    /// online part's connectivity.
    func metricsSnapshot() async -> DaemonMetrics.Snapshot {
        var snapshot = DaemonMetrics.Snapshot()
        let store = context.store
        let people = (try? store.people()) ?? []
        snapshot.people = people.count
        snapshot.peoplePasscodeLocked =
            people.map(terminal.record).filter {
                $0.passcodeHardLocked || $0.passcodeLockedUntil != nil
            }.count
        snapshot.readers = await context.reader?.readers.count ?? 0
        // The daemon asking itself: root's view, without a connection.
        let daemon = Caller(uid: 0, gid: 0, pid: Int(getpid()), groups: [], connectionID: 0)
        if let connectivity = try? online.connectivity(daemon, people: true) {
            snapshot.identityProviderConfigured = connectivity.identityProvider
            snapshot.offline = connectivity.state == "offline"
            for person in connectivity.people { snapshot.windows[person.window, default: 0] += 1 }
            snapshot.minimumWindowSecondsLeft = connectivity.people.compactMap(\.windowSecondsLeft).min()
        }
        if let monitor = services.auditDelivery, let head = try? store.auditHead() {
            let delivered = monitor.snapshot.deliveredThrough
            snapshot.auditQueued = max(head.events - delivered, 0)
            if snapshot.auditQueued > 0,
                let oldest = try? store.auditEntries(in: (delivered + 1)...(delivered + 1)).first
            {
                snapshot.auditLagSeconds = max(context.now().timeIntervalSince(oldest.time), 0)
            }
        }
        return snapshot
    }
}

extension OnlineAuthority {
    /// Counts a finished background refresh by outcome.
    func countRefresh(_ result: RefreshJobResult) {
        switch result {
        case .refreshed: services.metrics.refreshCompleted(outcome: "success")
        case .failed(let error):
            let outcome: String
            switch Self.outcome(of: error) {
            case .succeeded: outcome = "success"
            case .invalidGrant: outcome = "invalid_grant"
            case .responseLost: outcome = "response_lost"
            case .unreachable: outcome = "unreachable"
            case .timedOut: outcome = "timed_out"
            case .serverError: outcome = "server_error"
            }
            services.metrics.refreshCompleted(outcome: outcome)
        }
    }
}
