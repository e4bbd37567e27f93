import KioskAuthProtocol
import Testing

@testable import KioskAuthDaemon

/// `GetStatus` is answered on the event loop from the frames of its last few distinct answers.
/// A cached frame must never be served for an answer that differs from the one it carries: not
/// after the store changes, not after the uptime ticks, not to a caller of the other rank.
@Suite("Immediate replies: encoded once per distinct answer, never stale")
struct ReplyFrameCacheTests {
    struct Answer: Codable, Equatable, Sendable {
        var people: Int
        var head: String
        var endpoint: String?
    }

    static func fresh(_ answer: Answer) throws -> [UInt8] {
        try VarlinkCoding.frame(VarlinkReply(parameters: try VarlinkCoding.encode(answer)))
    }

    @Test("An answer equal to a kept one is not encoded again, and its frame is the fresh encoding")
    func equalAnswersShareOneEncoding() throws {
        let cache = ReplyFrameCache<Answer>()
        let answer = Answer(people: 3, head: "ab12", endpoint: nil)
        for _ in 0..<100 { #expect(cache.frame(for: answer) == (try Self.fresh(answer))) }
        #expect(cache.encodingCount == 1)
    }

    @Test("Any field that differs gets its own frame")
    func differingAnswersGetTheirOwnFrames() throws {
        let cache = ReplyFrameCache<Answer>()
        let answers = [
            Answer(people: 3, head: "ab12", endpoint: nil), Answer(people: 4, head: "ab12", endpoint: nil),
            Answer(people: 4, head: "ab13", endpoint: nil), Answer(people: 4, head: "ab13", endpoint: "audit.example"),
        ]
        for _ in 0..<3 {
            for answer in answers { #expect(cache.frame(for: answer) == (try Self.fresh(answer))) }
        }
        #expect(cache.encodingCount == answers.count)
    }

    @Test("Past its capacity the oldest answer is dropped and encoded again when it comes back")
    func theOldestAnswerIsDropped() throws {
        let cache = ReplyFrameCache<Answer>()
        let capacity = ReplyFrameCache<Answer>.capacity
        let answers = (0...capacity).map { Answer(people: $0, head: "", endpoint: nil) }
        for answer in answers { _ = cache.frame(for: answer) }
        #expect(cache.encodingCount == capacity + 1)
        _ = cache.frame(for: answers.last!)
        #expect(cache.encodingCount == capacity + 1)
        #expect(cache.frame(for: answers[0]) == (try Self.fresh(answers[0])))
        #expect(cache.encodingCount == capacity + 2)
    }

    @Test("Concurrent callers with alternating answers each get the frame of their own answer")
    func concurrentCallersGetTheirOwnFrames() async throws {
        let cache = ReplyFrameCache<Answer>()
        let answers = (0..<3).map { Answer(people: $0, head: String(repeating: "f", count: $0), endpoint: nil) }
        let expected = try answers.map(Self.fresh)
        let mismatches = await withTaskGroup(of: Int.self) { group in
            for worker in 0..<8 {
                group.addTask {
                    var wrong = 0
                    for call in 0..<500 {
                        let index = (worker + call) % answers.count
                        if cache.frame(for: answers[index]) != expected[index] { wrong += 1 }
                    }
                    return wrong
                }
            }
            return await group.reduce(0, +)
        }
        #expect(mismatches == 0)
        // Racing misses may encode an answer twice, but never once per call.
        #expect(cache.encodingCount <= answers.count * 8)
    }

    // MARK: Through the dispatcher

    /// The immediate `GetStatus` reply's parameters for `caller`.
    static func immediateStatus(
        _ fixture: DispatcherFixture, _ caller: Caller, _ parameters: JSONValue? = nil
    ) throws
        -> JSONValue?
    {
        guard let handler = fixture.dispatcher.immediate(KioskAuthMethod.getStatus.qualifiedName) else { return nil }
        return try replyParameters(handler(caller, parameters))
    }

    /// The parameters of a reply frame; nil for no frame.
    static func replyParameters(_ frame: [UInt8]?) throws -> JSONValue? {
        guard let frame else { return nil }
        #expect(frame.last == 0)
        return try VarlinkCoding.message(VarlinkReply.self, from: frame.dropLast()).parameters
    }

    @Test("The immediate status follows the store and the uptime, and matches the ordinary path")
    func theImmediateStatusIsNeverStale() async throws {
        let fixture = try DispatcherFixture()
        for caller in [fixture.stranger, fixture.admin] {
            #expect(
                try Self.immediateStatus(fixture, caller) == (try await fixture.call("GetStatus", as: caller).get()))
        }
        let before = try Self.immediateStatus(fixture, fixture.stranger)
        try await fixture.addPerson("alice")
        let after = try Self.immediateStatus(fixture, fixture.stranger)
        guard case .object(let old)? = before, case .object(let new)? = after else {
            Issue.record(
                "GetStatus replies are not objects: \(String(describing: before)), \(String(describing: after))")
            return
        }
        #expect(old["people"] == .number(0) && new["people"] == .number(1))
        #expect(old["auditEvents"] != new["auditEvents"] && old["auditHead"] != new["auditHead"])
        #expect(after == (try await fixture.call("GetStatus", as: fixture.admin).get()))

        fixture.clock.advance(7)
        guard case .object(let later)? = try Self.immediateStatus(fixture, fixture.admin),
            case .number(let uptime)? = later["uptimeSeconds"], case .number(let earlier)? = new["uptimeSeconds"]
        else {
            Issue.record("no uptime in the immediate GetStatus reply")
            return
        }
        #expect(uptime == earlier + 7)
    }

    @Test("Every rank gets its own view of audit delivery, in turns and all at once")
    func eachRankGetsItsOwnView() async throws {
        let fixture = try DispatcherFixture(auditEndpointHost: "audit.clinic.example:8443")
        fixture.auditMonitor?.update {
            $0.lastError = "connection refused by 10.1.2.3"
            $0.consecutiveFailures = 2
        }
        try await fixture.addPerson("alice", uid: 1234)
        let callers = [
            fixture.admin, fixture.stranger, fixture.root, fixture.caller(uid: 1234), fixture.kioskApp, fixture.admin,
            fixture.stranger,
        ]
        // In turns: each caller's immediate reply is what the ordinary path gives that caller.
        for caller in callers {
            let expected = try await fixture.call("GetStatus", as: caller).get()
            #expect(try Self.immediateStatus(fixture, caller) == expected)
            guard case .object(let status) = expected, case .object(let delivery)? = status["auditDelivery"] else {
                Issue.record("no auditDelivery in \(expected)")
                continue
            }
            let isAdmin = caller.uid == 0 || caller.groups?.contains(DispatcherFixture.adminGID) == true
            #expect((delivery["endpointHost"] != nil) == isAdmin, "uid \(caller.uid)")
            #expect((delivery["lastError"] != nil) == isAdmin, "uid \(caller.uid)")
        }
        // All at once, more ranks than the cache keeps answers for: nobody gets another's frame.
        let handler = try #require(fixture.dispatcher.immediate(KioskAuthMethod.getStatus.qualifiedName))
        let views = try await withThrowingTaskGroup(of: (Bool, JSONValue?).self) { group in
            for round in 0..<200 {
                let caller = callers[round % callers.count]
                let isAdmin = caller.uid == 0 || caller.groups?.contains(DispatcherFixture.adminGID) == true
                group.addTask { (isAdmin, try Self.replyParameters(handler(caller, nil))) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        let admin = try await fixture.call("GetStatus", as: fixture.admin).get()
        let stranger = try await fixture.call("GetStatus", as: fixture.stranger).get()
        #expect(admin != stranger)
        for (isAdmin, view) in views { #expect(view == (isAdmin ? admin : stranger)) }
    }

    @Test("The summary is not immediate: it reads every person on the actor")
    func theSummaryTakesTheOrdinaryPath() async throws {
        let fixture = try DispatcherFixture()
        #expect(try Self.immediateStatus(fixture, fixture.admin, .object(["summary": .bool(true)])) == nil)
        #expect(try Self.immediateStatus(fixture, fixture.admin, .object(["summary": .bool(false)])) != nil)
    }
}
