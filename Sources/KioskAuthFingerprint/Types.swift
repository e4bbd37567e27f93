/// A named finger, spelled the way users, the CLI and the socket API spell it (`right-index`).
public enum Finger: String, CaseIterable, Codable, Sendable {
    /// The left thumb.
    case leftThumb = "left-thumb"
    /// The left index finger.
    case leftIndex = "left-index"
    /// The left middle finger.
    case leftMiddle = "left-middle"
    /// The left ring finger.
    case leftRing = "left-ring"
    /// The left little finger.
    case leftLittle = "left-little"
    /// The right thumb.
    case rightThumb = "right-thumb"
    /// The right index finger.
    case rightIndex = "right-index"
    /// The right middle finger.
    case rightMiddle = "right-middle"
    /// The right ring finger.
    case rightRing = "right-ring"
    /// The right little finger.
    case rightLittle = "right-little"
}

/// Where a verify or identify stands before its touch: queued behind another operation, or owning
/// the reader (a touch now is its touch). Reported to the caller so that it prompts for a finger
/// only once the touch can be its own.
public enum ScanPhase: Sendable, Equatable {
    /// Another operation holds the reader; this one waits its turn.
    case waitingForReader
    /// This operation owns the reader and waits for a finger.
    case readyForTouch
}

/// What the daemon needs to know about one attached reader.
public struct ReaderInfo: Sendable, Codable, Equatable {
    /// Identifies the reader among those attached now: its driver and libfprint's device id.
    public var id: String
    /// The libfprint driver, e.g. `virtual_image` or `synaptics`.
    public var driver: String
    /// The human-readable device name reported by the driver.
    public var name: String
    /// Whether the reader can match one touch against a gallery (identify; duplicate checks).
    public var canIdentify: Bool
    /// Whether the reader keeps templates on the sensor (the template bytes only refer to them).
    public var hasStorage: Bool
    /// How many touches an enrolment takes.
    public var enrollStages: Int
    /// `"press"` or `"swipe"`: how the user presents a finger.
    public var scanType: String

    /// Creates a description of a reader.
    public init(
        id: String, driver: String, name: String, canIdentify: Bool, hasStorage: Bool,
        enrollStages: Int, scanType: String
    ) {
        self.id = id
        self.driver = driver
        self.name = name
        self.canIdentify = canIdentify
        self.hasStorage = hasStorage
        self.enrollStages = enrollStages
        self.scanType = scanType
    }
}

/// One step of an enrolment, as streamed by ``FingerprintReader/enroll(finger:username:duplicateGallery:)``.
public enum EnrollEvent: Sendable {
    /// `stage` of `of` touches have been accepted; `hint` tells the user what to do next when the
    /// last touch was rejected or before a special touch (see ``EnrollHint``).
    case progress(stage: Int, of: Int, hint: String?)
    /// Enrolment finished; `template` is the `fp_print_serialize` form of the new print. It is
    /// biometric data: seal it, never log it.
    case completed(template: [UInt8])
}

/// Fixed hints that ``FingerprintReader/enroll(finger:username:duplicateGallery:)`` sends before
/// the first enrolment touch, so that callers can recognise them rather than parse text.
public enum EnrollHint {
    /// Sent (as `.progress(stage: 0, …)`) when the next touch is the identify touch that checks the
    /// finger is not already enrolled.
    public static let checkingForDuplicates = "touch the reader to check this finger is not already enrolled"
    /// Sent (as `.progress(stage: 0, …)`) when the reader cannot identify, so a finger enrolled to
    /// someone else cannot be detected. Enrolment proceeds.
    public static let duplicatesNotChecked = "this reader cannot check whether the finger is already enrolled"
}

/// One enrolled print offered to identify or to the duplicate check.
public struct GalleryEntry: Sendable {
    /// The caller's identifier for this print, returned in ``MatchResult/match(id:)``.
    public var id: String
    /// The `fp_print_serialize` bytes of the print.
    public var template: [UInt8]

    /// Creates a gallery entry.
    public init(id: String, template: [UInt8]) {
        self.id = id
        self.template = template
    }
}

/// The outcome of one identify touch.
public enum MatchResult: Sendable, Equatable {
    /// The touch matched the gallery entry with this id (the first one above threshold).
    case match(id: String)
    /// The touch matched no gallery entry.
    case noMatch
}

/// A reader appearing or disappearing.
public enum ReaderEvent: Sendable, Equatable {
    /// A reader was found and opened; it is usable now.
    case added(ReaderInfo)
    /// The reader with this id was unplugged or failed; an operation running on it has ended
    /// with ``FingerprintError/Code-swift.enum/removed``.
    case removed(id: String)
}
