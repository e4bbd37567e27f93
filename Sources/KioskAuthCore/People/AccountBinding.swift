/// The rules that tie a person to a Unix account. A person becomes a Unix account only by being
/// bound to its uid; a name alone never makes anyone a Unix user.
public enum AccountBinding {
    /// `SYS_UID_MAX` when login.defs does not set it.
    public static let defaultSystemUIDMax = 999

    /// The highest system uid that `text` (the contents of login.defs) sets with `SYS_UID_MAX`,
    /// or ``defaultSystemUIDMax`` when it sets none (or an unreadable one). The last setting wins,
    /// as in shadow's own reader.
    ///
    /// Read as bytes in one pass, with nothing allocated: this runs at every start, and splitting
    /// Debian's 12 KB login.defs into Characters (grapheme breaking), and later into arrays of
    /// lines and fields, cost more than the rest of the configuration together.
    public static func systemUIDMax(loginDefs text: String) -> Int {
        var text = text
        return text.withUTF8 { bytes in
            var result = defaultSystemUIDMax
            var index = 0
            while index < bytes.count {
                var end = index
                while end < bytes.count, !(0x0A...0x0D).contains(bytes[end]) { end += 1 }
                if let value = settingValue(UnsafeBufferPointer(rebasing: bytes[index..<end])) { result = value }
                index = end + 1
            }
            return result
        }
    }

    /// The value of a `SYS_UID_MAX VALUE` line: its first two fields (separated by spaces and
    /// tabs), when the first is the key and the second a number from 0 up; nil for any other line.
    private static func settingValue(_ line: UnsafeBufferPointer<UInt8>) -> Int? {
        /// The field that starts at or after `index`: blanks skipped, then up to the next blank.
        func field(from index: Int) -> Range<Int> {
            func isBlank(_ byte: UInt8) -> Bool { byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
            var start = index
            while start < line.count, isBlank(line[start]) { start += 1 }
            var end = start
            while end < line.count, !isBlank(line[end]) { end += 1 }
            return start..<end
        }
        let key = field(from: 0)
        guard line[key].elementsEqual("SYS_UID_MAX".utf8) else { return nil }
        let value = field(from: key.upperBound)
        guard !value.isEmpty, let number = Int(String(decoding: line[value], as: UTF8.self)), number >= 0 else {
            return nil
        }
        return number
    }

    /// Why a person may not be bound to `uid`, or nil when they may: uid 0 and system uids (at or
    /// below `systemUIDMax`) are never bound, nor anything that is not a uid.
    public static func uidRefusal(_ uid: Int, systemUIDMax: Int) -> String? {
        if uid == 0 { return "uid 0 (root) cannot be bound to a person" }
        if uid < 0 || uid > Int(UInt32.max - 1) { return "\(uid) is not a valid uid" }
        if uid <= systemUIDMax { return "uid \(uid) is a system uid (SYS_UID_MAX is \(systemUIDMax))" }
        return nil
    }

    /// Why a person named `name` may not be bound to `uid` (nil: unbound), or nil when they may,
    /// given the uid of the Unix account of that name (`accountUID`, nil when there is none): a
    /// name that is a Unix account belongs to that account's uid only.
    public static func nameRefusal(_ name: LoginName, uid: Int?, accountUID: Int?) -> String? {
        guard let accountUID, accountUID != uid else { return nil }
        return "\(name) is a Unix account (uid \(accountUID)); a person of that name must be bound to it"
    }

    /// Why a binding to `uid` no longer stands, or nil when it does. `recorded` is the name of the
    /// account that had the uid when the binding was made ("" for none, nil when the binding
    /// predates the record); `current` the account that has it now (nil for none). A uid freed
    /// by deleting its account and given to a new one (or to an account created after binding)
    /// is a different account: the binding does not pass to it.
    public static func staleBindingRefusal(uid: Int, recorded: String?, current: String?) -> String? {
        guard let recorded else { return nil }
        let now = current ?? ""
        guard recorded != now else { return nil }
        let then = recorded.isEmpty ? "no account" : "account \(recorded)"
        let today = now.isEmpty ? "no account has it now" : "it is account \(now)'s now"
        return "the binding to uid \(uid) was made for \(then) and \(today): an admin must bind again"
    }

    /// Why a person bound to `boundUID` may not log in to the Unix account whose uid is
    /// `accountUID` (nil when the login is for no Unix account), or nil when they may.
    public static func loginRefusal(boundUID: Int?, accountUID: Int?) -> String? {
        guard let accountUID else { return nil }
        guard let boundUID else { return "not allowed on this account: the person is bound to no Unix account" }
        guard boundUID == accountUID else {
            return
                "not allowed on this account: the person is bound to uid \(boundUID), the account is uid \(accountUID)"
        }
        return nil
    }
}

/// Login names for a person the identity provider introduces.
public enum IdentityProviderLoginName {
    /// The prefix of names made from a digest; local people cannot take names with it.
    public static let digestPrefix = "idp-"

    /// The names to try, in order, for a new identity-provider person: their email address when
    /// it is a valid login name as it is (only ASCII letters fold to lowercase), else
    /// `idp-` and the start of `digestHex` (a hex digest of their subject), longer on each try.
    /// No name is ever formed by dropping or replacing characters, so an address such as
    /// `!root@clinic.example` can never turn into `root`.
    public static func candidates(email: String?, digestHex: String) -> [LoginName] {
        var names: [LoginName] = []
        if let email, let name = try? LoginName(email) { names.append(name) }
        let hex = digestHex.lowercased().filter { $0.isHexDigit }
        for length in [12, 16, 20, 24, 32, 40, 48, 56] where length <= hex.count {
            if let name = try? LoginName(digestPrefix + hex.prefix(length)) { names.append(name) }
        }
        return names
    }
}
