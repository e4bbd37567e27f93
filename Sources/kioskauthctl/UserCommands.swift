import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

struct User: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Add, list, show, change, export and remove people.",
        subcommands: [Add.self, List.self, Show.self, Set.self, Suspend.self, Resume.self, Export.self, Remove.self])

    struct Suspend: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Suspend a person: every authentication is refused and their sessions end; secrets are kept.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "Why (recorded in the audit trail).") var reason: String?

        func run() throws {
            try global.call(
                KioskAuthMethod.suspendPerson, Message.SuspendPerson(name: name, reason: reason))
            if !global.json { print("\(name) is suspended") }
        }
    }

    struct Resume: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make a person an admin suspended active again (identity-provider people sign in online).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            try global.call(KioskAuthMethod.resumePerson, Message.Name(name: name))
            if !global.json { print("\(name) is active again") }
        }
    }

    struct Set: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Change a person's settings.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String
        @Option(help: "Offer fingerprint enrolment after online logins: on, or off (as if declined).")
        var biometricOffer: String?
        @Option(help: "Bind the person (local or from the identity provider) to this Unix uid.") var uid: Int?
        @Flag(help: "Unbind the person from their Unix uid.") var unbind = false

        func validate() throws {
            guard biometricOffer != nil || uid != nil || unbind else {
                throw ValidationError("nothing to change: give --biometric-offer on|off, --uid UID or --unbind")
            }
            if let biometricOffer, !["on", "off"].contains(biometricOffer) {
                throw ValidationError("--biometric-offer takes on or off")
            }
            if uid != nil && unbind { throw ValidationError("--uid and --unbind exclude each other") }
        }

        func run() throws {
            if uid != nil || unbind {
                let reply = try global.call(
                    KioskAuthMethod.bindAccount, Message.BindAccount(name: name, uid: uid))
                if !global.json {
                    print(reply.person.uid.map { "\(name) is bound to uid \($0)" } ?? "\(name) is bound to no uid")
                }
            }
            if let biometricOffer {
                let enabled = biometricOffer == "on"
                try global.call(
                    KioskAuthMethod.setBiometricOffer, Message.SetBiometricOffer(name: name, enabled: enabled))
                if !global.json { print("fingerprint enrolment offer for \(name): \(enabled ? "on" : "off")") }
            }
        }
    }

    struct Add: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add a local person.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.") var name: String
        @Option(help: "Name shown to the person.") var displayName: String?
        @Option(help: "Role: caregiver, coordinator or family; repeat for several, the first is primary.")
        var role: [String] = []
        @Option(help: "Unix uid to bind the person to.") var uid: Int?

        func validate() throws {
            for role in role where !["caregiver", "coordinator", "family"].contains(role) {
                throw ValidationError("unknown role '\(role)': use caregiver, coordinator or family")
            }
        }

        func run() throws {
            let reply = try global.call(
                KioskAuthMethod.addPerson,
                Message.AddPerson(name: name, displayName: displayName, roles: role.isEmpty ? nil : role, uid: uid))
            guard !global.json else { return }
            print("added \(reply.person.name) (\(reply.person.roles.joined(separator: ", "))), pending activation")
            if let code = reply.activationCode {
                print("activation code: \(code)   (one use; expires \(reply.activationExpiresAt ?? "in 72 h"))")
                print("At the terminal \(reply.person.displayName) enters it, sets a passcode and enrols a finger.")
                print("Or activate now: kioskauthctl passcode set \(reply.person.name)")
            }
        }
    }

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List everyone on this terminal.")
        @OptionGroup var global: GlobalOptions

        func run() throws {
            let reply = try global.call(KioskAuthMethod.listPeople, Message.Empty())
            guard !global.json else { return }
            let rows =
                [["NAME", "DISPLAY NAME", "ROLES", "ORIGIN", "STATE", "UID", "PASSCODE", "FINGERS"]]
                + reply.people.map { p in
                    [
                        safe(p.name), safe(p.displayName), safe(p.roles.joined(separator: ",")), safe(p.origin),
                        safe(p.state),
                        p.uid.map(String.init) ?? "-",
                        p.passcodeHardLocked ? "locked" : (p.hasPasscode ? "set" : "-"),
                        p.fingers.isEmpty
                            ? "-"
                            : safe(
                                p.fingers.map {
                                    (p.fingersMissingFromSensor ?? []).contains($0) ? $0 + "(missing)" : $0
                                }
                                .joined(separator: ",")),
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

    struct Show: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show one person.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let p = try global.call(KioskAuthMethod.getPerson, Message.Name(name: name)).person
            guard !global.json else { return }
            print("name:          \(p.name)")
            print("display name:  \(p.displayName)")
            print("roles:         \(p.roles.joined(separator: ", ")) (primary: \(p.primaryRole))")
            print("origin:        \(p.origin)")
            print("state:         \(p.state)")
            print("uid:           \(p.uid.map(String.init) ?? "-")")
            if let stale = p.staleBinding { print("binding:       STALE, \(safe(stale))") }
            print(
                "passcode:      \(p.hasPasscode ? "set" : "not set")\(p.passcodeHardLocked ? ", HARD-LOCKED" : "")\(p.passcodeLockedUntil.map { ", delayed until \($0)" } ?? "")"
            )
            print("failures:      passcode \(p.passcodeFailures), fingerprint \(p.fingerprintFailures)")
            print("fingers:       \(p.fingers.isEmpty ? "-" : p.fingers.joined(separator: ", "))")
            if let missing = p.fingersMissingFromSensor, !missing.isEmpty {
                print("missing:       \(missing.joined(separator: ", ")) (not on the sensor: cannot match)")
                print(missingAdvice(name: p.name, missing))
            }
            print("created:       \(p.createdAt)")
            print("last unlock:   \(iso(p.lastUnlockAt))")
            if p.origin == "idp" {
                print("email:         \(iso(p.email))")
                print("last online:   \(iso(p.lastOnlineContactAt))")
                if let reason = p.suspendedReason { print("suspended:     until an online login (\(reason))") }
            }
            if let offer = p.biometricOffer { print("finger offer:  \(offer ? "on" : "declined")") }
        }
    }

    struct Export: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print everything stored about a person except secrets, as JSON (e.g. before user remove).")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.connect().call(
                KioskAuthMethod.exportPerson.qualifiedName,
                parameters: try VarlinkCoding.encode(Message.Name(name: name)))
            printJSON(reply)
        }
    }

    struct Remove: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a person and erase their passcode, fingerprints, tokens and sessions.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            try global.call(KioskAuthMethod.removePerson, Message.Name(name: name))
            if !global.json { print("removed \(name); their secrets are erased") }
        }
    }
}
