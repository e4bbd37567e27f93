/// A passcode refused when it was set, with the reason a person can act on.
public struct WeakPasscodeError: Error, CustomStringConvertible, Sendable, Equatable {
    /// Why a passcode was refused. The raw values are stable names for programs and logs.
    public enum Reason: String, Sendable {
        /// Fewer digits than ``PasscodePolicy/minimumLength``.
        case tooShort = "too-short"
        /// More digits than ``PasscodePolicy/maximumLength``.
        case tooLong = "too-long"
        /// Something other than the ASCII digits 0–9.
        case notDigits = "not-digits"
        /// One digit throughout (`000000`).
        case repeated
        /// Digits counting up or down by one, wrapping past 9 (`123456`, `987654`, `890123`).
        case sequential
        /// A short block repeated (`121212`, `123123`), every digit doubled (`112233`), or digits
        /// evenly spaced (`135791`).
        case pattern
        /// On the built-in list of common passcodes or the organisation's extra list.
        case common
        /// The confirmation differs from the first entry.
        case mismatch
    }

    /// Why the passcode was refused.
    public let reason: Reason
    /// The length limit that was broken, for ``Reason/tooShort`` and ``Reason/tooLong``.
    public let limit: Int?

    /// Makes an error for `reason`; `limit` is the broken length limit, if any.
    public init(_ reason: Reason, limit: Int? = nil) {
        self.reason = reason
        self.limit = limit
    }

    /// One plain sentence for the person choosing the passcode.
    public var description: String {
        switch reason {
        case .tooShort:
            if let limit { return "Passcode is too short: use at least \(limit) digits." }
            return "Passcode is too short."
        case .tooLong:
            if let limit { return "Passcode is too long: use at most \(limit) digits." }
            return "Passcode is too long."
        case .notDigits:
            return "Passcode must contain only the digits 0 to 9."
        case .repeated:
            return "Passcode is too easy to guess: the same digit throughout."
        case .sequential:
            return "Passcode is too easy to guess: digits in sequence."
        case .pattern:
            return "Passcode is too easy to guess: a repeated or regular pattern."
        case .common:
            return "Passcode is too easy to guess: it is one of the most common passcodes."
        case .mismatch:
            return "The passcodes do not match."
        }
    }
}
