import Foundation
import KioskAuthCore

/// The single-use tickets authentications earn (self-service, activation), by their random
/// value. The rules of one ticket are `LoginTicket`'s; the book issues, finds and forgets them.
/// Times are the terminal's steady time, given by the caller.
@AuthorityActor
final class TicketBook {
    private var tickets: [String: LoginTicket] = [:]

    nonisolated init() {}

    /// A ticket's length in random bytes (a multiple of 8).
    nonisolated static let ticketBytes = 24

    /// Issues a ticket and forgets the expired ones.
    func issue(_ ticket: LoginTicket, now: Date) -> String {
        tickets = tickets.filter { $0.value.isLive(at: now) }
        // 24 random bytes, drawn 8 at a time: each draw is one getrandom call.
        var bytes: [UInt8] = []
        bytes.reserveCapacity(Self.ticketBytes)
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<Self.ticketBytes / 8 {
            withUnsafeBytes(of: generator.next() as UInt64) { bytes += $0 }
        }
        let value = Data(bytes).base64EncodedString()
        tickets[value] = ticket
        return value
    }

    /// Consumes a self-service ticket and returns it when it is valid for the person on the
    /// connection. A ticket presented wrongly dies too.
    func take(_ value: String, personID: Int64, connectionID: UInt64, now: Date) -> LoginTicket? {
        defer { tickets[value] = nil }
        guard isValid(value, personID: personID, connectionID: connectionID, now: now) else { return nil }
        return tickets[value]
    }

    /// Whether a self-service ticket is valid for this person and connection, without using it up.
    func isValid(_ value: String, personID: Int64, connectionID: UInt64, now: Date) -> Bool {
        tickets[value]?.admitsSelfService(personID: personID, connectionID: connectionID, at: now) ?? false
    }

    /// The person and code an activation ticket is for, without using it up.
    func peekActivation(_ value: String, connectionID: UInt64, now: Date) -> (personID: Int64, codeID: Int64)? {
        tickets[value]?.activation(connectionID: connectionID, at: now)
    }

    /// Uses up an activation ticket.
    func consumeActivation(_ value: String, connectionID: UInt64, now: Date) -> (personID: Int64, codeID: Int64)? {
        guard let found = peekActivation(value, connectionID: connectionID, now: now) else { return nil }
        tickets[value] = nil
        return found
    }

    /// Voids every ticket of a person (suspended, removed).
    func void(personID: Int64) {
        tickets = tickets.filter { $0.value.personID != personID }
    }

    /// Forgets every ticket of a closed connection.
    func connectionClosed(_ connectionID: UInt64) {
        tickets = tickets.filter { $0.value.connectionID != connectionID }
    }
}
