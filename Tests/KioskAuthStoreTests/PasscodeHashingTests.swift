import CArgon2
import KioskAuthCore
import Testing

@testable import KioskAuthStore

/// The daemon computes Argon2id with its working memory in a huge-page mapping of its own
/// (`kioskauth_argon2id_hash_raw`); the hash must be exactly libargon2's `argon2id_hash_raw`, or
/// every passcode set before would stop matching. Serialized: one test turns huge pages off
/// (a process-wide setting) while another checks they are on by default.
@Suite("Passcode hashing", .serialized)
struct PasscodeHashingTests {
    /// A verifier whose hash libargon2's reference `argon2id_hash_raw` computed (8 MiB, 2 passes).
    @Test func aHashFromTheReferenceFunction_matchesTheRightCodeOnly() throws {
        let verifier = PasscodeVerifier(
            algorithm: "argon2id", parameters: PasscodeHashParameters(memoryKiB: 8192, iterations: 2, parallelism: 1),
            salt: Array("kioskauth-salt16".utf8),
            hash: hexBytes("4a556641a0b50d59b59ceae7a5a48e803c37dba81b1427ffd95d5dff8e39d3a1"))
        #expect(try verifier.matches("482913"))
        #expect(try !verifier.matches("482914"))
    }

    /// At the default cost (64 MiB: huge pages when the kernel gives them), with two lanes, and
    /// with sixteen over a memory size libargon2 rounds down to a multiple of the lanes, the same
    /// hash as `argon2id_hash_raw` for the same inputs, with huge pages asked for or not.
    @Test(arguments: [
        PasscodeHashParameters.default, PasscodeHashParameters(memoryKiB: 4096, iterations: 1, parallelism: 2),
        PasscodeHashParameters(memoryKiB: 1030, iterations: 2, parallelism: 16),
    ])
    func theDaemonsHash_isTheReferenceHash(parameters: PasscodeHashParameters) throws {
        #expect(PasscodeVerifier.usesHugePages, "on by default")
        try expectReferenceHash(parameters)
    }

    @Test func withoutHugePages_theHashIsTheSame() throws {
        PasscodeVerifier.usesHugePages = false
        defer { PasscodeVerifier.usesHugePages = true }
        try expectReferenceHash(.default)
    }

    private func expectReferenceHash(_ parameters: PasscodeHashParameters) throws {
        let made = try PasscodeVerifier.make(passcode: "917362", parameters: parameters)
        var reference = [UInt8](repeating: 0, count: made.hash.count)
        let passcode = Array("917362".utf8)
        let rc = reference.withUnsafeMutableBytes { out in
            argon2id_hash_raw(
                UInt32(parameters.iterations), UInt32(parameters.memoryKiB), UInt32(parameters.parallelism),
                passcode, passcode.count, made.salt, made.salt.count, out.baseAddress, out.count)
        }
        #expect(rc == ARGON2_OK.rawValue)
        #expect(made.hash == reference)
    }
}

private func hexBytes(_ hex: String) -> [UInt8] { Hex.decode(hex)! }
