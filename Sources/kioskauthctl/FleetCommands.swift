import ArgumentParser
import CKioskAuthSystem
import FoundationEssentials
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

/// `kioskauthctl fleet …`: this terminal's membership of a fleet directory (docs/fleet.md).
/// Everything but `keygen` calls the daemon, for root and kioskauth-admin only.
struct FleetCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fleet", abstract: "Join this terminal to a fleet directory, and see how it syncs (admins).",
        subcommands: [
            Keygen.self, Migrate.self, Create.self, Token.self, Join.self, Status.self, Sync.self, Terminals.self,
            Remove.self, Leave.self,
        ])

    struct Keygen: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a fresh terminal key (kioskauth.fleet-key) and print its public half.",
            discussion:
                "Runs locally, without the daemon. FILE gets the 32 raw bytes of an X25519 private key, mode 0600; it must not exist. Encrypt it into the credential store with systemd-creds encrypt --name=kioskauth.fleet-key FILE /etc/credstore.encrypted/kioskauth.fleet-key, then remove FILE."
        )
        @Option(help: "Where to write the private key (must not exist).") var output: String
        /// Accepted like every subcommand's (`--socket` is unused: no daemon call).
        @OptionGroup var global: GlobalOptions

        func run() throws {
            var bytes = [UInt8](repeating: 0, count: 32)
            var publicKey = [UInt8](repeating: 0, count: 32)
            guard kioskauth_x25519_keygen(&bytes, &publicKey) == 0 else {
                throw ValidationError("no randomness for the key (getrandom failed)")
            }
            defer { for index in bytes.indices { bytes[index] = 0 } }
            let fd = open(output, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
            guard fd >= 0 else {
                throw ValidationError("cannot create \(output): \(String(cString: strerror(errno)))")
            }
            var rest = bytes[...]
            while !rest.isEmpty {
                let written = rest.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
                if written < 0 && errno == EINTR { continue }
                guard written > 0 else {
                    close(fd)
                    unlink(output)
                    throw ValidationError("cannot write \(output)")
                }
                rest = rest.dropFirst(written)
            }
            guard fsync(fd) == 0, close(fd) == 0 else { throw ValidationError("cannot write \(output)") }
            print(
                publicKey.map { byte in
                    let digits = String(byte, radix: 16)
                    return digits.count == 1 ? "0" + digits : digits
                }.joined())
        }
    }

    struct Migrate: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Migrate the directory's schema as its owner role (before the first create).",
            discussion: """
                The daemon connects once with the owner's URL, migrates and forgets the URL and the \
                password; terminals then use roles of their own. With --password-stdin the owner's \
                password is read from standard input, never from the command line.
                """)
        @Argument(
            help:
                "The directory as its owner: postgres://OWNER@HOST[:PORT]/DATABASE or postgres://OWNER@/DATABASE?host=DIR"
        )
        var directory: String
        @Flag(help: "Read the owner role's password from standard input.") var passwordStdin = false
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let password = passwordStdin ? String(try readSecret(prompt: "Owner password: ")) : nil
            let reply = try global.call(
                KioskAuthMethod.fleetMigrate, Message.FleetMigrate(directory: directory, password: password))
            if !global.json { print("directory schema at version \(reply.version)") }
        }
    }

    struct Create: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Create a fleet in an empty, migrated directory, with this terminal as its first member.")
        @Argument(
            help:
                "As this terminal's own role: postgres://ROLE@HOST[:PORT]/DATABASE[?sslmode=…] or postgres://ROLE@/DATABASE?host=DIR"
        )
        var directory: String
        @Option(help: "This terminal's name in the directory (default: [Fleet] TerminalName, or the host name).")
        var name: String?
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let reply = try global.call(
                KioskAuthMethod.fleetCreate, Message.FleetCreate(directory: directory, name: name))
            if !global.json { print("created; terminal \(safe(reply.terminalId))") }
        }
    }

    struct Token: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Join tokens for other terminals.", subcommands: [Issue.self])

        struct Issue: ParsableCommand {
            static let configuration = CommandConfiguration(
                abstract: "Issue a one-time join token (members only); this terminal admits whoever uses it.")
            @Option(help: "How long it is valid: 90s, 30m, 1h, 2d (default 1h).") var valid: String = "1h"
            @OptionGroup var global: GlobalOptions

            func run() throws {
                guard let seconds = parseDuration(valid) else {
                    throw ValidationError("--valid: expected a duration like 90s, 30m, 1h or 2d")
                }
                let reply = try global.call(
                    KioskAuthMethod.fleetIssueJoinToken, Message.FleetIssueJoinToken(validSeconds: seconds))
                if !global.json { print(safe(reply.token)) }
            }
        }
    }

    struct Join: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Join a fleet; the token is read from standard input, never from the command line.")
        @Argument(help: "The directory, as for fleet create.") var directory: String
        @Option(help: "This terminal's name in the directory.") var name: String?
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let token = String(try readSecret(prompt: "Join token: ").filter { !$0.isWhitespace })
            let reply = try global.call(
                KioskAuthMethod.fleetJoin, Message.FleetJoin(directory: directory, token: token, name: name))
            if !global.json {
                print("joined as \(safe(reply.terminalId)): \(safe(reply.state)) until the issuing member admits it")
            }
        }
    }

    struct Status: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "How this terminal stands in its fleet.")
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let status = try global.call(KioskAuthMethod.fleetStatus, Message.Empty())
            guard !global.json else { return }
            guard status.configured else {
                print("not in a fleet")
                return
            }
            print("state:      \(safe(status.state ?? "-"))")
            print("terminal:   \(safe(status.terminalId ?? "-"))")
            print("directory:  \(safe(status.directory ?? "-")) (\(status.reachable ? "reachable" : "not reachable"))")
            print("cursor:     \(status.cursor) of \(status.head) (lag \(status.lag))")
            print("queued:     \(status.queuedPushes) push(es)")
            print("generation: \(status.generation)")
            print("last sync:  \(safe(status.lastSyncAt ?? "never"))")
            if let error = status.lastError { print("last error: \(safe(error))") }
            if status.rejectedChanges > 0 {
                print("refused:    \(status.rejectedChanges) directory row(s) not applied")
                if let why = status.lastRejection { print("last refusal: \(safe(why))") }
            }
        }
    }

    struct Sync: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Pull and push now; returns when done.")
        @OptionGroup var global: GlobalOptions

        func run() throws {
            try global.call(KioskAuthMethod.fleetSync, Message.Empty())
        }
    }

    struct Terminals: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the fleet's terminals, removed ones included (this one marked *).")
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let reply = try global.call(KioskAuthMethod.fleetTerminals, Message.Empty())
            guard !global.json else { return }
            for terminal in reply.terminals {
                let reader = terminal.readerDriver.map { driver in
                    driver + (terminal.readerDeviceType.map { "/" + $0 } ?? "")
                        + (terminal.matchOnChip ? " (on-chip)" : "")
                }
                let seen = terminal.lastSeenAt.map { "last seen \($0)" } ?? "never synced"
                print(
                    [
                        terminal.isThisTerminal ? "*" : " ", safe(terminal.terminalId), safe(terminal.name),
                        safe(terminal.state), safe(reader ?? "no reader"),
                        terminal.removedAt.map { "removed \(safe($0))" } ?? safe(seen),
                    ].joined(separator: "  "))
            }
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove another terminal (retired or stolen) and rotate the fleet's data key.",
            discussion: """
                The directory refuses the terminal from then on and deletes its wrapped keys; this \
                terminal then publishes a new data-key generation to the remaining members, so what \
                is written afterwards is sealed under a key the removed terminal never had. Drop its \
                database role too (DROP ROLE), so it cannot read the directory either. To take this \
                terminal out of the fleet, use fleet leave.
                """)
        @Argument(help: "The terminal's id, or its name (fleet terminals lists both).") var terminal: String
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let reply = try global.call(
                KioskAuthMethod.fleetRemoveTerminal, Message.FleetRemoveTerminal(terminal: terminal))
            guard !global.json else { return }
            print("removed \(safe(reply.name)) (\(safe(reply.terminalId)))")
            if reply.rotationOwed {
                print(
                    "the new data key is not published yet: the next member to sync publishes it (or run fleet remove again)"
                )
            } else {
                print("new secrets are sealed under generation \(reply.generation)")
            }
        }
    }

    struct Leave: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Push what is queued, leave the fleet and forget it (local people stay).")
        @OptionGroup var global: GlobalOptions

        func run() throws {
            try global.call(KioskAuthMethod.fleetLeave, Message.Empty())
            if !global.json { print("left the fleet") }
        }
    }
}

/// `90s`, `30m`, `1h`, `2d` or plain seconds.
func parseDuration(_ text: String) -> Int? {
    let units: [Character: Int] = ["s": 1, "m": 60, "h": 3600, "d": 86400]
    if let last = text.last, let unit = units[last], let number = Int(text.dropLast()), number > 0 {
        return number * unit
    }
    if let number = Int(text), number > 0 { return number }
    return nil
}
