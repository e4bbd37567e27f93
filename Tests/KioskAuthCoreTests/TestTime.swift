import Foundation

/// A fixed instant tests measure from; nothing in these tests reads the real clock.
let testStart = Date(timeIntervalSince1970: 1_750_000_000)

extension Date {
    /// `self` moved by `seconds`.
    func plus(_ seconds: TimeInterval) -> Date { addingTimeInterval(seconds) }
}
