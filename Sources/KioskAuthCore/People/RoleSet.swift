/// The roles of one person: never empty, no duplicates, and one primary role that is among them.
///
/// The invariants hold for every value, including decoded ones: decoding rebuilds the set from
/// its primary role and the listed roles, so a stored row cannot produce a primary role the
/// person does not hold.
public struct RoleSet: Codable, Sendable, Equatable {
    /// The role shown first ("Your role: caregiver").
    public let primary: Role
    /// Every role the person holds: `primary` first, then the others in the order given, each once.
    public let all: [Role]

    /// Makes a set from a primary role and any others, dropping duplicates and repeats of
    /// `primary`.
    public init(primary: Role, others: [Role] = []) {
        var roles = [primary]
        for role in others where !roles.contains(role) {
            roles.append(role)
        }
        self.primary = primary
        self.all = roles
    }

    /// Makes a set whose primary role is the first of `roles`; duplicates are dropped.
    ///
    /// - Throws: ``InvalidInputError`` for field `roles` when `roles` is empty.
    public init(_ roles: [Role]) throws(InvalidInputError) {
        guard let first = roles.first else {
            throw InvalidInputError(field: "roles", message: "A person needs at least one role.")
        }
        self.init(primary: first, others: Array(roles.dropFirst()))
    }

    /// The roles other than the primary one, in order.
    public var others: ArraySlice<Role> { all.dropFirst() }

    /// Whether the person holds `role`.
    public func contains(_ role: Role) -> Bool { all.contains(role) }

    private enum CodingKeys: String, CodingKey {
        case primary, all
    }

    /// Decodes `{"primary": …, "all": […]}` and restores the invariants: primary first, no
    /// duplicates.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let primary = try container.decode(Role.self, forKey: .primary)
        let all = try container.decodeIfPresent([Role].self, forKey: .all) ?? []
        self.init(primary: primary, others: all)
    }

    /// Encodes `{"primary": …, "all": […]}`.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(primary, forKey: .primary)
        try container.encode(all, forKey: .all)
    }
}
