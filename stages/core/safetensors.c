/*
 * stages/core/safetensors.c — safetensors reader, writer and sharded checkpoints (safetensors.h).
 *
 * The reader maps the whole file read-only and validates the JSON header (jansson, duplicate keys
 * rejected) before handing out any pointer, so later code can trust every st_tensor: its bytes lie
 * inside the mapping and belong to no other tensor. The writer streams: the header is computed
 * from the declarations alone, so a 16 GB checkpoint never has to sit in memory.
 */
#include "core/fsutil.h"
#include "core/safetensors.h"
#include "core/err.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- dtypes */

static const struct { const char *name; size_t size; } dtypes[ST_N_DTYPES] = {
    [ST_BF16] = {"BF16", 2}, [ST_F16] = {"F16", 2}, [ST_F32] = {"F32", 4},
    [ST_I64] = {"I64", 8},   [ST_I32] = {"I32", 4}, [ST_BOOL] = {"BOOL", 1},
};

const char *st_dtype_name(enum st_dtype d) {
    return (int)d >= 0 && d < ST_N_DTYPES ? dtypes[d].name : "?";
}
size_t st_dtype_size(enum st_dtype d) {
    return (int)d >= 0 && d < ST_N_DTYPES ? dtypes[d].size : 0;
}
int st_dtype_parse(const char *s, enum st_dtype *out) {
    for (int i = 0; i < ST_N_DTYPES; i++)
        if (strcmp(s, dtypes[i].name) == 0) { *out = (enum st_dtype)i; return 0; }
    return -1;
}

char *st_shape_str(char *buf, size_t len, int ndim, const int64_t *shape) {
    size_t used = 0;
    if (len == 0) return buf;
    buf[0] = '\0';
    used += (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, "]");
    return buf;
}

/* Tensor names: non-empty printable ASCII, at most 1024 bytes (HF names are < 100). */
static int name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 1024) return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) return 0;
    return 1;
}

/* numel and bytes of a shape, or -1 on overflow. */
static int shape_size(int ndim, const int64_t *shape, enum st_dtype d, int64_t *numel, uint64_t *nbytes) {
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return -1;
        if (__builtin_mul_overflow(n, (uint64_t)shape[i], &n)) return -1;
    }
    if (n > (uint64_t)INT64_MAX) return -1;
    uint64_t b;
    if (__builtin_mul_overflow(n, (uint64_t)st_dtype_size(d), &b)) return -1;
    *numel = (int64_t)n;
    *nbytes = b;
    return 0;
}

/* ---------------------------------------------------------------- reader */

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const struct st_tensor *)a)->name, ((const struct st_tensor *)b)->name);
}
static int cmp_tensor_ptr_offset(const void *a, const void *b) {
    const struct st_tensor *x = *(const struct st_tensor *const *)a, *y = *(const struct st_tensor *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset ? 1 : 0;
}

void st_close(struct st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->file_bytes);
    for (int i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < 2 * f->n_metadata; i++) free(f->metadata[i]);
    free(f->tensors);
    free(f->metadata);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* Parse one tensor entry of the header into t (name already set). */
static int parse_entry(const struct st_file *f, struct st_tensor *t, json_t *v, uint64_t data_bytes,
                       char *err, int err_len) {
    const char *p = f->path, *nm = t->name;
    if (!json_is_object(v)) return err_fail(err, err_len, "%s: tensor '%s': header entry is not a JSON object", p, nm);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"), *jo = json_object_get(v, "data_offsets");
    if (!json_is_string(jd)) return err_fail(err, err_len, "%s: tensor '%s': missing or non-string \"dtype\"", p, nm);
    if (st_dtype_parse(json_string_value(jd), &t->dtype) != 0)
        return err_fail(err, err_len, "%s: tensor '%s' has dtype '%s'; supported are BF16, F16, F32, I64, I32, BOOL",
                    p, nm, json_string_value(jd));
    if (!json_is_array(js)) return err_fail(err, err_len, "%s: tensor '%s': missing or non-array \"shape\"", p, nm);
    if (json_array_size(js) > ST_MAX_DIMS)
        return err_fail(err, err_len, "%s: tensor '%s' has %zu dimensions; at most %d are supported", p, nm,
                    json_array_size(js), ST_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    for (int i = 0; i < t->ndim; i++) {
        json_t *e = json_array_get(js, (size_t)i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return err_fail(err, err_len, "%s: tensor '%s': shape entry %d is not a non-negative integer", p, nm, i);
        t->shape[i] = json_integer_value(e);
    }
    uint64_t need;
    char sh[160];
    if (shape_size(t->ndim, t->shape, t->dtype, &t->numel, &need) != 0)
        return err_fail(err, err_len, "%s: tensor '%s': shape %s overflows 64 bits", p, nm,
                    st_shape_str(sh, sizeof sh, t->ndim, t->shape));
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return err_fail(err, err_len, "%s: tensor '%s': \"data_offsets\" is not a pair of integers", p, nm);
    json_int_t b = json_integer_value(json_array_get(jo, 0)), e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < b)
        return err_fail(err, err_len, "%s: tensor '%s': data_offsets [%lld, %lld] are not an increasing pair of "
                    "non-negative offsets", p, nm, (long long)b, (long long)e);
    if ((uint64_t)(e - b) != need)
        return err_fail(err, err_len, "%s: tensor '%s': data_offsets [%lld, %lld] span %llu bytes, but shape %s of "
                    "%s needs %llu", p, nm, (long long)b, (long long)e, (unsigned long long)(e - b),
                    st_shape_str(sh, sizeof sh, t->ndim, t->shape), st_dtype_name(t->dtype),
                    (unsigned long long)need);
    if ((uint64_t)e > data_bytes)
        return err_fail(err, err_len, "%s: tensor '%s': data_offsets [%lld, %lld] end beyond the %llu-byte data "
                    "area (file truncated?)", p, nm, (long long)b, (long long)e, (unsigned long long)data_bytes);
    t->nbytes = (size_t)need;
    t->offset = 8 + f->header_bytes + (uint64_t)b;
    t->data = (const char *)f->map + t->offset;
    return 0;
}

int st_open(struct st_file *f, const char *path, char *err, int err_len) {
    memset(f, 0, sizeof *f);
    json_t *root = NULL;
    const struct st_tensor **by_off = NULL;
    int fd = -1;
    f->path = strdup(path);
    if (!f->path) return err_fail(err, err_len, "%s: out of memory", path);

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { err_fail(err, err_len, "%s: cannot open: %s", path, strerror(errno)); goto bad; }
    struct stat sb;
    if (fstat(fd, &sb) != 0) { err_fail(err, err_len, "%s: fstat failed: %s", path, strerror(errno)); goto bad; }
    if (!S_ISREG(sb.st_mode)) { err_fail(err, err_len, "%s: not a regular file", path); goto bad; }
    f->file_bytes = (size_t)sb.st_size;
    if (f->file_bytes < 8) {
        err_fail(err, err_len, "%s: file is %zu bytes, too short for the 8-byte header length (truncated?)",
             path, f->file_bytes);
        goto bad;
    }
    f->map = mmap(NULL, f->file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        err_fail(err, err_len, "%s: mmap of %zu bytes failed: %s", path, f->file_bytes, strerror(errno));
        goto bad;
    }
    close(fd);
    fd = -1;

    const unsigned char *u = f->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | u[i];   /* little-endian regardless of host */
    f->header_bytes = n;
    if (n == 0) { err_fail(err, err_len, "%s: header length is 0 (not a safetensors file?)", path); goto bad; }
    if (n > f->file_bytes - 8) {
        err_fail(err, err_len, "%s: header length %llu goes beyond the end of the %zu-byte file (truncated, or not a "
             "safetensors file?)", path, (unsigned long long)n, f->file_bytes);
        goto bad;
    }
    if (n > ST_MAX_HEADER_BYTES) {
        err_fail(err, err_len, "%s: header length %llu exceeds the %u-byte limit", path, (unsigned long long)n,
             ST_MAX_HEADER_BYTES);
        goto bad;
    }
    if (u[8] != '{') { err_fail(err, err_len, "%s: header does not start with '{' (not a safetensors file?)", path); goto bad; }
    json_error_t je;
    root = json_loadb((const char *)u + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root) { err_fail(err, err_len, "%s: header is not valid JSON: %s (column %d)", path, je.text, je.column); goto bad; }
    if (!json_is_object(root)) { err_fail(err, err_len, "%s: header is not a JSON object", path); goto bad; }

    uint64_t data_bytes = f->file_bytes - 8 - n;
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) { err_fail(err, err_len, "%s: out of memory", path); goto bad; }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) { err_fail(err, err_len, "%s: __metadata__ is not a JSON object", path); goto bad; }
            size_t m = json_object_size(val);
            f->metadata = calloc(2 * m + 1, sizeof *f->metadata);
            if (!f->metadata) { err_fail(err, err_len, "%s: out of memory", path); goto bad; }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv) {
                if (!json_is_string(mv)) {
                    err_fail(err, err_len, "%s: __metadata__ value for '%s' is not a string", path, mk);
                    goto bad;
                }
                f->metadata[2 * f->n_metadata] = strdup(mk);
                f->metadata[2 * f->n_metadata + 1] = strdup(json_string_value(mv));
                f->n_metadata++;
                if (!f->metadata[2 * f->n_metadata - 2] || !f->metadata[2 * f->n_metadata - 1]) {
                    err_fail(err, err_len, "%s: out of memory", path);
                    goto bad;
                }
            }
            continue;
        }
        if (!name_ok(key)) {
            err_fail(err, err_len, "%s: tensor name '%.80s' is empty, too long or not printable ASCII", path, key);
            goto bad;
        }
        struct st_tensor *t = &f->tensors[f->n_tensors];
        t->name = strdup(key);
        t->path = f->path;
        if (!t->name) { err_fail(err, err_len, "%s: out of memory", path); goto bad; }
        f->n_tensors++;
        if (parse_entry(f, t, val, data_bytes, err, err_len) != 0) goto bad;
    }
    json_decref(root);
    root = NULL;

    qsort(f->tensors, (size_t)f->n_tensors, sizeof *f->tensors, cmp_tensor_name);
    /* Overlaps: sort by start; each non-empty tensor must start at or after the previous end. */
    by_off = malloc((size_t)(f->n_tensors ? f->n_tensors : 1) * sizeof *by_off);
    if (!by_off) { err_fail(err, err_len, "%s: out of memory", path); goto bad; }
    int m = 0;
    for (int i = 0; i < f->n_tensors; i++)
        if (f->tensors[i].nbytes) by_off[m++] = &f->tensors[i];
    qsort(by_off, (size_t)m, sizeof *by_off, cmp_tensor_ptr_offset);
    for (int i = 1; i < m; i++) {
        const struct st_tensor *a = by_off[i - 1], *b = by_off[i];
        if (b->offset < a->offset + a->nbytes) {
            err_fail(err, err_len, "%s: tensor '%s' (data_offsets [%llu, %llu]) overlaps tensor '%s' (data_offsets "
                 "[%llu, %llu])", path, b->name, (unsigned long long)(b->offset - 8 - n),
                 (unsigned long long)(b->offset - 8 - n + b->nbytes), a->name,
                 (unsigned long long)(a->offset - 8 - n), (unsigned long long)(a->offset - 8 - n + a->nbytes));
            goto bad;
        }
    }
    free(by_off);
    return 0;
bad:
    if (fd >= 0) close(fd);
    if (root) json_decref(root);
    free(by_off);
    st_close(f);
    return -1;
}

const struct st_tensor *st_find(const struct st_file *f, const char *name) {
    int lo = 0, hi = f->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

const char *st_metadata(const struct st_file *f, const char *key) {
    for (int i = 0; i < f->n_metadata; i++)
        if (strcmp(f->metadata[2 * i], key) == 0) return f->metadata[2 * i + 1];
    return NULL;
}

/* ---------------------------------------------------------------- writer */

struct st_wtensor {
    char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t nbytes;
};

struct st_writer {
    char *path, *tmp;
    int fd;
    int n, cap;
    struct st_wtensor *t;
    int *order;                   /* layout order: indices into t */
    int n_meta;
    char **meta;                  /* [2*n_meta] */
    int begun, finished;
    uint64_t data_bytes, written;
};

struct st_writer *st_writer_create(const char *path, char *err, int err_len) {
    struct st_writer *w = calloc(1, sizeof *w);
    if (!w) { err_fail(err, err_len, "%s: out of memory", path); return NULL; }
    w->fd = -1;
    size_t tl = strlen(path) + 32;
    w->path = strdup(path);
    w->tmp = malloc(tl);
    if (!w->path || !w->tmp) { err_fail(err, err_len, "%s: out of memory", path); st_writer_free(w); return NULL; }
    snprintf(w->tmp, tl, "%s.tmp.%d", path, (int)getpid());
    w->fd = fs_create_tmp(w->tmp);   /* private, O_EXCL | O_NOFOLLOW */
    if (w->fd < 0) {
        err_fail(err, err_len, "%s: cannot create: %s", w->tmp, strerror(errno));
        free(w->tmp);
        w->tmp = NULL;   /* nothing to unlink */
        st_writer_free(w);
        return NULL;
    }
    return w;
}

int st_writer_metadata(struct st_writer *w, const char *key, const char *value, char *err, int err_len) {
    if (w->begun) return err_fail(err, err_len, "%s: metadata '%s' added after the header was written", w->path, key);
    char **m = realloc(w->meta, (size_t)(2 * w->n_meta + 2) * sizeof *m);
    if (!m) return err_fail(err, err_len, "%s: out of memory", w->path);
    w->meta = m;
    m[2 * w->n_meta] = strdup(key);
    m[2 * w->n_meta + 1] = strdup(value);
    w->n_meta++;
    if (!m[2 * w->n_meta - 2] || !m[2 * w->n_meta - 1]) return err_fail(err, err_len, "%s: out of memory", w->path);
    return 0;
}

int st_writer_add(struct st_writer *w, const char *name, enum st_dtype dtype, int ndim, const int64_t *shape,
                  char *err, int err_len) {
    if (w->begun) return err_fail(err, err_len, "%s: tensor '%s' declared after the header was written", w->path, name);
    if (!name_ok(name) || strcmp(name, "__metadata__") == 0)
        return err_fail(err, err_len, "%s: tensor name '%.80s' is empty, reserved, too long or not printable ASCII",
                    w->path, name);
    if (st_dtype_size(dtype) == 0) return err_fail(err, err_len, "%s: tensor '%s': invalid dtype %d", w->path, name, (int)dtype);
    if (ndim < 0 || ndim > ST_MAX_DIMS)
        return err_fail(err, err_len, "%s: tensor '%s': %d dimensions (0..%d allowed)", w->path, name, ndim, ST_MAX_DIMS);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0) return err_fail(err, err_len, "%s: tensor '%s' declared twice", w->path, name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        struct st_wtensor *t = realloc(w->t, (size_t)cap * sizeof *t);
        if (!t) return err_fail(err, err_len, "%s: out of memory", w->path);
        w->t = t;
        w->cap = cap;
    }
    struct st_wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    t->ndim = ndim;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i];
    int64_t numel;
    char sh[160];
    if (shape_size(ndim, t->shape, dtype, &numel, &t->nbytes) != 0)
        return err_fail(err, err_len, "%s: tensor '%s': shape %s has a negative entry or overflows", w->path, name,
                    st_shape_str(sh, sizeof sh, ndim, t->shape));
    t->name = strdup(name);
    if (!t->name) return err_fail(err, err_len, "%s: out of memory", w->path);
    w->n++;
    return 0;
}

/* Write all of buf, retrying on EINTR and short writes. */
static int write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len) {
        ssize_t r = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
        if (r < 0) {
            if (errno == EINTR) continue;   /* a signal (progress timer, SIGTERM) interrupted the write */
            return -1;
        }
        p += r;
        len -= (size_t)r;
    }
    return 0;
}

int st_writer_begin(struct st_writer *w, char *err, int err_len) {
    if (w->begun) return err_fail(err, err_len, "%s: header already written", w->path);
    w->order = malloc((size_t)(w->n ? w->n : 1) * sizeof *w->order);
    if (!w->order) return err_fail(err, err_len, "%s: out of memory", w->path);
    /* Stable layout: largest element size first, declaration order within a size. */
    int k = 0;
    for (size_t sz = 8; sz >= 1; sz /= 2)
        for (int i = 0; i < w->n; i++)
            if (st_dtype_size(w->t[i].dtype) == sz) w->order[k++] = i;

    json_t *root = json_object(), *meta = json_object();
    int bad = !root || !meta;
    bad |= json_object_set_new(meta, "format", json_string("pt")) != 0;
    for (int i = 0; i < w->n_meta && !bad; i++)
        if (strcmp(w->meta[2 * i], "format") != 0)
            bad |= json_object_set_new(meta, w->meta[2 * i], json_string(w->meta[2 * i + 1])) != 0;
    if (!bad) {
        bad |= json_object_set_new(root, "__metadata__", meta) != 0;   /* steals meta either way */
        meta = NULL;
    }
    uint64_t off = 0;
    for (int j = 0; j < w->n && !bad; j++) {
        struct st_wtensor *t = &w->t[w->order[j]];
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        bad |= !e || !shape || !offs;
        for (int d = 0; d < t->ndim && !bad; d++) bad |= json_array_append_new(shape, json_integer(t->shape[d])) != 0;
        if (!bad) {
            bad |= json_array_append_new(offs, json_integer((json_int_t)off)) != 0;
            bad |= json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes))) != 0;
            bad |= json_object_set_new(e, "dtype", json_string(st_dtype_name(t->dtype))) != 0;
            bad |= json_object_set_new(e, "shape", shape) != 0;
            shape = NULL;
            bad |= json_object_set_new(e, "data_offsets", offs) != 0;
            offs = NULL;
            bad |= json_object_set_new(root, t->name, e) != 0;
            e = NULL;
        }
        json_decref(e);
        json_decref(shape);
        json_decref(offs);
        off += t->nbytes;
    }
    char *text = bad ? NULL : json_dumps(root, JSON_COMPACT);
    json_decref(root);
    json_decref(meta);
    if (!text) return err_fail(err, err_len, "%s: could not encode the header (out of memory?)", w->path);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;   /* keep the data area 8-byte aligned */
    char *hdr = malloc(8 + padded);
    if (!hdr) { free(text); return err_fail(err, err_len, "%s: out of memory", w->path); }
    for (int i = 0; i < 8; i++) hdr[i] = (char)((uint64_t)padded >> (8 * i));
    memcpy(hdr + 8, text, len);
    memset(hdr + 8 + len, ' ', padded - len);
    free(text);
    int r = write_all(w->fd, hdr, 8 + padded);
    free(hdr);
    if (r != 0) return err_fail(err, err_len, "%s: write failed: %s", w->tmp, strerror(errno));
    w->data_bytes = off;
    w->begun = 1;
    return 0;
}

int st_writer_count(const struct st_writer *w) { return w->n; }

int st_writer_order(const struct st_writer *w, int k, const char **name, size_t *nbytes) {
    if (!w->begun || k < 0 || k >= w->n) return -1;
    const struct st_wtensor *t = &w->t[w->order[k]];
    if (name) *name = t->name;
    if (nbytes) *nbytes = (size_t)t->nbytes;
    return w->order[k];
}

int st_writer_write(struct st_writer *w, const void *data, size_t len, char *err, int err_len) {
    if (!w->begun) return err_fail(err, err_len, "%s: data written before st_writer_begin", w->path);
    if (len > w->data_bytes - w->written)
        return err_fail(err, err_len, "%s: %zu more bytes written than the %llu declared", w->path,
                    (size_t)(len - (w->data_bytes - w->written)), (unsigned long long)w->data_bytes);
    if (write_all(w->fd, data, len) != 0) return err_fail(err, err_len, "%s: write failed: %s", w->tmp, strerror(errno));
    w->written += len;
    return 0;
}

int st_writer_finish(struct st_writer *w, char *err, int err_len) {
    if (!w->begun) return err_fail(err, err_len, "%s: finished before st_writer_begin", w->path);
    if (w->written != w->data_bytes)
        return err_fail(err, err_len, "%s: only %llu of %llu declared data bytes were written", w->path,
                    (unsigned long long)w->written, (unsigned long long)w->data_bytes);
    if (fsync(w->fd) != 0) return err_fail(err, err_len, "%s: fsync failed: %s", w->tmp, strerror(errno));
    if (close(w->fd) != 0) { w->fd = -1; return err_fail(err, err_len, "%s: close failed: %s", w->tmp, strerror(errno)); }
    w->fd = -1;
    if (rename(w->tmp, w->path) != 0)
        return err_fail(err, err_len, "rename %s -> %s failed: %s", w->tmp, w->path, strerror(errno));
    w->finished = 1;
    char ignored[256];   /* make the rename durable; best effort, the data itself is already synced */
    (void)fs_fsync_parent(w->path, ignored, sizeof ignored);
    return 0;
}

void st_writer_free(struct st_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (!w->finished && w->tmp) unlink(w->tmp);
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    for (int i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
    free(w->meta);
    free(w->t);
    free(w->order);
    free(w->path);
    free(w->tmp);
    free(w);
}

int st_write_file(const char *path, int n, const struct st_write_tensor *t, char *err, int err_len) {
    struct st_writer *w = st_writer_create(path, err, err_len);
    if (!w) return -1;
    int r = 0;
    for (int i = 0; i < n && r == 0; i++) r = st_writer_add(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, err, err_len);
    if (r == 0) r = st_writer_begin(w, err, err_len);
    for (int k = 0; k < n && r == 0; k++) {
        size_t nb = 0;
        int i = st_writer_order(w, k, NULL, &nb);
        if (nb && !t[i].data) r = err_fail(err, err_len, "%s: tensor '%s' has no data", path, t[i].name);
        else r = st_writer_write(w, t[i].data, nb, err, err_len);
    }
    if (r == 0) r = st_writer_finish(w, err, err_len);
    st_writer_free(w);
    return r;
}

/* ---------------------------------------------------------------- checkpoint directories */

static int cmp_tensor_pp_name(const void *a, const void *b) {
    return strcmp((*(const struct st_tensor *const *)a)->name, (*(const struct st_tensor *const *)b)->name);
}

void hf_weights_close(struct hf_weights *w) {
    if (!w) return;
    for (int i = 0; i < w->n_files; i++) st_close(&w->files[i]);
    free(w->files);
    free(w->tensors);
    free(w->dir);
    free(w->index_path);
    memset(w, 0, sizeof *w);
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int open_single(struct hf_weights *w, const char *file, char *err, int err_len) {
    w->files = calloc(1, sizeof *w->files);
    if (!w->files) return err_fail(err, err_len, "%s: out of memory", file);
    if (st_open(&w->files[0], file, err, err_len) != 0) return -1;
    w->n_files = 1;
    const struct st_file *f = &w->files[0];
    w->tensors = malloc((size_t)(f->n_tensors ? f->n_tensors : 1) * sizeof *w->tensors);
    if (!w->tensors) return err_fail(err, err_len, "%s: out of memory", file);
    for (int i = 0; i < f->n_tensors; i++) w->tensors[i] = &f->tensors[i];   /* already sorted by name */
    w->n_tensors = f->n_tensors;
    return 0;
}

static int open_index(struct hf_weights *w, char *err, int err_len) {
    const char *ip = w->index_path;
    json_error_t je;
    json_t *root = json_load_file(ip, JSON_REJECT_DUPLICATES, &je);
    int r = -1;
    const char **shard_of_file = NULL;
    if (!root) return err_fail(err, err_len, "%s: not valid JSON: %s (line %d)", ip, je.text, je.line);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map)) { err_fail(err, err_len, "%s: missing or non-object \"weight_map\"", ip); goto out; }
    size_t n = json_object_size(map);
    w->files = calloc(n ? n : 1, sizeof *w->files);
    shard_of_file = calloc(n ? n : 1, sizeof *shard_of_file);
    w->tensors = calloc(n ? n : 1, sizeof *w->tensors);
    if (!w->files || !shard_of_file || !w->tensors) { err_fail(err, err_len, "%s: out of memory", ip); goto out; }
    const char *name;
    json_t *v;
    json_object_foreach(map, name, v) {
        if (!json_is_string(v)) { err_fail(err, err_len, "%s: weight_map entry for tensor '%s' is not a string", ip, name); goto out; }
        const char *shard = json_string_value(v);
        if (!*shard || strchr(shard, '/') || strcmp(shard, "..") == 0 || strcmp(shard, ".") == 0) {
            err_fail(err, err_len, "%s: tensor '%s' maps to shard '%s', which is not a plain file name", ip, name, shard);
            goto out;
        }
        int k;
        for (k = 0; k < w->n_files; k++)
            if (strcmp(shard_of_file[k], shard) == 0) break;
        if (k == w->n_files) {   /* first tensor of a new shard: open it */
            char *p = join(w->dir, shard);
            if (!p) { err_fail(err, err_len, "%s: out of memory", ip); goto out; }
            char e2[1024];
            int rr = st_open(&w->files[k], p, e2, sizeof e2);
            free(p);
            if (rr != 0) {
                err_fail(err, err_len, "%s (shard of tensor '%s' in %s)", e2, name, ip);
                goto out;
            }
            shard_of_file[k] = shard;
            w->n_files++;
        }
        const struct st_tensor *t = st_find(&w->files[k], name);
        if (!t) {
            err_fail(err, err_len, "%s: no tensor '%s', although %s places it there", w->files[k].path, name, ip);
            goto out;
        }
        w->tensors[w->n_tensors++] = t;
    }
    qsort(w->tensors, (size_t)w->n_tensors, sizeof *w->tensors, cmp_tensor_pp_name);
    r = 0;
out:
    free(shard_of_file);
    json_decref(root);
    return r;
}

int hf_weights_open(struct hf_weights *w, const char *path, char *err, int err_len) {
    memset(w, 0, sizeof *w);
    struct stat sb;
    if (stat(path, &sb) != 0) return err_fail(err, err_len, "%s: cannot open checkpoint: %s", path, strerror(errno));
    int r;
    if (S_ISREG(sb.st_mode)) {
        char *c = strdup(path);
        w->dir = c ? strdup(dirname(c)) : NULL;
        free(c);
        if (!w->dir) return err_fail(err, err_len, "%s: out of memory", path);
        r = open_single(w, path, err, err_len);
    } else if (S_ISDIR(sb.st_mode)) {
        w->dir = strdup(path);
        char *ip = join(path, "model.safetensors.index.json"), *sp = join(path, "model.safetensors");
        if (!w->dir || !ip || !sp) { free(ip); free(sp); hf_weights_close(w); return err_fail(err, err_len, "%s: out of memory", path); }
        if (access(sp, F_OK) == 0) {   /* transformers' order: the single file wins over an index */
            free(ip);
            r = open_single(w, sp, err, err_len);
        } else if (access(ip, F_OK) == 0) {
            w->index_path = ip;
            r = open_index(w, err, err_len);
        } else {
            free(ip);
            r = err_fail(err, err_len, "%s: neither model.safetensors nor model.safetensors.index.json is there", path);
        }
        free(sp);
    } else {
        r = err_fail(err, err_len, "%s: neither a directory nor a regular file", path);
    }
    if (r != 0) hf_weights_close(w);
    return r;
}

const struct st_tensor *hf_weights_find(const struct hf_weights *w, const char *name) {
    int lo = 0, hi = w->n_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(w->tensors[mid]->name, name);
        if (c == 0) return w->tensors[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

int hf_weights_get(const struct hf_weights *w, const char *name, const struct st_tensor **out, char *err, int err_len) {
    *out = hf_weights_find(w, name);
    if (*out) return 0;
    return err_fail(err, err_len, "%s: no tensor '%s'", w->index_path ? w->index_path
                : w->n_files ? w->files[0].path : w->dir ? w->dir : "(closed checkpoint)", name);
}
