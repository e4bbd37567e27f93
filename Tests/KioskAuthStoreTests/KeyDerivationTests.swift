import Crypto
import Foundation
import KioskAuthCore
import Testing

@testable import KioskAuthStore

/// `StoreKey.derived(for:)` is HKDF-SHA256 written out over `SHA256`: every store's keys come
/// from it, so it must give exactly the bytes swift-crypto's own HKDF gives.
@Suite struct KeyDerivationTests {
    static func hex(_ text: String) -> [UInt8] { Hex.decode(text)! }

    static func bytes(_ key: SymmetricKey) -> [UInt8] { key.withUnsafeBytes { Array($0) } }

    static func library(_ key: StoreKey, _ purpose: String) -> [UInt8] {
        bytes(
            HKDF<SHA256>.deriveKey(
                inputKeyMaterial: key.key, salt: Data("kioskauth store v1".utf8), info: Data(purpose.utf8),
                outputByteCount: 32))
    }

    @Test func everyPurpose_givesWhatSwiftCryptosHKDFGives() throws {
        let purposes = [
            "audit", "activation-code", "row-mac", "seal", "audit-anchor", "", "x",
            String(repeating: "long purpose ", count: 20), "zweck-für-schlüssel",
        ]
        for _ in 0..<20 {
            let key = StoreKey.random()
            for purpose in purposes {
                #expect(Self.bytes(key.derived(for: purpose)) == Self.library(key, purpose), "\(purpose)")
            }
        }
    }

    /// A fixed key's subkeys, pinned (computed with Python's hmac and hashlib, an implementation
    /// of its own): a store written today must open with every later build.
    @Test func aFixedKeysSubkeys_arePinned() throws {
        let key = try StoreKey(bytes: [UInt8](repeating: 0x42, count: 32))
        #expect(
            Self.bytes(key.derived(for: "audit"))
                == Self.hex("8e2f504339866aa3dba7c718d1f68c29afad07118dfc3333b46f78aefc61193d"))
        #expect(
            Self.bytes(key.derived(for: "row-mac"))
                == Self.hex("5016a6d0a1af9f54999355eae4b5c9a51deed829dff49cb8f90dc4fc2527d7c8"))
    }

    @Test func hmac_givesWhatSwiftCryptosHMACGives_forEveryKeyLength() {
        var generator = SystemRandomNumberGenerator()
        for keyLength in [0, 1, 18, 31, 32, 33, 63, 64, 65, 100, 128, 200] {
            for messageLength in [0, 1, 55, 56, 63, 64, 65, 200] {
                let key = (0..<keyLength).map { _ in UInt8.random(in: 0...255, using: &generator) }
                let message = (0..<messageLength).map { _ in UInt8.random(in: 0...255, using: &generator) }
                let ours = message.withUnsafeBytes { StoreHKDF.hmacSHA256(key: key, message: $0) }
                let theirs = Array(HMAC<SHA256>.authenticationCode(for: message, using: SymmetricKey(data: key)))
                #expect(ours == theirs, "key \(keyLength) bytes, message \(messageLength) bytes")
            }
        }
    }

    /// RFC 5869, test case 1 (SHA-256): the pseudorandom key, and the first block of the output.
    @Test func rfc5869_testCase1() {
        let inputKeyMaterial = [UInt8](repeating: 0x0B, count: 22)
        let salt = Self.hex("000102030405060708090a0b0c")
        let info = Self.hex("f0f1f2f3f4f5f6f7f8f9")
        let pseudoRandomKey = inputKeyMaterial.withUnsafeBytes { StoreHKDF.hmacSHA256(key: salt, message: $0) }
        #expect(pseudoRandomKey == Self.hex("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5"))
        let firstBlock = (info + [1]).withUnsafeBytes { StoreHKDF.hmacSHA256(key: pseudoRandomKey, message: $0) }
        #expect(firstBlock == Self.hex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"))
    }
}
