import Foundation
import KioskAuthFingerprint
import Testing

extension FingerprintReaderTests {
    /// Identify latency against gallery size on `virtual_image` with the NIST prints. Informative,
    /// not a timed assertion: run with `KIOSKAUTH_FP_BENCH=1` and read the printed table.
    ///
    /// The 8 distinct fingers (4 prints and their mirrors) are enrolled once per gallery size;
    /// larger galleries repeat their templates. The probe is a second impression (`-rot`) of one
    /// finger placed first, fifth or last, with every other slot a different finger, or absent
    /// (no match). Latency runs from presenting the image to the result.
    @Suite("identify latency", .enabled(if: ProcessInfo.processInfo.environment["KIOSKAUTH_FP_BENCH"] != nil))
    struct IdentifyLatency {
        static let distinct = ["arch", "loop-right", "tented_arch", "whorl"].flatMap { [$0, "\($0)-mirror"] }

        @Test(arguments: [10, 40])
        func identifyLatency(gallerySize: Int) async throws {
            try await withReader(.image) { harness in
                let images = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                var templates: [String: [UInt8]] = [:]
                for finger in Self.distinct { templates[finger] = try await enrollImage(reader, images, finger) }
                let probe = "whorl"
                let others = Self.distinct.filter { !$0.hasPrefix(probe) }
                func gallery(targetAt position: Int?) -> [GalleryEntry] {
                    (0..<gallerySize).map { index in
                        if index == position { return GalleryEntry(id: probe, template: templates[probe]!) }
                        let finger = others[index % others.count]
                        return GalleryEntry(id: "\(finger)#\(index)", template: templates[finger]!)
                    }
                }
                let cases: [(String, Int?)] = [("first", 0), ("fifth", 4), ("last", gallerySize - 1), ("none", nil)]
                var line = "identify latency, \(gallerySize) fingers:"
                for (label, position) in cases {
                    var samples: [Double] = []
                    for _ in 0..<5 {
                        let entries = gallery(targetAt: position)
                        let image = try PrintImage.named("\(probe)-rot")
                        let scan = Task { try await reader.identify(gallery: entries) }
                        try await Task.sleep(for: .milliseconds(150))
                        let clock = ContinuousClock()
                        let start = clock.now
                        try images.send(image)
                        let result = try await within(.seconds(60)) { try await scan.value }
                        let elapsed = clock.now - start
                        samples.append(
                            Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000)
                        #expect(result == (position == nil ? .noMatch : .match(id: probe)))
                    }
                    line += " \(label) median \(Int(samples.sorted()[2])) ms (min \(Int(samples.min()!)));"
                }
                print(line)
            }
        }
    }
}
