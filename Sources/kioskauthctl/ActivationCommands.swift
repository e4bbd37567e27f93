import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

struct Activation: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Issue or revoke one-time activation codes.", subcommands: [Issue.self, Revoke.self])

    struct Issue: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Issue a new code for a person pending activation; the old one dies.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call(
                KioskAuthMethod.issueActivationCode, Message.Name(name: name))
            if !global.json { print("activation code: \(reply.code)   (one use; expires \(reply.expiresAt))") }
        }
    }

    struct Revoke: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Revoke a person's activation code.")
        @OptionGroup var global: GlobalOptions
        @Argument(help: "Login name.", completion: .people) var name: String

        func run() throws {
            let reply = try global.call(KioskAuthMethod.revokeActivationCode, Message.Name(name: name))
            if !global.json { print(reply.revoked ? "revoked" : "\(name) had no live activation code") }
            if !reply.revoked { throw ExitCode(1) }
        }
    }
}
