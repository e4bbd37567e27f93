/// What a person does at the terminal; a person may hold several roles, one of them primary.
public enum Role: String, Codable, CaseIterable, Sendable {
    /// Gives care; the everyday user of a shared terminal.
    case caregiver
    /// Organises care and the people who give it.
    case coordinator
    /// A relative of the person cared for.
    case family
}

/// Where a person's record comes from.
public enum Origin: String, Codable, Sendable {
    /// Provisioned by an admin on this terminal; has no offline window.
    case local
    /// Created at the person's first online login with the organisation's identity provider.
    case idp
}

/// Where a person is in their life cycle on this terminal.
public enum PersonState: String, Codable, Sendable {
    /// Provisioned, but the activation code has not been redeemed yet.
    case pendingActivation = "pending-activation"
    /// May authenticate.
    case active
    /// Kept on record but refused at every authentication.
    case suspended
}
