import Crypto
public import FoundationEssentials

/// What a sealed fleet value is bound to: its table, column, row and owner, and the data-key
/// generation. The binding is the AEAD's associated data, so a ciphertext moved to another
/// row, column, person or generation fails to open.
public struct FleetSealBinding: Sendable, Equatable, CustomStringConvertible {
    public var table: String
    public var column: String
    public var row: String
    public var owner: String

    /// Binds a value to one cell and its owner.
    public init(table: String, column: String, row: String, owner: String) {
        self.table = table
        self.column = column
        self.row = row
        self.owner = owner
    }

    /// The binding of a person's passcode verifier.
    public static func verifier(person: UUID) -> FleetSealBinding {
        let id = person.uuidString.lowercased()
        return FleetSealBinding(table: "passcode_verifiers", column: "sealed", row: id, owner: id)
    }

    /// The binding of one fingerprint template.
    public static func template(_ template: UUID, person: UUID) -> FleetSealBinding {
        FleetSealBinding(
            table: "templates", column: "sealed", row: template.uuidString.lowercased(),
            owner: person.uuidString.lowercased())
    }

    func associatedData(generation: Int32) -> Data {
        Data("kioskauth.fleet.seal.v1\u{0}\(generation)\u{0}\(table)\u{0}\(column)\u{0}\(row)\u{0}\(owner)".utf8)
    }

    public var description: String { "\(table).\(column) row \(row)" }
}

/// A sealed value with the generation of the data key that sealed it.
public struct SealedBlob: Sendable, Equatable {
    /// The data-key generation.
    public var generation: Int32
    /// Version byte, then ChaCha20-Poly1305's nonce, ciphertext and tag.
    public var bytes: [UInt8]

    /// Wraps stored columns.
    public init(generation: Int32, bytes: [UInt8]) {
        self.generation = generation
        self.bytes = bytes
    }
}

/// The data keys a terminal holds, by generation. It seals under the newest and opens any.
public struct FleetKeyring: Sendable {
    private static let version: UInt8 = 1
    private var keys: [Int32: SymmetricKey] = [:]
    private var macKeys: [Int32: SymmetricKey] = [:]
    /// The generations themselves, for the MACs that authenticate keys and members.
    private var dataKeys: [Int32: FleetDataKey] = [:]

    /// The newest generation held.
    public private(set) var currentGeneration: Int32 = 0

    /// A keyring holding `dataKeys`.
    public init(_ dataKeys: [FleetDataKey]) {
        for dataKey in dataKeys { add(dataKey) }
    }

    /// Adds a generation; the newest becomes the one new values are sealed under.
    public mutating func add(_ dataKey: FleetDataKey) {
        keys[dataKey.generation] = dataKey.derived(for: "seal")
        macKeys[dataKey.generation] = dataKey.derived(for: "row-mac")
        dataKeys[dataKey.generation] = dataKey
        currentGeneration = max(currentGeneration, dataKey.generation)
    }

    /// Generation `generation`, if held.
    package func dataKey(generation: Int32) -> FleetDataKey? { dataKeys[generation] }

    /// Every generation held, oldest first.
    package var heldKeys: [FleetDataKey] { dataKeys.values.sorted { $0.generation < $1.generation } }

    /// Seals `plaintext` under the newest generation.
    public func seal(_ plaintext: some DataProtocol, binding: FleetSealBinding) throws(FleetError) -> SealedBlob {
        guard let key = keys[currentGeneration] else {
            throw FleetError(.keyUnavailable("no data key to seal \(binding) with"))
        }
        do {
            let box = try ChaChaPoly.seal(
                plaintext, using: key, authenticating: binding.associatedData(generation: currentGeneration))
            return SealedBlob(generation: currentGeneration, bytes: [Self.version] + Array(box.combined))
        } catch {
            throw FleetError(.integrity("cannot seal \(binding): \(error)"))
        }
    }

    /// Opens a sealed value; any mismatch (wrong key, edited bytes, another row's ciphertext, a
    /// generation this terminal was never given) is an error naming the binding.
    public func open(_ sealed: SealedBlob, binding: FleetSealBinding) throws(FleetError) -> [UInt8] {
        guard let key = keys[sealed.generation] else {
            throw FleetError(.keyUnavailable("\(binding) is sealed under generation \(sealed.generation), not held"))
        }
        guard sealed.bytes.first == Self.version, sealed.bytes.count > 1 + 12 + 16 else {
            throw FleetError(.integrity("\(binding): unknown seal format"))
        }
        do {
            let box = try ChaChaPoly.SealedBox(combined: sealed.bytes.dropFirst())
            return Array(
                try ChaChaPoly.open(
                    box, using: key, authenticating: binding.associatedData(generation: sealed.generation)))
        } catch {
            throw FleetError(.integrity("\(binding) does not open"))
        }
    }

    /// Whether `generation` is held.
    public func holds(generation: Int32) -> Bool { keys[generation] != nil }

    /// HMAC-SHA256 of `input` under the row-MAC subkey of `generation`, nil if not held.
    package func rowMAC(_ input: Data, generation: Int32) -> Data? {
        guard let key = macKeys[generation] else { return nil }
        return Data(HMAC<SHA256>.authenticationCode(for: input, using: key))
    }

    /// Checks a row MAC in constant time; nil when `generation` is not held.
    package func isValidRowMAC(_ mac: [UInt8], for input: Data, generation: Int32) -> Bool? {
        guard let key = macKeys[generation] else { return nil }
        return HMAC<SHA256>.isValidAuthenticationCode(mac, authenticating: input, using: key)
    }
}
