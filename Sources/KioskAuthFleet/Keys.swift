import Crypto
public import FoundationEssentials

/// A terminal's own key pair (X25519). The private half is 32 bytes in the terminal's systemd
/// credential `kioskauth.fleet-key`; only the public half goes to the directory.
public struct TerminalKeyPair: Sendable {
    let privateKey: Curve25519.KeyAgreement.PrivateKey

    /// Reads the private key from the credential's 32 raw bytes; anything else is refused.
    public init(credential bytes: some ContiguousBytes) throws(FleetError) {
        do {
            privateKey = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: bytes)
        } catch {
            throw FleetError(.keyUnavailable("the terminal key must be 32 raw X25519 bytes"))
        }
    }

    private init(privateKey: Curve25519.KeyAgreement.PrivateKey) {
        self.privateKey = privateKey
    }

    /// A fresh key pair, as `fleet join` creates before writing the credential.
    public static func generate() -> TerminalKeyPair {
        TerminalKeyPair(privateKey: Curve25519.KeyAgreement.PrivateKey())
    }

    /// The public key, 32 bytes, as stored in `terminals.public_key`.
    public var publicKey: [UInt8] { Array(privateKey.publicKey.rawRepresentation) }

    /// The private key's raw bytes, for writing the credential only.
    public var credentialBytes: [UInt8] { Array(privateKey.rawRepresentation) }
}

/// One generation of the fleet data key: 32 random bytes under which templates and verifiers
/// are sealed. It exists in memory on member terminals only; the directory holds it wrapped.
public struct FleetDataKey: Sendable {
    /// Which generation; sealed values record it, and rotation adds one.
    public let generation: Int32
    let key: SymmetricKey

    /// A fresh random key for `generation`.
    public static func random(generation: Int32) -> FleetDataKey {
        FleetDataKey(generation: generation, key: SymmetricKey(size: .bits256))
    }

    init(generation: Int32, key: SymmetricKey) {
        self.generation = generation
        self.key = key
    }

    /// A subkey for one purpose; purposes never share a key.
    func derived(for purpose: String) -> SymmetricKey {
        HKDF<SHA256>.deriveKey(
            inputKeyMaterial: key, salt: Data("kioskauth fleet v1".utf8), info: Data(purpose.utf8),
            outputByteCount: 32)
    }
}

/// A data-key generation wrapped to one terminal's public key with HPKE (RFC 9180, base mode,
/// X25519 / HKDF-SHA256 / ChaCha20-Poly1305). The associated data binds it to the terminal and
/// the generation, so a row copied to another terminal or generation fails to open.
public struct WrappedDataKey: Sendable, Equatable, Codable {
    /// The terminal it is wrapped to.
    public var terminalID: UUID
    /// The generation inside.
    public var generation: Int32
    /// HPKE's encapsulated key.
    public var encapsulatedKey: [UInt8]
    /// The sealed 32 bytes.
    public var ciphertext: [UInt8]

    /// Wraps directly stored columns.
    public init(terminalID: UUID, generation: Int32, encapsulatedKey: [UInt8], ciphertext: [UInt8]) {
        self.terminalID = terminalID
        self.generation = generation
        self.encapsulatedKey = encapsulatedKey
        self.ciphertext = ciphertext
    }

    static let ciphersuite = HPKE.Ciphersuite.Curve25519_SHA256_ChachaPoly
    static let info = Data("kioskauth.fleet.data-key.v1".utf8)

    package static func associatedData(terminalID: UUID, generation: Int32) -> Data {
        Data("kioskauth.fleet.wrap.v1\u{0}\(terminalID.uuidString.lowercased())\u{0}\(generation)".utf8)
    }

    /// Wraps `dataKey` to the terminal whose public key is `publicKey`.
    public static func wrap(
        _ dataKey: FleetDataKey, to publicKey: [UInt8], terminalID: UUID
    ) throws(FleetError)
        -> WrappedDataKey
    {
        do {
            let recipient = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: publicKey)
            var sender = try HPKE.Sender(recipientKey: recipient, ciphersuite: ciphersuite, info: info)
            let sealed = try dataKey.key.withUnsafeBytes { raw in
                try sender.seal(
                    Data(raw), authenticating: associatedData(terminalID: terminalID, generation: dataKey.generation))
            }
            return WrappedDataKey(
                terminalID: terminalID, generation: dataKey.generation,
                encapsulatedKey: Array(sender.encapsulatedKey), ciphertext: Array(sealed))
        } catch {
            throw FleetError(.keyUnavailable("cannot wrap the data key to terminal \(terminalID): \(error)"))
        }
    }

    /// Opens the wrapped key with the terminal's own key pair. Any other key pair, or a row
    /// moved to another terminal or generation, is an integrity error.
    public func unwrap(with keyPair: TerminalKeyPair) throws(FleetError) -> FleetDataKey {
        do {
            var recipient = try HPKE.Recipient(
                privateKey: keyPair.privateKey, ciphersuite: Self.ciphersuite, info: Self.info,
                encapsulatedKey: Data(encapsulatedKey))
            let opened = try recipient.open(
                ciphertext, authenticating: Self.associatedData(terminalID: terminalID, generation: generation))
            guard opened.count == 32 else {
                throw FleetError(.integrity("wrapped data key of generation \(generation) is not 32 bytes"))
            }
            return FleetDataKey(generation: generation, key: SymmetricKey(data: opened))
        } catch let error as FleetError {
            throw error
        } catch {
            throw FleetError(
                .integrity("the data key of generation \(generation) does not open with this terminal's key"))
        }
    }
}
