import CArgon2
import Crypto
public import FoundationEssentials
import Synchronization

/// Argon2id parameters; recorded with every verifier so they can be raised later without
/// invalidating passcodes already set.
public struct PasscodeHashParameters: Codable, Sendable, Equatable {
    /// Memory in KiB.
    public var memoryKiB: Int
    /// Passes over memory.
    public var iterations: Int
    /// Lanes.
    public var parallelism: Int

    public init(memoryKiB: Int, iterations: Int, parallelism: Int) {
        self.memoryKiB = memoryKiB
        self.iterations = iterations
        self.parallelism = parallelism
    }

    /// 64 MiB, 3 passes, 1 lane: about a tenth of a second here, and the lockout limits tries.
    public static let `default` = PasscodeHashParameters(memoryKiB: 64 * 1024, iterations: 3, parallelism: 1)
}

/// A passcode verifier: Argon2id hash, salt and parameters. Stored only inside a seal.
public struct PasscodeVerifier: Codable, Sendable, Equatable {
    public var algorithm: String
    public var parameters: PasscodeHashParameters
    public var salt: [UInt8]
    public var hash: [UInt8]

    private static let hashLength = 32
    private static let saltLength = 16

    /// Whether Argon2id's working memory asks for transparent huge pages (`[Store]
    /// PasscodeHashHugePages`, on by default): about a fifth faster, but on a machine short of
    /// memory and fragmented, the kernel may stall a hash to compact memory for them. Set once
    /// at start; the hash is the same either way.
    public static var usesHugePages: Bool {
        get { hugePages.load(ordering: .relaxed) }
        set { hugePages.store(newValue, ordering: .relaxed) }
    }
    private static let hugePages = Atomic<Bool>(true)

    /// Hashes `passcode` with a fresh salt. Slow on purpose: call it off the event loop.
    public static func make(passcode: String, parameters: PasscodeHashParameters) throws(StoreError) -> PasscodeVerifier
    {
        var salt = [UInt8](repeating: 0, count: saltLength)
        SymmetricKey(size: .bits128).withUnsafeBytes { salt = Array($0) }
        let hash = try argon2id(passcode, salt: salt, parameters: parameters)
        return PasscodeVerifier(algorithm: "argon2id", parameters: parameters, salt: salt, hash: hash)
    }

    /// Whether `passcode` matches, in constant time. Slow on purpose.
    public func matches(_ passcode: String) throws(StoreError) -> Bool {
        guard algorithm == "argon2id" else {
            throw StoreError(.integrity("unknown passcode hash algorithm \(algorithm)"))
        }
        let candidate = try Self.argon2id(passcode, salt: salt, parameters: parameters)
        guard candidate.count == hash.count else { return false }
        var difference: UInt8 = 0
        for (a, b) in zip(candidate, hash) { difference |= a ^ b }
        return difference == 0
    }

    private static func argon2id(
        _ passcode: String, salt: [UInt8], parameters: PasscodeHashParameters
    ) throws(StoreError)
        -> [UInt8]
    {
        var secret = Array(passcode.utf8)
        defer { secret.withUnsafeMutableBytes { $0.initializeMemory(as: UInt8.self, repeating: 0) } }
        var output = [UInt8](repeating: 0, count: hashLength)
        let rc = secret.withUnsafeBytes { secretBytes in
            salt.withUnsafeBytes { saltBytes in
                output.withUnsafeMutableBytes { out in
                    kioskauth_argon2id_hash_raw(
                        UInt32(parameters.iterations), UInt32(parameters.memoryKiB), UInt32(parameters.parallelism),
                        secretBytes.baseAddress, secretBytes.count, saltBytes.baseAddress, saltBytes.count,
                        out.baseAddress, out.count, usesHugePages ? 1 : 0)
                }
            }
        }
        guard rc == ARGON2_OK.rawValue else {
            throw StoreError(.integrity("argon2id failed: \(String(cString: argon2_error_message(rc)))"))
        }
        return output
    }
}
