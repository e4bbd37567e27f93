public import Logging
import Synchronization

/// The fingerprint reader service: the only code in kioskauth that touches libfprint.
///
/// **Threading.** `start()` launches one thread that owns GLib's default main context and runs
/// its main loop until `shutdown()`. libfprint's asynchronous API is driven only from closures
/// scheduled onto that loop; results come back through continuations. Because the loop always
/// runs, hotplug (`device-added`/`device-removed`) and cancellation are handled while idle as
/// well as mid-scan. GLib's default context is process-wide, so one process runs at most one
/// started reader at a time (a second `start()` throws `.busy`).
///
/// **One operation at a time.** Operations are serialised: a caller that arrives while another
/// operation runs *waits* its turn (first come, first served) rather than failing with `.busy`;
/// its own cancellation applies while it waits. The wait is not part of the scan timeout.
/// verify and identify report where they stand (`ScanPhase`): waiting for the reader, then
/// owning it, so that a caller asks for a finger only when the touch will be its own.
///
/// **Answers at the match report.** verify and identify return as soon as libfprint reports
/// the match; image sensors finish the operation only once the finger is lifted, and the next
/// operation waits for that (not the caller).
///
/// **Cancellation and timeouts.** Cancelling the awaiting task (or dropping the enrolment
/// stream) cancels the scan through its `GCancellable` and throws `.cancelled`. Each touch has
/// `Configuration.scanTimeout`; when it passes the scan is cancelled and `.timeout` is thrown.
///
/// **Readers.** Each operation takes the id of the reader to run on (``ReaderInfo/id``); given
/// none, it uses the first usable reader (``readers``' first element). With none, they throw
/// `.noReader` at once; a named reader that is not attached (any more) throws `.removed`. A
/// reader unplugged mid-scan ends that operation with `.removed`; a reader plugged in later is
/// opened and used. A template works only on the reader it was enrolled on: see
/// ``readerIDs(of:)``. Operations are serialised across all readers.
///
/// **Fresh touches.** verify and identify (including enrolment's duplicate check) refuse a
/// result whose scan began with a finger already on the sensor (`.fingerAlreadyPresent`),
/// judged from libfprint's finger-status reports (see `TouchFreshness`). Drivers that do not
/// report finger status cannot be judged; their results are accepted. Enrolment stages rely on
/// the driver, which already requires the finger to be lifted between touches.
///
/// Templates are biometric data: this type never logs them.
///
/// Call ``shutdown()`` before releasing a started reader: the thread runs until then.
public final class FingerprintReader: Sendable {
    /// Tunables of the reader service.
    public struct Configuration: Sendable {
        /// How long one touch may take before the scan ends with `.timeout`.
        public var scanTimeout: Duration

        /// Creates a configuration.
        public init(scanTimeout: Duration = .seconds(30)) {
            self.scanTimeout = scanTimeout
        }
    }

    /// `starting` until the loop runs with libfprint loaded (its table is filled then): nothing
    /// schedules onto the loop before `running`, and a `shutdown()` meanwhile waits in `waiters`.
    private enum Lifecycle {
        case created
        case starting(waiters: [CheckedContinuation<Void, Never>])
        case running
        case stopped

        var isRunning: Bool { if case .running = self { true } else { false } }
    }

    private let logger: Logger
    private let loop = MainLoopThread()
    private let hub = ReaderHub()
    private let gate = OperationGate()
    private let engine: Engine
    private let lifecycle = Mutex(Lifecycle.created)

    /// Creates the service; nothing runs until ``start()``.
    public init(configuration: Configuration, logger: Logger) {
        self.logger = logger
        self.engine = Engine(logger: logger, hub: hub, loop: loop, scanTimeout: configuration.scanTimeout)
    }

    /// Starts the reader thread, creates the libfprint context, enumerates and opens the readers
    /// present, and starts following hotplug. Returns once the readers present are usable.
    /// Having no reader is not an error. A reader can be started once.
    public func start() async throws {
        let fresh = lifecycle.withLock { state in
            guard case .created = state else { return false }
            state = .starting(waiters: [])
            return true
        }
        guard fresh else { throw FingerprintError(.busy, "the reader service was already started") }
        do {
            try await loop.start()
        } catch {
            finishStarting(as: .stopped)
            hub.finish()
            throw error
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            loop.perform { [engine] in engine.start { continuation.resume() } }
        }
        finishStarting(as: .running)
        logger.debug("fingerprint reader service started", metadata: ["readers": "\(hub.readers.count)"])
    }

    /// Ends `starting`, and lets a `shutdown()` that came meanwhile go on.
    private func finishStarting(as state: Lifecycle) {
        let waiters = lifecycle.withLock { current -> [CheckedContinuation<Void, Never>] in
            guard case .starting(let waiters) = current else { return [] }
            current = state
            return waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Cancels the running operation (and any waiting ones), closes the readers and stops the
    /// thread. Event streams finish. Safe to call more than once, or without `start()`.
    public func shutdown() async {
        // A start under way ends first (its library load cannot be interrupted).
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let startDone = lifecycle.withLock { state -> Bool in
                guard case .starting(let waiters) = state else { return true }
                state = .starting(waiters: waiters + [continuation])
                return false
            }
            if startDone { continuation.resume() }
        }
        let wasRunning = lifecycle.withLock { state in
            defer { state = .stopped }
            return state.isRunning
        }
        guard wasRunning else {
            hub.finish()
            return
        }
        loop.perform { [engine] in engine.beginShutdown() }
        await gate.closeAndDrain(
            failingWaitersWith: FingerprintError(.cancelled, "the reader service is shutting down"))
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            loop.perform { [engine] in engine.whenDeviceIdle { engine.finishShutdown { continuation.resume() } } }
        }
        hub.finish()
        await loop.stop()
        logger.debug("fingerprint reader service stopped")
    }

    /// The usable readers, in discovery order; operations that name no reader use the first.
    public var readers: [ReaderInfo] {
        get async { hub.readers }
    }

    /// Hotplug events. Each access returns a new stream that first yields `.added` for every
    /// reader present at that moment, then every later `.added`/`.removed`, and finishes at
    /// ``shutdown()``.
    public var events: AsyncStream<ReaderEvent> { hub.makeStream() }

    /// Enrols a finger with live progress.
    ///
    /// The stream yields, in order:
    /// 1. when `duplicateGallery` is not empty: on a reader that can identify,
    ///    `.progress(stage: 0, of: N, hint: EnrollHint.checkingForDuplicates)` and then one
    ///    identify touch over the gallery; a match ends the stream with `.duplicate`. On a
    ///    verify-only reader, `.progress(stage: 0, of: N, hint: EnrollHint.duplicatesNotChecked)`
    ///    and enrolment goes on unchecked;
    /// 2. `.progress(stage: 0, of: N, hint: nil)` when the reader waits for the first touch;
    /// 3. `.progress(stage: k, of: N, hint:)` after each touch (`hint` set, `k` unchanged, when
    ///    the touch was rejected: "centre your finger");
    /// 4. `.completed(template:)`, then the stream finishes.
    ///
    /// Readers that detect duplicates themselves may also end the stream with `.duplicate`.
    /// Terminating the stream (or cancelling its consumer) cancels the enrolment.
    public func enroll(
        finger: Finger, username: String, duplicateGallery: [GalleryEntry], reader readerID: String? = nil
    )
        -> AsyncThrowingStream<EnrollEvent, any Error>
    {
        let (stream, continuation) = AsyncThrowingStream.makeStream(of: EnrollEvent.self)
        let task = Task { [self] in
            do {
                let template = try await runOperation(on: readerID) { engine, control, completion in
                    engine.enroll(
                        finger: finger, username: username, duplicateGallery: duplicateGallery, readerID: readerID,
                        control: control, emit: { continuation.yield($0) }, completion: completion)
                }
                continuation.yield(.completed(template: template))
                continuation.finish()
            } catch {
                continuation.finish(throwing: error)
            }
        }
        continuation.onTermination = { _ in task.cancel() }
        return stream
    }

    /// Scans once and compares the touch with `template` (1:1). Returns whether it matched.
    /// `phase` hears `.waitingForReader` (only when another operation holds the reader) and then
    /// `.readyForTouch`, before the scan starts.
    public func verify(
        template: [UInt8], reader readerID: String? = nil, phase: (@Sendable (ScanPhase) async -> Void)? = nil
    ) async throws -> Bool {
        try await runOperation(on: readerID, phase: phase) { engine, control, completion in
            engine.verify(template: template, readerID: readerID, control: control, completion: completion)
        }
    }

    /// Scans once and looks the touch up in `gallery`, tried in the given order (the caller
    /// orders by recency and caps the size) and laid out by `layout`; the first entry above the
    /// match threshold wins. Entries whose template cannot be used on this reader are skipped (and
    /// logged by id). Decoded templates are kept for the next identify with the same layout.
    /// Throws `.notSupported` on readers that cannot identify. `phase` as for ``verify(template:phase:)``.
    public func identify(
        gallery: [GalleryEntry], layout: IdentifyLayout = .full, reader readerID: String? = nil,
        phase: (@Sendable (ScanPhase) async -> Void)? = nil
    ) async throws -> MatchResult {
        try await runOperation(on: readerID, phase: phase) { engine, control, completion in
            engine.identify(
                gallery: gallery, layout: layout, readerID: readerID, control: control, completion: completion)
        }
    }

    /// Deletes the print `template` refers to from the sensor's own storage. A print already
    /// absent counts as deleted. Does nothing on readers without storage.
    public func deleteFromSensor(template: [UInt8], reader readerID: String? = nil) async throws {
        try await runOperation(on: readerID) { engine, control, completion in
            engine.deleteFromSensor(template: template, readerID: readerID, control: control, completion: completion)
        }
    }

    /// The prints stored on the sensor (as templates), for reconciling with the store at start.
    /// Empty on readers without storage; `.notSupported` on storage readers that cannot list.
    /// Compare entries with stored templates using ``isSamePrint(_:_:)``, not byte equality.
    public func sensorPrints(reader readerID: String? = nil) async throws -> [[UInt8]] {
        try await runOperation(on: readerID) { engine, control, completion in
            engine.sensorPrints(readerID: readerID, control: control, completion: completion)
        }
    }

    /// Whether two templates denote the same print for libfprint (same reader and same data;
    /// for storage readers, the same on-sensor record). Needs no touch and no reader.
    public func isSamePrint(_ first: [UInt8], _ second: [UInt8]) async -> Bool {
        guard lifecycle.withLock({ $0.isRunning }) else { return false }
        return await withCheckedContinuation { continuation in
            loop.perform { [engine] in continuation.resume(returning: engine.areSamePrint(first, second)) }
        }
    }

    /// The id of the reader (``ReaderInfo/id``) each template was enrolled on, attached or not;
    /// nil for a template that cannot be decoded. A template is usable only on the reader with
    /// that id. Needs no touch and no reader.
    public func readerIDs(of templates: [[UInt8]]) async -> [String?] {
        guard lifecycle.withLock({ $0.isRunning }), !templates.isEmpty else {
            return templates.map { _ in nil }
        }
        return await withCheckedContinuation { continuation in
            loop.perform { [engine] in continuation.resume(returning: engine.readerIDs(of: templates)) }
        }
    }

    /// Runs one operation on the loop thread, serialised, cancellable from the awaiting task.
    private func runOperation<Value: Sendable>(
        on readerID: String? = nil,
        phase: (@Sendable (ScanPhase) async -> Void)? = nil,
        _ start: @escaping @Sendable (Engine, ScanControl, @escaping Engine.Completion<Value>) -> Void
    ) async throws -> Value {
        try ensureReaderPresent(readerID)
        let notRunning = FingerprintError(.noReader, "the reader service is not running")
        if try !gate.tryAcquire(closedError: notRunning) {
            await phase?(.waitingForReader)
            try await gate.acquire(closedError: notRunning)
        }
        defer { gate.release() }
        try ensureReaderPresent(readerID)
        await phase?(.readyForTouch)
        let control = ScanControl()
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Value, any Error>) in
                loop.perform { [engine] in
                    engine.whenDeviceIdle {
                        start(engine, control) { continuation.resume(with: $0.mapError { $0 as any Error }) }
                    }
                }
            }
        } onCancel: {
            control.cancel(on: loop)
        }
    }

    /// Fails fast, without queueing, when nothing could serve the operation.
    private func ensureReaderPresent(_ readerID: String?) throws {
        guard lifecycle.withLock({ $0.isRunning }) else {
            throw FingerprintError(.noReader, "the reader service is not running")
        }
        let readers = hub.readers
        guard !readers.isEmpty else {
            throw FingerprintError(.noReader, "no fingerprint reader is attached")
        }
        if let readerID, !readers.contains(where: { $0.id == readerID }) {
            throw FingerprintError(.removed, "the fingerprint reader \(readerID) is not attached")
        }
    }
}
