import CFPrint
import Logging

// Discovery, hotplug and shutdown: readers appear, open, vanish and close on the loop thread.

extension Engine {
    /// Creates the context, enumerates, opens what it finds; completes once every device found at
    /// start is open (or failed to open).
    func start(completion: @escaping @Sendable () -> Void) {
        assertOnLoop()
        let context = lib.fp_context_new()!
        self.context = context
        contextHandlers = [
            connectSignal(context, "device-added", deviceAddedHandler, userData: unretained),
            connectSignal(context, "device-removed", contextDeviceRemovedHandler, userData: unretained),
        ]
        startCompletion = completion
        isEnumerating = true
        lib.fp_context_enumerate(context)  // iterates the loop; emits device-added for each device
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

    func deviceAdded(_ device: UnsafeMutablePointer<FpDevice>) {
        guard !isShuttingDown, !readers.contains(where: { $0.device == device }) else { return }
        lib.g_object_ref(device)
        let reader = Reader(device: device)
        reader.handlers = [
            connectSignal(device, "removed", deviceRemovedHandler, userData: unretained),
            connectSignal(device, "notify::finger-status", fingerStatusHandler, userData: unretained),
        ]
        readers.append(reader)
        logger.debug("opening fingerprint reader", metadata: ["reader": "\(reader.info.id)"])
        lib.fp_device_open(
            device, nil, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let opened = lib.fp_device_open_finish(device, result, &error) != 0
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
    func deviceRemoved(_ device: UnsafeMutablePointer<FpDevice>) {
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
    func contextDeviceRemoved(_ device: UnsafeMutablePointer<FpDevice>) {
        readers.first(where: { $0.device == device })?.isRemoved = true
    }

    func fingerStatusChanged(_ device: UnsafeMutablePointer<FpDevice>) {
        guard let scan, scan.reader.device == device else { return }
        scan.observeFingerStatus(.init(rawValue: lib.fp_device_get_finger_status(device).rawValue))
    }

    /// Closes an open reader and forgets it once the close finished.
    private func close(_ reader: Reader) {
        reader.phase = .closing
        lib.fp_device_close(
            reader.device, nil, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                if lib.fp_device_close_finish(reader.device, result, &error) == 0 {
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
        for handler in reader.handlers { lib.g_signal_handler_disconnect(reader.device, handler) }
        reader.handlers = []
        readers.removeAll { $0 === reader }
        lib.g_object_unref(reader.device)
        completeShutdownIfSettled()
    }

    /// Refuses new operations and cancels the running one.
    func beginShutdown() {
        assertOnLoop()
        isShuttingDown = true
        if let scan { lib.g_cancellable_cancel(scan.control.cancellable) }
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
                for handler in reader.handlers { lib.g_signal_handler_disconnect(reader.device, handler) }
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
        for handler in contextHandlers { lib.g_signal_handler_disconnect(context, handler) }
        contextHandlers = []
        if let context { lib.g_object_unref(context) }
        context = nil
        completion()
    }
}
