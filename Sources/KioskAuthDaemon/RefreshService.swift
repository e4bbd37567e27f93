import FoundationEssentials
import KioskAuthIdentity
import Logging
import ServiceLifecycle

/// Sends the refreshes, queued revocations and reachability probes the authority hands it, and
/// reports how each ended. All decisions (when, whether, what a failure means) are the authority's; this service
/// owns only the waiting and the network I/O, which never happens inside the authority actor.
///
/// It wakes when a timer is due or when the authority signals new work, and at least every
/// second, because timers run on the wall clock (token expiry is the provider's wall-clock
/// notion) and must notice clock changes and resume from suspend.
struct RefreshService: Service {
    let authority: Authority
    let provider: any IdentityProvider
    let wakeup: Wakeup
    let logger: Logger

    /// The longest the loop sleeps between checks.
    static let maximumSleep: Duration = .seconds(1)

    func run() async throws {
        logger.info("background refresh running")
        await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                while !Task.isCancelled && !Task.isShuttingDownGracefully {
                    let work = await authority.online.refreshTick()
                    for job in work.jobs {
                        group.addTask { await refresh(job) }
                    }
                    for delivery in work.deliveries {
                        group.addTask { await deliver(delivery) }
                    }
                    if let timeout = work.probe {
                        group.addTask { await probe(timeout: timeout) }
                    }
                    await wakeup.wait(upTo: min(work.sleep, Self.maximumSleep))
                }
                // Requests still out are cancelled; their in-flight records make the next start
                // treat them as lost responses.
                group.cancelAll()
            }
        } onGracefulShutdown: {
            wakeup.signal()
        }
        logger.info("background refresh stopped")
    }

    private func refresh(_ job: RefreshJob) async {
        let result: RefreshJobResult
        do {
            let refreshed = try await provider.refresh(refreshToken: job.refreshToken)
            result = .refreshed(refreshed, receivedAt: Date())
        } catch let error as IdentityError {
            result = .failed(error)
        } catch {
            // Cancellation at shutdown: the persisted in-flight marker speaks for it.
            return
        }
        #if DEBUG
            // Test-only (debug builds): the answer waits this long (or until shutdown cancels the
            // wait) before it is reported, as on a machine busy when the daemon is stopped.
            await testHookDelay("KIOSKAUTH_TEST_REFRESH_REPORT_DELAY", logger: logger, "a refresh answer is reported")
        #endif
        // Tokens that arrived are reported even when shutdown has begun meanwhile: the provider
        // has rotated the refresh token, and this answer holds the only copy of the new one
        // (dropped, the next start would retry with the spent one and meet reuse detection).
        // A failure at shutdown is not reported: the persisted in-flight marker speaks for it.
        if case .failed = result, Task.isCancelled { return }
        await authority.online.completeRefresh(job, result)
    }

    private func probe(timeout: Duration) async {
        var failure: (any Error)?
        do {
            try await provider.probe(timeout: timeout)
        } catch {
            failure = error
        }
        // At shutdown nobody needs the answer; otherwise report even a cancellation, which
        // frees the probe slot.
        if Task.isCancelled { return }
        await authority.online.completeProbe(error: failure)
    }

    private func deliver(_ job: DeliveryJob) async {
        var failure: (any Error)?
        do {
            try await provider.revoke(refreshToken: job.token)
        } catch {
            failure = error
        }
        if Task.isCancelled && failure != nil {
            await authority.online.releaseDelivery(job)
            return
        }
        await authority.online.completeDelivery(job, error: failure)
    }
}

/// Re-checks sessions every second while any is open (ending idle and overnight sessions and
/// telling subscribers), feeds the offline window a clock reading every minute, and once more at
/// shutdown, so the durable high-water mark is never far behind. With no session open it sleeps
/// until the next reading is due (`timekeepingTick`).
///
/// It stops before the socket server (services stop in reverse order), and on its way ends every
/// `Subscribe` call, which would otherwise hold the server's drain.
struct TimekeepingService: Service {
    let authority: Authority
    let wakeup: Wakeup
    let events: EventHub

    func run() async throws {
        await withGracefulShutdownHandler {
            while !Task.isCancelled && !Task.isShuttingDownGracefully {
                let next = await authority.online.timekeepingTick()
                await wakeup.wait(upTo: next)
            }
        } onGracefulShutdown: {
            events.finishAll()
            wakeup.signal()
        }
        await authority.online.observeClock()
    }
}
