/// The version of kioskauth: what kioskauthd reports (GetInfo, GetStatus, --version) and what
/// kioskauthctl --version prints. The one place it is written.
public enum KioskAuthVersion {
    public static let string = "0.1.0"
}
