import CFPrint

/// A libfprint NBIS template (image sensors: minutiae matched with bozorth3), read and rewritten
/// at the level of its enrolment impressions.
///
/// `fp_print_serialize` writes `"FP3"` followed by the GVariant `(issbymsmsia{sv}v)`: print type,
/// driver, device id, stored-on-device flag, finger, username, description, enrolment date, an
/// unused `a{sv}`, and the print data — for NBIS prints (type 2) a `(a(aiaiai))`: one minutiae set
/// (x, y and theta columns) per enrolment touch. libfprint's matcher compares a touch with each
/// impression in turn and stops at the first score at or above its threshold, so a template of
/// `k` impressions costs up to `k` bozorth3 comparisons. Everything but the impression list is
/// copied unchanged, so `fp_print_deserialize` reads the result as it reads the original.
///
/// Only the public serialisation format is relied on; templates of other kinds (sensors that
/// match on the chip) are not NBIS templates and ``init(_:)`` returns nil for them.
struct NBISTemplate {
    /// The minutiae count of each impression, in enrolment order.
    let impressionSizes: [Int]
    private let template: [UInt8]

    /// libfprint's `FPI_PRINT_NBIS`.
    private static let nbisType: Int32 = 2
    private static let magic = Array("FP3".utf8)
    private static let printSignature = "(issbymsmsia{sv}v)"
    private static let nbisDataSignature = "(a(aiaiai))"
    /// The number of fields of the outer tuple; the print data is the last.
    private static let fieldCount = 10

    /// Reads `template`; nil when it is not a well-formed NBIS template (or libfprint, whose
    /// GVariant code reads it, cannot be loaded).
    init?(_ template: [UInt8]) {
        guard
            (try? loadLibfprint()) != nil,
            let sizes = Self.withImpressions(
                of: template,
                { _, impressions in
                    (0..<lib.g_variant_n_children(impressions)).map { index in
                        let impression = lib.g_variant_get_child_value(impressions, index)!
                        defer { lib.g_variant_unref(impression) }
                        let xColumn = lib.g_variant_get_child_value(impression, 0)!
                        defer { lib.g_variant_unref(xColumn) }
                        return Int(lib.g_variant_n_children(xColumn))
                    }
                })
        else { return nil }
        self.impressionSizes = sizes
        self.template = template
    }

    /// The number of impressions.
    var impressionCount: Int { impressionSizes.count }

    /// The same template with only the impressions at `indices`, in that order (the order in
    /// which libfprint will compare them). `indices` must be valid and not empty.
    func keeping(_ indices: [Int]) -> [UInt8] {
        precondition(!indices.isEmpty && indices.allSatisfy(impressionSizes.indices.contains), "bad impression indices")
        guard indices != Array(impressionSizes.indices) else { return template }
        return Self.withImpressions(of: template) { fields, impressions in
            var kept: [OpaquePointer?] = indices.map { lib.g_variant_get_child_value(impressions, gsize($0)) }
            defer { kept.forEach { lib.g_variant_unref($0) } }
            let elementType = lib.g_variant_type_new("(aiaiai)")
            defer { lib.g_variant_type_free(elementType) }
            // Floating results are consumed by the container that takes them.
            let list = lib.g_variant_new_array(elementType, &kept, gsize(kept.count))
            var listTuple: [OpaquePointer?] = [list]
            let data = lib.g_variant_new_variant(lib.g_variant_new_tuple(&listTuple, 1))
            var outer: [OpaquePointer?] = (0..<(Self.fieldCount - 1)).map {
                lib.g_variant_get_child_value(fields, gsize($0))
            }
            defer { outer.forEach { lib.g_variant_unref($0) } }
            outer.append(data)
            let rewritten = lib.g_variant_ref_sink(lib.g_variant_new_tuple(&outer, gsize(outer.count)))!
            outer.removeLast()  // consumed by the tuple
            defer { lib.g_variant_unref(rewritten) }
            return Self.store(rewritten)
        }!
    }

    /// Runs `body` with the template's outer tuple (normal form, native byte order) and its
    /// impression list; nil when the bytes are not an NBIS template.
    private static func withImpressions<T>(
        of template: [UInt8], _ body: (_ fields: OpaquePointer, _ impressions: OpaquePointer) -> T
    ) -> T? {
        guard template.count > magic.count, template.starts(with: magic) else { return nil }
        let printType = lib.g_variant_type_new(printSignature)
        let dataType = lib.g_variant_type_new(nbisDataSignature)
        defer {
            lib.g_variant_type_free(printType)
            lib.g_variant_type_free(dataType)
        }
        let bytes = template.withUnsafeBufferPointer { buffer in
            lib.g_bytes_new(buffer.baseAddress! + magic.count, gsize(buffer.count - magic.count))
        }
        defer { lib.g_bytes_unref(bytes) }
        let raw = lib.g_variant_ref_sink(lib.g_variant_new_from_bytes(printType, bytes, 0))!
        defer { lib.g_variant_unref(raw) }
        // As fp_print_deserialize: the normal form, byte-swapped on big-endian hosts.
        #if _endian(big)
            let fields = lib.g_variant_byteswap(raw)!
        #else
            let fields = lib.g_variant_get_normal_form(raw)!
        #endif
        defer { lib.g_variant_unref(fields) }
        guard lib.g_variant_n_children(fields) == gsize(fieldCount) else { return nil }
        let typeField = lib.g_variant_get_child_value(fields, 0)!
        let type = lib.g_variant_get_int32(typeField)
        lib.g_variant_unref(typeField)
        guard type == nbisType else { return nil }
        let boxed = lib.g_variant_get_child_value(fields, gsize(fieldCount - 1))!
        defer { lib.g_variant_unref(boxed) }
        let data = lib.g_variant_get_variant(boxed)!
        defer { lib.g_variant_unref(data) }
        guard lib.g_variant_is_of_type(data, dataType) != 0 else { return nil }
        let impressions = lib.g_variant_get_child_value(data, 0)!
        defer { lib.g_variant_unref(impressions) }
        guard lib.g_variant_n_children(impressions) > 0 else { return nil }
        return body(fields, impressions)
    }

    /// `"FP3"` and the serialised value, as fp_print_serialize writes it.
    private static func store(_ value: OpaquePointer) -> [UInt8] {
        #if _endian(big)
            let value = lib.g_variant_byteswap(value)!
            defer { lib.g_variant_unref(value) }
        #endif
        // Serialised by GLib into its own (aligned) buffer, then copied: g_variant_store into an
        // unaligned destination fails GLib's checks.
        let bytes = lib.g_variant_get_data_as_bytes(value)!
        defer { lib.g_bytes_unref(bytes) }
        var size: gsize = 0
        let data = lib.g_bytes_get_data(bytes, &size)
        return magic + Array(UnsafeRawBufferPointer(start: data, count: Int(size)))
    }
}
