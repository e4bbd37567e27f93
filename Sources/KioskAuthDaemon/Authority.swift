public import FoundationEssentials
import KioskAuthCore
public import KioskAuthFingerprint
import KioskAuthProtocol
public import KioskAuthStore
public import Logging
public import NIOPosix

/// The daemon's decisions, in parts that share one isolation domain (`AuthorityActor`): credential
/// work (`credentials`), online work (`online`) and terminal-wide reads (`terminal`), with the
/// collaborators they share in `AuthorityContext` — access control, the audit trail and the
/// ticket book. This type only builds the parts and routes to them; the dispatcher calls the
/// parts directly.
@AuthorityActor
public final class Authority {
    nonisolated let credentials: CredentialAuthority
    nonisolated let online: OnlineAuthority
    nonisolated let terminal: TerminalAuthority
    nonisolated let access: AccessControl
    nonisolated let trail: AuditTrail
    /// The clock, the identity provider and the event hub.
    nonisolated let services: OnlineServices
    /// The fleet's network side (idle unless the terminal is in a fleet).
    nonisolated let fleet: FleetAgent
    /// The fleet helper process the agent's connections go through (started on the first).
    nonisolated let fleetHelper: FleetHelper
    let context: AuthorityContext

    public nonisolated init(
        store: Store, configuration: DaemonConfiguration, groups: AccessGroups, hashingPool: HashingPool,
        isSocketActivated: Bool, usesDevelopmentKey: Bool, reader: FingerprintReader?, logger: Logger,
        services: OnlineServices = OnlineServices(), accounts: SystemAccounts = .system(),
        credentialsDirectory: String? = nil, fleetEventLoops: MultiThreadedEventLoopGroup? = nil,
        now: @escaping @Sendable () -> Date = { Date() }
    ) {
        let access = AccessControl(
            groups: groups, accounts: accounts,
            loginPolicy: LoginContextPolicy(
                passcodeServices: configuration.access.passcodeServices,
                switchUserServices: configuration.access.switchUserServices,
                ticketLifetime: configuration.access.ticketLifetime),
            adminGroup: configuration.access.adminGroup)
        let context = AuthorityContext(
            store: store, configuration: configuration, access: access, hashingPool: hashingPool,
            isSocketActivated: isSocketActivated, usesDevelopmentKey: usesDevelopmentKey, reader: reader,
            logger: logger, services: services, now: now)
        let online = OnlineAuthority(context: context)
        self.context = context
        self.access = access
        self.trail = context.trail
        self.services = services
        self.online = online
        let credentials = CredentialAuthority(context: context, online: online)
        self.credentials = credentials
        self.terminal = TerminalAuthority(context: context)
        let fleetHelper = FleetHelper(
            group: fleetEventLoops, operationTimeout: configuration.fleet.operationTimeout, logger: logger)
        self.fleetHelper = fleetHelper
        self.fleet = FleetAgent(
            store: store, configuration: configuration.fleet, credentialsDirectory: credentialsDirectory,
            logger: logger, now: now,
            readerTags: { [context] in
                guard let first = await context.reader?.readers.first else { return nil }
                return FleetReaderTags(driver: first.driver, deviceType: first.name, isMatchOnChip: first.hasStorage)
            },
            apply: { changes, fleet in await credentials.applyFleetChanges(changes, fleet) },
            endResetWindows: { await credentials.endFleetResetWindows() },
            record: { [trail = context.trail] action, result, detail in
                await trail.audit(nil, action: action, result: result, detail: detail)
            },
            connector: .helper(fleetHelper))
        // A local write that queued a push wakes the sync service, which sends it at once.
        let wakeup = fleet.wakeup
        store.fleetBatchQueued = { wakeup.signal() }
    }

    // MARK: Routing for the daemon and the server

    /// Whether `caller` is root or in the admin or authenticator group (see `AccessControl`).
    nonisolated func isPrivileged(_ caller: Caller) -> Bool { access.isPrivileged(caller) }

    /// Counts a refusal of an unprivileged caller towards its uid's summary entry.
    nonisolated func tallyRefusal(_ caller: Caller, action: AuditAction, rateLimited: Bool) {
        trail.tallyRefusal(caller, action: action, rateLimited: rateLimited)
    }

    /// Audits what `tallyRefusal` counted.
    public func flushRefusalSummaries() { trail.flushRefusalSummaries() }

    /// Appends an entry to the audit trail (see `AuditTrail.audit`).
    func audit(
        _ caller: Caller?, action: AuditAction, result: AuditResult, person: String? = nil, method: String? = nil,
        service: String? = nil, detail: String? = nil, durable: Bool = true
    ) {
        trail.audit(
            caller, action: action, result: result, person: person, method: method, service: service, detail: detail,
            durable: durable)
    }

    /// `GetStatus` on the connection's event loop (see `TerminalAuthority.immediateStatus`).
    nonisolated func immediateStatus(_ caller: Caller) -> Message.Status? { terminal.immediateStatus(caller) }

    /// Attaches the reader service once its start finished. Start-up builds the authority and
    /// records the start while libfprint still comes up on its own thread, and attaches the reader
    /// before it reconciles the sensor and serves anything.
    public func attach(reader: FingerprintReader?) { context.attach(reader: reader) }

    /// Loads the online state (see `OnlineAuthority.startOnline`).
    public func startOnline() { online.startOnline() }

    /// Records the accounts of bindings made before the store kept them.
    func recordLegacyBindings() { credentials.recordLegacyBindings() }

    /// Records the passcode checks a stop interrupted (`CredentialAuthority.recordInterruptedPasscodeChecks`).
    func recordInterruptedPasscodeChecks() { credentials.recordInterruptedPasscodeChecks() }

    /// Reconciles the storage readers with the store (see `CredentialAuthority.reconcileSensor`).
    func reconcileSensor() async { await credentials.reconcileSensor() }

    /// Publishes a reader hot-plug event.
    func publishReaderEvent(added: Bool, reader: String) { online.publishReaderEvent(added: added, reader: reader) }

    /// Forgets every ticket and fingerprint failure of a closed connection.
    func connectionClosed(_ connectionID: UInt64) {
        context.tickets.connectionClosed(connectionID)
        credentials.connectionClosed(connectionID)
    }
}
