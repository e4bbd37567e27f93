import ArgumentParser
import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol

#if canImport(Glibc)
    import Glibc
#endif

struct Login: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Sign in online with the identity provider (the password is one line on standard input).")
    @OptionGroup var global: GlobalOptions
    @Argument(help: "Email address.") var email: String

    func run() throws {
        let password = try readSecret(prompt: "Password for \(email): ")
        let reply = try global.call(
            KioskAuthMethod.loginWithPassword, Message.LoginWithPassword(email: email, password: password))
        guard !global.json, let person = reply.person else { return }
        print(
            "signed in as \(person.name) (\(person.roles.joined(separator: ", ")))\(reply.created == true ? ", new on this terminal" : "")"
        )
        if reply.offerFingerprint == true {
            print("fingerprint enrolment can be offered (kioskauthctl finger enroll \(person.name))")
        }
    }
}
