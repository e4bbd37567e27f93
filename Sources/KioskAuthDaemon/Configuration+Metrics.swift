public import FoundationEssentials

extension DaemonConfiguration {
    /// The metrics textfile for node_exporter's textfile collector (off unless
    /// `[Metrics] TextfilePath` is set). The daemon never listens on TCP: metrics are read over
    /// the socket (`GetMetrics`) or from this file.
    public struct Metrics: Sendable {
        /// Absolute path of the file, ending in `.prom` (the collector reads only those). Empty: off.
        public var textfilePath = ""
        /// How often the file is rewritten.
        public var textfileInterval: TimeInterval = 60

        /// Whether the textfile is written.
        public var writesTextfile: Bool { !textfilePath.isEmpty }
    }

    /// Sets one `[Metrics]` key; returns false when the key is unknown.
    mutating func setMetricsKey(key: String, value: String) throws -> Bool {
        switch key {
        case "TextfilePath":
            if !value.isEmpty {
                guard value.hasPrefix("/"), value.hasSuffix(".prom"), !value.hasSuffix("/.prom"),
                    !value.split(separator: "/").contains("..")
                else {
                    throw ValueError(
                        message: "expected an absolute path ending in .prom (node_exporter reads only those)")
                }
            }
            metrics.textfilePath = value
        case "TextfileIntervalSec":
            guard let number = Double(value), number.isFinite, (1...86400).contains(number) else {
                throw ValueError(message: "expected a number of seconds in 1...86400")
            }
            metrics.textfileInterval = number
        default: return false
        }
        return true
    }
}
