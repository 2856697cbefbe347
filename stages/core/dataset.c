/*
 * stages/core/dataset.c — JSONL loading (jansson), the indexed format's writer and its mmap
 * reader with validation (dataset.h).
 *
 * The JSONL loader appends each sample's tokens straight into growing arrays and rolls them back
 * if the sample turns out bad, so a skipped sample leaves no trace. Every message names the file
 * and the 1-based line. The index is written section by section through one buffered fd to a
 * temporary name and renamed into place; the reader trusts nothing in the file before checking it.
 */
#include "core/dataset.h"
#include "core/fsutil.h"
#include "core/err.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- hash */

uint64_t dataset_hash64(const void *data, size_t n, uint64_t seed) {
    const unsigned char *p = data;
    uint64_t h = seed ^ 0x243F6A8885A308D3ull ^ (n * 0x9E3779B97F4A7C15ull);
    /* Each step is a bijection of h for a fixed word (xor, odd multiply, xorshift), so changing
     * any one word changes every later state and the result. */
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, p + i, n - i);
        h = (h ^ w ^ 0xFFull << 56) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
    }
    h = (h ^ (h >> 31)) * 0x94D049BB133111EBull;
    return h ^ (h >> 32);
}

static uint64_t data_hash(const struct dataset *ds) {
    uint64_t h = dataset_hash64(ds->offsets, 8 * (ds->n_rows + 1), 1);
    h = dataset_hash64(ds->first_loss, 4 * ds->n_rows, h);
    h = dataset_hash64(ds->tokens, 4 * ds->n_tokens, h);
    return dataset_hash64(ds->loss_mask, ds->n_tokens, h);
}

/* ---------------------------------------------------------------- SIGBUS guard
 *
 * An index is memory-mapped; if someone truncates the file while a stage reads it, the next
 * read of a page past the new end raises SIGBUS. That cannot be turned into an error return, but
 * it must not be silent: the handler writes one line naming the file, then lets the signal kill
 * the process as before (default action), so the supervisor sees a crash, restarts the stage,
 * and the restart reports "truncated index" at open. Faults outside our mappings are passed to
 * the previous handler / default action untouched. */
#define GUARD_MAX 16
static struct { void *_Atomic addr; size_t len; char line[600]; size_t line_len; } g_guard[GUARD_MAX];
static struct sigaction g_prev_bus;
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_guard_installed;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    for (int i = 0; i < GUARD_MAX; i++) {
        char *a = atomic_load(&g_guard[i].addr);
        if (a && (char *)si->si_addr >= a && (char *)si->si_addr < a + g_guard[i].len) {
            ssize_t w = write(2, g_guard[i].line, g_guard[i].line_len);
            (void)w;
            signal(SIGBUS, SIG_DFL);   /* returning re-runs the faulting read: it dies of SIGBUS now */
            return;
        }
    }
    if (g_prev_bus.sa_flags & SA_SIGINFO) { if (g_prev_bus.sa_sigaction) g_prev_bus.sa_sigaction(sig, si, uc); return; }
    if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN && g_prev_bus.sa_handler) { g_prev_bus.sa_handler(sig); return; }
    signal(SIGBUS, SIG_DFL);
}

static int guard_mapping(void *addr, size_t len, const char *path) {
    int rc = 0;
    pthread_mutex_lock(&g_guard_mu);
    if (!g_guard_installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &g_prev_bus) != 0) rc = -1;
        else g_guard_installed = 1;
    }
    for (int i = 0; rc == 0 && i < GUARD_MAX; i++) {
        if (atomic_load(&g_guard[i].addr)) continue;
        g_guard[i].len = len;
        int n = snprintf(g_guard[i].line, sizeof g_guard[i].line,
                         "dataset: SIGBUS reading %s: the index file was truncated or replaced in place while this process had it "
                         "mapped (never rewrite an index a running stage uses; write a new file and rename it)\n", path);
        g_guard[i].line_len = n < 0 ? 0 : (size_t)n >= sizeof g_guard[i].line ? sizeof g_guard[i].line - 1 : (size_t)n;
        atomic_store(&g_guard[i].addr, addr);
        break;   /* more than GUARD_MAX open indexes: the rest just die silently, as before */
    }
    pthread_mutex_unlock(&g_guard_mu);
    return rc;
}

static void unguard_mapping(void *addr) {
    pthread_mutex_lock(&g_guard_mu);
    for (int i = 0; i < GUARD_MAX; i++)
        if (atomic_load(&g_guard[i].addr) == addr) atomic_store(&g_guard[i].addr, NULL);
    pthread_mutex_unlock(&g_guard_mu);
}

void dataset_free(struct dataset *ds) {
    if (ds->map_) { unguard_mapping(ds->map_); munmap(ds->map_, ds->map_bytes_); }
    for (int i = 0; i < 4; i++) free(ds->own_[i]);
    memset(ds, 0, sizeof *ds);
}

/* ---------------------------------------------------------------- JSONL */

struct grow { void *p; size_t n, cap, esize; };

static int grow_reserve(struct grow *g, size_t more) {
    if (g->n + more <= g->cap) return 0;
    size_t cap = g->cap ? g->cap : 4096;
    while (cap < g->n + more) cap *= 2;
    void *p = realloc(g->p, cap * g->esize);
    if (!p) return -1;
    g->p = p;
    g->cap = cap;
    return 0;
}

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown type";
}

/* Parse one sample into the growing arrays. Returns 0 (appended), or -1 with "FILE:LINE..." in msg
 * (the arrays are then as before). */
static int parse_sample(const char *path, uint64_t lineno, const char *line, size_t len, int64_t vocab_size,
                        struct grow *tok, struct grow *loss, uint32_t *first_loss, char *msg, int msg_len) {
    json_error_t je;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return err_fail(msg, msg_len, "%s:%llu:%d: malformed JSON: %s", path, (unsigned long long)lineno, je.column, je.text);
    int rc = -1;
    size_t n0 = tok->n;
    if (!json_is_object(root)) {
        err_fail(msg, msg_len, "%s:%llu: expected a JSON object, found %s", path, (unsigned long long)lineno, json_type_name(root));
        goto out;
    }
    json_t *ids = json_object_get(root, "input_ids"), *lm = json_object_get(root, "loss_mask");
    const char *missing = !ids ? "input_ids" : !lm ? "loss_mask" : NULL;
    if (missing) {
        err_fail(msg, msg_len, "%s:%llu: missing key '%s'", path, (unsigned long long)lineno, missing);
        goto out;
    }
    if (!json_is_array(ids) || !json_is_array(lm)) {
        const char *k = !json_is_array(ids) ? "input_ids" : "loss_mask";
        err_fail(msg, msg_len, "%s:%llu: '%s' is %s, expected an array", path, (unsigned long long)lineno, k,
             json_type_name(json_object_get(root, k)));
        goto out;
    }
    size_t n = json_array_size(ids), nm = json_array_size(lm);
    if (n != nm) {
        err_fail(msg, msg_len, "%s:%llu: input_ids has %zu tokens but loss_mask has %zu", path, (unsigned long long)lineno, n, nm);
        goto out;
    }
    if (n == 0) {
        err_fail(msg, msg_len, "%s:%llu: empty sample (input_ids and loss_mask are [])", path, (unsigned long long)lineno);
        goto out;
    }
    if (n > DATASET_MAX_ROW_TOKENS) {
        err_fail(msg, msg_len, "%s:%llu: sample of %zu tokens is longer than %u", path, (unsigned long long)lineno, n,
             DATASET_MAX_ROW_TOKENS);
        goto out;
    }
    if (grow_reserve(tok, n) || grow_reserve(loss, n)) {
        err_fail(msg, msg_len, "%s:%llu: out of memory loading %zu more tokens", path, (unsigned long long)lineno, n);
        goto out;
    }
    int32_t *t = (int32_t *)tok->p + tok->n;
    uint8_t *m = (uint8_t *)loss->p + loss->n;
    uint32_t first = (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v)) {
            err_fail(msg, msg_len, "%s:%llu: input_ids[%zu] is %s, expected an integer", path, (unsigned long long)lineno, i,
                 json_type_name(v));
            goto out;
        }
        json_int_t x = json_integer_value(v);
        if (x < 0) {
            err_fail(msg, msg_len, "%s:%llu: input_ids[%zu] = %lld is negative", path, (unsigned long long)lineno, i, (long long)x);
            goto out;
        }
        if (vocab_size > 0 && x >= vocab_size) {
            err_fail(msg, msg_len, "%s:%llu: input_ids[%zu] = %lld is >= --vocab-size %lld", path, (unsigned long long)lineno, i,
                 (long long)x, (long long)vocab_size);
            goto out;
        }
        if (x > INT32_MAX) {
            err_fail(msg, msg_len, "%s:%llu: input_ids[%zu] = %lld does not fit in int32", path, (unsigned long long)lineno, i,
                 (long long)x);
            goto out;
        }
        t[i] = (int32_t)x;
        json_t *b = json_array_get(lm, i);
        long long mv;
        if (json_is_integer(b)) mv = json_integer_value(b);
        else if (json_is_boolean(b)) mv = json_is_true(b);
        else {
            err_fail(msg, msg_len, "%s:%llu: loss_mask[%zu] is %s, expected 0 or 1", path, (unsigned long long)lineno, i,
                 json_type_name(b));
            goto out;
        }
        if (mv != 0 && mv != 1) {
            err_fail(msg, msg_len, "%s:%llu: loss_mask[%zu] = %lld, expected 0 or 1", path, (unsigned long long)lineno, i, mv);
            goto out;
        }
        m[i] = (uint8_t)mv;
        if (mv && first == n) first = (uint32_t)i;
    }
    tok->n += n;
    loss->n += n;
    *first_loss = first;
    rc = 0;
out:
    if (rc) tok->n = loss->n = n0;
    json_decref(root);
    return rc;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

int dataset_load_jsonl(struct dataset *ds, const char *path, const struct dataset_load_opts *o,
                       struct dataset_load_stats *st, char *err, int err_len) {
    static const struct dataset_load_opts dflt = {0, 0, NULL, NULL};
    struct dataset_load_stats local;
    if (!o) o = &dflt;
    if (!st) st = &local;
    memset(st, 0, sizeof *st);
    memset(ds, 0, sizeof *ds);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) return err_fail(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    struct grow tok = {NULL, 0, 0, 4}, loss = {NULL, 0, 0, 1}, offs = {NULL, 0, 0, 8}, first = {NULL, 0, 0, 4};
    char *line = NULL, msg[1024];
    size_t line_cap = 0;
    ssize_t n;
    int rc = -1;
    if (grow_reserve(&offs, 1)) { err_fail(err, err_len, "%s: out of memory", path); goto out; }
    ((uint64_t *)offs.p)[offs.n++] = 0;
    errno = 0;
    while ((n = getline(&line, &line_cap, f)) >= 0) {
        st->lines++;
        if (is_blank(line, (size_t)n)) continue;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) n--;   /* so JSON columns refer to this line */
        uint32_t fl = 0;
        if (grow_reserve(&offs, 1) || grow_reserve(&first, 1)) { err_fail(err, err_len, "%s: out of memory", path); goto out; }
        const char *nul = memchr(line, 0, (size_t)n);
        int bad = nul != NULL;
        if (nul) /* jansson would stop at it or skip it: a NUL is never valid JSON text */
            err_fail(msg, sizeof msg, "%s:%llu:%lld: malformed JSON: a NUL byte inside the line", path, (unsigned long long)st->lines,
                     (long long)(nul - line) + 1);
        else bad = parse_sample(path, st->lines, line, (size_t)n, o->vocab_size, &tok, &loss, &fl, msg, sizeof msg);
        if (bad) {
            if (!o->skip_bad) { err_fail(err, err_len, "%s", msg); goto out; }
            st->skipped_bad++;
            if (o->on_bad) o->on_bad(o->ctx, msg);
            continue;
        }
        ((uint64_t *)offs.p)[offs.n++] = tok.n;
        ((uint32_t *)first.p)[first.n++] = fl;
        st->rows++;
    }
    if (ferror(f)) { err_fail(err, err_len, "%s: read error after line %llu: %s", path, (unsigned long long)st->lines, strerror(errno)); goto out; }
    ds->n_rows = st->rows;
    ds->n_tokens = tok.n;
    ds->offsets = offs.p;
    ds->first_loss = first.p;
    ds->tokens = tok.p;
    ds->loss_mask = loss.p;
    ds->own_[0] = offs.p;
    ds->own_[1] = first.p;
    ds->own_[2] = tok.p;
    ds->own_[3] = loss.p;
    offs.p = first.p = tok.p = loss.p = NULL;
    int32_t mx = -1;
    for (uint64_t i = 0; i < ds->n_tokens; i++) mx = ds->tokens[i] > mx ? ds->tokens[i] : mx;
    ds->max_token_id = mx;
    ds->data_hash = data_hash(ds);
    rc = 0;
out:
    free(line);
    free(tok.p);
    free(loss.p);
    free(offs.p);
    free(first.p);
    fclose(f);
    return rc;
}

/* ---------------------------------------------------------------- index writer */

static uint64_t align_up(uint64_t x) { return (x + DATASET_INDEX_ALIGN - 1) / DATASET_INDEX_ALIGN * DATASET_INDEX_ALIGN; }

static void layout(struct dataset_index_header *h, uint64_t n_rows, uint64_t n_tokens) {
    h->off_offsets = DATASET_INDEX_HEADER_BYTES;
    h->off_first = align_up(h->off_offsets + 8 * (n_rows + 1));
    h->off_tokens = align_up(h->off_first + 4 * n_rows);
    h->off_loss = align_up(h->off_tokens + 4 * n_tokens);
    h->file_bytes = h->off_loss + n_tokens;
}

static uint64_t header_hash(const struct dataset_index_header *h) {
    return dataset_hash64(h, offsetof(struct dataset_index_header, header_hash), 7);
}

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR) continue;   /* a signal handler ran; the write did not happen */
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write `bytes` of data at the file position `at`, zero-padding from *pos first. */
static int write_section(int fd, uint64_t *pos, uint64_t at, const void *data, uint64_t bytes) {
    static const char zeros[4096];
    while (*pos < at) {
        uint64_t k = at - *pos > sizeof zeros ? sizeof zeros : at - *pos;
        if (write_all(fd, zeros, k)) return -1;
        *pos += k;
    }
    if (write_all(fd, data, bytes)) return -1;
    *pos += bytes;
    return 0;
}

int dataset_write_index(const struct dataset *ds, const char *path, char *err, int err_len) {
    char tmp[PATH_MAX + 32], dir[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return err_fail(err, err_len, "%s: path too long", path);
    char hdr[DATASET_INDEX_HEADER_BYTES];
    memset(hdr, 0, sizeof hdr);
    struct dataset_index_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, DATASET_INDEX_MAGIC, 8);
    h.version = DATASET_INDEX_VERSION;
    h.header_bytes = DATASET_INDEX_HEADER_BYTES;
    h.n_rows = ds->n_rows;
    h.n_tokens = ds->n_tokens;
    layout(&h, ds->n_rows, ds->n_tokens);
    h.max_token_id = ds->max_token_id;
    h.data_hash = data_hash(ds);   /* recomputed: never trust a caller-built struct's field */
    h.header_hash = header_hash(&h);
    memcpy(hdr, &h, sizeof h);
    int fd = fs_create_tmp(tmp);   /* private, O_EXCL | O_NOFOLLOW */
    if (fd < 0) return err_fail(err, err_len, "%s: open for writing failed: %s", tmp, strerror(errno));
    uint64_t pos = 0;
    if (write_section(fd, &pos, 0, hdr, sizeof hdr) ||
        write_section(fd, &pos, h.off_offsets, ds->offsets, 8 * (ds->n_rows + 1)) ||
        write_section(fd, &pos, h.off_first, ds->first_loss, 4 * ds->n_rows) ||
        write_section(fd, &pos, h.off_tokens, ds->tokens, 4 * ds->n_tokens) ||
        write_section(fd, &pos, h.off_loss, ds->loss_mask, ds->n_tokens)) {
        err_fail(err, err_len, "%s: write failed: %s", tmp, strerror(errno));
        goto bad;
    }
    if (fsync(fd)) { err_fail(err, err_len, "%s: fsync failed: %s", tmp, strerror(errno)); goto bad; }
    if (close(fd)) { fd = -1; err_fail(err, err_len, "%s: close failed: %s", tmp, strerror(errno)); goto bad; }
    fd = -1;
    if (rename(tmp, path)) { err_fail(err, err_len, "rename %s -> %s failed: %s", tmp, path, strerror(errno)); goto bad; }
    /* the rename is durable once the directory is synced; a failure here loses nothing now */
    (void)fs_fsync_parent(path, dir, sizeof dir);
    return 0;
bad:
    if (fd >= 0) close(fd);
    unlink(tmp);
    return -1;
}

/* ---------------------------------------------------------------- index reader */

static int check_section(const char *path, const char *name, uint64_t off, uint64_t bytes, uint64_t prev_end,
                         uint64_t file_bytes, char *err, int err_len) {
    if (off % DATASET_INDEX_ALIGN || off < prev_end || off > file_bytes || bytes > file_bytes - off)
        return err_fail(err, err_len, "%s: corrupt index: section '%s' at [%llu, +%llu) does not fit after byte %llu of a %llu-byte file",
                    path, name, (unsigned long long)off, (unsigned long long)bytes, (unsigned long long)prev_end,
                    (unsigned long long)file_bytes);
    return 0;
}

/* Token range, mask values and the `first` table: run on every open, whatever verify says,
 * because later stages index embeddings with these ids and trust the mask (O(n_tokens), about
 * 1 GB/s). The hash is only checked with verify. */
static int check_values(const struct dataset *ds, const struct dataset_index_header *h, char *err, int err_len) {
    const char *path = ds->path;
    for (uint64_t r = 0; r < ds->n_rows; r++) {
        uint64_t lo = ds->offsets[r], hi = ds->offsets[r + 1];
        uint32_t first = (uint32_t)(hi - lo);
        for (uint64_t i = lo; i < hi; i++) {
            if (ds->tokens[i] < 0 || ds->tokens[i] > h->max_token_id)
                return err_fail(err, err_len, "%s: corrupt index: row %llu token %llu = %d is outside [0, %d]", path,
                            (unsigned long long)r, (unsigned long long)(i - lo), ds->tokens[i], h->max_token_id);
            if (ds->loss_mask[i] > 1)
                return err_fail(err, err_len, "%s: corrupt index: row %llu loss_mask[%llu] = %u", path, (unsigned long long)r,
                            (unsigned long long)(i - lo), ds->loss_mask[i]);
            if (ds->loss_mask[i] && first == hi - lo) first = (uint32_t)(i - lo);
        }
        if (ds->first_loss[r] != first)
            return err_fail(err, err_len, "%s: corrupt index: row %llu first supervised token %u, table says %u", path,
                        (unsigned long long)r, first, ds->first_loss[r]);
    }
    return 0;
}

int dataset_open_index(struct dataset *ds, const char *path, int verify, char *err, int err_len) {
    memset(ds, 0, sizeof *ds);
    snprintf(ds->path, sizeof ds->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_fail(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb)) { close(fd); return err_fail(err, err_len, "%s: fstat failed: %s", path, strerror(errno)); }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < DATASET_INDEX_HEADER_BYTES) {
        close(fd);
        return err_fail(err, err_len, "%s: truncated index: %llu bytes, smaller than the %u-byte header", path,
                    (unsigned long long)size, DATASET_INDEX_HEADER_BYTES);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return err_fail(err, err_len, "%s: mmap of %llu bytes failed: %s", path, (unsigned long long)size, strerror(errno));
    ds->map_ = map;
    ds->map_bytes_ = size;
    ds->is_index = 1;
    struct dataset_index_header h;
    memcpy(&h, map, sizeof h);
    if (memcmp(h.magic, DATASET_INDEX_MAGIC, 8)) {
        err_fail(err, err_len, "%s: not a dflash index (bad magic; expected the file `dflash-pack --index` writes)", path);
        goto bad;
    }
    if (h.version != DATASET_INDEX_VERSION) {
        err_fail(err, err_len, "%s: index version %u, this build reads version %u (rebuild the index with this dflash-pack)", path,
             h.version, DATASET_INDEX_VERSION);
        goto bad;
    }
    if (h.header_bytes != DATASET_INDEX_HEADER_BYTES || header_hash(&h) != h.header_hash) {
        err_fail(err, err_len, "%s: corrupt index: the header hash does not match (header bytes %u)", path, h.header_bytes);
        goto bad;
    }
    if (h.file_bytes != size) {
        err_fail(err, err_len, "%s: %s index: the header says %llu bytes, the file has %llu", path,
             size < h.file_bytes ? "truncated" : "oversized", (unsigned long long)h.file_bytes, (unsigned long long)size);
        goto bad;
    }
    if (h.n_rows > size / 8 || h.n_tokens > size) {
        err_fail(err, err_len, "%s: corrupt index: %llu rows / %llu tokens cannot fit in %llu bytes", path,
             (unsigned long long)h.n_rows, (unsigned long long)h.n_tokens, (unsigned long long)size);
        goto bad;
    }
    if (check_section(path, "offsets", h.off_offsets, 8 * (h.n_rows + 1), DATASET_INDEX_HEADER_BYTES, size, err, err_len) ||
        check_section(path, "first", h.off_first, 4 * h.n_rows, h.off_offsets + 8 * (h.n_rows + 1), size, err, err_len) ||
        check_section(path, "tokens", h.off_tokens, 4 * h.n_tokens, h.off_first + 4 * h.n_rows, size, err, err_len) ||
        check_section(path, "loss", h.off_loss, h.n_tokens, h.off_tokens + 4 * h.n_tokens, size, err, err_len))
        goto bad;
    const char *base = map;
    ds->n_rows = h.n_rows;
    ds->n_tokens = h.n_tokens;
    ds->offsets = (const uint64_t *)(const void *)(base + h.off_offsets);
    ds->first_loss = (const uint32_t *)(const void *)(base + h.off_first);
    ds->tokens = (const int32_t *)(const void *)(base + h.off_tokens);
    ds->loss_mask = (const uint8_t *)(base + h.off_loss);
    ds->max_token_id = h.max_token_id;
    ds->data_hash = h.data_hash;
    if (ds->offsets[0] != 0 || ds->offsets[h.n_rows] != h.n_tokens) {
        err_fail(err, err_len, "%s: corrupt index: offsets run from %llu to %llu, expected 0 to %llu", path,
             (unsigned long long)ds->offsets[0], (unsigned long long)ds->offsets[h.n_rows], (unsigned long long)h.n_tokens);
        goto bad;
    }
    for (uint64_t r = 0; r < h.n_rows; r++) {
        uint64_t len = ds->offsets[r + 1] - ds->offsets[r];
        if (ds->offsets[r + 1] <= ds->offsets[r] || ds->offsets[r + 1] > h.n_tokens || len > DATASET_MAX_ROW_TOKENS ||
            ds->first_loss[r] > len) {
            err_fail(err, err_len, "%s: corrupt index: row %llu has offsets [%llu, %llu) and first supervised token %u", path,
                 (unsigned long long)r, (unsigned long long)ds->offsets[r], (unsigned long long)ds->offsets[r + 1],
                 ds->first_loss[r]);
            goto bad;
        }
    }
    if (check_values(ds, &h, err, err_len)) goto bad;
    if (verify && data_hash(ds) != h.data_hash) {
        err_fail(err, err_len, "%s: corrupt index: the data hash does not match the header (the file was modified or damaged)", path);
        goto bad;
    }
    if (guard_mapping(map, size, path) != 0) {
        err_fail(err, err_len, "%s: cannot install the SIGBUS guard: %s", path, strerror(errno));
        goto bad;
    }
    return 0;
bad:
    dataset_free(ds);
    return -1;
}

int dataset_check_vocab(const struct dataset *ds, int64_t vocab_size, char *err, int err_len) {
    if (vocab_size <= 0 || ds->max_token_id < vocab_size) return 0;
    for (uint64_t r = 0; r < ds->n_rows; r++)
        for (uint64_t i = ds->offsets[r]; i < ds->offsets[r + 1]; i++)
            if (ds->tokens[i] >= vocab_size)
                return err_fail(err, err_len, "%s: row %llu: input_ids[%llu] = %d is >= --vocab-size %lld", ds->path,
                            (unsigned long long)r, (unsigned long long)(i - ds->offsets[r]), ds->tokens[i], (long long)vocab_size);
    return err_fail(err, err_len, "%s: the header says token id %d, which is >= --vocab-size %lld, but no row holds it", ds->path,
                ds->max_token_id, (long long)vocab_size);
}

int dataset_open(struct dataset *ds, const char *path, const struct dataset_load_opts *o, struct dataset_load_stats *st,
                 int verify, char *err, int err_len) {
    char magic[16] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return err_fail(err, err_len, "%s: cannot open: %s", path, strerror(errno));
    size_t got = fread(magic, 1, sizeof magic, f);
    fclose(f);
    /* An index with a damaged magic ("DFLIDX" prefix, or a NUL byte in the first 16, where JSONL has text) goes
     * to the index reader, which says "bad magic", not to the JSON parser. */
    int binary = memchr(magic, 0, got) != NULL;
    if ((got >= 6 && !memcmp(magic, DATASET_INDEX_MAGIC, 6)) || binary) {
        if (dataset_open_index(ds, path, verify, err, err_len)) return -1;
        if (st) { memset(st, 0, sizeof *st); st->rows = ds->n_rows; }
        if (o && o->vocab_size > 0 && dataset_check_vocab(ds, o->vocab_size, err, err_len)) {
            dataset_free(ds);
            return -1;
        }
        return 0;
    }
    return dataset_load_jsonl(ds, path, o, st, err, err_len);
}
