/// The one isolation domain of the authority's parts (`CredentialAuthority`, `OnlineAuthority`,
/// `TerminalAuthority`) and their shared collaborators (`AuditTrail`, `TicketBook`,
/// `AuthorityContext`). They are separate types but one serial domain: a part calls another
/// synchronously, so a check and the write it guards, a limiter's read and its update, or a
/// ticket's test and its use never interleave with another call — exactly as when they were one
/// actor. Awaits (the reader, the hashing pool, the identity provider) are the only points where
/// other calls run, as before.
@globalActor public actor AuthorityActor {
    public static let shared = AuthorityActor()
}
