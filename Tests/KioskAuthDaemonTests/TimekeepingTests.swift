import KioskAuthCore
import KioskAuthProtocol
import Testing

@testable import KioskAuthDaemon

/// The timekeeping service re-checks open sessions every second and feeds the offline window a
/// clock reading every minute. With no session open there is nothing to check each second, so
/// an idle daemon sleeps until the next reading is due instead of waking the CPU every second.
@Suite("Timekeeping: an idle daemon does not tick every second")
struct TimekeepingTests {
    static let observation = OfflineWindow.recommendedObservationInterval

    @Test("With no session open the service waits until the next clock reading is due")
    func idleWaitsForTheNextObservation() async throws {
        let fixture = try DispatcherFixture(systemClock: true)
        let online = fixture.authority.online
        // The first tick takes the first reading, so the next is a whole interval away.
        let first = await online.timekeepingTick()
        #expect(first > Self.observation - .seconds(5) && first <= Self.observation)
        // A reading is not taken again before it is due: the wait only shrinks.
        let second = await online.timekeepingTick()
        #expect(second <= first && second > .seconds(1))
    }

    @Test("An open session is checked every second, and the idle wait comes back when it closes")
    func anOpenSessionTicksEverySecond() async throws {
        let fixture = try DispatcherFixture(systemClock: true)
        let online = fixture.authority.online
        try await fixture.addPerson("alice")
        try await fixture.setPasscode("alice", "7391846")
        let opened = try await fixture.call("OpenSession", ["name": .string("alice")], as: fixture.root).get()
        guard case .object(let fields) = opened, case .object(let session)? = fields["session"],
            case .string(let id)? = session["id"]
        else {
            Issue.record("no session id in \(opened)")
            return
        }
        #expect(await online.timekeepingTick() == .seconds(1))
        #expect(await fixture.error("CloseSession", ["id": .string(id)], as: fixture.root) == nil)
        #expect(await online.timekeepingTick() > .seconds(1))
    }

    @Test("Under a test clock the service ticks every second: tests move that clock at will")
    func aTestClockTicksEverySecond() async throws {
        let fixture = try DispatcherFixture()
        #expect(await fixture.authority.online.timekeepingTick() == .seconds(1))
        fixture.clock.advance(3600)
        #expect(await fixture.authority.online.timekeepingTick() == .seconds(1))
    }
}
