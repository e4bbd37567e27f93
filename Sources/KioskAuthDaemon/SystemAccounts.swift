import FoundationEssentials
import KioskAuthCore

#if canImport(Glibc)
    import Glibc
#endif

/// The system's Unix accounts, as the binding rules need them: the uid of an account by name,
/// and where system uids end. Injectable so that tests can describe other systems.
public struct SystemAccounts: Sendable {
    /// The uid of the Unix account with this name, or nil when there is none.
    public var uidOfAccount: @Sendable (String) -> Int?
    /// The name of the Unix account with this uid, or nil when there is none.
    public var accountOfUID: @Sendable (Int) -> String?
    /// The highest system uid (`SYS_UID_MAX`); system uids are never bound to people.
    public var systemUIDMax: Int

    public init(
        uidOfAccount: @escaping @Sendable (String) -> Int?, accountOfUID: @escaping @Sendable (Int) -> String?,
        systemUIDMax: Int
    ) {
        self.uidOfAccount = uidOfAccount
        self.accountOfUID = accountOfUID
        self.systemUIDMax = systemUIDMax
    }

    /// The system's password database (getpwnam), and `SYS_UID_MAX` from `loginDefs`
    /// (999 when it is absent or does not set it).
    public static func system(loginDefs: String = "/etc/login.defs") -> SystemAccounts {
        // Not required to be UTF-8: a stray Latin-1 byte in a comment must not hide the setting.
        let text = (try? TextFile.bytes(loginDefs)).map { String(decoding: $0, as: UTF8.self) } ?? ""
        return SystemAccounts(
            uidOfAccount: { name in passwordEntryUID(name) },
            accountOfUID: { uid in passwordEntryName(uid) },
            systemUIDMax: AccountBinding.systemUIDMax(loginDefs: text))
    }

    static func passwordEntryUID(_ name: String) -> Int? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        let rc = getpwnam_r(name, &entry, &buffer, buffer.count, &result)
        guard rc == 0, result != nil else { return nil }
        return Int(entry.pw_uid)
    }

    static func passwordEntryName(_ uid: Int) -> String? {
        guard let id = uid_t(exactly: uid) else { return nil }
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        let rc = getpwuid_r(id, &entry, &buffer, buffer.count, &result)
        guard rc == 0, result != nil, let name = entry.pw_name else { return nil }
        return String(cString: name)
    }
}
