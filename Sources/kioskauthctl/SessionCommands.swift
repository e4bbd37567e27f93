import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

struct SessionCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "session", abstract: "List sessions, or end every session of a person.",
        subcommands: [List.self, End.self])

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List open sessions.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Only this person's.", completion: .people) var name: String?

        func run() throws {
            let reply = try global.call(KioskAuthMethod.listSessions, Message.ListSessions(name: name))
            guard !global.json else { return }
            let rows =
                [["ID", "NAME", "STATE", "SERVICE", "OPENED", "LAST ACTIVITY", "CUT-OFF"]]
                + reply.sessions.map { s in
                    [
                        String(s.id.prefix(12)), s.name, s.state, s.service ?? "-", s.openedAt, s.lastActivityAt,
                        s.overnightCutoff ?? "-",
                    ]
                }
            let widths = (0..<rows[0].count).map { column in rows.map { $0[column].count }.max() ?? 0 }
            for row in rows {
                print(
                    zip(row, widths).map { padded($0, to: $1) }.joined(
                        separator: "  "))
            }
        }
    }

    struct End: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "End every session of a person (security logout).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call(KioskAuthMethod.endSessions, Message.Name(name: name))
            if !global.json { print("ended \(reply.ended) session\(reply.ended == 1 ? "" : "s") of \(name)") }
        }
    }
}
