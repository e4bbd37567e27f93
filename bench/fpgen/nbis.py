"""libfprint NBIS templates at the level of their enrolment impressions (Debian's python3 + gi).

``fp_print_serialize`` writes ``FP3`` + the GVariant ``(issbymsmsia{sv}v)``; for NBIS prints
(type 2) the last field holds ``(a(aiaiai))``: one minutiae set (x, y, theta columns) per
enrolment touch.  libfprint compares a touch with each impression in turn and stops at the
first score >= threshold, so a template of k impressions costs up to k bozorth3 comparisons.
This mirrors the daemon's Sources/KioskAuthFingerprint/NBISTemplate.swift for the benchmarks.

Identify gallery layouts (``gallery(templates, layout)``), each a list of (owner index, template):

  full       every template whole (libfprint's default: finger-major, 5 comparisons per impostor)
  best       one impression per finger (the one with the most minutiae): compact-1
  kN         N impressions per finger, most minutiae first: compact-N
  staged     two passes: every finger's sparsest impression in roster order, then every finger's
             other impressions (sparsest first) in roster order; the same comparisons as ``full``
             (the same verdict on a no-match), in an order that finds recent people early
"""

import gi
from gi.repository import GLib

PRINT_TYPE = "(issbymsmsia{sv}v)"
NBIS = 2


def _fields(data):
    if data[:3] != b"FP3":
        raise ValueError("not a libfprint template")
    v = GLib.Variant.new_from_bytes(GLib.VariantType.new(PRINT_TYPE), GLib.Bytes.new(data[3:]), False)
    return v.get_normal_form()


def impressions(data):
    """Minutiae count of each impression (enrolment order); None if not an NBIS template."""
    v = _fields(data)
    if v.get_child_value(0).get_int32() != NBIS:
        return None
    arr = v.get_child_value(9).get_variant().get_child_value(0)
    return [arr.get_child_value(i).get_child_value(0).n_children() for i in range(arr.n_children())]


def keep(data, indices):
    """The template with only the impressions at ``indices``, in that order."""
    v = _fields(data)
    arr = v.get_child_value(9).get_variant().get_child_value(0)
    sel = [arr.get_child_value(i) for i in indices]
    if not sel:
        raise ValueError("keep at least one impression")
    new_arr = GLib.Variant.new_array(GLib.VariantType.new("(aiaiai)"), sel)
    out = GLib.Variant.new_tuple(*([v.get_child_value(i) for i in range(9)] + [GLib.Variant.new_variant(GLib.Variant.new_tuple(new_arr))]))
    return b"FP3" + bytes(out.get_data_as_bytes().get_data())


def order(data, descending=True):
    """Impression indices by minutiae count, most first unless ``descending`` is false (ties:
    enrolment order)."""
    sizes = impressions(data)
    return sorted(range(len(sizes)), key=lambda i: (-sizes[i] if descending else sizes[i], i))


LAYOUTS = ("full", "best", "k2", "k3", "staged")


def gallery(templates, layout):
    """[(owner, template bytes)] in the order libfprint will try them (``templates`` in roster order)."""
    if layout == "full":
        return list(enumerate(templates))
    orders = [order(t) for t in templates]
    if layout == "best":
        return [(i, keep(t, o[:1])) for i, (t, o) in enumerate(zip(templates, orders))]
    if layout.startswith("k"):
        k = int(layout[1:])
        return [(i, keep(t, o[:k])) for i, (t, o) in enumerate(zip(templates, orders))]
    if layout == "staged":
        orders = [order(t, descending=False) for t in templates]
        first = [(i, keep(t, o[:1])) for i, (t, o) in enumerate(zip(templates, orders))]
        rest = [(i, keep(t, o[1:])) for i, (t, o) in enumerate(zip(templates, orders)) if len(o) > 1]
        return first + rest
    raise ValueError("unknown layout %r" % layout)


def prune(data, limit):
    """The template with each impression cut to the ``limit`` minutiae nearest its centroid
    (border minutiae are the least reliable and the least likely to be inside another touch).
    An experiment (match_cost.py --prune): cheaper genuine comparisons, fewer recognised touches;
    the daemon does not do this."""
    v = _fields(data)
    arr = v.get_child_value(9).get_variant().get_child_value(0)
    out_imps = []
    for i in range(arr.n_children()):
        x, y, t = (list(arr.get_child_value(i).get_child_value(j).unpack()) for j in range(3))
        if len(x) > limit:
            cx, cy = sum(x) / len(x), sum(y) / len(y)
            keep = sorted(sorted(range(len(x)), key=lambda k: ((x[k] - cx) ** 2 + (y[k] - cy) ** 2, k))[:limit])
            x, y, t = ([col[k] for k in keep] for col in (x, y, t))
        out_imps.append(GLib.Variant("(aiaiai)", (x, y, t)))
    new_arr = GLib.Variant.new_array(GLib.VariantType.new("(aiaiai)"), out_imps)
    out = GLib.Variant.new_tuple(*([v.get_child_value(i) for i in range(9)] + [GLib.Variant.new_variant(GLib.Variant.new_tuple(new_arr))]))
    return b"FP3" + bytes(out.get_data_as_bytes().get_data())
