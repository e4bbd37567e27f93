import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

/// Binding people to Unix accounts, and the rule it serves: a login into a Unix account succeeds
/// only for the person bound to exactly that account's uid.
extension CallerContext {
    /// Whether the login is remote: PAM_RHOST names a remote host, or the module found (through
    /// logind, where it runs) that the caller's session is remote.
    var isRemote: Bool {
        remote == true || (remoteHost.map { !$0.isEmpty } ?? false) || logind == "remote"
    }
}

extension Authority {
    /// Why `name` may not be bound to `uid` (nil: unbound), or nil when it may: root and system
    /// uids are never bound, and a name that is a Unix account belongs to that account's uid.
    func bindingRefusal(_ name: LoginName, uid: Int?) -> String? {
        if let uid, let reason = AccountBinding.uidRefusal(uid, systemUIDMax: accounts.systemUIDMax) {
            return reason
        }
        return AccountBinding.nameRefusal(name, uid: uid, accountUID: accounts.uidOfAccount(name.rawValue))
    }

    static func bindingRefused(_ name: LoginName, _ reason: String) -> APIError {
        APIError.own("BindingRefused", ["name": .string(name.rawValue), "reason": .string(reason)])
    }

    /// Why `person` may not be authenticated for the login `context` describes, or nil. Only PAM
    /// logins carry a context. The Unix accounts at stake are the one the module says PAM_USER
    /// names (`targetUid`) and the one of the person's own name, as the daemon looks it up (walk-up
    /// identify has no PAM_USER yet): the person must be bound to each. From a switch-user service
    /// the target account must also be the invoking user's.
    func accountLoginRefusal(_ person: StoredPerson, _ context: CallerContext?) -> String? {
        guard let context else { return nil }
        for accountUID in [context.targetUid, accounts.uidOfAccount(person.name.rawValue)] {
            if let reason = AccountBinding.loginRefusal(boundUID: person.uid, accountUID: accountUID) {
                return reason
            }
        }
        if let service = context.service, configuration.access.switchUserServices.contains(service),
            let target = context.targetUid, context.ruid != target
        {
            return "not allowed on this account: \(service) to an account other than the invoking user's"
        }
        return nil
    }

    /// Refuses, audits and throws `AccountNotAllowed` when `person` may not log in to the Unix
    /// account at stake (see ``accountLoginRefusal(_:_:)``).
    func requireAccountAllowed(
        _ caller: Caller, _ person: StoredPerson, context: CallerContext?, action: String, method: String?
    ) throws(APIError) {
        guard let reason = accountLoginRefusal(person, context) else { return }
        audit(
            caller, action: action, result: "refused", person: person.name.rawValue, method: method,
            service: context?.service, detail: reason + Self.logindNote(context))
        throw APIError.own("AccountNotAllowed", ["name": .string(person.name.rawValue), "reason": .string(reason)])
    }

    /// "; logind: …" for the audit trail, when the module said what logind knows.
    static func logindNote(_ context: CallerContext?) -> String {
        guard let logind = context?.logind, !logind.isEmpty else { return "" }
        return "; logind: \(logind.prefix(80))"
    }

    /// BindAccount: binds a person (local or from the identity provider) to a Unix uid, or unbinds
    /// them. Admins only; every outcome is audited.
    func bindAccount(_ caller: Caller, _ input: Message.BindAccount) throws(APIError) -> PersonRecord {
        try requireAdmin(caller, action: "person.bind", person: input.name)
        let name = try loginName(input.name)
        let person = try existingPerson(name, caller: caller, action: "person.bind")
        if let reason = bindingRefusal(name, uid: input.uid) {
            audit(caller, action: "person.bind", result: "refused", person: name.rawValue, detail: reason)
            throw Self.bindingRefused(name, reason)
        }
        do {
            try audited { tx throws(StoreError) in
                try store.setUID(input.uid, for: person, now: now())
                try tx.audit(
                    caller, action: "person.bind", result: "success", person: name.rawValue,
                    detail: "uid \(person.uid.map(String.init) ?? "none") -> \(input.uid.map(String.init) ?? "none")")
            }
        } catch {
            if error.code == .personExists {
                audit(caller, action: "person.bind", result: "failure", person: name.rawValue, detail: error.message)
                throw APIError.personExists("uid \(input.uid ?? -1)")
            }
            throw try failStore(caller, "person.bind", error)
        }
        return record(try existingPerson(name, caller: caller, action: "person.bind"))
    }
}
