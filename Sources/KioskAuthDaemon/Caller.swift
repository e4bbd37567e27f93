import FoundationEssentials

#if canImport(Glibc)
    import Glibc
#endif

/// Who is on the other end of a connection, from `SO_PEERCRED` and `SO_PEERGROUPS` as the
/// kernel recorded them at connect time. Nothing a client says can change these.
public struct Caller: Sendable, Equatable {
    /// Peer uid.
    public var uid: Int
    /// Peer primary gid.
    public var gid: Int
    /// Peer pid (for the audit trail; never used to authorise).
    public var pid: Int
    /// Supplementary groups; nil when they could not be read, in which case no group grants
    /// anything (fail closed).
    public var groups: Set<Int>?
    /// Identifies the connection, for binding tickets and scans to it.
    public var connectionID: UInt64

    public init(uid: Int, gid: Int, pid: Int, groups: Set<Int>?, connectionID: UInt64) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.groups = groups
        self.connectionID = connectionID
    }

    /// Whether the caller is root.
    public var isRoot: Bool { uid == 0 }

    func isMember(of gid: Int?) -> Bool {
        guard let gid, gid != 0 else { return false }
        return self.gid == gid || (groups?.contains(gid) ?? false)
    }
}

/// The groups that grant privileges, resolved once at start.
public struct AccessGroups: Sendable {
    /// gid of the admin group, when it exists.
    public var admin: Int?
    /// gid of the authenticator group, when it exists.
    public var authenticator: Int?

    public init(admin: Int?, authenticator: Int?) {
        self.admin = admin
        self.authenticator = authenticator
    }

    /// Looks the named groups up in the system's group database.
    public static func resolve(admin: String, authenticator: String) -> AccessGroups {
        AccessGroups(admin: gid(of: admin), authenticator: gid(of: authenticator))
    }

    static func gid(of name: String) -> Int? {
        var group = group()
        var result: UnsafeMutablePointer<group>?
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        let rc = getgrnam_r(name, &group, &buffer, buffer.count, &result)
        guard rc == 0, result != nil else { return nil }
        return Int(group.gr_gid)
    }

    /// Root or a member of the admin group.
    public func isAdmin(_ caller: Caller) -> Bool { caller.isRoot || caller.isMember(of: admin) }

    /// Root or a member of the authenticator group (greeters, kiosk apps).
    public func isAuthenticator(_ caller: Caller) -> Bool { caller.isRoot || caller.isMember(of: authenticator) }
}
