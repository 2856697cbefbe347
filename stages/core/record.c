/*
 * stages/core/record.c — item validation, seq tracking and the item file format of dflash-record
 * (record.h). Shards are streamed straight from the slot's payload through the safetensors writer
 * (no staging copy: a hidden item of the standard configuration is ~400 MB), renamed into place
 * only when complete; reading validates everything before a byte reaches the caller's buffer
 * is trusted.
 */
#include "core/record.h"
#include "core/relay.h"
#include "shm/ring.h"
#include "core/err.h"
#include "core/fsutil.h"
#include "core/safetensors.h"

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

/* ---------------------------------------------------------------- items as tensors */

/* Any descriptor, decoded: the batch part plus the state geometry of hidden/features. */
struct item_view {
    enum desc_kind kind;
    struct desc_batch b;          /* offsets into the payload the descriptor describes */
    struct desc_hidden hd;        /* valid for hidden */
    struct desc_features fd;      /* valid for features */
    uint32_t k, H;
    enum desc_dtype dtype;
    uint64_t off_states, off_last;
};

static int view_decode(const void *desc, size_t len, uint64_t cap, struct item_view *v, char *why, int why_len) {
    memset(v, 0, sizeof *v);
    if (desc_peek_kind(desc, len, &v->kind, why, why_len)) return -1;
    if (v->kind == DESC_KIND_BATCH) return desc_batch_decode(desc, len, cap, &v->b, why, why_len);
    if (v->kind == DESC_KIND_HIDDEN) {
        if (desc_hidden_decode(desc, len, cap, &v->hd, why, why_len)) return -1;
        v->b = v->hd.batch; v->k = v->hd.n_layers; v->H = v->hd.hidden_size; v->dtype = v->hd.dtype;
        v->off_states = v->hd.off_states; v->off_last = v->hd.off_last;
        return 0;
    }
    if (desc_features_decode(desc, len, cap, &v->fd, why, why_len)) return -1;
    v->b = v->fd.batch; v->k = v->fd.n_layers; v->H = v->fd.hidden_size; v->dtype = v->fd.dtype;
    v->off_states = v->fd.off_states; v->off_last = v->fd.off_last;
    return 0;
}

/* The canonical form of v (offsets of desc_*_layout) encoded into out. */
static int view_canonical(const struct item_view *v, struct item_view *c, void *out, size_t cap, size_t *len,
                          char *why, int why_len) {
    *c = *v;
    if (v->kind == DESC_KIND_BATCH) {
        desc_batch_layout(&c->b);
        return desc_batch_encode(&c->b, out, cap, len, why, why_len);
    }
    if (v->kind == DESC_KIND_HIDDEN) {
        desc_hidden_layout(&c->hd);
        c->b = c->hd.batch; c->off_states = c->hd.off_states; c->off_last = c->hd.off_last;
        return desc_hidden_encode(&c->hd, out, cap, len, why, why_len);
    }
    desc_features_layout(&c->fd);
    c->b = c->fd.batch; c->off_states = c->fd.off_states; c->off_last = c->fd.off_last;
    return desc_features_encode(&c->fd, out, cap, len, why, why_len);
}

struct item_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[3];
    uint64_t off, bytes;          /* in the payload of the view */
};

/* The tensors of an item, in payload order. Returns how many (6 or 8). */
static int view_tensors(const struct item_view *v, struct item_tensor t[8]) {
    int64_t T = v->b.n_tokens, D = v->b.n_docs;
    int n = 0;
    t[n++] = (struct item_tensor){"row_ids", ST_I64, 1, {D}, v->b.off_row_ids, (uint64_t)D * 8};
    t[n++] = (struct item_tensor){"input_ids", ST_I32, 1, {T}, v->b.off_input_ids, (uint64_t)T * 4};
    t[n++] = (struct item_tensor){"loss_mask", ST_BOOL, 1, {T}, v->b.off_loss_mask, (uint64_t)T};
    t[n++] = (struct item_tensor){"position_ids", ST_I32, 1, {T}, v->b.off_position_ids, (uint64_t)T * 4};
    t[n++] = (struct item_tensor){"doc_ids", ST_I32, 1, {T}, v->b.off_doc_ids, (uint64_t)T * 4};
    t[n++] = (struct item_tensor){"cu_seqlens", ST_I32, 1, {D + 1}, v->b.off_cu_seqlens, (uint64_t)(D + 1) * 4};
    if (v->kind == DESC_KIND_BATCH) return n;
    enum st_dtype sd = v->dtype == DESC_DTYPE_F32 ? ST_F32 : ST_BF16;
    uint64_t e = desc_dtype_bytes(v->dtype), k = v->k, H = v->H;
    if (v->kind == DESC_KIND_FEATURES && v->fd.layout == DESC_LAYOUT_CONCAT)
        t[n++] = (struct item_tensor){"states", sd, 2, {T, (int64_t)(k * H)}, v->off_states, k * T * H * e};
    else
        t[n++] = (struct item_tensor){"states", sd, 3, {(int64_t)k, T, (int64_t)H}, v->off_states, k * T * H * e};
    t[n++] = (struct item_tensor){"last", sd, 2, {T, (int64_t)H}, v->off_last, (uint64_t)T * H * e};
    return n;
}

static void view_model(const struct item_view *v, char *out, size_t out_len) {
    if (v->kind == DESC_KIND_BATCH) { snprintf(out, out_len, "kind=batch"); return; }
    const int32_t *layers = v->kind == DESC_KIND_HIDDEN ? v->hd.layers : v->fd.layers;
    int n = snprintf(out, out_len, "kind=%s k=%u H=%u dtype=%s", desc_kind_name(v->kind), v->k, v->H,
                     desc_dtype_name(v->dtype));
    if (v->kind == DESC_KIND_FEATURES && n > 0 && (size_t)n < out_len)
        n += snprintf(out + n, out_len - (size_t)n, " layout=%s", desc_layout_name(v->fd.layout));
    for (uint32_t i = 0; i < v->k && n > 0 && (size_t)n < out_len; i++)
        n += snprintf(out + n, out_len - (size_t)n, "%s%d", i ? "," : " layers=", layers[i]);
}

int record_model_str(const void *desc, size_t desc_len, char *out, size_t out_len, char *err, int err_len) {
    struct item_view v;
    char why[512];
    if (view_decode(desc, desc_len, 0, &v, why, sizeof why)) return err_fail(err, err_len, "descriptor rejected: %s", why);
    view_model(&v, out, out_len);
    return 0;
}

/* ---------------------------------------------------------------- files */

int record_path(char *out, size_t out_len, const char *dir, uint64_t seq) {
    int n = snprintf(out, out_len, "%s/item-%012llu.safetensors", dir, (unsigned long long)seq);
    return n < 0 || (size_t)n >= out_len ? -1 : 0;
}

static uint64_t fnv_step(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
#define FNV_INIT 1469598103934665603ull

static void hex_encode(const void *p, size_t n, char *out) {
    static const char d[] = "0123456789abcdef";
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) { out[2 * i] = d[b[i] >> 4]; out[2 * i + 1] = d[b[i] & 15]; }
    out[2 * n] = 0;
}

static int hex_decode(const char *s, uint8_t *out, size_t cap, size_t *n) {
    size_t len = strlen(s);
    if (len % 2 || len / 2 > cap) return -1;
    for (size_t i = 0; i < len / 2; i++) {
        int v = 0;
        for (int j = 0; j < 2; j++) {
            char c = s[2 * i + j];
            int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (x < 0) return -1;
            v = v * 16 + x;
        }
        out[i] = (uint8_t)v;
    }
    *n = len / 2;
    return 0;
}

int record_write_file(const char *dir, uint64_t seq, enum desc_kind kind, const void *desc, uint32_t desc_len,
                      const void *payload, uint64_t payload_len, int durable, char *err, int err_len) {
    (void)durable;
    char path[PATH_MAX], why[768];
    if (record_path(path, sizeof path, dir, seq)) return err_fail(err, err_len, "record directory path too long: %s", dir);
    struct item_view v, c;
    if (view_decode(desc, desc_len, 0, &v, why, sizeof why))
        return err_fail(err, err_len, "seq %llu: descriptor rejected: %s", (unsigned long long)seq, why);
    if (v.kind != kind)
        return err_fail(err, err_len, "seq %llu: kind: expected '%s', the descriptor says '%s'", (unsigned long long)seq,
                        desc_kind_name(kind), desc_kind_name(v.kind));
    if (v.b.payload_bytes > payload_len)
        return err_fail(err, err_len, "seq %llu: the descriptor describes %llu payload bytes, %llu given",
                        (unsigned long long)seq, (unsigned long long)v.b.payload_bytes, (unsigned long long)payload_len);
    uint8_t cdesc[DESC_MAX_BYTES];
    size_t clen;
    if (view_canonical(&v, &c, cdesc, sizeof cdesc, &clen, why, sizeof why))
        return err_fail(err, err_len, "seq %llu: descriptor rejected: %s", (unsigned long long)seq, why);
    struct item_tensor t[8];
    int nt = view_tensors(&v, t);
    char hex[2 * DESC_MAX_BYTES + 1], model[RECORD_MODEL_MAX], seqs[32], kinds[16];
    hex_encode(cdesc, clen, hex);
    view_model(&v, model, sizeof model);
    snprintf(seqs, sizeof seqs, "%llu", (unsigned long long)seq);
    snprintf(kinds, sizeof kinds, "%s", desc_kind_name(kind));
    /* The data checksum goes into the header, which precedes the data: hash first, in the
     * writer's layout order (element size, largest first, declaration order within a size). */
    uint64_t h = FNV_INIT;
    for (size_t sz = 8; sz >= 1; sz /= 2)
        for (int i = 0; i < nt; i++)
            if (st_dtype_size(t[i].dtype) == sz) h = fnv_step(h, (const char *)payload + t[i].off, t[i].bytes);
    char fnvs[20];
    snprintf(fnvs, sizeof fnvs, "%016llx", (unsigned long long)h);
    struct st_writer *w = st_writer_create(path, why, sizeof why);
    if (!w) return err_fail(err, err_len, "seq %llu: %s", (unsigned long long)seq, why);
    int rc = st_writer_metadata(w, "dflash.format", RECORD_FORMAT, why, sizeof why) ||
             st_writer_metadata(w, "dflash.version", "2", why, sizeof why) ||
             st_writer_metadata(w, "dflash.kind", kinds, why, sizeof why) ||
             st_writer_metadata(w, "dflash.seq", seqs, why, sizeof why) ||
             st_writer_metadata(w, "dflash.model", model, why, sizeof why) ||
             st_writer_metadata(w, "dflash.desc", hex, why, sizeof why) ||
             st_writer_metadata(w, "dflash.data_fnv", fnvs, why, sizeof why);
    for (int i = 0; i < nt && !rc; i++) rc = st_writer_add(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape, why, sizeof why);
    if (!rc) rc = st_writer_begin(w, why, sizeof why);
    for (int k = 0; k < st_writer_count(w) && !rc; k++) {
        const char *name;
        size_t nb;
        st_writer_order(w, k, &name, &nb);
        for (int i = 0; i < nt; i++)
            if (!strcmp(t[i].name, name)) {
                /* <= 1 GiB per call: one write() moves at most ~2 GiB */
                for (uint64_t off = 0; off < t[i].bytes && !rc; off += 1ull << 30) {
                    uint64_t len = t[i].bytes - off < (1ull << 30) ? t[i].bytes - off : 1ull << 30;
                    rc = st_writer_write(w, (const char *)payload + t[i].off + off, (size_t)len, why, sizeof why);
                }
            }
    }
    if (!rc) rc = st_writer_finish(w, why, sizeof why);
    st_writer_free(w);
    if (rc) return err_fail(err, err_len, "seq %llu: %s", (unsigned long long)seq, why);
    return 0;
}

int record_read_into(const char *path, void *desc, uint32_t desc_cap, void *payload, uint64_t payload_cap,
                     const char *want_model, struct record_header *h, char *err, int err_len) {
    struct st_file f;
    char why[768];
    memset(h, 0, sizeof *h);
    if (st_open(&f, path, why, sizeof why)) return err_fail(err, err_len, "%s (truncated or not a safetensors file?)", why);
    int rc = -1;
    const char *fmt = st_metadata(&f, "dflash.format"), *ver = st_metadata(&f, "dflash.version"),
               *kind = st_metadata(&f, "dflash.kind"), *seqs = st_metadata(&f, "dflash.seq"),
               *model = st_metadata(&f, "dflash.model"), *hex = st_metadata(&f, "dflash.desc"),
               *fnvs = st_metadata(&f, "dflash.data_fnv");
    if (!fmt || strcmp(fmt, RECORD_FORMAT)) { err_fail(err, err_len, "%s: dflash.format: expected '%s', found '%s'", path, RECORD_FORMAT, fmt ? fmt : "(none)"); goto out; }
    if (!ver || strcmp(ver, "2")) { err_fail(err, err_len, "%s: dflash.version: expected 2, found '%s'", path, ver ? ver : "(none)"); goto out; }
    if (!kind || !seqs || !model || !hex || !fnvs) { err_fail(err, err_len, "%s: metadata: expected dflash.kind, .seq, .model, .desc and .data_fnv, some are missing", path); goto out; }
    size_t dlen;
    if (hex_decode(hex, desc, desc_cap, &dlen)) { err_fail(err, err_len, "%s: dflash.desc: expected hex of at most %u bytes", path, desc_cap); goto out; }
    struct item_view v, c;
    if (view_decode(desc, dlen, 0, &v, why, sizeof why)) { err_fail(err, err_len, "%s: descriptor rejected: %s", path, why); goto out; }
    char m[RECORD_MODEL_MAX], seqbuf[32];
    view_model(&v, m, sizeof m);
    snprintf(seqbuf, sizeof seqbuf, "%llu", (unsigned long long)v.b.seq);
    if (strcmp(kind, desc_kind_name(v.kind)) || strcmp(seqs, seqbuf) || strcmp(model, m)) {
        err_fail(err, err_len, "%s: metadata (kind %s, seq %s, model '%s') disagrees with the descriptor (kind %s, seq %s, model '%s')",
                 path, kind, seqs, model, desc_kind_name(v.kind), seqbuf, m);
        goto out;
    }
    if (want_model && strcmp(want_model, m)) {
        err_fail(err, err_len, "%s (batch seq %s): belongs to another model: expected '%s', found '%s'", path, seqs, want_model, m);
        goto out;
    }
    uint8_t cdesc[DESC_MAX_BYTES];
    size_t clen;
    if (view_canonical(&v, &c, cdesc, sizeof cdesc, &clen, why, sizeof why) || clen != dlen || memcmp(cdesc, desc, dlen)) {
        err_fail(err, err_len, "%s: descriptor is not in canonical layout", path);
        goto out;
    }
    if (v.b.payload_bytes > payload_cap) {
        err_fail(err, err_len, "%s (batch seq %s): payload of %llu bytes does not fit the %llu-byte buffer (ring slot too small)",
                 path, seqs, (unsigned long long)v.b.payload_bytes, (unsigned long long)payload_cap);
        goto out;
    }
    struct item_tensor t[8];
    int nt = view_tensors(&v, t);
    if (f.n_tensors != nt) { err_fail(err, err_len, "%s: expected %d tensors for a %s item, found %d", path, nt, kind, f.n_tensors); goto out; }
    for (int i = 0; i < nt; i++) {
        const struct st_tensor *x = st_find(&f, t[i].name);
        int same = x && x->dtype == t[i].dtype && x->ndim == t[i].ndim;
        for (int d = 0; same && d < t[i].ndim; d++) same = x->shape[d] == t[i].shape[d];
        if (!same) {
            char sh[64];
            err_fail(err, err_len, "%s: tensor '%s': expected %s %s from the descriptor, found %s", path, t[i].name,
                     st_dtype_name(t[i].dtype), st_shape_str(sh, sizeof sh, t[i].ndim, t[i].shape),
                     x ? st_dtype_name(x->dtype) : "nothing");
            goto out;
        }
    }
    uint64_t data0 = 8 + f.header_bytes;
    uint64_t hsum = fnv_step(FNV_INIT, (const char *)f.map + data0, f.file_bytes - data0);
    char got[20];
    snprintf(got, sizeof got, "%016llx", (unsigned long long)hsum);
    if (strcmp(got, fnvs)) { err_fail(err, err_len, "%s (batch seq %s): data checksum mismatch: expected %s, found %s (file corrupt)", path, seqs, fnvs, got); goto out; }
    /* canonical payload: each array at its canonical offset, the gaps between them zeroed */
    uint64_t pos = 0;
    struct item_tensor ct[8];
    view_tensors(&c, ct);
    for (int i = 0; i < nt; i++) {
        const struct st_tensor *x = st_find(&f, ct[i].name);
        if (ct[i].off > pos) memset((char *)payload + pos, 0, ct[i].off - pos);
        memcpy((char *)payload + ct[i].off, x->data, ct[i].bytes);
        pos = ct[i].off + ct[i].bytes;
    }
    if (c.b.payload_bytes > pos) memset((char *)payload + pos, 0, c.b.payload_bytes - pos);
    if (desc_batch_check_payload(&c.b, payload, 0, why, sizeof why)) { err_fail(err, err_len, "%s: batch arrays rejected: %s", path, why); goto out; }
    h->version = RECORD_VERSION;
    h->kind = (uint32_t)v.kind;
    h->seq = v.b.seq;
    h->desc_len = (uint32_t)dlen;
    h->payload_len = c.b.payload_bytes;
    h->n_tokens = v.b.n_tokens;
    h->data_fnv = hsum;
    snprintf(h->model, sizeof h->model, "%s", m);
    rc = 0;
out:
    st_close(&f);
    return rc;
}

void record_item_free(struct record_item *it) {
    if (!it) return;
    free(it->block_);
    memset(it, 0, sizeof *it);
}

int record_read_file(const char *path, struct record_item *it, char *err, int err_len) {
    memset(it, 0, sizeof *it);
    /* The payload size is in the descriptor: a first pass reads the header only. */
    struct st_file f;
    char why[768];
    if (st_open(&f, path, why, sizeof why)) return err_fail(err, err_len, "%s (truncated or not a safetensors file?)", why);
    uint64_t cap = f.file_bytes + 16 * DESC_ALIGN;   /* canonical payload <= data + 8 alignment gaps */
    st_close(&f);
    char *block = aligned_alloc(DESC_ALIGN, DESC_MAX_BYTES + (cap + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
    if (!block) return err_fail(err, err_len, "%s: out of memory for %llu bytes", path, (unsigned long long)cap);
    if (record_read_into(path, block, DESC_MAX_BYTES, block + DESC_MAX_BYTES, cap, NULL, &it->h, err, err_len)) {
        free(block);
        return -1;
    }
    it->desc = block;
    it->payload = block + DESC_MAX_BYTES;
    it->block_ = block;
    return 0;
}

/* ---------------------------------------------------------------- index */

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Seqs of the item files in dir (sorted), or -1. */
static int64_t list_items(const char *dir, uint64_t **out, char *err, int err_len) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return err_fail(err, err_len, "opendir(%s) failed: %s", dir, strerror(errno));
    uint64_t *v = NULL;
    int64_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        unsigned long long seq;
        int used = 0;
        if (sscanf(e->d_name, "item-%12llu.safetensors%n", &seq, &used) != 1 || used != (int)strlen(e->d_name)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            uint64_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) { free(v); closedir(d); return err_fail(err, err_len, "out of memory listing %s", dir); }
            v = nv;
        }
        v[n++] = seq;
    }
    closedir(d);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_u64);
    *out = v;
    return n;
}

int64_t record_index_write(const char *dir, char *err, int err_len) {
    uint64_t *seqs;
    int64_t n = list_items(dir, &seqs, err, err_len);
    if (n < 0) return -1;
    size_t cap = 4096 + (size_t)n * 192, len = 0;   /* an item line is at most ~115 bytes */
    char *text = malloc(cap), model[RECORD_MODEL_MAX] = "", path[PATH_MAX], why[768];
    if (!text) { free(seqs); return err_fail(err, err_len, "out of memory for the index of %s", dir); }
    int64_t rc = -1;
    for (int64_t i = 0; i < n; i++) {
        if (i && seqs[i] != seqs[i - 1] + 1) {
            err_fail(err, err_len, "%s: seq %llu is missing (items %llu..%llu on disk): a recording with gaps is not complete",
                     dir, (unsigned long long)(seqs[i - 1] + 1), (unsigned long long)seqs[0], (unsigned long long)seqs[n - 1]);
            goto out;
        }
        record_path(path, sizeof path, dir, seqs[i]);
        struct st_file f;
        if (st_open(&f, path, why, sizeof why)) { err_fail(err, err_len, "%s", why); goto out; }
        const char *m = st_metadata(&f, "dflash.model"), *hex = st_metadata(&f, "dflash.desc"), *fnvs = st_metadata(&f, "dflash.data_fnv");
        uint8_t d[DESC_MAX_BYTES];
        size_t dl;
        struct item_view v;
        int bad = !m || !hex || !fnvs || hex_decode(hex, d, sizeof d, &dl) || view_decode(d, dl, 0, &v, why, sizeof why);
        if (!bad && !i) snprintf(model, sizeof model, "%s", m);
        if (bad || strcmp(model, m)) {
            err_fail(err, err_len, "%s: %s", path, bad ? "not a dflash-rec item (metadata or descriptor unreadable)" : "belongs to another model than the first item");
            st_close(&f);
            goto out;
        }
        if (!i) len += (size_t)snprintf(text + len, cap - len, "%s %u\nmodel %s\n", RECORD_FORMAT, RECORD_VERSION, model);
        len += (size_t)snprintf(text + len, cap - len, "item %llu item-%012llu.safetensors %u %llu %s\n",
                                (unsigned long long)seqs[i], (unsigned long long)seqs[i], v.b.n_tokens,
                                (unsigned long long)v.b.payload_bytes, fnvs);
        st_close(&f);
    }
    if (!n) len += (size_t)snprintf(text + len, cap - len, "%s %u\nmodel none\n", RECORD_FORMAT, RECORD_VERSION);
    len += (size_t)snprintf(text + len, cap - len, "end %lld\n", (long long)n);
    if (snprintf(path, sizeof path, "%s/index.txt", dir) >= (int)sizeof path) { err_fail(err, err_len, "path too long: %s", dir); goto out; }
    if (fs_write_atomic(path, text, len, err, err_len)) goto out;
    rc = n;
out:
    free(text);
    free(seqs);
    return rc;
}

void record_index_free(struct record_index *ix) {
    if (!ix) return;
    free(ix->items);
    memset(ix, 0, sizeof *ix);
}

int record_index_read(const char *dir, struct record_index *ix, char *err, int err_len) {
    memset(ix, 0, sizeof *ix);
    char path[PATH_MAX], why[512];
    if (snprintf(path, sizeof path, "%s/index.txt", dir) >= (int)sizeof path) return err_fail(err, err_len, "path too long: %s", dir);
    if (!fs_exists(path)) return err_fail(err, err_len, "%s: no index.txt: not a complete recording (the recorder did not finish, or the stream had gaps)", dir);
    char *text;
    size_t len;
    if (fs_read_file(path, &text, &len, why, sizeof why)) return err_fail(err, err_len, "%s", why);
    int rc = -1, line_no = 0, ended = 0;
    uint64_t cap = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        line_no++;
        unsigned long long seq, bytes, n;
        unsigned tokens, ver;
        char file[64], fnvs[32];
        int used = 0;
        if (line_no == 1) {
            if (sscanf(line, "dflash-rec %u%n", &ver, &used) != 1 || line[used] || ver != RECORD_VERSION) {
                err_fail(err, err_len, "%s:1: expected 'dflash-rec %u', found '%.60s'", path, RECORD_VERSION, line);
                goto out;
            }
        } else if (line_no == 2) {
            if (strncmp(line, "model ", 6)) { err_fail(err, err_len, "%s:2: expected 'model ...', found '%.60s'", path, line); goto out; }
            snprintf(ix->model, sizeof ix->model, "%s", line + 6);
        } else if (!strncmp(line, "item ", 5)) {
            if (ended || sscanf(line, "item %llu %63s %u %llu %31s%n", &seq, file, &tokens, &bytes, fnvs, &used) != 5 ||
                line[used] || strlen(fnvs) != 16 || (ix->n_items && seq != ix->items[ix->n_items - 1].seq + 1)) {
                err_fail(err, err_len, "%s:%d: expected 'item <seq> <file> <tokens> <bytes> <fnv>' with seqs consecutive, found '%.80s'",
                         path, line_no, line);
                goto out;
            }
            if (ix->n_items == cap) {
                cap = cap ? 2 * cap : 256;
                struct record_index_entry *ne = realloc(ix->items, cap * sizeof *ne);
                if (!ne) { err_fail(err, err_len, "%s: out of memory", path); goto out; }
                ix->items = ne;
            }
            struct record_index_entry *e = &ix->items[ix->n_items++];
            e->seq = seq;
            e->n_tokens = tokens;
            e->payload_bytes = bytes;
            e->data_fnv = strtoull(fnvs, NULL, 16);
            if (bytes > ix->max_payload_bytes) ix->max_payload_bytes = bytes;
            if (tokens > ix->max_tokens) ix->max_tokens = tokens;
        } else if (sscanf(line, "end %llu%n", &n, &used) == 1 && !line[used]) {
            if (n != ix->n_items) { err_fail(err, err_len, "%s:%d: 'end %llu' but %llu items listed", path, line_no, n, (unsigned long long)ix->n_items); goto out; }
            ended = 1;
        } else {
            err_fail(err, err_len, "%s:%d: unexpected line '%.80s'", path, line_no, line);
            goto out;
        }
    }
    if (!ended) { err_fail(err, err_len, "%s: no 'end' line (truncated index)", path); goto out; }
    rc = 0;
out:
    free(text);
    if (rc) record_index_free(ix);
    return rc;
}

/* ---------------------------------------------------------------- resume */

int64_t record_scan_dir(const char *dir, struct relay_seen *s, uint64_t *min_seq, uint64_t *n_bad, char *err,
                        int err_len) {
    *n_bad = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return err_fail(err, err_len, "opendir(%s) failed: %s", dir, strerror(errno));
    }
    uint64_t *good = NULL, n_good = 0, cap = 0;
    struct dirent *e;
    char p[PATH_MAX], why[1024];
    while ((e = readdir(d)) != NULL) {
        unsigned long long seq;
        int used = 0, pid;
        if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
        if (sscanf(e->d_name, "item-%12llu.safetensors.tmp.%d%n", &seq, &pid, &used) == 2 && used == (int)strlen(e->d_name)) {
            /* a temporary of a writer killed mid-write: remove it, unless its writer still runs */
            if (pid > 0 && !ring_pid_alive(pid, 0)) unlink(p);   /* zombies count as dead */
            continue;
        }
        if (!strcmp(e->d_name, "index.txt")) { unlink(p); continue; }
        used = 0;
        if (sscanf(e->d_name, "item-%12llu.safetensors%n", &seq, &used) != 1 || used != (int)strlen(e->d_name)) continue;
        struct record_item it;
        if (record_read_file(p, &it, why, sizeof why) || it.h.seq != seq) {
            char bad[PATH_MAX + 8];
            snprintf(bad, sizeof bad, "%s.bad", p);
            if (rename(p, bad) != 0) {
                closedir(d);
                record_item_free(&it);
                free(good);
                return err_fail(err, err_len, "rename(%s) failed: %s", p, strerror(errno));
            }
            (*n_bad)++;
            record_item_free(&it);
            continue;
        }
        record_item_free(&it);
        if (n_good == cap) {
            uint64_t *ng = realloc(good, (cap = cap ? 2 * cap : 1024) * sizeof *ng);
            if (!ng) { closedir(d); free(good); return err_fail(err, err_len, "%s: out of memory for the seq list", dir); }
            good = ng;
        }
        good[n_good++] = seq;
    }
    closedir(d);
    /* In seq order: the seen set then counts no item on disk as out of order. */
    if (n_good) qsort(good, n_good, sizeof *good, cmp_u64);
    int64_t n = 0;
    for (uint64_t i = 0; i < n_good; i++) {
        int rc = relay_seen_add(s, good[i], err, err_len);
        if (rc < 0) { free(good); return -1; }
        n += rc;
    }
    if (n_good) *min_seq = good[0];
    free(good);
    return n;
}
