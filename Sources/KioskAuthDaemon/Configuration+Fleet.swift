public import FoundationEssentials

extension DaemonConfiguration {
    /// `[Fleet]`: how a fleet member syncs (docs/fleet.md). Membership itself is in the store
    /// (`kioskauthctl fleet create` / `join`), so a terminal in no fleet ignores this section.
    public struct Fleet: Sendable {
        /// The backstop poll: a pull at least this often, even without a notification.
        public var pollInterval: TimeInterval = 30
        /// The longest wait between reconnection attempts (the back-off doubles up to it).
        public var reconnectMax: TimeInterval = 30
        /// This terminal's name in the directory; empty: the host name.
        public var terminalName = ""
        /// The longest one directory operation (connecting included) may take before the
        /// directory is taken as unreachable.
        public var operationTimeout: TimeInterval = 20
    }

    /// Sets one `[Fleet]` key; returns false when the key is unknown.
    mutating func setFleetKey(key: String, value: String) throws -> Bool {
        switch key {
        case "PollIntervalSec":
            guard let number = Double(value), number.isFinite, (0.1...86400).contains(number) else {
                throw ValueError(message: "expected a number of seconds in 0.1...86400")
            }
            fleet.pollInterval = number
        case "ReconnectMaxSec":
            guard let number = Double(value), number.isFinite, (0.1...3600).contains(number) else {
                throw ValueError(message: "expected a number of seconds in 0.1...3600")
            }
            fleet.reconnectMax = number
        case "OperationTimeoutSec":
            guard let number = Double(value), number.isFinite, (1...600).contains(number) else {
                throw ValueError(message: "expected a number of seconds in 1...600")
            }
            fleet.operationTimeout = number
        case "TerminalName":
            guard value.count <= 128, !value.contains(where: { $0.isNewline || $0 == "\0" }) else {
                throw ValueError(message: "expected a name of at most 128 characters on one line")
            }
            fleet.terminalName = value
        default: return false
        }
        return true
    }
}
