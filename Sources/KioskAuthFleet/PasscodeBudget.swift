/// The fleet-wide passcode budget (docs/fleet.md §5). A terminal counts a person's failures as
/// the directory's fleet-wide sum it last pulled plus its own failures not yet in that sum; the
/// passcode is hard-locked when that count reaches `hardLockAfter`. No I/O.
public struct FleetPasscodeBudget: Sendable, Equatable {
    /// `[Passcode] HardLockAfter` (10 by default).
    public var hardLockAfter: Int
    /// `[Passcode] LockoutDelaysSec`: the delay after the Nth consecutive failure, the last
    /// entry repeating.
    public var delaysSeconds: [Int]

    /// The policy's numbers.
    public init(hardLockAfter: Int = 10, delaysSeconds: [Int] = [0, 0, 60, 300, 900, 1800, 1800, 1800, 1800]) {
        self.hardLockAfter = hardLockAfter
        self.delaysSeconds = delaysSeconds
    }

    /// The failures this terminal counts: the fleet sum it knows plus its own not yet in it.
    public func failures(fleetSum: Int, unpushedLocal: Int) -> Int { fleetSum + unpushedLocal }

    /// Whether another attempt may be checked.
    public func mayAttempt(fleetSum: Int, unpushedLocal: Int) -> Bool {
        failures(fleetSum: fleetSum, unpushedLocal: unpushedLocal) < hardLockAfter
    }

    /// The delay after the `failures`-th consecutive failure.
    public func delay(afterFailures failures: Int) -> Int {
        guard failures > 0, let last = delaysSeconds.last else { return 0 }
        return failures <= delaysSeconds.count ? delaysSeconds[failures - 1] : last
    }

    /// Failures counted in a row without any wait: one plus the leading zero delays.
    public var attemptsWithoutWaiting: Int {
        1 + (delaysSeconds.prefix(while: { $0 == 0 }).count)
    }

    /// The most guesses across `terminals` terminals when none of them can reach the directory
    /// (or all start together before any sync): each has only its local budget.
    public func worstCaseGuessesPartitioned(terminals: Int) -> Int { terminals * hardLockAfter }

    /// The most guesses across `terminals` connected terminals whose failures reach each other
    /// within `propagationSeconds`, shorter than the first non-zero delay. Every guess is made
    /// before the fleet's `hardLockAfter`-th failure is `propagationSeconds` old (after that every
    /// terminal counts at least that many); in that last window each terminal fits at most the
    /// attempts its schedule allows without waiting. So at most
    /// `hardLockAfter + terminals × attemptsWithoutWaiting`, and never more than partitioned.
    public func worstCaseGuessesConnected(terminals: Int, propagationSeconds: Int) -> Int {
        let firstWait = delaysSeconds.first(where: { $0 > 0 }) ?? Int.max
        guard propagationSeconds < firstWait else { return worstCaseGuessesPartitioned(terminals: terminals) }
        return min(
            hardLockAfter + terminals * attemptsWithoutWaiting, worstCaseGuessesPartitioned(terminals: terminals))
    }
}
