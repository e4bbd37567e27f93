public import FoundationEssentials
public import Logging

#if canImport(Glibc)
    import Glibc
#endif

/// Where the store key comes from.
public enum StoreKeySource: Sendable, Equatable {
    /// `$CREDENTIALS_DIRECTORY/kioskauth.store-key`, decrypted by systemd from
    /// `LoadCredentialEncrypted=`.
    case credential(path: String)
    /// A key file beside the database, for development only.
    case developmentKeyFile(path: String)
}

/// Finds and reads the store key.
public enum StoreKeyLoader {
    /// Name of the systemd credential holding the key.
    public static let credentialName = "kioskauth.store-key"
    /// Name of the development key file in the state directory.
    public static let developmentKeyFileName = "store.key"

    /// Loads the key: the systemd credential when present; otherwise, only if
    /// `allowDevelopmentKeyFile`, a key file in `stateDirectory` (created 0600 when neither it
    /// nor a store exists). A missing credential without that permission is an error.
    public static func load(
        credentialsDirectory: String?, stateDirectory: String, storeExists: Bool, allowDevelopmentKeyFile: Bool,
        logger: Logger
    ) throws(StoreError) -> (StoreKey, StoreKeySource) {
        if let credentialsDirectory {
            let path = credentialsDirectory + "/" + credentialName
            if FileManager.default.fileExists(atPath: path) {
                return (
                    try StoreKey(bytes: try readSecret(path, what: "credential \(credentialName)")),
                    .credential(path: path)
                )
            }
        }
        guard allowDevelopmentKeyFile else {
            throw StoreError(
                .keyUnavailable(
                    "no credential \(credentialName) in \(credentialsDirectory.map { "$CREDENTIALS_DIRECTORY (\($0))" } ?? "$CREDENTIALS_DIRECTORY (unset)"); "
                        + "install it with LoadCredentialEncrypted= (see kioskauthd(8)), or pass --development-key-file for a development setup"
                ))
        }
        let path = stateDirectory + "/" + developmentKeyFileName
        logger.warning(
            "USING A DEVELOPMENT KEY FILE: the store key lies unencrypted beside the database; anyone who can read \(path) can read every secret. Never do this on a real terminal.",
            metadata: ["path": "\(path)"])
        if FileManager.default.fileExists(atPath: path) {
            return (
                try StoreKey(bytes: try readSecret(path, what: "development key file")), .developmentKeyFile(path: path)
            )
        }
        guard !storeExists else {
            throw StoreError(
                .keyUnavailable(
                    "a store exists but its development key file \(path) is missing; refusing to create a new key that could never open it"
                ))
        }
        let key = StoreKey.random()
        let fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else {
            throw StoreError(.keyUnavailable("cannot create \(path): \(String(cString: strerror(errno)))"))
        }
        defer { close(fd) }
        let written = key.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        guard written == StoreKey.byteCount, fsync(fd) == 0 else {
            unlink(path)
            throw StoreError(.keyUnavailable("cannot write \(path): \(String(cString: strerror(errno)))"))
        }
        return (key, .developmentKeyFile(path: path))
    }

    private static func readSecret(_ path: String, what: String) throws(StoreError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else {
            throw StoreError(.keyUnavailable("cannot open \(what) \(path): \(String(cString: strerror(errno)))"))
        }
        defer { close(fd) }
        var status = stat()
        guard fstat(fd, &status) == 0, status.st_mode & S_IFMT == S_IFREG else {
            throw StoreError(.keyUnavailable("\(what) \(path) is not a regular file"))
        }
        guard status.st_mode & 0o077 == 0 else {
            throw StoreError(
                .keyUnavailable(
                    "\(what) \(path) is readable by others (mode \(String(status.st_mode & 0o777, radix: 8))); it must be 0600 or stricter"
                ))
        }
        var bytes = [UInt8](repeating: 0, count: StoreKey.byteCount + 1)
        let count = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count >= 0 else {
            throw StoreError(.keyUnavailable("cannot read \(what) \(path): \(String(cString: strerror(errno)))"))
        }
        guard count == StoreKey.byteCount else {
            throw StoreError(.keyUnavailable("\(what) \(path) must hold exactly \(StoreKey.byteCount) bytes"))
        }
        return Array(bytes.prefix(count))
    }
}
