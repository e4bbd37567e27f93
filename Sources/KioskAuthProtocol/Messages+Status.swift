/// A person whose passcode is locked now (`GetStatus`, admins only).
public struct LockedOutPerson: Codable, Sendable, Equatable {
    public var name: String
    /// RFC 3339; nil when hard-locked.
    public var until: String?
    public var hardLocked: Bool
    public init(name: String, until: String?, hardLocked: Bool) {
        self.name = name
        self.until = until
        self.hardLocked = hardLocked
    }
}

/// A recent unlock of this terminal (`GetStatus`, admins only).
public struct RecentUnlock: Codable, Sendable, Equatable {
    public var name: String
    /// RFC 3339.
    public var at: String
    public init(name: String, at: String) {
        self.name = name
        self.at = at
    }
}
