// libfprint, loaded when the reader starts rather than linked.
//
// kioskauthd does not name libfprint (nor GLib, GIO, GUsb and the rest of its tree, about twenty
// libraries) among the libraries the loader maps before main(): mapping and relocating them was
// about 2 ms of every start. The reader's own thread loads it instead (kioskauth_fprint_load),
// while start-up opens the store, and the functions kioskauth calls are reached through the
// table below. Everything else here is libfprint's and GLib's own headers: their types,
// enumerations and constants.
#pragma once

#include <fprint.h>

// Every libfprint and GLib function the fingerprint module calls (X(name) for each).
#define KIOSKAUTH_FPRINT_FUNCTIONS(X)                                                              \
    X(fp_context_enumerate)                                                                        \
    X(fp_context_new)                                                                              \
    X(fp_device_close)                                                                             \
    X(fp_device_close_finish)                                                                      \
    X(fp_device_delete_print)                                                                      \
    X(fp_device_delete_print_finish)                                                               \
    X(fp_device_enroll)                                                                            \
    X(fp_device_enroll_finish)                                                                     \
    X(fp_device_error_quark)                                                                       \
    X(fp_device_get_device_id)                                                                     \
    X(fp_device_get_driver)                                                                        \
    X(fp_device_get_finger_status)                                                                 \
    X(fp_device_get_name)                                                                          \
    X(fp_device_get_nr_enroll_stages)                                                              \
    X(fp_device_get_scan_type)                                                                     \
    X(fp_device_has_feature)                                                                       \
    X(fp_device_identify)                                                                          \
    X(fp_device_identify_finish)                                                                   \
    X(fp_device_list_prints)                                                                       \
    X(fp_device_list_prints_finish)                                                                \
    X(fp_device_open)                                                                              \
    X(fp_device_open_finish)                                                                       \
    X(fp_device_retry_quark)                                                                       \
    X(fp_device_verify)                                                                            \
    X(fp_device_verify_finish)                                                                     \
    X(fp_print_compatible)                                                                         \
    X(fp_print_deserialize)                                                                        \
    X(fp_print_equal)                                                                              \
    X(fp_print_get_device_id)                                                                      \
    X(fp_print_get_driver)                                                                         \
    X(fp_print_new)                                                                                \
    X(fp_print_serialize)                                                                          \
    X(fp_print_set_finger)                                                                         \
    X(fp_print_set_username)                                                                       \
    X(g_bytes_get_data)                                                                            \
    X(g_bytes_new)                                                                                 \
    X(g_bytes_unref)                                                                               \
    X(g_cancellable_cancel)                                                                        \
    X(g_cancellable_new)                                                                           \
    X(g_error_free)                                                                                \
    X(g_error_new_literal)                                                                         \
    X(g_free)                                                                                      \
    X(g_idle_add_full)                                                                             \
    X(g_io_error_quark)                                                                            \
    X(g_main_context_acquire)                                                                      \
    X(g_main_context_default)                                                                      \
    X(g_main_context_iteration)                                                                    \
    X(g_main_context_release)                                                                      \
    X(g_main_loop_new)                                                                             \
    X(g_main_loop_quit)                                                                            \
    X(g_main_loop_run)                                                                             \
    X(g_main_loop_unref)                                                                           \
    X(g_object_ref)                                                                                \
    X(g_object_unref)                                                                              \
    X(g_ptr_array_add)                                                                             \
    X(g_ptr_array_new_with_free_func)                                                              \
    X(g_ptr_array_unref)                                                                           \
    X(g_quark_from_string)                                                                         \
    X(g_signal_connect_data)                                                                       \
    X(g_signal_handler_disconnect)                                                                 \
    X(g_source_remove)                                                                             \
    X(g_timeout_add_full)                                                                          \
    X(g_variant_byteswap)                                                                          \
    X(g_variant_get_child_value)                                                                   \
    X(g_variant_get_data_as_bytes)                                                                 \
    X(g_variant_get_int32)                                                                         \
    X(g_variant_get_normal_form)                                                                   \
    X(g_variant_get_variant)                                                                       \
    X(g_variant_is_of_type)                                                                        \
    X(g_variant_n_children)                                                                        \
    X(g_variant_new_array)                                                                         \
    X(g_variant_new_from_bytes)                                                                    \
    X(g_variant_new_tuple)                                                                         \
    X(g_variant_new_variant)                                                                       \
    X(g_variant_ref_sink)                                                                          \
    X(g_variant_type_free)                                                                         \
    X(g_variant_type_new)                                                                          \
    X(g_variant_unref)

#define KIOSKAUTH_FPRINT_FIELD(name) __typeof__(&name) _Nonnull name;

// The functions, each with the type its header declares. Filled by kioskauth_fprint_load; a
// call before it succeeded is a call through a null pointer.
struct kioskauth_fprint_functions {
    KIOSKAUTH_FPRINT_FUNCTIONS(KIOSKAUTH_FPRINT_FIELD)
};

#undef KIOSKAUTH_FPRINT_FIELD

extern const struct kioskauth_fprint_functions *const _Nonnull kioskauth_fprint;

// Loads libfprint (KIOSKAUTH_FPRINT_LIBRARY, by the name its package installs) and resolves
// every function of the table through it; when one is missing the library is closed again
// (GLib's GObject stays: it cannot be unloaded). Once per process: later calls return the first
// one's result. NULL on success, else why it failed (static storage).
const char *_Nullable kioskauth_fprint_load(void);

#define KIOSKAUTH_FPRINT_LIBRARY "libfprint-2.so.2"
