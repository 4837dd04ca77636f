/* The world-independent half of Weir's C plugins: everything `filter_rows.c` and
 * `jsonl_sink.c` share that does not touch the generated bindings, in plain C types, so that one
 * `weir_c.c` links into a component of any world (each world's bindings have their own header,
 * `transform.h`, `sink.h`, ..., with differently named list types). It holds a growable byte
 * buffer and formatted messages, a strict JSON parser for `config` with the key checks of the
 * Rust SDK's `deny_unknown_fields`, bitmaps, and the text forms of `plugin-sdk/src/text.rs` and
 * of Rust's float formatting (timestamps, dates, exact decimals, shortest round-trip floats), so
 * that a C plugin reads literals and writes output byte for byte as the Rust plugins do. Errors
 * are returned as malloc'd messages, which a plugin hands to the host as its `plugin-error`
 * message (the bindings' post-return code frees them). */

#ifndef WEIR_C_H
#define WEIR_C_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* `plugin-error` kinds, numbered as `error-kind` in wit/weir.wit (the plugins check that the
 * generated constants agree). */
enum {
    WEIR_FATAL = 0,
    WEIR_RETRYABLE = 1,
    WEIR_INVALID_CONFIG = 2,
    WEIR_INVALID_INPUT = 3,
};

/* `data-type` tags, numbered as in wit/weir.wit. */
enum {
    WEIR_BOOLEAN = 0,
    WEIR_INT32 = 1,
    WEIR_INT64 = 2,
    WEIR_FLOAT64 = 3,
    WEIR_DECIMAL128 = 4,
    WEIR_UTF8 = 5,
    WEIR_TIMESTAMP_MICROS = 6,
    WEIR_DATE32 = 7,
};

/* Puts the JSON given as the argument into the custom section `weir:metadata` (what the Rust
 * SDK's `plugin_metadata!` does): the plugin's name, version, description and a JSON Schema of
 * its config, which `weir plugin inspect` shows and `weir validate` checks configs against. The
 * JSON is written as C tokens, stringified unexpanded (so `false` stays `false`), then quoted
 * again for the assembler's `.ascii` (clang 14 turns a `section` attribute into a data segment,
 * not a custom section). */
#define WEIR_PLUGIN_METADATA(...) WEIR_METADATA_ASM(#__VA_ARGS__)
#define WEIR_STR(x) #x
#define WEIR_METADATA_ASM(json)                                                                 \
    __asm__(".section \".custom_section.weir:metadata\",\"\",@\n.ascii " WEIR_STR(json) "\n.text\n")

/* Arrow's decimal128 (clang supports 128-bit integers on wasm32). */
typedef __int128 weir_i128;

/* Aborts (a trap, which the host reports) when memory runs out: there is nothing better to do
 * inside a plugin call. */
void *weir_xmalloc(size_t size);
void *weir_xrealloc(void *ptr, size_t size);

/* ---- growable byte buffer -------------------------------------------------------------------- */

typedef struct {
    uint8_t *ptr;
    size_t len;
    size_t cap;
} weir_buf;

void weir_buf_reserve(weir_buf *b, size_t extra);
void weir_buf_put(weir_buf *b, const void *bytes, size_t len);
void weir_buf_puts(weir_buf *b, const char *s);
void weir_buf_putc(weir_buf *b, char c);
void weir_buf_printf(weir_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void weir_buf_vprintf(weir_buf *b, const char *fmt, va_list args);
/* NUL-terminates the contents and hands them over (the buffer is left empty). */
char *weir_buf_take(weir_buf *b);
void weir_buf_free(weir_buf *b);

/* A signed integer in decimal, without printf (the sink writes millions). */
void weir_buf_i64(weir_buf *b, int64_t v);

/* A malloc'd formatted string. */
char *weir_format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- text forms (plugin-sdk/src/text.rs, Rust's float and string formatting) ---------------- */

/* `"..."` as serde_json writes a string: `"`, `\`, and control characters escaped. */
void weir_buf_json_string(weir_buf *b, const uint8_t *bytes, size_t len);
/* `"..."` as Rust's `{:?}` writes a string (for messages that quote a value as Rust does). */
void weir_buf_debug_string(weir_buf *b, const uint8_t *bytes, size_t len);
/* Rust's `{:?}` of a finite f64 (`1.0`, `0.1`, `1e16`, `1.5e-5`): the shortest text that reads
 * back as the same double, which is also what serde_json and the Rust sink write. */
void weir_buf_f64_debug(weir_buf *b, double x);
/* Rust's `{}` of a finite f64 (`1`, `0.1`, `10000000000000000`): shortest digits, no exponent. */
void weir_buf_f64_display(weir_buf *b, double x);
/* `DecimalText`: an unscaled decimal at `scale`, exactly (`2390` at 2 is `23.90`). */
void weir_buf_decimal(weir_buf *b, weir_i128 unscaled, int8_t scale);
/* `TimestampMicrosText`: RFC 3339 UTC with `Z` and 0, 3 or 6 fractional digits. */
void weir_buf_timestamp_micros(weir_buf *b, int64_t micros);
/* `Date32Text`: `YYYY-MM-DD`. */
void weir_buf_date32(weir_buf *b, int32_t days);

/* The parsers return NULL on success, else the message of `TextError` (malloc'd). `text` is
 * NUL-terminated. */
char *weir_parse_decimal(const char *text, int8_t scale, weir_i128 *out);
char *weir_parse_date32(const char *text, int32_t *out);
char *weir_parse_timestamp_micros(const char *text, int64_t *out);

/* Reads a 16-byte little-endian decimal128 value. */
weir_i128 weir_decimal_at(const uint8_t *bytes, size_t index);

/* `utf8`, `int64`, `decimal128(12, 2)`, ... as the Rust SDK's `DataType` displays them. */
void weir_buf_data_type(weir_buf *b, uint8_t tag, uint8_t precision, int8_t scale);

/* ---- bitmaps (least significant bit first, Arrow's layout) ---------------------------------- */

static inline bool weir_bit(const uint8_t *bits, size_t i) {
    return (bits[i >> 3] >> (i & 7)) & 1;
}
static inline size_t weir_bitmap_bytes(size_t rows) {
    return (rows + 7) / 8;
}
/* A malloc'd bitmap of `rows` bits, all clear or all set (bits past `rows` clear). NULL when
 * `rows` is 0, which the bindings read as an empty list. */
uint8_t *weir_bitmap_new(size_t rows, bool set);
/* `bits &= other` over `weir_bitmap_bytes(rows)` bytes. */
void weir_bitmap_and(uint8_t *bits, const uint8_t *other, size_t rows);

/* ---- JSON (the plugin's `config`) ------------------------------------------------------------ */

typedef enum {
    WEIR_JSON_NULL,
    WEIR_JSON_BOOL,
    /* An integer that fits int64 (serde_json's u64/i64 that a Rust `i64` accepts). */
    WEIR_JSON_INT,
    /* Any other number (a fraction, an exponent, `-0`, an integer out of int64's range). */
    WEIR_JSON_FLOAT,
    WEIR_JSON_STRING,
    WEIR_JSON_ARRAY,
    WEIR_JSON_OBJECT,
} weir_json_kind;

typedef struct weir_json weir_json;
struct weir_json {
    weir_json_kind kind;
    bool boolean;
    int64_t integer;
    double number;
    /* A string's UTF-8 bytes, NUL-terminated (a `\u0000` inside counts in `len`). */
    char *str;
    size_t len;
    /* Array items, or object values in document order. */
    weir_json *items;
    size_t count;
    /* Object keys, parallel to `items`. */
    weir_json *keys;
};

/* Parses `len` bytes of JSON; an empty (or all-blank) text reads as `{}`, as the Rust SDK's
 * `parse_config` does. Returns NULL and sets `*error` (malloc'd, `config: ...`) on failure. */
weir_json *weir_json_parse(const char *text, size_t len, char **error);
void weir_json_free(weir_json *value);
/* The value of `key` in an object, or NULL. */
const weir_json *weir_json_get(const weir_json *object, const char *key);
/* serde's description of an unexpected value, for `invalid type` messages: `integer \`3\``,
 * `string "x"`, `sequence`, `map`, ... */
void weir_buf_json_unexpected(weir_buf *b, const weir_json *value);
/* Checks that `config` is an object whose keys are among `required` and `optional` (each a
 * NULL-terminated list) and that holds every `required` key. Returns NULL or the message naming
 * every offending key: `config.colum: unknown key; config.column: missing` (malloc'd). */
char *weir_config_check(const weir_json *config, const char *const *required,
                        const char *const *optional);

#endif
