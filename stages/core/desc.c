/*
 * stages/core/desc.c — encode, decode and validate the ring descriptors (desc.h).
 *
 * One table of field names and types serves all three kinds: `batch` uses the first
 * DESC_N_BATCH fields, `hidden` the first DESC_N_HIDDEN, `features` all of them. Encoding goes
 * through a generic field record (struct gen) so encoder and decoder cannot disagree on names or
 * order; the decoder fills the same record, checking type, presence and uniqueness of each key and
 * the exact count, then converts and validates ranges and array placement.
 */
#include "core/mpk.h"
#include "core/desc.h"
#include "core/err.h"
#include "core/fsutil.h"

#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- field table */

enum field {
    F_KIND, F_VERSION, F_SEQ, F_EPOCH, F_N_TOKENS, F_BUDGET, F_N_DOCS, F_N_LOSS, F_PAYLOAD_BYTES,
    F_OFF_ROW_IDS, F_OFF_INPUT_IDS, F_OFF_LOSS_MASK, F_OFF_POSITION_IDS, F_OFF_DOC_IDS, F_OFF_CU_SEQLENS, F_SPLIT, F_PLAN,
    F_LAYERS, F_DTYPE, F_HIDDEN_SIZE, F_OFF_STATES, F_OFF_LAST, F_TARGET,
    F_LAYOUT,
    F_COUNT
};
#define DESC_N_BATCH (F_PLAN + 1)
#define DESC_N_HIDDEN (F_TARGET + 1)
#define DESC_N_FEATURES F_COUNT

enum ftype { T_STR, T_U32, T_U64, T_LAYERS };

static const struct { const char *name; enum ftype type; } g_fields[F_COUNT] = {
    [F_KIND] = {"kind", T_STR},
    [F_VERSION] = {"version", T_U32},
    [F_SEQ] = {"seq", T_U64},
    [F_EPOCH] = {"epoch", T_U32},
    [F_N_TOKENS] = {"n_tokens", T_U32},
    [F_BUDGET] = {"budget", T_U32},
    [F_N_DOCS] = {"n_docs", T_U32},
    [F_N_LOSS] = {"n_loss", T_U32},
    [F_PAYLOAD_BYTES] = {"payload_bytes", T_U64},
    [F_OFF_ROW_IDS] = {"off_row_ids", T_U64},
    [F_OFF_INPUT_IDS] = {"off_input_ids", T_U64},
    [F_OFF_LOSS_MASK] = {"off_loss_mask", T_U64},
    [F_OFF_POSITION_IDS] = {"off_position_ids", T_U64},
    [F_OFF_DOC_IDS] = {"off_doc_ids", T_U64},
    [F_OFF_CU_SEQLENS] = {"off_cu_seqlens", T_U64},
    [F_SPLIT] = {"split", T_STR},
    [F_PLAN] = {"plan", T_U64},
    [F_LAYERS] = {"layers", T_LAYERS},
    [F_DTYPE] = {"dtype", T_STR},
    [F_HIDDEN_SIZE] = {"hidden_size", T_U32},
    [F_OFF_STATES] = {"off_states", T_U64},
    [F_OFF_LAST] = {"off_last", T_U64},
    [F_TARGET] = {"target", T_U64},
    [F_LAYOUT] = {"layout", T_STR},
};

/* A descriptor of any kind as plain values. Strings are NUL-terminated copies. */
struct gen {
    uint64_t u[F_COUNT];
    char s[F_COUNT][16];
    uint32_t n_layers;
    int32_t layers[DESC_MAX_LAYERS];
};

/* ---------------------------------------------------------------- names and sizes */

size_t desc_dtype_bytes(enum desc_dtype dtype) {
    return dtype == DESC_DTYPE_BF16 ? 2 : dtype == DESC_DTYPE_F32 ? 4 : 0;
}
const char *desc_dtype_name(enum desc_dtype dtype) {
    return dtype == DESC_DTYPE_BF16 ? "bf16" : dtype == DESC_DTYPE_F32 ? "f32" : "?";
}
const char *desc_layout_name(enum desc_layout layout) {
    return layout == DESC_LAYOUT_CONCAT ? "concat" : layout == DESC_LAYOUT_SPLIT ? "split" : "?";
}
const char *desc_kind_name(enum desc_kind kind) {
    return kind == DESC_KIND_BATCH ? "batch" : kind == DESC_KIND_HIDDEN ? "hidden" : kind == DESC_KIND_FEATURES ? "features" : "?";
}

const char *desc_split_name(enum desc_split split) {
    return split == DESC_SPLIT_TRAIN ? "train" : split == DESC_SPLIT_VAL ? "val" : "?";
}

uint32_t desc_version(enum desc_kind kind) {
    return kind == DESC_KIND_BATCH ? DESC_BATCH_VERSION : kind == DESC_KIND_HIDDEN ? DESC_HIDDEN_VERSION
         : kind == DESC_KIND_FEATURES ? DESC_FEATURES_VERSION : 0;
}

static uint64_t align_up(uint64_t x) { return (x + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN; }

/* Place an array of `bytes` at the next aligned offset after *end. */
static uint64_t place(uint64_t *end, uint64_t bytes) {
    uint64_t off = align_up(*end);
    *end = off + bytes;
    return off;
}

uint64_t desc_batch_layout(struct desc_batch *d) {
    uint64_t end = 0, T = d->n_tokens, n = d->n_docs;
    d->off_row_ids = place(&end, 8 * n);
    d->off_input_ids = place(&end, 4 * T);
    d->off_loss_mask = place(&end, T);
    d->off_position_ids = place(&end, 4 * T);
    d->off_doc_ids = place(&end, 4 * T);
    d->off_cu_seqlens = place(&end, 4 * (n + 1));
    d->payload_bytes = end;
    return end;
}

static uint64_t states_bytes(uint64_t T, uint64_t k, uint64_t H, enum desc_dtype dtype) {
    return T * k * H * desc_dtype_bytes(dtype);
}

uint64_t desc_hidden_layout(struct desc_hidden *d) {
    uint64_t end = desc_batch_layout(&d->batch), T = d->batch.n_tokens;
    d->off_states = place(&end, states_bytes(T, d->n_layers, d->hidden_size, d->dtype));
    d->off_last = place(&end, states_bytes(T, 1, d->hidden_size, d->dtype));
    d->batch.payload_bytes = end;
    return end;
}

uint64_t desc_features_layout(struct desc_features *d) {
    uint64_t end = desc_batch_layout(&d->batch), T = d->batch.n_tokens;
    d->off_states = place(&end, states_bytes(T, d->n_layers, d->hidden_size, d->dtype));
    d->off_last = place(&end, states_bytes(T, 1, d->hidden_size, d->dtype));
    d->batch.payload_bytes = end;
    return end;
}

uint64_t desc_batch_max_payload_bytes(uint32_t budget) {
    struct desc_batch d = {.n_tokens = budget, .n_docs = budget};
    return desc_batch_layout(&d);
}
uint64_t desc_hidden_max_payload_bytes(uint32_t budget, uint32_t n_layers, uint32_t hidden_size, enum desc_dtype dtype) {
    struct desc_hidden d = {.batch = {.n_tokens = budget, .n_docs = budget}, .n_layers = n_layers,
                            .dtype = dtype, .hidden_size = hidden_size};
    return desc_hidden_layout(&d);
}
uint64_t desc_features_max_payload_bytes(uint32_t budget, uint32_t n_layers, uint32_t hidden_size, enum desc_dtype dtype) {
    struct desc_features d = {.batch = {.n_tokens = budget, .n_docs = budget}, .n_layers = n_layers,
                              .dtype = dtype, .hidden_size = hidden_size, .layout = DESC_LAYOUT_CONCAT};
    return desc_features_layout(&d);
}

void desc_batch_arrays(const struct desc_batch *d, void *payload, struct desc_batch_arrays *a) {
    char *p = payload;
    a->row_ids = (int64_t *)(void *)(p + d->off_row_ids);
    a->input_ids = (int32_t *)(void *)(p + d->off_input_ids);
    a->loss_mask = (uint8_t *)(p + d->off_loss_mask);
    a->position_ids = (int32_t *)(void *)(p + d->off_position_ids);
    a->doc_ids = (int32_t *)(void *)(p + d->off_doc_ids);
    a->cu_seqlens = (int32_t *)(void *)(p + d->off_cu_seqlens);
}

/* ---------------------------------------------------------------- validation */

struct span { const char *name; uint64_t off, bytes; };

/* Each span aligned, inside payload_bytes (and payload_cap when non-zero), and no two overlap. */
static int check_spans(struct span *s, int n, uint64_t payload_bytes, uint64_t payload_cap, char *err, int err_len) {
    if (payload_cap && payload_bytes > payload_cap)
        return err_fail(err, err_len, "descriptor payload_bytes %llu exceeds the slot's payload capacity %llu",
                    (unsigned long long)payload_bytes, (unsigned long long)payload_cap);
    for (int i = 0; i < n; i++) {
        if (s[i].off % DESC_ALIGN)
            return err_fail(err, err_len, "descriptor array '%s': offset %llu is not a multiple of %u",
                        s[i].name, (unsigned long long)s[i].off, DESC_ALIGN);
        if (s[i].off > payload_bytes || s[i].bytes > payload_bytes - s[i].off)
            return err_fail(err, err_len, "descriptor array '%s': bytes [%llu, %llu) lie outside the payload of %llu bytes",
                        s[i].name, (unsigned long long)s[i].off, (unsigned long long)(s[i].off + s[i].bytes),
                        (unsigned long long)payload_bytes);
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (s[i].off < s[j].off + s[j].bytes && s[j].off < s[i].off + s[i].bytes)
                return err_fail(err, err_len, "descriptor arrays '%s' and '%s' overlap", s[i].name, s[j].name);
    return 0;
}

static int batch_ranges(const struct desc_batch *d, char *err, int err_len) {
    if (d->split != DESC_SPLIT_TRAIN && d->split != DESC_SPLIT_VAL)
        return err_fail(err, err_len, "descriptor split: expected train or val, found enum value %d", (int)d->split);
    if (d->n_tokens < 1 || d->n_tokens > INT32_MAX)
        return err_fail(err, err_len, "descriptor n_tokens: expected 1..%d, found %u", INT32_MAX, d->n_tokens);
    if (d->budget < d->n_tokens || d->budget > INT32_MAX)
        return err_fail(err, err_len, "descriptor budget: expected n_tokens (%u)..%d, found %u", d->n_tokens, INT32_MAX, d->budget);
    if (d->n_docs < 1 || d->n_docs > d->n_tokens)
        return err_fail(err, err_len, "descriptor n_docs: expected 1..n_tokens (%u), found %u", d->n_tokens, d->n_docs);
    if (d->n_loss < 1 || d->n_loss > d->n_tokens)
        return err_fail(err, err_len, "descriptor n_loss: expected 1..n_tokens (%u), found %u", d->n_tokens, d->n_loss);
    return 0;
}

static int batch_spans(const struct desc_batch *d, struct span *s) {
    uint64_t T = d->n_tokens, n = d->n_docs;
    s[0] = (struct span){"row_ids", d->off_row_ids, 8 * n};
    s[1] = (struct span){"input_ids", d->off_input_ids, 4 * T};
    s[2] = (struct span){"loss_mask", d->off_loss_mask, T};
    s[3] = (struct span){"position_ids", d->off_position_ids, 4 * T};
    s[4] = (struct span){"doc_ids", d->off_doc_ids, 4 * T};
    s[5] = (struct span){"cu_seqlens", d->off_cu_seqlens, 4 * (n + 1)};
    return 6;
}

int desc_batch_validate(const struct desc_batch *d, uint64_t payload_cap, char *err, int err_len) {
    if (batch_ranges(d, err, err_len)) return -1;
    struct span s[6];
    int n = batch_spans(d, s);
    return check_spans(s, n, d->payload_bytes, payload_cap, err, err_len);
}

/* Shared by hidden and features: layers, dtype, H, and the two state arrays. */
static int states_validate(const struct desc_batch *b, uint32_t n_layers, const int32_t *layers, enum desc_dtype dtype,
                           uint32_t hidden_size, uint64_t off_states, uint64_t off_last, uint64_t payload_cap,
                           char *err, int err_len) {
    if (batch_ranges(b, err, err_len)) return -1;
    if (n_layers < 1 || n_layers > DESC_MAX_LAYERS)
        return err_fail(err, err_len, "descriptor layers: expected 1..%d layer ids, found %u", DESC_MAX_LAYERS, n_layers);
    for (uint32_t i = 0; i < n_layers; i++)
        if (layers[i] < 0)
            return err_fail(err, err_len, "descriptor layers[%u]: expected a layer id >= 0, found %d", i, layers[i]);
    if (!desc_dtype_bytes(dtype))
        return err_fail(err, err_len, "descriptor dtype: expected bf16 or f32, found enum value %d", (int)dtype);
    if (hidden_size < 1 || hidden_size > (1u << 20))
        return err_fail(err, err_len, "descriptor hidden_size: expected 1..%u, found %u", 1u << 20, hidden_size);
    /* T < 2^31, H <= 2^20, k <= 64, 4 bytes: at most 2^59, no overflow. */
    uint64_t last = states_bytes(b->n_tokens, 1, hidden_size, dtype);
    struct span s[8];
    int n = batch_spans(b, s);
    s[n++] = (struct span){"states", off_states, last * n_layers};
    s[n++] = (struct span){"last", off_last, last};
    return check_spans(s, n, b->payload_bytes, payload_cap, err, err_len);
}

int desc_hidden_validate(const struct desc_hidden *d, uint64_t payload_cap, char *err, int err_len) {
    return states_validate(&d->batch, d->n_layers, d->layers, d->dtype, d->hidden_size, d->off_states, d->off_last,
                           payload_cap, err, err_len);
}

int desc_features_validate(const struct desc_features *d, uint64_t payload_cap, char *err, int err_len) {
    if (d->layout != DESC_LAYOUT_CONCAT && d->layout != DESC_LAYOUT_SPLIT)
        return err_fail(err, err_len, "descriptor layout: expected concat or split, found enum value %d", (int)d->layout);
    return states_validate(&d->batch, d->n_layers, d->layers, d->dtype, d->hidden_size, d->off_states, d->off_last,
                           payload_cap, err, err_len);
}

int desc_batch_check_payload(const struct desc_batch *d, const void *payload, int64_t vocab_size, char *err, int err_len) {
    if (desc_batch_validate(d, 0, err, err_len)) return -1;
    struct desc_batch_arrays a;
    desc_batch_arrays(d, (void *)payload, &a);
    unsigned long long seq = (unsigned long long)d->seq;
    int32_t T = (int32_t)d->n_tokens, n = (int32_t)d->n_docs;
    if (a.cu_seqlens[0] != 0)
        return err_fail(err, err_len, "batch seq %llu: cu_seqlens[0] = %d, expected 0", seq, a.cu_seqlens[0]);
    if (a.cu_seqlens[n] != T)
        return err_fail(err, err_len, "batch seq %llu: cu_seqlens[%d] = %d, expected n_tokens %d", seq, n, a.cu_seqlens[n], T);
    uint32_t n_loss = 0;
    for (int32_t doc = 0; doc < n; doc++) {
        int32_t lo = a.cu_seqlens[doc], hi = a.cu_seqlens[doc + 1];
        if (hi <= lo || hi > T)
            return err_fail(err, err_len, "batch seq %llu: cu_seqlens[%d..%d] = %d, %d is not strictly increasing within [0, %d]",
                        seq, doc, doc + 1, lo, hi, T);
        if (a.row_ids[doc] < 0)
            return err_fail(err, err_len, "batch seq %llu: row_ids[%d] = %lld is negative", seq, doc, (long long)a.row_ids[doc]);
        uint32_t doc_loss = 0;
        for (int32_t t = lo; t < hi; t++) {
            if (a.position_ids[t] != t - lo)
                return err_fail(err, err_len, "batch seq %llu: position_ids[%d] = %d, expected %d (document %d starts at %d)",
                            seq, t, a.position_ids[t], t - lo, doc, lo);
            if (a.doc_ids[t] != doc)
                return err_fail(err, err_len, "batch seq %llu: doc_ids[%d] = %d, expected %d", seq, t, a.doc_ids[t], doc);
            if (a.loss_mask[t] > 1)
                return err_fail(err, err_len, "batch seq %llu: loss_mask[%d] = %u, expected 0 or 1", seq, t, a.loss_mask[t]);
            if (a.input_ids[t] < 0 || (vocab_size > 0 && a.input_ids[t] >= vocab_size))
                return err_fail(err, err_len, "batch seq %llu: input_ids[%d] = %d is outside [0, %lld)", seq, t, a.input_ids[t],
                            (long long)(vocab_size > 0 ? vocab_size : (int64_t)INT32_MAX + 1));
            doc_loss += a.loss_mask[t];
        }
        if (!doc_loss)
            return err_fail(err, err_len, "batch seq %llu: document %d (row %lld) has no loss_mask = 1 token", seq, doc,
                        (long long)a.row_ids[doc]);
        n_loss += doc_loss;
    }
    if (n_loss != d->n_loss)
        return err_fail(err, err_len, "batch seq %llu: descriptor n_loss %u, but loss_mask has %u ones", seq, d->n_loss, n_loss);
    return 0;
}

/* ---------------------------------------------------------------- generic record <-> structs */

static void gen_from_batch(struct gen *g, const struct desc_batch *d, enum desc_kind kind) {
    memset(g, 0, sizeof *g);
    snprintf(g->s[F_KIND], sizeof g->s[0], "%s", desc_kind_name(kind));
    g->u[F_VERSION] = desc_version(kind);
    g->u[F_SEQ] = d->seq;
    g->u[F_EPOCH] = d->epoch;
    g->u[F_N_TOKENS] = d->n_tokens;
    g->u[F_BUDGET] = d->budget;
    g->u[F_N_DOCS] = d->n_docs;
    g->u[F_N_LOSS] = d->n_loss;
    g->u[F_PAYLOAD_BYTES] = d->payload_bytes;
    g->u[F_OFF_ROW_IDS] = d->off_row_ids;
    g->u[F_OFF_INPUT_IDS] = d->off_input_ids;
    g->u[F_OFF_LOSS_MASK] = d->off_loss_mask;
    g->u[F_OFF_POSITION_IDS] = d->off_position_ids;
    g->u[F_OFF_DOC_IDS] = d->off_doc_ids;
    g->u[F_OFF_CU_SEQLENS] = d->off_cu_seqlens;
    snprintf(g->s[F_SPLIT], sizeof g->s[0], "%s", desc_split_name(d->split));
    g->u[F_PLAN] = d->plan;
}

/* The batch part from the record; 0, or -1 with a sentence for a split that is neither train nor val. */
static int batch_from_gen(struct desc_batch *d, const struct gen *g, const char *kind, char *err, int err_len) {
    d->seq = g->u[F_SEQ];
    d->epoch = (uint32_t)g->u[F_EPOCH];
    d->n_tokens = (uint32_t)g->u[F_N_TOKENS];
    d->budget = (uint32_t)g->u[F_BUDGET];
    d->n_docs = (uint32_t)g->u[F_N_DOCS];
    d->n_loss = (uint32_t)g->u[F_N_LOSS];
    d->payload_bytes = g->u[F_PAYLOAD_BYTES];
    d->off_row_ids = g->u[F_OFF_ROW_IDS];
    d->off_input_ids = g->u[F_OFF_INPUT_IDS];
    d->off_loss_mask = g->u[F_OFF_LOSS_MASK];
    d->off_position_ids = g->u[F_OFF_POSITION_IDS];
    d->off_doc_ids = g->u[F_OFF_DOC_IDS];
    d->off_cu_seqlens = g->u[F_OFF_CU_SEQLENS];
    d->plan = g->u[F_PLAN];
    if (!strcmp(g->s[F_SPLIT], "train")) d->split = DESC_SPLIT_TRAIN;
    else if (!strcmp(g->s[F_SPLIT], "val")) d->split = DESC_SPLIT_VAL;
    else return err_fail(err, err_len, "%s descriptor split: expected 'train' or 'val', found '%s'", kind, g->s[F_SPLIT]);
    return 0;
}

static void gen_states(struct gen *g, uint32_t n_layers, const int32_t *layers, enum desc_dtype dtype, uint32_t H,
                       uint64_t off_states, uint64_t off_last, uint64_t target_id) {
    g->u[F_TARGET] = target_id;
    g->n_layers = n_layers;
    memcpy(g->layers, layers, sizeof(int32_t) * (n_layers > DESC_MAX_LAYERS ? DESC_MAX_LAYERS : n_layers));
    snprintf(g->s[F_DTYPE], sizeof g->s[0], "%s", desc_dtype_name(dtype));
    g->u[F_HIDDEN_SIZE] = H;
    g->u[F_OFF_STATES] = off_states;
    g->u[F_OFF_LAST] = off_last;
}

/* ---------------------------------------------------------------- msgpack encoding */

static int gen_encode(const struct gen *g, int n_fields, void *buf, size_t cap, size_t *len, char *err, int err_len) {
    struct mpk_fixbuf f = {buf, cap, 0, 0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &f, mpk_fixbuf_write);
    msgpack_pack_map(&pk, (size_t)n_fields);
    for (int i = 0; i < n_fields; i++) {
        mpk_pack_str(&pk, g_fields[i].name);
        switch (g_fields[i].type) {
        case T_STR: mpk_pack_str(&pk, g->s[i]); break;
        case T_U32:
        case T_U64: msgpack_pack_uint64(&pk, g->u[i]); break;
        case T_LAYERS:
            msgpack_pack_array(&pk, g->n_layers);
            for (uint32_t j = 0; j < g->n_layers; j++) msgpack_pack_int32(&pk, g->layers[j]);
            break;
        }
    }
    if (f.need > cap)
        return err_fail(err, err_len, "descriptor needs %zu bytes, buffer has %zu", f.need, cap);
    *len = f.len;
    return 0;
}

int desc_batch_encode(const struct desc_batch *d, void *buf, size_t cap, size_t *len, char *err, int err_len) {
    if (desc_batch_validate(d, 0, err, err_len)) return -1;
    struct gen g;
    gen_from_batch(&g, d, DESC_KIND_BATCH);
    return gen_encode(&g, DESC_N_BATCH, buf, cap, len, err, err_len);
}

int desc_hidden_encode(const struct desc_hidden *d, void *buf, size_t cap, size_t *len, char *err, int err_len) {
    if (desc_hidden_validate(d, 0, err, err_len)) return -1;
    struct gen g;
    gen_from_batch(&g, &d->batch, DESC_KIND_HIDDEN);
    gen_states(&g, d->n_layers, d->layers, d->dtype, d->hidden_size, d->off_states, d->off_last, d->target_id);
    return gen_encode(&g, DESC_N_HIDDEN, buf, cap, len, err, err_len);
}

int desc_features_encode(const struct desc_features *d, void *buf, size_t cap, size_t *len, char *err, int err_len) {
    if (desc_features_validate(d, 0, err, err_len)) return -1;
    struct gen g;
    gen_from_batch(&g, &d->batch, DESC_KIND_FEATURES);
    gen_states(&g, d->n_layers, d->layers, d->dtype, d->hidden_size, d->off_states, d->off_last, d->target_id);
    snprintf(g.s[F_LAYOUT], sizeof g.s[0], "%s", desc_layout_name(d->layout));
    return gen_encode(&g, DESC_N_FEATURES, buf, cap, len, err, err_len);
}

/* ---------------------------------------------------------------- msgpack decoding */

/* Unpack buf into u (caller destroys it) and check it is exactly one map. */
static int unpack_map(const void *buf, size_t len, msgpack_unpacked *u, char *err, int err_len) {
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(u, buf, len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS)
        return err_fail(err, err_len, "descriptor: not a complete msgpack object (%zu bytes; unpack returned %d)", len, (int)r);
    if (off != len)
        return err_fail(err, err_len, "descriptor: %zu trailing bytes after the msgpack map", len - off);
    if (u->data.type != MSGPACK_OBJECT_MAP)
        return err_fail(err, err_len, "descriptor: expected a msgpack map, found %s", mpk_type_name(u->data.type));
    return 0;
}

/* Find the kind string of a map. */
static int map_kind(const msgpack_object *map, enum desc_kind *kind, char *err, int err_len) {
    const msgpack_object_map *m = &map->via.map;
    for (uint32_t i = 0; i < m->size; i++) {
        if (!mpk_key_is(&m->ptr[i].key, "kind")) continue;
        const msgpack_object *v = &m->ptr[i].val;
        if (v->type != MSGPACK_OBJECT_STR)
            return err_fail(err, err_len, "descriptor field 'kind': expected a string, found %s", mpk_type_name(v->type));
        static const struct { const char *name; enum desc_kind kind; } kinds[] = {
            {"batch", DESC_KIND_BATCH}, {"hidden", DESC_KIND_HIDDEN}, {"features", DESC_KIND_FEATURES}};
        for (size_t j = 0; j < sizeof kinds / sizeof kinds[0]; j++)
            if (mpk_key_is(v, kinds[j].name)) { *kind = kinds[j].kind; return 0; }
        return err_fail(err, err_len, "descriptor kind: expected batch, hidden or features, found '%.*s'",
                    (int)(v->via.str.size > 32 ? 32 : v->via.str.size), v->via.str.ptr);
    }
    return err_fail(err, err_len, "descriptor: the map has no 'kind' field");
}

int desc_peek_kind(const void *buf, size_t len, enum desc_kind *kind, char *err, int err_len) {
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = unpack_map(buf, len, &u, err, err_len);
    if (!rc) rc = map_kind(&u.data, kind, err, err_len);
    msgpack_unpacked_destroy(&u);
    return rc;
}

static int gen_decode(const void *buf, size_t len, enum desc_kind want, int n_fields, struct gen *g, char *err, int err_len) {
    memset(g, 0, sizeof *g);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    int rc = -1;
    enum desc_kind kind;
    if (unpack_map(buf, len, &u, err, err_len) || map_kind(&u.data, &kind, err, err_len)) goto out;
    if (kind != want) {
        err_fail(err, err_len, "descriptor kind: expected '%s', found '%s'", desc_kind_name(want), desc_kind_name(kind));
        goto out;
    }
    const msgpack_object_map *m = &u.data.via.map;
    /* The version first, so a newer producer gets "version" and not a confusing count error. */
    for (uint32_t i = 0; i < m->size; i++)
        if (mpk_key_is(&m->ptr[i].key, "version")) {
            const msgpack_object *v = &m->ptr[i].val;
            if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 != desc_version(want)) {
                if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                    err_fail(err, err_len, "%s descriptor version: expected %u, found %llu%s", desc_kind_name(want),
                             desc_version(want), (unsigned long long)v->via.u64,
                             v->via.u64 < desc_version(want) ? " (written by an older build: re-record or re-run the "
                                                               "producer)" : " (written by a newer build)");
                else
                    err_fail(err, err_len, "%s descriptor field 'version': expected an unsigned integer, found %s",
                         desc_kind_name(want), mpk_type_name(v->type));
                goto out;
            }
        }
    if (m->size != (uint32_t)n_fields) {
        err_fail(err, err_len, "%s descriptor: expected %d fields, found %u", desc_kind_name(want), n_fields, m->size);
        goto out;
    }
    int seen[F_COUNT] = {0};
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key, *v = &m->ptr[i].val;
        int f = -1;
        for (int j = 0; j < n_fields; j++)
            if (mpk_key_is(k, g_fields[j].name)) { f = j; break; }
        if (f < 0) {
            if (k->type == MSGPACK_OBJECT_STR)
                err_fail(err, err_len, "%s descriptor: unexpected field '%.*s'", desc_kind_name(want),
                     (int)(k->via.str.size > 32 ? 32 : k->via.str.size), k->via.str.ptr);
            else
                err_fail(err, err_len, "%s descriptor: a key is %s, expected a string", desc_kind_name(want), mpk_type_name(k->type));
            goto out;
        }
        if (seen[f]++) {
            err_fail(err, err_len, "%s descriptor: field '%s' appears twice", desc_kind_name(want), g_fields[f].name);
            goto out;
        }
        switch (g_fields[f].type) {
        case T_STR:
            if (v->type != MSGPACK_OBJECT_STR || v->via.str.size >= sizeof g->s[0]) {
                err_fail(err, err_len, "%s descriptor field '%s': expected a short string, found %s", desc_kind_name(want),
                     g_fields[f].name, mpk_type_name(v->type));
                goto out;
            }
            memcpy(g->s[f], v->via.str.ptr, v->via.str.size);
            g->s[f][v->via.str.size] = 0;
            break;
        case T_U32:
        case T_U64:
            if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
                err_fail(err, err_len, "%s descriptor field '%s': expected an unsigned integer, found %s", desc_kind_name(want),
                     g_fields[f].name, mpk_type_name(v->type));
                goto out;
            }
            if (g_fields[f].type == T_U32 && v->via.u64 > UINT32_MAX) {
                err_fail(err, err_len, "%s descriptor field '%s': %llu does not fit in 32 bits", desc_kind_name(want),
                     g_fields[f].name, (unsigned long long)v->via.u64);
                goto out;
            }
            g->u[f] = v->via.u64;
            break;
        case T_LAYERS:
            if (v->type != MSGPACK_OBJECT_ARRAY) {
                err_fail(err, err_len, "%s descriptor field 'layers': expected an array, found %s", desc_kind_name(want),
                     mpk_type_name(v->type));
                goto out;
            }
            if (v->via.array.size < 1 || v->via.array.size > DESC_MAX_LAYERS) {
                err_fail(err, err_len, "%s descriptor field 'layers': expected 1..%d layer ids, found %u", desc_kind_name(want),
                     DESC_MAX_LAYERS, v->via.array.size);
                goto out;
            }
            g->n_layers = v->via.array.size;
            for (uint32_t j = 0; j < g->n_layers; j++) {
                const msgpack_object *e = &v->via.array.ptr[j];
                if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > INT32_MAX) {
                    err_fail(err, err_len, "%s descriptor field 'layers'[%u]: expected a layer id >= 0, found %s",
                         desc_kind_name(want), j, e->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? "a value past 2^31" : mpk_type_name(e->type));
                    goto out;
                }
                g->layers[j] = (int32_t)e->via.u64;
            }
            break;
        }
    }
    rc = 0;  /* count matched and no key repeated or unknown, so every field is present */
out:
    msgpack_unpacked_destroy(&u);
    return rc;
}

static int parse_dtype(const struct gen *g, enum desc_dtype *dtype, const char *kind, char *err, int err_len) {
    if (!strcmp(g->s[F_DTYPE], "bf16")) *dtype = DESC_DTYPE_BF16;
    else if (!strcmp(g->s[F_DTYPE], "f32")) *dtype = DESC_DTYPE_F32;
    else return err_fail(err, err_len, "%s descriptor dtype: expected 'bf16' or 'f32', found '%s'", kind, g->s[F_DTYPE]);
    return 0;
}

int desc_batch_decode(const void *buf, size_t len, uint64_t payload_cap, struct desc_batch *d, char *err, int err_len) {
    struct gen g;
    if (gen_decode(buf, len, DESC_KIND_BATCH, DESC_N_BATCH, &g, err, err_len)) return -1;
    if (batch_from_gen(d, &g, "batch", err, err_len)) return -1;
    return desc_batch_validate(d, payload_cap, err, err_len);
}

int desc_hidden_decode(const void *buf, size_t len, uint64_t payload_cap, struct desc_hidden *d, char *err, int err_len) {
    struct gen g;
    memset(d, 0, sizeof *d);
    if (gen_decode(buf, len, DESC_KIND_HIDDEN, DESC_N_HIDDEN, &g, err, err_len)) return -1;
    if (batch_from_gen(&d->batch, &g, "hidden", err, err_len)) return -1;
    d->n_layers = g.n_layers;
    memcpy(d->layers, g.layers, sizeof d->layers);
    if (parse_dtype(&g, &d->dtype, "hidden", err, err_len)) return -1;
    d->hidden_size = (uint32_t)g.u[F_HIDDEN_SIZE];
    d->off_states = g.u[F_OFF_STATES];
    d->off_last = g.u[F_OFF_LAST];
    d->target_id = g.u[F_TARGET];
    return desc_hidden_validate(d, payload_cap, err, err_len);
}

int desc_features_decode(const void *buf, size_t len, uint64_t payload_cap, struct desc_features *d, char *err, int err_len) {
    struct gen g;
    memset(d, 0, sizeof *d);
    if (gen_decode(buf, len, DESC_KIND_FEATURES, DESC_N_FEATURES, &g, err, err_len)) return -1;
    if (batch_from_gen(&d->batch, &g, "features", err, err_len)) return -1;
    d->n_layers = g.n_layers;
    memcpy(d->layers, g.layers, sizeof d->layers);
    if (parse_dtype(&g, &d->dtype, "features", err, err_len)) return -1;
    if (!strcmp(g.s[F_LAYOUT], "concat")) d->layout = DESC_LAYOUT_CONCAT;
    else if (!strcmp(g.s[F_LAYOUT], "split")) d->layout = DESC_LAYOUT_SPLIT;
    else return err_fail(err, err_len, "features descriptor layout: expected 'concat' or 'split', found '%s'", g.s[F_LAYOUT]);
    d->hidden_size = (uint32_t)g.u[F_HIDDEN_SIZE];
    d->off_states = g.u[F_OFF_STATES];
    d->off_last = g.u[F_OFF_LAST];
    d->target_id = g.u[F_TARGET];
    return desc_features_validate(d, payload_cap, err, err_len);
}

/* ---------------------------------------------------------------- the run plan */

int desc_check_plan(const struct desc_batch *b, uint64_t stage_plan, const char *ring, char *err, int err_len) {
    if (!stage_plan || !b->plan || b->plan == stage_plan) return 0;
    char where[96] = "";
    if (ring) snprintf(where, sizeof where, "ring '%.60s' ", ring);
    return err_fail(err, err_len, "%sseq %llu was made under run plan %016llx, this stage read plan %016llx from its "
                    "run's plan.json: a stage of another run (or an older plan) feeds this ring", where,
                    (unsigned long long)b->seq, (unsigned long long)b->plan, (unsigned long long)stage_plan);
}

/* ---------------------------------------------------------------- the target's identity */

uint64_t desc_target_id(const void *config_json, size_t len) {
    const unsigned char *p = config_json;
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a 64 */
    for (size_t i = 0; i < len; i++) { h ^= p[i]; h *= 0x100000001b3ull; }
    return h ? h : 1;
}

int desc_target_id_of_model(const char *model_dir, uint64_t *id, char *err, int err_len) {
    char path[4096], *text = NULL, e2[512];
    size_t len = 0;
    if (snprintf(path, sizeof path, "%s/config.json", model_dir) >= (int)sizeof path)
        return err_fail(err, err_len, "model directory path too long: %s", model_dir);
    if (fs_read_file(path, &text, &len, e2, sizeof e2)) return err_fail(err, err_len, "the target's identity: %s", e2);
    *id = desc_target_id(text, len);
    free(text);
    return 0;
}
