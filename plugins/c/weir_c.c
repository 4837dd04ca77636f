/* The world-independent half of Weir's C plugins (see weir_c.h): a byte buffer, a strict JSON
 * parser for `config` with the Rust SDK's key checks, bitmaps, and C ports of
 * `plugin-sdk/src/text.rs` (timestamps, dates, exact decimals) and of Rust's shortest
 * round-trip float formatting, so that the C plugins read and write text byte for byte as the
 * Rust ones do. It includes no world header, so it links into a component of any world. */

#include "weir_c.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- memory ---------------------------------------------------------------------------------- */

void *weir_xmalloc(size_t size) {
    void *p = malloc(size ? size : 1);
    if (!p) {
        abort();
    }
    return p;
}

void *weir_xrealloc(void *ptr, size_t size) {
    void *p = realloc(ptr, size ? size : 1);
    if (!p) {
        abort();
    }
    return p;
}

/* ---- buffer ---------------------------------------------------------------------------------- */

void weir_buf_reserve(weir_buf *b, size_t extra) {
    if (b->cap - b->len >= extra) {
        return;
    }
    size_t cap = b->cap ? b->cap : 64;
    while (cap - b->len < extra) {
        cap *= 2;
    }
    b->ptr = weir_xrealloc(b->ptr, cap);
    b->cap = cap;
}

void weir_buf_put(weir_buf *b, const void *bytes, size_t len) {
    if (len == 0) {
        return;
    }
    weir_buf_reserve(b, len);
    memcpy(b->ptr + b->len, bytes, len);
    b->len += len;
}

void weir_buf_puts(weir_buf *b, const char *s) {
    weir_buf_put(b, s, strlen(s));
}

void weir_buf_putc(weir_buf *b, char c) {
    weir_buf_reserve(b, 1);
    b->ptr[b->len++] = (uint8_t)c;
}

void weir_buf_vprintf(weir_buf *b, const char *fmt, va_list args) {
    va_list again;
    va_copy(again, args);
    int n = vsnprintf(NULL, 0, fmt, args);
    if (n < 0) {
        va_end(again);
        abort();
    }
    weir_buf_reserve(b, (size_t)n + 1);
    vsnprintf((char *)b->ptr + b->len, (size_t)n + 1, fmt, again);
    va_end(again);
    b->len += (size_t)n;
}

void weir_buf_printf(weir_buf *b, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    weir_buf_vprintf(b, fmt, args);
    va_end(args);
}

char *weir_buf_take(weir_buf *b) {
    weir_buf_reserve(b, 1);
    b->ptr[b->len] = 0;
    char *s = (char *)b->ptr;
    b->ptr = NULL;
    b->len = b->cap = 0;
    return s;
}

void weir_buf_free(weir_buf *b) {
    free(b->ptr);
    b->ptr = NULL;
    b->len = b->cap = 0;
}

void weir_buf_i64(weir_buf *b, int64_t v) {
    char tmp[24];
    size_t n = 0;
    uint64_t abs = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[sizeof tmp - 1 - n++] = (char)('0' + abs % 10);
        abs /= 10;
    } while (abs);
    if (v < 0) {
        tmp[sizeof tmp - 1 - n++] = '-';
    }
    weir_buf_put(b, tmp + sizeof tmp - n, n);
}

/* `value` as exactly `width` zero-padded digits (0 <= value < 10^width). */
static void put_digits(weir_buf *b, int64_t value, int width) {
    char tmp[8];
    for (int i = width - 1; i >= 0; i--) {
        tmp[i] = (char)('0' + value % 10);
        value /= 10;
    }
    weir_buf_put(b, tmp, (size_t)width);
}

char *weir_format(const char *fmt, ...) {
    weir_buf b = {0};
    va_list args;
    va_start(args, fmt);
    weir_buf_vprintf(&b, fmt, args);
    va_end(args);
    return weir_buf_take(&b);
}

/* ---- strings --------------------------------------------------------------------------------- */

void weir_buf_json_string(weir_buf *b, const uint8_t *bytes, size_t len) {
    static const char hex[] = "0123456789abcdef";
    weir_buf_reserve(b, len + 2);
    weir_buf_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        uint8_t c = bytes[i];
        const char *escape;
        switch (c) {
        case '"': escape = "\\\""; break;
        case '\\': escape = "\\\\"; break;
        case '\n': escape = "\\n"; break;
        case '\r': escape = "\\r"; break;
        case '\t': escape = "\\t"; break;
        case 0x08: escape = "\\b"; break;
        case 0x0c: escape = "\\f"; break;
        default:
            if (c >= 0x20) {
                continue;
            }
            escape = NULL;
        }
        weir_buf_put(b, bytes + run, i - run);
        if (escape) {
            weir_buf_puts(b, escape);
        } else {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            weir_buf_put(b, u, sizeof u);
        }
        run = i + 1;
    }
    weir_buf_put(b, bytes + run, len - run);
    weir_buf_putc(b, '"');
}

void weir_buf_debug_string(weir_buf *b, const uint8_t *bytes, size_t len) {
    weir_buf_putc(b, '"');
    for (size_t i = 0; i < len; i++) {
        uint8_t c = bytes[i];
        switch (c) {
        case '"': weir_buf_puts(b, "\\\""); break;
        case '\\': weir_buf_puts(b, "\\\\"); break;
        case '\n': weir_buf_puts(b, "\\n"); break;
        case '\r': weir_buf_puts(b, "\\r"); break;
        case '\t': weir_buf_puts(b, "\\t"); break;
        case 0: weir_buf_puts(b, "\\0"); break;
        default:
            if (c < 0x20 || c == 0x7f) {
                weir_buf_printf(b, "\\u{%x}", c);
            } else {
                weir_buf_putc(b, (char)c);
            }
        }
    }
    weir_buf_putc(b, '"');
}

/* ---- floats ---------------------------------------------------------------------------------- */

/* Splits `%.Ne` output ("1.2345e+02") into its digits and decimal exponent. */
static size_t split_exp(const char *text, char *digits, int *exp10) {
    size_t n = 0;
    const char *p = text;
    for (; *p && *p != 'e'; p++) {
        if (*p >= '0' && *p <= '9') {
            digits[n++] = *p;
        }
    }
    *exp10 = *p == 'e' ? (int)strtol(p + 1, NULL, 10) : 0;
    return n;
}

/* Drops leading zeros (adjusting the exponent) and trailing zeros; returns the new count. */
static size_t normalize_digits(char *digits, size_t n, int *exp10) {
    size_t lead = 0;
    while (lead < n && digits[lead] == '0') {
        lead++;
    }
    if (lead) {
        memmove(digits, digits + lead, n - lead);
        n -= lead;
        *exp10 -= (int)lead;
    }
    while (n > 1 && digits[n - 1] == '0') {
        n--;
    }
    return n;
}

static bool reads_back(const char *digits, size_t n, int exp10, double x) {
    char text[48];
    size_t k = 0;
    text[k++] = digits[0];
    if (n > 1) {
        text[k++] = '.';
        memcpy(text + k, digits + 1, n - 1);
        k += n - 1;
    }
    snprintf(text + k, sizeof text - k, "e%d", exp10);
    return strtod(text, NULL) == x;
}

/* Adds one in the last place of `n` digits (carrying; 999 becomes 1 with the exponent one up);
 * returns the normalised count. */
static size_t round_up_last(char *digits, size_t n, int *exp10) {
    size_t i = n;
    while (i > 0 && digits[i - 1] == '9') {
        digits[--i] = '0';
    }
    if (i == 0) {
        digits[0] = '1';
        ++*exp10;
    } else {
        digits[i - 1]++;
    }
    return normalize_digits(digits, n, exp10);
}

/* Whether x's exact decimal expansion is `lower` (its first `digits` significant digits) then a
 * final 5: a tie that rounding to `digits` digits broke downwards. (A double's expansion has at
 * most 767 significant digits.) */
static bool tie_below(double x, const char *lower, int digits) {
    char text[48];
    snprintf(text, sizeof text, "%.*e", digits, x);
    char *e = strchr(text, 'e');
    if (!e || e[-1] != '5') {
        return false;
    }
    static char exact[820];
    snprintf(exact, sizeof exact, "%.780e", x);
    size_t at = 0, seen = 0;
    for (; exact[at] && exact[at] != 'e'; at++) {
        if (exact[at] < '0' || exact[at] > '9') {
            continue;
        }
        if (seen < (size_t)digits) {
            if (exact[at] != lower[seen]) {
                return false;
            }
        } else if (seen == (size_t)digits) {
            if (exact[at] != '5') {
                return false;
            }
        } else if (seen > (size_t)digits && exact[at] != '0') {
            return false;
        }
        seen++;
    }
    return true;
}

/* The fast path of `f64_shortest`, for the doubles of everyday data (prices, measurements,
 * integers): x == m / 10^k for the smallest k in 0..22 with an integer m of at most 15 digits.
 * Such an m is exact in a double and so is 10^k, and IEEE division rounds correctly, so the test
 * is exactly "the text m e-k reads back as x". At most one decimal of 15 digits or fewer at each
 * scale reads back as a given double (they are 1e-15 apart relatively, and a double's rounding
 * interval is narrower), and the smallest k gives the fewest digits, so m is also what Rust's
 * shortest formatting finds. Returns 0 when x is not such a number. */
static size_t f64_shortest_small(double x, char digits[24], int *exp10) {
    static const double powers[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                    1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                    1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    if (x >= 1e15) {
        return 0;
    }
    for (int k = 0; k <= 22; k++) {
        double y = x * powers[k];
        if (y >= 1e15) {
            return 0;
        }
        if (y < 0.5) {
            continue;
        }
        int64_t m = (int64_t)(y + 0.5);
        if ((double)m / powers[k] != x) {
            continue;
        }
        char tmp[24];
        size_t n = 0;
        for (int64_t v = m; v; v /= 10) {
            tmp[n++] = (char)('0' + v % 10);
        }
        for (size_t i = 0; i < n; i++) {
            digits[i] = tmp[n - 1 - i];
        }
        *exp10 = (int)n - 1 - k;
        return normalize_digits(digits, n, exp10);
    }
    return 0;
}

/* The shortest digits d1 d2 ... dn (d1 != 0) with x == d1.d2...dn × 10^exp10 once read back,
 * the closest to x among the shortest: what Rust's (Grisu/Dragon) shortest formatting finds.
 * `x` is finite and positive. */
static size_t f64_shortest(double x, char digits[24], int *exp10) {
    size_t small = f64_shortest_small(x, digits, exp10);
    if (small) {
        return small;
    }
    char text[48];
    /* Whether the nearest decimal of p+1 digits reads back is monotonic in p where x's rounding
     * interval is symmetric, i.e. everywhere but at powers of two: search it by halves there. */
    int first = 0;
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & ((UINT64_C(1) << 52) - 1)) != 0) {
        int last = 16;
        while (first < last) {
            int mid = (first + last) / 2;
            snprintf(text, sizeof text, "%.*e", mid, x);
            if (strtod(text, NULL) == x) {
                last = mid;
            } else {
                first = mid + 1;
            }
        }
    }
    for (int precision = first; precision <= 16; precision++) {
        snprintf(text, sizeof text, "%.*e", precision, x);
        size_t n = split_exp(text, digits, exp10);
        double back = strtod(text, NULL);
        if (back == x) {
            /* At an exact tie printf rounds to even, and Rust rounds up: when x is exactly
             * halfway between this candidate (rounded down to an even digit) and the next one
             * up, and that one reads back as x too, it is Rust's. */
            if ((digits[n - 1] - '0') % 2 == 0 && tie_below(x, digits, precision + 1)) {
                char up[24];
                memcpy(up, digits, n);
                int up_exp = *exp10;
                size_t up_n = round_up_last(up, n, &up_exp);
                if (reads_back(up, up_n, up_exp, x)) {
                    memcpy(digits, up, up_n);
                    *exp10 = up_exp;
                    return up_n;
                }
            }
            return normalize_digits(digits, n, exp10);
        }
        /* The nearest decimal of this length reads back as a neighbour of x; at a power of two
         * (where x's rounding interval is lopsided) the one on x's other side may still read
         * back as x. */
        char alt[24];
        memcpy(alt, digits, n);
        int alt_exp = *exp10;
        size_t alt_n = n;
        if (back < x) {
            alt_n = round_up_last(alt, n, &alt_exp);
        } else {
            size_t i = n;
            while (i > 0 && alt[i - 1] == '0') {
                alt[--i] = '9';
            }
            if (i == 0) {
                continue;
            }
            alt[i - 1]--;
            if (alt[0] == '0') {
                if (n == 1) {
                    continue;
                }
                memmove(alt, alt + 1, n - 1);
                alt_n = n - 1;
                alt_exp--;
            }
        }
        alt_n = normalize_digits(alt, alt_n, &alt_exp);
        if (reads_back(alt, alt_n, alt_exp, x)) {
            memcpy(digits, alt, alt_n);
            return alt_n;
        }
    }
    snprintf(text, sizeof text, "%.16e", x);
    size_t n = split_exp(text, digits, exp10);
    return normalize_digits(digits, n, exp10);
}

/* Positional notation of the shortest digits, with at least `min_frac` fractional digits. */
static void f64_positional(weir_buf *b, const char *digits, size_t n, int exp10, int min_frac) {
    long point = (long)exp10 + 1; /* digits before the decimal point */
    if (point <= 0) {
        weir_buf_puts(b, "0.");
        for (long i = 0; i < -point; i++) {
            weir_buf_putc(b, '0');
        }
        weir_buf_put(b, digits, n);
    } else if ((size_t)point < n) {
        weir_buf_put(b, digits, (size_t)point);
        weir_buf_putc(b, '.');
        weir_buf_put(b, digits + point, n - (size_t)point);
    } else {
        weir_buf_put(b, digits, n);
        for (size_t i = n; i < (size_t)point; i++) {
            weir_buf_putc(b, '0');
        }
        if (min_frac > 0) {
            weir_buf_puts(b, ".0");
        }
    }
}

static void f64_text(weir_buf *b, double x, bool debug) {
    if (x != x) {
        weir_buf_puts(b, "NaN");
        return;
    }
    if (x < 0 || (x == 0 && 1 / x < 0)) {
        weir_buf_putc(b, '-');
        x = -x;
    }
    if (x == __builtin_inf()) {
        weir_buf_puts(b, "inf");
        return;
    }
    if (x == 0) {
        weir_buf_puts(b, debug ? "0.0" : "0");
        return;
    }
    char digits[24];
    int exp10;
    size_t n = f64_shortest(x, digits, &exp10);
    if (debug && (x < 1e-4 || x >= 1e16)) {
        weir_buf_putc(b, digits[0]);
        if (n > 1) {
            weir_buf_putc(b, '.');
            weir_buf_put(b, digits + 1, n - 1);
        }
        weir_buf_putc(b, 'e');
        weir_buf_i64(b, exp10);
        return;
    }
    f64_positional(b, digits, n, exp10, debug ? 1 : 0);
}

void weir_buf_f64_debug(weir_buf *b, double x) {
    f64_text(b, x, true);
}

void weir_buf_f64_display(weir_buf *b, double x) {
    f64_text(b, x, false);
}

/* ---- decimals, timestamps, dates ------------------------------------------------------------- */

void weir_buf_decimal(weir_buf *b, weir_i128 value, int8_t scale) {
    char buf[48];
    size_t n = 0;
    unsigned __int128 abs = value < 0 ? -(unsigned __int128)value : (unsigned __int128)value;
    do {
        buf[n++] = (char)('0' + (int)(abs % 10));
        abs /= 10;
    } while (abs);
    for (size_t i = 0; i < n / 2; i++) {
        char t = buf[i];
        buf[i] = buf[n - 1 - i];
        buf[n - 1 - i] = t;
    }
    if (value < 0) {
        weir_buf_putc(b, '-');
    }
    if (scale <= 0) {
        weir_buf_put(b, buf, n);
        if (value != 0) {
            for (int i = 0; i < -scale; i++) {
                weir_buf_putc(b, '0');
            }
        }
        return;
    }
    size_t s = (size_t)scale;
    if (n <= s) {
        weir_buf_puts(b, "0.");
        for (size_t i = 0; i < s - n; i++) {
            weir_buf_putc(b, '0');
        }
        weir_buf_put(b, buf, n);
    } else {
        weir_buf_put(b, buf, n - s);
        weir_buf_putc(b, '.');
        weir_buf_put(b, buf + n - s, s);
    }
}

weir_i128 weir_decimal_at(const uint8_t *bytes, size_t index) {
    uint64_t lo, hi; /* wasm is little-endian, as Arrow's layout */
    memcpy(&lo, bytes + index * 16, 8);
    memcpy(&hi, bytes + index * 16 + 8, 8);
    return (weir_i128)((unsigned __int128)hi << 64 | lo);
}

static int64_t div_floor(int64_t a, int64_t b) {
    int64_t q = a / b;
    return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static int64_t mod_floor(int64_t a, int64_t b) {
    int64_t r = a % b;
    return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}

/* Howard Hinnant's civil_from_days / days_from_civil, as in text.rs. */
static void civil_from_days(int64_t days, int64_t *year, int *month, int *day) {
    int64_t z = days + 719468;
    int64_t era = div_floor(z, 146097);
    int64_t doe = mod_floor(z, 146097);
    int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    int64_t mp = (5 * doy + 2) / 153;
    int64_t d = doy - (153 * mp + 2) / 5 + 1;
    int64_t m = mp < 10 ? mp + 3 : mp - 9;
    *year = yoe + era * 400 + (m <= 2);
    *month = (int)m;
    *day = (int)d;
}

static int64_t days_from_civil(int64_t year, int month, int day) {
    int64_t y = month <= 2 ? year - 1 : year;
    int64_t era = div_floor(y, 400);
    int64_t yoe = mod_floor(y, 400);
    int64_t m = month;
    int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + day - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int days_in_month(int64_t year, int month) {
    switch (month) {
    case 1: case 3: case 5: case 7: case 8: case 10: case 12: return 31;
    case 4: case 6: case 9: case 11: return 30;
    case 2: return ((year % 4 == 0 && year % 100 != 0) || year % 400 == 0) ? 29 : 28;
    default: return 0;
    }
}

static void put_date(weir_buf *b, int64_t days) {
    int64_t y;
    int m, d;
    civil_from_days(days, &y, &m, &d);
    if (y >= 0 && y <= 9999) {
        put_digits(b, y, 4);
    } else {
        weir_buf_printf(b, "%+05lld", (long long)y);
    }
    weir_buf_putc(b, '-');
    put_digits(b, m, 2);
    weir_buf_putc(b, '-');
    put_digits(b, d, 2);
}

void weir_buf_date32(weir_buf *b, int32_t days) {
    put_date(b, days);
}

void weir_buf_timestamp_micros(weir_buf *b, int64_t micros) {
    int64_t secs = div_floor(micros, 1000000);
    int64_t frac = mod_floor(micros, 1000000);
    int64_t days = div_floor(secs, 86400);
    int64_t sod = mod_floor(secs, 86400);
    put_date(b, days);
    weir_buf_putc(b, 'T');
    put_digits(b, sod / 3600, 2);
    weir_buf_putc(b, ':');
    put_digits(b, sod / 60 % 60, 2);
    weir_buf_putc(b, ':');
    put_digits(b, sod % 60, 2);
    if (frac == 0) {
        weir_buf_putc(b, 'Z');
        return;
    }
    weir_buf_putc(b, '.');
    if (frac % 1000 == 0) {
        put_digits(b, frac / 1000, 3);
    } else {
        put_digits(b, frac, 6);
    }
    weir_buf_putc(b, 'Z');
}

void weir_buf_data_type(weir_buf *b, uint8_t tag, uint8_t precision, int8_t scale) {
    static const char *const names[] = {
        "boolean", "int32", "int64", "float64", "decimal128", "utf8", "timestamp-micros", "date32",
    };
    if (tag == WEIR_DECIMAL128) {
        weir_buf_printf(b, "decimal128(%u, %d)", precision, scale);
    } else if (tag < sizeof names / sizeof names[0]) {
        weir_buf_puts(b, names[tag]);
    } else {
        weir_buf_printf(b, "data-type %u", tag);
    }
}

/* `width` ASCII digits at `at` of `text` (length `len`). */
static bool number_at(const char *text, size_t len, size_t at, size_t width, int *out) {
    if (at > len || len - at < width) {
        return false;
    }
    int v = 0;
    for (size_t i = at; i < at + width; i++) {
        if (text[i] < '0' || text[i] > '9') {
            return false;
        }
        v = v * 10 + (text[i] - '0');
    }
    *out = v;
    return true;
}

static bool parse_ymd(const char *t, size_t len, int64_t *y, int *m, int *d) {
    int year;
    if (len < 10 || t[4] != '-' || t[7] != '-') {
        return false;
    }
    if (!number_at(t, len, 0, 4, &year) || !number_at(t, len, 5, 2, m) ||
        !number_at(t, len, 8, 2, d)) {
        return false;
    }
    *y = year;
    return *m >= 1 && *m <= 12 && *d != 0 && *d <= days_in_month(year, *m);
}

char *weir_parse_date32(const char *text, int32_t *out) {
    size_t len = strlen(text);
    int64_t y;
    int m, d;
    if (len != 10 || !parse_ymd(text, len, &y, &m, &d)) {
        return weir_format("`%s` is not a date (expected YYYY-MM-DD)", text);
    }
    *out = (int32_t)days_from_civil(y, m, d);
    return NULL;
}

static bool parse_timestamp(const char *t, size_t len, int64_t *out) {
    int64_t y;
    int mo, d;
    if (!parse_ymd(t, len, &y, &mo, &d)) {
        return false;
    }
    int64_t micros = days_from_civil(y, mo, d) * 86400 * 1000000;
    size_t at = 10;
    if (at == len) {
        *out = micros;
        return true;
    }
    if (t[at] != 'T' && t[at] != 't' && t[at] != ' ') {
        return false;
    }
    at++;
    int h, mi, s = 0;
    if (!number_at(t, len, at, 2, &h) || at + 2 >= len || t[at + 2] != ':' ||
        !number_at(t, len, at + 3, 2, &mi)) {
        return false;
    }
    at += 5;
    if (at < len && t[at] == ':') {
        if (!number_at(t, len, at + 1, 2, &s)) {
            return false;
        }
        at += 3;
        if (at < len && t[at] == '.') {
            at++;
            size_t start = at;
            int64_t frac = 0;
            while (at < len && t[at] >= '0' && t[at] <= '9') {
                if (at - start < 6) {
                    frac = frac * 10 + (t[at] - '0');
                }
                at++;
            }
            if (at == start) {
                return false;
            }
            for (size_t i = at - start; i < 6; i++) {
                frac *= 10;
            }
            micros += frac;
        }
    }
    if (h > 23 || mi > 59 || s > 60) {
        return false;
    }
    micros += ((int64_t)h * 3600 + (int64_t)mi * 60 + s) * 1000000;
    int64_t offset = 0;
    if (at == len) {
        offset = 0;
    } else if ((t[at] == 'Z' || t[at] == 'z') && at + 1 == len) {
        offset = 0;
    } else if (t[at] == '+' || t[at] == '-') {
        int oh, om;
        if (!number_at(t, len, at + 1, 2, &oh)) {
            return false;
        }
        size_t rest = len - (at + 3);
        if (rest == 0) {
            om = 0;
        } else if (t[at + 3] == ':' && rest == 3) {
            if (!number_at(t, len, at + 4, 2, &om)) {
                return false;
            }
        } else if (rest == 2) {
            if (!number_at(t, len, at + 3, 2, &om)) {
                return false;
            }
        } else {
            return false;
        }
        if (oh > 23 || om > 59) {
            return false;
        }
        offset = (int64_t)oh * 3600 + (int64_t)om * 60;
        if (t[at] == '-') {
            offset = -offset;
        }
    } else {
        return false;
    }
    *out = micros - offset * 1000000;
    return true;
}

char *weir_parse_timestamp_micros(const char *text, int64_t *out) {
    if (!parse_timestamp(text, strlen(text), out)) {
        return weir_format("`%s` is not a timestamp (expected e.g. 2024-05-01T12:00:00Z or "
                           "2024-05-01 12:00:00.5+02:00)",
                           text);
    }
    return NULL;
}

/* Byte length of the Unicode whitespace character (Rust's `char::is_whitespace`) at `s`, or 0. */
static size_t whitespace_at(const unsigned char *s, size_t avail) {
    if (avail >= 1 && (s[0] == ' ' || (s[0] >= 0x09 && s[0] <= 0x0d))) {
        return 1;
    }
    if (avail >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) {
        return 2;
    }
    if (avail >= 3) {
        unsigned c = (unsigned)(s[0] & 0x0f) << 12 | (unsigned)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
        if ((s[0] & 0xf0) == 0xe0 &&
            (c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
             c == 0x202f || c == 0x205f || c == 0x3000)) {
            return 3;
        }
    }
    return 0;
}

char *weir_parse_decimal(const char *text, int8_t scale, weir_i128 *out) {
    const unsigned char *t = (const unsigned char *)text;
    size_t len = strlen(text), w;
    while (len && (w = whitespace_at(t, len)) != 0) {
        t += w;
        len -= w;
    }
    for (bool trimmed = true; trimmed && len;) {
        trimmed = false;
        for (size_t k = 1; k <= 3 && k <= len; k++) {
            if (whitespace_at(t + len - k, k) == k) {
                len -= k;
                trimmed = true;
                break;
            }
        }
    }
    bool negative = false;
    if (len && (t[0] == '-' || t[0] == '+')) {
        negative = t[0] == '-';
        t++;
        len--;
    }
    size_t mantissa_len = len;
    int64_t exponent = 0;
    for (size_t i = 0; i < len; i++) {
        if (t[i] == 'e' || t[i] == 'E') {
            /* Rust's i32 parse: one optional sign, then at least one digit, in range. */
            mantissa_len = i;
            size_t j = i + 1;
            bool neg = false;
            if (j < len && (t[j] == '+' || t[j] == '-')) {
                neg = t[j] == '-';
                j++;
            }
            if (j == len) {
                return weir_format("`%s` is not a decimal number", text);
            }
            for (; j < len; j++) {
                if (t[j] < '0' || t[j] > '9') {
                    return weir_format("`%s` is not a decimal number", text);
                }
                exponent = exponent * 10 + (t[j] - '0');
                if (exponent > (int64_t)INT32_MAX + 1) {
                    return weir_format("`%s` is not a decimal number", text);
                }
            }
            if (neg) {
                exponent = -exponent;
            }
            if (exponent > INT32_MAX || exponent < INT32_MIN) {
                return weir_format("`%s` is not a decimal number", text);
            }
            break;
        }
    }
    size_t int_len = mantissa_len, frac_start = mantissa_len, frac_len = 0;
    for (size_t i = 0; i < mantissa_len; i++) {
        if (t[i] == '.') {
            int_len = i;
            frac_start = i + 1;
            frac_len = mantissa_len - i - 1;
            break;
        }
    }
    bool digits_only = true;
    for (size_t i = 0; i < int_len; i++) {
        digits_only &= t[i] >= '0' && t[i] <= '9';
    }
    for (size_t i = 0; i < frac_len; i++) {
        digits_only &= t[frac_start + i] >= '0' && t[frac_start + i] <= '9';
    }
    if ((int_len == 0 && frac_len == 0) || !digits_only) {
        return weir_format("`%s` is not a decimal number", text);
    }
    weir_i128 unscaled = 0;
    for (size_t i = 0; i < int_len + frac_len; i++) {
        unsigned char c = i < int_len ? t[i] : t[frac_start + i - int_len];
        if (__builtin_mul_overflow(unscaled, 10, &unscaled) ||
            __builtin_add_overflow(unscaled, c - '0', &unscaled)) {
            return weir_format("`%s` is out of the decimal128 range", text);
        }
    }
    int64_t shift = (int64_t)scale + exponent - (int64_t)frac_len;
    if (shift >= 0) {
        for (int64_t i = 0; i < shift && unscaled != 0; i++) {
            if (__builtin_mul_overflow(unscaled, 10, &unscaled)) {
                return weir_format("`%s` is out of the decimal128 range", text);
            }
        }
    } else {
        for (int64_t i = 0; i < -shift; i++) {
            if (unscaled % 10 != 0) {
                return weir_format("`%s` has more decimal places than scale %d", text, scale);
            }
            unscaled /= 10;
            if (unscaled == 0) {
                break;
            }
        }
    }
    *out = negative ? -unscaled : unscaled;
    return NULL;
}

/* ---- bitmaps --------------------------------------------------------------------------------- */

uint8_t *weir_bitmap_new(size_t rows, bool set) {
    size_t n = weir_bitmap_bytes(rows);
    if (n == 0) {
        return NULL;
    }
    uint8_t *bits = weir_xmalloc(n);
    memset(bits, set ? 0xff : 0, n);
    if (set && rows % 8) {
        bits[n - 1] = (uint8_t)((1u << (rows % 8)) - 1);
    }
    return bits;
}

void weir_bitmap_and(uint8_t *bits, const uint8_t *other, size_t rows) {
    size_t n = weir_bitmap_bytes(rows);
    for (size_t i = 0; i < n; i++) {
        bits[i] &= other[i];
    }
}

/* ---- JSON ------------------------------------------------------------------------------------ */

typedef struct {
    const char *text;
    size_t len;
    size_t at;
    int depth;
    char *error;
} json_parser;

static void json_fail(json_parser *p, const char *what) {
    if (p->error) {
        return;
    }
    size_t line = 1, column = 0;
    size_t end = p->at < p->len ? p->at + 1 : p->len;
    for (size_t i = 0; i < end; i++) {
        if (p->text[i] == '\n') {
            line++;
            column = 0;
        } else {
            column++;
        }
    }
    p->error = weir_format("config: %s at line %zu column %zu", what, line, column);
}

static void json_skip_blank(json_parser *p) {
    while (p->at < p->len) {
        char c = p->text[p->at];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            break;
        }
        p->at++;
    }
}

static bool json_value(json_parser *p, weir_json *out);

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool json_hex4(json_parser *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        if (p->at >= p->len) {
            json_fail(p, "EOF while parsing a string");
            return false;
        }
        int h = hex_digit(p->text[p->at]);
        if (h < 0) {
            json_fail(p, "invalid escape");
            return false;
        }
        v = v << 4 | (unsigned)h;
        p->at++;
    }
    *out = v;
    return true;
}

static void put_utf8(weir_buf *b, unsigned c) {
    if (c < 0x80) {
        weir_buf_putc(b, (char)c);
    } else if (c < 0x800) {
        weir_buf_putc(b, (char)(0xc0 | c >> 6));
        weir_buf_putc(b, (char)(0x80 | (c & 0x3f)));
    } else if (c < 0x10000) {
        weir_buf_putc(b, (char)(0xe0 | c >> 12));
        weir_buf_putc(b, (char)(0x80 | (c >> 6 & 0x3f)));
        weir_buf_putc(b, (char)(0x80 | (c & 0x3f)));
    } else {
        weir_buf_putc(b, (char)(0xf0 | c >> 18));
        weir_buf_putc(b, (char)(0x80 | (c >> 12 & 0x3f)));
        weir_buf_putc(b, (char)(0x80 | (c >> 6 & 0x3f)));
        weir_buf_putc(b, (char)(0x80 | (c & 0x3f)));
    }
}

/* A string; `p->at` is on the opening quote. */
static bool json_string(json_parser *p, weir_json *out) {
    weir_buf b = {0};
    p->at++;
    for (;;) {
        if (p->at >= p->len) {
            json_fail(p, "EOF while parsing a string");
            weir_buf_free(&b);
            return false;
        }
        unsigned char c = (unsigned char)p->text[p->at];
        if (c == '"') {
            break;
        }
        if (c < 0x20) {
            json_fail(p, "control character (\\u0000-\\u001F) found while parsing a string");
            weir_buf_free(&b);
            return false;
        }
        if (c != '\\') {
            weir_buf_putc(&b, (char)c);
            p->at++;
            continue;
        }
        p->at++;
        if (p->at >= p->len) {
            json_fail(p, "EOF while parsing a string");
            weir_buf_free(&b);
            return false;
        }
        char e = p->text[p->at++];
        switch (e) {
        case '"': weir_buf_putc(&b, '"'); break;
        case '\\': weir_buf_putc(&b, '\\'); break;
        case '/': weir_buf_putc(&b, '/'); break;
        case 'b': weir_buf_putc(&b, '\b'); break;
        case 'f': weir_buf_putc(&b, '\f'); break;
        case 'n': weir_buf_putc(&b, '\n'); break;
        case 'r': weir_buf_putc(&b, '\r'); break;
        case 't': weir_buf_putc(&b, '\t'); break;
        case 'u': {
            unsigned u;
            if (!json_hex4(p, &u)) {
                weir_buf_free(&b);
                return false;
            }
            if (u >= 0xdc00 && u <= 0xdfff) {
                json_fail(p, "lone leading surrogate in hex escape");
                weir_buf_free(&b);
                return false;
            }
            if (u >= 0xd800 && u <= 0xdbff) {
                unsigned low;
                if (p->at + 1 >= p->len || p->text[p->at] != '\\' || p->text[p->at + 1] != 'u') {
                    json_fail(p, "unexpected end of hex escape");
                    weir_buf_free(&b);
                    return false;
                }
                p->at += 2;
                if (!json_hex4(p, &low)) {
                    weir_buf_free(&b);
                    return false;
                }
                if (low < 0xdc00 || low > 0xdfff) {
                    json_fail(p, "lone leading surrogate in hex escape");
                    weir_buf_free(&b);
                    return false;
                }
                u = 0x10000 + ((u - 0xd800) << 10) + (low - 0xdc00);
            }
            put_utf8(&b, u);
            break;
        }
        default:
            p->at--;
            json_fail(p, "invalid escape");
            weir_buf_free(&b);
            return false;
        }
    }
    p->at++;
    out->kind = WEIR_JSON_STRING;
    out->len = b.len;
    out->str = weir_buf_take(&b);
    return true;
}

static bool is_digit(char c) {
    return c >= '0' && c <= '9';
}

static bool json_number(json_parser *p, weir_json *out) {
    size_t start = p->at;
    bool negative = false;
    if (p->text[p->at] == '-') {
        negative = true;
        p->at++;
    }
    if (p->at >= p->len || !is_digit(p->text[p->at])) {
        json_fail(p, "invalid number");
        return false;
    }
    if (p->text[p->at] == '0') {
        p->at++;
        if (p->at < p->len && is_digit(p->text[p->at])) {
            json_fail(p, "invalid number");
            return false;
        }
    } else {
        while (p->at < p->len && is_digit(p->text[p->at])) {
            p->at++;
        }
    }
    bool integer = true;
    if (p->at < p->len && p->text[p->at] == '.') {
        integer = false;
        p->at++;
        if (p->at >= p->len || !is_digit(p->text[p->at])) {
            json_fail(p, "invalid number");
            return false;
        }
        while (p->at < p->len && is_digit(p->text[p->at])) {
            p->at++;
        }
    }
    if (p->at < p->len && (p->text[p->at] == 'e' || p->text[p->at] == 'E')) {
        integer = false;
        p->at++;
        if (p->at < p->len && (p->text[p->at] == '+' || p->text[p->at] == '-')) {
            p->at++;
        }
        if (p->at >= p->len || !is_digit(p->text[p->at])) {
            json_fail(p, "invalid number");
            return false;
        }
        while (p->at < p->len && is_digit(p->text[p->at])) {
            p->at++;
        }
    }
    size_t n = p->at - start;
    char *copy = weir_xmalloc(n + 1);
    memcpy(copy, p->text + start, n);
    copy[n] = 0;
    if (integer) {
        /* serde_json: a non-negative integer is a u64 and a negative one an i64, which a Rust
         * `i64` takes when in range; `-0` and anything out of range become floats. */
        unsigned long long magnitude = 0;
        bool overflow = false;
        for (size_t i = negative ? 1 : 0; i < n; i++) {
            unsigned d = (unsigned)(copy[i] - '0');
            if (magnitude > (ULLONG_MAX - d) / 10) {
                overflow = true;
                break;
            }
            magnitude = magnitude * 10 + d;
        }
        if (!overflow && !negative && magnitude <= (unsigned long long)INT64_MAX) {
            out->kind = WEIR_JSON_INT;
            out->integer = (int64_t)magnitude;
            out->number = (double)out->integer;
            free(copy);
            return true;
        }
        if (!overflow && negative && magnitude != 0 &&
            magnitude <= (unsigned long long)INT64_MAX + 1) {
            out->kind = WEIR_JSON_INT;
            out->integer = magnitude == (unsigned long long)INT64_MAX + 1
                               ? INT64_MIN
                               : -(int64_t)magnitude;
            out->number = (double)out->integer;
            free(copy);
            return true;
        }
    }
    errno = 0;
    double x = strtod(copy, NULL);
    free(copy);
    if (x == __builtin_inf() || x == -__builtin_inf()) {
        json_fail(p, "number out of range");
        return false;
    }
    out->kind = WEIR_JSON_FLOAT;
    out->number = x;
    return true;
}

static bool json_literal(json_parser *p, const char *word) {
    size_t n = strlen(word);
    for (size_t i = 0; i < n; i++) {
        if (p->at >= p->len) {
            json_fail(p, "EOF while parsing a value");
            return false;
        }
        if (p->text[p->at] != word[i]) {
            json_fail(p, "expected ident");
            return false;
        }
        p->at++;
    }
    return true;
}

static void json_push(weir_json **items, size_t *count, size_t *cap, const weir_json *item) {
    if (*count == *cap) {
        *cap = *cap ? *cap * 2 : 4;
        *items = weir_xrealloc(*items, *cap * sizeof **items);
    }
    (*items)[(*count)++] = *item;
}

static void json_clear(weir_json *v);

/* After an item of a list (`close` is `]`, `what` "a list") or an object: 1 when `close` ended
 * it, 0 when a `,` leads to another item, -1 (with the parser's error set) otherwise. */
static int json_after_item(json_parser *p, char close, const char *what) {
    json_skip_blank(p);
    if (p->at >= p->len) {
        char message[64];
        snprintf(message, sizeof message, "EOF while parsing %s", what);
        json_fail(p, message);
        return -1;
    }
    char c = p->text[p->at];
    if (c == close) {
        p->at++;
        return 1;
    }
    if (c != ',') {
        json_fail(p, close == ']' ? "expected `,` or `]`" : "expected `,` or `}`");
        return -1;
    }
    p->at++;
    json_skip_blank(p);
    if (p->at < p->len && p->text[p->at] == close) {
        json_fail(p, "trailing comma");
        return -1;
    }
    return 0;
}

static bool json_array(json_parser *p, weir_json *out) {
    size_t cap = 0;
    out->kind = WEIR_JSON_ARRAY;
    p->at++;
    json_skip_blank(p);
    if (p->at < p->len && p->text[p->at] == ']') {
        p->at++;
        return true;
    }
    for (;;) {
        weir_json item = {0};
        if (!json_value(p, &item)) {
            json_clear(&item);
            return false;
        }
        json_push(&out->items, &out->count, &cap, &item);
        int after = json_after_item(p, ']', "a list");
        if (after != 0) {
            return after > 0;
        }
    }
}

static bool json_object(json_parser *p, weir_json *out) {
    size_t cap = 0, key_cap = 0, keys = 0;
    out->kind = WEIR_JSON_OBJECT;
    p->at++;
    json_skip_blank(p);
    if (p->at < p->len && p->text[p->at] == '}') {
        p->at++;
        return true;
    }
    for (;;) {
        json_skip_blank(p);
        if (p->at >= p->len) {
            json_fail(p, "EOF while parsing an object");
            return false;
        }
        if (p->text[p->at] != '"') {
            json_fail(p, "key must be a string");
            return false;
        }
        weir_json key = {0}, value = {0};
        if (!json_string(p, &key)) {
            return false;
        }
        json_skip_blank(p);
        if (p->at >= p->len || p->text[p->at] != ':') {
            json_fail(p, p->at >= p->len ? "EOF while parsing an object" : "expected `:`");
            json_clear(&key);
            return false;
        }
        p->at++;
        if (!json_value(p, &value)) {
            json_clear(&key);
            json_clear(&value);
            return false;
        }
        /* keys and values stay parallel, so that json_clear frees both */
        json_push(&out->keys, &keys, &key_cap, &key);
        json_push(&out->items, &out->count, &cap, &value);
        int after = json_after_item(p, '}', "an object");
        if (after != 0) {
            return after > 0;
        }
    }
}

static bool json_value(json_parser *p, weir_json *out) {
    json_skip_blank(p);
    if (p->at >= p->len) {
        json_fail(p, "EOF while parsing a value");
        return false;
    }
    if (++p->depth > 128) {
        json_fail(p, "recursion limit exceeded");
        return false;
    }
    bool ok;
    char c = p->text[p->at];
    switch (c) {
    case '{': ok = json_object(p, out); break;
    case '[': ok = json_array(p, out); break;
    case '"': ok = json_string(p, out); break;
    case 't':
        ok = json_literal(p, "true");
        out->kind = WEIR_JSON_BOOL;
        out->boolean = true;
        break;
    case 'f':
        ok = json_literal(p, "false");
        out->kind = WEIR_JSON_BOOL;
        out->boolean = false;
        break;
    case 'n':
        ok = json_literal(p, "null");
        out->kind = WEIR_JSON_NULL;
        break;
    default:
        if (c == '-' || is_digit(c)) {
            ok = json_number(p, out);
        } else {
            json_fail(p, "expected value");
            ok = false;
        }
    }
    p->depth--;
    return ok;
}

static void json_clear(weir_json *v) {
    free(v->str);
    for (size_t i = 0; i < v->count; i++) {
        json_clear(&v->items[i]);
        if (v->kind == WEIR_JSON_OBJECT) {
            json_clear(&v->keys[i]);
        }
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

weir_json *weir_json_parse(const char *text, size_t len, char **error) {
    json_parser p = {text, len, 0, 0, NULL};
    json_skip_blank(&p);
    weir_json *value = weir_xmalloc(sizeof *value);
    memset(value, 0, sizeof *value);
    if (p.at == len) {
        value->kind = WEIR_JSON_OBJECT; /* an empty config reads as `{}` */
        return value;
    }
    if (json_value(&p, value)) {
        json_skip_blank(&p);
        if (p.at < len) {
            json_fail(&p, "trailing characters");
        }
    }
    if (p.error) {
        json_clear(value);
        free(value);
        *error = p.error;
        return NULL;
    }
    return value;
}

void weir_json_free(weir_json *value) {
    if (value) {
        json_clear(value);
        free(value);
    }
}

const weir_json *weir_json_get(const weir_json *object, const char *key) {
    if (!object || object->kind != WEIR_JSON_OBJECT) {
        return NULL;
    }
    size_t n = strlen(key);
    for (size_t i = 0; i < object->count; i++) {
        if (object->keys[i].len == n && memcmp(object->keys[i].str, key, n) == 0) {
            return &object->items[i];
        }
    }
    return NULL;
}

void weir_buf_json_unexpected(weir_buf *b, const weir_json *v) {
    switch (v->kind) {
    case WEIR_JSON_NULL: weir_buf_puts(b, "null"); break;
    case WEIR_JSON_BOOL: weir_buf_printf(b, "boolean `%s`", v->boolean ? "true" : "false"); break;
    case WEIR_JSON_INT: weir_buf_printf(b, "integer `%lld`", (long long)v->integer); break;
    case WEIR_JSON_FLOAT:
        weir_buf_puts(b, "floating point `");
        weir_buf_f64_debug(b, v->number);
        weir_buf_putc(b, '`');
        break;
    case WEIR_JSON_STRING:
        weir_buf_puts(b, "string ");
        weir_buf_debug_string(b, (const uint8_t *)v->str, v->len);
        break;
    case WEIR_JSON_ARRAY: weir_buf_puts(b, "sequence"); break;
    case WEIR_JSON_OBJECT: weir_buf_puts(b, "map"); break;
    }
}

static bool listed(const weir_json *key, const char *const *names) {
    for (; names && *names; names++) {
        if (strlen(*names) == key->len && memcmp(*names, key->str, key->len) == 0) {
            return true;
        }
    }
    return false;
}

char *weir_config_check(const weir_json *config, const char *const *required,
                        const char *const *optional) {
    weir_buf b = {0};
    if (config->kind != WEIR_JSON_OBJECT) {
        weir_buf_puts(&b, "config: invalid type: ");
        weir_buf_json_unexpected(&b, config);
        weir_buf_puts(&b, ", expected an object");
        return weir_buf_take(&b);
    }
    for (size_t i = 0; i < config->count; i++) {
        const weir_json *key = &config->keys[i];
        const char *problem = NULL;
        if (!listed(key, required) && !listed(key, optional)) {
            problem = "unknown key";
        } else {
            for (size_t j = 0; j < i; j++) {
                if (config->keys[j].len == key->len &&
                    memcmp(config->keys[j].str, key->str, key->len) == 0) {
                    problem = "duplicate key";
                    break;
                }
            }
        }
        if (problem) {
            if (b.len) {
                weir_buf_puts(&b, "; ");
            }
            weir_buf_puts(&b, "config.");
            weir_buf_put(&b, key->str, key->len);
            weir_buf_printf(&b, ": %s", problem);
        }
    }
    for (; required && *required; required++) {
        if (!weir_json_get(config, *required)) {
            if (b.len) {
                weir_buf_puts(&b, "; ");
            }
            weir_buf_printf(&b, "config.%s: missing", *required);
        }
    }
    if (b.len == 0) {
        return NULL;
    }
    return weir_buf_take(&b);
}
