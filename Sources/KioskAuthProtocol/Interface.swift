/// The varlink interface kioskauthd serves.
public enum KioskAuthInterface {
    /// The interface name.
    public static let name = "io.kioskauth"

    /// The interface description text, exactly as in `io.kioskauth.varlink` (embedded in the
    /// binary at build time) without the file's final newline.
    public static let description: String = {
        var text = String(decoding: PackageResources.io_kioskauth_varlink, as: UTF8.self)
        if text.hasSuffix("\n") { text.removeLast() }
        return text
    }()
}
