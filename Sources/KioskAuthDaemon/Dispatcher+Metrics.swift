import KioskAuthProtocol

extension Dispatcher {
    /// `GetMetrics` (see Metrics.swift and Authority+Metrics.swift).
    mutating func registerMetricsMethods(authority: Authority) {
        register(KioskAuthMethod.getMetrics) { (_, caller, _) in
            try await authority.metrics(caller)
        }
    }
}
