import ArgumentParser
import FoundationEssentials
import KioskAuthProtocol

/// `kioskauthctl metrics`: the daemon's metrics in the Prometheus text format (`GetMetrics`),
/// for a look by hand or a scraper that runs a command; root and kioskauth-admin only.
struct MetricsCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "metrics",
        abstract: "Print the daemon's metrics in the Prometheus text exposition format (admins).",
        discussion:
            "The same text the daemon writes to [Metrics] TextfilePath= for node_exporter's textfile collector. With --json, the GetMetrics reply ({\"text\": …})."
    )
    @OptionGroup var global: GlobalOptions

    func run() throws {
        let reply = try global.call(KioskAuthMethod.getMetrics, Message.Empty())
        guard !global.json else { return }
        // Metric names, label values and numbers only: nothing a terminal could act on, and the
        // exposition format must reach a parser byte for byte.
        writeStandardOutput(reply.text)
    }
}
