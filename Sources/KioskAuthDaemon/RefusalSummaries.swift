import Synchronization

/// Tallies refusals of unprivileged callers — calls the daemon refused and calls over the rate
/// limit — so that the durable audit gets one summary entry per uid per interval, with counts,
/// instead of one entry per refused call: a flood from one uid costs the store a row a minute.
/// Privileged callers' refusals and every success are still audited one entry each.
final class RefusalSummaries: Sendable {
    struct Tally: Sendable, Equatable {
        var refused = 0
        var rateLimited = 0
        var actions: [String: Int] = [:]
        var lastPID = 0
    }

    private let tallies = Mutex<[Int: Tally]>([:])

    /// Counts one refusal of `action` (a rate-limited call when `rateLimited`). Returns true when
    /// this is the first refusal since the last `take()`: the caller then schedules a flush.
    func add(uid: Int, pid: Int, action: String, rateLimited: Bool) -> Bool {
        tallies.withLock { tallies in
            let first = tallies.isEmpty
            var tally = tallies[uid] ?? Tally()
            if rateLimited {
                tally.rateLimited += 1
            } else {
                tally.refused += 1
                // A bounded list of names: a caller cannot grow the entry by inventing methods.
                if tally.actions[action] != nil || tally.actions.count < 16 {
                    tally.actions[action, default: 0] += 1
                }
            }
            tally.lastPID = pid
            tallies[uid] = tally
            return first
        }
    }

    /// Everything counted since the last call, by uid, and starts counting afresh.
    func take() -> [(uid: Int, tally: Tally)] {
        tallies.withLock { tallies in
            defer { tallies = [:] }
            return tallies.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }
        }
    }

    /// The audit detail of one uid's summary.
    static func detail(_ tally: Tally, interval: Double) -> String {
        var parts = ["\(tally.refused) refused call\(tally.refused == 1 ? "" : "s")"]
        if tally.rateLimited > 0 { parts.append("\(tally.rateLimited) rate-limited") }
        var text = parts.joined(separator: ", ") + " within \(Int(interval.rounded())) s"
        if !tally.actions.isEmpty {
            text +=
                ": " + tally.actions.sorted { $0.key < $1.key }.map { "\($0.key)×\($0.value)" }.joined(separator: " ")
        }
        return text
    }
}
