extension Message {
    /// `GetMetrics`' reply.
    public struct Metrics: Codable, Sendable {
        /// The Prometheus text exposition format (version 0.0.4).
        public var text: String
        public init(text: String) { self.text = text }
    }
}
