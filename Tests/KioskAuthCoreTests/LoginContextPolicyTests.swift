import Foundation
import KioskAuthCore
import Testing

@Suite("Login-context policy")
struct LoginContextPolicyTests {
    let policy = LoginContextPolicy(
        passcodeServices: ["login", "gdm-password", "sudo"], switchUserServices: ["sudo", "su"], ticketLifetime: 120)

    @Test func remoteness_comesFromTheHost_theModule_orLogind() {
        #expect(!LoginContext(service: "login").isRemote)
        #expect(!LoginContext(service: "login", remoteHost: "").isRemote)
        #expect(LoginContext(service: "login", remoteHost: "10.0.0.9").isRemote)
        #expect(LoginContext(service: "login", remote: true).isRemote)
        #expect(!LoginContext(service: "login", remote: false).isRemote)
        #expect(LoginContext(service: "login", logind: "remote").isRemote)
        #expect(!LoginContext(service: "login", logind: "seat0").isRemote)
    }

    @Test func everyCredential_isRefusedOverARemoteSession() {
        let remote = LoginContext(service: "login", remote: true)
        #expect(policy.passcodeRefusal(remote, personUID: 1000) == "passcodes are not accepted over remote sessions")
        #expect(policy.fingerprintRefusal(remote) == "fingerprints are not accepted over remote sessions")
        #expect(policy.onlineLoginRule(remote) == .refused("online logins are not accepted over remote sessions"))
        #expect(policy.remoteRefusal(remote, for: .activation) == "activation is only possible at the terminal itself")
        #expect(policy.remoteRefusal(LoginContext(service: "login"), for: .activation) == nil)
    }

    @Test func noContext_meansNoLoginRule() {
        #expect(policy.passcodeRefusal(nil, personUID: nil) == nil)
        #expect(policy.fingerprintRefusal(nil) == nil)
        #expect(policy.onlineLoginRule(nil) == .allowed)
        #expect(policy.switchUserTargetRefusal(nil) == nil)
    }

    @Test func serviceAllowList_switchUserWinsOverTheKeyboardList() {
        #expect(policy.serviceClass("login") == .keyboard)
        #expect(policy.serviceClass("sudo") == .switchUser)
        #expect(policy.serviceClass("su") == .switchUser)
        #expect(policy.serviceClass("sshd") == .refused)
        #expect(policy.mayActivate(service: "login"))
        #expect(!policy.mayActivate(service: "sudo"))
        #expect(!policy.mayActivate(service: "sshd"))
    }

    @Test func passcodes_followTheAllowList_andSwitchUserOnlyForTheInvokingUser() {
        #expect(policy.passcodeRefusal(LoginContext(service: "login"), personUID: nil) == nil)
        #expect(policy.passcodeRefusal(LoginContext(), personUID: nil) == nil)
        #expect(
            policy.passcodeRefusal(LoginContext(service: "sshd"), personUID: 1000)
                == "the PAM service sshd is not allowed to use passcodes")
        #expect(policy.passcodeRefusal(LoginContext(service: "sudo", ruid: 1000), personUID: 1000) == nil)
        #expect(
            policy.passcodeRefusal(LoginContext(service: "sudo", ruid: 1001), personUID: 1000)
                == "sudo accepts a passcode only for the invoking user")
        #expect(policy.passcodeRefusal(LoginContext(service: "su", ruid: 1000), personUID: nil) != nil)
        #expect(policy.passcodeRefusal(LoginContext(service: "su"), personUID: 1000) != nil)
    }

    @Test func fingerprints_ignoreTheKeyboardAllowList() {
        #expect(policy.fingerprintRefusal(LoginContext(service: "sshd")) == nil)
        #expect(policy.fingerprintRefusal(LoginContext(service: "sudo", ruid: 5)) == nil)
    }

    @Test func onlineLogins_followTheAllowList() {
        #expect(policy.onlineLoginRule(LoginContext(service: "login")) == .allowed)
        #expect(policy.onlineLoginRule(LoginContext()) == .allowed)
        #expect(
            policy.onlineLoginRule(LoginContext(service: "sshd"))
                == .refused("the PAM service sshd is not allowed online logins"))
        #expect(
            policy.onlineLoginRule(LoginContext(service: "su", ruid: 1000))
                == .invokingUserOnly(ruid: 1000, service: "su"))
        #expect(policy.onlineLoginRule(LoginContext(service: "su")) == .invokingUserOnly(ruid: nil, service: "su"))
    }

    @Test func switchUser_mayOnlyTargetTheInvokingUsersAccount() {
        #expect(policy.switchUserTargetRefusal(LoginContext(service: "sudo", ruid: 1000, targetUID: 1000)) == nil)
        #expect(policy.switchUserTargetRefusal(LoginContext(service: "sudo", ruid: 1000)) == nil)
        #expect(
            policy.switchUserTargetRefusal(LoginContext(service: "sudo", ruid: 1000, targetUID: 1001))
                == "not allowed on this account: sudo to an account other than the invoking user's")
        #expect(policy.switchUserTargetRefusal(LoginContext(service: "su", targetUID: 1001)) != nil)
        #expect(policy.switchUserTargetRefusal(LoginContext(service: "login", ruid: 1000, targetUID: 1001)) == nil)
    }

    @Test func tickets_areBoundToPersonConnectionPurposeAndTime() {
        let reading = ClockReading(wall: testStart, sinceBoot: .seconds(100), bootID: "boot")
        let expires = policy.ticketExpiry(issuedAt: testStart)
        #expect(expires == testStart.plus(120))
        let ticket = LoginTicket(
            personID: 7, connectionID: 3, expires: expires, purpose: .selfService, startedAt: reading,
            issuedAt: reading)
        #expect(ticket.admitsSelfService(personID: 7, connectionID: 3, at: testStart.plus(119)))
        #expect(!ticket.admitsSelfService(personID: 7, connectionID: 3, at: testStart.plus(120)))
        #expect(!ticket.admitsSelfService(personID: 8, connectionID: 3, at: testStart))
        #expect(!ticket.admitsSelfService(personID: 7, connectionID: 4, at: testStart))
        #expect(ticket.activation(connectionID: 3, at: testStart) == nil)

        var activation = ticket
        activation.purpose = .activation(codeID: 42)
        #expect(!activation.admitsSelfService(personID: 7, connectionID: 3, at: testStart))
        #expect(activation.activation(connectionID: 3, at: testStart).map { [$0.personID, $0.codeID] } == [7, 42])
        #expect(activation.activation(connectionID: 4, at: testStart) == nil)
        #expect(activation.activation(connectionID: 3, at: testStart.plus(121)) == nil)
    }

    @Test func displayNames_comeFromTheEmailsLocalPart() {
        #expect(LoginContextPolicy.displayName(email: "sarah.jones@clinic.example") == "Sarah Jones")
        #expect(LoginContextPolicy.displayName(email: "a-b_c+d@x") == "A B C D")
        #expect(LoginContextPolicy.displayName(email: nil) == "IdP user")
        #expect(LoginContextPolicy.displayName(email: "@") == "IdP user")
        // As on main: splitting at "@" drops empty pieces, so with no local part the first piece
        // is the domain.
        #expect(LoginContextPolicy.displayName(email: "@x") == "X")
        #expect(LoginContextPolicy.displayName(email: "...@x") == "...@x")
    }
}
