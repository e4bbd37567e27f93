import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

/// Binding people to Unix accounts, and the rule it serves: a login into a Unix account succeeds
/// only for the person bound to exactly that account's uid.
extension CallerContext {
    /// The facts the login-context rules (`LoginContextPolicy`) read.
    var loginContext: LoginContext {
        LoginContext(
            service: service, ruid: ruid, targetUID: targetUid, remoteHost: remoteHost, remote: remote, logind: logind)
    }
}

extension CredentialAuthority {
    nonisolated static func bindingRefused(_ name: LoginName, _ reason: String) -> APIError {
        APIError.own("BindingRefused", ["name": .string(name.rawValue), "reason": .string(reason)])
    }

    /// Why `uid` cannot be bound on a fleet member, or nil: the fleet directory holds uids as
    /// PostgreSQL `integer`s, so one above 2147483647 could not be shared (it used to trap the
    /// daemon when the person's change was pushed, at every sync, since the change stays queued).
    func fleetUIDRefusal(_ uid: Int?) -> String? {
        guard let uid, uid > Int(Int32.max), store.isInFleet else { return nil }
        return "uid \(uid) is above 2147483647, the largest the fleet directory holds"
    }

    /// BindAccount: binds a person (local or from the identity provider) to a Unix uid, or unbinds
    /// them. Admins only; every outcome is audited.
    func bindAccount(_ caller: Caller, _ input: Message.BindAccount) throws(APIError) -> PersonRecord {
        try requireAdmin(caller, action: .personBind, person: input.name)
        let name = try loginName(input.name)
        let person = try existingPerson(name, caller: caller, action: .personBind)
        if let reason = access.bindingRefusal(name, uid: input.uid) ?? fleetUIDRefusal(input.uid) {
            audit(caller, action: .personBind, result: .refused, person: name.rawValue, detail: reason)
            throw Self.bindingRefused(name, reason)
        }
        do {
            try audited { tx throws(StoreError) in
                let account = access.accountForBinding(input.uid)
                try store.setUID(input.uid, account: account, for: person, now: now())
                try tx.audit(
                    caller, action: .personBind, result: .success, person: name.rawValue,
                    detail: "uid \(person.uid.map(String.init) ?? "none") -> \(input.uid.map(String.init) ?? "none")")
            }
        } catch {
            if error.code == .personExists {
                audit(caller, action: .personBind, result: .failure, person: name.rawValue, detail: error.message)
                throw APIError.personExists("uid \(input.uid ?? -1)")
            }
            throw try failStore(caller, .personBind, error)
        }
        return record(try existingPerson(name, caller: caller, action: .personBind))
    }

    /// Records, for bindings made before the store kept it (schema < 5), the account that has
    /// each bound uid now: from here on a uid given to another account no longer carries the
    /// binding. Once per binding, at the first start on schema 5; each record is audited.
    func recordLegacyBindings() {
        let people: [StoredPerson]
        do { people = try store.peopleWithUnrecordedAccounts() } catch {
            logger.error("cannot read bindings to record their accounts", metadata: ["error": "\(error)"])
            return
        }
        for person in people {
            guard let account = access.accountForBinding(person.uid) else { continue }
            do {
                try audited { tx throws(StoreError) in
                    try store.recordBoundAccount(account, for: person, now: now())
                    try tx.audit(
                        nil, action: .personBind, result: .success, person: person.name.rawValue,
                        detail:
                            "uid \(person.uid.map(String.init) ?? "none"): recorded "
                            + (account.isEmpty ? "that no account has it" : "account \(account)")
                            + " (bound before accounts were recorded)")
                }
            } catch {
                logger.error(
                    "cannot record a binding's account",
                    metadata: ["person": "\(person.name)", "error": "\(error.message)"])
            }
        }
    }
}
