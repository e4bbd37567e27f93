import CFPrint
import Testing

@testable import KioskAuthFingerprint

/// The one GError → FingerprintError mapping, and the fresh-touch rule, without a device.
struct MappingTests {
    init() throws { try loadLibfprint() }

    private static func map(_ domain: GQuark, _ code: Int32) -> FingerprintError {
        let error = lib.g_error_new_literal(domain, code, "from libfprint")!
        defer { lib.g_error_free(error) }
        return FingerprintError(gError: error)
    }

    @Test(
        arguments: [
            (FP_DEVICE_RETRY_GENERAL, "poor scan, please try again"),
            (FP_DEVICE_RETRY_TOO_SHORT, "swipe too short, please try again"),
            (FP_DEVICE_RETRY_CENTER_FINGER, "centre your finger on the reader"),
            (FP_DEVICE_RETRY_REMOVE_FINGER, "remove your finger and try again"),
        ])
    func retryErrors_becomeRetryWithAHint(code: FpDeviceRetry, hint: String) {
        let error = Self.map(lib.fp_device_retry_quark(), Int32(code.rawValue))
        #expect(error.code == .retry)
        #expect(error.message == hint)
    }

    @Test(
        arguments: [
            (FP_DEVICE_ERROR_GENERAL, FingerprintError.Code.deviceFailure),
            (FP_DEVICE_ERROR_NOT_SUPPORTED, .notSupported),
            (FP_DEVICE_ERROR_NOT_OPEN, .noReader),
            (FP_DEVICE_ERROR_BUSY, .busy),
            (FP_DEVICE_ERROR_PROTO, .deviceFailure),
            (FP_DEVICE_ERROR_DATA_INVALID, .invalidTemplate),
            (FP_DEVICE_ERROR_DATA_NOT_FOUND, .invalidTemplate),
            (FP_DEVICE_ERROR_DATA_FULL, .dataFull),
            (FP_DEVICE_ERROR_DATA_DUPLICATE, .duplicate),
            (FP_DEVICE_ERROR_REMOVED, .removed),
            (FP_DEVICE_ERROR_TOO_HOT, .tooHot),
        ])
    func deviceErrors_mapToOneCodeEach(code: FpDeviceError, expected: FingerprintError.Code) {
        let error = Self.map(lib.fp_device_error_quark(), Int32(code.rawValue))
        #expect(error.code == expected)
        if expected != .retry { #expect(error.message == "from libfprint") }
    }

    @Test func ioErrors_cancelledAndTimedOut() {
        #expect(Self.map(lib.g_io_error_quark(), Int32(G_IO_ERROR_CANCELLED.rawValue)).code == .cancelled)
        #expect(Self.map(lib.g_io_error_quark(), Int32(G_IO_ERROR_TIMED_OUT.rawValue)).code == .timeout)
        #expect(Self.map(lib.g_io_error_quark(), Int32(G_IO_ERROR_PERMISSION_DENIED.rawValue)).code == .deviceFailure)
        #expect(Self.map(lib.g_quark_from_string("elsewhere"), 1).code == .deviceFailure)
    }

    @Test func fingerPlacedAfterTheReaderWaited_isFresh() {
        var touch = TouchFreshness(initial: [])
        touch.observe(.needed)
        touch.observe([.needed, .present])
        touch.observe(.present)
        touch.observe([])
        #expect(touch.isFresh)
        #expect(touch.reportsFingerStatus)
    }

    @Test func fingerPresentBeforeTheReaderWaited_isStale() {
        var touch = TouchFreshness(initial: [])
        touch.observe(.present)
        touch.observe([.needed, .present])
        touch.observe(.present)
        #expect(!touch.isFresh)

        var resting = TouchFreshness(initial: .present)
        resting.observe(.needed)  // lifting later does not make the first report fresh
        #expect(!resting.isFresh)
    }

    @Test func driverWithoutFingerStatus_isAcceptedButFlagged() {
        let touch = TouchFreshness(initial: [])
        #expect(touch.isFresh)
        #expect(!touch.reportsFingerStatus)
    }
}
