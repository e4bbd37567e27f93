import KioskAuthCore
import Testing

/// The reason `policy` refuses `passcode`, or `nil` when it accepts it.
private func refusal(
    of passcode: String, by policy: PasscodePolicy = PasscodePolicy()
) -> WeakPasscodeError? {
    do {
        try policy.validate(passcode)
        return nil
    } catch {
        return error
    }
}

@Suite("Passcode policy")
struct PasscodePolicyTests {
    @Test(
        "Weak passcodes are refused with the most specific reason",
        arguments: [
            ("48291a", WeakPasscodeError.Reason.notDigits),
            (" 482913", .notDigits),
            ("482 913", .notDigits),
            ("４８２９１３", .notDigits),  // fullwidth digits
            ("٤٨٢٩١٣", .notDigits),  // Arabic-Indic digits
            ("", .tooShort),
            ("48291", .tooShort),
            ("12345", .tooShort),
            ("4829137560123", .tooLong),
            ("000000", .repeated),
            ("7777777777", .repeated),
            ("123456", .sequential),
            ("987654", .sequential),
            ("890123", .sequential),
            ("109876", .sequential),
            ("0123456789", .sequential),
            ("121212", .pattern),
            ("123123", .pattern),
            ("1212121", .pattern),
            ("482913482913", .pattern),
            ("112233", .pattern),
            ("111222", .pattern),
            ("11223344", .pattern),
            ("135791", .pattern),
            ("147036", .pattern),
            ("696969", .pattern),
            ("520520", .pattern),
            ("159753", .common),
            ("789456", .common),
            ("147258", .common),
            ("123321", .common),
            ("000001", .common),
            ("112211", .pattern),
            ("142536", .common),
            ("102030", .common),
            ("159357", .common),
        ])
    func weakPasscode_isRefused(passcode: String, reason: WeakPasscodeError.Reason) {
        #expect(refusal(of: passcode)?.reason == reason)
    }

    @Test(
        "Good passcodes are accepted",
        arguments: ["482913", "730562", "918274", "305817", "150387", "2847193", "604219375812"])
    func goodPasscode_isAccepted(passcode: String) {
        #expect(refusal(of: passcode) == nil)
    }

    @Test func lengthErrors_nameTheLimitInTheirSentence() {
        #expect(
            refusal(of: "48291")?.description == "Passcode is too short: use at least 6 digits.")
        #expect(
            refusal(of: "4829137560123")?.description
                == "Passcode is too long: use at most 12 digits.")
        #expect(refusal(of: "48291")?.limit == 6)
    }

    @Test func everyReason_readsAsOnePlainSentence() {
        let reasons: [WeakPasscodeError.Reason] = [
            .tooShort, .tooLong, .notDigits, .repeated, .sequential, .pattern, .common, .mismatch,
        ]
        for reason in reasons {
            let sentence = WeakPasscodeError(reason).description
            #expect(sentence.first?.isUppercase == true, "\(reason)")
            #expect(sentence.hasSuffix("."), "\(reason)")
        }
        #expect(
            WeakPasscodeError(.sequential).description
                == "Passcode is too easy to guess: digits in sequence.")
        #expect(WeakPasscodeError.Reason.tooShort.rawValue == "too-short")
        #expect(WeakPasscodeError.Reason.notDigits.rawValue == "not-digits")
    }

    @Test func lengthLimits_areConfigurable() {
        let policy = PasscodePolicy(minimumLength: 8, maximumLength: 10)
        #expect(refusal(of: "482913", by: policy) == WeakPasscodeError(.tooShort, limit: 8))
        #expect(refusal(of: "48291375", by: policy) == nil)
        #expect(refusal(of: "48291375601", by: policy) == WeakPasscodeError(.tooLong, limit: 10))
    }

    @Test func extraCommonPasscodes_areRefusedAsCommon() {
        let policy = PasscodePolicy(extraCommonPasscodes: ["482913"])
        #expect(refusal(of: "482913", by: policy)?.reason == .common)
        #expect(refusal(of: "730562", by: policy) == nil)
        #expect(refusal(of: "482913") == nil)
    }

    @Test func builtInList_holdsOverAHundredSixDigitCodes_allRefused() {
        let weakReasons: Set<WeakPasscodeError.Reason> = [
            .repeated, .sequential, .pattern, .common,
        ]
        let list = PasscodePolicy.builtInCommonPasscodes
        #expect(list.count >= 100)
        for code in list {
            #expect(
                code.utf8.count == 6 && code.utf8.allSatisfy { (48...57).contains($0) }, "\(code)")
            let reason = refusal(of: code)?.reason
            #expect(reason.map(weakReasons.contains) == true, "\(code) is listed but accepted")
        }
        #expect(!list.contains("482913"))
    }

    @Test func matchingConfirmation_isAccepted() throws {
        try PasscodePolicy().validate("482913", confirmation: "482913")
    }

    @Test func differentConfirmation_isAMismatch() {
        #expect(throws: WeakPasscodeError(.mismatch)) {
            try PasscodePolicy().validate("482913", confirmation: "482931")
        }
        #expect(throws: WeakPasscodeError(.mismatch)) {
            try PasscodePolicy().validate("482913", confirmation: "")
        }
    }

    @Test func weakFirstEntry_isReportedBeforeAMismatch() {
        #expect(throws: WeakPasscodeError(.sequential)) {
            try PasscodePolicy().validate("123456", confirmation: "482913")
        }
    }
}
