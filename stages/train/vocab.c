/*
 * stages/train/vocab.c — supervised-token counts, the t2d/d2t draft vocabulary and a minimal
 * .npy reader/writer for the two dtypes speculators uses (stages/train/vocab.h).
 */
#include "train/vocab.h"

#include "core/err.h"
#include "core/fsutil.h"
#include "kernels/lmhead_loss.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int vocab_count_dataset(const struct dataset *ds, int64_t V_t, uint64_t *counts, char *err, int err_len) {
    if (V_t < 1) return err_fail(err, err_len, "vocab_count_dataset: vocab size must be >= 1, got %lld", (long long)V_t);
    for (uint64_t r = 0; r < ds->n_rows; r++)
        for (uint64_t k = ds->offsets[r]; k < ds->offsets[r + 1]; k++) {
            if (!ds->loss_mask[k]) continue;
            int32_t id = ds->tokens[k];
            if (id < 0 || id >= V_t)
                return err_fail(err, err_len, "%s: row %llu: input_ids[%llu] = %d >= vocab size %lld", ds->path,
                                (unsigned long long)r, (unsigned long long)(k - ds->offsets[r]), id, (long long)V_t);
            counts[id]++;
        }
    return 0;
}

struct idc { int64_t id; uint64_t count; };

static int by_count_desc_id_asc(const void *a, const void *b) {
    const struct idc *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id ? 1 : 0;
}

int vocab_check(const uint8_t *t2d, int64_t V_t, const int64_t *d2t, int64_t V_d, char *err, int err_len) {
    if (V_t < 1 || V_t > INT_MAX || V_d < 1 || V_d > V_t)
        return err_fail(err, err_len, "vocab mapping: need 1 <= V_d (%lld) <= V_t (%lld) <= %d", (long long)V_d, (long long)V_t, INT_MAX);
    for (int64_t d = 0; d < V_d; d++)
        if (d + d2t[d] < 0 || d + d2t[d] >= V_t)
            return err_fail(err, err_len, "vocab mapping: draft %lld maps to %lld, outside [0, %lld)", (long long)d,
                            (long long)(d + d2t[d]), (long long)V_t);
    return lmhead_vocab_check(t2d, (int)V_t, d2t, (int)V_d, err, err_len);
}

int vocab_build(const uint64_t *counts, int64_t V_t, int64_t V_d, uint8_t *t2d, int64_t *d2t,
                char *err, int err_len) {
    if (V_t < 1 || V_t > INT_MAX || V_d < 1 || V_d > V_t)
        return err_fail(err, err_len, "vocab_build: need 1 <= draft vocab size (%lld) <= vocab size (%lld) <= %d",
                        (long long)V_d, (long long)V_t, INT_MAX);
    struct idc *v = malloc((size_t)V_t * sizeof *v);
    if (!v) return err_fail(err, err_len, "vocab_build: out of memory for %lld ids", (long long)V_t);
    for (int64_t i = 0; i < V_t; i++) { v[i].id = i; v[i].count = counts[i]; }
    qsort(v, (size_t)V_t, sizeof *v, by_count_desc_id_asc);
    memset(t2d, 0, (size_t)V_t);
    for (int64_t k = 0; k < V_d; k++) t2d[v[k].id] = 1;   /* top V_d; unseen ids come last by id: the padding */
    free(v);
    int64_t d = 0;
    for (int64_t id = 0; id < V_t; id++)   /* chosen ids ascending */
        if (t2d[id]) { d2t[d] = id - d; d++; }
    return vocab_check(t2d, V_t, d2t, V_d, err, err_len);
}

/* ---------------------------------------------------------------- npy */

#define NPY_MAGIC "\x93NUMPY"
#define NPY_ALIGN 64
#define NPY_GROWTH_DIGITS 21

int vocab_npy_header(char *out, size_t out_len, const char *descr, int64_t n) {
    char dict[200];
    int l = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr, (long long)n);
    char num[32];
    int digits = snprintf(num, sizeof num, "%lld", (long long)n);
    int spaces = NPY_GROWTH_DIGITS - digits;   /* numpy's room to grow the shape in place */
    if (spaces < 0) spaces = 0;
    int hlen = l + spaces + 1;                  /* + the final '\n' */
    int pad = NPY_ALIGN - ((8 + 2 + hlen) % NPY_ALIGN);   /* 1..64, as numpy's _wrap_header */
    int total = 10 + hlen + pad;
    if (total > 65535 + 10 || (size_t)total > out_len) return -1;
    memcpy(out, NPY_MAGIC, 6);
    out[6] = 1; out[7] = 0;
    int hl = hlen + pad;
    out[8] = (char)(hl & 0xff); out[9] = (char)(hl >> 8);
    memcpy(out + 10, dict, (size_t)l);
    memset(out + 10 + l, ' ', (size_t)(spaces + pad));
    out[total - 1] = '\n';
    return total;
}

static int npy_write(const char *path, const char *descr, const void *x, int64_t n, size_t es, char *err, int err_len) {
    if (n < 0) return err_fail(err, err_len, "%s: negative length %lld", path, (long long)n);
    char hdr[256];
    int h = vocab_npy_header(hdr, sizeof hdr, descr, n);
    if (h < 0) return err_fail(err, err_len, "%s: npy header does not fit", path);
    size_t bytes = (size_t)h + (size_t)n * es;
    char *buf = malloc(bytes ? bytes : 1);
    if (!buf) return err_fail(err, err_len, "%s: out of memory for %zu bytes", path, bytes);
    memcpy(buf, hdr, (size_t)h);
    if (n) memcpy(buf + h, x, (size_t)n * es);   /* little-endian host (x86-64, aarch64) */
    int rc = fs_write_atomic(path, buf, bytes, err, err_len);
    free(buf);
    return rc;
}

int vocab_npy_write_i64(const char *path, const int64_t *x, int64_t n, char *err, int err_len) {
    return npy_write(path, "<i8", x, n, 8, err, err_len);
}

int vocab_npy_write_bool(const char *path, const uint8_t *x, int64_t n, char *err, int err_len) {
    return npy_write(path, "|b1", x, n, 1, err, err_len);
}

/* The value text after 'key': in the header dict, or NULL. */
static const char *dict_value(const char *dict, const char *key) {
    char pat[64];
    snprintf(pat, sizeof pat, "'%s':", key);
    const char *p = strstr(dict, pat);
    if (!p) return NULL;
    p += strlen(pat);
    while (*p == ' ') p++;
    return p;
}

static int npy_read(const char *path, const char *want_descr, size_t es, void **out, int64_t *n_out, char *err, int err_len) {
    char *buf;
    size_t len;
    *out = NULL;
    if (fs_read_file(path, &buf, &len, err, err_len)) return -1;
    int rc = -1;
    char *dict = NULL;
    if (len < 10 || memcmp(buf, NPY_MAGIC, 6)) { err_fail(err, err_len, "%s: not a .npy file (bad magic)", path); goto out; }
    unsigned major = (unsigned char)buf[6];
    size_t hl, off;
    if (major == 1) { hl = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8); off = 10; }
    else if (major == 2 || major == 3) {
        if (len < 12) { err_fail(err, err_len, "%s: truncated npy header", path); goto out; }
        hl = (unsigned char)buf[8] | ((size_t)(unsigned char)buf[9] << 8) | ((size_t)(unsigned char)buf[10] << 16) | ((size_t)(unsigned char)buf[11] << 24);
        off = 12;
    } else { err_fail(err, err_len, "%s: npy format version %u.%u, expected 1.0-3.0", path, major, (unsigned char)buf[7]); goto out; }
    if (hl > len - off) { err_fail(err, err_len, "%s: truncated: npy header of %zu bytes, file has %zu", path, hl, len); goto out; }
    dict = malloc(hl + 1);
    if (!dict) { err_fail(err, err_len, "%s: out of memory", path); goto out; }
    memcpy(dict, buf + off, hl);
    dict[hl] = 0;
    const char *d = dict_value(dict, "descr"), *f = dict_value(dict, "fortran_order"), *s = dict_value(dict, "shape");
    if (!d || !f || !s) { err_fail(err, err_len, "%s: npy header lacks descr, fortran_order or shape", path); goto out; }
    size_t wl = strlen(want_descr);
    if (d[0] != '\'' || strncmp(d + 1, want_descr, wl) || d[1 + wl] != '\'') {
        const char *e = strchr(d + 1, '\'');
        err_fail(err, err_len, "%s: dtype %.*s, expected '%s'", path, e ? (int)(e - d + 1) : 8, d, want_descr);
        goto out;
    }
    if (strncmp(f, "False", 5)) { err_fail(err, err_len, "%s: fortran_order must be False", path); goto out; }
    if (*s != '(') { err_fail(err, err_len, "%s: malformed shape", path); goto out; }
    char *end;
    long long n = strtoll(s + 1, &end, 10);
    while (*end == ' ') end++;
    if (end == s + 1 || n < 0 || *end != ',') { err_fail(err, err_len, "%s: shape must be 1-D (N,), got %.24s", path, s); goto out; }
    end++;
    while (*end == ' ') end++;
    if (*end != ')') { err_fail(err, err_len, "%s: shape must be 1-D (N,), got %.24s", path, s); goto out; }
    size_t data_off = off + hl;
    if ((uint64_t)n > (len - data_off) / es || len - data_off != (size_t)n * es) {
        err_fail(err, err_len, "%s: %zu data bytes, shape (%lld,) of %s needs %llu", path, len - data_off, n, want_descr,
                 (unsigned long long)n * es);
        goto out;
    }
    void *x = malloc(n ? (size_t)n * es : 1);
    if (!x) { err_fail(err, err_len, "%s: out of memory", path); goto out; }
    memcpy(x, buf + data_off, (size_t)n * es);
    if (es == 1)
        for (long long i = 0; i < n; i++)
            if (((uint8_t *)x)[i] > 1) {
                unsigned bad = ((uint8_t *)x)[i];
                free(x);
                err_fail(err, err_len, "%s: bool element %lld is %u, expected 0 or 1", path, i, bad);
                goto out;
            }
    *out = x;
    *n_out = n;
    rc = 0;
out:
    free(dict);
    free(buf);
    return rc;
}

int vocab_npy_read_i64(const char *path, int64_t **out, int64_t *n, char *err, int err_len) {
    return npy_read(path, "<i8", 8, (void **)out, n, err, err_len);
}

int vocab_npy_read_bool(const char *path, uint8_t **out, int64_t *n, char *err, int err_len) {
    return npy_read(path, "|b1", 1, (void **)out, n, err, err_len);
}

int vocab_load(const char *dir, int64_t V_t, int64_t *V_d, uint8_t **t2d, int64_t **d2t,
               char *err, int err_len) {
    char tp[PATH_MAX], dp[PATH_MAX];
    if (snprintf(tp, sizeof tp, "%s/t2d.npy", dir) >= (int)sizeof tp || snprintf(dp, sizeof dp, "%s/d2t.npy", dir) >= (int)sizeof dp)
        return err_fail(err, err_len, "vocab_load: path too long: %s", dir);
    uint8_t *t = NULL;
    int64_t *d = NULL, nt, nd;
    if (vocab_npy_read_bool(tp, &t, &nt, err, err_len)) return -1;
    if (vocab_npy_read_i64(dp, &d, &nd, err, err_len)) { free(t); return -1; }
    int rc = -1;
    if (nt != V_t) { err_fail(err, err_len, "%s: length %lld, the target vocab size is %lld", tp, (long long)nt, (long long)V_t); goto out; }
    if (*V_d > 0 && nd != *V_d) { err_fail(err, err_len, "%s: length %lld, the draft vocab size is %lld", dp, (long long)nd, (long long)*V_d); goto out; }
    int64_t pop = 0;
    for (int64_t i = 0; i < nt; i++) pop += t[i];
    if (pop != nd) { err_fail(err, err_len, "%s has %lld ids set but %s has length %lld", tp, (long long)pop, dp, (long long)nd); goto out; }
    char why[256];
    if (vocab_check(t, nt, d, nd, why, sizeof why)) { err_fail(err, err_len, "%s, %s: %s", tp, dp, why); goto out; }
    *V_d = nd;
    *t2d = t;
    *d2t = d;
    return 0;
out:
    free(t);
    free(d);
    return rc;
}
