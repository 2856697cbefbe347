/*
 * stages/core/record.c — item validation, seq tracking and the item file format of dflash-record
 * (record.h). Files are written with one writev-style loop straight from the slot's payload (no
 * staging copy: a hidden item of the standard configuration is ~400 MB), renamed into place only
 * when complete.
 */
#include "core/record.h"
#include "core/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

_Static_assert(sizeof(struct record_header) == RECORD_HEADER_BYTES, "record_header must be 64 bytes");

uint64_t record_fnv(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ---------------------------------------------------------------- validation */

/* Index of the first non-finite value among n of dtype at p, or -1 when all are finite. */
static int64_t first_nonfinite(const void *p, uint64_t n, enum desc_dtype dtype) {
    if (dtype == DESC_DTYPE_F32) {
        const float *f = p;
        for (uint64_t i = 0; i < n; i++)
            if (!isfinite(f[i])) return (int64_t)i;
    } else {
        const uint16_t *h = p;   /* bf16: inf/nan iff the 8 exponent bits are all ones */
        for (uint64_t i = 0; i < n; i++)
            if ((h[i] & 0x7f80u) == 0x7f80u) return (int64_t)i;
    }
    return -1;
}

static int check_states(uint64_t seq, const char *payload, uint64_t off_states, uint64_t off_last, uint32_t T,
                        uint32_t k, uint32_t H, enum desc_dtype dtype, uint64_t *n_checked, char *err, int err_len) {
    uint64_t n_states = (uint64_t)k * T * H, n_last = (uint64_t)T * H;
    int64_t i = first_nonfinite(payload + off_states, n_states, dtype);
    if (i >= 0)
        return err_fail(err, err_len, "seq %llu: captured state value %lld (layer slot %llu, token %llu) is not finite",
                    (unsigned long long)seq, (long long)i, (unsigned long long)((uint64_t)i / ((uint64_t)T * H)),
                    (unsigned long long)((uint64_t)i / H % T));
    i = first_nonfinite(payload + off_last, n_last, dtype);
    if (i >= 0)
        return err_fail(err, err_len, "seq %llu: last-layer state value %lld (token %llu) is not finite",
                    (unsigned long long)seq, (long long)i, (unsigned long long)((uint64_t)i / H));
    *n_checked = n_states + n_last;
    return 0;
}

int record_check(const void *desc, size_t desc_len, uint64_t slot_seq, const void *payload, uint64_t payload_len,
                 uint64_t payload_cap, enum desc_kind want_kind, int64_t vocab_size, struct record_info *info,
                 char *err, int err_len) {
    char why[768];
    enum desc_kind kind;
    memset(info, 0, sizeof *info);
    if (desc_peek_kind(desc, desc_len, &kind, why, sizeof why))
        return err_fail(err, err_len, "seq %llu: descriptor rejected: %s", (unsigned long long)slot_seq, why);
    if (want_kind && kind != want_kind)
        return err_fail(err, err_len, "seq %llu: descriptor kind: expected '%s', found '%s'", (unsigned long long)slot_seq,
                    desc_kind_name(want_kind), desc_kind_name(kind));
    struct desc_batch b;
    struct desc_hidden hd;
    struct desc_features fd;
    int rc;
    if (kind == DESC_KIND_BATCH) rc = desc_batch_decode(desc, desc_len, payload_cap, &b, why, sizeof why);
    else if (kind == DESC_KIND_HIDDEN) rc = desc_hidden_decode(desc, desc_len, payload_cap, &hd, why, sizeof why);
    else rc = desc_features_decode(desc, desc_len, payload_cap, &fd, why, sizeof why);
    if (rc) return err_fail(err, err_len, "seq %llu: %s descriptor rejected: %s", (unsigned long long)slot_seq,
                        desc_kind_name(kind), why);
    if (kind == DESC_KIND_HIDDEN) b = hd.batch;
    if (kind == DESC_KIND_FEATURES) b = fd.batch;
    if (b.seq != slot_seq)
        return err_fail(err, err_len, "seq %llu: the descriptor says seq %llu; the slot and its descriptor must agree",
                    (unsigned long long)slot_seq, (unsigned long long)b.seq);
    if (payload_len < b.payload_bytes)
        return err_fail(err, err_len, "seq %llu: the producer published %llu payload bytes, the %s descriptor describes %llu",
                    (unsigned long long)slot_seq, (unsigned long long)payload_len, desc_kind_name(kind),
                    (unsigned long long)b.payload_bytes);
    info->kind = kind;
    info->seq = slot_seq;
    info->n_tokens = b.n_tokens;
    info->n_docs = b.n_docs;
    info->payload_bytes = b.payload_bytes;
    if (!payload) return 0;
    if (desc_batch_check_payload(&b, payload, vocab_size, why, sizeof why))
        return err_fail(err, err_len, "seq %llu: batch arrays rejected: %s", (unsigned long long)slot_seq, why);
    if (kind == DESC_KIND_HIDDEN)
        return check_states(slot_seq, payload, hd.off_states, hd.off_last, b.n_tokens, hd.n_layers, hd.hidden_size,
                            hd.dtype, &info->n_checked, err, err_len);
    if (kind == DESC_KIND_FEATURES)
        return check_states(slot_seq, payload, fd.off_states, fd.off_last, b.n_tokens, fd.n_layers, fd.hidden_size,
                            fd.dtype, &info->n_checked, err, err_len);
    return 0;
}

/* ---------------------------------------------------------------- files */

int record_path(char *out, size_t out_len, const char *dir, uint64_t seq) {
    int n = snprintf(out, out_len, "%s/item-%012llu.rec", dir, (unsigned long long)seq);
    return n < 0 || (size_t)n >= out_len ? -1 : 0;
}

/* write() all of iov, resuming after short writes (EINTR retried: a signal must not lose bytes). */
static int write_all(int fd, struct iovec *iov, int n, char *err, int err_len, const char *path) {
    while (n > 0) {
        ssize_t w = writev(fd, iov, n > IOV_MAX ? IOV_MAX : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return err_fail(err, err_len, "writev(%s) failed: %s", path, strerror(errno));
        }
        size_t left = (size_t)w;
        while (n > 0 && left >= iov->iov_len) { left -= iov->iov_len; iov++; n--; }
        if (n > 0) { iov->iov_base = (char *)iov->iov_base + left; iov->iov_len -= left; }
    }
    return 0;
}

int record_write_file(const char *dir, uint64_t seq, enum desc_kind kind, const void *desc, uint32_t desc_len,
                      const void *payload, uint64_t payload_len, int durable, char *err, int err_len) {
    char path[PATH_MAX], tmp[PATH_MAX];
    if (record_path(path, sizeof path, dir, seq) ||
        snprintf(tmp, sizeof tmp, "%s/.item-%012llu.tmp.%d", dir, (unsigned long long)seq, (int)getpid()) >= (int)sizeof tmp)
        return err_fail(err, err_len, "record directory path too long: %s", dir);
    struct record_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, RECORD_MAGIC, 8);
    h.version = RECORD_VERSION;
    h.kind = (uint32_t)kind;
    h.seq = seq;
    h.desc_len = desc_len;
    h.header_bytes = RECORD_HEADER_BYTES;
    h.payload_len = payload_len;
    h.desc_fnv = record_fnv(desc, desc_len);
    h.payload_fnv = record_fnv(payload, payload_len);
    if (payload_len > 64ull << 30)
        return err_fail(err, err_len, "item seq %llu of %llu payload bytes is too large to record (64 GiB at most)",
                    (unsigned long long)seq, (unsigned long long)payload_len);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return err_fail(err, err_len, "open(%s) failed: %s", tmp, strerror(errno));
    /* Split the payload into <= 1 GiB pieces: one write() moves at most ~2 GiB. */
    struct iovec iov[2 + 64];
    int n = 0;
    iov[n++] = (struct iovec){&h, sizeof h};
    iov[n++] = (struct iovec){(void *)desc, desc_len};
    for (uint64_t off = 0; off < payload_len && n < (int)(sizeof iov / sizeof iov[0]); off += 1ull << 30) {
        uint64_t len = payload_len - off < (1ull << 30) ? payload_len - off : 1ull << 30;
        iov[n++] = (struct iovec){(char *)payload + off, (size_t)len};
    }
    if (write_all(fd, iov, n, err, err_len, tmp) || (durable && fsync(fd) != 0 &&
                                                     err_fail(err, err_len, "fsync(%s) failed: %s", tmp, strerror(errno)))) {
        close(fd);
        unlink(tmp);
        return -1;
    }
    if (close(fd) != 0) { unlink(tmp); return err_fail(err, err_len, "close(%s) failed: %s", tmp, strerror(errno)); }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return err_fail(err, err_len, "rename(%s, %s) failed: %s", tmp, path, strerror(e));
    }
    if (durable) {
        int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0) return err_fail(err, err_len, "open(%s) failed: %s", dir, strerror(errno));
        int rc = fsync(dfd);
        close(dfd);
        if (rc != 0) return err_fail(err, err_len, "fsync(%s) failed: %s", dir, strerror(errno));
    }
    return 0;
}

void record_item_free(struct record_item *it) {
    if (!it) return;
    free(it->block_);
    memset(it, 0, sizeof *it);
}

int record_read_file(const char *path, struct record_item *it, char *err, int err_len) {
    memset(it, 0, sizeof *it);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return err_fail(err, err_len, "open(%s) failed: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) { close(fd); return err_fail(err, err_len, "fstat(%s) failed: %s", path, strerror(errno)); }
    uint64_t size = (uint64_t)sb.st_size;
    struct record_header h;
    int rc = -1;
    char *block = NULL;
    if (size < sizeof h) {
        err_fail(err, err_len, "%s: %llu bytes, shorter than the %u-byte record header", path, (unsigned long long)size,
             RECORD_HEADER_BYTES);
        goto out;
    }
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) { err_fail(err, err_len, "pread(%s) failed: %s", path, strerror(errno)); goto out; }
    if (memcmp(h.magic, RECORD_MAGIC, 8)) { err_fail(err, err_len, "%s: magic: expected \"DFRECRD\\n\", found other bytes (not a dflash-record item file)", path); goto out; }
    if (h.version != RECORD_VERSION) { err_fail(err, err_len, "%s: version: expected %u, found %u", path, RECORD_VERSION, h.version); goto out; }
    if (h.header_bytes != RECORD_HEADER_BYTES) { err_fail(err, err_len, "%s: header size: expected %u, found %u", path, RECORD_HEADER_BYTES, h.header_bytes); goto out; }
    if (h.kind < DESC_KIND_BATCH || h.kind > DESC_KIND_FEATURES) { err_fail(err, err_len, "%s: kind: expected 1 (batch), 2 (hidden) or 3 (features), found %u", path, h.kind); goto out; }
    if (h.desc_len == 0 || h.desc_len > DESC_MAX_BYTES || h.payload_len > size ||
        (uint64_t)sizeof h + h.desc_len + h.payload_len != size) {
        err_fail(err, err_len, "%s: size: the header says %u + %u + %llu bytes, the file has %llu", path, RECORD_HEADER_BYTES,
             h.desc_len, (unsigned long long)h.payload_len, (unsigned long long)size);
        goto out;
    }
    uint64_t desc_room = (h.desc_len + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN;
    block = aligned_alloc(DESC_ALIGN, desc_room + (h.payload_len + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN + DESC_ALIGN);
    if (!block) { err_fail(err, err_len, "%s: out of memory for %llu bytes", path, (unsigned long long)h.payload_len); goto out; }
    char *desc = block, *payload = block + desc_room;
    for (uint64_t done = 0, total = h.desc_len + h.payload_len; done < total;) {
        char *dst = done < h.desc_len ? desc + done : payload + (done - h.desc_len);
        uint64_t want = done < h.desc_len ? h.desc_len - done : total - done;
        if (want > (1u << 30)) want = 1u << 30;
        ssize_t r = pread(fd, dst, (size_t)want, (off_t)(sizeof h + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { err_fail(err, err_len, "pread(%s) failed: %s", path, r < 0 ? strerror(errno) : "unexpected end of file"); goto out; }
        done += (uint64_t)r;
    }
    if (record_fnv(desc, h.desc_len) != h.desc_fnv) { err_fail(err, err_len, "%s: descriptor checksum mismatch (file corrupt)", path); goto out; }
    if (record_fnv(payload, h.payload_len) != h.payload_fnv) { err_fail(err, err_len, "%s: payload checksum mismatch (file corrupt)", path); goto out; }
    enum desc_kind k;
    char why[512];
    if (desc_peek_kind(desc, h.desc_len, &k, why, sizeof why)) { err_fail(err, err_len, "%s: %s", path, why); goto out; }
    if ((uint32_t)k != h.kind) { err_fail(err, err_len, "%s: header kind %u but the descriptor's kind is '%s'", path, h.kind, desc_kind_name(k)); goto out; }
    it->h = h;
    it->desc = desc;
    it->payload = payload;
    it->block_ = block;
    block = NULL;
    rc = 0;
out:
    free(block);
    close(fd);
    return rc;
}

/* ---------------------------------------------------------------- seqs */

void record_seqs_init(struct record_seqs *s) { memset(s, 0, sizeof *s); }

void record_seqs_free(struct record_seqs *s) {
    free(s->bits);
    memset(s, 0, sizeof *s);
}

int record_seqs_has(const struct record_seqs *s, uint64_t seq) {
    uint64_t w = seq / 64;
    return w < s->n_words && (s->bits[w] >> (seq % 64) & 1);
}

/* Mark seq without counting duplicates or order; 1 new, 0 present, -1 error. */
static int mark(struct record_seqs *s, uint64_t seq, char *err, int err_len) {
    if (seq >= RECORD_MAX_SEQ)
        return err_fail(err, err_len, "seq %llu is beyond what the recorder tracks (< %llu)", (unsigned long long)seq,
                    (unsigned long long)RECORD_MAX_SEQ);
    uint64_t w = seq / 64;
    if (w >= s->n_words) {
        uint64_t n = s->n_words ? s->n_words : 64;
        while (n <= w) n *= 2;
        uint64_t *nb = realloc(s->bits, n * sizeof *nb);
        if (!nb) return err_fail(err, err_len, "out of memory for the seq bitmap (%llu words)", (unsigned long long)n);
        memset(nb + s->n_words, 0, (n - s->n_words) * sizeof *nb);
        s->bits = nb;
        s->n_words = n;
    }
    if (s->bits[w] >> (seq % 64) & 1) return 0;
    s->bits[w] |= 1ull << (seq % 64);
    if (!s->n_distinct || seq < s->min) s->min = seq;
    if (!s->n_distinct || seq > s->max) s->max = seq;
    s->n_distinct++;
    return 1;
}

int record_seqs_add(struct record_seqs *s, uint64_t seq, char *err, int err_len) {
    uint64_t prev_max = s->max, had = s->n_distinct;
    int rc = mark(s, seq, err, err_len);
    if (rc < 0) return -1;
    if (rc == 0) { s->n_dups++; return 0; }
    if (had && seq < prev_max) s->n_out_of_order++;
    if (!s->n_added++) s->first = seq;
    s->last = seq;
    return 1;
}

uint64_t record_seqs_gaps(const struct record_seqs *s) {
    return s->n_distinct ? s->max - s->min + 1 - s->n_distinct : 0;
}

uint64_t record_seqs_next_missing(const struct record_seqs *s, uint64_t from) {
    uint64_t q = from;
    while (q / 64 < s->n_words) {
        uint64_t w = s->bits[q / 64] >> (q % 64);
        if (~w == 0 && q % 64 == 0) { q += 64; continue; }
        if (!(w & 1)) return q;
        q++;
    }
    return q;
}

int64_t record_scan_dir(const char *dir, struct record_seqs *s, char *err, int err_len) {
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return err_fail(err, err_len, "opendir(%s) failed: %s", dir, strerror(errno));
    }
    int64_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        unsigned long long seq;
        int used = 0;
        int pid;
        if (sscanf(e->d_name, ".item-%12llu.tmp.%d%n", &seq, &pid, &used) == 2 && used == (int)strlen(e->d_name)) {
            /* a temporary of a recorder killed mid-write is never visible as an item: remove it,
             * unless its writer still runs (another recorder on the same directory) */
            char p[PATH_MAX];
            if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH && snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
                unlink(p);
            continue;
        }
        used = 0;
        if (sscanf(e->d_name, "item-%12llu.rec%n", &seq, &used) != 1 || used != (int)strlen(e->d_name)) continue;
        int rc = mark(s, seq, err, err_len);
        if (rc < 0) { closedir(d); return -1; }
        n += rc;
    }
    closedir(d);
    return n;
}
