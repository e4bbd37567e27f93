import Crypto
public import FoundationEssentials

/// Who made a data-key generation, and who is a member (docs/fleet.md §6.2).
///
/// HPKE base mode does not say who wrapped a key, and members' public keys are in the
/// directory, so a wrapped key proves nothing about where it came from. Anyone who can write to
/// the directory (its owner, a superuser, whoever restores a doctored backup) could otherwise
/// wrap a generation of their own making to every member, and add a `member` row with a public
/// key of their own for the next rotation to be wrapped to. Three MACs close that, each under a
/// secret a directory writer does not hold:
///
/// * **chain**: each generation after the first carries HMAC under the previous generation's
///   key (`data_keys.chain_mac`). A member takes a generation it does not hold only if it holds
///   the one before and the chain MAC opens with it.
/// * **admission**: the member that admits a newcomer MACs every generation it wraps to it under
///   the join token's secret, which only the issuer and the newcomer know
///   (`terminals.admission_mac`, covering generations 1 … `admitted_through`).
/// * **vouch**: every member row carries HMAC, under a data key, of the terminal's id and public
///   key (`terminals.vouch_mac`, `vouch_generation`), made by the admitting member (or, for the
///   creator and rows older than migration 4, by the terminal itself). A rotation wraps the new
///   generation only to members whose vouch opens.
public enum FleetKeyAuthentication {
    /// The chain MAC of `key`, made with the generation before it.
    public static func chainMAC(of key: FleetDataKey, under previous: FleetDataKey) -> Data {
        Data(HMAC<SHA256>.authenticationCode(for: chainInput(key), using: previous.derived(for: "generation-chain")))
    }

    /// Whether `mac` is `key`'s chain MAC under `previous` (compared in constant time).
    public static func isValidChainMAC(_ mac: Data, of key: FleetDataKey, under previous: FleetDataKey) -> Bool {
        HMAC<SHA256>.isValidAuthenticationCode(
            mac, authenticating: chainInput(key), using: previous.derived(for: "generation-chain"))
    }

    /// The admission MAC over every generation wrapped to a newcomer, under the join secret.
    public static func admissionMAC(
        joinSecret: [UInt8], terminal: UUID, publicKey: [UInt8], keys: [FleetDataKey]
    ) -> Data {
        Data(
            HMAC<SHA256>.authenticationCode(
                for: admissionInput(terminal: terminal, publicKey: publicKey, keys: keys),
                using: SymmetricKey(data: joinSecret)))
    }

    /// Whether `mac` is the admission MAC of `keys` under `joinSecret` (in constant time).
    public static func isValidAdmissionMAC(
        _ mac: Data, joinSecret: [UInt8], terminal: UUID, publicKey: [UInt8], keys: [FleetDataKey]
    ) -> Bool {
        HMAC<SHA256>.isValidAuthenticationCode(
            mac, authenticating: admissionInput(terminal: terminal, publicKey: publicKey, keys: keys),
            using: SymmetricKey(data: joinSecret))
    }

    /// The vouch for a member row: its id and public key, under `key`.
    public static func vouchMAC(terminal: UUID, publicKey: [UInt8], under key: FleetDataKey) -> Data {
        Data(
            HMAC<SHA256>.authenticationCode(
                for: vouchInput(terminal: terminal, publicKey: publicKey), using: key.derived(for: "member-vouch")))
    }

    /// Whether `mac` vouches for the member row (`terminal`, `publicKey`) under `key`.
    public static func isValidVouch(_ mac: Data, terminal: UUID, publicKey: [UInt8], under key: FleetDataKey) -> Bool {
        HMAC<SHA256>.isValidAuthenticationCode(
            mac, authenticating: vouchInput(terminal: terminal, publicKey: publicKey),
            using: key.derived(for: "member-vouch"))
    }

    package static func chainInput(_ key: FleetDataKey) -> Data {
        var input = Data("kioskauth.fleet.generation.v1\u{0}".utf8)
        input += bigEndian(key.generation)
        key.key.withUnsafeBytes { input += $0 }
        return input
    }

    package static func admissionInput(terminal: UUID, publicKey: [UInt8], keys: [FleetDataKey]) -> Data {
        var input = Data("kioskauth.fleet.admission.v1\u{0}\(terminal.fleetText)\u{0}".utf8) + Data(publicKey)
        for key in keys.sorted(by: { $0.generation < $1.generation }) {
            input += bigEndian(key.generation)
            key.key.withUnsafeBytes { input += $0 }
        }
        return input
    }

    package static func vouchInput(terminal: UUID, publicKey: [UInt8]) -> Data {
        Data("kioskauth.fleet.member.v1\u{0}\(terminal.fleetText)\u{0}".utf8) + Data(publicKey)
    }

    /// Which of the generations delivered to a terminal it may take (`FleetKeyDelivery`), given
    /// the generations it already holds (trusted: its own store) and, while it has none, the
    /// join secret its admission is MACed under. Nothing is taken on the directory's word:
    ///
    /// * a generation already held must unwrap to the same key (a replaced one is refused and
    ///   the held one kept);
    /// * with nothing held, generations 1 … `admitted_through` are taken together if the
    ///   admission MAC opens with the join secret;
    /// * any other generation is taken only if the one before it is held (or taken just now)
    ///   and its chain MAC opens with that one.
    ///
    /// Every refusal is returned with its reason; refused generations are never taken.
    public static func accept(
        _ delivery: FleetKeyDelivery, keyPair: TerminalKeyPair, terminal: UUID, held: [FleetDataKey],
        joinSecret: [UInt8]?
    ) -> FleetKeyAcceptance {
        var trusted = Dictionary(held.map { ($0.generation, $0) }, uniquingKeysWith: { first, _ in first })
        var result = FleetKeyAcceptance()
        var opened: [Int32: (wrapped: WrappedDataKey, key: FleetDataKey)] = [:]
        // Two rows for one generation: neither is taken, whichever opens.
        let listedTwice = Set(
            Dictionary(grouping: delivery.wrapped, by: \.generation).filter { $0.value.count > 1 }.keys)
        for wrapped in delivery.wrapped {
            // Generations start at 1 (the directory's CHECK, which its owner can drop): anything
            // else is refused here, before any arithmetic on it.
            guard wrapped.generation >= 1 else {
                result.refused.append((wrapped.generation, "generation \(wrapped.generation) is not a generation"))
                continue
            }
            guard wrapped.terminalID == terminal else {
                result.refused.append(
                    (wrapped.generation, "generation \(wrapped.generation) is wrapped to another terminal"))
                continue
            }
            guard !listedTwice.contains(wrapped.generation) else {
                result.refused.append((wrapped.generation, "generation \(wrapped.generation) is listed twice"))
                continue
            }
            do {
                opened[wrapped.generation] = (wrapped, try wrapped.unwrap(with: keyPair))
            } catch {
                result.refused.append((wrapped.generation, "\(error)"))
            }
        }
        // Held generations: the directory may list them, but never change them (SymmetricKey's
        // == compares in constant time).
        for (generation, entry) in opened.sorted(by: { $0.key < $1.key }) {
            guard let mine = trusted[generation] else { continue }
            if mine.key != entry.key.key {
                result.refused.append(
                    (
                        generation,
                        "the directory lists another key for generation \(generation), which this terminal holds"
                    ))
            }
            opened[generation] = nil
        }
        // A newcomer's first keys: exactly the generations its admission names, all present.
        if trusted.isEmpty, let admission = delivery.admission {
            let through = admission.through
            // Bounded by what was delivered: a made-up `admitted_through` never drives the loop.
            let plausible = through >= 1 && Int(through) <= opened.count
            let admitted = plausible ? (1...through).compactMap { opened[$0]?.key } : []
            let verifies =
                plausible && admitted.count == Int(through)
                && joinSecret.map {
                    isValidAdmissionMAC(
                        admission.mac, joinSecret: $0, terminal: terminal, publicKey: keyPair.publicKey,
                        keys: admitted)
                } == true
            if verifies {
                for key in admitted {
                    trusted[key.generation] = key
                    result.accepted.append(opened[key.generation]!.wrapped)
                    opened[key.generation] = nil
                }
            } else {
                let why =
                    joinSecret == nil
                    ? "this terminal no longer has the join secret to check its admission with"
                    : "the admission MAC over generations 1…\(through) does not open with the join secret"
                for generation in opened.keys.sorted() where generation <= through {
                    result.refused.append((generation, why))
                    opened[generation] = nil
                }
            }
        }
        // Later generations, each by the one before it.
        for generation in opened.keys.sorted() {
            guard let entry = opened[generation] else { continue }
            guard generation > 1, let previous = trusted[generation - 1] else {
                result.refused.append(
                    (generation, "generation \(generation) cannot be checked: generation \(generation - 1) is not held")
                )
                continue
            }
            guard let mac = delivery.chainMACs[generation], isValidChainMAC(mac, of: entry.key, under: previous) else {
                result.refused.append(
                    (generation, "generation \(generation) carries no valid MAC under generation \(generation - 1)"))
                continue
            }
            trusted[generation] = entry.key
            result.accepted.append(entry.wrapped)
        }
        result.keys = trusted.values.sorted { $0.generation < $1.generation }
        return result
    }

    package static func bigEndian(_ value: Int32) -> Data {
        withUnsafeBytes(of: value.bigEndian) { Data($0) }
    }
}

/// What the directory delivers to one terminal: its wrapped generations, each generation's chain
/// MAC, and its admission (`FleetDirectory.keyDelivery(for:)`).
public struct FleetKeyDelivery: Sendable {
    public var wrapped: [WrappedDataKey]
    /// `data_keys.chain_mac` by generation (none for generation 1, or before migration 4).
    public var chainMACs: [Int32: Data]
    /// The admission MAC and the newest generation it covers, once admitted (migration 4 on).
    public var admission: (mac: Data, through: Int32)?

    public init(wrapped: [WrappedDataKey], chainMACs: [Int32: Data], admission: (mac: Data, through: Int32)?) {
        self.wrapped = wrapped
        self.chainMACs = chainMACs
        self.admission = admission
    }
}

/// The outcome of `FleetKeyAuthentication.accept`.
public struct FleetKeyAcceptance: Sendable {
    /// The generations newly taken, as wrapped (to keep in the store).
    public var accepted: [WrappedDataKey] = []
    /// Every generation now held (the held ones and the newly taken), oldest first.
    public var keys: [FleetDataKey] = []
    /// Generations refused, with why.
    public var refused: [(generation: Int32, reason: String)] = []
}
