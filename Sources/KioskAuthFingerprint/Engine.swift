import CFPrint
import Logging

/// Cancels one operation from any thread, by asking the loop thread to cancel its GCancellable
/// (libfprint's cancel handler touches device state, so it must run there).
final class ScanControl: @unchecked Sendable {
    let cancellable: UnsafeMutablePointer<GCancellable>

    init() {
        cancellable = lib.g_cancellable_new()!
    }

    deinit {
        lib.g_object_unref(cancellable)
    }

    func cancel(on loop: MainLoopThread) {
        loop.perform { [self] in lib.g_cancellable_cancel(cancellable) }
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
        lib.fp_device_has_feature(device, feature) != 0
    }

    static func describe(_ device: UnsafeMutablePointer<FpDevice>) -> ReaderInfo {
        let driver = string(from: lib.fp_device_get_driver(device))
        return ReaderInfo(
            id: "\(driver):\(string(from: lib.fp_device_get_device_id(device)))",
            driver: driver,
            name: string(from: lib.fp_device_get_name(device)),
            canIdentify: lib.fp_device_has_feature(device, FP_DEVICE_FEATURE_IDENTIFY) != 0,
            hasStorage: lib.fp_device_has_feature(device, FP_DEVICE_FEATURE_STORAGE) != 0,
            enrollStages: Int(lib.fp_device_get_nr_enroll_stages(device)),
            scanType: lib.fp_device_get_scan_type(device) == FP_SCAN_TYPE_SWIPE ? "swipe" : "press")
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
        self.freshness = TouchFreshness(
            initial: .init(rawValue: lib.fp_device_get_finger_status(reader.device).rawValue))
    }

    /// (Re)starts the per-touch timeout: when it fires the scan is cancelled and reported as
    /// `.timeout`.
    func armTimeout() {
        disarmTimeout()
        timeoutSource = scheduleTimeout(milliseconds: timeoutMilliseconds) { [weak self] in
            guard let self else { return }
            self.timeoutSource = 0
            self.timedOut = true
            lib.g_cancellable_cancel(self.control.cancellable)
        }
    }

    func disarmTimeout() {
        if timeoutSource != 0 {
            lib.g_source_remove(timeoutSource)
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

    let logger: Logger
    let hub: ReaderHub
    let loop: MainLoopThread
    let scanTimeoutMilliseconds: UInt32

    var context: UnsafeMutablePointer<FpContext>?
    var contextHandlers: [gulong] = []
    var readers: [Reader] = []
    var isEnumerating = false
    var isShuttingDown = false
    var startCompletion: (@Sendable () -> Void)?
    var shutdownCompletion: (@Sendable () -> Void)?
    var scan: ScanState?
    /// Operations waiting for the device to finish one that already answered.
    var waitingForDevice: [() -> Void] = []

    init(logger: Logger, hub: ReaderHub, loop: MainLoopThread, scanTimeout: Duration) {
        self.logger = logger
        self.hub = hub
        self.loop = loop
        let milliseconds =
            scanTimeout.components.seconds * 1000 + scanTimeout.components.attoseconds / 1_000_000_000_000_000
        self.scanTimeoutMilliseconds = UInt32(clamping: max(1, milliseconds))
    }

    var unretained: gpointer { Unmanaged.passUnretained(self).toOpaque() }

    static func from(_ pointer: gpointer?) -> Engine {
        Unmanaged<Engine>.fromOpaque(pointer!).takeUnretainedValue()
    }

    func assertOnLoop() {
        assert(loop.isCurrent, "libfprint must only be used on the reader thread")
    }

    /// The reader operations use when they name none: the first usable one, in discovery order.
    var activeReader: Reader? { readers.first(where: \.isUsable) }

    /// Deserialised gallery prints kept between identifies, per layout, keyed by the template
    /// they were made from: a roster that did not change since the last identify costs no
    /// decoding. Each layout keeps only the entries of its latest gallery (a removed finger is
    /// dropped at the next identify); the cache is emptied when the reader changes and at shutdown.
    var printCache: [String: [[UInt8]: [OpaquePointer]]] = [:]
    var printCacheDevice: UnsafeMutablePointer<FpDevice>?
}
