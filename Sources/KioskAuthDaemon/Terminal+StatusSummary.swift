import FoundationEssentials
import KioskAuthProtocol
import KioskAuthStore

extension TerminalAuthority {
    /// How many recent unlocks `GetStatus` lists.
    static let statusRecentUnlocks = 5

    /// `status` with what only admins see: who is locked out and the last unlocks. Others get
    /// `status` unchanged (those fields absent), as with every list that names people.
    func withAdminSummary(_ status: Message.Status, for caller: Caller) throws(APIError) -> Message.Status {
        guard groups.isAdmin(caller) else { return status }
        let people = try withStore(caller, action: .status) { () throws(StoreError) in try store.people() }.map(record)
        var status = status
        status.lockedOut = people.filter { $0.passcodeHardLocked || $0.passcodeLockedUntil != nil }.map {
            LockedOutPerson(
                name: $0.name, until: $0.passcodeHardLocked ? nil : $0.passcodeLockedUntil,
                hardLocked: $0.passcodeHardLocked)
        }
        status.lastUnlocks =
            people.compactMap { person in person.lastUnlockAt.map { (person.name, $0) } }
            .sorted { $0.1 > $1.1 }.prefix(Self.statusRecentUnlocks).map { RecentUnlock(name: $0.0, at: $0.1) }
        return status
    }
}
