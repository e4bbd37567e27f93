public import FoundationEssentials
import KioskAuthFingerprint
import KioskAuthIdentity
import KioskAuthProtocol
import KioskAuthStore
public import Logging
import NIOPosix
import ServiceLifecycle

#if canImport(Glibc)
    import Glibc
#endif

/// Where the daemon keeps things, resolved from options, then systemd's variables, then the
/// built-in defaults.
public struct DaemonPaths: Sendable {
    public var configuration: String
    public var stateDirectory: String
    public var runtimeDirectory: String
    public var socket: String
    public var credentialsDirectory: String?

    public init(
        configuration: String?, stateDirectory: String?, runtimeDirectory: String?, socket: String?,
        environment given: [String: String]? = nil
    ) {
        let environment = EnvironmentLookup(given)
        // systemd may pass several directories separated by ':'; the first is ours.
        func first(_ value: String?) -> String? { value?.split(separator: ":").first.map(String.init) }
        self.configuration = configuration ?? "/etc/kioskauth/kioskauthd.conf"
        self.stateDirectory = stateDirectory ?? first(environment["STATE_DIRECTORY"]) ?? "/var/lib/kioskauth"
        self.runtimeDirectory = runtimeDirectory ?? first(environment["RUNTIME_DIRECTORY"]) ?? "/run/kioskauth"
        self.socket = socket ?? (self.runtimeDirectory + "/io.kioskauth")
        self.credentialsDirectory = environment["CREDENTIALS_DIRECTORY"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// The database file.
    public var database: String { stateDirectory + "/" + Store.databaseFileName }
}

/// A start-up failure: one line for the journal, and the exit status.
public struct StartupError: Error, CustomStringConvertible {
    public var message: String
    /// 78 (EX_CONFIG) for problems only an admin can fix — configuration, store key, a store
    /// from a newer version — so the unit's `RestartPreventExitStatus=78` stops restart loops; 1
    /// otherwise.
    public var exitCode: Int32 = 1
    public var description: String { message }

    /// Exit status for configuration and key problems.
    public static let configurationExitCode: Int32 = 78
}

/// A store that cannot be opened or fails its check before serving: one line naming the
/// database and what is wrong. Everything only an admin can fix (key, schema, a damaged,
/// edited or rolled-back store, a read-only state directory) exits 78 so systemd does not
/// restart into the same refusal.
func startupError(_ error: StoreError, database: String) -> StartupError {
    let fixable: Set<StoreError.Code> = [.wrongKey, .futureSchema, .keyUnavailable, .integrity, .rollback, .readOnly]
    let message = error.message.contains(database) ? error.message : "\(database): \(error.message)"
    return StartupError(
        message: message, exitCode: fixable.contains(error.code) ? StartupError.configurationExitCode : 1)
}

/// Composes the daemon's services and runs them until SIGTERM/SIGINT.
public enum Daemon {
    /// Runs the daemon: loads configuration and key, opens the store, serves the socket, and
    /// shuts down gracefully. Throws `StartupError` for anything that stops it from starting.
    /// `hotBSS` is what `kioskauth_populate_hot_bss` returned at the top of `main` (the ready
    /// line reports it).
    public static func run(
        paths: DaemonPaths, developmentKeyFile: Bool, acceptStoreRollback: Bool = false, hotBSS: Int = 0,
        logger baseLogger: Logger
    ) async throws {
        MemoryBounds.boundAllocator()
        var timeline = StartupTimeline()
        let loaded = try loadConfiguration(paths: paths, logger: baseLogger)
        timeline.mark("configuration")
        let logger = loaded.logger
        let clock = DaemonClock.system()
        if clock.isTestClock {
            logger.warning(
                "TEST CLOCK ACTIVE: readings are shifted by KIOSKAUTH_TEST_CLOCK_FILE (debug build, tests only)")
        }
        let notifier = SystemdNotifier()
        // libfprint comes up on its own thread (GLib, USB and udev enumeration), and the event
        // loop's thread binds the socket, while this one opens and checks the store; READY=1
        // still waits for all three, and no call is served before it.
        // LISTEN_* is read and cleared before any other thread starts (libfprint reads the
        // environment on its own).
        let listenFD = SystemdNotifier.listenedSocket()
        SystemdNotifier.unsetListenEnvironment()
        // A socket path this daemon binds itself is locked before anything else starts: a
        // second daemon on the same path is refused here, before it claims the reader or opens
        // the store; the lock is let go of only after the store is closed (the defer below runs
        // after the store's).
        let target: ListenTarget
        let pathLock: SocketPathLock?
        if let listenFD {
            target = .inherited(fd: listenFD)
            pathLock = nil
        } else {
            do {
                try createDirectory(paths.runtimeDirectory, mode: 0o755)
                let lock = try SocketPathLock.acquire(for: paths.socket)
                target = .path(paths.socket, lock: lock)
                pathLock = lock
            } catch let served as VarlinkListener.AlreadyServed {
                throw StartupError(message: "\(served)")
            } catch {
                throw StartupError(message: "cannot listen on \(paths.socket): \(error)")
            }
        }
        defer { pathLock?.release() }
        // Looked up while the store opens: the access groups (a group missing from /etc/group
        // sends NSS on to systemd's module, or a directory's: about a millisecond here) and the
        // processors the cgroup allows (the hashing pool's default size and its priority); and
        // the metrics registry built (a fifth of a millisecond), while the store waits for its
        // first syncs.
        let access = loaded.configuration.access
        let lookups = Task {
            (
                groups: AccessGroups.resolve(admin: access.adminGroup, authenticator: access.authenticatorGroup),
                processors: ProcessInfo.processInfo.activeProcessorCount,
                metrics: DaemonMetrics()
            )
        }
        let readerStart = startReader(configuration: loaded.configuration, logger: logger)
        let eventLoops = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let listening = Task { try await VarlinkListener.bind(target: target, group: eventLoops, logger: logger) }
        func abandon() async {
            await abandonStart(
                listener: try? await listening.value, eventLoops: eventLoops, readerStart: readerStart)
        }
        #if DEBUG
            // Test-only: start-up holds here with the socket bound, so a test can connect before
            // READY=1 and see its call served once the daemon is ready.
            if ProcessInfo.processInfo.environment["KIOSKAUTH_TEST_START_DELAY"] != nil {
                _ = try? await listening.value
                await testHookDelay("KIOSKAUTH_TEST_START_DELAY", logger: logger, "start-up continues")
            }
        #endif
        let store: Store
        let source: StoreKeySource
        do {
            (store, source) = try openStore(
                paths: paths, configuration: loaded.configuration, developmentKeyFile: developmentKeyFile,
                acceptStoreRollback: acceptStoreRollback, logger: logger)
        } catch {
            await abandon()
            throw error
        }
        timeline.mark("store")
        defer { store.close() }
        let listener: VarlinkListener
        do { listener = try await listening.value } catch {
            await abandon()
            if let served = error as? VarlinkListener.AlreadyServed { throw StartupError(message: "\(served)") }
            throw StartupError(message: "cannot listen on \(listenFD.map { "fd \($0)" } ?? paths.socket): \(error)")
        }
        timeline.mark("socket")
        try await serve(
            paths: paths, loaded: loaded, store: store, keySource: source, clock: clock, notifier: notifier,
            readerStart: readerStart, listener: listener, eventLoops: eventLoops,
            lookups: await lookups.value, timeline: timeline, hotBSS: hotBSS)
    }

    /// Start-up ends without serving: whatever it started is stopped again (the socket, the event
    /// loop, and the reader once its start finished).
    static func abandonStart(
        listener: VarlinkListener?, eventLoops: MultiThreadedEventLoopGroup,
        readerStart: Task<FingerprintReader?, Never>?
    ) async {
        await listener?.abandon()
        try? await eventLoops.shutdownGracefully()
        if let reader = await readerStart?.value { await reader.shutdown() }
    }

    /// Starts the fingerprint reader service in the background when fingerprints are enabled;
    /// the task's value is the started service, or nil when libfprint could not be started
    /// (logged: the daemon then offers passcodes only).
    static func startReader(configuration: DaemonConfiguration, logger: Logger) -> Task<FingerprintReader?, Never>? {
        guard configuration.fingerprint.enabled else { return nil }
        let candidate = FingerprintReader(
            configuration: .init(scanTimeout: .milliseconds(Int64(configuration.fingerprint.scanTimeout * 1000))),
            logger: logger)
        return Task {
            do {
                try await candidate.start()
                let present = await candidate.readers
                logger.info(
                    "fingerprint readers",
                    metadata: ["readers": "\(present.map { "\($0.driver) (\($0.name))" }.joined(separator: ", "))"])
                return candidate
            } catch {
                logger.error("fingerprint support unavailable; passcodes only", metadata: ["error": "\(error)"])
                return nil
            }
        }
    }

    /// What start-up reads before touching the store: the configuration, the logger at its
    /// configured level, and the identity-provider and audit-endpoint settings.
    struct LoadedConfiguration {
        var configuration: DaemonConfiguration
        var logger: Logger
        var identityProvider: IdentityProviderConfiguration?
        var auditEndpoint: AuditEndpointClient?
    }

    /// Loads and checks the configuration and the credentials it names.
    static func loadConfiguration(paths: DaemonPaths, logger baseLogger: Logger) throws -> LoadedConfiguration {
        var logger = baseLogger
        let configuration: DaemonConfiguration
        do {
            configuration = try DaemonConfiguration.load(path: paths.configuration) { warning in
                baseLogger.warning("\(warning)")
            }
        } catch {
            throw StartupError(message: "configuration: \(error)", exitCode: StartupError.configurationExitCode)
        }
        if let level = Logger.Level(rawValue: configuration.logLevel), baseLogger.logLevel == .info {
            logger.logLevel = level
        }
        let identityProviderConfiguration: IdentityProviderConfiguration?
        do {
            identityProviderConfiguration = try configuration.makeIdentityProviderConfiguration(
                credentialsDirectory: paths.credentialsDirectory)
        } catch {
            throw StartupError(message: "configuration: \(error.message)", exitCode: StartupError.configurationExitCode)
        }
        let auditEndpointConfiguration: AuditEndpointClient.Configuration?
        do {
            auditEndpointConfiguration = try configuration.makeAuditEndpointConfiguration(
                credentialsDirectory: paths.credentialsDirectory)
        } catch {
            throw StartupError(message: "configuration: \(error.message)", exitCode: StartupError.configurationExitCode)
        }
        var auditEndpoint: AuditEndpointClient?
        if let auditEndpointConfiguration {
            do { auditEndpoint = try AuditEndpointClient(configuration: auditEndpointConfiguration) } catch {
                throw StartupError(
                    message: "configuration: [AuditDelivery]: \(error.message)",
                    exitCode: StartupError.configurationExitCode)
            }
        }
        return LoadedConfiguration(
            configuration: configuration, logger: logger, identityProvider: identityProviderConfiguration,
            auditEndpoint: auditEndpoint)
    }

    /// Loads the store key and opens the store, checking it before anything is served.
    static func openStore(
        paths: DaemonPaths, configuration: DaemonConfiguration, developmentKeyFile: Bool, acceptStoreRollback: Bool,
        logger: Logger
    ) throws -> (Store, StoreKeySource) {
        try createDirectory(paths.stateDirectory, mode: 0o700)
        let storeExists = FileManager.default.fileExists(atPath: paths.database)
        let key: StoreKey
        let source: StoreKeySource
        do {
            (key, source) = try StoreKeyLoader.load(
                credentialsDirectory: paths.credentialsDirectory, stateDirectory: paths.stateDirectory,
                storeExists: storeExists,
                allowDevelopmentKeyFile: developmentKeyFile || configuration.store.developmentKeyFile,
                logger: logger)
        } catch {
            throw StartupError(message: error.message, exitCode: StartupError.configurationExitCode)
        }
        let store: Store
        do {
            store = try Store(path: paths.database, key: key, logger: logger, acceptRollback: acceptStoreRollback)
        } catch {
            throw startupError(error, database: paths.database)
        }
        // Nothing is served before READY=1, so nothing written on the way there waits for an
        // fsync of its own (Store.holdSyncsUntilServing; `serve` ends it before READY=1).
        store.holdSyncsUntilServing()
        #if DEBUG
            // Test-only: audit appends of these actions fail (debug builds; see Store.failingAuditActions).
            if let actions = ProcessInfo.processInfo.environment["KIOSKAUTH_TEST_FAILING_AUDIT"], !actions.isEmpty {
                store.failingAuditActions = Set(actions.split(separator: ",").map(String.init))
                logger.warning("TEST HOOK ACTIVE: audit appends fail for \(actions) (debug build, tests only)")
            }
        #endif
        // Before serving: a damaged, edited or rolled-back store is refused here, not found by
        // the first request that touches it. Cheap: proportional to neither the people nor the
        // audit trail (the chain is checked from the anchored head on; `audit verify` checks all
        // of it). The rows that grow with the people are swept as soon as the daemon serves
        // (`StoreSweepService`), and each is checked again wherever it is used.
        do {
            let check = try store.verifyAtStart()
            logger.info(
                "store checked", metadata: ["audit_seq": "\(check.events)", "checked_from": "\(check.checkedFrom)"])
        } catch {
            store.close()  // the caller closes it only once it is returned
            throw startupError(error, database: paths.database)
        }

        return (store, source)
    }

    /// Starts the identity provider, the authority and the long-lived services, attaches the
    /// reader once `readerStart` finished, serves the socket until SIGTERM/SIGINT, and shuts down.
    static func serve(
        paths: DaemonPaths, loaded: LoadedConfiguration, store: Store, keySource source: StoreKeySource,
        clock: DaemonClock, notifier: SystemdNotifier, readerStart: Task<FingerprintReader?, Never>?,
        listener: VarlinkListener,
        eventLoops: MultiThreadedEventLoopGroup,
        lookups: (groups: AccessGroups, processors: Int, metrics: DaemonMetrics),
        timeline: StartupTimeline, hotBSS: Int
    ) async throws {
        var timeline = timeline
        let configuration = loaded.configuration
        let logger = loaded.logger
        let readyLogger = logger
        let identityProviderConfiguration = loaded.identityProvider
        let auditEndpoint = loaded.auditEndpoint
        PasscodeVerifier.usesHugePages = configuration.store.passcodeHashHugePages
        let hashWorkers =
            configuration.store.passcodeHashWorkers > 0
            ? configuration.store.passcodeHashWorkers : HashingPool.defaultWorkers(processors: lookups.processors)
        let hashingPool = HashingPool(
            workers: hashWorkers, queueLimit: configuration.store.passcodeHashQueue,
            priority: HashingPriority(
                steps: configuration.store.passcodeHashPriority, workers: hashWorkers, processors: lookups.processors,
                logger: logger))
        timeline.mark("groups")
        var provider: IdentityProviderClient?
        if let identityProviderConfiguration {
            do {
                provider = try IdentityProviderClient(configuration: identityProviderConfiguration, logger: logger)
            } catch {
                await abandonStart(listener: listener, eventLoops: eventLoops, readerStart: readerStart)
                throw StartupError(
                    message: "configuration: [IdentityProvider]: \(error)", exitCode: StartupError.configurationExitCode
                )
            }
            logger.info(
                "identity provider configured", metadata: ["issuer": "\(configuration.identityProvider.issuer)"])
        }
        let auditMonitor = auditEndpoint.map {
            AuditDeliveryService.monitor(
                store: store, endpoint: configuration.auditDelivery.endpoint, endpointHost: $0.endpointHost,
                logger: logger)
        }
        if let auditEndpoint {
            logger.info("audit delivery configured", metadata: ["endpoint": "\(auditEndpoint.endpointHost)"])
        }
        let onlineServices = OnlineServices(
            clock: clock, provider: provider, auditDelivery: auditMonitor, metrics: lookups.metrics)
        let authority = Authority(
            store: store, configuration: configuration, groups: lookups.groups, hashingPool: hashingPool,
            isSocketActivated: listener.isInherited,
            usesDevelopmentKey: { if case .developmentKeyFile = source { true } else { false } }(),
            reader: nil, logger: logger, services: onlineServices,
            credentialsDirectory: paths.credentialsDirectory, fleetEventLoops: eventLoops, now: { clock.now() })
        timeline.mark("authority")
        // The method table (generic metadata for every method's input and reply types, about
        // half a millisecond) is built on another thread while the authority records the start
        // and restores its state.
        let dispatching = Task { Dispatcher(authority: authority) }
        // Not worth an fsync on the way to READY=1: a power cut in the next moments loses at most
        // this record, and the chain stays valid (it is synced, then anchored, in the background).
        await authority.audit(
            nil, action: .daemonStart, result: .success, detail: "schema \(Store.schemaVersion)", durable: false)
        await authority.recordLegacyBindings()
        await authority.recordInterruptedPasscodeChecks()
        timeline.mark("audit")
        await authority.startOnline()
        timeline.mark("online")
        // libfprint has come up on its own thread meanwhile (its library load, USB and udev
        // enumeration, opening the readers found), while the steps above ran here; nothing needs
        // it before the sensor is reconciled. Attached before anything is served, so READY=1
        // still means the readers present are usable.
        let reader = await readerStart?.value
        await authority.attach(reader: reader)
        timeline.mark("reader")
        // Commits are durable again from here (Store.holdSyncsUntilServing): reconciling a reader
        // that keeps prints itself may delete some from it, which cannot be undone, so its record
        // must not wait for the background sync.
        store.serving()
        await authority.reconcileSensor()
        timeline.mark("sensor")
        let startup = timeline

        let (serving, servingContinuation) = AsyncStream<Void>.makeStream()
        let (swept, sweptContinuation) = AsyncStream<Void>.makeStream()
        let idleRelease = IdleRelease(quiet: IdleRelease.quiet(seconds: configuration.idleRelease))
        let server = VarlinkServer(
            listener: listener, authority: authority, dispatcher: await dispatching.value,
            configuration: configuration.socket, idleRelease: idleRelease, logger: logger
        ) {
            notifier.notify("READY=1\nSTATUS=Serving")
            var startup = startup
            startup.mark("listen")
            readyLogger.info(
                "ready",
                metadata: [
                    "version": "\(KioskAuthVersion.string)", "startup_ms": "\(startup.summary)",
                    "hot_bss": "\(describeHotBSS(hotBSS))",
                ])
            servingContinuation.finish()
        }
        // Every service is named here: without a name ServiceLifecycle makes one by interpolating
        // the service value, and describing a struct through its Mirror costs the runtime a
        // protocol-conformance search per field type, about a fifth of start-up's CPU.
        var services: [ServiceGroupConfiguration.ServiceConfiguration] = [
            .init(
                service: server, successTerminationBehavior: .gracefullyShutdownGroup,
                failureTerminationBehavior: .gracefullyShutdownGroup, serviceName: "socket"),
            .init(
                service: StoreSweepService(
                    store: store, database: paths.database, serving: serving, swept: sweptContinuation, logger: logger),
                successTerminationBehavior: .ignore, failureTerminationBehavior: .gracefullyShutdownGroup,
                serviceName: "store-sweep"),
            .init(
                service: IdleReleaseService(release: idleRelease, startupDone: swept, logger: logger),
                serviceName: "idle-release"),
        ]
        if let reader {
            services.append(
                .init(
                    service: ReaderService(reader: reader, authority: authority, logger: logger), serviceName: "reader")
            )
        }
        if let provider {
            services.append(
                .init(
                    service: RefreshService(
                        authority: authority, provider: provider, wakeup: onlineServices.refreshWakeup, logger: logger),
                    serviceName: "refresh"))
        }
        if let auditEndpoint, let auditMonitor {
            services.append(
                .init(
                    service: AuditDeliveryService(
                        store: store, client: auditEndpoint, monitor: auditMonitor,
                        endpoint: configuration.auditDelivery.endpoint, policy: configuration.auditDelivery.policy,
                        terminal: hostName(), logger: logger, now: { clock.now() }),
                    serviceName: "audit-delivery"))
        }
        services.append(
            .init(
                service: TimekeepingService(
                    authority: authority, wakeup: onlineServices.sessionWakeup, events: onlineServices.events),
                serviceName: "timekeeping"))
        // Idle (no connection) until the terminal is in a fleet.
        services.append(
            .init(
                service: FleetSyncService(
                    agent: authority.fleet, helper: authority.fleetHelper, configuration: configuration.fleet,
                    logger: logger),
                serviceName: "fleet-sync"))
        if configuration.metrics.writesTextfile {
            services.append(
                .init(
                    service: MetricsTextfileService(
                        authority: authority, path: configuration.metrics.textfilePath,
                        interval: .milliseconds(Int64(configuration.metrics.textfileInterval * 1000)), logger: logger),
                    serviceName: "metrics-textfile"))
        }
        if configuration.store.auditVerifyInterval > 0 {
            services.append(
                .init(
                    service: AuditVerificationService(
                        store: store, database: paths.database,
                        interval: .milliseconds(Int64(configuration.store.auditVerifyInterval * 1000)), logger: logger
                    ),
                    failureTerminationBehavior: .gracefullyShutdownGroup, serviceName: "audit-verification"))
        }
        if let interval = SystemdNotifier.watchdogInterval() {
            services.append(
                .init(
                    service: WatchdogService(
                        interval: interval, notifier: notifier, authority: authority, logger: logger),
                    serviceName: "watchdog"))
        }
        var groupConfiguration = ServiceGroupConfiguration(services: services, logger: logger)
        groupConfiguration.gracefulShutdownSignals = [.sigterm, .sigint]
        let group = ServiceGroup(configuration: groupConfiguration)
        do {
            try await withGracefulShutdownHandler {
                try await group.run()
            } onGracefulShutdown: {
                notifier.notify("STOPPING=1\nSTATUS=Shutting down")
                // Subscriptions are calls that never end by themselves: end them so the socket drains.
                onlineServices.events.finishAll()
            }
        } catch {
            logger.error("stopped with an error", metadata: ["error": "\(error)"])
            await authority.flushRefusalSummaries()
            await authority.audit(nil, action: .daemonStop, result: .failure, detail: "\(error)")
            hashingPool.shutdown()
            await authority.fleetHelper.stop()
            await listener.abandon()  // the services may have stopped before the socket was served
            try? await eventLoops.shutdownGracefully()
            // A refusal found while running (the scheduled chain check) keeps its exit status.
            if let refusal = error as? StartupError { throw refusal }
            throw StartupError(message: "\(error)")
        }
        // The fleet's sync service has stopped: its helper goes before the event loops do.
        await authority.fleetHelper.stop()
        notifier.notify("STOPPING=1\nSTATUS=Stopped")
        await authority.flushRefusalSummaries()
        await authority.audit(nil, action: .daemonStop, result: .success)
        hashingPool.shutdown()
        try? await eventLoops.shutdownGracefully()
        logger.info("stopped")
    }

    /// What the ready line says of the part of `.bss` made resident at the top of `main`
    /// (`kioskauth_populate_hot_bss`): `404KiB`; `unordered` for a program linked without the
    /// package's symbol order (a development build); `too-large` when the part is over its limit
    /// (nothing made resident); or the errno `madvise` gave (`EINVAL`: a kernel before 5.14).
    static func describeHotBSS(_ result: Int) -> String {
        if result > 0 { return "\(result / 1024)KiB" }
        if result == 0 { return "unordered" }
        switch Int32(-result) {
        case ERANGE: return "too-large"
        case EINVAL: return "EINVAL"
        default: return "errno-\(-result)"
        }
    }

    /// The kernel's host name (never a DNS lookup, which could block start-up).
    static func hostName() -> String {
        var buffer = [CChar](repeating: 0, count: 256)
        guard gethostname(&buffer, buffer.count - 1) == 0 else { return "" }
        return String(decoding: buffer.prefix(while: { $0 != 0 }).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func createDirectory(_ path: String, mode: mode_t) throws {
        var status = stat()
        if stat(path, &status) == 0 {
            guard status.st_mode & S_IFMT == S_IFDIR else { throw StartupError(message: "\(path) is not a directory") }
            return
        }
        // Each missing directory on the way, with `mode` (set after mkdir, so the umask does not
        // narrow it), as FileManager's createDirectory(withIntermediateDirectories:attributes:).
        var built = path.hasPrefix("/") ? "" : "."
        for component in path.split(separator: "/") {
            built += "/" + component
            if mkdir(built, mode) == 0 {
                _ = chmod(built, mode)
            } else if errno != EEXIST {
                throw StartupError(message: "cannot create \(path): \(String(cString: strerror(errno)))")
            }
        }
    }
}

/// How long each step of start-up took, for the `ready` log line (`startup_ms`): milliseconds
/// from the previous mark, the first from when `Daemon.run` was entered.
struct StartupTimeline: Sendable {
    private var last = ContinuousClock.now
    private var steps: [(String, Duration)] = []

    mutating func mark(_ step: String) {
        let now = ContinuousClock.now
        steps.append((step, now - last))
        last = now
    }

    /// `configuration=0.4 store=1.2 ...`
    var summary: String {
        steps.map { step, elapsed in
            let ms = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
            return "\(step)=\((ms * 10).rounded() / 10)"
        }.joined(separator: " ")
    }
}

/// Tells the service manager the daemon is alive, but only while the authority answers: a
/// wedged actor stops the pings and systemd restarts the daemon.
struct WatchdogService: Service {
    let interval: Duration
    let notifier: SystemdNotifier
    let authority: Authority
    let logger: Logger

    func run() async throws {
        logger.info("watchdog enabled", metadata: ["interval": "\(interval)"])
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            await authority.ping()
            notifier.notify("WATCHDOG=1")
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: interval / 2) }
            } catch {
                return
            }
        }
    }
}

/// Recomputes the whole audit chain every `interval` while serving (the first time after at most
/// five minutes): the check before serving covers only the entries after the sealed checkpoint,
/// so an entry edited before it is found here (and by `audit verify`). A broken chain is
/// reported as start-up reports it, one line naming the database and what is wrong, and stops
/// the daemon with exit status 78: a daemon must not keep recording on top of an untrusted trail.
struct AuditVerificationService: Service {
    let store: Store
    let database: String
    let interval: Duration
    let logger: Logger

    func run() async throws {
        var wait = min(interval, .seconds(300))
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let delay = wait
            do {
                try await cancelWhenGracefulShutdown { try await Task.sleep(for: delay) }
            } catch {
                return
            }
            wait = interval
            let started = ContinuousClock.now
            let result = await Self.verify(store)
            switch result {
            case .success(let verification) where verification.isValid:
                logger.info(
                    "audit chain verified",
                    metadata: [
                        "audit_seq": "\(verification.events)", "elapsed": "\(ContinuousClock.now - started)",
                    ])
            case .success(let verification):
                let refusal = StartupError(
                    message: "\(database): audit \(verification.reason ?? "chain is broken")",
                    exitCode: StartupError.configurationExitCode)
                logger.critical("\(refusal.message)")
                throw refusal
            case .failure(let error):
                // The store could not be read (busy, I/O): said, and tried again next time.
                logger.error("audit chain verification failed", metadata: ["error": "\(error.message)"])
            }
        }
    }

    /// Runs the verification on a thread of its own: it is long, synchronous work that must not
    /// hold a thread of the cooperative pool (the store lock is taken one chunk at a time).
    static func verify(_ store: Store) async -> Result<AuditChainVerification, StoreError> {
        await withCheckedContinuation { continuation in
            startThread(name: "audit-verify") {
                let result = Result { () throws(StoreError) in try store.verifyAudit(trustedHead: nil) }
                MemoryBounds.releaseFreeMemory()  // what the pass over the trail freed
                continuation.resume(returning: result)
            }
        }
    }
}

/// Sweeps the rows that grow with the people (`Store.verifyRows`) once, as soon as the daemon
/// serves: the check before serving covers only what does not grow, so start-up stays flat. A
/// finding is reported as start-up reports one, one line naming the database and what is wrong,
/// and stops the daemon with exit status 78. Until the sweep ends nothing is served on trust:
/// every row it checks is checked again where a call uses it (see `Store.verifyAtStart`).
struct StoreSweepService: Service {
    let store: Store
    let database: String
    /// Ends when the socket is served (READY=1).
    let serving: AsyncStream<Void>
    /// Finished once the rows are checked: start-up's own work is done (`IdleRelease`).
    let swept: AsyncStream<Void>.Continuation
    let logger: Logger

    func run() async throws {
        for await _ in serving.cancelOnGracefulShutdown() {}
        guard !Task.isCancelled, !Task.isShuttingDownGracefully else { return }
        let started = ContinuousClock.now
        let store = self.store
        let result = await withCheckedContinuation {
            (continuation: CheckedContinuation<Result<Int, StoreError>, Never>) in
            // Synchronous work that must not hold a thread of the cooperative pool.
            startThread(name: "store-sweep") {
                let result = Result { () throws(StoreError) in try store.verifyRows() }
                MemoryBounds.releaseFreeMemory()  // what the pass over every row freed
                continuation.resume(returning: result)
            }
        }
        switch result {
        case .success(let rows):
            logger.info(
                "store rows checked", metadata: ["rows": "\(rows)", "elapsed": "\(ContinuousClock.now - started)"])
            swept.finish()
            // Stay until the group shuts down: a service that ends on its own while a shutdown
            // is under way is an error to the service group (exit status 1 on SIGTERM).
            try? await gracefulShutdown()
        case .failure(let error):
            let refusal = startupError(error, database: database)
            logger.critical("\(refusal.message)")
            throw refusal
        }
    }
}

extension Authority {
    /// Answers when the actor is not wedged.
    func ping() {}
}

/// Follows reader hotplug for the audit trail and the journal, and closes the reader at shutdown.
struct ReaderService: Service {
    let reader: FingerprintReader
    let authority: Authority
    let logger: Logger

    func run() async throws {
        for await event in reader.events.cancelOnGracefulShutdown() {
            switch event {
            case .added(let info):
                logger.info("reader added", metadata: ["driver": "\(info.driver)", "reader": "\(info.name)"])
                await authority.audit(
                    nil, action: .readerAdded, result: .success, detail: "\(info.driver): \(info.name)")
                await authority.publishReaderEvent(added: true, reader: info.id)
                await authority.reconcileSensor()
            case .removed(let id):
                logger.info("reader removed", metadata: ["reader": "\(id)"])
                await authority.audit(nil, action: .readerRemoved, result: .success, detail: id)
                await authority.publishReaderEvent(added: false, reader: id)
            }
        }
        await reader.shutdown()
    }
}
