import CFPrint

/// Why a fingerprint operation did not produce a result.
///
/// Every `GError` libfprint reports is turned into one of these in exactly one place
/// (`init(gError:)`), so callers switch over ``Code-swift.enum`` and never see GLib.
public struct FingerprintError: Error, Sendable, CustomStringConvertible {
    /// The kind of failure; each maps to one named error of the socket API.
    public var code: Code
    /// A short explanation. For ``Code-swift.enum/retry`` it is the hint to show the user
    /// ("centre your finger").
    public var message: String
    /// The source file that raised the error.
    public var file: String
    /// The source line that raised the error.
    public var line: Int
    /// For ``Code-swift.enum/duplicate`` found by the identify touch: the id of the gallery entry
    /// the touch matched (``GalleryEntry/id``); nil when the sensor itself refused the print.
    public var matchedID: String?

    /// The kinds of failure.
    public enum Code: String, Sendable {
        /// No reader is attached (or the reader service is not running).
        case noReader
        /// The reader is busy with another request.
        case busy
        /// The reader was unplugged during the operation.
        case removed
        /// The touch was not usable; `message` says what to do, then try again.
        case retry
        /// The reader disabled itself to avoid overheating; try again later.
        case tooHot
        /// The reader's on-sensor storage is full.
        case dataFull
        /// The finger is already enrolled (found by the identify touch or by the sensor itself).
        case duplicate
        /// No finger was presented within the scan timeout.
        case timeout
        /// The operation was cancelled by the caller (or by shutdown).
        case cancelled
        /// The scan began with a finger already on the sensor, so it is not a fresh touch.
        case fingerAlreadyPresent
        /// The reader does not support the operation.
        case notSupported
        /// A template could not be decoded or belongs to another reader.
        case invalidTemplate
        /// Any other device or driver failure.
        case deviceFailure
    }

    /// Creates an error.
    public init(_ code: Code, _ message: String, file: String = #fileID, line: Int = #line) {
        self.code = code
        self.message = message
        self.file = file
        self.line = line
    }

    /// `code: message`.
    public var description: String { "\(code.rawValue): \(message)" }
}

extension FingerprintError {
    /// Hints for touches the reader rejected, worded for the person at the reader.
    enum RetryHint {
        static let general = "poor scan, please try again"
        static let tooShort = "swipe too short, please try again"
        static let centreFinger = "centre your finger on the reader"
        static let removeFinger = "remove your finger and try again"
        static let liftFirst = "lift your finger, then touch the reader again"
    }

    /// The single mapping from libfprint's and GIO's `GError`s to ``FingerprintError``.
    init(gError error: UnsafePointer<GError>, file: String = #fileID, line: Int = #line) {
        let domain = error.pointee.domain
        let code = error.pointee.code
        let text = error.pointee.message.map { String(cString: $0) } ?? "unknown error"
        let mapped: (Code, String)
        if domain == lib.fp_device_retry_quark() {
            switch FpDeviceRetry(rawValue: UInt32(bitPattern: code)) {
            case FP_DEVICE_RETRY_TOO_SHORT: mapped = (.retry, RetryHint.tooShort)
            case FP_DEVICE_RETRY_CENTER_FINGER: mapped = (.retry, RetryHint.centreFinger)
            case FP_DEVICE_RETRY_REMOVE_FINGER: mapped = (.retry, RetryHint.removeFinger)
            default: mapped = (.retry, RetryHint.general)
            }
        } else if domain == lib.fp_device_error_quark() {
            switch FpDeviceError(rawValue: UInt32(bitPattern: code)) {
            case FP_DEVICE_ERROR_NOT_SUPPORTED: mapped = (.notSupported, text)
            case FP_DEVICE_ERROR_NOT_OPEN: mapped = (.noReader, text)
            case FP_DEVICE_ERROR_BUSY: mapped = (.busy, text)
            case FP_DEVICE_ERROR_DATA_INVALID, FP_DEVICE_ERROR_DATA_NOT_FOUND:
                mapped = (.invalidTemplate, text)
            case FP_DEVICE_ERROR_DATA_FULL: mapped = (.dataFull, text)
            case FP_DEVICE_ERROR_DATA_DUPLICATE: mapped = (.duplicate, text)
            case FP_DEVICE_ERROR_REMOVED: mapped = (.removed, text)
            case FP_DEVICE_ERROR_TOO_HOT: mapped = (.tooHot, text)
            default: mapped = (.deviceFailure, text)
            }
        } else if domain == lib.g_io_error_quark() {
            switch GIOErrorEnum(rawValue: UInt32(bitPattern: code)) {
            case G_IO_ERROR_CANCELLED: mapped = (.cancelled, text)
            case G_IO_ERROR_TIMED_OUT: mapped = (.timeout, text)
            case G_IO_ERROR_BUSY: mapped = (.busy, text)
            case G_IO_ERROR_NOT_SUPPORTED: mapped = (.notSupported, text)
            default: mapped = (.deviceFailure, text)
            }
        } else {
            mapped = (.deviceFailure, text)
        }
        self.init(mapped.0, mapped.1, file: file, line: line)
    }

    /// Whether `error` is libfprint's "print not on the sensor", which identify and delete treat
    /// as an answer rather than a failure.
    static func isDataNotFound(_ error: UnsafePointer<GError>) -> Bool {
        error.pointee.domain == lib.fp_device_error_quark()
            && UInt32(bitPattern: error.pointee.code) == FP_DEVICE_ERROR_DATA_NOT_FOUND.rawValue
    }
}
