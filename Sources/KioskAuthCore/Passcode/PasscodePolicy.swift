/// The rules a new passcode must meet (docs/design.md, §3.1).
///
/// A passcode is refused, checking in this order, when it:
/// 1. contains anything but the ASCII digits 0–9 (``WeakPasscodeError/Reason/notDigits``);
/// 2. is shorter than ``minimumLength`` or longer than ``maximumLength``;
/// 3. is one digit throughout, `000000` (``WeakPasscodeError/Reason/repeated``);
/// 4. counts up or down by one, wrapping past 9 or 0: `123456`, `987654`, `890123`, `109876`
///    (``WeakPasscodeError/Reason/sequential``);
/// 5. is a pattern (``WeakPasscodeError/Reason/pattern``): a block of at most half its length
///    repeated (`121212`, `123123`, `1231231`), every digit doubled or tripled (`112233`,
///    `111222`), or digits evenly spaced modulo 10 (`135791`, `147036`). Each of these leaves
///    at most a thousandth of the six-digit space, so refusing them costs people little;
/// 6. is on the built-in common list or in ``extraCommonPasscodes``
///    (``WeakPasscodeError/Reason/common``).
///
/// Mirrored codes (`123321`) and dates are not refused by rule; the commonest mirrored codes
/// are on the list. The order puts the most specific reason first, so `123456` is reported as
/// sequential rather than common.
public struct PasscodePolicy: Sendable {
    /// The fewest digits accepted (default 6).
    public var minimumLength: Int = 6
    /// The most digits accepted (default 12).
    public var maximumLength: Int = 12
    /// Passcodes refused as common in addition to the built-in list (digits only; others never
    /// match since such passcodes are refused as not digits first).
    public var extraCommonPasscodes: Set<String> = []

    /// Makes a policy; the defaults are docs/design.md's.
    public init(
        minimumLength: Int = 6, maximumLength: Int = 12, extraCommonPasscodes: Set<String> = []
    ) {
        self.minimumLength = minimumLength
        self.maximumLength = maximumLength
        self.extraCommonPasscodes = extraCommonPasscodes
    }

    /// The built-in list of common six-digit passcodes: refused as common unless a more
    /// specific rule refuses them first.
    public static var builtInCommonPasscodes: Set<String> { CommonPasscodes.all }

    /// Throws WeakPasscodeError naming the reason.
    ///
    /// Checks `passcode` against the rules listed on ``PasscodePolicy``, in that order.
    public func validate(_ passcode: String) throws(WeakPasscodeError) {
        var digits: [UInt8] = []
        digits.reserveCapacity(passcode.utf8.count)
        for byte in passcode.utf8 {
            // Only ASCII digits: `Character.isNumber` would admit other scripts' digits, which a
            // keypad cannot type.
            guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else {
                throw WeakPasscodeError(.notDigits)
            }
            digits.append(byte - UInt8(ascii: "0"))
        }
        if digits.count < minimumLength {
            throw WeakPasscodeError(.tooShort, limit: minimumLength)
        }
        if digits.count > maximumLength {
            throw WeakPasscodeError(.tooLong, limit: maximumLength)
        }
        if let step = Self.constantStep(digits) {
            switch step {
            case 0: throw WeakPasscodeError(.repeated)
            case 1, 9: throw WeakPasscodeError(.sequential)
            default: throw WeakPasscodeError(.pattern)
            }
        }
        if Self.isPeriodic(digits) || Self.isStuttered(digits) {
            throw WeakPasscodeError(.pattern)
        }
        if CommonPasscodes.all.contains(passcode) || extraCommonPasscodes.contains(passcode) {
            throw WeakPasscodeError(.common)
        }
    }

    /// Validates and checks the confirmation equals the first entry.
    ///
    /// A weak first entry is reported before a mismatch: the person has to choose another
    /// passcode either way.
    public func validate(_ passcode: String, confirmation: String) throws(WeakPasscodeError) {
        try validate(passcode)
        // Byte-wise: `String ==` treats canonically equivalent strings as equal.
        guard passcode.utf8.elementsEqual(confirmation.utf8) else {
            throw WeakPasscodeError(.mismatch)
        }
    }

    /// The step, modulo 10, between every pair of neighbouring digits, if it is the same for all
    /// of them (0 for `000000`, 1 for `890123`, 9 for `987654`).
    private static func constantStep(_ digits: [UInt8]) -> UInt8? {
        guard digits.count >= 2 else { return nil }
        let step = (digits[1] + 10 - digits[0]) % 10
        for index in 2..<digits.count where (digits[index] + 10 - digits[index - 1]) % 10 != step {
            return nil
        }
        return step
    }

    /// Whether the digits repeat with some period of at most half their length (`121212`,
    /// `123123`, `1212121`).
    private static func isPeriodic(_ digits: [UInt8]) -> Bool {
        guard digits.count >= 2 else { return false }
        return (1...digits.count / 2).contains { period in
            (period..<digits.count).allSatisfy { digits[$0] == digits[$0 - period] }
        }
    }

    /// Whether the digits come in equal runs of two or more (`112233`, `111222`, `11223344`).
    private static func isStuttered(_ digits: [UInt8]) -> Bool {
        guard digits.count >= 4 else { return false }
        return (2...digits.count / 2).contains { run in
            digits.count % run == 0
                && stride(from: 0, to: digits.count, by: run).allSatisfy { start in
                    digits[start..<start + run].allSatisfy { $0 == digits[start] }
                }
        }
    }
}
