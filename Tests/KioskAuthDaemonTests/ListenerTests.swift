import Foundation
import KioskAuthProtocol
import Testing

@testable import KioskAuthDaemon

#if canImport(Glibc)
    import Glibc
#endif

/// How the daemon makes its socket file (`VarlinkListener`): what it refuses to touch, and that
/// it never changes a file it did not make (docs/design.md, start-up).
@Suite("socket file")
struct ListenerTests {
    /// A fresh directory, mode 0755, removed at the end.
    private func withDirectory(_ body: (String) throws -> Void) throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("listener-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
        chmod(path, 0o755)
        defer { try? FileManager.default.removeItem(atPath: path) }
        try body(path)
    }

    /// A socket file at `path` (mode from the umask, as any program's), listening or not; the
    /// descriptor stays open until the caller closes it.
    private func socketFile(at path: String, listening: Bool) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        #expect(UnixSocketAddress.with(path, { bind(fd, $0, $1) }) == 0)
        chmod(path, 0o600)
        if listening { #expect(listen(fd, 4) == 0) }
        return fd
    }

    @Test func theSocketsDirectory_isEverythingBeforeTheLastSlash() {
        #expect(VarlinkListener.parentDirectory(of: "/run/kioskauth/io.kioskauth") == "/run/kioskauth")
        #expect(VarlinkListener.parentDirectory(of: "/run/kioskauth/") == "/run/kioskauth")
        #expect(VarlinkListener.parentDirectory(of: "run//io.kioskauth") == "run/")
        #expect(VarlinkListener.parentDirectory(of: "/io.kioskauth") == "/")
        #expect(VarlinkListener.parentDirectory(of: "io.kioskauth") == ".")
        #expect(VarlinkListener.parentDirectory(of: "/tmp/é/sock") == "/tmp/é")
    }

    /// `listeningSocket(at:holding:)` with the path's lock taken for the call and let go of after.
    private func listenLocked(at path: String) throws -> (Int32, VarlinkListener.FileIdentity) {
        let lock = try SocketPathLock.acquire(for: path)
        defer { lock.release() }
        return try VarlinkListener.listeningSocket(at: path, holding: lock)
    }

    private func mode(_ path: String) -> mode_t {
        var status = stat()
        #expect(lstat(path, &status) == 0)
        return status.st_mode & 0o7777
    }

    @Test func itsOwnSocket_isOpenedToEveryone_andListens() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let (fd, identity) = try listenLocked(at: path)
            defer { close(fd) }
            #expect(mode(path) == 0o666)
            #expect(VarlinkListener.identity(of: path) == identity)
            #expect(VarlinkListener.probe(path) == .served)
        }
    }

    @Test func aSymbolicLinkOrAHardLink_isNeverChanged() throws {
        try withDirectory { directory in
            let target = directory + "/someone-elses.sock"
            let fd = socketFile(at: target, listening: true)
            defer { close(fd) }
            let link = directory + "/symlink"
            #expect(symlink(target, link) == 0)
            #expect(VarlinkListener.openToEveryone(link) == nil)
            let hard = directory + "/hardlink"
            #expect(Glibc.link(target, hard) == 0)
            #expect(VarlinkListener.openToEveryone(hard) == nil)
            #expect(mode(target) == 0o600)
        }
    }

    @Test func aServedSocket_isRefused_aStaleOne_replaced_anythingElse_refused() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let served = socketFile(at: path, listening: true)
            #expect(throws: VarlinkListener.AlreadyServed.self) { try listenLocked(at: path) }
            #expect(mode(path) == 0o600)  // left as it was
            close(served)
            // Its listener gone, the file is a leftover: replaced.
            #expect(VarlinkListener.probe(path) == .stale)
            let (fd, _) = try listenLocked(at: path)
            close(fd)
            unlink(path)
            // A file that is not a socket is nobody's leftover.
            #expect(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
            #expect(throws: VarlinkListener.ListenError.self) { try listenLocked(at: path) }
            #expect(FileManager.default.contents(atPath: path) == Data("x".utf8))
        }
    }

    @Test func aDirectoryOthersCanChange_isRefused_unlessSticky() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            chmod(directory, 0o777)
            #expect(throws: VarlinkListener.ListenError.self) { try listenLocked(at: path) }
            #expect(access(path, F_OK) != 0)
            chmod(directory, 0o1777)
            let (fd, _) = try listenLocked(at: path)
            close(fd)
        }
    }

    /// Of two processes setting up the same path, only the one holding `PATH.lock` gets to
    /// look at the socket file: the other is refused before it could find the file stale and
    /// remove a socket bound a moment later. (Two descriptors of one process conflict as two
    /// processes do.)
    @Test func thePathLock_refusesASecondHolder_untilReleased() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let lock = try SocketPathLock.acquire(for: path)
            let (fd, identity) = try VarlinkListener.listeningSocket(at: path, holding: lock)
            let refused = #expect(throws: VarlinkListener.AlreadyServed.self) { try SocketPathLock.acquire(for: path) }
            #expect(refused?.lockHeld == true)
            #expect(VarlinkListener.identity(of: path) == identity)
            #expect(mode(path + ".lock") == 0o600)
            // Let go of, the lock is anyone's again; the socket still listening is refused for
            // what it is.
            lock.release()
            lock.release()  // idempotent
            let served = #expect(throws: VarlinkListener.AlreadyServed.self) { try listenLocked(at: path) }
            #expect(served?.lockHeld == false)
            #expect(VarlinkListener.identity(of: path) == identity)
            // Neither: a leftover, replaced.
            close(fd)
            let (again, _) = try listenLocked(at: path)
            close(again)
        }
    }

    /// A lock file that is a symbolic or hard link, not a regular file, or another user's is
    /// nobody's lock to take: refused, with what it points at left alone. One of root's that
    /// others may read is made 0600 and taken.
    @Test func aLockFileThatIsALinkNotAFileOrAnotherUsers_isRefused() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let lockFile = path + ".lock"
            let target = directory + "/elsewhere"
            #expect(FileManager.default.createFile(atPath: target, contents: Data("x".utf8)))
            #expect(symlink(target, lockFile) == 0)
            #expect(throws: VarlinkListener.ListenError.self) { try SocketPathLock.acquire(for: path) }
            unlink(lockFile)
            #expect(Glibc.link(target, lockFile) == 0)
            #expect(throws: VarlinkListener.ListenError.self) { try SocketPathLock.acquire(for: path) }
            #expect(FileManager.default.contents(atPath: target) == Data("x".utf8))
            unlink(lockFile)
            #expect(mkfifo(lockFile, 0o600) == 0)
            #expect(throws: VarlinkListener.ListenError.self) { try SocketPathLock.acquire(for: path) }
            unlink(lockFile)
            #expect(FileManager.default.createFile(atPath: lockFile, contents: nil))
            #expect(chown(lockFile, 65534, 65534) == 0)
            #expect(throws: VarlinkListener.ListenError.self) { try SocketPathLock.acquire(for: path) }
            #expect(access(path, F_OK) != 0)
            // Root's own, readable by everyone: made 0600 (nobody else may take it), then taken.
            #expect(chown(lockFile, 0, 0) == 0)
            #expect(chmod(lockFile, 0o444) == 0)
            try SocketPathLock.acquire(for: path).release()
            #expect(mode(lockFile) == 0o600)
        }
    }

    /// A socket whose listener is too busy to accept (its backlog full) is still served: the
    /// connect says EAGAIN, not ECONNREFUSED, and the file is not taken for a leftover.
    @Test func aSocketWithAFullBacklog_isServed_notStale() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let busy = socketFile(at: path, listening: false)
            defer { close(busy) }
            #expect(listen(busy, 0) == 0)
            var waiting: [Int32] = []
            defer { waiting.forEach { close($0) } }
            // Nothing accepts: connections queue until the kernel refuses more with EAGAIN.
            var full = false
            while !full && waiting.count < 64 {
                let client = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
                let connected = UnixSocketAddress.with(path, { connect(client, $0, $1) }) == 0
                let error = errno
                waiting.append(client)
                if !connected {
                    #expect(error == EAGAIN)
                    full = true
                }
            }
            #expect(full)
            #expect(VarlinkListener.probe(path) == .served)
            let before = VarlinkListener.identity(of: path)
            let refused = #expect(throws: VarlinkListener.AlreadyServed.self) { try listenLocked(at: path) }
            #expect(refused?.lockHeld == false)
            #expect(VarlinkListener.identity(of: path) == before)
        }
    }
}
