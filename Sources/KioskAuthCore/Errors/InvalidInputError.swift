/// A value typed by a person or sent by a caller was refused before any work was done.
///
/// `field` names the input (for example `"login"`, `"roles"`, `"activationCode"`) so a caller can
/// point at it; `message` is one plain sentence a person can act on.
public struct InvalidInputError: Error, CustomStringConvertible, Sendable, Equatable {
    /// The name of the refused input, stable enough for programs to match on.
    public var field: String
    /// One plain sentence saying what is wrong with the input.
    public var message: String

    /// Makes an error for the input named `field`.
    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }

    /// `field: message`.
    public var description: String { "\(field): \(message)" }
}
