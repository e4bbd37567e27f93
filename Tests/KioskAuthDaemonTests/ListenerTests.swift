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

    private func mode(_ path: String) -> mode_t {
        var status = stat()
        #expect(lstat(path, &status) == 0)
        return status.st_mode & 0o7777
    }

    @Test func itsOwnSocket_isOpenedToEveryone_andListens() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let (fd, identity, lock) = try VarlinkListener.listeningSocket(at: path)
            defer {
                close(fd)
                close(lock)
            }
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
            #expect(throws: VarlinkListener.AlreadyServed.self) { try VarlinkListener.listeningSocket(at: path) }
            #expect(mode(path) == 0o600)  // left as it was
            close(served)
            // Its listener gone, the file is a leftover: replaced.
            #expect(VarlinkListener.probe(path) == .stale)
            let (fd, _, lock) = try VarlinkListener.listeningSocket(at: path)
            close(fd)
            close(lock)
            unlink(path)
            // A file that is not a socket is nobody's leftover.
            #expect(FileManager.default.createFile(atPath: path, contents: Data("x".utf8)))
            #expect(throws: VarlinkListener.ListenError.self) { try VarlinkListener.listeningSocket(at: path) }
            #expect(FileManager.default.contents(atPath: path) == Data("x".utf8))
        }
    }

    @Test func aDirectoryOthersCanChange_isRefused_unlessSticky() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            chmod(directory, 0o777)
            #expect(throws: VarlinkListener.ListenError.self) { try VarlinkListener.listeningSocket(at: path) }
            #expect(access(path, F_OK) != 0)
            chmod(directory, 0o1777)
            let (fd, _, lock) = try VarlinkListener.listeningSocket(at: path)
            close(fd)
            close(lock)
        }
    }

    /// Of two processes setting up the same path, only the one holding `PATH.lock` looks at the
    /// socket file: the other is refused before it could find the file stale and remove a socket
    /// bound a moment later. (Two descriptors of one process conflict as two processes do.)
    @Test func thePathLock_refusesASecondListener_andTouchesNothing() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let (fd, identity, lock) = try VarlinkListener.listeningSocket(at: path)
            let refused = #expect(throws: VarlinkListener.AlreadyServed.self) {
                try VarlinkListener.listeningSocket(at: path)
            }
            #expect(refused?.lockHeld == true)
            #expect(VarlinkListener.identity(of: path) == identity)
            #expect(mode(path + ".lock") == 0o600)
            // The lock let go of, the socket still listening: refused for what the path is.
            close(lock)
            let served = #expect(throws: VarlinkListener.AlreadyServed.self) {
                try VarlinkListener.listeningSocket(at: path)
            }
            #expect(served?.lockHeld == false)
            #expect(VarlinkListener.identity(of: path) == identity)
            // Neither: a leftover, replaced.
            close(fd)
            let (again, _, relock) = try VarlinkListener.listeningSocket(at: path)
            close(again)
            close(relock)
        }
    }

    /// A lock file that is a link, or not a regular file, is nobody's lock to take: refused,
    /// and what it points at is left alone.
    @Test func aLockFileThatIsALinkOrNotAFile_isRefused() throws {
        try withDirectory { directory in
            let path = directory + "/io.kioskauth"
            let target = directory + "/elsewhere"
            #expect(FileManager.default.createFile(atPath: target, contents: Data("x".utf8)))
            #expect(symlink(target, path + ".lock") == 0)
            #expect(throws: VarlinkListener.ListenError.self) { try VarlinkListener.listeningSocket(at: path) }
            #expect(FileManager.default.contents(atPath: target) == Data("x".utf8))
            #expect(access(path, F_OK) != 0)
            unlink(path + ".lock")
            #expect(mkfifo(path + ".lock", 0o600) == 0)
            #expect(throws: VarlinkListener.ListenError.self) { try VarlinkListener.listeningSocket(at: path) }
            #expect(access(path, F_OK) != 0)
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
            let refused = #expect(throws: VarlinkListener.AlreadyServed.self) {
                try VarlinkListener.listeningSocket(at: path)
            }
            #expect(refused?.lockHeld == false)
            #expect(VarlinkListener.identity(of: path) == before)
        }
    }
}
