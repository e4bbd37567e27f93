import CKioskAuthSystem
import NIOCore
import Synchronization

/// What the daemon asks of glibc's allocator so that memory freed after a burst of calls goes
/// back to the kernel instead of staying resident (issue #13 item 4).
///
/// Measured on the live-socket fuzzer (docs/reliability.md): the daemon's live heap stays at about
/// 2 MB however many frames it has parsed, but with glibc's defaults its anonymous RSS kept
/// growing, because (1) each thread that allocates gets an arena of its own (up to 8 per core),
/// each keeping its free memory, and (2) freeing the first block larger than 128 KiB (a long
/// frame's buffer) raises the trim threshold, after which an arena keeps a megabyte or more free
/// at its top for good.
enum MemoryBounds {
    /// Arenas: the socket's event loop, the hashing pool and the cooperative pool share two.
    static let arenas: Int32 = 2
    /// Blocks this large are mapped and unmapped on their own; free memory above it at an arena's
    /// top is returned (glibc's default before it adjusts itself).
    static let threshold: Int32 = 128 * 1024

    /// Applies the bounds; call before the daemon starts its threads.
    static func boundAllocator() {
        kioskauth_bound_allocator(arenas, threshold)
    }

    /// Hands the allocator's free memory back to the kernel now (`malloc_trim`).
    static func releaseFreeMemory() {
        kioskauth_release_free_memory()
    }

    /// Hands the memory a burst of calls freed back to the kernel: half a second after a
    /// connection closes, one `malloc_trim` for every connection that closed meanwhile. Under a
    /// steady stream of connections that is two trims a second (well under a millisecond each
    /// with two small arenas); on an idle kiosk, none.
    final class ReleaseAfterBurst: Sendable {
        private let scheduled = Mutex(false)
        static let delay = TimeAmount.milliseconds(500)

        func connectionClosed(on eventLoop: any EventLoop) {
            let first = scheduled.withLock { scheduled in
                defer { scheduled = true }
                return !scheduled
            }
            guard first else { return }
            eventLoop.scheduleTask(in: Self.delay) {
                self.scheduled.withLock { $0 = false }
                releaseFreeMemory()
            }
        }
    }
}
