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
        person.uid != nil && person.uid == caller.uid
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
    /// identify has no PAM_USER yet): the person must be bound to each. From a switch-user service
    /// the target account must also be the invoking user's.
    func accountLoginRefusal(_ person: StoredPerson, _ context: LoginContext?) -> String? {
        guard let context else { return nil }
        for accountUID in [context.targetUID, accounts.uidOfAccount(person.name.rawValue)] {
            if let reason = AccountBinding.loginRefusal(boundUID: person.uid, accountUID: accountUID) {
                return reason
            }
        }
        return loginPolicy.switchUserTargetRefusal(context)
    }
}
