import FoundationEssentials
import KioskAuthCore
import KioskAuthIdentity

// The decisions behind the reachability probe: ReachabilityProbeSchedule (KioskAuthCore) says
// when, these say what an outcome means, and RefreshService sends the probe. Nothing here runs
// on an unlock path or waits for the network.

extension OnlineAuthority {
    /// Any request to the provider ended, whatever the outcome: the next probe moves away.
    func noteTraffic() {
        var random = SystemRandomNumberGenerator()
        online.probe.noteTraffic(at: services.clock.reading().sinceBoot, using: &random)
    }

    /// Whether to send a probe now (then it is recorded as in flight and its timeout returned),
    /// and otherwise how long until one may be due.
    func takeProbe() -> (timeout: Duration?, sleep: Duration?) {
        guard services.provider != nil else { return (nil, nil) }
        let boot = services.clock.reading().sinceBoot
        var circuitOpen = false
        if case .open(let until) = online.schedule.circuit, until > now() { circuitOpen = true }
        switch online.probe.decide(at: boot, circuitOpen: circuitOpen) {
        case .probe:
            online.probe.probeStarted(at: boot)
            let idp = configuration.identityProvider
            let seconds = min(idp.probeTimeout, idp.requestTimeout)
            return (.milliseconds(Int64(seconds * 1000)), nil)
        case .wait(let until):
            return (nil, max(until - boot, .zero))
        case .idle:
            return (nil, nil)
        }
    }

    /// Reports how a probe ended (nil: the expected success). An outcome updates reachability
    /// through the same path as every other request's (state, since, events, and on coming back
    /// the release of queued work), with two differences:
    ///
    /// - A success is no one's contact for the offline window. The window is per person and
    ///   only that person's refreshed tokens renew it; a probe proves only that the network and
    ///   the provider work.
    /// - An answer other than the expected success proves nothing either way (a captive portal,
    ///   a misconfigured path, a rejected API key), so unlike a refused refresh it does not count
    ///   as "online"; it is logged and changes nothing.
    func completeProbe(error: (any Error)?) {
        var random = SystemRandomNumberGenerator()
        online.probe.probeFinished(at: services.clock.reading().sinceBoot, using: &random)
        guard let error else {
            noteProviderAnswered()
            return
        }
        if error is CancellationError { return }
        if let error = error as? IdentityError, !error.isTransient {
            logger.notice(
                "reachability probe inconclusive: the provider's answer was not the expected success",
                metadata: ["error": "\(error)"])
            return
        }
        logger.debug("reachability probe failed", metadata: ["error": "\(Self.summary(error))"])
        noteProviderUnavailable(Self.summary(error))
    }
}
