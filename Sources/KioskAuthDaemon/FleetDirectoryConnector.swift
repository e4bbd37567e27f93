import KioskAuthFleet
import KioskAuthFleetDirectory
import Logging

/// How the fleet agent opens a connection to the directory. The agent and the sync service see
/// only `FleetDirectoryConnection`; which client stands behind it is chosen here, so the
/// database client can move out of the daemon's process without touching either (docs/fleet.md).
struct FleetDirectoryConnector: Sendable {
    let connect: @Sendable (FleetEndpoint, String?, Logger) async throws(FleetError) -> any FleetDirectoryConnection

    /// postgres-nio, in this process.
    static let inProcess = FleetDirectoryConnector { endpoint, password, logger throws(FleetError) in
        try await FleetDirectory.connect(to: endpoint, password: password, logger: logger)
    }
}
