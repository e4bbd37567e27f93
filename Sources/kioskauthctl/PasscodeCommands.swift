import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

struct Passcode: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Set or check a passcode.", subcommands: [Set.self, Verify.self])

    struct Set: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Set a person's passcode: typed twice on a terminal, or two lines on standard input.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let first = try readSecret(prompt: "New passcode for \(name): ")
            let second = try readSecret(prompt: "Again: ")
            try global.call(
                KioskAuthMethod.setPasscode, Message.SetPasscode(name: name, passcode: first, confirmation: second))
            if !global.json { print("passcode set for \(name)") }
        }
    }

    struct Verify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check a passcode (one line on standard input); exits 0 only when it matches.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let passcode = try readSecret(prompt: "Passcode for \(name): ")
            let reply = try global.call(
                KioskAuthMethod.verifyPasscode, Message.VerifyPasscode(name: name, passcode: passcode))
            guard !global.json else { return }
            print("passcode accepted for \(safe(reply.person.displayName))")
            if reply.offerFingerprint == true {
                print(
                    "no finger of \(safe(reply.person.name)) works on this terminal's reader: enrol one with kioskauthctl finger enroll \(safe(reply.person.name)) (offered once)"
                )
            }
        }
    }
}

struct Lockout: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Clear failure counts.", subcommands: [Reset.self])

    struct Reset: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Clear a person's passcode and fingerprint failure counts, including a hard lock.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            try global.call(KioskAuthMethod.resetLockout, Message.Name(name: name))
            if !global.json { print("lockout cleared for \(name)") }
        }
    }
}
