/* filter_rows in C: the same transform (world `transform`) as plugins/filter_rows (Rust) and
 * plugins/python/filter_rows.py, built with wit-bindgen's C generator, clang and the WASI
 * preview-1 reactor adapter (tests/build_c.rs; wit/README.md shows the commands). It keeps the
 * rows whose column compares true against a literal. Config:
 * `{ "column": "status", "op": "eq", "value": "completed" }` with `op` one of eq, ne, gt, ge, lt,
 * le, in (`value` an array), is_null, not_null (no `value`); a null never compares true.
 * Literals by column type: utf8 a string (compared bytewise); int32/int64 an integer; float64 a
 * number; decimal128 a number or a string, compared exactly at the column's scale; boolean
 * true/false; timestamp an RFC 3339 string or integer microseconds; date a YYYY-MM-DD string or
 * integer days. The comparison is compiled once at `open` into typed literals; each batch pulls
 * the one column it tests with the batch resource's `column` method and answers with an edit
 * whose keep mask is a bitmap, so the other columns never leave the host. Errors are
 * `plugin-error` values with the Rust plugin's messages (unknown or missing config keys are
 * named, `config.colum: unknown key`, as the other languages' SDKs do). */

#include "transform.h"
#include "weir_c.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(WEIR_PLUGIN_TYPES_ERROR_KIND_INVALID_CONFIG == WEIR_INVALID_CONFIG, "error-kind");
_Static_assert(WEIR_PLUGIN_TYPES_ERROR_KIND_INVALID_INPUT == WEIR_INVALID_INPUT, "error-kind");
_Static_assert(WEIR_PLUGIN_TYPES_DATA_TYPE_DATE32 == WEIR_DATE32, "data-type");
_Static_assert(WEIR_PLUGIN_TYPES_DATA_TYPE_DECIMAL128 == WEIR_DECIMAL128, "data-type");

/* What `weir plugin inspect` shows and `weir validate` checks configs against: the Rust
 * plugin's metadata, in the custom section `weir:metadata`. */
WEIR_PLUGIN_METADATA({
    "name": "filter_rows",
    "version": "0.1.0",
    "description": "Keeps the rows whose column compares true with a literal (eq, ne, gt, ge, lt, le, in, is_null, not_null); the C example.",
    "config_schema": {
        "type": "object",
        "properties": {
            "column": {"type": "string", "minLength": 1},
            "op": {"enum": ["eq", "ne", "gt", "ge", "lt", "le", "in", "is_null", "not_null"]},
            "value": {"type": ["string", "number", "boolean", "array"]}
        },
        "required": ["column", "op"],
        "additionalProperties": false
    }
});

typedef enum { OP_EQ, OP_NE, OP_GT, OP_GE, OP_LT, OP_LE, OP_IN, OP_IS_NULL, OP_NOT_NULL } op_t;
static const char *const OP_NAMES[] = {"eq", "ne", "gt", "ge", "lt", "le", "in", "is_null",
                                       "not_null"};
#define OP_COUNT (sizeof OP_NAMES / sizeof OP_NAMES[0])

/* The literals' representation, chosen by the column's type at `open`. */
typedef enum { LIT_UTF8, LIT_INT, LIT_FLOAT, LIT_DECIMAL, LIT_BOOL } lit_kind;

/* The opened filter: one per component instance, as the host calls `open` once. */
static struct {
    char *column;
    size_t column_len;
    weir_plugin_types_data_type_t data_type;
    op_t op;
    lit_kind kind;
    size_t count; /* 1 for a comparison, the array's length for `in` */
    uint8_t **bytes;
    size_t *lens;
    int64_t *ints;
    double *floats;
    weir_i128 *decimals;
    bool *bools;
} filter;

static void filter_reset(void) {
    for (size_t i = 0; filter.bytes && i < filter.count; i++) {
        free(filter.bytes[i]);
    }
    free(filter.bytes);
    free(filter.lens);
    free(filter.ints);
    free(filter.floats);
    free(filter.decimals);
    free(filter.bools);
    free(filter.column);
    memset(&filter, 0, sizeof filter);
}

/* Fills `err` with `message` (malloc'd; the bindings free it after the call) and returns false. */
static bool fail(weir_plugin_types_plugin_error_t *err, uint8_t kind, char *message) {
    err->kind = kind;
    err->message.ptr = (uint8_t *)message;
    err->message.len = strlen(message);
    err->row.is_some = false;
    err->row.val = 0;
    return false;
}

static void put_type(weir_buf *b, const weir_plugin_types_data_type_t *t) {
    weir_buf_data_type(b, t->tag, t->val.decimal128.precision, t->val.decimal128.scale);
}

static bool same_type(const weir_plugin_types_data_type_t *a,
                      const weir_plugin_types_data_type_t *b) {
    if (a->tag != b->tag) {
        return false;
    }
    return a->tag != WEIR_DECIMAL128 ||
           (a->val.decimal128.precision == b->val.decimal128.precision &&
            a->val.decimal128.scale == b->val.decimal128.scale);
}

/* A literal as the Rust plugin's `Literal` displays it in messages. */
static void put_literal(weir_buf *b, const weir_json *v) {
    switch (v->kind) {
    case WEIR_JSON_BOOL: weir_buf_puts(b, v->boolean ? "true" : "false"); break;
    case WEIR_JSON_INT: weir_buf_printf(b, "%lld", (long long)v->integer); break;
    case WEIR_JSON_FLOAT: weir_buf_f64_display(b, v->number); break;
    case WEIR_JSON_STRING: weir_buf_debug_string(b, (const uint8_t *)v->str, v->len); break;
    case WEIR_JSON_ARRAY: weir_buf_printf(b, "an array of %zu", v->count); break;
    default: weir_buf_puts(b, "null"); break;
    }
}

/* serde's untagged `Literal`: a boolean, number, string or (nested) array, never null or an
 * object. */
static bool is_literal(const weir_json *v) {
    if (v->kind == WEIR_JSON_NULL || v->kind == WEIR_JSON_OBJECT) {
        return false;
    }
    for (size_t i = 0; v->kind == WEIR_JSON_ARRAY && i < v->count; i++) {
        if (!is_literal(&v->items[i])) {
            return false;
        }
    }
    return true;
}

/* Reads literal `v` into slot `i` of the filter's literals; NULL or the message. */
static char *convert(const weir_json *v, size_t i) {
    const weir_plugin_types_data_type_t *t = &filter.data_type;
    char *e = NULL;
    switch (t->tag) {
    case WEIR_UTF8:
        if (v->kind != WEIR_JSON_STRING) {
            goto mismatch;
        }
        filter.bytes[i] = weir_xmalloc(v->len);
        memcpy(filter.bytes[i], v->str, v->len);
        filter.lens[i] = v->len;
        return NULL;
    case WEIR_INT32:
    case WEIR_INT64:
        if (v->kind != WEIR_JSON_INT) {
            goto mismatch;
        }
        filter.ints[i] = v->integer;
        return NULL;
    case WEIR_FLOAT64:
        if (v->kind != WEIR_JSON_INT && v->kind != WEIR_JSON_FLOAT) {
            goto mismatch;
        }
        /* An integer literal is its nearest double, as in Rust (`i as f64`). */
        filter.floats[i] = v->kind == WEIR_JSON_INT ? (double)v->integer : v->number;
        return NULL;
    case WEIR_DECIMAL128: {
        /* A JSON number arrives as the nearest double; its shortest round-trip text is what
         * the author wrote (23.90 → "23.9"), which is then read exactly. */
        weir_buf text = {0};
        if (v->kind == WEIR_JSON_INT) {
            weir_buf_printf(&text, "%lld", (long long)v->integer);
        } else if (v->kind == WEIR_JSON_FLOAT) {
            weir_buf_f64_display(&text, v->number);
        } else if (v->kind == WEIR_JSON_STRING) {
            weir_buf_put(&text, v->str, v->len);
        } else {
            goto mismatch;
        }
        char *s = weir_buf_take(&text);
        e = weir_parse_decimal(s, t->val.decimal128.scale, &filter.decimals[i]);
        free(s);
        break;
    }
    case WEIR_BOOLEAN:
        if (v->kind != WEIR_JSON_BOOL) {
            goto mismatch;
        }
        filter.bools[i] = v->boolean;
        return NULL;
    case WEIR_TIMESTAMP_MICROS:
        if (v->kind == WEIR_JSON_INT) {
            filter.ints[i] = v->integer;
            return NULL;
        }
        if (v->kind != WEIR_JSON_STRING) {
            goto mismatch;
        }
        e = weir_parse_timestamp_micros(v->str, &filter.ints[i]);
        break;
    case WEIR_DATE32:
        if (v->kind == WEIR_JSON_INT) {
            filter.ints[i] = v->integer;
            return NULL;
        }
        if (v->kind != WEIR_JSON_STRING) {
            goto mismatch;
        } else {
            int32_t days = 0;
            e = weir_parse_date32(v->str, &days);
            filter.ints[i] = days;
        }
        break;
    default:
        goto mismatch;
    }
    if (e) {
        char *message = weir_format("filter_rows: column `%s`: %s", filter.column, e);
        free(e);
        return message;
    }
    return NULL;
mismatch: {
    weir_buf b = {0};
    weir_buf_puts(&b, "filter_rows: value ");
    put_literal(&b, v);
    weir_buf_printf(&b, " does not fit column `%s` of type ", filter.column);
    put_type(&b, t);
    return weir_buf_take(&b);
}
}

static void *zeroed(size_t count, size_t size) {
    void *p = weir_xmalloc(count * size);
    memset(p, 0, count * size);
    return p;
}

/* Compiles the comparison for the column's type (the Rust plugin's `compile`). */
static char *compile(const weir_json *value) {
    const char *op = OP_NAMES[filter.op];
    weir_buf b = {0};
    if (filter.op == OP_IS_NULL || filter.op == OP_NOT_NULL) {
        if (value) {
            weir_buf_printf(&b, "filter_rows: op `%s` takes no value, got ", op);
            put_literal(&b, value);
            return weir_buf_take(&b);
        }
        return NULL;
    }
    if (!value) {
        return weir_format("filter_rows: op `%s` needs a `value`", op);
    }
    const weir_json *literals = value;
    size_t count = 1;
    if (filter.op == OP_IN) {
        if (value->kind != WEIR_JSON_ARRAY) {
            weir_buf_puts(&b, "filter_rows: op `in` needs an array `value`, got ");
            put_literal(&b, value);
            return weir_buf_take(&b);
        }
        literals = value->items;
        count = value->count;
    } else if (value->kind == WEIR_JSON_ARRAY) {
        return weir_format("filter_rows: op `%s` needs a single `value`, got an array", op);
    }
    size_t slots = count ? count : 1;
    switch (filter.data_type.tag) {
    case WEIR_UTF8:
        filter.kind = LIT_UTF8;
        filter.bytes = zeroed(slots, sizeof *filter.bytes);
        filter.lens = zeroed(slots, sizeof *filter.lens);
        break;
    case WEIR_FLOAT64:
        filter.kind = LIT_FLOAT;
        filter.floats = zeroed(slots, sizeof *filter.floats);
        break;
    case WEIR_DECIMAL128:
        filter.kind = LIT_DECIMAL;
        filter.decimals = zeroed(slots, sizeof *filter.decimals);
        break;
    case WEIR_BOOLEAN:
        filter.kind = LIT_BOOL;
        filter.bools = zeroed(slots, sizeof *filter.bools);
        break;
    default: /* int32, int64, timestamp, date: int64 literals */
        filter.kind = LIT_INT;
        filter.ints = zeroed(slots, sizeof *filter.ints);
        break;
    }
    filter.count = count;
    for (size_t i = 0; i < count; i++) {
        char *e = convert(&literals[i], i);
        if (e) {
            return e;
        }
    }
    return NULL;
}

/* `open` once the config is parsed: NULL, or the error's kind in `*kind` and its message. */
static char *open_filter(const weir_json *config,
                         const exports_weir_plugin_transformer_list_field_t *schema,
                         uint8_t *kind) {
    static const char *const required[] = {"column", "op", NULL};
    static const char *const optional[] = {"value", NULL};
    *kind = WEIR_INVALID_CONFIG;
    char *e = weir_config_check(config, required, optional);
    if (e) {
        return e;
    }
    const weir_json *column = weir_json_get(config, "column");
    const weir_json *op = weir_json_get(config, "op");
    const weir_json *value = weir_json_get(config, "value");
    weir_buf b = {0};
    if (column->kind != WEIR_JSON_STRING) {
        weir_buf_puts(&b, "config.column: invalid type: ");
        weir_buf_json_unexpected(&b, column);
        weir_buf_puts(&b, ", expected a string");
        return weir_buf_take(&b);
    }
    size_t found = OP_COUNT;
    for (size_t i = 0; op->kind == WEIR_JSON_STRING && i < OP_COUNT; i++) {
        if (strlen(OP_NAMES[i]) == op->len && memcmp(OP_NAMES[i], op->str, op->len) == 0) {
            found = i;
        }
    }
    if (found == OP_COUNT) {
        if (op->kind == WEIR_JSON_STRING) {
            weir_buf_printf(&b, "config.op: unknown op `%s`", op->str);
        } else {
            weir_buf_puts(&b, "config.op: invalid type: ");
            weir_buf_json_unexpected(&b, op);
        }
        weir_buf_puts(&b, ", expected one of ");
        for (size_t i = 0; i < OP_COUNT; i++) {
            weir_buf_printf(&b, "%s%s", i ? ", " : "", OP_NAMES[i]);
        }
        return weir_buf_take(&b);
    }
    if (value && value->kind == WEIR_JSON_NULL) {
        value = NULL; /* `Option<Literal>`: null is no value */
    }
    if (value && !is_literal(value)) {
        return weir_format("config.value: data did not match any variant of untagged enum "
                           "Literal");
    }
    size_t index = schema->len;
    for (size_t i = 0; i < schema->len; i++) {
        const transform_string_t *name = &schema->ptr[i].name;
        if (name->len == column->len && memcmp(name->ptr, column->str, column->len) == 0) {
            index = i;
            break;
        }
    }
    if (index == schema->len) {
        *kind = WEIR_INVALID_INPUT;
        return weir_format("filter_rows: the input has no column `%s`", column->str);
    }
    filter.column = weir_xmalloc(column->len + 1);
    memcpy(filter.column, column->str, column->len + 1);
    filter.column_len = column->len;
    filter.data_type = schema->ptr[index].data_type;
    filter.op = (op_t)found;
    return compile(value);
}

bool exports_weir_plugin_transformer_open(
    transform_string_t *config, exports_weir_plugin_transformer_list_field_t *input_schema,
    exports_weir_plugin_transformer_list_field_t *ret,
    exports_weir_plugin_transformer_plugin_error_t *err) {
    filter_reset();
    char *e = NULL;
    uint8_t kind = WEIR_INVALID_CONFIG;
    weir_json *json = weir_json_parse((const char *)config->ptr, config->len, &e);
    transform_string_free(config);
    if (json) {
        e = open_filter(json, input_schema, &kind);
        weir_json_free(json);
    }
    if (e) {
        filter_reset();
        exports_weir_plugin_transformer_list_field_free(input_schema);
        return fail(err, kind, e);
    }
    /* The output schema is the input's: hand the list we own back (the bindings free it). */
    *ret = *input_schema;
    return true;
}

/* ---- the per-batch loops --------------------------------------------------------------------- */

/* Packs KEEP (an expression of row `i`) for rows 0..rows into `bits`, eight rows a byte. */
#define PACK(bits, rows, KEEP)                                                                   \
    do {                                                                                         \
        for (size_t base_ = 0; base_ < (rows); base_ += 8) {                                     \
            size_t n_ = (rows) - base_ < 8 ? (rows) - base_ : 8;                                 \
            uint8_t byte_ = 0;                                                                   \
            for (size_t bit_ = 0; bit_ < n_; bit_++) {                                           \
                size_t i = base_ + bit_;                                                         \
                byte_ |= (uint8_t)((KEEP) ? 1u : 0u) << bit_;                                    \
            }                                                                                    \
            (bits)[base_ >> 3] = byte_;                                                          \
        }                                                                                        \
    } while (0)

/* One loop per comparison, chosen outside the loop, with `X` the value of row `i`. */
#define COMPARE(bits, rows, X, LIT)                                                              \
    do {                                                                                         \
        switch (filter.op) {                                                                     \
        case OP_EQ: PACK(bits, rows, (X) == (LIT)); break;                                       \
        case OP_NE: PACK(bits, rows, (X) != (LIT)); break;                                       \
        case OP_GT: PACK(bits, rows, (X) > (LIT)); break;                                        \
        case OP_GE: PACK(bits, rows, (X) >= (LIT)); break;                                       \
        case OP_LT: PACK(bits, rows, (X) < (LIT)); break;                                        \
        case OP_LE: PACK(bits, rows, (X) <= (LIT)); break;                                       \
        default: break;                                                                          \
        }                                                                                        \
    } while (0)

static bool int_in(int64_t x) {
    for (size_t k = 0; k < filter.count; k++) {
        if (filter.ints[k] == x) {
            return true;
        }
    }
    return false;
}

static bool float_in(double x) {
    for (size_t k = 0; k < filter.count; k++) {
        if (filter.floats[k] == x) {
            return true;
        }
    }
    return false;
}

static bool decimal_in(weir_i128 x) {
    for (size_t k = 0; k < filter.count; k++) {
        if (filter.decimals[k] == x) {
            return true;
        }
    }
    return false;
}

static bool bool_in(bool x) {
    for (size_t k = 0; k < filter.count; k++) {
        if (filter.bools[k] == x) {
            return true;
        }
    }
    return false;
}

/* String `i`: offsets from the host are ascending and inside `data` (Arrow's invariant); a
 * broken pair reads as an empty string, as in Rust. */
static inline const uint8_t *utf8_at(const weir_plugin_types_utf8_values_t *v, size_t i,
                                     size_t *len) {
    int32_t start = v->offsets.ptr[i], end = v->offsets.ptr[i + 1];
    if (start < 0 || end < start || (size_t)end > v->data.len) {
        *len = 0;
        return v->data.ptr;
    }
    *len = (size_t)(end - start);
    return v->data.ptr + start;
}

/* Bytewise order of string `i` against literal `k`: <0, 0, >0. */
static inline int utf8_cmp(const weir_plugin_types_utf8_values_t *v, size_t i, size_t k) {
    size_t len;
    const uint8_t *s = utf8_at(v, i, &len);
    size_t lit_len = filter.lens[k];
    size_t n = len < lit_len ? len : lit_len;
    int c = n ? memcmp(s, filter.bytes[k], n) : 0;
    if (c != 0) {
        return c;
    }
    return len < lit_len ? -1 : len > lit_len ? 1 : 0;
}

/* Equality of string `i` and literal `k`, deciding most rows by their length alone. */
static inline bool utf8_eq(const weir_plugin_types_utf8_values_t *v, size_t i, size_t k) {
    int64_t len = (int64_t)v->offsets.ptr[i + 1] - (int64_t)v->offsets.ptr[i];
    if (len != (int64_t)filter.lens[k]) {
        return false;
    }
    size_t n;
    const uint8_t *s = utf8_at(v, i, &n);
    return n == filter.lens[k] && (n == 0 || memcmp(s, filter.bytes[k], n) == 0);
}

static bool utf8_in(const weir_plugin_types_utf8_values_t *v, size_t i) {
    for (size_t k = 0; k < filter.count; k++) {
        if (utf8_eq(v, i, k)) {
            return true;
        }
    }
    return false;
}

/* The mask of the compared values (before nulls are cleared), or false when the column's values
 * do not have the layout of its type (or fewer values than rows). */
static bool compare_values(const weir_plugin_types_column_values_t *values, size_t rows,
                           uint8_t *bits) {
    bool in = filter.op == OP_IN;
    switch (filter.kind) {
    case LIT_UTF8: {
        if (values->tag != WEIR_PLUGIN_TYPES_COLUMN_VALUES_UTF8) {
            return false;
        }
        const weir_plugin_types_utf8_values_t *v = &values->val.utf8;
        if (rows > 0 && v->offsets.len <= rows) {
            return false;
        }
        switch (filter.op) {
        case OP_EQ: PACK(bits, rows, utf8_eq(v, i, 0)); break;
        case OP_NE: PACK(bits, rows, !utf8_eq(v, i, 0)); break;
        case OP_GT: PACK(bits, rows, utf8_cmp(v, i, 0) > 0); break;
        case OP_GE: PACK(bits, rows, utf8_cmp(v, i, 0) >= 0); break;
        case OP_LT: PACK(bits, rows, utf8_cmp(v, i, 0) < 0); break;
        case OP_LE: PACK(bits, rows, utf8_cmp(v, i, 0) <= 0); break;
        default: PACK(bits, rows, utf8_in(v, i)); break;
        }
        return true;
    }
    case LIT_INT: {
        int64_t lit = filter.count ? filter.ints[0] : 0;
        switch (values->tag) {
        case WEIR_PLUGIN_TYPES_COLUMN_VALUES_INT64:
        case WEIR_PLUGIN_TYPES_COLUMN_VALUES_TIMESTAMP_MICROS: {
            const int64_t *x = values->val.int64.ptr;
            if (values->val.int64.len < rows) {
                return false;
            }
            if (in) {
                PACK(bits, rows, int_in(x[i]));
            } else {
                COMPARE(bits, rows, x[i], lit);
            }
            return true;
        }
        case WEIR_PLUGIN_TYPES_COLUMN_VALUES_INT32:
        case WEIR_PLUGIN_TYPES_COLUMN_VALUES_DATE32: {
            const int32_t *x = values->val.int32.ptr;
            if (values->val.int32.len < rows) {
                return false;
            }
            if (in) {
                PACK(bits, rows, int_in(x[i]));
            } else if (lit >= INT32_MIN && lit <= INT32_MAX) {
                int32_t lit32 = (int32_t)lit;
                COMPARE(bits, rows, x[i], lit32);
            } else {
                COMPARE(bits, rows, (int64_t)x[i], lit);
            }
            return true;
        }
        default:
            return false;
        }
    }
    case LIT_FLOAT: {
        if (values->tag != WEIR_PLUGIN_TYPES_COLUMN_VALUES_FLOAT64 ||
            values->val.float64.len < rows) {
            return false;
        }
        const double *x = values->val.float64.ptr;
        if (in) {
            PACK(bits, rows, float_in(x[i]));
        } else {
            double lit = filter.floats[0];
            COMPARE(bits, rows, x[i], lit);
        }
        return true;
    }
    case LIT_DECIMAL: {
        if (values->tag != WEIR_PLUGIN_TYPES_COLUMN_VALUES_DECIMAL128 ||
            values->val.decimal128.len / 16 < rows) {
            return false;
        }
        const uint8_t *x = values->val.decimal128.ptr;
        if (in) {
            PACK(bits, rows, decimal_in(weir_decimal_at(x, i)));
        } else {
            weir_i128 lit = filter.decimals[0];
            COMPARE(bits, rows, weir_decimal_at(x, i), lit);
        }
        return true;
    }
    case LIT_BOOL: {
        if (values->tag != WEIR_PLUGIN_TYPES_COLUMN_VALUES_BOOLEAN ||
            values->val.boolean.len < weir_bitmap_bytes(rows)) {
            return false;
        }
        const uint8_t *x = values->val.boolean.ptr;
        if (in) {
            PACK(bits, rows, bool_in(weir_bit(x, i)));
        } else {
            bool lit = filter.bools[0];
            COMPARE(bits, rows, weir_bit(x, i), lit);
        }
        return true;
    }
    }
    return false;
}

/* The keep mask of one batch's column: NULL with `*e` set on an error. */
static uint8_t *mask_of(const weir_plugin_types_column_t *column, size_t rows, char **e) {
    const uint8_t *validity = NULL;
    if (column->validity.is_some) {
        if (column->validity.val.len < weir_bitmap_bytes(rows)) {
            *e = weir_format("filter_rows: column `%s` has a validity bitmap shorter than its "
                             "%zu rows",
                             filter.column, rows);
            return NULL;
        }
        validity = column->validity.val.ptr;
    }
    size_t nbytes = weir_bitmap_bytes(rows);
    if (filter.op == OP_IS_NULL) {
        uint8_t *bits = weir_bitmap_new(rows, validity != NULL);
        for (size_t i = 0; validity && i < nbytes; i++) {
            bits[i] &= (uint8_t)~validity[i];
        }
        return bits;
    }
    if (filter.op == OP_NOT_NULL) {
        uint8_t *bits = weir_bitmap_new(rows, true);
        if (validity) {
            weir_bitmap_and(bits, validity, rows);
        }
        return bits;
    }
    uint8_t *bits = weir_bitmap_new(rows, false);
    if (!compare_values(&column->values, rows, bits)) {
        free(bits);
        weir_buf b = {0};
        weir_buf_printf(&b, "filter_rows: column `%s` holds values that do not match its type ",
                        filter.column);
        put_type(&b, &column->data_type);
        *e = weir_buf_take(&b);
        return NULL;
    }
    /* A null never compares true: clear its bit, a byte at a time. */
    if (validity) {
        weir_bitmap_and(bits, validity, rows);
    }
    return bits;
}

/* One batch: NULL with the mask in `*bits`, or the message of an invalid-input error. */
static char *process_batch(weir_plugin_types_borrow_batch_t batch, uint8_t **bits,
                           size_t *nbytes) {
    weir_plugin_types_list_field_t schema;
    weir_plugin_types_method_batch_schema(batch, &schema);
    size_t index = schema.len;
    for (size_t i = 0; i < schema.len; i++) {
        if (schema.ptr[i].name.len == filter.column_len &&
            memcmp(schema.ptr[i].name.ptr, filter.column, filter.column_len) == 0) {
            index = i;
            break;
        }
    }
    if (index == schema.len) {
        weir_buf b = {0};
        weir_buf_printf(&b, "the batch has no column `%s` (columns: ", filter.column);
        for (size_t i = 0; i < schema.len; i++) {
            if (i) {
                weir_buf_puts(&b, ", ");
            }
            weir_buf_put(&b, schema.ptr[i].name.ptr, schema.ptr[i].name.len);
        }
        weir_buf_putc(&b, ')');
        weir_plugin_types_list_field_free(&schema);
        return weir_buf_take(&b);
    }
    weir_plugin_types_list_field_free(&schema);

    size_t rows = weir_plugin_types_method_batch_num_rows(batch);
    weir_plugin_types_column_t column;
    weir_plugin_types_method_batch_column(batch, (uint32_t)index, &column);
    char *e = NULL;
    if (!same_type(&column.data_type, &filter.data_type)) {
        weir_buf b = {0};
        weir_buf_printf(&b, "filter_rows: column `%s` is ", filter.column);
        put_type(&b, &column.data_type);
        weir_buf_puts(&b, ", it was ");
        put_type(&b, &filter.data_type);
        weir_buf_puts(&b, " when the plugin opened");
        e = weir_buf_take(&b);
    } else {
        *bits = mask_of(&column, rows, &e);
        *nbytes = weir_bitmap_bytes(rows);
    }
    weir_plugin_types_column_free(&column);
    return e;
}

bool exports_weir_plugin_transformer_process(
    exports_weir_plugin_transformer_batch_info_t *info,
    exports_weir_plugin_transformer_borrow_batch_t input,
    exports_weir_plugin_transformer_transform_output_t *ret,
    exports_weir_plugin_transformer_plugin_error_t *err) {
    exports_weir_plugin_transformer_batch_info_free(info);
    uint8_t *bits = NULL;
    size_t nbytes = 0;
    char *e = filter.column ? process_batch(input, &bits, &nbytes)
                            : weir_format("filter_rows: `process` before `open`");
    /* A borrow handed to an export is the callee's to drop (the bindings do not autodrop). */
    weir_plugin_types_batch_drop_borrow(input);
    if (e) {
        return fail(err, WEIR_INVALID_INPUT, e);
    }
    memset(ret, 0, sizeof *ret);
    ret->tag = WEIR_PLUGIN_TYPES_TRANSFORM_OUTPUT_EDIT;
    ret->val.edit.keep.is_some = true;
    ret->val.edit.keep.val.tag = WEIR_PLUGIN_TYPES_SELECTION_MASK;
    ret->val.edit.keep.val.val.mask.ptr = bits;
    ret->val.edit.keep.val.val.mask.len = nbytes;
    return true;
}
