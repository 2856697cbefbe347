/*
 * stages/hspack/hspack.c — layout conversion, reorder window and spill pool of dflash-hspack
 * (hspack.h). The conversion is pure data movement except for the optional dtype change: the
 * device path is one 2D (or 3D peer) copy per layer, so it costs what moving the bytes costs.
 */
#include "hspack/hspack.h"
#include "core/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---------------------------------------------------------------- conversion */

int hspack_plan(const void *in_desc, size_t in_len, uint64_t in_cap, const struct hspack_want *want,
                uint64_t out_cap, struct hspack_plan *p, char *err, int err_len) {
    char why[768];
    enum desc_kind kind;
    memset(p, 0, sizeof *p);
    if (desc_peek_kind(in_desc, in_len, &kind, why, sizeof why)) return err_fail(err, err_len, "descriptor rejected: %s", why);
    const int32_t *layers;
    if (kind == DESC_KIND_HIDDEN) {
        struct desc_hidden h;
        if (desc_hidden_decode(in_desc, in_len, in_cap, &h, why, sizeof why))
            return err_fail(err, err_len, "hidden descriptor rejected: %s", why);
        p->in_layout = DESC_LAYOUT_SPLIT;
        p->in_dtype = h.dtype;
        p->in_k = h.n_layers;
        p->in_off_states = h.off_states;
        p->in_off_last = h.off_last;
        p->in_batch = h.batch;
        memcpy(p->out.layers, h.layers, sizeof h.layers);
        p->out.hidden_size = h.hidden_size;
        p->out.target_id = h.target_id;
    } else if (kind == DESC_KIND_FEATURES) {
        struct desc_features f;
        if (desc_features_decode(in_desc, in_len, in_cap, &f, why, sizeof why))
            return err_fail(err, err_len, "features descriptor rejected: %s", why);
        p->in_layout = f.layout;
        p->in_dtype = f.dtype;
        p->in_k = f.n_layers;
        p->in_off_states = f.off_states;
        p->in_off_last = f.off_last;
        p->in_batch = f.batch;
        memcpy(p->out.layers, f.layers, sizeof f.layers);
        p->out.hidden_size = f.hidden_size;
        p->out.target_id = f.target_id;
    } else {
        return err_fail(err, err_len, "descriptor kind: expected 'hidden' or 'features', found '%s'", desc_kind_name(kind));
    }
    p->in_kind = kind;
    layers = p->out.layers;
    int32_t in_layers[DESC_MAX_LAYERS];
    memcpy(in_layers, layers, sizeof in_layers);
    unsigned long long seq = (unsigned long long)p->in_batch.seq;
    if (want->layout != DESC_LAYOUT_CONCAT && want->layout != DESC_LAYOUT_SPLIT)
        return err_fail(err, err_len, "seq %llu: output layout: expected concat or split, found %d", seq, (int)want->layout);
    uint32_t k = want->n_select ? want->n_select : p->in_k;
    if (k > DESC_MAX_LAYERS) return err_fail(err, err_len, "seq %llu: %u layers selected, at most %d", seq, k, DESC_MAX_LAYERS);
    for (uint32_t j = 0; j < k; j++) {
        if (!want->n_select) { p->src_layer[j] = j; continue; }
        uint32_t l = 0;
        while (l < p->in_k && in_layers[l] != want->select[j]) l++;
        if (l == p->in_k) {
            char have[256];
            int n = 0;
            have[0] = 0;
            for (uint32_t i = 0; i < p->in_k && n >= 0 && n < (int)sizeof have; i++)
                n += snprintf(have + n, sizeof have - (size_t)n, "%s%d", i ? "," : "", in_layers[i]);
            return err_fail(err, err_len, "seq %llu: layer %d selected but the item captured layers [%s]", seq,
                            want->select[j], have);
        }
        p->src_layer[j] = l;
    }
    for (uint32_t j = 0; j < k; j++) p->out.layers[j] = in_layers[p->src_layer[j]];
    for (uint32_t j = k; j < DESC_MAX_LAYERS; j++) p->out.layers[j] = 0;
    p->out.batch = p->in_batch;
    p->out.layout = want->layout;
    p->out.n_layers = k;
    p->out.dtype = want->dtype ? want->dtype : p->in_dtype;
    desc_features_layout(&p->out);
    if (out_cap && p->out.batch.payload_bytes > out_cap)
        return err_fail(err, err_len, "seq %llu: the features item needs %llu payload bytes, the output slot holds %llu", seq,
                        (unsigned long long)p->out.batch.payload_bytes, (unsigned long long)out_cap);
    size_t len;
    if (desc_features_encode(&p->out, p->out_desc, sizeof p->out_desc, &len, why, sizeof why))
        return err_fail(err, err_len, "seq %llu: features descriptor: %s", seq, why);
    p->out_desc_len = (uint32_t)len;
    return 0;
}

/* The six batch arrays: (input offset, output offset, bytes). */
static int batch_parts(const struct hspack_plan *p, uint64_t part[8][3]) {
    const struct desc_batch *a = &p->in_batch, *b = &p->out.batch;
    uint64_t T = a->n_tokens, D = a->n_docs;
    uint64_t v[6][3] = {
        {a->off_row_ids, b->off_row_ids, D * 8},          {a->off_input_ids, b->off_input_ids, T * 4},
        {a->off_loss_mask, b->off_loss_mask, T},          {a->off_position_ids, b->off_position_ids, T * 4},
        {a->off_doc_ids, b->off_doc_ids, T * 4},          {a->off_cu_seqlens, b->off_cu_seqlens, (D + 1) * 4},
    };
    memcpy(part, v, sizeof v);
    return 6;
}

/* Output gaps [start, end) between the canonical arrays (all arrays ascend in canonical order). */
static int out_gaps(const struct hspack_plan *p, uint64_t gap[10][2]) {
    const struct desc_features *f = &p->out;
    uint64_t T = f->batch.n_tokens, D = f->batch.n_docs, e = desc_dtype_bytes(f->dtype);
    uint64_t arr[8][2] = {
        {f->batch.off_row_ids, D * 8},          {f->batch.off_input_ids, T * 4},
        {f->batch.off_loss_mask, T},            {f->batch.off_position_ids, T * 4},
        {f->batch.off_doc_ids, T * 4},          {f->batch.off_cu_seqlens, (D + 1) * 4},
        {f->off_states, (uint64_t)f->n_layers * T * f->hidden_size * e}, {f->off_last, T * f->hidden_size * e},
    };
    int n = 0;
    uint64_t pos = 0;
    for (int i = 0; i < 8; i++) {
        if (arr[i][0] > pos) { gap[n][0] = pos; gap[n][1] = arr[i][0]; n++; }
        pos = arr[i][0] + arr[i][1];
    }
    if (f->batch.payload_bytes > pos) { gap[n][0] = pos; gap[n][1] = f->batch.payload_bytes; n++; }
    return n;
}

/* Byte offset of row t of captured layer l in a state tensor of the given layout. */
static uint64_t state_off(enum desc_layout layout, uint32_t k, uint64_t T, uint64_t H, uint64_t e, uint32_t l, uint64_t t) {
    return layout == DESC_LAYOUT_CONCAT ? ((t * k + l) * H) * e : ((l * T + t) * H) * e;
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x7fffffu)) return (uint16_t)((u >> 16) | 0x40);   /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);   /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* n elements from src (dtype a) to dst (dtype b). */
static void copy_row(void *dst, enum desc_dtype b, const void *src, enum desc_dtype a, uint64_t n) {
    if (a == b) { memcpy(dst, src, n * desc_dtype_bytes(a)); return; }
    if (a == DESC_DTYPE_F32) {
        const float *s = src;
        uint16_t *d = dst;
        for (uint64_t i = 0; i < n; i++) d[i] = f32_to_bf16(s[i]);
    } else {
        const uint16_t *s = src;
        float *d = dst;
        for (uint64_t i = 0; i < n; i++) d[i] = bf16_to_f32(s[i]);
    }
}

int hspack_convert_host(const struct hspack_plan *p, const void *in_payload, void *out_payload, char *err,
                        int err_len) {
    if (!in_payload || !out_payload) return err_fail(err, err_len, "hspack_convert_host: NULL payload");
    const char *in = in_payload;
    char *out = out_payload;
    uint64_t part[8][3], gap[10][2];
    int np = batch_parts(p, part);
    for (int i = 0; i < np; i++) memcpy(out + part[i][1], in + part[i][0], part[i][2]);
    int ng = out_gaps(p, gap);
    for (int i = 0; i < ng; i++) memset(out + gap[i][0], 0, gap[i][1] - gap[i][0]);
    const struct desc_features *f = &p->out;
    uint64_t T = f->batch.n_tokens, H = f->hidden_size, ei = desc_dtype_bytes(p->in_dtype), eo = desc_dtype_bytes(f->dtype);
    for (uint32_t j = 0; j < f->n_layers; j++) {
        uint32_t l = p->src_layer[j];
        if (p->in_layout == DESC_LAYOUT_SPLIT && f->layout == DESC_LAYOUT_SPLIT) {   /* one block per layer */
            copy_row(out + f->off_states + state_off(f->layout, f->n_layers, T, H, eo, j, 0), f->dtype,
                     in + p->in_off_states + state_off(p->in_layout, p->in_k, T, H, ei, l, 0), p->in_dtype, T * H);
            continue;
        }
        for (uint64_t t = 0; t < T; t++)
            copy_row(out + f->off_states + state_off(f->layout, f->n_layers, T, H, eo, j, t), f->dtype,
                     in + p->in_off_states + state_off(p->in_layout, p->in_k, T, H, ei, l, t), p->in_dtype, H);
    }
    copy_row(out + f->off_last, f->dtype, in + p->in_off_last, p->in_dtype, T * H);
    return 0;
}

#ifdef DFLASH_CUDA
/* One 2D copy: height rows of width bytes, with pitches, between any two of host/device. */
static cudaError_t copy_2d(char *dst, int dst_dev, uint64_t dpitch, const char *src, int src_dev, uint64_t spitch,
                           uint64_t width, uint64_t height, cudaStream_t stream) {
    if (dst_dev >= 0 && src_dev >= 0 && dst_dev != src_dev) {
        struct cudaMemcpy3DPeerParms q;
        memset(&q, 0, sizeof q);
        q.srcPtr.ptr = (void *)src;   /* make_cudaPitchedPtr is in driver_functions.h, not included here */
        q.srcPtr.pitch = spitch;
        q.srcPtr.xsize = width;
        q.srcPtr.ysize = height;
        q.dstPtr.ptr = dst;
        q.dstPtr.pitch = dpitch;
        q.dstPtr.xsize = width;
        q.dstPtr.ysize = height;
        q.srcDevice = src_dev;
        q.dstDevice = dst_dev;
        q.extent.width = width;
        q.extent.height = height;
        q.extent.depth = 1;
        return cudaMemcpy3DPeerAsync(&q, stream);
    }
    return cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, stream);
}

int hspack_convert_device(const struct hspack_plan *p, const void *in_payload, int in_device, void *out_payload,
                          int out_device, cudaStream_t stream, char *err, int err_len) {
    const struct desc_features *f = &p->out;
    if (f->dtype != p->in_dtype)
        return err_fail(err, err_len, "seq %llu: a dtype change (%s -> %s) is done on the host only",
                        (unsigned long long)f->batch.seq, desc_dtype_name(p->in_dtype), desc_dtype_name(f->dtype));
    const char *in = in_payload;
    char *out = out_payload;
    cudaError_t ce = cudaSuccess;
    uint64_t part[8][3], gap[10][2];
    int np = batch_parts(p, part);
    for (int i = 0; i < np && ce == cudaSuccess; i++)
        ce = copy_2d(out + part[i][1], out_device, part[i][2], in + part[i][0], in_device, part[i][2], part[i][2], 1, stream);
    int ng = out_gaps(p, gap);
    for (int i = 0; i < ng && ce == cudaSuccess; i++) {
        if (out_device >= 0) ce = cudaMemsetAsync(out + gap[i][0], 0, gap[i][1] - gap[i][0], stream);
        else memset(out + gap[i][0], 0, gap[i][1] - gap[i][0]);   /* host output: no device work to order against */
    }
    uint64_t T = f->batch.n_tokens, H = f->hidden_size, e = desc_dtype_bytes(f->dtype), row = H * e;
    uint64_t ipitch = p->in_layout == DESC_LAYOUT_CONCAT ? p->in_k * row : row;
    uint64_t opitch = f->layout == DESC_LAYOUT_CONCAT ? f->n_layers * row : row;
    for (uint32_t j = 0; j < f->n_layers && ce == cudaSuccess; j++) {
        uint32_t l = p->src_layer[j];
        ce = copy_2d(out + f->off_states + state_off(f->layout, f->n_layers, T, H, e, j, 0), out_device, opitch,
                     in + p->in_off_states + state_off(p->in_layout, p->in_k, T, H, e, l, 0), in_device, ipitch, row, T,
                     stream);
    }
    if (ce == cudaSuccess) ce = copy_2d(out + f->off_last, out_device, T * row, in + p->in_off_last, in_device, T * row, T * row, 1, stream);
    if (ce != cudaSuccess)
        return err_fail(err, err_len, "seq %llu: layout copy (device %d -> %d) failed: %s", (unsigned long long)f->batch.seq,
                        in_device, out_device, cudaGetErrorString(ce));
    return 0;
}
#endif

/* ---------------------------------------------------------------- reorder window */

int hspack_window_init(struct hspack_window *w, uint32_t held_max, uint32_t spill_max, uint64_t next, char *err,
                       int err_len) {
    memset(w, 0, sizeof *w);
    if (held_max < 1 || held_max + spill_max > HSPACK_MAX_WINDOW)
        return err_fail(err, err_len, "reorder window: expected 1 <= held (%u) and held + spill (%u) <= %d", held_max,
                        held_max + spill_max, HSPACK_MAX_WINDOW);
    w->held_max = held_max;
    w->spill_max = spill_max;
    w->next = next;
    seq_shard_all(&w->shard);
    return 0;
}

int hspack_window_set_shard(struct hspack_window *w, const struct seq_shard *s, char *err, int err_len) {
    if (hspack_window_depth(w))
        return err_fail(err, err_len, "reorder window: the shard is set before any seq enters (%u held)",
                        hspack_window_depth(w));
    w->shard = *s;
    w->next = seq_shard_next(s, w->next);
    return 0;
}

static int find(const struct hspack_window *w, uint64_t seq) {
    for (uint32_t i = 0; i < w->n_held + w->n_spilled; i++)
        if (w->e[i].seq == seq) return (int)i;
    return -1;
}

int hspack_window_is_dup(const struct hspack_window *w, uint64_t seq) { return seq < w->next || find(w, seq) >= 0; }

int hspack_window_has_room(const struct hspack_window *w, enum hspack_where where, uint64_t seq) {
    if (where == HSPACK_SPILLED) return w->n_spilled < w->spill_max;
    return seq == w->next ? w->n_held < w->held_max : w->n_held + 1 < w->held_max;
}

int hspack_window_put(struct hspack_window *w, uint64_t seq, enum hspack_where where, int ref, char *err, int err_len) {
    if (hspack_window_is_dup(w, seq))
        return err_fail(err, err_len, "reorder window: seq %llu is a duplicate (next is %llu)", (unsigned long long)seq,
                        (unsigned long long)w->next);
    if (!seq_shard_owns(&w->shard, seq))
        return err_fail(err, err_len, "reorder window: seq %llu is not this chain's (it takes the seqs s with %llu <= "
                        "s %% %llu < %llu: a several-host run's host shard)", (unsigned long long)seq,
                        (unsigned long long)w->shard.lo, (unsigned long long)w->shard.period,
                        (unsigned long long)w->shard.hi);
    if (!hspack_window_has_room(w, where, seq))
        return err_fail(err, err_len, "reorder window: no room for seq %llu (%u held of %u, %u spilled of %u)",
                        (unsigned long long)seq, w->n_held, w->held_max, w->n_spilled, w->spill_max);
    w->e[w->n_held + w->n_spilled] = (struct hspack_entry){seq, where, ref};
    if (where == HSPACK_HELD) w->n_held++;
    else { w->n_spilled++; w->n_spills++; }
    w->n_in++;
    if (hspack_window_depth(w) > w->max_depth) w->max_depth = hspack_window_depth(w);
    return 0;
}

void hspack_window_count_dup(struct hspack_window *w) { w->n_dups++; }

const struct hspack_entry *hspack_window_peek(const struct hspack_window *w) {
    int i = find(w, w->next);
    return i < 0 ? NULL : &w->e[i];
}

int hspack_window_take(struct hspack_window *w, struct hspack_entry *out) {
    int i = find(w, w->next);
    if (i < 0) return -1;
    *out = w->e[i];
    uint32_t n = w->n_held + w->n_spilled;
    w->e[i] = w->e[n - 1];
    if (out->where == HSPACK_HELD) w->n_held--;
    else w->n_spilled--;
    w->next = seq_shard_next(&w->shard, w->next + 1);
    w->n_out++;
    return 0;
}

const struct hspack_entry *hspack_window_spill_victim(const struct hspack_window *w) {
    const struct hspack_entry *best = NULL;
    for (uint32_t i = 0; i < w->n_held + w->n_spilled; i++)
        if (w->e[i].where == HSPACK_HELD && w->e[i].seq != w->next && (!best || w->e[i].seq > best->seq)) best = &w->e[i];
    return best;
}

int hspack_window_mark_spilled(struct hspack_window *w, uint64_t seq, int ref, char *err, int err_len) {
    int i = find(w, seq);
    if (i < 0 || w->e[i].where != HSPACK_HELD || w->n_spilled >= w->spill_max)
        return err_fail(err, err_len, "reorder window: cannot spill seq %llu (not held, or the spill pool is full)",
                        (unsigned long long)seq);
    w->e[i].where = HSPACK_SPILLED;
    w->e[i].ref = ref;
    w->n_held--;
    w->n_spilled++;
    w->n_spills++;
    return 0;
}

uint32_t hspack_window_depth(const struct hspack_window *w) { return w->n_held + w->n_spilled; }

void hspack_window_range(const struct hspack_window *w, uint64_t *lo, uint64_t *hi) {
    *lo = *hi = 0;
    for (uint32_t i = 0; i < w->n_held + w->n_spilled; i++) {
        if (!i || w->e[i].seq < *lo) *lo = w->e[i].seq;
        if (!i || w->e[i].seq > *hi) *hi = w->e[i].seq;
    }
}

/* ---------------------------------------------------------------- spill pool */

int hspack_spill_init(struct hspack_spill *s, uint32_t n, uint64_t item_bytes, int pinned, char *err, int err_len) {
    memset(s, 0, sizeof *s);
    if (n > HSPACK_MAX_WINDOW) return err_fail(err, err_len, "spill pool: %u buffers, at most %d", n, HSPACK_MAX_WINDOW);
    s->item_bytes = (item_bytes + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN;
    s->n = n;
    if (!n || !s->item_bytes) return 0;
    uint64_t total = s->item_bytes * n;
#ifdef DFLASH_CUDA
    if (pinned) {
        void *p = NULL;
        cudaError_t ce = cudaMallocHost(&p, total);
        if (ce != cudaSuccess)
            return err_fail(err, err_len, "spill pool: cudaMallocHost(%llu bytes) failed: %s", (unsigned long long)total,
                            cudaGetErrorString(ce));
        s->base = p;
        s->pinned = 1;
        return 0;
    }
#else
    (void)pinned;
#endif
    s->base = aligned_alloc(DESC_ALIGN, total);
    if (!s->base) return err_fail(err, err_len, "spill pool: out of memory for %llu bytes", (unsigned long long)total);
    return 0;
}

int hspack_spill_get(struct hspack_spill *s) {
    for (uint32_t i = 0; i < s->n; i++)
        if (!s->used[i]) { s->used[i] = 1; s->n_used++; return (int)i; }
    return -1;
}

void *hspack_spill_ptr(const struct hspack_spill *s, int i) { return s->base + (uint64_t)i * s->item_bytes; }

void hspack_spill_put(struct hspack_spill *s, int i) {
    if (i >= 0 && (uint32_t)i < s->n && s->used[i]) { s->used[i] = 0; s->n_used--; }
}

void hspack_spill_free(struct hspack_spill *s) {
#ifdef DFLASH_CUDA
    if (s->pinned && s->base) cudaFreeHost(s->base);
    else
#endif
    free(s->base);
    memset(s, 0, sizeof *s);
}
