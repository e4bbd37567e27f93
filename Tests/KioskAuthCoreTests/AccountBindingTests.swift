import KioskAuthCore
import Testing

@Suite("Binding people to Unix accounts")
struct AccountBindingTests {
    @Test func systemUIDMax_defaultsTo999_andReadsTheLastSetting() {
        #expect(AccountBinding.systemUIDMax(loginDefs: "") == 999)
        #expect(AccountBinding.systemUIDMax(loginDefs: "#SYS_UID_MAX\t\t  999\nUID_MIN 1000\n") == 999)
        #expect(AccountBinding.systemUIDMax(loginDefs: "SYS_UID_MAX\t\t  4999\n") == 4999)
        #expect(AccountBinding.systemUIDMax(loginDefs: "SYS_UID_MAX 200\nSYS_UID_MAX 300\n") == 300)
        #expect(AccountBinding.systemUIDMax(loginDefs: "SYS_UID_MAX lots\n") == 999)
        #expect(AccountBinding.systemUIDMax(loginDefs: "SYS_UID_MAX_X 5\n") == 999)
        #expect(AccountBinding.systemUIDMax(loginDefs: "SYS_UID_MAX -5\n") == 999)
        #expect(AccountBinding.systemUIDMax(loginDefs: " SYS_UID_MAX 700 # pinned\n") == 700)
    }

    @Test func systemUIDMax_readsWindowsLineEndsAndTextBesideIt() {
        #expect(AccountBinding.systemUIDMax(loginDefs: "UID_MIN 1000\r\nSYS_UID_MAX 1234\r\nGID_MIN 1000\r\n") == 1234)
        #expect(AccountBinding.systemUIDMax(loginDefs: "# Standardwerte für Benutzer — café\nSYS_UID_MAX\t850") == 850)
        #expect(AccountBinding.systemUIDMax(loginDefs: "SYS_UID_MAX\u{0B}850\n") == 999)
    }

    @Test func rootAndSystemUIDs_areNeverBound() {
        #expect(AccountBinding.uidRefusal(0, systemUIDMax: 999) != nil)
        #expect(AccountBinding.uidRefusal(1, systemUIDMax: 999) != nil)
        #expect(AccountBinding.uidRefusal(999, systemUIDMax: 999) != nil)
        #expect(AccountBinding.uidRefusal(-1, systemUIDMax: 999) != nil)
        #expect(AccountBinding.uidRefusal(4_294_967_295, systemUIDMax: 999) != nil)
        #expect(AccountBinding.uidRefusal(1000, systemUIDMax: 999) == nil)
        #expect(AccountBinding.uidRefusal(65534, systemUIDMax: 999) == nil)
        #expect(AccountBinding.uidRefusal(1500, systemUIDMax: 1999) != nil)
        #expect(AccountBinding.uidRefusal(0, systemUIDMax: -1) != nil)
    }

    @Test func aNameThatIsAUnixAccount_belongsToThatUidOnly() throws {
        let root = try LoginName("root")
        #expect(AccountBinding.nameRefusal(root, uid: 1000, accountUID: 0) != nil)
        #expect(AccountBinding.nameRefusal(root, uid: nil, accountUID: 0) != nil)
        let alice = try LoginName("alice")
        #expect(AccountBinding.nameRefusal(alice, uid: 1001, accountUID: 1001) == nil)
        #expect(AccountBinding.nameRefusal(alice, uid: 1001, accountUID: nil) == nil)
        #expect(AccountBinding.nameRefusal(alice, uid: nil, accountUID: nil) == nil)
    }

    @Test func aBinding_standsOnlyWhileItsUidNamesTheSameAccount() {
        #expect(AccountBinding.staleBindingRefusal(uid: 5001, recorded: "alice", current: "alice") == nil)
        #expect(AccountBinding.staleBindingRefusal(uid: 5001, recorded: "", current: nil) == nil)
        // Recorded before the store kept accounts: stands until the daemon records it.
        #expect(AccountBinding.staleBindingRefusal(uid: 5001, recorded: nil, current: "mallory") == nil)
        let reused = AccountBinding.staleBindingRefusal(uid: 5001, recorded: "alice", current: "mallory")
        #expect(reused?.contains("account alice") == true && reused?.contains("mallory") == true)
        #expect(AccountBinding.staleBindingRefusal(uid: 5001, recorded: "", current: "eve") != nil)
        #expect(AccountBinding.staleBindingRefusal(uid: 5001, recorded: "alice", current: nil) != nil)
    }

    @Test func aLoginToAUnixAccount_needsTheBindingToItsUid() {
        #expect(AccountBinding.loginRefusal(boundUID: nil, accountUID: nil) == nil)
        #expect(AccountBinding.loginRefusal(boundUID: 1000, accountUID: nil) == nil)
        #expect(AccountBinding.loginRefusal(boundUID: 1000, accountUID: 1000) == nil)
        #expect(AccountBinding.loginRefusal(boundUID: nil, accountUID: 1000) != nil)
        #expect(AccountBinding.loginRefusal(boundUID: 1001, accountUID: 1000) != nil)
    }
}

@Suite("Login names of identity-provider people")
struct IdentityProviderLoginNameTests {
    let digest = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

    @Test func aValidEmail_isTheNameAsItIs() throws {
        let names = IdentityProviderLoginName.candidates(email: "Sarah.Jones@Clinic.example", digestHex: digest)
        #expect(names.first == (try LoginName("sarah.jones@clinic.example")))
        #expect(names.dropFirst().allSatisfy { $0.rawValue.hasPrefix("idp-0123456789ab") })
    }

    @Test(arguments: ["!secu1@clinic.example", "-root@x.example", "ro ot@x.example", "rööt@x.example", "_x@y"])
    func anInvalidEmail_isNeverStrippedIntoAnotherName(email: String) {
        let names = IdentityProviderLoginName.candidates(email: email, digestHex: digest)
        #expect(names.map(\.rawValue) == [12, 16, 20, 24, 32, 40, 48, 56].map { "idp-" + digest.prefix($0) })
        #expect(names.allSatisfy { !$0.rawValue.contains("secu1") && !$0.rawValue.contains("root") })
    }

    @Test func noEmail_usesTheDigest() {
        let names = IdentityProviderLoginName.candidates(email: nil, digestHex: digest)
        #expect(names.first?.rawValue == "idp-0123456789ab")
    }
}
