import CFPrint
import Logging

/// Cancels one operation from any thread, by asking the loop thread to cancel its GCancellable
/// (libfprint's cancel handler touches device state, so it must run there).
final class ScanControl: @unchecked Sendable {
    let cancellable: UnsafeMutablePointer<GCancellable>

    init() {
        cancellable = g_cancellable_new()
    }

    deinit {
        g_object_unref(cancellable)
    }

    func cancel(on loop: MainLoopThread) {
        loop.perform { [self] in g_cancellable_cancel(cancellable) }
    }
}

/// One attached device, open or opening. Loop thread only, like ``Engine``.
final class Reader: @unchecked Sendable {
    let device: UnsafeMutablePointer<FpDevice>
    var info: ReaderInfo
    var handlers: [gulong] = []
    var phase = Phase.opening
    /// The device reported itself gone; it is never used again.
    var isRemoved = false

    /// Where the device is in its life; every reader leaves through `closing` (or a failed open).
    enum Phase { case opening, open, closing }

    init(device: UnsafeMutablePointer<FpDevice>) {
        self.device = device
        self.info = Reader.describe(device)
    }

    var isUsable: Bool { phase == .open && !isRemoved }

    func has(_ feature: FpDeviceFeature) -> Bool {
        fp_device_has_feature(device, feature) != 0
    }

    static func describe(_ device: UnsafeMutablePointer<FpDevice>) -> ReaderInfo {
        let driver = string(from: fp_device_get_driver(device))
        return ReaderInfo(
            id: "\(driver):\(string(from: fp_device_get_device_id(device)))",
            driver: driver,
            name: string(from: fp_device_get_name(device)),
            canIdentify: fp_device_has_feature(device, FP_DEVICE_FEATURE_IDENTIFY) != 0,
            hasStorage: fp_device_has_feature(device, FP_DEVICE_FEATURE_STORAGE) != 0,
            enrollStages: Int(fp_device_get_nr_enroll_stages(device)),
            scanType: fp_device_get_scan_type(device) == FP_SCAN_TYPE_SWIPE ? "swipe" : "press")
    }
}

/// The state of the one scan in flight: its timeout and what the finger did. Loop thread only.
final class ScanState: @unchecked Sendable {
    let reader: Reader
    let control: ScanControl
    let operation: String
    private let timeoutMilliseconds: UInt32
    private var timeoutSource: guint = 0
    private(set) var timedOut = false
    var freshness: TouchFreshness
    /// When the driver first reported a finger on the sensor during this scan.
    private(set) var fingerSeenAt: ContinuousClock.Instant?
    /// The result went to the caller at the driver's match report; the device is still finishing
    /// the operation (image sensors wait for the finger to be lifted).
    var answered = false

    init(reader: Reader, control: ScanControl, operation: String, timeoutMilliseconds: UInt32) {
        self.reader = reader
        self.control = control
        self.operation = operation
        self.timeoutMilliseconds = timeoutMilliseconds
        self.freshness = TouchFreshness(initial: .init(rawValue: fp_device_get_finger_status(reader.device).rawValue))
    }

    /// (Re)starts the per-touch timeout: when it fires the scan is cancelled and reported as
    /// `.timeout`.
    func armTimeout() {
        disarmTimeout()
        timeoutSource = scheduleTimeout(milliseconds: timeoutMilliseconds) { [weak self] in
            guard let self else { return }
            self.timeoutSource = 0
            self.timedOut = true
            g_cancellable_cancel(self.control.cancellable)
        }
    }

    func disarmTimeout() {
        if timeoutSource != 0 {
            g_source_remove(timeoutSource)
            timeoutSource = 0
        }
    }

    func observeFingerStatus(_ status: TouchFreshness.Status) {
        freshness.observe(status)
        if status.contains(.present) && fingerSeenAt == nil { fingerSeenAt = .now }
    }

    /// Milliseconds from the finger reaching the sensor to now (image processing and matching),
    /// for the logs; nil when the driver reports no finger status.
    var millisecondsSinceTouch: Int? {
        fingerSeenAt.map { Int(($0.duration(to: .now) / .milliseconds(1)).rounded()) }
    }

    /// Maps the operation's error, turning our own timeout's cancellation into `.timeout`.
    func failure(_ error: UnsafeMutablePointer<GError>?) -> FingerprintError {
        let mapped = consume(error)
        if mapped.code == .cancelled && timedOut {
            return FingerprintError(.timeout, "no finger was presented within \(timeoutMilliseconds) ms")
        }
        return mapped
    }
}

/// Everything that touches libfprint. Lives on the loop thread: every method must be called
/// there (it is `@unchecked Sendable` only so that closures can carry it to that thread).
final class Engine: @unchecked Sendable {
    typealias Completion<Value> = @Sendable (Result<Value, FingerprintError>) -> Void

    private let logger: Logger
    private let hub: ReaderHub
    private let loop: MainLoopThread
    private let scanTimeoutMilliseconds: UInt32

    private var context: UnsafeMutablePointer<FpContext>?
    private var contextHandlers: [gulong] = []
    private var readers: [Reader] = []
    private var isEnumerating = false
    private var isShuttingDown = false
    private var startCompletion: (@Sendable () -> Void)?
    private var shutdownCompletion: (@Sendable () -> Void)?
    private var scan: ScanState?
    /// Operations waiting for the device to finish one that already answered.
    private var waitingForDevice: [() -> Void] = []

    init(logger: Logger, hub: ReaderHub, loop: MainLoopThread, scanTimeout: Duration) {
        self.logger = logger
        self.hub = hub
        self.loop = loop
        let milliseconds =
            scanTimeout.components.seconds * 1000 + scanTimeout.components.attoseconds / 1_000_000_000_000_000
        self.scanTimeoutMilliseconds = UInt32(clamping: max(1, milliseconds))
    }

    private var unretained: gpointer { Unmanaged.passUnretained(self).toOpaque() }

    fileprivate static func from(_ pointer: gpointer?) -> Engine {
        Unmanaged<Engine>.fromOpaque(pointer!).takeUnretainedValue()
    }

    private func assertOnLoop() {
        assert(loop.isCurrent, "libfprint must only be used on the reader thread")
    }

    /// The reader operations use when they name none: the first usable one, in discovery order.
    private var activeReader: Reader? { readers.first(where: \.isUsable) }

    // MARK: - Discovery and hotplug

    /// Creates the context, enumerates, opens what it finds; completes once every device found at
    /// start is open (or failed to open).
    func start(completion: @escaping @Sendable () -> Void) {
        assertOnLoop()
        let context = fp_context_new()!
        self.context = context
        contextHandlers = [
            connectSignal(context, "device-added", deviceAddedHandler, userData: unretained),
            connectSignal(context, "device-removed", contextDeviceRemovedHandler, userData: unretained),
        ]
        startCompletion = completion
        isEnumerating = true
        fp_context_enumerate(context)  // iterates the loop; emits device-added for each device
        isEnumerating = false
        completeStartIfSettled()
        guard startCompletion != nil else { return }
        // A reader that takes too long to open joins later, like a hotplugged one.
        _ = scheduleTimeout(milliseconds: Self.openGraceMilliseconds) { [self] in
            guard startCompletion != nil else { return }
            logger.warning("fingerprint reader still opening; starting without it")
            startCompletion?()
            startCompletion = nil
        }
    }

    /// How long start waits for the readers found at start to open.
    static let openGraceMilliseconds: UInt32 = 10_000

    private func completeStartIfSettled() {
        guard !isEnumerating, let completion = startCompletion,
            !readers.contains(where: { $0.phase == .opening })
        else { return }
        startCompletion = nil
        completion()
    }

    fileprivate func deviceAdded(_ device: UnsafeMutablePointer<FpDevice>) {
        guard !isShuttingDown, !readers.contains(where: { $0.device == device }) else { return }
        g_object_ref(device)
        let reader = Reader(device: device)
        reader.handlers = [
            connectSignal(device, "removed", deviceRemovedHandler, userData: unretained),
            connectSignal(device, "notify::finger-status", fingerStatusHandler, userData: unretained),
        ]
        readers.append(reader)
        logger.debug("opening fingerprint reader", metadata: ["reader": "\(reader.info.id)"])
        fp_device_open(
            device, nil, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let opened = fp_device_open_finish(device, result, &error) != 0
                if opened && !reader.isRemoved && !isShuttingDown {
                    reader.phase = .open
                    reader.info = Reader.describe(device)  // some drivers settle stages on open
                    logger.info(
                        "fingerprint reader added",
                        metadata: [
                            "reader": "\(reader.info.id)", "name": "\(reader.info.name)",
                            "identify": "\(reader.info.canIdentify)", "storage": "\(reader.info.hasStorage)",
                        ])
                    hub.add(reader.info)
                } else if opened {
                    close(reader)  // removed or shutting down while opening
                } else {
                    let failure = consume(error)
                    logger.warning(
                        "could not open fingerprint reader",
                        metadata: ["reader": "\(reader.info.id)", "error": "\(failure)"])
                    detach(reader)
                }
                completeStartIfSettled()
            }.retainedPointer())
    }

    /// The device reports it is gone (unplugged, or the driver gave up). An operation running on
    /// it has already ended with FP_DEVICE_ERROR_REMOVED; drop the reader and close it.
    fileprivate func deviceRemoved(_ device: UnsafeMutablePointer<FpDevice>) {
        guard let reader = readers.first(where: { $0.device == device }), !reader.isRemoved else { return }
        reader.isRemoved = true
        if reader.phase == .open {
            logger.info("fingerprint reader removed", metadata: ["reader": "\(reader.info.id)"])
            hub.remove(id: reader.info.id)
            close(reader)
        }
    }

    /// The context dropped a device. It does so only after the device reported `removed` (and,
    /// if it was open, after it closed), so the reader is already on its way out; a device still
    /// opening is closed when its open completes.
    fileprivate func contextDeviceRemoved(_ device: UnsafeMutablePointer<FpDevice>) {
        readers.first(where: { $0.device == device })?.isRemoved = true
    }

    fileprivate func fingerStatusChanged(_ device: UnsafeMutablePointer<FpDevice>) {
        guard let scan, scan.reader.device == device else { return }
        scan.observeFingerStatus(.init(rawValue: fp_device_get_finger_status(device).rawValue))
    }

    /// Closes an open reader and forgets it once the close finished.
    private func close(_ reader: Reader) {
        reader.phase = .closing
        fp_device_close(
            reader.device, nil, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                if fp_device_close_finish(reader.device, result, &error) == 0 {
                    // A removed device often fails to close; it is gone either way.
                    logger.debug(
                        "closing fingerprint reader failed",
                        metadata: ["reader": "\(reader.info.id)", "error": "\(consume(error))"])
                }
                detach(reader)
            }.retainedPointer())
    }

    private func detach(_ reader: Reader) {
        guard readers.contains(where: { $0 === reader }) else { return }
        if printCacheDevice == reader.device { clearPrintCache() }
        for handler in reader.handlers { g_signal_handler_disconnect(reader.device, handler) }
        reader.handlers = []
        readers.removeAll { $0 === reader }
        g_object_unref(reader.device)
        completeShutdownIfSettled()
    }

    /// Refuses new operations and cancels the running one.
    func beginShutdown() {
        assertOnLoop()
        isShuttingDown = true
        if let scan { g_cancellable_cancel(scan.control.cancellable) }
    }

    /// Closes every reader and drops the context once no open or close is in flight. Call after
    /// the running operation has ended.
    func finishShutdown(completion: @escaping @Sendable () -> Void) {
        assertOnLoop()
        isShuttingDown = true
        shutdownCompletion = completion
        for reader in readers where reader.phase == .open {
            if !reader.isRemoved { hub.remove(id: reader.info.id) }
            close(reader)
        }
        // Readers still opening are closed by their open callback; closing ones finish by themselves.
        completeShutdownIfSettled()
        guard shutdownCompletion != nil else { return }
        // A driver that never finishes closing must not hold up the daemon's shutdown.
        _ = scheduleTimeout(milliseconds: Self.closeGraceMilliseconds) { [self] in
            guard shutdownCompletion != nil else { return }
            logger.warning(
                "fingerprint readers did not close in time; abandoning them", metadata: ["count": "\(readers.count)"])
            for reader in readers {
                for handler in reader.handlers { g_signal_handler_disconnect(reader.device, handler) }
            }
            readers = []  // their late close callbacks find nothing to detach; the objects leak
            completeShutdownIfSettled()
        }
    }

    /// How long shutdown waits for readers to close.
    static let closeGraceMilliseconds: UInt32 = 5000

    private func completeShutdownIfSettled() {
        guard let completion = shutdownCompletion, readers.isEmpty else { return }
        shutdownCompletion = nil
        clearPrintCache()
        for handler in contextHandlers { g_signal_handler_disconnect(context, handler) }
        contextHandlers = []
        if let context { g_object_unref(context) }
        context = nil
        completion()
    }

    // MARK: - Operations

    private func begin(_ operation: String, on reader: Reader, control: ScanControl) -> ScanState {
        let state = ScanState(
            reader: reader, control: control, operation: operation,
            timeoutMilliseconds: scanTimeoutMilliseconds)
        state.armTimeout()
        scan = state
        logger.debug("\(operation) started", metadata: ["reader": "\(reader.info.id)"])
        return state
    }

    private func end(_ state: ScanState) {
        state.disarmTimeout()
        if scan === state { scan = nil }
        if state.answered { runWaitingForDevice() }
    }

    /// Runs `body` now, or, while an operation that already answered its caller is still
    /// finishing on the device (the finger not lifted yet), once it has finished: libfprint runs
    /// one operation per device at a time. Every operation, and shutdown, starts through here.
    func whenDeviceIdle(_ body: @escaping () -> Void) {
        assertOnLoop()
        if let scan, scan.answered {
            waitingForDevice.append(body)
        } else {
            body()
        }
    }

    private func runWaitingForDevice() {
        let waiting = waitingForDevice
        waitingForDevice = []
        for body in waiting { body() }
    }

    /// The reader to run on (the one with id `id`, or else the first usable one), or why there
    /// is none. A named reader that is no longer attached counts as removed.
    private func readerForOperation(_ id: String?) -> Result<Reader, FingerprintError> {
        if isShuttingDown { return .failure(FingerprintError(.cancelled, "the reader service is shutting down")) }
        if let id {
            guard let reader = readers.first(where: { $0.isUsable && $0.info.id == id }) else {
                return .failure(FingerprintError(.removed, "the fingerprint reader \(id) is not attached"))
            }
            return .success(reader)
        }
        guard let reader = activeReader else {
            return .failure(FingerprintError(.noReader, "no fingerprint reader is attached"))
        }
        return .success(reader)
    }

    /// The id of the reader (``ReaderInfo/id``: driver and device id) each template was enrolled
    /// on, whether or not that reader is attached; nil for a template that cannot be decoded. A
    /// template can be used only on the reader with that id (libfprint's `fp_print_compatible`).
    func readerIDs(of templates: [[UInt8]]) -> [String?] {
        assertOnLoop()
        return templates.map { template in
            guard case .success(let print) = Self.deserialize(template) else { return nil }
            defer { g_object_unref(gpointer(print)) }
            return "\(string(from: fp_print_get_driver(print))):\(string(from: fp_print_get_device_id(print)))"
        }
    }

    /// A deserialised print (a full reference) usable on `reader`.
    private func print(from template: [UInt8], for reader: Reader) -> Result<OpaquePointer, FingerprintError> {
        let print: OpaquePointer
        switch Self.deserialize(template) {
        case .success(let decoded): print = decoded
        case .failure(let error): return .failure(error)
        }
        guard fp_print_compatible(print, reader.device) != 0 else {
            g_object_unref(gpointer(print))
            return .failure(FingerprintError(.invalidTemplate, "template was enrolled on a different reader"))
        }
        return .success(print)
    }

    /// Why a scan that matched must still be refused, if it must.
    private func staleTouch(_ state: ScanState, log: Bool = true) -> FingerprintError? {
        if !state.freshness.reportsFingerStatus && log {
            logger.trace("driver does not report finger status; touch freshness not checked")
        }
        guard !state.freshness.isFresh else { return nil }
        if log {
            logger.notice(
                "\(state.operation): finger was already on the sensor when the scan began; result discarded",
                metadata: ["reader": "\(state.reader.info.id)"])
        }
        return FingerprintError(.fingerAlreadyPresent, FingerprintError.RetryHint.liftFirst)
    }

    func verify(
        template: [UInt8], readerID: String?, control: ScanControl, completion: @escaping Completion<Bool>
    ) {
        assertOnLoop()
        let reader: Reader
        let print: OpaquePointer
        do {
            reader = try readerForOperation(readerID).get()
            print = try self.print(from: template, for: reader).get()
        } catch {
            return completion(.failure(error))
        }
        let state = begin("verify", on: reader, control: control)
        let report = MatchReport { [self] match, error in
            guard error == nil, !state.answered, staleTouch(state, log: false) == nil else { return }
            state.answered = true
            logger.debug(
                "verify finished",
                metadata: [
                    "match": "\(match != nil)",
                    "touch_to_result_ms": "\(state.millisecondsSinceTouch.map(String.init) ?? "-")",
                ])
            completion(.success(match != nil))
        }
        fp_device_verify(
            reader.device, print, control.cancellable, matchReportTrampoline, report.retainedPointer(),
            releaseMatchReport, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var matched: gboolean = 0
                var scanned: OpaquePointer?
                var error: UnsafeMutablePointer<GError>?
                let succeeded = fp_device_verify_finish(reader.device, result, &matched, &scanned, &error) != 0
                if let scanned { g_object_unref(gpointer(scanned)) }
                g_object_unref(gpointer(print))
                end(state)
                if state.answered {
                    // Answered at the match report; the rest (the finger lifted, or not) changes nothing.
                    if let error { g_error_free(error) }
                    return
                }
                guard succeeded else { return completion(.failure(state.failure(error))) }
                if let stale = staleTouch(state) { return completion(.failure(stale)) }
                logger.debug("verify finished", metadata: ["match": "\(matched != 0)"])
                completion(.success(matched != 0))
            }.retainedPointer())
    }

    /// With `answerAtReport`, the result goes to `completion` as soon as libfprint reports it:
    /// image sensors finish the operation only once the finger is lifted, and the person should
    /// not wait for that. The device finishes meanwhile; operations started then wait for it
    /// (``whenDeviceIdle(_:)``).
    func identify(
        gallery: [GalleryEntry], layout: IdentifyLayout = .full, answerAtReport: Bool = true, readerID: String?,
        control: ScanControl, completion: @escaping Completion<MatchResult>
    ) {
        assertOnLoop()
        let reader: Reader
        do {
            reader = try readerForOperation(readerID).get()
        } catch {
            return completion(.failure(error))
        }
        guard reader.info.canIdentify else {
            return completion(.failure(FingerprintError(.notSupported, "this reader cannot identify")))
        }
        let preparing = ContinuousClock.now
        let (entries, firstPass) = galleryPrints(gallery, layout: layout, for: reader)
        let prints = g_ptr_array_new_with_free_func(g_object_unref)!
        for entry in entries { g_ptr_array_add(prints, g_object_ref(gpointer(entry.print))) }
        let prepared = preparing.duration(to: .now)
        let state = begin("identify", on: reader, control: control)
        func result(_ match: OpaquePointer?) -> MatchResult {
            match.flatMap { match in entries.first(where: { $0.print == match })?.id }.map { .match(id: $0) }
                ?? .noMatch
        }
        func logFinished(_ match: OpaquePointer?) {
            // Which pass over the gallery matched (layouts in two passes): how often a person's
            // first-pass impression misses them on this reader.
            let pass = match.flatMap { match in entries.firstIndex { $0.print == match } }.map {
                $0 < firstPass ? 1 : 2
            }
            logger.debug(
                "identify finished",
                metadata: [
                    "gallery": "\(entries.count)", "match": "\(match != nil)",
                    "pass": "\(pass.map(String.init) ?? "-")",
                    "prepare_ms": "\(Int((prepared / .milliseconds(1)).rounded()))",
                    "touch_to_result_ms": "\(state.millisecondsSinceTouch.map(String.init) ?? "-")",
                ])
        }
        let report = MatchReport { [self] match, error in
            guard answerAtReport, error == nil, !state.answered, staleTouch(state, log: false) == nil else { return }
            state.answered = true
            logFinished(match)
            completion(.success(result(match)))
        }
        fp_device_identify(
            reader.device, prints, control.cancellable, matchReportTrampoline, report.retainedPointer(),
            releaseMatchReport, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] asyncResult in
                var match: OpaquePointer?
                var scanned: OpaquePointer?
                var error: UnsafeMutablePointer<GError>?
                let succeeded = fp_device_identify_finish(reader.device, asyncResult, &match, &scanned, &error) != 0
                let outcome = result(match)
                let matched = match
                defer { if let matched { g_object_unref(gpointer(matched)) } }
                if let scanned { g_object_unref(gpointer(scanned)) }
                g_ptr_array_unref(prints)
                end(state)
                if state.answered {
                    // Answered at the match report; the rest (the finger lifted, or not) changes nothing.
                    if let error { g_error_free(error) }
                    return
                }
                if !succeeded {
                    // Storage readers report a finger that is not on the sensor this way.
                    if let error, FingerprintError.isDataNotFound(error) {
                        g_error_free(error)
                    } else {
                        return completion(.failure(state.failure(error)))
                    }
                }
                if let stale = staleTouch(state) { return completion(.failure(stale)) }
                logFinished(matched)
                completion(.success(outcome))
            }.retainedPointer())
    }

    /// Deserialised gallery prints kept between identifies, per layout, keyed by the template
    /// they were made from: a roster that did not change since the last identify costs no
    /// decoding. Each layout keeps only the entries of its latest gallery (a removed finger is
    /// dropped at the next identify); the cache is emptied when the reader changes and at shutdown.
    private var printCache: [String: [[UInt8]: [OpaquePointer]]] = [:]
    private var printCacheDevice: UnsafeMutablePointer<FpDevice>?

    /// `gallery` as libfprint's gallery in trial order: (entry id, print) pairs (borrowed from the
    /// cache), passes of `layout` one after the other, and how many belong to the first pass.
    /// Undecodable or foreign templates are skipped (and logged) rather than failing everyone's
    /// unlock.
    private func galleryPrints(
        _ gallery: [GalleryEntry], layout: IdentifyLayout, for reader: Reader
    ) -> (entries: [(id: String, print: OpaquePointer)], firstPass: Int) {
        if printCacheDevice != reader.device {
            clearPrintCache()
            printCacheDevice = reader.device
        }
        let key = layout.description
        let previous = printCache[key] ?? [:]
        var current: [[UInt8]: [OpaquePointer]] = [:]
        var passes: [[(id: String, print: OpaquePointer)]] = []
        for entry in gallery {
            let pieces: [OpaquePointer]
            if let cached = current[entry.template] ?? previous[entry.template] {
                pieces = cached
            } else {
                var decoded: [OpaquePointer] = []
                var failure: FingerprintError?
                for template in layout.passes(of: entry.template) where failure == nil {
                    switch print(from: template, for: reader) {
                    case .success(let print): decoded.append(print)
                    case .failure(let error): failure = error
                    }
                }
                if let failure {
                    decoded.forEach { g_object_unref(gpointer($0)) }
                    logger.warning(
                        "identify: skipping gallery entry", metadata: ["id": "\(entry.id)", "error": "\(failure)"])
                    continue
                }
                pieces = decoded
            }
            current[entry.template] = pieces
            for (pass, print) in pieces.enumerated() {
                if passes.count <= pass { passes.append([]) }
                passes[pass].append((entry.id, print))
            }
        }
        for (template, pieces) in previous where current[template] == nil {
            pieces.forEach { g_object_unref(gpointer($0)) }
        }
        printCache[key] = current
        return (passes.flatMap { $0 }, passes.first?.count ?? 0)
    }

    private func clearPrintCache() {
        for pieces in printCache.values.flatMap(\.values) {
            pieces.forEach { g_object_unref(gpointer($0)) }
        }
        printCache = [:]
        printCacheDevice = nil
    }

    func enroll(
        finger: Finger, username: String, duplicateGallery: [GalleryEntry], readerID: String?, control: ScanControl,
        emit: @escaping @Sendable (EnrollEvent) -> Void, completion: @escaping Completion<[UInt8]>
    ) {
        assertOnLoop()
        let reader: Reader
        do {
            reader = try readerForOperation(readerID).get()
        } catch {
            return completion(.failure(error))
        }
        let stages = Int(fp_device_get_nr_enroll_stages(reader.device))
        guard !duplicateGallery.isEmpty else {
            return enrollTouches(
                finger: finger, username: username, reader: reader, control: control, emit: emit, completion: completion
            )
        }
        guard reader.info.canIdentify else {
            emit(.progress(stage: 0, of: stages, hint: EnrollHint.duplicatesNotChecked))
            return enrollTouches(
                finger: finger, username: username, reader: reader, control: control, emit: emit, completion: completion
            )
        }
        emit(.progress(stage: 0, of: stages, hint: EnrollHint.checkingForDuplicates))
        // The enrolment touches follow on the device: take the result when the operation ends.
        identify(gallery: duplicateGallery, answerAtReport: false, readerID: reader.info.id, control: control) {
            [self] result in
            switch result {
            case .success(.match(let id)):
                logger.notice("enroll refused: finger already enrolled", metadata: ["finger": "\(finger.rawValue)"])
                var error = FingerprintError(.duplicate, "this finger is already enrolled")
                error.matchedID = id
                completion(.failure(error))
            case .success(.noMatch):
                enrollTouches(
                    finger: finger, username: username, reader: reader, control: control, emit: emit,
                    completion: completion)
            case .failure(let error):
                completion(.failure(error))
            }
        }
    }

    private func enrollTouches(
        finger: Finger, username: String, reader: Reader, control: ScanControl,
        emit: @escaping @Sendable (EnrollEvent) -> Void, completion: @escaping Completion<[UInt8]>
    ) {
        guard reader.isUsable, !isShuttingDown else {
            return completion(.failure(FingerprintError(.removed, "the reader went away before enrolment")))
        }
        let stages = Int(fp_device_get_nr_enroll_stages(reader.device))
        let template = fp_print_new(reader.device)  // floating; fp_device_enroll sinks it
        fp_print_set_finger(template, finger.fpFinger)
        fp_print_set_username(template, username)
        let state = begin("enroll", on: reader, control: control)
        emit(.progress(stage: 0, of: stages, hint: nil))
        let progress = CallbackBox<(Int, UnsafeMutablePointer<GError>?)> { stage, error in
            state.armTimeout()  // each touch gets the full timeout
            let hint = error.map { FingerprintError(gError: $0).message }
            emit(.progress(stage: stage, of: stages, hint: hint))
        }
        fp_device_enroll(
            reader.device, template, control.cancellable, enrollProgressTrampoline,
            progress.retainedPointer(), releaseProgressBox, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let print = fp_device_enroll_finish(reader.device, result, &error)
                end(state)
                guard let print else { return completion(.failure(state.failure(error))) }
                defer { g_object_unref(gpointer(print)) }
                logger.info("enroll finished", metadata: ["finger": "\(finger.rawValue)"])
                completion(serialize(print))
            }.retainedPointer())
    }

    func deleteFromSensor(
        template: [UInt8], readerID: String?, control: ScanControl, completion: @escaping Completion<Void>
    ) {
        assertOnLoop()
        let reader: Reader
        do {
            reader = try readerForOperation(readerID).get()
        } catch {
            return completion(.failure(error))
        }
        guard reader.info.hasStorage else { return completion(.success(())) }
        guard reader.has(FP_DEVICE_FEATURE_STORAGE_DELETE) else {
            return completion(.failure(FingerprintError(.notSupported, "this reader cannot delete stored prints")))
        }
        let print: OpaquePointer
        do {
            print = try self.print(from: template, for: reader).get()
        } catch {
            return completion(.failure(error))
        }
        let state = begin("delete", on: reader, control: control)
        fp_device_delete_print(
            reader.device, print, control.cancellable, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let succeeded = fp_device_delete_print_finish(reader.device, result, &error) != 0
                g_object_unref(gpointer(print))
                end(state)
                if succeeded { return completion(.success(())) }
                if let error, FingerprintError.isDataNotFound(error) {
                    g_error_free(error)
                    return completion(.success(()))  // already gone: the goal is reached
                }
                completion(.failure(state.failure(error)))
            }.retainedPointer())
    }

    func sensorPrints(readerID: String?, control: ScanControl, completion: @escaping Completion<[[UInt8]]>) {
        assertOnLoop()
        let reader: Reader
        do {
            reader = try readerForOperation(readerID).get()
        } catch {
            return completion(.failure(error))
        }
        guard reader.info.hasStorage else { return completion(.success([])) }
        guard reader.has(FP_DEVICE_FEATURE_STORAGE_LIST) else {
            return completion(.failure(FingerprintError(.notSupported, "this reader cannot list stored prints")))
        }
        let state = begin("list", on: reader, control: control)
        fp_device_list_prints(
            reader.device, control.cancellable, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let list = fp_device_list_prints_finish(reader.device, result, &error)
                end(state)
                guard let list else { return completion(.failure(state.failure(error))) }
                defer { g_ptr_array_unref(list) }
                var templates: [[UInt8]] = []
                for index in 0..<Int(list.pointee.len) {
                    switch serialize(OpaquePointer(list.pointee.pdata[index]!)) {
                    case .success(let bytes): templates.append(bytes)
                    case .failure(let error): return completion(.failure(error))
                    }
                }
                completion(.success(templates))
            }.retainedPointer())
    }

    /// Whether two templates denote the same print (libfprint's `fp_print_equal`).
    func areSamePrint(_ first: [UInt8], _ second: [UInt8]) -> Bool {
        assertOnLoop()
        guard case .success(let a) = Self.deserialize(first) else { return false }
        defer { g_object_unref(gpointer(a)) }
        guard case .success(let b) = Self.deserialize(second) else { return false }
        defer { g_object_unref(gpointer(b)) }
        return fp_print_equal(a, b) != 0
    }

    /// `fp_print_deserialize`, which asserts (aborting the process) on input shorter than its
    /// magic, so that is checked here first. Returns a full reference.
    private static func deserialize(_ template: [UInt8]) -> Result<OpaquePointer, FingerprintError> {
        guard template.count > 3, template.starts(with: Array("FP3".utf8)) else {
            return .failure(FingerprintError(.invalidTemplate, "not a libfprint template"))
        }
        var error: UnsafeMutablePointer<GError>?
        let print = template.withUnsafeBufferPointer { bytes in
            fp_print_deserialize(bytes.baseAddress, gsize(bytes.count), &error)
        }
        guard let print else {
            return .failure(FingerprintError(.invalidTemplate, "template cannot be decoded: \(consume(error).message)"))
        }
        return .success(print)
    }

    private func serialize(_ print: OpaquePointer) -> Result<[UInt8], FingerprintError> {
        var data: UnsafeMutablePointer<guchar>?
        var length: gsize = 0
        var error: UnsafeMutablePointer<GError>?
        guard fp_print_serialize(print, &data, &length, &error) != 0, let data else {
            return .failure(consume(error))
        }
        defer { g_free(data) }
        return .success(Array(UnsafeBufferPointer(start: data, count: Int(length))))
    }
}

// MARK: - C callbacks (user data: the Engine, unretained; it outlives every connection)

private let deviceAddedHandler:
    @convention(c) (UnsafeMutablePointer<FpContext>?, UnsafeMutablePointer<FpDevice>?, gpointer?) -> Void = {
        _, device, engine in Engine.from(engine).deviceAdded(device!)
    }

private let contextDeviceRemovedHandler:
    @convention(c) (UnsafeMutablePointer<FpContext>?, UnsafeMutablePointer<FpDevice>?, gpointer?) -> Void = {
        _, device, engine in Engine.from(engine).contextDeviceRemoved(device!)
    }

private let deviceRemovedHandler: @convention(c) (UnsafeMutablePointer<FpDevice>?, gpointer?) -> Void = {
    device, engine in Engine.from(engine).deviceRemoved(device!)
}

private let fingerStatusHandler: @convention(c) (gpointer?, gpointer?, gpointer?) -> Void = {
    device, _, engine in
    Engine.from(engine).fingerStatusChanged(device!.assumingMemoryBound(to: FpDevice.self))
}

/// A match report (verify, identify): the matching gallery print, if any, and the error that
/// accompanies a rejected touch. Both are borrowed.
typealias MatchReport = CallbackBox<(OpaquePointer?, UnsafeMutablePointer<GError>?)>

private let matchReportTrampoline: FpMatchCb = { _, match, _, box, error in
    MatchReport.borrow(box).body((match, error))
}

private let releaseMatchReport: GDestroyNotify = { pointer in
    Unmanaged<MatchReport>.fromOpaque(pointer!).release()
}

private let enrollProgressTrampoline: FpEnrollProgress = { _, stage, _, box, error in
    CallbackBox<(Int, UnsafeMutablePointer<GError>?)>.borrow(box).body((Int(stage), error))
}

private let releaseProgressBox: GDestroyNotify = { pointer in
    Unmanaged<CallbackBox<(Int, UnsafeMutablePointer<GError>?)>>.fromOpaque(pointer!).release()
}

extension Finger {
    var fpFinger: FpFinger {
        switch self {
        case .leftThumb: FP_FINGER_LEFT_THUMB
        case .leftIndex: FP_FINGER_LEFT_INDEX
        case .leftMiddle: FP_FINGER_LEFT_MIDDLE
        case .leftRing: FP_FINGER_LEFT_RING
        case .leftLittle: FP_FINGER_LEFT_LITTLE
        case .rightThumb: FP_FINGER_RIGHT_THUMB
        case .rightIndex: FP_FINGER_RIGHT_INDEX
        case .rightMiddle: FP_FINGER_RIGHT_MIDDLE
        case .rightRing: FP_FINGER_RIGHT_RING
        case .rightLittle: FP_FINGER_RIGHT_LITTLE
        }
    }
}
