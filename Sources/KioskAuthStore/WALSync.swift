import Dispatch
import FoundationEssentials

#if canImport(Glibc)
    import Glibc
#endif

/// Makes commits that were written without `fsync` durable shortly afterwards, off the caller's
/// path.
///
/// A commit made with `synchronous=NORMAL` in WAL mode reaches the WAL file but is not synced;
/// syncing that file later makes it durable (SQLite's frame checksums discard a torn tail after a
/// power cut, so the store stays consistent either way). The sync runs on its own queue through
/// a descriptor of the WAL file, so it never holds the store's lock. Requests coalesce: while a
/// sync is pending, another request adds nothing.
///
/// SQLite takes no locks on the WAL file itself (its locks live on the database and `-shm`
/// files), so holding and closing this descriptor cannot drop one of SQLite's POSIX locks.
final class WALSync: @unchecked Sendable {
    private let path: String
    private let queue = DispatchQueue(label: "io.kioskauth.store.wal-sync", qos: .utility)
    private let lock = Lock()
    private var descriptor: Int32 = -1
    private var pending = false
    private var closed = false
    /// Where a head made durable by the next sync is recorded, and that head.
    var anchor: AuditAnchor?
    private var pendingHead: AuditHeadMark?

    init(databasePath: String) {
        self.path = databasePath + "-wal"
    }

    /// Whether the WAL file can be synced from here; when it cannot, callers commit durably.
    func available() -> Bool {
        lock.withLock {
            if closed { return false }
            if descriptor < 0 {
                descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
            }
            return descriptor >= 0
        }
    }

    /// Syncs the WAL file soon; with `head`, then writes that audit head to the anchor (only
    /// once the commit that made it is durable, so the anchor never runs ahead of the store).
    func request(head: AuditHeadMark? = nil) {
        let fd: Int32? = lock.withLock {
            if let head, head.sequence > (pendingHead?.sequence ?? -1) { pendingHead = head }
            guard !pending, !closed, descriptor >= 0 else { return nil }
            pending = true
            return descriptor
        }
        guard let fd else { return }
        queue.async { [self] in
            let head = lock.withLock {
                pending = false
                defer { pendingHead = nil }
                return pendingHead
            }
            if fdatasync(fd) == 0, let head { anchor?.write(head) }
        }
    }

    /// Finishes any pending sync and closes the descriptor.
    func close() {
        queue.sync {}
        lock.withLock {
            closed = true
            if descriptor >= 0 {
                if fdatasync(descriptor) == 0, let head = pendingHead { anchor?.write(head) }
                pendingHead = nil
                _ = Glibc.close(descriptor)
                descriptor = -1
            }
        }
    }
}
