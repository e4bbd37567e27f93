import FoundationEssentials
import KioskAuthCore
import KioskAuthProtocol
import KioskAuthStore

extension CredentialAuthority {
    /// The reason recorded when an admin suspends someone without giving one.
    static let defaultSuspensionReason = "suspended by an admin"

    /// Suspends a person: refused everywhere, sessions ended, tickets voided; secrets kept.
    func suspendPerson(_ caller: Caller, _ input: Message.SuspendPerson) throws(APIError) -> PersonRecord {
        try requireAdmin(caller, action: .personSuspend, person: input.name)
        let name = try loginName(input.name)
        let person = try existingPerson(name, caller: caller, action: .personSuspend)
        let reason = input.reason.map { $0.trimmingWhitespace(newlines: false) } ?? ""
        guard reason.utf8.count <= 200 else {
            throw APIError.invalidInput("reason", "at most 200 bytes")
        }
        let recorded = reason.isEmpty ? Self.defaultSuspensionReason : reason
        try audited(caller, action: .personSuspend, person: name.rawValue) { tx throws(StoreError) in
            try store.setSuspension(recorded, for: person, now: now())
            try tx.audit(caller, action: .personSuspend, result: .success, person: name.rawValue, detail: recorded)
        }
        context.tickets.void(personID: person.id)
        _ = online.endSessions(of: person.id, reason: .securityLogout)
        return record(try existingPerson(name, caller: caller, action: .personSuspend))
    }

    /// Makes a person an admin suspended active again.
    func resumePerson(_ caller: Caller, _ name: String) throws(APIError) -> PersonRecord {
        try requireAdmin(caller, action: .personResume, person: name)
        let name = try loginName(name)
        let person = try existingPerson(name, caller: caller, action: .personResume)
        guard person.state == .suspended else {
            throw APIError.invalidInput("name", "\(name.rawValue) is not suspended")
        }
        if person.origin == .idp {
            audit(
                caller, action: .personResume, result: .refused, person: name.rawValue,
                detail: "an identity-provider person resumes by signing in online")
            throw APIError.invalidInput(
                "name", "\(name.rawValue) comes from the identity provider: they resume by signing in online")
        }
        try audited(caller, action: .personResume, person: name.rawValue) { tx throws(StoreError) in
            try store.setSuspension(nil, for: person, now: now())
            try tx.audit(caller, action: .personResume, result: .success, person: name.rawValue)
        }
        return record(try existingPerson(name, caller: caller, action: .personResume))
    }
}
