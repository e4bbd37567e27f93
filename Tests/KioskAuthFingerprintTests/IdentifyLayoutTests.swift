import Testing

@testable import KioskAuthFingerprint

/// Enrols `finger` on the image reader with a different picture per touch (`images`, cycled), so
/// that the template's impressions differ.
func enrollImages(
    _ reader: FingerprintReader, _ control: VirtualImageControl, _ images: [String]
) async throws
    -> [UInt8]
{
    let pictures = try images.map(PrintImage.named)
    var touches = 0
    return try await enroll(reader) { event in
        guard event.wantsTouch else { return }
        try control.send(pictures[touches % pictures.count])
        touches += 1
    }.template
}

@Suite("identify layouts")
struct IdentifyLayoutParsing {
    @Test(arguments: ["full", "staged", "compact-1", "compact-3", "compact-9"])
    func configurationSpelling_roundTrips(text: String) {
        #expect(IdentifyLayout(text)?.description == text)
    }

    @Test(arguments: ["", "Full", "stage", "compact", "compact-0", "compact-10", "compact--1", "compact-x"])
    func otherSpellings_areRefused(text: String) {
        #expect(IdentifyLayout(text) == nil)
    }

    @Test(arguments: [
        [UInt8](), Array("FP3".utf8), Array("FP2xxxxxxxxxxxxxxxxxxxxx".utf8),
        Array("FP3".utf8) + [UInt8](repeating: 0xff, count: 64),
    ])
    func bytesThatAreNoTemplate_areNotNBIS_andPassWhole(bytes: [UInt8]) {
        #expect(NBISTemplate(bytes) == nil)
        #expect(IdentifyLayout.staged.passes(of: bytes) == [bytes])
        #expect(IdentifyLayout.compact(impressions: 1).passes(of: bytes) == [bytes])
    }
}

extension FingerprintReaderTests {
    /// Templates cut down to some of their impressions, on `virtual_image` with the NIST prints.
    @Suite("NBIS templates")
    struct NBISTemplates {
        @Test func impressions_areRead_andKeptInTheOrderAsked() async throws {
            try await withReader(.image) { harness in
                let control = try VirtualImageControl(path: harness.socketPath)
                let template = try await enrollImages(
                    harness.reader, control, ["whorl", "whorl-rot", "whorl", "whorl-rot", "whorl"])
                let nbis = try #require(NBISTemplate(template))
                #expect(nbis.impressionCount == 5)
                #expect(nbis.impressionSizes.allSatisfy { $0 > 10 })
                #expect(
                    nbis.impressionSizes[0] == nbis.impressionSizes[2]
                        && nbis.impressionSizes[1] == nbis.impressionSizes[3])
                // All of them in enrolment order is the template itself.
                #expect(nbis.keeping([0, 1, 2, 3, 4]) == template)
                let cut = try #require(NBISTemplate(nbis.keeping([3, 0])))
                #expect(cut.impressionSizes == [nbis.impressionSizes[3], nbis.impressionSizes[0]])
                let sizes = nbis.impressionSizes
                let ascending = nbis.impressionsByMinutiae(descending: false)
                #expect(ascending.map { sizes[$0] } == sizes.sorted())
                #expect(nbis.impressionsByMinutiae(descending: true).map { sizes[$0] } == sizes.sorted(by: >))
                // staged: the sparsest impression, then the others (sparsest first).
                let staged = IdentifyLayout.staged.passes(of: template).map { NBISTemplate($0)?.impressionSizes }
                #expect(staged == [[sizes.min()!], Array(sizes.sorted().dropFirst())])
                // compact-K: the K with the most minutiae.
                let compact = IdentifyLayout.compact(impressions: 2).passes(of: template).map {
                    NBISTemplate($0)?.impressionSizes
                }
                #expect(compact == [Array(sizes.sorted(by: >).prefix(2))])
                #expect(IdentifyLayout.full.passes(of: template) == [template])
                // Truncated bytes are not a template.
                #expect(NBISTemplate(Array(template.prefix(template.count / 2))) == nil)
            }
        }

        @Test func aOneImpressionTemplate_stillMatchesTheFinger_andNotAnother() async throws {
            try await withReader(.image) { harness in
                let control = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                let template = try await enrollImage(reader, control, "loop-right")
                let nbis = try #require(NBISTemplate(template))
                let one = nbis.keeping([nbis.impressionsByMinutiae(descending: true)[0]])
                #expect(try await present("loop-right-rot", to: control) { try await reader.verify(template: one) })
                #expect(
                    try await present("loop-right-mirror", to: control) { try await reader.verify(template: one) }
                        == false)
            }
        }

        @Test func aTemplateOfAnotherKind_isNotNBIS() async throws {
            try await withReader(.device) { harness in
                let template = try await enrollVirtual(harness, id: "sarah-right-index")
                #expect(NBISTemplate(template) == nil)
                #expect(IdentifyLayout.staged.passes(of: template) == [template])
            }
        }

        /// A template of one arch touch and four whorl touches (arch prints have more minutiae): the
        /// first pass of staged holds a whorl impression, compact-1 keeps the arch.
        @Test func staged_triesEveryImpression_andCompactOnlyThoseItKeeps() async throws {
            try await withReader(.image) { harness in
                let control = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                let mixed = try await enrollImages(reader, control, ["arch", "whorl", "whorl", "whorl", "whorl"])
                let nbis = try #require(NBISTemplate(mixed))
                try #require(
                    nbis.impressionsByMinutiae(descending: true)[0] == 0, "premise: the arch has the most minutiae")
                let other = try await enrollImage(reader, control, "loop-right")
                let gallery = [GalleryEntry(id: "mixed", template: mixed), GalleryEntry(id: "other", template: other)]
                func identify(_ probe: String, _ layout: IdentifyLayout) async throws -> MatchResult {
                    try await present(probe, to: control) {
                        try await reader.identify(gallery: gallery, layout: layout)
                    }
                }
                // The arch touch is found only by the second pass of staged (the first does not match it).
                let firstPass = IdentifyLayout.staged.passes(of: mixed)[0]
                #expect(
                    try await present("arch-rot", to: control) { try await reader.verify(template: firstPass) } == false
                )
                for layout in [IdentifyLayout.full, .staged, .compact(impressions: 1)] {
                    #expect(try await identify("arch-rot", layout) == .match(id: "mixed"), "\(layout)")
                }
                // compact-1 kept only the arch: a whorl touch is no longer recognised.
                for layout in [IdentifyLayout.full, .staged] {
                    #expect(try await identify("whorl-rot", layout) == .match(id: "mixed"), "\(layout)")
                }
                #expect(try await identify("whorl-rot", .compact(impressions: 1)) == .noMatch)
            }
        }

        @Test(arguments: [IdentifyLayout.full, .staged, .compact(impressions: 1), .compact(impressions: 2)])
        func identify_picksTheRightPerson_andRejectsAStranger(layout: IdentifyLayout) async throws {
            try await withReader(.image) { harness in
                let control = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                var gallery: [GalleryEntry] = []
                for finger in ["arch", "tented_arch", "loop-right", "whorl"] {
                    gallery.append(GalleryEntry(id: finger, template: try await enrollImage(reader, control, finger)))
                }
                let enrolled = gallery
                for finger in ["whorl", "arch"] {
                    let result = try await present("\(finger)-rot", to: control) {
                        try await reader.identify(gallery: enrolled, layout: layout)
                    }
                    #expect(result == .match(id: finger), "\(layout): identify of \(finger)-rot")
                }
                let stranger = try await present("whorl-mirror", to: control) {
                    try await reader.identify(gallery: enrolled, layout: layout)
                }
                #expect(stranger == .noMatch, "\(layout): a stranger")
                // A finger removed from the roster is no longer found, though its decoded print was
                // kept from the identify before; undecodable entries are skipped, not fatal.
                let without =
                    enrolled.filter { $0.id != "whorl" } + [GalleryEntry(id: "junk", template: Array("FP3junk".utf8))]
                let removed = try await present("whorl-rot", to: control) {
                    try await reader.identify(gallery: without, layout: layout)
                }
                #expect(removed == .noMatch, "\(layout): a removed finger")
            }
        }
    }
}

extension FingerprintReaderTests {
    /// Image sensors end an operation only once the finger is lifted; the answer must not wait.
    @Suite("answers at the match report")
    struct AnswerAtReport {
        @Test func identifyAndVerify_answerWhileTheFingerIsStillDown_andTheNextScanWaitsForTheLift() async throws {
            try await withReader(.image) { harness in
                let control = try VirtualImageControl(path: harness.socketPath)
                let reader = harness.reader
                let template = try await enrollImage(reader, control, "arch")
                let gallery = [GalleryEntry(id: "arch", template: template)]
                try control.automaticFinger(false)
                let image = try PrintImage.named("arch-rot")

                let identify = Task { try await reader.identify(gallery: gallery, layout: .staged) }
                try await Task.sleep(for: .milliseconds(150))
                try control.finger(present: true)
                try control.send(image)
                // The finger stays down: the answer comes anyway.
                #expect(try await within(.seconds(10)) { try await identify.value } == .match(id: "arch"))

                // The device is still in that identify until the finger is lifted; a verify asked
                // for now waits for it instead of failing as busy.
                let verify = Task { try await reader.verify(template: template) }
                try await Task.sleep(for: .milliseconds(300))
                try control.finger(present: false)
                try await Task.sleep(for: .milliseconds(150))
                try control.finger(present: true)
                try control.send(image)
                #expect(try await within(.seconds(10)) { try await verify.value })
                try control.finger(present: false)
            }
        }
    }
}
