public import Crypto
public import FoundationEssentials

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The store key: 32 secret bytes from which every other key is derived. Held as a
/// `SymmetricKey`, which wipes itself; never logged.
public struct StoreKey: Sendable {
    /// Size of the key in bytes, as systemd hands the credential over.
    public static let byteCount = 32

    let key: SymmetricKey

    /// Wraps exactly 32 bytes; anything else is refused.
    public init(bytes: some ContiguousBytes) throws(StoreError) {
        let key = SymmetricKey(data: bytes)
        guard key.bitCount == Self.byteCount * 8 else {
            throw StoreError(
                .keyUnavailable("the store key must be exactly \(Self.byteCount) bytes, got \(key.bitCount / 8)"))
        }
        self.key = key
    }

    /// A fresh random key.
    public static func random() -> StoreKey {
        // A random key of the right size cannot fail validation.
        try! StoreKey(bytes: SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })
    }

    /// The raw bytes, for writing a development key file only.
    func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try key.withUnsafeBytes(body)
    }

    /// A subkey for one purpose; purposes never share a key: HKDF-SHA256 (RFC 5869) of the store
    /// key, salted with `kioskauth store v1`, with `purpose` as the info, 32 bytes long.
    ///
    /// The same bytes as swift-crypto's `HKDF<SHA256>.deriveKey` (the tests compare them), written
    /// out over `SHA256` (`StoreHKDF`): the store derives five subkeys before it can serve, and
    /// the generic HKDF spent most of its time there instantiating its generic code (a good part
    /// of a millisecond of every start).
    func derived(for purpose: String) -> SymmetricKey {
        var info = Array(purpose.utf8)
        info.append(1)  // the counter of the one output block
        var block = key.withUnsafeBytes { inputKeyMaterial in
            var pseudoRandomKey = StoreHKDF.hmacSHA256(key: StoreHKDF.salt, message: inputKeyMaterial)
            defer { StoreHKDF.wipe(&pseudoRandomKey) }
            return info.withUnsafeBytes { StoreHKDF.hmacSHA256(key: pseudoRandomKey, message: $0) }
        }
        defer { StoreHKDF.wipe(&block) }
        return SymmetricKey(data: block)
    }
}

/// HMAC-SHA256 (RFC 2104) over swift-crypto's `SHA256`, for `StoreKey.derived(for:)`'s HKDF.
enum StoreHKDF {
    static let salt = Array("kioskauth store v1".utf8)
    static let blockSize = 64

    /// HMAC-SHA256 of `message` under `key` (any length; one longer than a block is hashed first).
    static func hmacSHA256(key: [UInt8], message: UnsafeRawBufferPointer) -> [UInt8] {
        key.withUnsafeBytes { hmacSHA256(key: $0, message: message) }
    }

    static func hmacSHA256(key: UnsafeRawBufferPointer, message: UnsafeRawBufferPointer) -> [UInt8] {
        var block = [UInt8](repeating: 0, count: blockSize)
        if key.count > blockSize {
            var hash = SHA256()
            hash.update(bufferPointer: key)
            hash.finalize().withUnsafeBytes { digest in block.withUnsafeMutableBytes { $0.copyMemory(from: digest) } }
        } else {
            block.withUnsafeMutableBytes { $0.copyMemory(from: key) }
        }
        var pad = block.map { $0 ^ 0x36 }
        var inner = SHA256()
        pad.withUnsafeBytes { inner.update(bufferPointer: $0) }
        inner.update(bufferPointer: message)
        let innerDigest = inner.finalize()
        for index in 0..<blockSize { pad[index] = block[index] ^ 0x5C }
        var outer = SHA256()
        pad.withUnsafeBytes { outer.update(bufferPointer: $0) }
        innerDigest.withUnsafeBytes { outer.update(bufferPointer: $0) }
        wipe(&block)
        wipe(&pad)
        return outer.finalize().withUnsafeBytes { Array($0) }
    }

    /// Zeroes key material that is done with (`explicit_bzero`: not optimised away): the padded
    /// key blocks, the pseudorandom key and the output once it is in a `SymmetricKey` (which wipes
    /// its own copy). The `SHA256Digest` values in between (the inner hash, which with the public
    /// salt gives the pseudorandom key) are immutable temporaries left to the stack, as in
    /// swift-crypto's own HMAC; swift-crypto wipes its hash contexts itself.
    static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { buffer in
            if let base = buffer.baseAddress { explicit_bzero(base, buffer.count) }
        }
    }
}

/// What a sealed value is bound to: its table, column, row and owner. The binding is the AEAD's
/// associated data, so a ciphertext moved to another row, column or person fails to open.
public struct SealBinding: Sendable, Equatable, CustomStringConvertible {
    public var table: String
    public var column: String
    public var row: String
    public var owner: String

    public init(table: String, column: String, row: String, owner: String) {
        self.table = table
        self.column = column
        self.row = row
        self.owner = owner
    }

    var associatedData: Data {
        Data("kioskauth.seal.v1\u{0}\(table)\u{0}\(column)\u{0}\(row)\u{0}\(owner)".utf8)
    }

    public var description: String { "\(table).\(column) row \(row)" }
}

/// Seals and opens secrets with ChaCha20-Poly1305 under a key derived from the store key.
struct Sealer: Sendable {
    private static let version: UInt8 = 1
    private let key: SymmetricKey

    init(storeKey: StoreKey) {
        key = storeKey.derived(for: "seal")
    }

    func seal(_ plaintext: some DataProtocol, binding: SealBinding) throws -> [UInt8] {
        let box = try ChaChaPoly.seal(plaintext, using: key, authenticating: binding.associatedData)
        return [Self.version] + Array(box.combined)
    }

    /// Opens a sealed value; any mismatch (wrong key, edited bytes, another row's ciphertext) is
    /// an integrity error naming the binding, never a crash and never a silent success.
    func open(_ sealed: [UInt8], binding: SealBinding) throws(StoreError) -> [UInt8] {
        guard sealed.first == Self.version, sealed.count > 1 + 12 + 16 else {
            throw StoreError(.integrity("\(binding): unknown seal format"))
        }
        do {
            let box = try ChaChaPoly.SealedBox(combined: sealed.dropFirst())
            return Array(try ChaChaPoly.open(box, using: key, authenticating: binding.associatedData))
        } catch {
            throw StoreError(.integrity("\(binding): sealed value does not open (edited, moved, or another key)"))
        }
    }
}
