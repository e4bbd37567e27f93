// For SOCK_DGRAM and SOCK_CLOEXEC, which the C helpers' module also sees (<sys/socket.h>): once
// this module gained the metrics and journal files, a clean build no longer found them through
// Glibc alone in this file ("cannot find 'SOCK_DGRAM' in scope"); why is not understood yet.
import CKioskAuthSystem
public import FoundationEssentials

#if canImport(Glibc)
    import Glibc
#endif

/// The systemd service protocol, spoken directly (no libsystemd): readiness and watchdog
/// notifications on `NOTIFY_SOCKET`, and sockets passed with `LISTEN_FDS`.
public struct SystemdNotifier: Sendable {
    private let socketPath: String?

    /// Reads `NOTIFY_SOCKET` from `environment`; with none set, notifications do nothing.
    public init(environment: [String: String]? = nil) {
        socketPath = EnvironmentLookup(environment)["NOTIFY_SOCKET"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Whether a service manager listens.
    public var isEnabled: Bool { socketPath != nil }

    /// Sends `state` (e.g. `READY=1\nSTATUS=Serving`) as one datagram. Failures are returned,
    /// not thrown: a lost notification must not take the daemon down.
    @discardableResult
    public func notify(_ state: String) -> Bool {
        guard let socketPath else { return false }
        let fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        var pathBytes = Array(socketPath.utf8)
        // A leading '@' names an abstract socket: a NUL byte in the kernel's view.
        let isAbstract = pathBytes.first == UInt8(ascii: "@")
        if isAbstract { pathBytes[0] = 0 }
        guard pathBytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return false }
        withUnsafeMutableBytes(of: &address.sun_path) { $0.copyBytes(from: pathBytes) }
        let length = socklen_t(MemoryLayout<sa_family_t>.size + pathBytes.count + (isAbstract ? 0 : 1))
        let bytes = Array(state.utf8)
        let sent = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { sockaddrPointer in
                bytes.withUnsafeBytes {
                    sendto(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL), sockaddrPointer, length)
                }
            }
        }
        return sent == bytes.count
    }

    /// The watchdog interval the manager expects, from `WATCHDOG_USEC` (and `WATCHDOG_PID`,
    /// which must be ours when set).
    public static func watchdogInterval(
        environment given: [String: String]? = nil
    ) -> Duration? {
        let environment = EnvironmentLookup(given)
        guard let text = environment["WATCHDOG_USEC"], let usec = UInt64(text), usec > 0 else { return nil }
        if let pid = environment["WATCHDOG_PID"], Int32(pid) != getpid() { return nil }
        return .microseconds(usec)
    }

    /// The first socket passed by the manager (`LISTEN_FDS`, fd 3), when it is for us.
    public static func listenedSocket(environment given: [String: String]? = nil) -> Int32? {
        let environment = EnvironmentLookup(given)
        guard let count = environment["LISTEN_FDS"].flatMap(Int.init), count >= 1 else { return nil }
        if let pid = environment["LISTEN_PID"], Int32(pid) != getpid() { return nil }
        let fd: Int32 = 3
        // Keep the inherited descriptor from leaking into anything we start.
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        return fd
    }

    /// Clears the variables so nothing we start inherits them.
    public static func unsetListenEnvironment() {
        unsetenv("LISTEN_FDS")
        unsetenv("LISTEN_PID")
        unsetenv("LISTEN_FDNAMES")
    }
}
