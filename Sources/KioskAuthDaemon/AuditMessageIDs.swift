/// The journal `MESSAGE_ID` of each kind of audit event, keyed by the audit action: fixed
/// 128-bit ids (made once with `systemd-id128 new`, never changed, never reused), each explained
/// in `systemd/kioskauth.catalog` so that `journalctl -x` says what happened and what to do.
/// A test keeps this table and the catalog identical, and checks that every action the daemon
/// audits has an entry.
enum AuditMessageID {
    /// An audit action without its own id (none today; the catalog explains it generically).
    static let other = "5a339fea1745470bb47d73d86d0f97c8"

    /// By audit action.
    static let byAction: [String: String] = [
        "access.refused.summary": "9119528a07284b7a821e00ee17d1ea1e",
        "account.check": "c54d743ddbe74867ba8f2901dbf37a4d",
        "activation.check": "6bbf0947cbbe49eb9b6aeb51c97e4f9b",
        "activation.complete": "1a06cef26dd44117892c1ad618946b8c",
        "activation.issue": "612def95fd674036a266f6c28de1c5d2",
        "activation.revoke": "3692fb89aab242d7a1eca7bb7bd1228e",
        "audit.read": "3d13bafc8c954489ab331e5a9c5669d7",
        "audit.verify": "e5a7270eb47545f2ab495dd461b5323c",
        "clock.backwards": "06cca15328d146c2bfc15d6af811715c",
        "daemon.start": "cc3b94b5b96042b1b319637a8f69986a",
        "daemon.stop": "77cb242a79f942e8a8d3a1344babc32d",
        "finger.enroll": "c3c314598a814e9481e16fc3ac8a66e6",
        "finger.identify": "27f2a58886324c37af12b1ac23e44133",
        "finger.list": "39687055eeaf4695a2f856f7e0c6f8ec",
        "finger.remove": "db1e05f1bf0e499abf75ffb2a3cd17db",
        "finger.throttle": "26f2b4115efb439c92218853ce265823",
        "finger.verify": "ad2dde761a844128942bb142af5d36de",
        "idp.circuit": "abc0261b2f484fa1a3eb152df313dca6",
        "idp.login": "e70dc6fc79064d4cab0877cd82198e00",
        "idp.refresh": "d5657d136d37421ca92c5604b2a700b0",
        "idp.revoke": "06cd96ae5821484e816fc83f4821c5ea",
        "idp.roles": "d760a849b3f34fdc9b8e64fce18d01eb",
        "lockout.reset": "2324bec895e34ee78ee9b9bca0a7372a",
        "metrics": "6599319d332540a1a5065b0a82367605",
        "passcode.set": "68a26a0062674eb9bfea967b54917a77",
        "passcode.verify": "5386a91c9a8248f49fb95c4c39a4b8f1",
        "person.add": "1da763baf944470bb1a7d7d01571fd94",
        "person.bind": "f69e3d3af4ba411a8e4304b16e8af489",
        "person.biometric-offer": "36c04968f77c4e88abc60966b285c3e0",
        "person.export": "e8f3f1a345184b2482930d1eb807140d",
        "person.list": "091ee204feda4c1fa3ac3cee052965b1",
        "person.remove": "abec097bedfd4deab326e0997f9b0a9f",
        "person.resume": "504c60fa536448229a5cea54ba624d4f",
        "person.show": "3283ba84f4f94e03b02bd891fc4f4696",
        "person.suspend": "679602affd71495c8a477a546e7f62f3",
        "rate-limited": "0f83a124c2d9438e933e057bbcdd6e3f",
        "reader.added": "5ea9bc2139e2474a9e36e9b1178ed858",
        "reader.reconcile": "f3095a6e5860493695f2e29d1f82e9bd",
        "reader.removed": "b1dfa8169062415cb6594e2c7b69d2c0",
        "session.activity": "301b74e11fcd4b14bd14f63b0c16fe5c",
        "session.authenticate": "f4b6a4ff752e4add9304077e91d56c8e",
        "session.close": "ce277b3de42f490ea9d8c47e43c28663",
        "session.end": "4a75d06617dc452296ee91a23e318614",
        "session.list": "f494e17294ce4676b61014c733ef3e96",
        "session.lock": "efd495e7d1b541e593da3f4bc40b0a8c",
        "session.open": "90bb03a615d745f79a791cce84df21b3",
        "session.security-logout": "d1d8b705c67e471fa5ef10585b148419",
        "session.step-up": "2f1678d2ee774ea89131a93f441e815e",
        "session.token": "d98a1264f04a410a89261c203675dffe",
        "store.integrity": "8aca642aaa8a48bd9f9c7382652a2c7f",
        "store.rollback.accepted": "2efe05da0b854648a87a17ca5fca421e",
    ]

    /// The id of `action`'s events.
    static func of(_ action: String) -> String { byAction[action] ?? other }
}
