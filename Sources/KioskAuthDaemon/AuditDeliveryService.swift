import FoundationEssentials
import KioskAuthCore
import KioskAuthIdentity
import KioskAuthProtocol
import KioskAuthStore
import Logging
import ServiceLifecycle
import Synchronization

/// What audit delivery shows in `GetStatus`, and how the rest of the daemon nudges it. Safe to
/// use from anywhere; the authority reads it without waiting for the service.
final class AuditDeliveryMonitor: Sendable {
    /// Delivery as last observed by the service.
    struct Snapshot: Sendable {
        /// The endpoint's host (and port), for admins.
        var endpointHost: String
        /// The highest sequence number the endpoint acknowledged.
        var deliveredThrough = 0
        /// When it last acknowledged a batch (from the store at start, then live).
        var lastDeliveryAt: Date?
        /// Why the last attempt failed; nil once a batch is accepted again.
        var lastError: String?
        /// When it failed.
        var lastErrorAt: Date?
        /// Failed attempts since the last accepted batch.
        var consecutiveFailures = 0
        /// When the failed batch goes out again (wall clock, for display).
        var nextAttemptAt: Date?
        /// Whether a request is out now.
        var isSending = false
    }

    private struct State {
        var snapshot: Snapshot
        var networkCameBack = false
    }

    private let state: Mutex<State>
    /// Wakes the service: an entry was appended, the network came back, or shutdown.
    let wakeup = Wakeup()

    init(endpointHost: String) {
        state = Mutex(State(snapshot: Snapshot(endpointHost: endpointHost)))
    }

    /// The current snapshot.
    var snapshot: Snapshot { state.withLock { $0.snapshot } }

    func update(_ body: (inout Snapshot) -> Void) {
        state.withLock { body(&$0.snapshot) }
    }

    /// An entry was appended to the trail: deliver it (unless a backoff is running).
    func entryAppended() {
        wakeup.signal()
    }

    /// The terminal is back online: end a transient backoff now.
    func networkAvailable() {
        state.withLock { $0.networkCameBack = true }
        wakeup.signal()
    }

    /// Whether the network came back since the last call.
    func takeNetworkAvailable() -> Bool {
        state.withLock { state in
            defer { state.networkCameBack = false }
            return state.networkCameBack
        }
    }
}

/// Delivers the audit trail to the configured HTTP endpoint, at least once, in order, in batches.
///
/// It works beside the authority, not inside it: it reads entries and writes its cursor through
/// the store (whose lock is held for single statements, never across a request), so neither a
/// slow endpoint nor a hanging one can hold up an unlock. The schedule (AuditDeliverySchedule)
/// makes every decision; this service waits, sends and reports.
struct AuditDeliveryService: Service {
    let store: Store
    let client: AuditEndpointClient
    let monitor: AuditDeliveryMonitor
    /// The configured URL: the durable cursor belongs to it.
    let endpoint: String
    let policy: AuditDeliveryPolicy
    /// The terminal's host name, carried in every batch.
    let terminal: String
    let logger: Logger
    /// The daemon's wall clock, for the times shown in the status.
    let now: @Sendable () -> Date

    /// The longest the loop sleeps without looking for new entries (appends also wake it).
    static let pollInterval: Duration = .seconds(5)

    /// The monitor for delivery to `endpoint`, starting from the durable cursor. Made before the
    /// socket is served, so that no status shows the whole trail as queued while the service has
    /// yet to start.
    static func monitor(
        store: Store, endpoint: String, endpointHost: String, logger: Logger
    ) -> AuditDeliveryMonitor {
        let progress: AuditDeliveryProgress
        do {
            if let recorded = try store.recordedAuditDeliveryProgress(), recorded.endpoint != endpoint {
                logger.notice(
                    "the audit endpoint changed: the new one receives the whole trail (event ids are unchanged)",
                    metadata: ["acknowledged_by_previous": "\(recorded.deliveredThrough)"])
            }
            progress = try store.auditDeliveryProgress(endpoint: endpoint)
        } catch {
            // Starting over is safe: ids are stable, so the endpoint recognises what it holds.
            logger.error(
                "cannot read the audit delivery cursor; delivering from the start",
                metadata: ["error": "\(error.message)"])
            progress = AuditDeliveryProgress(endpoint: endpoint, deliveredThrough: 0, lastDeliveryAt: nil)
        }
        let monitor = AuditDeliveryMonitor(endpointHost: endpointHost)
        monitor.update {
            $0.deliveredThrough = progress.deliveredThrough
            $0.lastDeliveryAt = progress.lastDeliveryAt
        }
        return monitor
    }

    func run() async throws {
        #if DEBUG
            // Test-only (debug builds): the service starts this many seconds late, as it may on a
            // busy machine; what the status shows meanwhile must already be the durable cursor.
            await testHookDelay("KIOSKAUTH_TEST_AUDIT_DELIVERY_START_DELAY", logger: logger, "audit delivery starts")
        #endif
        let stream = store.auditStreamID
        let deliveredThrough = monitor.snapshot.deliveredThrough  // the durable cursor, read before serving
        let head = (try? store.auditHead().events) ?? 0
        logger.info(
            "audit delivery running",
            metadata: [
                "endpoint": "\(client.endpointHost)", "delivered_through": "\(deliveredThrough)",
                "queued": "\(max(head - deliveredThrough, 0))",
            ])
        await withGracefulShutdownHandler {
            var schedule = AuditDeliverySchedule<ContinuousClock.Instant>(
                policy: policy, deliveredThrough: deliveredThrough)
            var random = SystemRandomNumberGenerator()
            delivery: while !Task.isCancelled && !Task.isShuttingDownGracefully {
                if monitor.takeNetworkAvailable() { schedule.networkAvailable() }
                let head: Int
                do throws(StoreError) { head = try store.auditHead().events } catch {
                    logger.error("cannot read the audit trail's head", metadata: ["error": "\(error.message)"])
                    await monitor.wakeup.wait(upTo: Self.pollInterval)
                    continue
                }
                switch schedule.next(head: head, at: .now) {
                case .wait(let until):
                    var timeout = Self.pollInterval
                    if let until { timeout = min(timeout, max(.zero, ContinuousClock.now.duration(to: until))) }
                    await monitor.wakeup.wait(upTo: timeout)
                case .send(let range):
                    do {
                        try await send(range, stream: stream, schedule: &schedule, random: &random)
                    } catch {
                        // Shutdown cut the request short: not acknowledged, so sent again at the
                        // next start under the same ids.
                        break delivery
                    }
                }
            }
        } onGracefulShutdown: {
            monitor.wakeup.signal()
        }
        logger.info("audit delivery stopped")
    }

    /// Sends one batch and records its outcome. Throws only when shutdown cancelled the request.
    private func send(
        _ range: ClosedRange<Int>, stream: String, schedule: inout AuditDeliverySchedule<ContinuousClock.Instant>,
        random: inout SystemRandomNumberGenerator
    ) async throws {
        let entries: [AuditEntry]
        do { entries = try store.auditEntries(in: range) } catch {
            logger.error("cannot read audit entries", metadata: ["error": "\(error.message)"])
            _ = schedule.complete(.failed(retryAfter: nil), at: .now, using: &random)
            return
        }
        if entries.count < range.count {
            // Entries were deleted behind the store's back; the gap in the sequence numbers the
            // endpoint receives is the evidence. Nothing can be delivered for them.
            logger.critical(
                "audit entries are missing from the trail; the endpoint will see the gap",
                metadata: ["range": "\(range.lowerBound)-\(range.upperBound)", "present": "\(entries.count)"])
        }
        let result: Result<Int, AuditEndpointFailure>
        if entries.isEmpty {
            result = .success(0)
        } else {
            let batch = AuditBatch(stream: stream, terminal: terminal, entries: entries)
            let body = batch.encoded()
            let key = batch.key
            monitor.update { $0.isSending = true }
            defer { monitor.update { $0.isSending = false } }
            result = try await cancelWhenGracefulShutdown { [client] in try await client.post(body, key: key) }
        }
        let wall = now()
        switch result {
        case .success(let status):
            guard case .persistCursor(let through) = schedule.complete(.accepted, at: .now, using: &random) else {
                return
            }
            do { try store.recordAuditDelivery(through: through, endpoint: endpoint, at: wall) } catch {
                // Delivered but not recorded: sent again later, which the ids make harmless.
                logger.error("cannot record the audit delivery cursor", metadata: ["error": "\(error.message)"])
            }
            let previous = monitor.snapshot
            monitor.update {
                $0.deliveredThrough = through
                $0.lastDeliveryAt = wall
                $0.lastError = nil
                $0.lastErrorAt = nil
                $0.consecutiveFailures = 0
                $0.nextAttemptAt = nil
            }
            if previous.consecutiveFailures > 0 {
                logger.notice(
                    "audit delivery works again",
                    metadata: ["failed_attempts": "\(previous.consecutiveFailures)", "delivered_through": "\(through)"])
            }
            logger.debug(
                "audit events delivered",
                metadata: ["first": "\(range.lowerBound)", "last": "\(range.upperBound)", "status": "\(status)"])
        case .failure(let failure):
            let outcome: AuditDeliveryOutcome =
                failure.isRefusal ? .refused : .failed(retryAfter: failure.retryAfter)
            guard case .retry(_, let delay) = schedule.complete(outcome, at: .now, using: &random) else { return }
            let failures = schedule.consecutiveFailures
            let next = wall.addingTimeInterval(
                Double(delay.components.seconds) + Double(delay.components.attoseconds) * 1e-18)
            monitor.update {
                $0.lastError = failure.message
                $0.lastErrorAt = wall
                $0.consecutiveFailures = failures
                $0.nextAttemptAt = next
            }
            let metadata: Logger.Metadata = [
                "endpoint": "\(client.endpointHost)", "error": "\(failure.message)", "attempts": "\(failures)",
                "retry_in": "\(delay.components.seconds) s",
                "queued": "\(schedule.queued(head: (try? store.auditHead().events) ?? range.upperBound))",
            ]
            if failure.isRefusal {
                // Only an administrator can fix this: say so every time (at most once per backoff cap).
                logger.error("the audit endpoint refuses the batch; nothing is dropped, retrying", metadata: metadata)
            } else if failures == 1 {
                logger.notice("audit delivery failed; events stay queued and are retried", metadata: metadata)
            } else {
                logger.debug("audit delivery failed again", metadata: metadata)
            }
        }
    }
}
