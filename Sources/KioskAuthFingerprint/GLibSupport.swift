import CFPrint

// Small bridges between Swift closures and GLib's C callbacks. Every closure handed to GLib
// travels as a retained `CallbackBox`; GLib's destroy notify releases it.

/// A closure GLib can carry through a `gpointer`.
final class CallbackBox<Arguments> {
    let body: (Arguments) -> Void
    init(_ body: @escaping (Arguments) -> Void) { self.body = body }

    /// A +1 pointer for GLib; balanced by `release` (or `takeRetainedValue`).
    func retainedPointer() -> gpointer { Unmanaged.passRetained(self).toOpaque() }

    static func borrow(_ pointer: gpointer?) -> CallbackBox<Arguments> {
        Unmanaged<CallbackBox<Arguments>>.fromOpaque(pointer!).takeUnretainedValue()
    }

    static func take(_ pointer: gpointer?) -> CallbackBox<Arguments> {
        Unmanaged<CallbackBox<Arguments>>.fromOpaque(pointer!).takeRetainedValue()
    }
}

/// Releases a box handed to GLib with a destroy notify.
let releaseVoidBox: GDestroyNotify = { pointer in
    Unmanaged<CallbackBox<Void>>.fromOpaque(pointer!).release()
}

/// The GAsyncReadyCallback for every libfprint `*_finish` call: runs the box once.
let asyncReadyTrampoline: GAsyncReadyCallback = { _, result, userData in
    CallbackBox<OpaquePointer?>.take(userData).body(result)
}

/// Runs a one-shot `CallbackBox<Void>` and removes its source.
private let sourceOnceTrampoline: GSourceFunc = { userData in
    CallbackBox<Void>.borrow(userData).body(())
    return 0  // G_SOURCE_REMOVE
}

/// Schedules `body` on GLib's global default main context. Thread-safe: `g_idle_add_full` wakes
/// the context, so the loop thread runs it promptly.
func scheduleOnDefaultContext(_ body: @escaping () -> Void) {
    _ = lib.g_idle_add_full(
        G_PRIORITY_DEFAULT, sourceOnceTrampoline, CallbackBox<Void>(body).retainedPointer(),
        releaseVoidBox)
}

/// Runs `body` once after `milliseconds` on the default main context; returns the source id for
/// `g_source_remove`. Loop thread only (the id must not outlive its source).
func scheduleTimeout(milliseconds: UInt32, _ body: @escaping () -> Void) -> guint {
    lib.g_timeout_add_full(
        G_PRIORITY_DEFAULT, milliseconds, sourceOnceTrampoline,
        CallbackBox<Void>(body).retainedPointer(), releaseVoidBox)
}

/// Connects a C signal handler whose first arguments match the signal's. `handler` must be a
/// `@convention(c)` function whose last parameter is the `gpointer` user data.
func connectSignal<Handler>(
    _ instance: gpointer, _ signal: String, _ handler: Handler, userData: gpointer?
) -> gulong {
    let callback = unsafeBitCast(handler, to: (@convention(c) () -> Void).self)
    return lib.g_signal_connect_data(instance, signal, callback, userData, nil, GConnectFlags(0))
}

/// The message and mapping of a `GError`, which is then freed.
func consume(
    _ error: UnsafeMutablePointer<GError>?, file: String = #fileID, line: Int = #line
)
    -> FingerprintError
{
    guard let error else { return FingerprintError(.deviceFailure, "libfprint reported failure without an error") }
    defer { lib.g_error_free(error) }
    return FingerprintError(gError: error, file: file, line: line)
}

/// A borrowed C string as a Swift string; `""` for NULL.
func string(from pointer: UnsafePointer<gchar>?) -> String {
    pointer.map { String(cString: $0) } ?? ""
}

/// libfprint's functions and the GLib ones this module calls, as `lib.fp_device_open(...)`:
/// libfprint is not linked but loaded by `loadLibfprint()`, which the reader's thread calls
/// first (see CFPrint.h). Calling one before that succeeded is a call through a null pointer.
var lib: kioskauth_fprint_functions { kioskauth_fprint.pointee }

/// Loads libfprint and resolves `lib`; once per process (later calls report the first result).
func loadLibfprint() throws(FingerprintError) {
    if let failure = kioskauth_fprint_load() {
        throw FingerprintError(.deviceFailure, String(cString: failure))
    }
}
