import FoundationEssentials
import KioskAuthFleet
import Logging
import ServiceLifecycle
import Synchronization

/// Keeps a fleet member in step with the directory (docs/fleet.md §9): pulls and pushes on a
/// notification from the change feed, on the backstop poll (`[Fleet] PollIntervalSec`) and at
/// every reconnection, with a capped exponential back-off (`[Fleet] ReconnectMaxSec`) while the
/// directory is unreachable. The pulls and pushes run on the fleet agent's connection; a second
/// connection LISTENs and only wakes the loop.
///
/// A terminal in no fleet opens no connection: the service waits for a membership to begin
/// (`FleetCreate`, `FleetJoin`), which wakes it.
struct FleetSyncService: Service {
    let agent: FleetAgent
    /// The fleet helper the agent's connections go through: stopped as soon as the stop begins.
    let helper: FleetHelper
    let configuration: DaemonConfiguration.Fleet
    let logger: Logger

    /// Whether the LISTEN connection is up, and that connection, so that shutdown can close it
    /// (which ends the listener however its notification sequence treats cancellation). A
    /// listener that ends soon after it started (a refused connection, a role's connection
    /// limit, a LISTEN that fails) is started again only after a pause that doubles each time,
    /// up to `[Fleet] ReconnectMaxSec`: every end wakes the sync loop, which would otherwise
    /// reconnect at once, over and over.
    final class Listening: Sendable {
        struct State {
            var isUp = false
            var startedAt: ContinuousClock.Instant?
            /// Not before then, after a short-lived listener.
            var retryAt: ContinuousClock.Instant?
            var pause: Duration = .seconds(1)
        }

        /// A listener that lasted this long was not failing: the next one starts at once.
        static let steadyLifetime: Duration = .seconds(30)

        let state = Mutex(State())
        let connection = Mutex<(any FleetDirectoryConnection)?>(nil)
        let longestPause: Duration

        init(longestPause: Duration) { self.longestPause = longestPause }

        var isUp: Bool { state.withLock { $0.isUp } }

        /// How long until a new listener may start (zero when it may start now).
        func wait(at now: ContinuousClock.Instant) -> Duration {
            state.withLock { state in state.retryAt.map { max(now.duration(to: $0), .zero) } ?? .zero }
        }

        func started(at now: ContinuousClock.Instant) {
            state.withLock { state in
                state.isUp = true
                state.startedAt = now
                state.retryAt = nil
            }
        }

        func ended(at now: ContinuousClock.Instant) {
            state.withLock { state in
                state.isUp = false
                if let started = state.startedAt, started.duration(to: now) < Self.steadyLifetime {
                    state.retryAt = now + state.pause
                    state.pause = min(state.pause * 2, longestPause)
                } else {
                    state.pause = .seconds(1)
                }
            }
        }
    }

    func run() async throws {
        let listening = Listening(longestPause: .milliseconds(Int64(configuration.reconnectMax * 1000)))
        var listener: Task<Void, Never>?
        await withGracefulShutdownHandler {
            var backoff = 1.0
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                guard agent.isMember() else {
                    listener?.cancel()
                    listener = nil
                    await agent.wakeup.wait(upTo: .seconds(3600))
                    continue
                }
                do throws(APIError) {
                    try await agent.sync()
                    backoff = 1
                    var wait = Duration.milliseconds(Int64(configuration.pollInterval * 1000))
                    if !listening.isUp {
                        let pause = listening.wait(at: .now)
                        if pause == .zero {
                            listener?.cancel()
                            listener = startListener(listening)
                        } else {
                            wait = min(wait, pause)
                        }
                    }
                    await agent.wakeup.wait(upTo: wait)
                } catch {
                    logger.warning(
                        "fleet sync failed", metadata: ["error": "\(error.name)", "detail": "\(error.parameters)"])
                    await agent.wakeup.wait(upTo: .milliseconds(Int64(backoff * 1000)))
                    backoff = min(backoff * 2, configuration.reconnectMax)
                }
            }
        } onGracefulShutdown: {
            agent.wakeup.signal()
            // A sync waiting on the helper (one that stopped answering, say) would hold this
            // service, and the services stopped after it, up to the helper's call deadline:
            // stopping the helper fails its calls in flight now. Nothing is lost: a stopping
            // daemon starts no new sync, and the next start pulls and pushes what is left.
            Task { await helper.stop() }
        }
        // Close both directory connections before the daemon lets go of them: PostgresNIO
        // requires it (a connection dropped open is an assertion failure in debug builds, and a
        // socket left to the kernel otherwise).
        listener?.cancel()
        if let open = listening.connection.withLock({ $0 }) { await open.close() }
        await listener?.value
        await agent.close()
    }

    /// LISTENs on a connection of its own; each notification wakes the loop, and so does the
    /// connection's end (the loop then pulls and reconnects it).
    private func startListener(_ listening: Listening) -> Task<Void, Never> {
        let agent = agent
        let logger = logger
        listening.started(at: .now)
        return Task {
            defer {
                listening.ended(at: .now)
                agent.wakeup.signal()
            }
            let connection: (any FleetDirectoryConnection)?
            do { connection = try await agent.listenerConnection() } catch {
                logger.info("fleet listener cannot connect", metadata: ["error": "\(error)"])
                return
            }
            guard let connection else { return }
            listening.connection.withLock { $0 = connection }
            defer { listening.connection.withLock { $0 = nil } }
            #if DEBUG
                // Test-only (debug builds): the LISTEN goes out this many seconds late, as it may
                // on a slow link; a change made meanwhile must still arrive without the poll.
                await testHookDelay("KIOSKAUTH_TEST_FLEET_LISTEN_DELAY", logger: logger, "the fleet listener LISTENs")
            #endif
            if Task.isCancelled {
                await connection.close()
                return
            }
            do {
                try await connection.withChangeWakeups { wakeups in
                    // The LISTEN is in force from here on. A change committed between the last
                    // pull and now sent its NOTIFY to nobody: pull once more, or it would wait
                    // for the backstop poll (`[Fleet] PollIntervalSec`).
                    agent.wakeup.signal()
                    for try await _ in wakeups {
                        agent.wakeup.signal()
                    }
                }
            } catch {
                if !Task.isCancelled {
                    logger.info("fleet listener ended", metadata: ["error": "\(error)"])
                }
            }
            await connection.close()
        }
    }
}
