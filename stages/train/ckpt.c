/*
 * stages/train/ckpt.c — checkpoint files, the checkpoint directory and the resume state file
 * (stages/train/ckpt.h). Streams tensors straight to and from the file (no whole-file buffer:
 * a drafter's weights and optimizer state are several GB).
 */
#include "train/ckpt.h"

#include "core/err.h"
#include "core/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

_Static_assert(sizeof(struct ckpt_header) <= CKPT_HEADER_BYTES, "ckpt header too large");
_Static_assert(sizeof(struct ckpt_record) == 16, "ckpt record must be 16 bytes");

#define CKPT_MAX_CONFIG_BYTES (64u << 20)
#define CKPT_MAX_RNG_BYTES (64u << 20)
#define CKPT_IO_CHUNK (4u << 20)

static uint64_t a8(uint64_t x) { return (x + 7) & ~(uint64_t)7; }

static size_t dtype_size(uint32_t dtype) {
    return dtype == CKPT_F32 ? 4 : dtype == CKPT_I64 ? 8 : dtype == CKPT_U8 ? 1 : 0;
}
static const char *dtype_name(uint32_t dtype) {
    return dtype == CKPT_F32 ? "f32" : dtype == CKPT_I64 ? "i64" : dtype == CKPT_U8 ? "u8" : "?";
}

/* ---------------------------------------------------------------- hash */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

void ckpt_hash_init(struct ckpt_hasher *s) { memset(s, 0, sizeof *s); s->h = FNV_OFFSET; }

static inline uint64_t fnv_word(uint64_t h, uint64_t w) { return (h ^ w) * FNV_PRIME; }

void ckpt_hash_update(struct ckpt_hasher *s, const void *data, size_t n) {
    const uint8_t *p = data;
    s->len += n;
    while (n > 0 && s->nbuf > 0 && s->nbuf < 8) { s->buf[s->nbuf++] = *p++; n--; }
    if (s->nbuf == 8) {
        uint64_t w; memcpy(&w, s->buf, 8);
        s->h = fnv_word(s->h, w);
        s->nbuf = 0;
    }
    uint64_t h = s->h;
    for (; n >= 8; n -= 8, p += 8) { uint64_t w; memcpy(&w, p, 8); h = fnv_word(h, w); }
    s->h = h;
    while (n > 0) { s->buf[s->nbuf++] = *p++; n--; }
}

uint64_t ckpt_hash_final(const struct ckpt_hasher *s) {
    uint64_t h = s->h;
    if (s->nbuf) {
        uint8_t t[8] = {0};
        memcpy(t, s->buf, (size_t)s->nbuf);
        uint64_t w; memcpy(&w, t, 8);
        h = fnv_word(h, w);
    }
    return fnv_word(h, s->len);
}

uint64_t ckpt_hash(const void *data, size_t n) {
    struct ckpt_hasher s;
    ckpt_hash_init(&s);
    ckpt_hash_update(&s, data, n);
    return ckpt_hash_final(&s);
}

/* ---------------------------------------------------------------- tables */

void ckpt_table_init(struct ckpt_table *tab) { memset(tab, 0, sizeof *tab); }

void ckpt_table_free(struct ckpt_table *tab) {
    for (int i = 0; i < tab->n; i++) free((char *)tab->t[i].name);
    free(tab->t);
    memset(tab, 0, sizeof *tab);
}

int ckpt_table_add(struct ckpt_table *tab, const char *name, int dtype, int64_t n, void *data,
                   char *err, int err_len) {
    size_t l = name ? strlen(name) : 0;
    if (l < 1 || l > CKPT_NAME_MAX) return err_fail(err, err_len, "ckpt_table_add: tensor name must be 1..%d bytes, got %zu", CKPT_NAME_MAX, l);
    if (!dtype_size((uint32_t)dtype)) return err_fail(err, err_len, "ckpt_table_add: tensor %s: unknown dtype %d", name, dtype);
    if (n < 0 || (n > 0 && !data)) return err_fail(err, err_len, "ckpt_table_add: tensor %s: bad size %lld or no data", name, (long long)n);
    for (int i = 0; i < tab->n; i++)
        if (!strcmp(tab->t[i].name, name)) return err_fail(err, err_len, "ckpt_table_add: tensor %s listed twice", name);
    if (tab->n == tab->cap) {
        int cap = tab->cap ? 2 * tab->cap : 64;
        struct ckpt_tensor *t = realloc(tab->t, (size_t)cap * sizeof *t);
        if (!t) return err_fail(err, err_len, "ckpt_table_add: out of memory");
        tab->t = t;
        tab->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return err_fail(err, err_len, "ckpt_table_add: out of memory");
    struct ckpt_tensor x = { copy, dtype, n, data };
    tab->t[tab->n++] = x;
    return 0;
}

int ckpt_table_add_optim(struct ckpt_table *tab, struct optim *o, char *err, int err_len) {
    char nm[CKPT_NAME_MAX + 64];
    for (int i = 0; i < o->n; i++) {
        if (o->group[i] == OPTIM_GROUP_NONE) continue;
        const char *base = o->t[i].name;
        if (!base) return err_fail(err, err_len, "ckpt_table_add_optim: trainable tensor %d has no name", i);
        if (ckpt_table_add(tab, base, CKPT_F32, o->numel[i], o->t[i].w, err, err_len)) return -1;
        if (o->group[i] == OPTIM_GROUP_ADAMW) {
            snprintf(nm, sizeof nm, "optim.adamw.exp_avg.%s", base);
            if (ckpt_table_add(tab, nm, CKPT_F32, o->numel[i], o->m[i], err, err_len)) return -1;
            snprintf(nm, sizeof nm, "optim.adamw.exp_avg_sq.%s", base);
            if (ckpt_table_add(tab, nm, CKPT_F32, o->numel[i], o->v[i], err, err_len)) return -1;
        } else {
            snprintf(nm, sizeof nm, "optim.muon.momentum_buffer.%s", base);
            if (ckpt_table_add(tab, nm, CKPT_F32, o->numel[i], o->mom[i], err, err_len)) return -1;
        }
    }
    if (ckpt_table_add(tab, "optim.adamw.step", CKPT_I64, 1, &o->adamw_step, err, err_len)) return -1;
    return ckpt_table_add(tab, "optim.muon.step", CKPT_I64, 1, &o->muon_step, err, err_len);
}

int ckpt_table_add_guard(struct ckpt_table *tab, struct optim_guard *g, char *err, int err_len) {
    return ckpt_table_add(tab, "guard.state", CKPT_U8, (int64_t)sizeof *g, g, err, err_len);
}

/* ---------------------------------------------------------------- writing */

struct wr { int fd; struct ckpt_hasher h; const char *tmp; char *err; int err_len; };

static int wr_put(struct wr *w, const void *data, size_t n, int hash) {
    const char *p = data;
    if (hash) ckpt_hash_update(&w->h, data, n);
    while (n > 0) {
        size_t chunk = n < CKPT_IO_CHUNK ? n : CKPT_IO_CHUNK;
        ssize_t k = write(w->fd, p, chunk);
        if (k < 0) {
            if (errno == EINTR) continue;   /* retry: interrupted by a signal */
            return err_fail(w->err, w->err_len, "write(%s) failed: %s", w->tmp, strerror(errno));
        }
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static int wr_pad(struct wr *w, uint64_t len) {
    static const uint8_t zeros[8];
    uint64_t pad = a8(len) - len;
    return pad ? wr_put(w, zeros, (size_t)pad, 1) : 0;
}

int ckpt_write(const char *path, const struct ckpt_meta *meta, const struct ckpt_tensor *t, int n,
               char *err, int err_len) {
    const char *cfg = meta->config_json ? meta->config_json : "{}";
    uint64_t cfg_bytes = strlen(cfg);
    if (cfg_bytes > CKPT_MAX_CONFIG_BYTES) return err_fail(err, err_len, "ckpt_write(%s): config of %llu bytes exceeds %u", path, (unsigned long long)cfg_bytes, CKPT_MAX_CONFIG_BYTES);
    if (meta->rng_bytes > CKPT_MAX_RNG_BYTES || (meta->rng_bytes && !meta->rng))
        return err_fail(err, err_len, "ckpt_write(%s): bad RNG state (%zu bytes)", path, meta->rng_bytes);
    if (n < 0 || (uint64_t)n > UINT32_MAX) return err_fail(err, err_len, "ckpt_write(%s): bad tensor count %d", path, n);
    struct ckpt_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, CKPT_MAGIC, 8);
    h.version = CKPT_VERSION;
    h.header_bytes = CKPT_HEADER_BYTES;
    h.step = meta->step;
    h.next_seq = meta->next_seq;
    h.sched_pos = meta->sched_pos;
    h.config_bytes = cfg_bytes;
    h.rng_bytes = meta->rng_bytes;
    h.n_tensors = (uint32_t)n;
    h.off_config = CKPT_HEADER_BYTES;
    h.off_rng = a8(h.off_config + cfg_bytes);
    h.off_tensors = a8(h.off_rng + h.rng_bytes);
    uint64_t off = h.off_tensors;
    for (int i = 0; i < n; i++) {
        size_t l = t[i].name ? strlen(t[i].name) : 0, es = dtype_size((uint32_t)t[i].dtype);
        if (l < 1 || l > CKPT_NAME_MAX || !es || t[i].n < 0 || (t[i].n > 0 && !t[i].data))
            return err_fail(err, err_len, "ckpt_write(%s): tensor %d (%s) has a bad name, dtype or size", path, i, t[i].name ? t[i].name : "(null)");
        off += sizeof(struct ckpt_record) + a8(l) + a8((uint64_t)t[i].n * es);
    }
    h.off_checksum = off;
    h.file_bytes = off + 8;
    h.header_hash = ckpt_hash(&h, offsetof(struct ckpt_header, header_hash));

    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return err_fail(err, err_len, "ckpt_write: path too long: %s", path);
    struct wr w = { -1, {0}, tmp, err, err_len };
    w.fd = fs_create_tmp(tmp);   /* private, O_EXCL | O_NOFOLLOW */
    if (w.fd < 0) return err_fail(err, err_len, "open(%s) failed: %s", tmp, strerror(errno));
    ckpt_hash_init(&w.h);
    static const uint8_t zpad[CKPT_HEADER_BYTES];
    uint8_t hbuf[CKPT_HEADER_BYTES];
    memcpy(hbuf, zpad, sizeof hbuf);
    memcpy(hbuf, &h, sizeof h);
    int rc = wr_put(&w, hbuf, sizeof hbuf, 0);
    if (!rc) rc = wr_put(&w, cfg, (size_t)cfg_bytes, 1);
    if (!rc) rc = wr_pad(&w, cfg_bytes);
    if (!rc && h.rng_bytes) rc = wr_put(&w, meta->rng, meta->rng_bytes, 1);
    if (!rc) rc = wr_pad(&w, h.rng_bytes);
    for (int i = 0; i < n && !rc; i++) {
        struct ckpt_record r = { (uint32_t)strlen(t[i].name), (uint32_t)t[i].dtype, (uint64_t)t[i].n };
        uint64_t bytes = (uint64_t)t[i].n * dtype_size(r.dtype);
        rc = wr_put(&w, &r, sizeof r, 1);
        if (!rc) rc = wr_put(&w, t[i].name, r.name_bytes, 1);
        if (!rc) rc = wr_pad(&w, r.name_bytes);
        if (!rc && bytes) rc = wr_put(&w, t[i].data, (size_t)bytes, 1);
        if (!rc) rc = wr_pad(&w, bytes);
    }
    if (!rc) {
        uint64_t sum = ckpt_hash_final(&w.h);
        rc = wr_put(&w, &sum, 8, 0);
    }
    if (!rc && fsync(w.fd) != 0) rc = err_fail(err, err_len, "fsync(%s) failed: %s", tmp, strerror(errno));
    if (close(w.fd) != 0 && !rc) rc = err_fail(err, err_len, "close(%s) failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = err_fail(err, err_len, "rename(%s, %s) failed: %s", tmp, path, strerror(errno));
    if (rc) { unlink(tmp); return -1; }
    return fs_fsync_parent(path, err, err_len);
}

/* ---------------------------------------------------------------- reading */

static int pread_all(int fd, void *buf, size_t n, uint64_t off, const char *path, char *err, int err_len) {
    char *p = buf;
    while (n > 0) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0) {
            if (errno == EINTR) continue;   /* retry: interrupted by a signal */
            return err_fail(err, err_len, "checkpoint %s: pread failed: %s", path, strerror(errno));
        }
        if (k == 0) return err_fail(err, err_len, "checkpoint %s: truncated: unexpected end of file at byte %llu", path, (unsigned long long)off);
        p += k; n -= (size_t)k; off += (uint64_t)k;
    }
    return 0;
}

/* Record i as found in the file. */
struct rec { char name[CKPT_NAME_MAX + 1]; uint32_t dtype; uint64_t n, off_data; };

void ckpt_info_free(struct ckpt_info *info) {
    if (!info) return;
    free(info->config_json);
    memset(info, 0, sizeof *info);
}

/* Open and check everything; on success *fd_out is open, *recs (malloc'd) lists the records. */
static int ckpt_open_checked(const char *path, int *fd_out, struct ckpt_header *hout, struct rec **recs,
                             char **config, char *err, int err_len) {
    *fd_out = -1; *recs = NULL; *config = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_fail(err, err_len, "checkpoint %s: open failed: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { int e = errno; close(fd); return err_fail(err, err_len, "checkpoint %s: fstat failed: %s", path, strerror(e)); }
    uint64_t size = (uint64_t)st.st_size;
    struct ckpt_header h;
    struct rec *rv = NULL;
    char *cfg = NULL, *buf = NULL;
    int rc = -1;
    if (size < CKPT_HEADER_BYTES) { err_fail(err, err_len, "checkpoint %s: truncated: %llu bytes, shorter than the %u-byte header", path, (unsigned long long)size, CKPT_HEADER_BYTES); goto out; }
    if (pread_all(fd, &h, sizeof h, 0, path, err, err_len)) goto out;
    if (memcmp(h.magic, CKPT_MAGIC, 8)) { err_fail(err, err_len, "checkpoint %s: bad magic (not a dflash checkpoint)", path); goto out; }
    if (h.version != CKPT_VERSION) { err_fail(err, err_len, "checkpoint %s: version %u, this build reads version %u", path, h.version, CKPT_VERSION); goto out; }
    if (h.header_bytes != CKPT_HEADER_BYTES) { err_fail(err, err_len, "checkpoint %s: header_bytes %u, expected %u", path, h.header_bytes, CKPT_HEADER_BYTES); goto out; }
    if (h.header_hash != ckpt_hash(&h, offsetof(struct ckpt_header, header_hash))) { err_fail(err, err_len, "checkpoint %s: header hash mismatch (corrupt header)", path); goto out; }
    if (size < h.file_bytes) { err_fail(err, err_len, "checkpoint %s: truncated: %llu bytes, the header says %llu", path, (unsigned long long)size, (unsigned long long)h.file_bytes); goto out; }
    if (size > h.file_bytes) { err_fail(err, err_len, "checkpoint %s: %llu bytes, longer than the %llu the header says", path, (unsigned long long)size, (unsigned long long)h.file_bytes); goto out; }
    if (h.config_bytes > CKPT_MAX_CONFIG_BYTES || h.rng_bytes > CKPT_MAX_RNG_BYTES || h.off_config != CKPT_HEADER_BYTES ||
        h.off_rng != a8(h.off_config + h.config_bytes) || h.off_tensors != a8(h.off_rng + h.rng_bytes) ||
        h.off_checksum < h.off_tensors || h.off_checksum + 8 != h.file_bytes) {
        err_fail(err, err_len, "checkpoint %s: inconsistent section offsets in the header", path);
        goto out;
    }
    /* records */
    rv = calloc(h.n_tensors ? h.n_tensors : 1, sizeof *rv);
    if (!rv) { err_fail(err, err_len, "checkpoint %s: out of memory for %u records", path, h.n_tensors); goto out; }
    uint64_t pos = h.off_tensors;
    for (uint32_t i = 0; i < h.n_tensors; i++) {
        struct ckpt_record r;
        if (pos + sizeof r > h.off_checksum) { err_fail(err, err_len, "checkpoint %s: record %u starts past the tensor section", path, i); goto out; }
        if (pread_all(fd, &r, sizeof r, pos, path, err, err_len)) goto out;
        size_t es = dtype_size(r.dtype);
        if (r.name_bytes < 1 || r.name_bytes > CKPT_NAME_MAX || !es || r.n > (UINT64_MAX / 16)) {
            err_fail(err, err_len, "checkpoint %s: record %u has a bad name length %u, dtype %u or count %llu", path, i, r.name_bytes, r.dtype, (unsigned long long)r.n);
            goto out;
        }
        uint64_t end = pos + sizeof r + a8(r.name_bytes) + a8(r.n * es);
        if (end > h.off_checksum) { err_fail(err, err_len, "checkpoint %s: record %u runs past the tensor section", path, i); goto out; }
        if (pread_all(fd, rv[i].name, r.name_bytes, pos + sizeof r, path, err, err_len)) goto out;
        rv[i].name[r.name_bytes] = 0;
        rv[i].dtype = r.dtype;
        rv[i].n = r.n;
        rv[i].off_data = pos + sizeof r + a8(r.name_bytes);
        pos = end;
    }
    if (pos != h.off_checksum) { err_fail(err, err_len, "checkpoint %s: %llu bytes after the last record, expected none", path, (unsigned long long)(h.off_checksum - pos)); goto out; }
    /* checksum over everything after the header */
    buf = malloc(CKPT_IO_CHUNK);
    if (!buf) { err_fail(err, err_len, "checkpoint %s: out of memory", path); goto out; }
    struct ckpt_hasher hs;
    ckpt_hash_init(&hs);
    for (uint64_t p = CKPT_HEADER_BYTES; p < h.off_checksum;) {
        size_t k = (size_t)(h.off_checksum - p < CKPT_IO_CHUNK ? h.off_checksum - p : CKPT_IO_CHUNK);
        if (pread_all(fd, buf, k, p, path, err, err_len)) goto out;
        ckpt_hash_update(&hs, buf, k);
        p += k;
    }
    uint64_t sum;
    if (pread_all(fd, &sum, 8, h.off_checksum, path, err, err_len)) goto out;
    if (sum != ckpt_hash_final(&hs)) { err_fail(err, err_len, "checkpoint %s: checksum mismatch (corrupt data)", path); goto out; }
    cfg = malloc(h.config_bytes + 1);
    if (!cfg) { err_fail(err, err_len, "checkpoint %s: out of memory", path); goto out; }
    if (pread_all(fd, cfg, (size_t)h.config_bytes, h.off_config, path, err, err_len)) goto out;
    cfg[h.config_bytes] = 0;
    if (strlen(cfg) != h.config_bytes) { err_fail(err, err_len, "checkpoint %s: config text contains a NUL byte", path); goto out; }
    rc = 0;
out:
    free(buf);
    if (rc) { free(rv); free(cfg); close(fd); return -1; }
    *fd_out = fd; *hout = h; *recs = rv; *config = cfg;
    return 0;
}

static void fill_info(struct ckpt_info *info, const struct ckpt_header *h, char *cfg) {
    info->step = h->step;
    info->next_seq = h->next_seq;
    info->sched_pos = h->sched_pos;
    info->config_json = cfg;
    info->rng_bytes = (size_t)h->rng_bytes;
    info->n_tensors = h->n_tensors;
    info->file_bytes = h->file_bytes;
}

int ckpt_verify(const char *path, struct ckpt_info *info, char *err, int err_len) {
    int fd;
    struct ckpt_header h;
    struct rec *rv;
    char *cfg;
    if (ckpt_open_checked(path, &fd, &h, &rv, &cfg, err, err_len)) return -1;
    close(fd);
    free(rv);
    if (info) { memset(info, 0, sizeof *info); fill_info(info, &h, cfg); }
    else free(cfg);
    return 0;
}

int ckpt_load(const char *path, const struct ckpt_tensor *t, int n, void *rng, size_t rng_cap,
              struct ckpt_info *info, char *err, int err_len) {
    int fd;
    struct ckpt_header h;
    struct rec *rv;
    char *cfg;
    if (ckpt_open_checked(path, &fd, &h, &rv, &cfg, err, err_len)) return -1;
    int rc = -1;
    int *match = calloc(n > 0 ? (size_t)n : 1, sizeof *match);
    if (!match) { err_fail(err, err_len, "checkpoint %s: out of memory", path); goto out; }
    if (h.rng_bytes != rng_cap) { err_fail(err, err_len, "checkpoint %s: RNG state of %llu bytes, this run's is %zu", path, (unsigned long long)h.rng_bytes, rng_cap); goto out; }
    for (int j = 0; j < n; j++) match[j] = -1;
    for (uint32_t i = 0; i < h.n_tensors; i++) {
        int j = 0;
        while (j < n && strcmp(t[j].name, rv[i].name)) j++;
        if (j == n) { err_fail(err, err_len, "checkpoint %s: tensor %s is not part of this run", path, rv[i].name); goto out; }
        if (match[j] >= 0) { err_fail(err, err_len, "checkpoint %s: tensor %s appears twice", path, rv[i].name); goto out; }
        if ((uint32_t)t[j].dtype != rv[i].dtype || (uint64_t)t[j].n != rv[i].n) {
            err_fail(err, err_len, "checkpoint %s: tensor %s is %s[%llu], this run expects %s[%lld]", path, rv[i].name,
                     dtype_name(rv[i].dtype), (unsigned long long)rv[i].n, dtype_name((uint32_t)t[j].dtype), (long long)t[j].n);
            goto out;
        }
        match[j] = (int)i;
    }
    for (int j = 0; j < n; j++)
        if (match[j] < 0) { err_fail(err, err_len, "checkpoint %s: tensor %s is missing", path, t[j].name); goto out; }
    /* everything matches: only now overwrite the caller's buffers */
    for (int j = 0; j < n; j++) {
        const struct rec *r = &rv[match[j]];
        size_t bytes = (size_t)(r->n * dtype_size(r->dtype));
        if (bytes && pread_all(fd, t[j].data, bytes, r->off_data, path, err, err_len)) goto out;
    }
    if (rng_cap && pread_all(fd, rng, rng_cap, h.off_rng, path, err, err_len)) goto out;
    rc = 0;
out:
    free(match);
    free(rv);
    close(fd);
    if (rc == 0 && info) { memset(info, 0, sizeof *info); fill_info(info, &h, cfg); }
    else free(cfg);
    return rc;
}

/* ---------------------------------------------------------------- config comparison */

static void describe(const json_t *v, char *out, size_t len) {
    if (!v) { snprintf(out, len, "(missing)"); return; }
    char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (!s) { snprintf(out, len, "(?)"); return; }
    if (strlen(s) > 80) snprintf(out, len, "%.77s...", s);
    else snprintf(out, len, "%s", s);
    free(s);
}

static int ignored(const char *const *ignore, const char *path) {
    for (; ignore && *ignore; ignore++)
        if (!strcmp(*ignore, path)) return 1;
    return 0;
}

static int values_equal(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal((json_t *)a, (json_t *)b);
}

/* 0 equal; -1 with err naming the first differing field under prefix. */
static int diff_obj(const json_t *ck, const json_t *run, const char *prefix, const char *const *ignore, char *err, int err_len) {
    const char *key;
    json_t *rv;
    char path[1024], a[100], b[100];
    json_object_foreach((json_t *)run, key, rv) {
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
        if (ignored(ignore, path)) continue;
        json_t *cv = json_object_get(ck, key);
        if (!cv) { describe(rv, b, sizeof b); return err_fail(err, err_len, "field %s is missing in the checkpoint, this run has %s", path, b); }
        if (json_is_object(cv) && json_is_object(rv)) {
            if (diff_obj(cv, rv, path, ignore, err, err_len)) return -1;
            continue;
        }
        if (!values_equal(cv, rv)) {
            describe(cv, a, sizeof a); describe(rv, b, sizeof b);
            return err_fail(err, err_len, "field %s: the checkpoint has %s, this run has %s", path, a, b);
        }
    }
    json_t *cv;
    json_object_foreach((json_t *)ck, key, cv) {
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", key);
        if (ignored(ignore, path) || json_object_get(run, key)) continue;
        describe(cv, a, sizeof a);
        return err_fail(err, err_len, "field %s: the checkpoint has %s, this run does not set it", path, a);
    }
    return 0;
}

int ckpt_config_diff(const char *ckpt_json, const char *run_json, const char *const *ignore,
                     char *err, int err_len) {
    json_error_t je;
    json_t *ck = json_loads(ckpt_json ? ckpt_json : "", 0, &je);
    if (!ck || !json_is_object(ck)) { json_decref(ck); return err_fail(err, err_len, "the checkpoint's config is not a JSON object (line %d: %s)", je.line, ck ? "not an object" : je.text); }
    json_t *run = json_loads(run_json ? run_json : "", 0, &je);
    if (!run || !json_is_object(run)) { json_decref(ck); json_decref(run); return err_fail(err, err_len, "this run's config is not a JSON object (line %d: %s)", je.line, run ? "not an object" : je.text); }
    int rc = diff_obj(ck, run, "", ignore, err, err_len);
    json_decref(ck);
    json_decref(run);
    return rc;
}

/* ---------------------------------------------------------------- directory */

int ckpt_path(char *out, size_t out_len, const char *dir, int64_t step) {
    int k = snprintf(out, out_len, "%s/step-%lld.ckpt", dir, (long long)step);
    return (k < 0 || (size_t)k >= out_len) ? -1 : 0;
}

/* step-<digits>.ckpt exactly -> step; else -1. */
static int64_t parse_name(const char *nm) {
    if (strncmp(nm, "step-", 5)) return -1;
    const char *p = nm + 5, *q = p;
    while (*q >= '0' && *q <= '9') q++;
    if (q == p || q - p > 18 || (p[0] == '0' && q - p > 1) || strcmp(q, ".ckpt")) return -1;
    return strtoll(p, NULL, 10);
}

static int cmp_desc(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

int ckpt_list(const char *dir, int64_t **steps, char *err, int err_len) {
    *steps = NULL;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return err_fail(err, err_len, "opendir(%s) failed: %s", dir, strerror(errno));
    }
    int n = 0, cap = 0;
    int64_t *v = NULL;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d)) != NULL) {
        int64_t s = parse_name(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) { free(v); closedir(d); return err_fail(err, err_len, "ckpt_list(%s): out of memory", dir); }
            v = nv;
        }
        v[n++] = s;
    }
    closedir(d);
    qsort(v, (size_t)n, sizeof *v, cmp_desc);
    *steps = v;
    return n;
}

uint64_t ckpt_tensor_bytes(const struct ckpt_tensor *t, int n) {
    uint64_t b = CKPT_HEADER_BYTES + 8;   /* the header and the checksum */
    for (int i = 0; i < n; i++)
        b += sizeof(struct ckpt_record) + a8(t[i].name ? strlen(t[i].name) : 0) +
             a8((uint64_t)t[i].n * dtype_size((uint32_t)t[i].dtype));
    return b;
}

int ckpt_check_space(const char *path, uint64_t need, const char *what, char *err, int err_len) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p) return err_fail(err, err_len, "%s: path too long", path);
    struct statvfs sv;
    while (statvfs(p, &sv) != 0) {   /* not created yet: its nearest existing parent's filesystem */
        if (errno != ENOENT || !strcmp(p, ".")) return err_fail(err, err_len, "statvfs(%s): %s", p, strerror(errno));
        char *slash = strrchr(p, '/');
        if (!slash) snprintf(p, sizeof p, ".");
        else if (slash == p) slash[1] = 0;
        else *slash = 0;
    }
    uint64_t free_b = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    if (free_b >= need) return 0;
    return err_fail(err, err_len, "%s: %s needs %.2f GB and the filesystem of %s has %.2f GB free: free space there or "
                    "put the run on a larger filesystem", path, what, need / 1e9, p, free_b / 1e9);
}

int ckpt_save(const char *dir, const struct ckpt_meta *meta, const struct ckpt_tensor *t, int n,
              int keep, char *out_path, size_t out_len, char *err, int err_len) {
    char path[PATH_MAX];
    if (fs_mkdir_p(dir, err, err_len)) return -1;
    if (ckpt_path(path, sizeof path, dir, meta->step)) return err_fail(err, err_len, "ckpt_save: path too long under %s", dir);
    if (ckpt_write(path, meta, t, n, err, err_len)) return -1;
    if (out_path && out_len) snprintf(out_path, out_len, "%s", path);
    /* the new checkpoint is durable: prune older ones and stale temporaries */
    int64_t *steps;
    int k = ckpt_list(dir, &steps, err, err_len);
    if (k < 0) return -1;
    char old[PATH_MAX];
    for (int i = keep > 0 ? keep : k; i < k; i++) {
        if (steps[i] == meta->step) continue;
        ckpt_path(old, sizeof old, dir, steps[i]);
        if (unlink(old) != 0 && errno != ENOENT) { free(steps); return err_fail(err, err_len, "unlink(%s) failed: %s", old, strerror(errno)); }
    }
    free(steps);
    DIR *d = opendir(dir);
    if (!d) return err_fail(err, err_len, "opendir(%s) failed: %s", dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "step-", 5) || !strstr(e->d_name, ".ckpt.tmp.")) continue;
        snprintf(old, sizeof old, "%s/%s", dir, e->d_name);
        unlink(old);   /* best effort: a leftover of a killed writer */
    }
    closedir(d);
    return fs_fsync_parent(path, err, err_len);
}

int ckpt_find_newest_valid(const char *dir, const char *run_config, const char *const *ignore,
                           int skip_other_config, ckpt_log_fn log, void *log_ctx,
                           char *out_path, size_t out_len, struct ckpt_info *info, char *err, int err_len) {
    int64_t *steps;
    int k = ckpt_list(dir, &steps, err, err_len);
    if (k < 0) return -1;
    char path[PATH_MAX], why[1024], line[PATH_MAX + 1024 + 64];
    for (int i = 0; i < k; i++) {
        ckpt_path(path, sizeof path, dir, steps[i]);
        struct ckpt_info ci;
        if (ckpt_verify(path, &ci, why, sizeof why)) {
            snprintf(line, sizeof line, "skipping %s", why);   /* why names the file */
            if (log) log(log_ctx, line);
            continue;
        }
        if (run_config && ckpt_config_diff(ci.config_json, run_config, ignore, why, sizeof why)) {
            ckpt_info_free(&ci);
            if (!skip_other_config) {
                free(steps);
                return err_fail(err, err_len, "%s was written with another configuration: %s (resume refused)", path, why);
            }
            snprintf(line, sizeof line, "skipping checkpoint %s: written with another configuration: %s", path, why);
            if (log) log(log_ctx, line);
            continue;
        }
        free(steps);
        if (out_path && out_len) snprintf(out_path, out_len, "%s", path);
        if (info) *info = ci; else ckpt_info_free(&ci);
        return 1;
    }
    free(steps);
    return 0;
}

/* ---------------------------------------------------------------- state file */

int ckpt_write_state(const char *path, int64_t step, int64_t next_seq, const char *ckpt_file,
                     char *err, int err_len) {
    json_t *o = json_object();
    if (!o) return err_fail(err, err_len, "ckpt_write_state(%s): out of memory", path);
    int bad = json_object_set_new(o, "step", json_integer(step));
    bad |= json_object_set_new(o, "next_seq", json_integer(next_seq));
    bad |= json_object_set_new(o, "checkpoint", ckpt_file ? json_string(ckpt_file) : json_null());
    char *s = bad ? NULL : json_dumps(o, JSON_INDENT(2));
    json_decref(o);
    if (!s) return err_fail(err, err_len, "ckpt_write_state(%s): could not encode (checkpoint path not UTF-8?)", path);
    size_t l = strlen(s);
    char *t = realloc(s, l + 2);
    if (!t) { free(s); return err_fail(err, err_len, "ckpt_write_state(%s): out of memory", path); }
    t[l] = '\n'; t[l + 1] = 0;
    int rc = fs_write_atomic(path, t, l + 1, err, err_len);
    free(t);
    return rc;
}

int ckpt_read_state(const char *path, int64_t *step, int64_t *next_seq, char *ckpt_file, size_t out_len,
                    char *err, int err_len) {
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) return err_fail(err, err_len, "%s:%d: %s", path, je.line, je.text);
    int rc = -1;
    json_t *s = json_object_get(o, "step"), *q = json_object_get(o, "next_seq"), *c = json_object_get(o, "checkpoint");
    if (!json_is_integer(s) || json_integer_value(s) < 0) { err_fail(err, err_len, "%s: field step is missing or not a non-negative integer", path); goto out; }
    if (!json_is_integer(q) || json_integer_value(q) < 0) { err_fail(err, err_len, "%s: field next_seq is missing or not a non-negative integer", path); goto out; }
    if (c && !json_is_string(c) && !json_is_null(c)) { err_fail(err, err_len, "%s: field checkpoint is not a string", path); goto out; }
    *step = json_integer_value(s);
    *next_seq = json_integer_value(q);
    if (ckpt_file && out_len) snprintf(ckpt_file, out_len, "%s", json_is_string(c) ? json_string_value(c) : "");
    rc = 0;
out:
    json_decref(o);
    return rc;
}
