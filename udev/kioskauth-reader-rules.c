/*
 * kioskauth-reader-rules — writes udev rules that mark every fingerprint reader the installed
 * libfprint supports, straight from libfprint's own driver tables.
 *
 * Usage: kioskauth-reader-rules TEMPLATE > 70-kioskauth.rules
 *
 * The template holds the policy (what a reader gets: group, systemd tag); this program fills in
 * the data, replacing the lines @USB_MATCHES@, @SPIDEV_MATCHES@ and @HIDRAW_MATCHES@. It runs at
 * build time against the libfprint the daemon links, so the rules follow the library instead of a
 * hand-kept list of IDs. libfprint's own hwdb is no substitute: it only sets ID_AUTOSUSPEND and
 * ID_PERSIST, which other devices share and which it also sets on known-unsupported readers.
 *
 * libfprint keeps its driver tables in private structures (fpi-device.h), so this program reads
 * them through a mirror of their stable leading fields and refuses to print anything that does
 * not look exactly like a driver table: a build that cannot derive the list fails loudly rather
 * than install rules for the wrong devices.
 */

#include <ctype.h>
#include <fprint.h>
#include <glib-object.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The udev node kinds a libfprint "udev" driver needs (FpiDeviceUdevSubtypeFlags). */
enum {
    UDEV_SUBTYPE_SPIDEV = 1 << 0,
    UDEV_SUBTYPE_HIDRAW = 1 << 1,
    UDEV_SUBTYPE_KNOWN = UDEV_SUBTYPE_SPIDEV | UDEV_SUBTYPE_HIDRAW,
};

/*
 * The head of libfprint's FpIdEntry: a union of the USB, virtual and udev identifications, then
 * driver_data. Some libfprint versions append padding to every entry, so the distance between
 * entries is measured (see entry_stride()) instead of taken from sizeof.
 */
typedef struct {
    union {
        struct {
            guint pid;
            guint vid;
        } usb;
        const gchar *virtual_envvar;
        struct {
            guint types;
            const gchar *spi_acpi_id;
            struct {
                guint pid;
                guint vid;
            } hid;
        } udev;
    };
    guint64 driver_data;
} IdEntryHead;

/* The leading fields of libfprint's FpDeviceClass, unchanged since libfprint 1.90. */
typedef struct {
    GObjectClass parent_class;
    const gchar *id;
    const gchar *full_name;
    FpDeviceType type;
    const IdEntryHead *id_table;
} DeviceClassHead;

/* Entries are either exactly IdEntryHead or IdEntryHead plus 16 pointers of padding. */
static const gsize candidate_strides[] = {sizeof(IdEntryHead),
                                          sizeof(IdEntryHead) + 16 * sizeof(gpointer)};

/* Longest ACPI ID or driver name accepted; real ones are 8 and about 20 characters. */
enum { MAX_NAME_LENGTH = 64, MAX_TABLE_ENTRIES = 4096 };

static void G_GNUC_NORETURN G_GNUC_PRINTF(1, 2) die(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("kioskauth-reader-rules: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(EXIT_FAILURE);
}

static const IdEntryHead *entry_at(const IdEntryHead *table, gsize stride, gsize index) {
    return (const IdEntryHead *)((const guint8 *)table + stride * index);
}

static gboolean is_plain_name(const char *s, gboolean allow_space) {
    if (s == NULL || *s == '\0' || strnlen(s, MAX_NAME_LENGTH + 1) > MAX_NAME_LENGTH)
        return FALSE;
    for (; *s != '\0'; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '-' || *s == '.' ||
              (allow_space && (*s == ' ' || *s == '/' || *s == '(' || *s == ')'))))
            return FALSE;
    return TRUE;
}

static gboolean is_terminator(const DeviceClassHead *cls, const IdEntryHead *entry) {
    switch (cls->type) {
    case FP_DEVICE_TYPE_USB:
        return entry->usb.vid == 0;
    case FP_DEVICE_TYPE_UDEV:
        return entry->udev.types == 0;
    default:
        return entry->virtual_envvar == NULL;
    }
}

static gboolean is_valid_entry(const DeviceClassHead *cls, const IdEntryHead *entry) {
    switch (cls->type) {
    case FP_DEVICE_TYPE_USB:
        return entry->usb.vid <= 0xffff && entry->usb.pid <= 0xffff;
    case FP_DEVICE_TYPE_UDEV:
        if ((entry->udev.types & ~UDEV_SUBTYPE_KNOWN) != 0)
            return FALSE;
        if ((entry->udev.types & UDEV_SUBTYPE_SPIDEV) &&
            !is_plain_name(entry->udev.spi_acpi_id, FALSE))
            return FALSE;
        if (entry->udev.types & UDEV_SUBTYPE_HIDRAW)
            return entry->udev.hid.vid != 0 && entry->udev.hid.vid <= 0xffff &&
                   entry->udev.hid.pid <= 0xffff;
        return TRUE;
    default:
        return is_plain_name(entry->virtual_envvar, FALSE);
    }
}

static gboolean is_zero(const guint8 *bytes, gsize length) {
    for (gsize i = 0; i < length; i++)
        if (bytes[i] != 0)
            return FALSE;
    return TRUE;
}

/*
 * Whether every table reads as valid entries followed by a terminator when entries are `stride`
 * bytes apart, with any padding zero. Sets *longest to the longest table seen.
 */
static gboolean stride_fits(GPtrArray *classes, gsize stride, gsize *longest) {
    *longest = 0;
    for (guint i = 0; i < classes->len; i++) {
        const DeviceClassHead *cls = g_ptr_array_index(classes, i);
        gsize n = 0;
        for (;; n++) {
            const IdEntryHead *entry = entry_at(cls->id_table, stride, n);
            if (stride > sizeof(IdEntryHead) &&
                !is_zero((const guint8 *)entry + sizeof(IdEntryHead), stride - sizeof(IdEntryHead)))
                return FALSE;
            if (is_terminator(cls, entry))
                break;
            if (n >= MAX_TABLE_ENTRIES || !is_valid_entry(cls, entry))
                return FALSE;
        }
        *longest = MAX(*longest, n);
    }
    return TRUE;
}

/*
 * The distance between entries in libfprint's id tables. Exactly one candidate must fit, and it
 * must be confirmed by a table with at least two entries: with one entry per table the padded and
 * unpadded layouts cannot be told apart.
 */
static gsize entry_stride(GPtrArray *classes) {
    gsize found = 0;
    for (gsize c = 0; c < G_N_ELEMENTS(candidate_strides); c++) {
        gsize longest = 0;
        if (stride_fits(classes, candidate_strides[c], &longest) && longest >= 2) {
            if (found != 0)
                die("libfprint's driver tables fit more than one layout; refusing to guess");
            found = candidate_strides[c];
        }
    }
    if (found == 0)
        die("libfprint's driver tables do not have a layout this program knows; "
            "update udev/kioskauth-reader-rules.c for libfprint %s",
            LIBFPRINT_VERSION_STRING);
    return found;
}

static void collect_driver_classes(GType type, GPtrArray *classes) {
    guint n_children = 0;
    GType *children = g_type_children(type, &n_children);
    for (guint i = 0; i < n_children; i++) {
        if (!G_TYPE_IS_ABSTRACT(children[i])) {
            const DeviceClassHead *cls = g_type_class_ref(children[i]);
            if (!is_plain_name(cls->id, FALSE) || !is_plain_name(cls->full_name, TRUE))
                die("driver type %s has no readable id or name; libfprint's layout changed?",
                    g_type_name(children[i]));
            if (cls->type != FP_DEVICE_TYPE_VIRTUAL && cls->type != FP_DEVICE_TYPE_USB &&
                cls->type != FP_DEVICE_TYPE_UDEV)
                die("driver %s has unknown device type %d", cls->id, (int)cls->type);
            if (cls->id_table == NULL)
                die("driver %s has no id table", cls->id);
            g_ptr_array_add(classes, (gpointer)cls);
        }
        collect_driver_classes(children[i], classes);
    }
    g_free(children);
}

static gint compare_driver_ids(gconstpointer a, gconstpointer b) {
    const DeviceClassHead *x = *(const DeviceClassHead *const *)a;
    const DeviceClassHead *y = *(const DeviceClassHead *const *)b;
    return g_strcmp0(x->id, y->id);
}

/* Rules for one section; each matching device gets KIOSKAUTH_READER (or _COMPANION) and
 * KIOSKAUTH_DRIVER. */
static void print_matches(GPtrArray *classes, gsize stride, const char *section, FILE *out) {
    GHashTable *printed = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, NULL);
    for (guint i = 0; i < classes->len; i++) {
        const DeviceClassHead *cls = g_ptr_array_index(classes, i);
        gboolean header_printed = FALSE;
        for (gsize n = 0;; n++) {
            const IdEntryHead *entry = entry_at(cls->id_table, stride, n);
            if (is_terminator(cls, entry))
                break;
            g_autofree char *key = NULL;
            g_autofree char *rule = NULL;
            if (strcmp(section, "usb") == 0 && cls->type == FP_DEVICE_TYPE_USB) {
                /* sysfs spells idVendor/idProduct as four lower-case hex digits. */
                key = g_strdup_printf("usb %04x:%04x", entry->usb.vid, entry->usb.pid);
                rule = g_strdup_printf("ATTR{idVendor}==\"%04x\", ATTR{idProduct}==\"%04x\", "
                                       "ENV{KIOSKAUTH_READER}=\"1\", ENV{KIOSKAUTH_DRIVER}=\"%s\"",
                                       entry->usb.vid, entry->usb.pid, cls->id);
            } else if (strcmp(section, "spidev") == 0 && cls->type == FP_DEVICE_TYPE_UDEV &&
                       (entry->udev.types & UDEV_SUBTYPE_SPIDEV)) {
                /* libfprint picks the spidev node whose sysfs path contains the ACPI ID. */
                key = g_strdup_printf("spidev %s", entry->udev.spi_acpi_id);
                rule = g_strdup_printf("DEVPATH==\"*%s*\", ENV{KIOSKAUTH_READER}=\"1\", "
                                       "ENV{KIOSKAUTH_DRIVER}=\"%s\"",
                                       entry->udev.spi_acpi_id, cls->id);
            } else if (strcmp(section, "hidraw") == 0 && cls->type == FP_DEVICE_TYPE_UDEV &&
                       (entry->udev.types & UDEV_SUBTYPE_HIDRAW)) {
                /* libfprint compares the parent HID device's vendor and product; the kernel
                 * names HID devices BUS:VENDOR:PRODUCT.INSTANCE in upper-case hex. When the
                 * sensor itself is on SPI, this node is a companion (the touchpad it shares a
                 * controller with), needed for access but not a reader of its own. */
                gboolean is_companion = (entry->udev.types & UDEV_SUBTYPE_SPIDEV) != 0;
                key = g_strdup_printf("hidraw %04X:%04X", entry->udev.hid.vid, entry->udev.hid.pid);
                rule = g_strdup_printf(
                    "SUBSYSTEMS==\"hid\", KERNELS==\"*:%04X:%04X.*\", "
                    "ENV{%s}=\"1\", ENV{KIOSKAUTH_DRIVER}=\"%s\"",
                    entry->udev.hid.vid, entry->udev.hid.pid,
                    is_companion ? "KIOSKAUTH_READER_COMPANION" : "KIOSKAUTH_READER", cls->id);
            }
            if (rule == NULL || g_hash_table_contains(printed, key))
                continue; /* another driver claimed it first, as libfprint's own lists do */
            if (!header_printed) {
                fprintf(out, "# %s: %s\n", cls->id, cls->full_name);
                header_printed = TRUE;
            }
            fprintf(out, "%s\n", rule);
            g_hash_table_add(printed, g_steal_pointer(&key));
        }
    }
    if (g_hash_table_size(printed) == 0)
        fprintf(out, "# (libfprint %s has no %s readers)\n", LIBFPRINT_VERSION_STRING, section);
    g_hash_table_unref(printed);
}

int main(int argc, char **argv) {
    if (argc != 2)
        die("usage: kioskauth-reader-rules TEMPLATE");

    g_autofree char *template = NULL;
    g_autoptr(GError) error = NULL;
    if (!g_file_get_contents(argv[1], &template, NULL, &error))
        die("%s", error->message);

    /* Creating a context registers every driver type the library was built with. */
    g_autoptr(FpContext) context = fp_context_new();
    g_autoptr(GPtrArray) classes = g_ptr_array_new();
    collect_driver_classes(FP_TYPE_DEVICE, classes);
    g_ptr_array_sort(classes, compare_driver_ids);
    if (classes->len == 0)
        die("libfprint registered no drivers");
    gsize stride = entry_stride(classes);

    g_auto(GStrv) lines = g_strsplit(template, "\n", -1);
    guint substituted = 0;
    for (guint i = 0; lines[i] != NULL; i++) {
        if (lines[i + 1] == NULL && lines[i][0] == '\0')
            break; /* the template's final newline */
        if (strcmp(lines[i], "@LIBFPRINT_VERSION@") == 0) {
            printf("# Generated from the driver tables of libfprint %s.\n",
                   LIBFPRINT_VERSION_STRING);
            substituted++;
        } else if (strcmp(lines[i], "@USB_MATCHES@") == 0) {
            print_matches(classes, stride, "usb", stdout);
            substituted++;
        } else if (strcmp(lines[i], "@SPIDEV_MATCHES@") == 0) {
            print_matches(classes, stride, "spidev", stdout);
            substituted++;
        } else if (strcmp(lines[i], "@HIDRAW_MATCHES@") == 0) {
            print_matches(classes, stride, "hidraw", stdout);
            substituted++;
        } else {
            printf("%s\n", lines[i]);
        }
    }
    if (substituted != 4)
        die("%s must contain each of @LIBFPRINT_VERSION@, @USB_MATCHES@, @SPIDEV_MATCHES@ and "
            "@HIDRAW_MATCHES@ once",
            argv[1]);
    if (fflush(stdout) != 0 || ferror(stdout))
        die("cannot write the rules");
    return EXIT_SUCCESS;
}
