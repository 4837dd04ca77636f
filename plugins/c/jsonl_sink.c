/* jsonl_sink in C: the same foreachBatch sink (world `sink`) as plugins/jsonl_sink (Rust),
 * built with wit-bindgen's C generator, clang and the WASI preview-1 reactor adapter
 * (tests/build_c.rs; wit/README.md shows the commands). It appends each batch's rows to a
 * JSON-lines file exactly once per batch id, with nothing but the directory the host grants (a
 * WASI preopen, reached through wasi-libc's open/ftruncate/fsync/rename). Config:
 * `{ "path": "/out/orders.jsonl" }`. Protocol, as in Rust: a sidecar `<path>.batches` holds
 * `"<last batch id> <data length>\n"`; `write-batch(N)` skips when N <= last, truncates the data
 * file to the recorded length (dropping what an interrupted attempt appended), appends every row
 * and syncs, then replaces the sidecar atomically (write `<path>.batches.tmp`, sync, rename).
 * Rows are byte for byte the Rust sink's: one JSON object per line, keys in schema order, nulls
 * omitted, strings escaped as serde_json does, timestamps RFC 3339 UTC with `Z` (and 3 or 6
 * fractional digits when needed), dates `YYYY-MM-DD`, decimals exact at their scale, floats in
 * Rust's shortest round-trip form (`1.0`, `0.1`, `1e16`), non-finite floats as the strings
 * `NaN`, `Infinity`, `-Infinity`. */

#include "sink.h"
#include "weir_c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(WEIR_PLUGIN_TYPES_ERROR_KIND_FATAL == WEIR_FATAL, "error-kind");
_Static_assert(WEIR_PLUGIN_TYPES_ERROR_KIND_RETRYABLE == WEIR_RETRYABLE, "error-kind");
_Static_assert(WEIR_PLUGIN_TYPES_ERROR_KIND_INVALID_CONFIG == WEIR_INVALID_CONFIG, "error-kind");
_Static_assert(WEIR_PLUGIN_TYPES_ERROR_KIND_INVALID_INPUT == WEIR_INVALID_INPUT, "error-kind");

WEIR_PLUGIN_METADATA({
    "name": "jsonl_sink",
    "version": "0.1.0",
    "description": "Appends rows to a JSON-lines file, exactly once per batch id (a <path>.batches sidecar); the C example.",
    "config_schema": {
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1}},
        "required": ["path"],
        "additionalProperties": false
    }
});

/* The opened sink: the data file, its sidecar and the sidecar's temporary name. */
static struct {
    char *path;
    char *sidecar;
    char *sidecar_tmp;
} sink;

/* A plugin error: `message` is malloc'd (the bindings free it after the call). */
typedef struct {
    uint8_t kind;
    char *message;
} failure;

static failure ok(void) {
    return (failure){0, NULL};
}

static failure failed(uint8_t kind, char *message) {
    return (failure){kind, message};
}

/* Debian's wasi-libc (preview 1) says ENOTCAPABLE for a path under no preopen, where the newer
 * wasi-libc of Rust's std says ENOENT: read it as ENOENT, so that the messages are Rust's and a
 * path that is not granted is a fatal error, as a missing one is. */
static int path_errno(int code) {
#ifdef ENOTCAPABLE
    if (code == ENOTCAPABLE) {
        return ENOENT;
    }
#endif
    return code;
}

/* Rust's `io::Error` text: `No such file or directory (os error 44)`. */
static char *os_error(int code) {
    code = path_errno(code);
    return weir_format("%s (os error %d)", strerror(code), code);
}

/* A file-system failure naming the file and what was being done. A missing or forbidden path
 * will not fix itself; anything else (a full disk, an I/O error) may. */
static failure io_error(const char *what, const char *path, int code) {
    code = path_errno(code);
    char *e = os_error(code);
    char *message = weir_format("jsonl_sink: %s %s: %s", what, path, e);
    free(e);
    bool permanent = code == ENOENT || code == EACCES || code == EPERM;
    return failed(permanent ? WEIR_FATAL : WEIR_RETRYABLE, message);
}

static void host_log(weir_plugin_host_log_level_t level, char *message) {
    sink_string_t text = {(uint8_t *)message, strlen(message)};
    weir_plugin_host_log(level, &text);
    free(message);
}

/* ---- open ------------------------------------------------------------------------------------ */

/* Rust's `Path::file_name`: the last component unless it is `..` (or there is none). */
static bool names_a_file(const char *path) {
    const char *last = NULL;
    size_t last_len = 0;
    for (const char *p = path; *p;) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > 0 && !(n == 1 && p[0] == '.')) {
            last = p;
            last_len = n;
        }
        p += n;
        while (*p == '/') {
            p++;
        }
    }
    return last && !(last_len == 2 && last[0] == '.' && last[1] == '.');
}

/* Rust's `Path::parent`, with an empty parent read as `.`. */
static char *parent_of(const char *path) {
    size_t n = strlen(path);
    /* Trailing separators and `.` components are not components. */
    for (;;) {
        while (n > 1 && path[n - 1] == '/') {
            n--;
        }
        if (n >= 2 && path[n - 1] == '.' && path[n - 2] == '/') {
            n -= 2;
            continue;
        }
        break;
    }
    while (n > 0 && path[n - 1] != '/') {
        n--;
    }
    while (n > 1 && path[n - 1] == '/') {
        n--;
    }
    if (n == 0) {
        return weir_format(".");
    }
    return weir_format("%.*s", (int)n, path);
}

static failure open_sink(const weir_json *config) {
    static const char *const required[] = {"path", NULL};
    char *e = weir_config_check(config, required, NULL);
    if (e) {
        return failed(WEIR_INVALID_CONFIG, e);
    }
    const weir_json *path = weir_json_get(config, "path");
    if (path->kind != WEIR_JSON_STRING) {
        weir_buf b = {0};
        weir_buf_puts(&b, "config.path: invalid type: ");
        weir_buf_json_unexpected(&b, path);
        weir_buf_puts(&b, ", expected path string");
        return failed(WEIR_INVALID_CONFIG, weir_buf_take(&b));
    }
    if (strlen(path->str) != path->len) {
        return failed(WEIR_INVALID_CONFIG,
                      weir_format("jsonl_sink: path `%s` holds a NUL character", path->str));
    }
    if (!names_a_file(path->str)) {
        return failed(WEIR_INVALID_CONFIG,
                      weir_format("jsonl_sink: path `%s` does not name a file", path->str));
    }
    char *dir = parent_of(path->str);
    struct stat st;
    if (stat(dir, &st) != 0) {
        char *why = os_error(errno);
        failure f = failed(WEIR_INVALID_CONFIG,
                           weir_format("jsonl_sink: directory %s of path `%s` is not accessible "
                                       "(is it granted?): %s",
                                       dir, path->str, why));
        free(why);
        free(dir);
        return f;
    }
    free(dir);
    sink.path = weir_format("%s", path->str);
    sink.sidecar = weir_format("%s.batches", path->str);
    sink.sidecar_tmp = weir_format("%s.batches.tmp", path->str);
    return ok();
}

bool exports_weir_plugin_writer_open(sink_string_t *config,
                                     exports_weir_plugin_writer_list_field_t *input_schema,
                                     exports_weir_plugin_writer_plugin_error_t *err) {
    exports_weir_plugin_writer_list_field_free(input_schema);
    free(sink.path);
    free(sink.sidecar);
    free(sink.sidecar_tmp);
    memset(&sink, 0, sizeof sink);
    char *e = NULL;
    weir_json *json = weir_json_parse((const char *)config->ptr, config->len, &e);
    sink_string_free(config);
    failure f = json ? open_sink(json) : failed(WEIR_INVALID_CONFIG, e);
    weir_json_free(json);
    if (f.message) {
        err->kind = f.kind;
        err->message = (sink_string_t){(uint8_t *)f.message, strlen(f.message)};
        err->row.is_some = false;
        return false;
    }
    return true;
}

/* ---- the sidecar ----------------------------------------------------------------------------- */

/* Rust's `u64::from_str`: an optional `+`, then decimal digits only, in range. */
static bool parse_u64(const char *s, size_t n, uint64_t *out) {
    if (n && s[0] == '+') {
        s++;
        n--;
    }
    if (n == 0) {
        return false;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return false;
        }
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s[i] - '0', &v)) {
            return false;
        }
    }
    *out = v;
    return true;
}

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (len == 0 || i + len > n) {
            return false;
        }
        uint32_t cp = len == 1 ? c : (uint32_t)(c & (0x7f >> len));
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) {
                return false;
            }
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        static const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
            return false;
        }
        i += len;
    }
    return true;
}

/* Reads `<last batch> <length>` from the sidecar; `*found` is false when there is none. */
static failure read_progress(bool *found, uint64_t *last, uint64_t *length) {
    *found = false;
    int fd = open(sink.sidecar, O_RDONLY);
    if (fd < 0) {
        return path_errno(errno) == ENOENT ? ok() : io_error("cannot read", sink.sidecar, errno);
    }
    weir_buf text = {0};
    for (;;) {
        weir_buf_reserve(&text, 4096);
        ssize_t n = read(fd, text.ptr + text.len, text.cap - text.len);
        if (n < 0) {
            int code = errno;
            close(fd);
            weir_buf_free(&text);
            return io_error("cannot read", sink.sidecar, code);
        }
        if (n == 0) {
            break;
        }
        text.len += (size_t)n;
    }
    close(fd);
    if (!valid_utf8(text.ptr, text.len)) {
        weir_buf_free(&text);
        return failed(WEIR_RETRYABLE,
                      weir_format("jsonl_sink: cannot read %s: stream did not contain valid UTF-8",
                                  sink.sidecar));
    }
    /* `text.trim_end().split_once(' ')`, then both halves as u64. */
    const char *s = (const char *)text.ptr;
    size_t end = text.len;
    while (end > 0 && (s[end - 1] == ' ' || (s[end - 1] >= '\t' && s[end - 1] <= '\r'))) {
        end--;
    }
    const char *space = end ? memchr(s, ' ', end) : NULL;
    if (space && parse_u64(s, (size_t)(space - s), last) &&
        parse_u64(space + 1, end - (size_t)(space - s) - 1, length)) {
        weir_buf_free(&text);
        *found = true;
        return ok();
    }
    weir_buf b = {0};
    weir_buf_printf(&b, "jsonl_sink: %s is not `<batch id> <length>`: ", sink.sidecar);
    weir_buf_debug_string(&b, text.ptr, text.len);
    weir_buf_free(&text);
    return failed(WEIR_FATAL, weir_buf_take(&b));
}

static failure write_progress(uint64_t last, uint64_t length) {
    const char *tmp = sink.sidecar_tmp;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd < 0) {
        return io_error("cannot create", tmp, errno);
    }
    char line[48];
    int n = snprintf(line, sizeof line, "%llu %llu\n", (unsigned long long)last,
                     (unsigned long long)length);
    ssize_t written = write(fd, line, (size_t)n);
    if (written != n || fsync(fd) != 0) {
        int code = written >= 0 && written != n ? EIO : errno;
        close(fd);
        return io_error("cannot write", tmp, code);
    }
    close(fd);
    if (rename(tmp, sink.sidecar) != 0) {
        return io_error("cannot rename", tmp, errno);
    }
    /* Syncing the directory makes the rename survive a power loss; the crash model here is the
     * process dying, which the rename alone survives, and some WASI hosts cannot open a
     * directory as a file. So this is best effort and its failure is not an error. */
    char *dir = parent_of(sink.sidecar);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
    return ok();
}

/* ---- rows ------------------------------------------------------------------------------------ */

/* Writes all of `b` to `fd` and empties it; false with errno set on failure. */
static bool flush(int fd, weir_buf *b) {
    size_t at = 0;
    while (at < b->len) {
        ssize_t n = write(fd, b->ptr + at, b->len - at);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return false;
        }
        if (n == 0) {
            errno = EIO;
            return false;
        }
        at += (size_t)n;
    }
    b->len = 0;
    return true;
}

static bool is_null(const weir_plugin_types_column_t *c, size_t row) {
    return c->validity.is_some && !weir_bit(c->validity.val.ptr, row);
}

/* Whether the column's buffers hold `rows` values of its layout (the host's always do). */
static bool fits(const weir_plugin_types_column_t *c, size_t rows) {
    const weir_plugin_types_column_values_t *v = &c->values;
    if (c->validity.is_some && c->validity.val.len < weir_bitmap_bytes(rows)) {
        return false;
    }
    switch (v->tag) {
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_BOOLEAN:
        return v->val.boolean.len >= weir_bitmap_bytes(rows);
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_INT32:
        return v->val.int32.len >= rows;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_INT64:
        return v->val.int64.len >= rows;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_FLOAT64:
        return v->val.float64.len >= rows;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_DECIMAL128:
        return v->val.decimal128.len / 16 >= rows;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_UTF8:
        return rows == 0 || v->val.utf8.offsets.len > rows;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_TIMESTAMP_MICROS:
        return v->val.timestamp_micros.len >= rows;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_DATE32:
        return v->val.date32.len >= rows;
    default:
        return false;
    }
}

/* Writes value `row` of `c` (not null) as JSON. */
static void write_value(weir_buf *out, const weir_plugin_types_column_t *c, size_t row) {
    const weir_plugin_types_column_values_t *v = &c->values;
    switch (v->tag) {
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_BOOLEAN:
        weir_buf_puts(out, weir_bit(v->val.boolean.ptr, row) ? "true" : "false");
        break;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_INT32:
        weir_buf_i64(out, v->val.int32.ptr[row]);
        break;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_INT64:
        weir_buf_i64(out, v->val.int64.ptr[row]);
        break;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_FLOAT64: {
        double x = v->val.float64.ptr[row];
        if (x != x) {
            weir_buf_puts(out, "\"NaN\"");
        } else if (x == __builtin_inf()) {
            weir_buf_puts(out, "\"Infinity\"");
        } else if (x == -__builtin_inf()) {
            weir_buf_puts(out, "\"-Infinity\"");
        } else {
            weir_buf_f64_debug(out, x);
        }
        break;
    }
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_DECIMAL128: {
        int8_t scale = c->data_type.tag == WEIR_DECIMAL128 ? c->data_type.val.decimal128.scale : 0;
        weir_buf_decimal(out, weir_decimal_at(v->val.decimal128.ptr, row), scale);
        break;
    }
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_UTF8: {
        const weir_plugin_types_utf8_values_t *u = &v->val.utf8;
        int32_t start = u->offsets.ptr[row], end = u->offsets.ptr[row + 1];
        bool sane = start >= 0 && end >= start && (size_t)end <= u->data.len;
        weir_buf_json_string(out, sane ? u->data.ptr + start : u->data.ptr,
                             sane ? (size_t)(end - start) : 0);
        break;
    }
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_TIMESTAMP_MICROS:
        weir_buf_putc(out, '"');
        weir_buf_timestamp_micros(out, v->val.timestamp_micros.ptr[row]);
        weir_buf_putc(out, '"');
        break;
    case WEIR_PLUGIN_TYPES_COLUMN_VALUES_DATE32:
        weir_buf_putc(out, '"');
        weir_buf_date32(out, v->val.date32.ptr[row]);
        weir_buf_putc(out, '"');
        break;
    }
}

#define BUFFER_SIZE (64 * 1024)

/* Appends one JSON line per row at `fd`'s position. Halfway through it flushes and logs, so that
 * the host's crash tests can kill the process in that host call with half a batch on disk. */
static failure append_rows(int fd, weir_plugin_types_borrow_batch_t batch, uint64_t batch_id) {
    weir_plugin_types_list_field_t schema;
    weir_plugin_types_method_batch_schema(batch, &schema);
    size_t width = schema.len;
    weir_plugin_types_list_field_free(&schema);
    size_t rows = weir_plugin_types_method_batch_num_rows(batch);
    weir_plugin_types_column_t *columns = weir_xmalloc(width * sizeof *columns);
    weir_buf *keys = weir_xmalloc(width * sizeof *keys);
    failure f = ok();
    size_t pulled = 0;
    for (; pulled < width; pulled++) {
        weir_plugin_types_column_t *c = &columns[pulled];
        weir_plugin_types_method_batch_column(batch, (uint32_t)pulled, c);
        keys[pulled] = (weir_buf){0};
        weir_buf_json_string(&keys[pulled], c->name.ptr, c->name.len);
        weir_buf_putc(&keys[pulled], ':');
        if (!fits(c, rows)) {
            f = failed(WEIR_INVALID_INPUT,
                       weir_format("jsonl_sink: column `%.*s` holds fewer values than the "
                                   "batch's %zu rows",
                                   (int)c->name.len, (const char *)c->name.ptr, rows));
            pulled++;
            goto done;
        }
    }
    weir_buf out = {0};
    weir_buf_reserve(&out, BUFFER_SIZE);
    for (size_t row = 0; row < rows; row++) {
        if (row == rows / 2) {
            if (!flush(fd, &out)) {
                f = io_error("cannot write", sink.path, errno);
                break;
            }
            host_log(WEIR_PLUGIN_HOST_LOG_LEVEL_DEBUG,
                     weir_format("jsonl_sink: wrote half of batch %llu",
                                 (unsigned long long)batch_id));
        }
        weir_buf_putc(&out, '{');
        bool first = true;
        for (size_t k = 0; k < width; k++) {
            if (is_null(&columns[k], row)) {
                continue;
            }
            if (!first) {
                weir_buf_putc(&out, ',');
            }
            first = false;
            weir_buf_put(&out, keys[k].ptr, keys[k].len);
            write_value(&out, &columns[k], row);
        }
        weir_buf_put(&out, "}\n", 2);
        if (out.len >= BUFFER_SIZE && !flush(fd, &out)) {
            f = io_error("cannot write", sink.path, errno);
            break;
        }
    }
    if (!f.message && !flush(fd, &out)) {
        f = io_error("cannot write", sink.path, errno);
    }
    weir_buf_free(&out);
done:
    for (size_t k = 0; k < pulled; k++) {
        weir_plugin_types_column_free(&columns[k]);
        weir_buf_free(&keys[k]);
    }
    free(columns);
    free(keys);
    return f;
}

/* ---- write-batch ----------------------------------------------------------------------------- */

static failure write_batch(weir_plugin_types_borrow_batch_t batch, uint64_t id) {
    bool found;
    uint64_t last = 0, length = 0;
    failure f = read_progress(&found, &last, &length);
    if (f.message) {
        return f;
    }
    if (found && id <= last) {
        host_log(WEIR_PLUGIN_HOST_LOG_LEVEL_INFO,
                 weir_format("jsonl_sink: batch %llu is already in %s (last written: %llu), "
                             "skipping",
                             (unsigned long long)id, sink.path, (unsigned long long)last));
        return ok();
    }
    if (!found) {
        length = 0;
    }

    int fd = open(sink.path, O_WRONLY | O_CREAT, 0666);
    if (fd < 0) {
        return io_error("cannot open", sink.path, errno);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        f = io_error("cannot stat", sink.path, errno);
        goto out;
    }
    uint64_t actual = (uint64_t)st.st_size;
    if (actual < length) {
        f = failed(WEIR_FATAL,
                   weir_format("jsonl_sink: %s has %llu bytes but %s records %llu: the file was "
                               "changed outside the sink",
                               sink.path, (unsigned long long)actual, sink.sidecar,
                               (unsigned long long)length));
        goto out;
    }
    if (actual > length) {
        host_log(WEIR_PLUGIN_HOST_LOG_LEVEL_WARN,
                 weir_format("jsonl_sink: dropping %llu bytes of an interrupted write from %s",
                             (unsigned long long)(actual - length), sink.path));
        if (ftruncate(fd, (off_t)length) != 0) {
            f = io_error("cannot truncate", sink.path, errno);
            goto out;
        }
    }
    if (lseek(fd, (off_t)length, SEEK_SET) < 0) {
        f = io_error("cannot seek in", sink.path, errno);
        goto out;
    }
    f = append_rows(fd, batch, id);
    if (f.message) {
        goto out;
    }
    if (fsync(fd) != 0) {
        f = io_error("cannot sync", sink.path, errno);
        goto out;
    }
    off_t end = lseek(fd, 0, SEEK_CUR);
    if (end < 0) {
        f = io_error("cannot tell the position in", sink.path, errno);
        goto out;
    }
    close(fd);
    return write_progress(id, (uint64_t)end);
out:
    close(fd);
    return f;
}

bool exports_weir_plugin_writer_write_batch(exports_weir_plugin_writer_batch_info_t *info,
                                            exports_weir_plugin_writer_borrow_batch_t input,
                                            exports_weir_plugin_writer_plugin_error_t *err) {
    uint64_t id = info->batch_id;
    exports_weir_plugin_writer_batch_info_free(info);
    failure f = sink.path
                    ? write_batch(input, id)
                    : failed(WEIR_FATAL, weir_format("jsonl_sink: `write-batch` before `open`"));
    /* A borrow handed to an export is the callee's to drop (the bindings do not autodrop). */
    weir_plugin_types_batch_drop_borrow(input);
    if (f.message) {
        err->kind = f.kind;
        err->message = (sink_string_t){(uint8_t *)f.message, strlen(f.message)};
        err->row.is_some = false;
        return false;
    }
    return true;
}
