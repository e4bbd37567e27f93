import KioskAuthFingerprint
import Testing

/// Enrols `finger` on the image reader by sending its picture for every requested touch.
func enrollImage(_ reader: FingerprintReader, _ images: VirtualImageControl, _ finger: String) async throws -> [UInt8] {
    let image = try PrintImage.named(finger)
    return try await enroll(reader) { event in
        if event.wantsTouch { try images.send(image) }
    }.template
}

/// Starts a scan, then presents `finger`'s picture; returns the operation's result.
func present<T: Sendable>(
    _ finger: String, to images: VirtualImageControl, _ operation: @escaping @Sendable () async throws -> T
) async throws -> T {
    let image = try PrintImage.named(finger)
    let scan = Task { try await operation() }
    try await Task.sleep(for: .milliseconds(100))
    try images.send(image)
    return try await within(.seconds(20)) { try await scan.value }
}

extension FingerprintReaderTests {
    /// `virtual_image` with the NIST example prints: real minutiae matching (NBIS) in libfprint.
    /// `NAME-rot` is a second impression of `NAME`; `NAME-mirror` is, for NBIS, another finger.
    @Suite("virtual_image")
    struct VirtualImage {
        static let fingers = ["arch", "loop-right", "tented_arch", "whorl"]

        @Test(arguments: ["whorl", "loop-right"])
        func secondImpression_matches_andADifferentFingerDoesNot(finger: String) async throws {
            try await withReader(.image) { harness in
                let images = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                #expect(await reader.readers.first?.canIdentify == true)
                let template = try await enrollImage(reader, images, finger)
                #expect(try await present("\(finger)-rot", to: images) { try await reader.verify(template: template) })
                #expect(
                    try await present("\(finger)-mirror", to: images) { try await reader.verify(template: template) }
                        == false)
            }
        }

        @Test func identify_picksTheRightPerson_amongSeveral() async throws {
            try await withReader(.image) { harness in
                let images = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                var gallery: [GalleryEntry] = []
                for finger in Self.fingers {
                    gallery.append(GalleryEntry(id: finger, template: try await enrollImage(reader, images, finger)))
                }
                let enrolled = gallery
                for finger in Self.fingers {
                    let result = try await present("\(finger)-rot", to: images) {
                        try await reader.identify(gallery: enrolled)
                    }
                    #expect(result == .match(id: finger), "identify of \(finger)-rot")
                }
                let stranger = try await present("whorl-mirror", to: images) {
                    try await reader.identify(gallery: enrolled)
                }
                #expect(stranger == .noMatch)
            }
        }

        @Test func unplugMidScan_endsTheScanWithRemoved() async throws {
            try await withReader(.image) { harness in
                let images = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                let template = try await enrollImage(reader, images, "arch")
                let scan = Task { try await reader.verify(template: template) }
                try await Task.sleep(for: .milliseconds(200))
                try images.unplug()
                #expect(await failureCode { try await within(.seconds(5)) { try await scan.value } } == .removed)
                try await within(.seconds(5)) {
                    while await !reader.readers.isEmpty { try await Task.sleep(for: .milliseconds(20)) }
                }
            }
        }
    }
}
