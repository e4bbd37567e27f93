import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

/// The PAM account step: may a person log in now, whatever authenticated them.
extension CredentialAuthority {
    /// Why `person` may not log in now, in one plain line; nil when they may.
    func accountRefusal(for person: StoredPerson) -> String? {
        switch person.state {
        case .active: return nil
        case .pendingActivation: return "Your account is not activated yet: enter your activation code first."
        case .suspended: return "Your account is suspended on this terminal. Ask your coordinator."
        }
    }

    func checkAccount(_ caller: Caller, _ input: Message.CheckAccount) throws(APIError) -> Message.AccountStatus {
        let name = try loginName(input.name)
        let person = try authorisedPerson(
            name, caller: caller, action: .accountCheck, privileged: groups.isAuthenticator(caller),
            refusal: "you may only ask about your own account")
        let reason = access.accountLoginRefusal(person, input.context?.loginContext) ?? accountRefusal(for: person)
        if let reason {
            audit(
                caller, action: .accountCheck, result: .refused, person: name.rawValue,
                service: input.context?.service, detail: reason + Self.logindNote(input.context))
        }
        return Message.AccountStatus(allowed: reason == nil, reason: reason, person: record(person))
    }
}
