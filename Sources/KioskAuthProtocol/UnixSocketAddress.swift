#if canImport(Glibc)
    public import Glibc
#endif

/// A Unix socket path as the kernel takes it (`sockaddr_un`): the one place the daemon's
/// listener and the clients build it.
public enum UnixSocketAddress {
    /// Calls `body` with `path` as a `sockaddr_un` and its length, and returns what it returns;
    /// nil, with `errno` set to `ENAMETOOLONG`, when the path does not fit.
    public static func with<Result>(
        _ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> Result
    ) -> Result? {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            errno = ENAMETOOLONG
            return nil
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
    }
}
