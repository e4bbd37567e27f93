import KioskAuthProtocol

extension Dispatcher {
    /// `GetMetrics` (see Metrics.swift and Authority+Metrics.swift).
    mutating func registerMetricsMethods(authority: Authority) {
        register(KioskAuthInterface.name + ".GetMetrics") { (_: Message.Empty, caller, _) in
            try await authority.metrics(caller)
        }
    }
}
