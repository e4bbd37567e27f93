import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show the daemon's status.")
    @OptionGroup var global: GlobalOptions

    func run() throws {
        let status = try global.call(KioskAuthMethod.getStatus, Message.Empty())
        guard !global.json else { return }
        print("kioskauthd \(status.version), store schema \(status.schemaVersion)")
        print("people:       \(status.people)")
        print("socket:       \(global.socketPath)\(status.socketActivated ? " (socket-activated)" : "")")
        print(
            "store key:    \(status.developmentKey ? "DEVELOPMENT KEY FILE (not for production)" : "systemd credential")"
        )
        print("uptime:       \(status.uptimeSeconds) s")
        print("audit:        \(status.auditEvents) events, head \(status.auditHead.prefix(16))…")
        if let delivery = status.auditDelivery { printAuditDelivery(delivery) }
        guard
            let connectivity = try? global.call(
                KioskAuthMethod.getConnectivity, Message.GetConnectivity(people: true))
        else {
            return
        }
        guard connectivity.identityProvider else {
            print("identity provider: none configured (local people only)")
            return
        }
        var line = "identity provider: \(connectivity.state)"
        if let since = connectivity.since { line += " since \(since)" }
        if connectivity.circuit != "closed" { line += ", refresh paused (circuit \(connectivity.circuit))" }
        print(line)
        for person in connectivity.people {
            var window = "  \(person.name): offline window \(person.window)"
            if let left = person.windowSecondsLeft { window += ", \(left / 3600) h \(left % 3600 / 60) min left" }
            if let reason = person.suspendedReason { window += " (\(reason))" }
            print(window)
        }
        print(
            "revocation queue: \(connectivity.outboxPending) pending\(connectivity.lastDeliveryAt.map { ", last delivery \($0)" } ?? "")\(connectivity.lastDeliveryError.map { ", last error: \($0)" } ?? "")"
        )
    }
}

/// The audit-delivery lines of `status`; admins see the endpoint and the failure.
func printAuditDelivery(_ delivery: AuditDeliveryStatus) {
    guard delivery.configured else {
        print("audit delivery: off (no [AuditDelivery] Endpoint= configured)")
        return
    }
    var line = "audit delivery: \(delivery.state)"
    if let host = delivery.endpointHost { line += " to \(host)" }
    line += ", \(delivery.queued) event\(delivery.queued == 1 ? "" : "s") queued"
    line += ", last delivery \(delivery.lastDeliveryAt ?? "never")"
    print(line)
    if let error = delivery.lastError {
        var details: [String] = []
        if let at = delivery.lastErrorAt { details.append("at \(at)") }
        if let attempts = delivery.consecutiveFailures {
            details.append("\(attempts) failed attempt\(attempts == 1 ? "" : "s") in a row")
        }
        print("  last error: \(error)" + (details.isEmpty ? "" : " (\(details.joined(separator: ", ")))"))
        if let next = delivery.nextAttemptAt { print("  next attempt: \(next)") }
    }
}
