import ArgumentParser
import FoundationEssentials
import KioskAuthProtocol

/// `kioskauthctl status`: one screen an admin reads at a glance — the daemon, the reader(s),
/// connectivity and offline windows, people and who is locked out, the last unlocks, and the
/// audit and revocation queues. Built from `GetStatus`, `GetReaders` and `GetConnectivity`, each
/// of which filters by caller: what a non-admin may not see is absent, not refused.
struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the daemon's status: reader, connectivity, people, lockouts, last unlocks, queues.",
        discussion: """
            With --json, one object: the keys of GetStatus (version, schemaVersion, people, \
            socketActivated, developmentKey, uptimeSeconds, auditEvents, auditHead, auditDelivery, \
            and for admins lockedOut and lastUnlocks), plus socket (the path asked), readers (GetReaders; \
            null when it failed) and connectivity (GetConnectivity with people; null when it failed).
            """)
    @OptionGroup var global: GlobalOptions

    /// The `--json` object: GetStatus' keys at the top level, so existing readers keep working.
    struct Summary: Encodable {
        var status: Message.Status
        var socket: String
        var readers: [ReaderRecord]?
        var connectivity: Message.Connectivity?

        enum Keys: String, CodingKey { case socket, readers, connectivity }

        func encode(to encoder: any Encoder) throws {
            try status.encode(to: encoder)
            var container = encoder.container(keyedBy: Keys.self)
            try container.encode(socket, forKey: .socket)
            try container.encode(readers, forKey: .readers)
            try container.encode(connectivity, forKey: .connectivity)
        }
    }

    func run() throws {
        var quiet = global
        quiet.json = false
        let status = try quiet.call(KioskAuthMethod.getStatus, Message.GetStatus(summary: true))
        let readers = try? quiet.call(KioskAuthMethod.getReaders, Message.Empty()).readers
        let connectivity = try? quiet.call(
            KioskAuthMethod.getConnectivity, Message.GetConnectivity(people: true))
        if global.json {
            printJSON(Summary(status: status, socket: global.socketPath, readers: readers, connectivity: connectivity))
            return
        }
        print(
            "kioskauthd \(status.version), store schema \(status.schemaVersion), up \(Self.duration(status.uptimeSeconds))"
        )
        printReaders(readers)
        if let connectivity { printConnectivity(connectivity) }
        printPeople(status)
        print("audit:        \(status.auditEvents) events, head \(status.auditHead.prefix(16))…")
        if let delivery = status.auditDelivery { printAuditDelivery(delivery) }
        print("socket:       \(global.socketPath)\(status.socketActivated ? " (socket-activated)" : "")")
        print(
            "store key:    \(status.developmentKey ? "DEVELOPMENT KEY FILE (not for production)" : "systemd credential")"
        )
    }

    /// "2 h 5 min", "3 min", "40 s".
    static func duration(_ seconds: Int) -> String {
        if seconds >= 86400 { return "\(seconds / 86400) d \(seconds % 86400 / 3600) h" }
        if seconds >= 3600 { return "\(seconds / 3600) h \(seconds % 3600 / 60) min" }
        if seconds >= 60 { return "\(seconds / 60) min" }
        return "\(seconds) s"
    }

    private func printReaders(_ readers: [ReaderRecord]?) {
        guard let readers else {
            print("reader:       unknown (GetReaders failed)")
            return
        }
        guard !readers.isEmpty else {
            print("reader:       none (passcodes only)")
            return
        }
        for (index, reader) in readers.enumerated() {
            var line = index == 0 ? "reader:       " : "              "
            line += "\(safe(reader.driver)) (\(safe(reader.name)))"
            line += reader.canIdentify ? ", walk-up identify" : ", verify only"
            if reader.hasStorage { line += ", prints on the sensor" }
            print(line)
        }
    }

    private func printConnectivity(_ connectivity: Message.Connectivity) {
        guard connectivity.identityProvider else {
            print("identity provider: none configured (local people only)")
            return
        }
        var line = "identity provider: \(connectivity.state)"
        if let since = connectivity.since { line += " since \(since)" }
        if connectivity.circuit != "closed" { line += ", refresh paused (circuit \(connectivity.circuit))" }
        print(line)
        for person in connectivity.people {
            var window = "  \(safe(person.name)): offline window \(person.window)"
            if let left = person.windowSecondsLeft { window += ", \(left / 3600) h \(left % 3600 / 60) min left" }
            if let reason = person.suspendedReason { window += " (\(safe(reason)))" }
            print(window)
        }
        if let windows = connectivity.windows, connectivity.people.isEmpty {
            print(
                "  offline windows: \(windows.open) open, \(windows.expired) expired, \(windows.suspended) suspended, \(windows.never) never online"
            )
        }
        print(
            "revocation queue: \(connectivity.outboxPending) pending\(connectivity.lastDeliveryAt.map { ", last delivery \($0)" } ?? "")\(connectivity.lastDeliveryError.map { ", last error: \(safe($0))" } ?? "")"
        )
    }

    private func printPeople(_ status: Message.Status) {
        print("people:       \(status.people)")
        if let locked = status.lockedOut {
            let names = locked.map {
                "\(safe($0.name)) (\($0.hardLocked ? "hard-locked" : "until \($0.until ?? "-")"))"
            }
            print("locked out:   \(names.isEmpty ? "nobody" : names.joined(separator: ", "))")
        }
        if let unlocks = status.lastUnlocks {
            let list = unlocks.map { "\(safe($0.name)) \($0.at)" }
            print("last unlocks: \(list.isEmpty ? "none yet" : list.joined(separator: ", "))")
        }
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
