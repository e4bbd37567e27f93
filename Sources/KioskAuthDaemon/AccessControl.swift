import KioskAuthCore
import KioskAuthStore

/// Who may call what: the groups that grant privileges, the system's accounts for the binding
/// rules, and where credentials may be used (`LoginContextPolicy`). Immutable; the refusals it
/// leads to are audited by the caller through `AuditTrail`.
struct AccessControl: Sendable {
    let groups: AccessGroups
    let accounts: SystemAccounts
    let loginPolicy: LoginContextPolicy
    /// The admin group's name, for refusal messages.
    let adminGroup: String

    /// Root or the admin group.
    func isAdmin(_ caller: Caller) -> Bool { groups.isAdmin(caller) }

    /// Root or the authenticator group (greeters, kiosk apps).
    func isAuthenticator(_ caller: Caller) -> Bool { groups.isAuthenticator(caller) }

    /// Whether `caller` is root or in the admin or authenticator group: such callers are never
    /// rate-limited, may use the reserved connections, and have each refusal audited on its own.
    func isPrivileged(_ caller: Caller) -> Bool { isAdmin(caller) || isAuthenticator(caller) }

    /// The caller acts on `person`: the person bound to the caller's own uid.
    func isSelf(_ caller: Caller, _ person: StoredPerson) -> Bool {
        boundUID(person) == caller.uid
    }

    /// The uid `person` is bound to, while that uid still belongs to the account it belonged to
    /// at binding (`staleBinding`); nil when unbound or when the uid now names another account.
    /// Every decision that a binding grants reads the uid through here.
    func boundUID(_ person: StoredPerson) -> Int? {
        guard let uid = person.uid, staleBinding(person) == nil else { return nil }
        return uid
    }

    /// Why `person`'s binding no longer stands (the uid was given to another account), or nil.
    func staleBinding(_ person: StoredPerson) -> String? {
        guard let uid = person.uid else { return nil }
        return AccountBinding.staleBindingRefusal(
            uid: uid, recorded: person.boundAccount, current: accounts.accountOfUID(uid))
    }

    /// The name of the account that has `uid` now, as a binding records it ("" for none).
    func accountForBinding(_ uid: Int?) -> String? {
        uid.map { accounts.accountOfUID($0) ?? "" }
    }

    /// Why `name` may not be bound to `uid` (nil: unbound), or nil when it may: root and system
    /// uids are never bound, and a name that is a Unix account belongs to that account's uid.
    func bindingRefusal(_ name: LoginName, uid: Int?) -> String? {
        if let uid, let reason = AccountBinding.uidRefusal(uid, systemUIDMax: accounts.systemUIDMax) {
            return reason
        }
        return AccountBinding.nameRefusal(name, uid: uid, accountUID: accounts.uidOfAccount(name.rawValue))
    }

    /// Why `person` may not be authenticated for the login `context` describes, or nil. Only PAM
    /// logins carry a context. The Unix accounts at stake are the one the module says PAM_USER
    /// names (`targetUID`) and the one of the person's own name, as the daemon looks it up (walk-up
    /// identify has no PAM_USER yet): the person must be bound to each, by a binding that still
    /// stands (`boundUID`). From a switch-user service the target account must also be the
    /// invoking user's.
    func accountLoginRefusal(_ person: StoredPerson, _ context: LoginContext?) -> String? {
        guard let context else { return nil }
        for accountUID in [context.targetUID, accounts.uidOfAccount(person.name.rawValue)] {
            if let reason = AccountBinding.loginRefusal(boundUID: boundUID(person), accountUID: accountUID) {
                return staleBinding(person).map { "not allowed on this account: \($0)" } ?? reason
            }
        }
        return loginPolicy.switchUserTargetRefusal(context)
    }
}
