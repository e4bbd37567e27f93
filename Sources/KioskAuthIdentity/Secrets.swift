import Crypto
public import FoundationEssentials

/// A token issued by the identity provider (access, refresh, ID or device code).
///
/// Its description is redacted so that string interpolation into a log line cannot leak it;
/// read ``rawValue`` only where the token is sent or sealed. Swift strings cannot be wiped, so
/// the daemon keeps tokens in memory no longer than it must and stores them sealed.
public struct OAuthToken: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The token as the provider issued it.
    public let rawValue: String

    /// Wraps a token received from the provider or loaded from the sealed store.
    public init(_ rawValue: String) {
        self.rawValue = rawValue
    }

    /// `OAuthToken(<redacted>)`.
    public var description: String { "OAuthToken(<redacted>)" }
    /// `OAuthToken(<redacted>)`.
    public var debugDescription: String { description }
}

/// A secret the daemon loads from a systemd credential: the OAuth client secret, the Supabase
/// API key or the Supabase JWT secret.
///
/// Held as a `SymmetricKey`, which zeroes its memory when released; the description is
/// redacted.
public struct CredentialSecret: Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    let key: SymmetricKey

    /// Takes the credential file's bytes. One trailing newline (LF or CRLF), which editors and
    /// `echo` add, is dropped; everything else is kept as is.
    public init(credentialBytes bytes: some DataProtocol) {
        var data = Data(bytes)
        if data.last == UInt8(ascii: "\n") { data.removeLast() }
        if data.last == UInt8(ascii: "\r") { data.removeLast() }
        self.key = SymmetricKey(data: data)
        data.resetBytes(in: 0..<data.count)
    }

    /// Takes a secret given as text (tests and development configurations).
    public init(_ text: String) {
        self.init(credentialBytes: Data(text.utf8))
    }

    /// Calls `body` with the secret as UTF-8 text. Throws if the secret is not valid UTF-8.
    func withText<R>(_ body: (String) throws -> R) throws -> R {
        let text = key.withUnsafeBytes { String(validating: $0, as: UTF8.self) }
        guard let text else {
            throw IdentityError(.misconfigured, "the credential is not valid UTF-8 text")
        }
        return try body(text)
    }

    /// `CredentialSecret(<redacted>)`.
    public var description: String { "CredentialSecret(<redacted>)" }
    /// `CredentialSecret(<redacted>)`.
    public var debugDescription: String { description }
}
