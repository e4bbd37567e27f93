import CFPrint
import Logging

// The reader operations: verify, identify (with its gallery cache), enroll, delete from and list
// the sensor's storage, and print (de)serialisation. One runs at a time, on the loop thread.

extension Engine {
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
            defer { lib.g_object_unref(gpointer(print)) }
            return "\(string(from: lib.fp_print_get_driver(print))):\(string(from: lib.fp_print_get_device_id(print)))"
        }
    }

    /// A deserialised print (a full reference) usable on `reader`.
    private func print(from template: [UInt8], for reader: Reader) -> Result<OpaquePointer, FingerprintError> {
        let print: OpaquePointer
        switch Self.deserialize(template) {
        case .success(let decoded): print = decoded
        case .failure(let error): return .failure(error)
        }
        guard lib.fp_print_compatible(print, reader.device) != 0 else {
            lib.g_object_unref(gpointer(print))
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
        lib.fp_device_verify(
            reader.device, print, control.cancellable, matchReportTrampoline, report.retainedPointer(),
            releaseMatchReport, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var matched: gboolean = 0
                var scanned: OpaquePointer?
                var error: UnsafeMutablePointer<GError>?
                let succeeded = lib.fp_device_verify_finish(reader.device, result, &matched, &scanned, &error) != 0
                if let scanned { lib.g_object_unref(gpointer(scanned)) }
                lib.g_object_unref(gpointer(print))
                end(state)
                if state.answered {
                    // Answered at the match report; the rest (the finger lifted, or not) changes nothing.
                    if let error { lib.g_error_free(error) }
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
        let prints = lib.g_ptr_array_new_with_free_func(lib.g_object_unref)!
        for entry in entries { lib.g_ptr_array_add(prints, lib.g_object_ref(gpointer(entry.print))) }
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
        lib.fp_device_identify(
            reader.device, prints, control.cancellable, matchReportTrampoline, report.retainedPointer(),
            releaseMatchReport, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] asyncResult in
                var match: OpaquePointer?
                var scanned: OpaquePointer?
                var error: UnsafeMutablePointer<GError>?
                let succeeded = lib.fp_device_identify_finish(reader.device, asyncResult, &match, &scanned, &error) != 0
                let outcome = result(match)
                let matched = match
                defer { if let matched { lib.g_object_unref(gpointer(matched)) } }
                if let scanned { lib.g_object_unref(gpointer(scanned)) }
                lib.g_ptr_array_unref(prints)
                end(state)
                if state.answered {
                    // Answered at the match report; the rest (the finger lifted, or not) changes nothing.
                    if let error { lib.g_error_free(error) }
                    return
                }
                if !succeeded {
                    // Storage readers report a finger that is not on the sensor this way.
                    if let error, FingerprintError.isDataNotFound(error) {
                        lib.g_error_free(error)
                    } else {
                        return completion(.failure(state.failure(error)))
                    }
                }
                if let stale = staleTouch(state) { return completion(.failure(stale)) }
                logFinished(matched)
                completion(.success(outcome))
            }.retainedPointer())
    }

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
                    decoded.forEach { lib.g_object_unref(gpointer($0)) }
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
            pieces.forEach { lib.g_object_unref(gpointer($0)) }
        }
        printCache[key] = current
        return (passes.flatMap { $0 }, passes.first?.count ?? 0)
    }

    func clearPrintCache() {
        for pieces in printCache.values.flatMap(\.values) {
            pieces.forEach { lib.g_object_unref(gpointer($0)) }
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
        let stages = Int(lib.fp_device_get_nr_enroll_stages(reader.device))
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
        let stages = Int(lib.fp_device_get_nr_enroll_stages(reader.device))
        let template = lib.fp_print_new(reader.device)  // floating; fp_device_enroll sinks it
        lib.fp_print_set_finger(template, finger.fpFinger)
        lib.fp_print_set_username(template, username)
        let state = begin("enroll", on: reader, control: control)
        emit(.progress(stage: 0, of: stages, hint: nil))
        let progress = CallbackBox<(Int, UnsafeMutablePointer<GError>?)> { stage, error in
            state.armTimeout()  // each touch gets the full timeout
            let hint = error.map { FingerprintError(gError: $0).message }
            emit(.progress(stage: stage, of: stages, hint: hint))
        }
        lib.fp_device_enroll(
            reader.device, template, control.cancellable, enrollProgressTrampoline,
            progress.retainedPointer(), releaseProgressBox, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let print = lib.fp_device_enroll_finish(reader.device, result, &error)
                end(state)
                guard let print else { return completion(.failure(state.failure(error))) }
                defer { lib.g_object_unref(gpointer(print)) }
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
        lib.fp_device_delete_print(
            reader.device, print, control.cancellable, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let succeeded = lib.fp_device_delete_print_finish(reader.device, result, &error) != 0
                lib.g_object_unref(gpointer(print))
                end(state)
                if succeeded { return completion(.success(())) }
                if let error, FingerprintError.isDataNotFound(error) {
                    lib.g_error_free(error)
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
        lib.fp_device_list_prints(
            reader.device, control.cancellable, asyncReadyTrampoline,
            CallbackBox<OpaquePointer?> { [self] result in
                var error: UnsafeMutablePointer<GError>?
                let list = lib.fp_device_list_prints_finish(reader.device, result, &error)
                end(state)
                guard let list else { return completion(.failure(state.failure(error))) }
                defer { lib.g_ptr_array_unref(list) }
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
        defer { lib.g_object_unref(gpointer(a)) }
        guard case .success(let b) = Self.deserialize(second) else { return false }
        defer { lib.g_object_unref(gpointer(b)) }
        return lib.fp_print_equal(a, b) != 0
    }

    /// `fp_print_deserialize`, which asserts (aborting the process) on input shorter than its
    /// magic, so that is checked here first. Returns a full reference.
    private static func deserialize(_ template: [UInt8]) -> Result<OpaquePointer, FingerprintError> {
        guard template.count > 3, template.starts(with: Array("FP3".utf8)) else {
            return .failure(FingerprintError(.invalidTemplate, "not a libfprint template"))
        }
        var error: UnsafeMutablePointer<GError>?
        let print = template.withUnsafeBufferPointer { bytes in
            lib.fp_print_deserialize(bytes.baseAddress, gsize(bytes.count), &error)
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
        guard lib.fp_print_serialize(print, &data, &length, &error) != 0, let data else {
            return .failure(consume(error))
        }
        defer { lib.g_free(data) }
        return .success(Array(UnsafeBufferPointer(start: data, count: Int(length))))
    }
}
