/// A token bucket per uid: each holds up to `rate` tokens (one second's worth), refills at
/// `rate` tokens per second, and a call takes one. A value type with no clock of its own; the
/// socket server keeps one behind a lock and passes the time in, so each decision is atomic.
public struct RequestRateLimit: Sendable {
    /// Calls per second per uid, and the burst allowed.
    public let rate: Int
    private var buckets: [Int: Bucket] = [:]
    /// Buckets kept before full ones (uids that have been quiet for a second) are dropped.
    public static let trackedUIDs = 1024

    private struct Bucket {
        var tokens: Double
        var updated: Double
    }

    public init(rate: Int) {
        self.rate = max(1, rate)
    }

    /// Takes a token for `uid` at `now` (seconds on a monotonic clock). Returns nil when the call
    /// may go ahead, else the seconds until the next token.
    public mutating func take(uid: Int, now: Double) -> Double? {
        let capacity = Double(rate)
        var bucket = buckets[uid] ?? Bucket(tokens: capacity, updated: now)
        bucket.tokens = min(capacity, bucket.tokens + max(0, now - bucket.updated) * capacity)
        bucket.updated = now
        defer {
            buckets[uid] = bucket
            if buckets.count > Self.trackedUIDs { forgetQuiet(now: now) }
        }
        if bucket.tokens >= 1 {
            bucket.tokens -= 1
            return nil
        }
        return (1 - bucket.tokens) / capacity
    }

    private mutating func forgetQuiet(now: Double) {
        let capacity = Double(rate)
        buckets = buckets.filter { $0.value.tokens + (now - $0.value.updated) * capacity < capacity }
    }
}
