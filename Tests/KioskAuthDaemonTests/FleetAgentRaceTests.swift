import Dispatch
import Foundation
import Testing

@testable import KioskAuthDaemon

/// `FleetAgent.race` bounds every directory operation: the answer when it comes in time, nil at
/// the deadline even when the operation ignores cancellation (a connection that stopped
/// answering), and the caller is never held until such an operation ends.
@Suite("Fleet agent: directory operations under a deadline")
struct FleetAgentRaceTests {
    @Test func anAnswerInTime_isReturned() async {
        let answer = await FleetAgent.race(.seconds(5)) { 42 }
        #expect(answer == 42)
    }

    @Test func anOperationThatIgnoresCancellation_isNotWaitedForPastTheDeadline() async {
        let started = ContinuousClock.now
        let answer: Int? = await FleetAgent.race(.milliseconds(200)) {
            // Finishes after 90 s whatever happens: no cancellation reaches it.
            await withCheckedContinuation { continuation in
                DispatchQueue.global().asyncAfter(deadline: .now() + 90) { continuation.resume(returning: 7) }
            }
        }
        let waited = ContinuousClock.now - started
        #expect(answer == nil)
        // Generous: other suites run in parallel and may hold the cooperative threads for
        // seconds (starting PostgreSQL; 12 s once in CI on a loaded 2-core machine), which
        // delays any resumption; waiting for the operation would take 90 s.
        #expect(waited < .seconds(45), "waited \(waited)")
    }

    @Test func manyRaces_eachResumeOnce() async {
        await withTaskGroup(of: Int?.self) { group in
            for index in 0..<200 {
                group.addTask {
                    await FleetAgent.race(.milliseconds(index % 2 == 0 ? 1 : 500)) {
                        try? await Task.sleep(for: .milliseconds(2))
                        return index
                    }
                }
            }
            var answered = 0
            for await answer in group where answer != nil { answered += 1 }
            #expect(answered >= 100)
        }
    }

    /// A `fleet create` or `join` run again finds its recorded attempt however the same directory
    /// and role are written; another host, port, database or role is another directory.
    @Test func aRetrySpeltDifferently_isTheSameDirectory_andAnotherOneIsNot() {
        let url = "postgres://kt_ward3@directory.clinic/fleet"
        #expect(FleetAgent.sameDirectory(url, url))
        #expect(FleetAgent.sameDirectory(url, "postgres://kt_ward3@directory.clinic:5432/fleet"))
        #expect(
            FleetAgent.sameDirectory(
                "postgres://kt_a@127.0.0.1:5432/fleet?sslmode=disable",
                "postgres://kt_a@127.0.0.1/fleet?sslmode=disable"))
        #expect(!FleetAgent.sameDirectory(url, "postgres://kt_ward4@directory.clinic/fleet"))
        #expect(!FleetAgent.sameDirectory(url, "postgres://kt_ward3@directory.clinic:5433/fleet"))
        #expect(!FleetAgent.sameDirectory(url, "postgres://kt_ward3@other.clinic/fleet"))
        #expect(!FleetAgent.sameDirectory(url, "postgres://kt_ward3@directory.clinic/fleet2"))
        #expect(!FleetAgent.sameDirectory(url, "not a url"))
    }
}
