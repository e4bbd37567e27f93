import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

/// Online work: the identity provider (password and device logins), background refresh, the
/// reachability probe, the offline window, desktop sessions and the online-login policy. It
/// alone owns `OnlineState`. Every method authorises its caller first, audits what it did, and
/// throws only `APIError`s, each of which is one named varlink error.
@AuthorityActor
final class OnlineAuthority: AuthorityPart {
    let context: AuthorityContext
    /// Offline window, refresh schedule, sessions and connectivity.
    let online: OnlineState

    nonisolated init(context: AuthorityContext) {
        self.context = context
        self.online = OnlineState(configuration: context.configuration)
    }
}
