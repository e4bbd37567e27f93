import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

/// Completion of people's and fingers' names, asked of the daemon: the shell runs
/// `kioskauthctl ---completion SUBCOMMAND... -- ARGUMENT INDEX CURSOR WORD...` and offers the
/// lines printed. A caller the daemon does not let list them (or no daemon) gets no candidates,
/// never an error, so the shell simply offers nothing.
enum ShellCompletion {
    /// Options of any subcommand that take a value, so their values are not taken for the name.
    static let optionsWithValues: Swift.Set<String> = [
        "--socket", "--finger", "--display-name", "--role", "--uid", "--reason", "--biometric-offer",
        "--after", "--limit", "-n", "--head",
    ]

    /// The socket the command line names (`--socket PATH` or `--socket=PATH`), else the default.
    static func client(_ words: [String]) -> VarlinkClient? {
        var socket: String?
        for (index, word) in words.enumerated() {
            if word == "--socket", index + 1 < words.count { socket = words[index + 1] }
            if word.hasPrefix("--socket=") { socket = String(word.dropFirst("--socket=".count)) }
        }
        return try? VarlinkClient(socketPath: GlobalOptions.socketPath(socket))
    }

    /// The names of everyone on the terminal starting with `prefix` (admins only).
    static func people(_ words: [String], prefix: String) -> [String] {
        guard let client = client(words),
            let reply = try? client.call(KioskAuthMethod.listPeople, Message.Empty())
        else { return [] }
        return reply.people.map(\.name).filter { $0.hasPrefix(prefix) && SafeText.escaped($0) == $0 }
    }

    /// The enrolled fingers of the person the command line names (admins, or that person).
    static func enrolledFingers(_ words: [String], prefix: String) -> [String] {
        // The person is the first word after the subcommands that is neither an option nor an
        // option's value: `finger remove NAME --finger <TAB>`.
        guard
            let start = words.indices.first(where: {
                words[$0] == "finger" && words.dropFirst($0 + 1).first == "remove"
            })
        else { return [] }
        var name: String?
        var index = start + 2
        while index < words.count {
            let word = words[index]
            if optionsWithValues.contains(word) {
                index += 2
                continue
            }
            if !word.hasPrefix("-") {
                name = word
                break
            }
            index += 1
        }
        guard let name, let client = client(words),
            let reply = try? client.call(
                KioskAuthMethod.listFingers, Message.Name(name: name))
        else { return [] }
        return reply.fingers.filter { $0.hasPrefix(prefix) && fingerNames.contains($0) }
    }
}

extension CompletionKind {
    /// People's login names, from the daemon.
    static var people: CompletionKind {
        .custom { words, _, prefix in ShellCompletion.people(words, prefix: prefix) }
    }

    /// The fingers enrolled for the person named on the command line, from the daemon.
    static var enrolledFingers: CompletionKind {
        .custom { words, _, prefix in ShellCompletion.enrolledFingers(words, prefix: prefix) }
    }
}
