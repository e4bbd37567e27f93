/// How an identify gallery is laid out for libfprint's match loop.
///
/// On image sensors libfprint compares the touch with the gallery's templates in order, and with
/// each template's enrolment impressions in order, and stops at the first score at or above its
/// threshold: a template that does not match costs one bozorth3 comparison per impression (five on
/// most readers). The layout decides which impressions are tried, and in what order. Templates
/// that are not NBIS templates (sensors that match on the chip) are always tried whole, in place.
public enum IdentifyLayout: Sendable, Equatable, CustomStringConvertible {
    /// Every template whole, in gallery order: libfprint's own behaviour.
    case full
    /// Two passes over the gallery, in gallery order: first each template's impression with the
    /// fewest minutiae, then each template's other impressions (fewest first). The same
    /// comparisons as ``full``, so the same verdict for a finger nobody enrolled (and the same
    /// worst case), but a finger near the front of the gallery is usually found after one
    /// comparison per template before it. The sparsest impression goes first because bozorth3's
    /// cost grows steeply with minutiae, for the genuine comparison most of all; a touch it
    /// misses is found in the second pass, later but just as surely.
    case staged
    /// Only each template's `impressions` impressions with the most minutiae: fewer comparisons
    /// per template (faster, fewer false matches) and fewer chances for a genuine touch to match.
    case compact(impressions: Int)

    /// The configuration spelling: `full`, `staged`, `compact-K`.
    public var description: String {
        switch self {
        case .full: "full"
        case .staged: "staged"
        case .compact(let impressions): "compact-\(impressions)"
        }
    }

    /// Parses the configuration spelling; nil for anything else.
    public init?(_ text: String) {
        switch text {
        case "full": self = .full
        case "staged": self = .staged
        default:
            guard text.hasPrefix("compact-"), let k = Int(text.dropFirst("compact-".count)), (1...9).contains(k)
            else { return nil }
            self = .compact(impressions: k)
        }
    }

    /// What one gallery template contributes to each pass over the gallery, in trial order: one
    /// template for ``full`` and ``compact(impressions:)``, two for ``staged`` (its best impression,
    /// then its others). Non-NBIS and single-impression templates are passed whole, first pass.
    func passes(of template: [UInt8]) -> [[UInt8]] {
        if self == .full { return [template] }
        guard let nbis = NBISTemplate(template), nbis.impressionCount > 1 else { return [template] }
        switch self {
        case .full: return [template]
        case .staged:
            let order = nbis.impressionsByMinutiae(descending: false)
            return [nbis.keeping(Array(order.prefix(1))), nbis.keeping(Array(order.dropFirst()))]
        case .compact(let impressions):
            return [nbis.keeping(Array(nbis.impressionsByMinutiae(descending: true).prefix(impressions)))]
        }
    }
}

extension NBISTemplate {
    /// Impression indices ordered by minutiae count (ties in enrolment order).
    func impressionsByMinutiae(descending: Bool) -> [Int] {
        impressionSizes.indices.sorted { a, b in
            let (x, y) = (impressionSizes[a], impressionSizes[b])
            return x == y ? a < b : (descending ? x > y : x < y)
        }
    }
}
