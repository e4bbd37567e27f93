import Crypto
import FoundationEssentials
import KioskAuthCore

#if canImport(Glibc)
    import Glibc
#endif

/// The audit chain's head, as the anchor records it.
public struct AuditHeadMark: Sendable, Equatable {
    /// Sequence number of the head entry (0: the chain was empty).
    public var sequence: Int
    /// The head entry's MAC (empty for sequence 0).
    public var mac: [UInt8]

    public init(sequence: Int, mac: [UInt8]) {
        self.sequence = sequence
        self.mac = mac
    }

    /// Parses `SEQ:MAC` (MAC in hex), as `audit verify --head` takes it and the journal's
    /// `audit_seq`/`audit_head` fields give it.
    public init?(parsing text: String) {
        let parts = text.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 2, let sequence = Int(parts[0]), sequence >= 0 else { return nil }
        guard let mac = Hex.decode(parts[1]), mac.count == (sequence == 0 ? 0 : 32) else { return nil }
        self.init(sequence: sequence, mac: mac)
    }

    public var text: String { "\(sequence):\(Hex.encode(mac))" }
}

/// A durable copy of the audit chain's head outside the database: the file `audit-head` beside
/// it, so that deleting the newest audit rows (and the head recorded in the database with them)
/// is still found after later entries are added.
///
/// The file holds two fixed-size slots; a head with sequence N goes to slot N mod 2 with one
/// `pwrite` and `fdatasync`, so a torn write can only damage the slot being written and the other
/// one still holds the previous head. Each slot is one text line: the store's id, the sequence,
/// the head MAC, and an HMAC over them under a key derived from the store key (label
/// "audit-head"), so the anchor cannot be forged or moved to another store without the key. The
/// newest valid slot is the anchor.
///
/// Ordering rule: the anchor never claims a head the database does not durably have. It is
/// written after a durable commit returns, and after a commit that skipped `fsync` only once the
/// background WAL sync has made that commit durable. So after any crash or power cut the anchor
/// is at or behind the database's head, and verification accepts an anchor at or behind the
/// chain's end provided the chain's entry at that sequence has the anchor's MAC; an anchor ahead
/// of the chain, or one whose entry has another MAC, means the chain was truncated or rolled back.
final class AuditAnchor: @unchecked Sendable {
    static let fileName = "audit-head"
    static let slotSize = 256
    private static let magic = "kioskauth-audit-head-v1"

    let path: String
    private let key: SymmetricKey
    /// The store's id, set once the store is open (before any read or write).
    var storeID: [UInt8] = []
    private let lock = Lock()
    private var descriptor: Int32 = -1
    /// The highest sequence written: writes arriving out of order never replace a newer head.
    private var written = -1
    /// The head last written (or read at startup).
    private var last: AuditHeadMark?
    /// Set once the chain is found not to contain the anchored head: the anchor then keeps
    /// that head, so the truncation stays visible however many entries follow.
    private var frozen = false

    init(directory: String, key: SymmetricKey) {
        path = directory + "/" + Self.fileName
        self.key = key
    }

    private func tag(sequence: Int, mac: [UInt8]) -> [UInt8] { tag(storeID: storeID, sequence: sequence, mac: mac) }

    private func tag(storeID: [UInt8], sequence: Int, mac: [UInt8]) -> [UInt8] {
        var input = Array(Self.magic.utf8) + [0] + storeID
        withUnsafeBytes(of: UInt64(sequence).bigEndian) { input += $0 }
        input += mac
        return Array(HMAC<SHA256>.authenticationCode(for: input, using: key))
    }

    private func slot(for head: AuditHeadMark) -> [UInt8] {
        let line =
            "\(Self.magic) \(Hex.encode(storeID)) \(head.sequence) \(head.mac.isEmpty ? "-" : Hex.encode(head.mac)) \(Hex.encode(tag(sequence: head.sequence, mac: head.mac)))\n"
        var bytes = Array(line.utf8)
        bytes += [UInt8](repeating: UInt8(ascii: " "), count: max(0, Self.slotSize - bytes.count))
        return bytes
    }

    /// Whether the file exists.
    var exists: Bool { access(path, F_OK) == 0 }

    /// Writes `head` durably unless a newer head was already written. Returns false when the
    /// file could not be written (the caller logs it; the commit itself stands).
    @discardableResult
    func write(_ head: AuditHeadMark) -> Bool {
        lock.withLock {
            guard head.sequence > written, !frozen else { return true }
            if descriptor < 0 {
                let created = access(path, F_OK) != 0
                descriptor = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
                guard descriptor >= 0 else { return false }
                if created {
                    // Make the new name durable too.
                    let directory = directoryName(of: path)
                    let dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                    if dfd >= 0 {
                        _ = fsync(dfd)
                        _ = Glibc.close(dfd)
                    }
                }
            }
            let bytes = slot(for: head)
            let offset = off_t((head.sequence % 2) * Self.slotSize)
            let count = bytes.withUnsafeBytes { pwrite(descriptor, $0.baseAddress, $0.count, offset) }
            guard count == bytes.count, fdatasync(descriptor) == 0 else { return false }
            written = head.sequence
            last = head
            return true
        }
    }

    /// The head the anchor holds, read from the file at startup or last written.
    var lastHead: AuditHeadMark? { lock.withLock { last } }

    /// Whether the anchor stopped following the chain.
    var isFrozen: Bool { lock.withLock { frozen } }

    /// Stops following the chain: it no longer contains the anchored head.
    func freeze() { lock.withLock { frozen = true } }

    /// Reads the file at startup: the anchor only moves forward from the head it holds. A
    /// missing or invalid file freezes it (it is not silently recreated).
    func load() {
        let reading = read()
        lock.withLock {
            switch reading {
            case .head(let head):
                last = head
                written = head.sequence
            case .missing, .invalid:
                frozen = true
            }
        }
    }

    /// What the file says.
    enum Reading: Equatable {
        case missing
        /// Present, but no slot checks out (edited, torn in both slots, or another store's).
        case invalid
        case head(AuditHeadMark)
    }

    func read() -> Reading { read(storeID: storeID) }

    /// Which store the file anchors and how far, before the database is open (so a missing or
    /// emptied database is told from a new one): the store id is taken from the file and the
    /// slot's HMAC checked with it. nil when no slot checks out under this key.
    func peek() -> (storeID: [UInt8], head: AuditHeadMark)? {
        guard let data = FileManager.default.contents(atPath: path) else { return nil }
        var best: (storeID: [UInt8], head: AuditHeadMark)?
        for index in 0..<2 {
            let start = index * Self.slotSize
            guard data.count > start else { continue }
            let end = min(data.count, start + Self.slotSize)
            let text = String(decoding: [UInt8](data)[start..<end], as: UTF8.self)
            let fields = text.split(separator: "\n").first?.split(separator: " ") ?? []
            guard fields.count == 5, let id = Hex.decode(fields[1]) else { continue }
            if case .head(let head) = read(storeID: id), head.sequence > (best?.head.sequence ?? -1) {
                best = (id, head)
            }
        }
        return best
    }

    /// What the anchor records, for a refusal: which store and how far.
    func describeForRollback() -> String {
        guard let (id, head) = peek() else {
            return "the audit head anchor \(path) exists (and does not check out under this key)"
        }
        return "the audit head anchor \(path) records store \(Hex.encode(id)) at audit entry \(head.sequence)"
    }

    /// Forgets the frozen state and the head written, and writes `head`: only when an admin
    /// accepted a rollback at start-up.
    func reset(to head: AuditHeadMark) -> Bool {
        lock.withLock {
            // Both slots go: the other may hold a head of the store that was lost.
            if descriptor >= 0 {
                _ = ftruncate(descriptor, 0)
            } else {
                _ = truncate(path, 0)
            }
            frozen = false
            written = -1
        }
        return write(head)
    }

    private func read(storeID: [UInt8]) -> Reading {
        guard let data = FileManager.default.contents(atPath: path) else { return .missing }
        let bytes = [UInt8](data)
        var best: AuditHeadMark?
        for index in 0..<2 {
            let start = index * Self.slotSize
            guard bytes.count >= start + 1 else { continue }
            let end = min(bytes.count, start + Self.slotSize)
            let text = String(decoding: bytes[start..<end], as: UTF8.self)
            let fields = text.split(separator: "\n").first?.split(separator: " ") ?? []
            guard fields.count == 5, fields[0] == Self.magic, Hex.decode(fields[1]) == storeID,
                let sequence = Int(fields[2]), sequence >= 0,
                let mac = fields[3] == "-" ? [] : Hex.decode(fields[3]), let tag = Hex.decode(fields[4]),
                tag == self.tag(storeID: storeID, sequence: sequence, mac: mac)
            else { continue }
            if sequence > (best?.sequence ?? -1) { best = AuditHeadMark(sequence: sequence, mac: mac) }
        }
        if let best { return .head(best) }
        return .invalid
    }

    func close() {
        lock.withLock {
            if descriptor >= 0 {
                _ = Glibc.close(descriptor)
                descriptor = -1
            }
        }
    }
}
