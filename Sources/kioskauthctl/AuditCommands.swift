import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

struct Audit: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the audit trail, or verify its HMAC chain.", subcommands: [Show.self, Verify.self],
        defaultSubcommand: Show.self)

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "show", abstract: "Show audit events, oldest first.")
        @OptionGroup var global: GlobalOptions
        @Option(help: "Only events after this sequence number.") var after: Int?
        @Option(
            name: [.customShort("n"), .long], help: "Only the newest N events (like journalctl -n), still oldest first."
        )
        var limit: Int?

        func validate() throws {
            if let limit, limit < 1 { throw ValidationError("--limit takes a positive number") }
        }

        func run() throws {
            let reply = try global.call(
                KioskAuthMethod.getAudit,
                Message.GetAudit(after: after, limit: limit, newest: limit == nil ? nil : true))
            guard !global.json else { return }
            for e in reply.events {
                var line = "\(e.sequence)\t\(safe(e.time))\t\(safe(e.action))\t\(safe(e.result))"
                if let person = e.person { line += "\tperson=\(safe(person))" }
                if let method = e.method { line += "\tmethod=\(safe(method))" }
                if let uid = e.callerUid { line += "\tuid=\(uid)" }
                if let pid = e.callerPid { line += "\tpid=\(pid)" }
                if let service = e.service { line += "\tservice=\(safe(service))" }
                if let detail = e.detail { line += "\t\(safe(detail))" }
                print(line)
            }
        }
    }

    struct Verify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check the audit trail's HMAC chain; exits 1 when broken.")
        @OptionGroup var global: GlobalOptions
        @Option(
            name: .long, help: "A trusted head SEQ:MAC (e.g. the journal's audit_seq:audit_head) the chain must reach.")
        var head: String?

        func run() throws {
            let result = try global.call(
                KioskAuthMethod.verifyAudit, Message.VerifyAudit(head: head))
            if !global.json {
                if result.valid {
                    print("audit chain intact: \(result.events) events, head \(result.head)")
                } else {
                    print("AUDIT CHAIN BROKEN at event \(result.brokenAt ?? 0): \(result.reason ?? "")")
                }
            }
            if !result.valid { throw ExitCode(1) }
        }
    }
}
