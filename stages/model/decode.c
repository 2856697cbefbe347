/*
 * stages/model/decode.c — the KV-cached decode step (model/decode.h): one interface, a CPU implementation
 * (extend_cpu: the kernels' fp32 references) and a GPU one (extend_gpu: the bf16 launchers on the target's
 * stream). Both run target.c's layer sequence; only the attention reads its keys and values from the cache
 * (kernels/decode_attn.h), after appending the step's own. A Qwen3.5 / 3.6 hybrid's Gated DeltaNet layers carry
 * their conv input rows and recurrent state per slot: on the CPU the whole history (gdn.c's rows), on the GPU a
 * ring of the last positions (kernels/conv1d.h's decode pair) and kernels/gated_delta.h's decode step.
 */
#include "model/decode.h"
#include "core/err.h"
#include "model/gdn.h"
#include "kernels/argmax.h"

#include "kernels/decode_attn.h"
#include "kernels/embedding.h"
#include "kernels/gated_attn.h"
#include "kernels/gated_delta.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#ifdef DFLASH_CUDA
#include "kernels/blas.h"
#include "kernels/cast.h"
#include "kernels/conv1d.h"
#include "kernels/gated_rmsnorm.h"
#include "kernels/l2norm.h"
#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct decode {
    struct target *t;
    const struct model_config *c;
    int dev;                    /* -1 CPU, else the CUDA ordinal */
    int n_slots, max_len, max_step;
    int *len;                   /* (n_slots) */
    int32_t *row_slot, *row_pos;/* (max_step) host: the slot and position of each row of a step */
    int last_T;                 /* rows of the last decode_extend */
    size_t cache_bytes, dev_bytes;
    /* CPU: caches and work fp32 host; GPU: caches and work bf16 device */
    void *kc, *vc;              /* (L, n_slots, max_len, NKV·HD) */
    void *x, *h, *qkv, *q, *k, *v, *att, *gu, *act;   /* (max_step rows) */
    double *scratch;            /* CPU attention scratch (max_len + HD) */
    /* Qwen3.5 hybrid: caches only for the full-attention layers, recurrent state for the linear ones; CPU buffers
     * fp32 host, GPU buffers device (the ring bf16, states and the delta rule's rows fp32) */
    int hybrid, n_attn, n_lin;
    int attn_idx[HF_MAX_LAYERS], lin_idx[HF_MAX_LAYERS];   /* layer -> its cache / state index, or -1 */
    struct gdn_shape gs;
    int ring;                   /* positions per slot in lin_hist: CPU max_len (position p at p), GPU a ring
                                 * (position p at p % ring) of the rows one step and a rollback can reach */
    void *gate;                 /* (max_step, NH·HD) attention output gate */
    void *lin_hist;             /* (n_lin, n_slots, ring, conv_dim) conv input rows by position */
    float *lin_state;           /* (n_lin, n_slots, n_v·d_k·d_v) live recurrent states */
    float *lin_snap;            /* (n_lin, n_slots, DECODE_STATE_SNAPS, n_v·d_k·d_v) state after position p, at
                                 * p % DECODE_STATE_SNAPS */
    int *snap_pos;              /* (n_slots, DECODE_STATE_SNAPS) host: the position each snapshot holds, -1 none */
    float *lin_conv, *lin_o;    /* (max_step, conv_dim); GPU (max_step, n_v·d_v) the delta rule's output */
    void *lin_y;                /* (max_step, n_v·d_v) the gated norm's output (CPU fp32 = the layer's y) */
    /* head (decode_set_head) */
    const float *norm_h, *head_h;   /* CPU: the caller's (C), (V, C) */
    int max_rows;
    float *logits_one;              /* CPU: (V) one row's logits for decode_argmax */
#ifdef DFLASH_CUDA
    cudaStream_t s;
    int32_t *d_ids, *d_slot, *d_pos;   /* (max_step) device */
    int32_t *d_cu, *d_sslot, *d_spos;  /* (n_slots + 1), (n_slots), (n_slots) device: a step's sequences */
    float *d_f32;               /* (max_step, C) fp32 staging of a captured layer or last */
    float *d_norm;              /* (C) */
    bf16 *d_head;               /* (V, C) */
    bf16 *d_xr, *d_xn;          /* (max_rows, C) gathered rows, normed rows */
    float *d_logits;            /* (max_rows, V) */
    int32_t *d_arg;             /* (max_rows) decode_argmax's picks */
#endif
};

/* ---------------------------------------------------------------- init / free */

static void mem_free(struct decode *d, void *p) {
    if (!p) return;
#ifdef DFLASH_CUDA
    if (d->dev >= 0) {
        cudaFree(p);
        return;
    }
#endif
    (void)d;
    free(p);
}

void decode_free(struct decode *d) {
    if (!d) return;
#ifdef DFLASH_CUDA
    if (d->dev >= 0) {
        cudaSetDevice(d->dev);
        void *dv[] = {d->d_ids, d->d_slot, d->d_pos, d->d_cu, d->d_sslot, d->d_spos, d->d_f32, d->d_norm, d->d_head,
                      d->d_xr, d->d_xn, d->d_logits, d->d_arg};
        for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++)
            if (dv[i]) cudaFree(dv[i]);
    }
#endif
    void *bufs[] = {d->kc,   d->vc,       d->x,         d->h,        d->qkv,      d->q,        d->k,
                    d->v,    d->att,      d->gu,        d->act,      d->gate,     d->lin_hist, d->lin_state,
                    d->lin_snap, d->lin_conv, d->lin_o, d->lin_y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mem_free(d, bufs[i]);
    free(d->len);
    free(d->row_slot);
    free(d->row_pos);
    free(d->scratch);
    free(d->snap_pos);
    free(d->logits_one);
    free(d);
}

#ifdef DFLASH_CUDA
/* Elements of one step row of work: x, h, qkv (qkv_w wide), q, k, v, att, gu, act. */
static size_t work_row_elems(const struct model_config *c, size_t qkv_w) {
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, HD = (size_t)c->head_dim;
    size_t NH = (size_t)c->num_attention_heads, NKV = (size_t)c->num_key_value_heads;
    return 2 * C + qkv_w + 2 * NH * HD + 2 * NKV * HD + 3 * I;
}
#endif

static void *dalloc(struct decode *d, size_t bytes, int *ok) {
    if (!*ok) return NULL;
    void *p = NULL;
    if (bytes == 0) bytes = 16;
#ifdef DFLASH_CUDA
    if (d->dev >= 0) {
        if (cudaMalloc(&p, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            *ok = 0;
            return NULL;
        }
        d->dev_bytes += bytes;
        return p;
    }
#endif
    (void)d;
    if (!(p = malloc(bytes))) *ok = 0;
    return p;
}

struct decode *decode_init(struct target *t, int n_slots, int max_len, int max_step_tokens, char *err, int err_len) {
    const struct model_config *c = target_config(t);
    int hybrid = c->arch == HF_ARCH_QWEN3_5;
    if (c->num_hidden_layers > HF_MAX_LAYERS) {
        err_fail(err, err_len, "decode: %d layers, at most %d", c->num_hidden_layers, HF_MAX_LAYERS);
        return NULL;
    }
    if (n_slots < 1 || max_len < 1 || max_step_tokens < 1) {
        err_fail(err, err_len, "decode: %d slots of %d tokens, %d per step", n_slots, max_len, max_step_tokens);
        return NULL;
    }
    int dev = target_device(t);
#ifndef DFLASH_CUDA
    if (dev >= 0) {
        err_fail(err, err_len, "decode: a GPU target in a build without CUDA");
        return NULL;
    }
#endif
    int C = c->hidden_size, HD = c->head_dim, NKV = c->num_key_value_heads, L = c->num_hidden_layers;
    int I = c->intermediate_size, NH = c->num_attention_heads, QKV = ((hybrid ? 2 : 1) * NH + 2 * NKV) * HD;
    int n_attn = 0, n_lin = 0;
    for (int l = 0; l < L; l++) n_attn += !(hybrid && c->layer_linear[l]);
    n_lin = L - n_attn;
    size_t es = dev >= 0 ? 2 : 4, cache = (size_t)n_attn * n_slots * max_len * NKV * HD, T = (size_t)max_step_tokens;
    /* the hybrid's Gated DeltaNet: its projection rows share qkv; the GPU keeps a ring of the last positions a step
     * (its own rows and the K - 1 before them) and a rollback into the last DECODE_STATE_SNAPS tokens can reach */
    struct gdn_shape gs = {0};
    size_t qkv_w = (size_t)QKV, D = 0, SS = 0, VD = 0, lin_bytes = 0;
    int ring = max_len;
    if (hybrid) {
        gs = (struct gdn_shape){c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                                c->linear_value_head_dim, c->linear_conv_kernel_dim};
        D = (size_t)gdn_conv_dim(&gs);
        SS = (size_t)gs.n_v * gs.d_k * gs.d_v;
        VD = (size_t)gs.n_v * gs.d_v;
        if ((size_t)gdn_in_dim(&gs) > qkv_w) qkv_w = (size_t)gdn_in_dim(&gs);
        if (dev >= 0 && max_step_tokens + DECODE_STATE_SNAPS + gs.K - 1 < ring)
            ring = max_step_tokens + DECODE_STATE_SNAPS + gs.K - 1;
        lin_bytes = (size_t)n_lin * n_slots * ((size_t)ring * D * es + (1 + DECODE_STATE_SNAPS) * SS * 4);
        char why[200];
        if (dev >= 0 && gated_delta_check_shape(gs.n_k, gs.n_v, gs.d_k, gs.d_v, why, sizeof why)) {
            err_fail(err, err_len, "decode: %s", why);
            return NULL;
        }
        if (dev >= 0 && gs.d_v > 256) {
            err_fail(err, err_len, "decode: linear_value_head_dim %d: the GPU decode step takes at most 256", gs.d_v);
            return NULL;
        }
    }
#ifdef DFLASH_CUDA
    if (dev >= 0) {
        /* the whole plan against the device's free memory, before allocating anything: one line when it does not
         * fit (the head's buffers come later, decode_set_head, and are small beside the cache) */
        size_t need = 2 * cache * es + lin_bytes + T * work_row_elems(c, qkv_w) * es + T * (size_t)C * 4 + 3 * T * 4;
        if (hybrid) need += T * ((size_t)NH * HD * es + D * 4 + VD * 4 + VD * es) + 3 * ((size_t)n_slots + 1) * 4;
        size_t free_b = 0, total_b = 0;
        cudaError_t e = cudaSetDevice(dev);
        if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
        if (e != cudaSuccess) {
            err_fail(err, err_len, "decode: cuda:%d: %s", dev, cudaGetErrorString(e));
            return NULL;
        }
        size_t reserve = (size_t)512 << 20;   /* cuBLASLt workspace, the CUDA context's growth */
        if (need + reserve > free_b) {
            err_fail(err, err_len, "decode: %d slots x %d tokens need %.2f GiB on cuda:%d (KV cache %.2f GiB, "
                     "recurrent states and conv rows %.2f GiB, work for %d tokens per step %.2f GiB, + 0.5 GiB "
                     "reserve) but %.2f GiB are free; lower --batch or the length", n_slots, max_len,
                     (double)need / (1 << 30), dev, (double)(2 * cache * es) / (1 << 30),
                     (double)lin_bytes / (1 << 30), max_step_tokens,
                     (double)(need - 2 * cache * es - lin_bytes) / (1 << 30), (double)free_b / (1 << 30));
            return NULL;
        }
    }
#endif
    struct decode *d = calloc(1, sizeof *d);
    if (!d) {
        err_fail(err, err_len, "decode: out of memory");
        return NULL;
    }
    d->t = t;
    d->c = c;
    d->dev = dev;
    d->n_slots = n_slots;
    d->max_len = max_len;
    d->max_step = max_step_tokens;
    d->hybrid = hybrid;
    d->gs = gs;
    d->ring = ring;
    d->n_attn = n_attn;
    for (int l = 0; l < L; l++) {
        int lin = hybrid && c->layer_linear[l];
        d->attn_idx[l] = lin ? -1 : l - d->n_lin;
        d->lin_idx[l] = lin ? d->n_lin++ : -1;
    }
    d->cache_bytes = 2 * cache * es;
    d->len = calloc((size_t)n_slots, sizeof *d->len);
    d->row_slot = malloc(T * sizeof(int32_t));
    d->row_pos = malloc(T * sizeof(int32_t));
    int ok = d->len && d->row_slot && d->row_pos;
    d->kc = dalloc(d, cache * es, &ok);
    d->vc = dalloc(d, cache * es, &ok);
    d->x = dalloc(d, T * C * es, &ok);
    d->h = dalloc(d, T * C * es, &ok);
    d->qkv = dalloc(d, T * qkv_w * es, &ok);
    d->q = dalloc(d, T * NH * HD * es, &ok);
    d->k = dalloc(d, T * NKV * HD * es, &ok);
    d->v = dalloc(d, T * NKV * HD * es, &ok);
    d->att = dalloc(d, T * NH * HD * es, &ok);
    d->gu = dalloc(d, T * 2 * I * es, &ok);
    d->act = dalloc(d, T * I * es, &ok);
    if (dev < 0) {
        d->scratch = malloc(((size_t)max_len + HD + 1) * sizeof(double));
        ok = ok && d->scratch;
    }
    if (hybrid && ok) {
        size_t nl = (size_t)n_lin, ns = (size_t)n_slots;
        d->gate = dalloc(d, T * NH * HD * es, &ok);
        d->lin_hist = dalloc(d, nl * ns * (size_t)ring * D * es, &ok);
        d->lin_state = dalloc(d, nl * ns * SS * sizeof(float), &ok);
        d->lin_snap = dalloc(d, nl * ns * DECODE_STATE_SNAPS * SS * sizeof(float), &ok);
        d->lin_conv = dalloc(d, T * D * sizeof(float), &ok);
        d->lin_y = dalloc(d, T * VD * es, &ok);
        if (dev >= 0) d->lin_o = dalloc(d, T * VD * sizeof(float), &ok);
        d->snap_pos = malloc(ns * DECODE_STATE_SNAPS * sizeof(int));
        ok = ok && d->snap_pos;
        if (ok) {
            for (size_t i = 0; i < ns * DECODE_STATE_SNAPS; i++) d->snap_pos[i] = -1;
#ifdef DFLASH_CUDA
            if (dev >= 0) ok = cudaMemset(d->lin_state, 0, nl * ns * SS * sizeof(float)) == cudaSuccess;
            else
#endif
                memset(d->lin_state, 0, nl * ns * SS * sizeof(float));
        }
        d->cache_bytes += lin_bytes;
    }
#ifdef DFLASH_CUDA
    if (dev >= 0) {
        d->s = target_stream(t);
        d->d_ids = dalloc(d, T * 4, &ok);
        d->d_slot = dalloc(d, T * 4, &ok);
        d->d_pos = dalloc(d, T * 4, &ok);
        d->d_f32 = dalloc(d, T * C * 4, &ok);
        if (hybrid) {
            d->d_cu = dalloc(d, ((size_t)n_slots + 1) * 4, &ok);
            d->d_sslot = dalloc(d, (size_t)n_slots * 4, &ok);
            d->d_spos = dalloc(d, (size_t)n_slots * 4, &ok);
        }
    }
#endif
    if (!ok) {
        err_fail(err, err_len, "decode: out of %s memory for %d slots x %d tokens (%.1f MiB of cache)",
                 dev >= 0 ? "GPU" : "host", n_slots, max_len, (double)d->cache_bytes / (1 << 20));
        decode_free(d);
        return NULL;
    }
    return d;
}

int decode_len(const struct decode *d, int slot) { return slot >= 0 && slot < d->n_slots ? d->len[slot] : -1; }

size_t decode_cache_bytes(const struct decode *d) { return d->cache_bytes; }
size_t decode_device_bytes(const struct decode *d) { return d->dev_bytes; }

int decode_truncate(struct decode *d, int slot, int len, char *err, int err_len) {
    if (slot < 0 || slot >= d->n_slots) return err_fail(err, err_len, "decode: slot %d of %d", slot, d->n_slots);
    if (len < 0 || len > d->len[slot])
        return err_fail(err, err_len, "decode: truncate slot %d to %d tokens, it holds %d", slot, len, d->len[slot]);
    if (d->hybrid && len < d->len[slot]) {
        /* the recurrent state cannot be rewound: it is restored from the snapshot taken after position len - 1 */
        size_t SS = (size_t)d->gs.n_v * d->gs.d_k * d->gs.d_v, ns = (size_t)d->n_slots;
        int *sp = d->snap_pos + (size_t)slot * DECODE_STATE_SNAPS, e = len > 0 ? (len - 1) % DECODE_STATE_SNAPS : 0;
        if (len > 0 && sp[e] != len - 1)
            return err_fail(err, err_len, "decode: slot %d: a Qwen3.5 recurrent state rolls back only into the last "
                            "%d tokens of the slot's last step (to %d tokens asked, it holds %d)", slot,
                            DECODE_STATE_SNAPS, len, d->len[slot]);
        for (int li = 0; li < d->n_lin; li++) {
            float *live = d->lin_state + ((size_t)li * ns + slot) * SS;
            const float *snap = d->lin_snap + (((size_t)li * ns + slot) * DECODE_STATE_SNAPS + e) * SS;
#ifdef DFLASH_CUDA
            if (d->dev >= 0) {   /* on the decode stream: ordered after the last step, before the next */
                cudaError_t ce = cudaSetDevice(d->dev);
                if (ce == cudaSuccess)
                    ce = len == 0 ? cudaMemsetAsync(live, 0, SS * sizeof(float), d->s)
                                  : cudaMemcpyAsync(live, snap, SS * sizeof(float), cudaMemcpyDeviceToDevice, d->s);
                if (ce != cudaSuccess)
                    return err_fail(err, err_len, "decode: restoring slot %d's recurrent state: %s", slot,
                                    cudaGetErrorString(ce));
                continue;
            }
#endif
            if (len == 0) memset(live, 0, SS * sizeof(float));
            else memcpy(live, snap, SS * sizeof(float));
        }
        for (int i = 0; i < DECODE_STATE_SNAPS; i++)
            if (sp[i] >= len) sp[i] = -1;   /* positions of the abandoned branch */
    }
    d->len[slot] = len;
    return 0;
}

/* The positions of the state snapshots a hybrid step took (the last DECODE_STATE_SNAPS tokens of each sequence),
 * for every linear layer at once; called after the step, before the lengths move. */
static void note_snapshots(struct decode *d, int n_seq, const int *slots, const int32_t *cu) {
    for (int i = 0; i < n_seq; i++) {
        int s = slots[i], m = cu[i + 1] - cu[i];
        for (int r = m > DECODE_STATE_SNAPS ? m - DECODE_STATE_SNAPS : 0; r < m; r++)
            d->snap_pos[(size_t)s * DECODE_STATE_SNAPS + (d->len[s] + r) % DECODE_STATE_SNAPS] = d->len[s] + r;
    }
}

/* ---------------------------------------------------------------- CPU */

/* Layer l's MLP block on x (x += down(swiglu(gate_up(norm(x))))), then its captured plane into states. */
static void step_mlp_cpu(struct decode *d, const struct target_layer_view *ly, int l, int T, float *states) {
    const struct model_config *c = d->c;
    int C = c->hidden_size, I = c->intermediate_size, n_cap = target_n_capture(d->t);
    const int *cap = target_capture(d->t);
    size_t plane = (size_t)T * C;
    float *x = d->x, *h = d->h, *gu = d->gu, *act = d->act;
    rmsnorm_forward_ref(h, NULL, x, ly->ln_post, T, C, (float)c->rms_norm_eps);
    gemm_forward_ref(gu, h, 0, ly->w_gu, 1, T, 2 * I, C, 1.0f, 0.0f);
    swiglu_forward_ref(act, gu, gu + I, T, I, 2 * I);
    gemm_forward_ref(x, act, 0, ly->w_down, 1, T, C, I, 1.0f, 1.0f);
    if (states)
        for (int j = 0; j < n_cap; j++)
            if (cap[j] == l) memcpy(states + (size_t)j * plane, x, plane * sizeof(float));
}

static int extend_cpu(struct decode *d, int T, const int32_t *ids, float *states, float *last, char *err,
                      int err_len) {
    const struct model_config *c = d->c;
    int C = c->hidden_size, HD = c->head_dim, NH = c->num_attention_heads;
    int NKV = c->num_key_value_heads, L = c->num_hidden_layers, QKV = (NH + 2 * NKV) * HD;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    size_t kvrow = (size_t)NKV * HD, layer = (size_t)d->n_slots * d->max_len * kvrow, plane = (size_t)T * C;
    float *x = d->x, *h = d->h, *qkv = d->qkv, *q = d->q, *k = d->k, *v = d->v, *att = d->att;
    if (embedding_forward_ref(x, ids, target_cpu_embed(d->t), T, C, c->vocab_size))
        return err_fail(err, err_len, "decode: %s", kernels_error());
    for (int l = 0; l < L; l++) {
        struct target_layer_view ly;
        if (target_cpu_layer(d->t, l, &ly, err, err_len)) return -1;
        rmsnorm_forward_ref(h, NULL, x, ly.ln_in, T, C, eps);
        gemm_forward_ref(qkv, h, 0, ly.w_qkv, 1, T, QKV, C, 1.0f, 0.0f);
        size_t nq = (size_t)NH * HD;
        for (int r = 0; r < T; r++) {
            const float *row = qkv + (size_t)r * QKV;
            memcpy(q + (size_t)r * nq, row, nq * sizeof(float));
            memcpy(k + (size_t)r * kvrow, row + nq, kvrow * sizeof(float));
            memcpy(v + (size_t)r * kvrow, row + nq + kvrow, kvrow * sizeof(float));
        }
        if (c->qk_norm) {
            rmsnorm_forward_ref(q, NULL, q, ly.q_norm, T * NH, HD, eps);
            rmsnorm_forward_ref(k, NULL, k, ly.k_norm, T * NKV, HD, eps);
        }
        rope_forward_ref(q, k, d->row_pos, target_cpu_inv_freq(d->t), T, NH, NKV, HD);
        float *kc = (float *)d->kc + (size_t)l * layer, *vc = (float *)d->vc + (size_t)l * layer;
        if (decode_attn_append_ref(kc, vc, k, v, d->row_slot, d->row_pos, T, d->n_slots, d->max_len, NKV, HD) ||
            decode_attn_forward_ref(att, q, kc, vc, d->row_slot, d->row_pos, T, d->n_slots, d->max_len, NH, NKV, HD,
                                    scale, d->scratch))
            return err_fail(err, err_len, "decode: %s", kernels_error());
        gemm_forward_ref(x, att, 0, ly.w_o, 1, T, C, NH * HD, 1.0f, 1.0f);
        step_mlp_cpu(d, &ly, l, T, states);
    }
    if (last) memcpy(last, x, plane * sizeof(float));
    return 0;
}

/* Qwen3.5 / 3.6 hybrid, CPU: forward_cpu_hybrid's layer sequence (target.c). A full-attention layer reads its
 * keys and values from the cache; a Gated DeltaNet layer appends the step's conv input rows to the slot's history,
 * convolves them (gdn_conv_rows reads the K - 1 rows before them there) and runs the recurrence token by token
 * from the slot's live state, keeping a snapshot after each of the step's last DECODE_STATE_SNAPS tokens for
 * decode_truncate. Every row's arithmetic is the full forward's, so the outputs are bitwise its own. */
static int extend_cpu_hybrid(struct decode *d, int n_seq, const int *slots, const int32_t *cu, int T,
                             const int32_t *ids, float *states, float *last, char *err, int err_len) {
    const struct model_config *c = d->c;
    int C = c->hidden_size, HD = c->head_dim, NH = c->num_attention_heads;
    int NKV = c->num_key_value_heads, L = c->num_hidden_layers, QKV = (2 * NH + 2 * NKV) * HD;
    int R = hf_config_rotary_dim(c);
    const struct gdn_shape *gs = &d->gs;
    int D = gdn_conv_dim(gs), LIN_IN = gdn_in_dim(gs), VD = gs->n_v * gs->d_v;
    size_t SS = (size_t)gs->n_v * gs->d_k * gs->d_v, ns = (size_t)d->n_slots;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    size_t kvrow = (size_t)NKV * HD, layer = (size_t)d->n_slots * d->max_len * kvrow, plane = (size_t)T * C;
    float *x = d->x, *h = d->h, *qkv = d->qkv, *q = d->q, *k = d->k, *v = d->v, *att = d->att;
    if (embedding_forward_ref(x, ids, target_cpu_embed(d->t), T, C, c->vocab_size))
        return err_fail(err, err_len, "decode: %s", kernels_error());
    for (int l = 0; l < L; l++) {
        struct target_layer_view ly;
        if (target_cpu_layer(d->t, l, &ly, err, err_len)) return -1;
        rmsnorm_forward_ref(h, NULL, x, ly.ln_in, T, C, eps);
        if (ly.linear) {
            int li = d->lin_idx[l];
            gemm_forward_ref(qkv, h, 0, ly.w_lin_in, 1, T, LIN_IN, C, 1.0f, 0.0f);
            for (int i = 0; i < n_seq; i++) {
                int s = slots[i], r0 = cu[i], m = cu[i + 1] - cu[i], len0 = d->len[s];
                float *hist = (float *)d->lin_hist + ((size_t)li * ns + s) * d->max_len * D;
                float *live = d->lin_state + ((size_t)li * ns + s) * SS;
                for (int r = 0; r < m; r++)
                    memcpy(hist + (size_t)(len0 + r) * D, qkv + (size_t)(r0 + r) * LIN_IN, (size_t)D * sizeof(float));
                gdn_conv_rows(d->lin_conv + (size_t)r0 * D, hist, D, len0, len0 + m, gs, ly.conv_w);
                for (int r = 0; r < m; r++) {
                    gdn_recur_rows((float *)d->lin_y + (size_t)(r0 + r) * VD, d->lin_conv + (size_t)(r0 + r) * D,
                                   qkv + (size_t)(r0 + r) * LIN_IN, LIN_IN, 1, gs, ly.a_neg, ly.dt_bias, ly.gnorm, eps,
                                   live);
                    int p = len0 + r;
                    if (r >= m - DECODE_STATE_SNAPS)
                        memcpy(d->lin_snap + (((size_t)li * ns + s) * DECODE_STATE_SNAPS + p % DECODE_STATE_SNAPS) * SS,
                               live, SS * sizeof(float));
                }
            }
            gemm_forward_ref(x, d->lin_y, 0, ly.w_lin_out, 1, T, C, VD, 1.0f, 1.0f);   /* x += y · W_outᵀ */
        } else {
            gemm_forward_ref(qkv, h, 0, ly.w_qkv, 1, T, QKV, C, 1.0f, 0.0f);
            gated_attn_split_forward_ref(q, d->gate, k, v, qkv, T, NH, NKV, HD);
            rmsnorm_forward_ref(q, NULL, q, ly.q_norm, T * NH, HD, eps);
            rmsnorm_forward_ref(k, NULL, k, ly.k_norm, T * NKV, HD, eps);
            gated_attn_rope_forward_ref(q, d->row_pos, target_cpu_inv_freq(d->t), T, NH, HD, R);
            gated_attn_rope_forward_ref(k, d->row_pos, target_cpu_inv_freq(d->t), T, NKV, HD, R);
            float *kc = (float *)d->kc + (size_t)d->attn_idx[l] * layer;
            float *vc = (float *)d->vc + (size_t)d->attn_idx[l] * layer;
            if (decode_attn_append_ref(kc, vc, k, v, d->row_slot, d->row_pos, T, d->n_slots, d->max_len, NKV, HD) ||
                decode_attn_forward_ref(att, q, kc, vc, d->row_slot, d->row_pos, T, d->n_slots, d->max_len, NH, NKV,
                                        HD, scale, d->scratch))
                return err_fail(err, err_len, "decode: %s", kernels_error());
            gated_attn_gate_forward_ref(att, d->gate, (int64_t)T * NH * HD);
            gemm_forward_ref(x, att, 0, ly.w_o, 1, T, C, NH * HD, 1.0f, 1.0f);
        }
        step_mlp_cpu(d, &ly, l, T, states);
    }
    if (last) memcpy(last, x, plane * sizeof(float));
    note_snapshots(d, n_seq, slots, cu);
    return 0;
}

/* The arithmetic of eval_target_logits (stages/export/eval.c): double sum of squares, fp32 products. */
static void logits_cpu(struct decode *d, int n_rows, const int32_t *rows, float *logits) {
    int H = d->c->hidden_size, V = d->c->vocab_size;
    float xn[H];
    for (int i = 0; i < n_rows; i++) {
        const float *x = (const float *)d->x + (size_t)rows[i] * H;
        double ss = 0;
        for (int c = 0; c < H; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / H + d->c->rms_norm_eps));
        for (int c = 0; c < H; c++) xn[c] = x[c] * r * d->norm_h[c];
        float *out = logits + (size_t)i * V;
        for (int v = 0; v < V; v++) {
            const float *w = d->head_h + (size_t)v * H;
            float s = 0;
            for (int c = 0; c < H; c++) s += w[c] * xn[c];
            out[v] = s;
        }
    }
}

/* ---------------------------------------------------------------- GPU */

#ifdef DFLASH_CUDA
#define KCALL(call) do { if ((call) != 0) return err_fail(err, err_len, "decode: %s", kernels_error()); } while (0)
#define CCALL(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return err_fail(err, err_len, \
                         "decode: %s: %s", #call, cudaGetErrorString(e_)); } while (0)

/* A bf16 device plane (rows, C) to host fp32 through the fp32 staging buffer. */
static int plane_to_host(struct decode *d, float *dst, const bf16 *src, size_t n, char *err, int err_len) {
    KCALL(cast_bf16_to_f32(d->d_f32, src, n, d->s));
    CCALL(cudaMemcpyAsync(dst, d->d_f32, n * 4, cudaMemcpyDeviceToHost, d->s));
    /* the staging buffer is reused by the next plane: the copy must be done first */
    CCALL(cudaStreamSynchronize(d->s));
    return 0;
}

/* A step's inputs on the device (ids, each row's slot and position) and its embedded rows in x. */
static int step_begin_gpu(struct decode *d, int T, const int32_t *ids, char *err, int err_len) {
    cudaStream_t s = d->s;
    CCALL(cudaSetDevice(d->dev));
    CCALL(cudaMemcpyAsync(d->d_ids, ids, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(d->d_slot, d->row_slot, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(d->d_pos, d->row_pos, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    KCALL(embedding_forward(d->x, d->d_ids, target_gpu_embed(d->t), T, d->c->hidden_size, d->c->vocab_size, s));
    return 0;
}

/* Layer l's MLP block on x (x += down(swiglu(gate_up(norm(x))))), then its captured plane to the host. */
static int step_mlp_gpu(struct decode *d, const struct target_gpu_layer_view *ly, int l, int T, float *states,
                        char *err, int err_len) {
    const struct model_config *c = d->c;
    int C = c->hidden_size, I = c->intermediate_size, n_cap = target_n_capture(d->t);
    const int *cap = target_capture(d->t);
    size_t plane = (size_t)T * C;
    bf16 *x = d->x, *h = d->h, *gu = d->gu, *act = d->act;
    cudaStream_t s = d->s;
    KCALL(rmsnorm_forward(h, NULL, x, ly->ln_post, T, C, (float)c->rms_norm_eps, s));
    KCALL(blas_linear_forward(gu, BLAS_BF16, h, ly->w_gu, NULL, T, 2 * I, C, s));
    KCALL(swiglu_forward(act, gu, gu + I, T, I, 2 * I, s));
    KCALL(blas_matmul(x, BLAS_BF16, act, 0, ly->w_down, 1, NULL, T, C, I, 0, 0, 0, 1.0f, 1.0f, s));
    if (states)
        for (int j = 0; j < n_cap; j++)
            if (cap[j] == l && plane_to_host(d, states + (size_t)j * plane, x, plane, err, err_len)) return -1;
    return 0;
}

static int extend_gpu(struct decode *d, int T, const int32_t *ids, float *states, float *last, char *err,
                      int err_len) {
    const struct model_config *c = d->c;
    int C = c->hidden_size, HD = c->head_dim, NH = c->num_attention_heads;
    int NKV = c->num_key_value_heads, L = c->num_hidden_layers, QKV = (NH + 2 * NKV) * HD;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    size_t layer = (size_t)d->n_slots * d->max_len * NKV * HD, plane = (size_t)T * C;
    bf16 *x = d->x, *h = d->h, *qkv = d->qkv, *q = d->q, *k = d->k, *v = d->v, *att = d->att;
    cudaStream_t s = d->s;
    if (step_begin_gpu(d, T, ids, err, err_len)) return -1;
    for (int l = 0; l < L; l++) {
        struct target_gpu_layer_view ly;
        if (target_gpu_layer(d->t, l, &ly, err, err_len)) return -1;
        bf16 *kc = (bf16 *)d->kc + (size_t)l * layer, *vc = (bf16 *)d->vc + (size_t)l * layer;
        KCALL(rmsnorm_forward(h, NULL, x, ly.ln_in, T, C, eps, s));
        KCALL(blas_linear_forward(qkv, BLAS_BF16, h, ly.w_qkv, NULL, T, QKV, C, s));
        KCALL(target_qkv_split(q, k, v, qkv, T, NH, NKV, HD, s));
        if (c->qk_norm)
            KCALL(rmsnorm_qk_forward(q, NULL, q, ly.q_norm, T * NH, k, NULL, k, ly.k_norm, T * NKV, HD, eps, s));
        KCALL(rope_forward(q, k, d->d_pos, target_gpu_inv_freq(d->t), T, NH, NKV, HD, s));
        KCALL(decode_attn_append(kc, vc, k, v, d->d_slot, d->d_pos, T, d->max_len, NKV, HD, s));
        KCALL(decode_attn_forward(att, q, kc, vc, d->d_slot, d->d_pos, T, d->max_len, NH, NKV, HD, scale, s));
        KCALL(blas_matmul(x, BLAS_BF16, att, 0, ly.w_o, 1, NULL, T, C, NH * HD, 0, 0, 0, 1.0f, 1.0f, s));
        if (step_mlp_gpu(d, &ly, l, T, states, err, err_len)) return -1;
    }
    if (last && plane_to_host(d, last, x, plane, err, err_len)) return -1;
    CCALL(cudaStreamSynchronize(s));
    return 0;
}

/* Qwen3.5 / 3.6 hybrid on the GPU: forward_gpu_hybrid's layer sequence (target.c) over the step's rows. A full
 * attention layer appends its keys and values to the cache and attends over it; a Gated DeltaNet layer appends its
 * conv input rows to the slots' rings, convolves them (conv1d_decode reads the K - 1 positions before), normalises
 * q and k, and runs each sequence's rows in order from its slot's state (gated_delta_decode, which also keeps the
 * snapshots decode_truncate restores). */
static int extend_gpu_hybrid(struct decode *d, int n_seq, const int *slots, const int32_t *cu, int T,
                             const int32_t *ids, float *states, float *last, char *err, int err_len) {
    const struct model_config *c = d->c;
    int C = c->hidden_size, HD = c->head_dim, NH = c->num_attention_heads;
    int NKV = c->num_key_value_heads, L = c->num_hidden_layers, QKV = (2 * NH + 2 * NKV) * HD;
    int R = hf_config_rotary_dim(c);
    const struct gdn_shape *gs = &d->gs;
    int D = gdn_conv_dim(gs), LIN_IN = gdn_in_dim(gs), VD = gs->n_v * gs->d_v, KD = gs->n_k * gs->d_k;
    size_t SS = (size_t)gs->n_v * gs->d_k * gs->d_v, ns = (size_t)d->n_slots;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD), qscale = 1.0f / sqrtf((float)gs->d_k);
    size_t layer = ns * d->max_len * NKV * HD, plane = (size_t)T * C;
    bf16 *x = d->x, *h = d->h, *qkv = d->qkv, *q = d->q, *k = d->k, *v = d->v, *att = d->att;
    bf16 *gate = d->gate, *y = d->lin_y;
    float *conv = d->lin_conv, *o = d->lin_o;
    struct gated_delta_shape ds = {T, n_seq, gs->n_k, gs->n_v, gs->d_k, gs->d_v, D, D, LIN_IN};
    int32_t seq_slot[n_seq], seq_pos[n_seq];
    for (int i = 0; i < n_seq; i++) {
        seq_slot[i] = slots[i];
        seq_pos[i] = d->len[slots[i]];
    }
    cudaStream_t s = d->s;
    if (step_begin_gpu(d, T, ids, err, err_len)) return -1;
    CCALL(cudaMemcpyAsync(d->d_cu, cu, (size_t)(n_seq + 1) * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(d->d_sslot, seq_slot, (size_t)n_seq * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(d->d_spos, seq_pos, (size_t)n_seq * 4, cudaMemcpyHostToDevice, s));
    for (int l = 0; l < L; l++) {
        struct target_gpu_layer_view ly;
        if (target_gpu_layer(d->t, l, &ly, err, err_len)) return -1;
        KCALL(rmsnorm_forward(h, NULL, x, ly.ln_in, T, C, eps, s));
        if (ly.linear) {
            size_t li = (size_t)d->lin_idx[l];
            bf16 *hist = (bf16 *)d->lin_hist + li * ns * d->ring * D;
            float *state = d->lin_state + li * ns * SS, *snap = d->lin_snap + li * ns * DECODE_STATE_SNAPS * SS;
            KCALL(blas_linear_forward(qkv, BLAS_BF16, h, ly.w_lin_in, NULL, T, LIN_IN, C, s));
            KCALL(conv1d_decode_append(hist, qkv, LIN_IN, d->d_slot, d->d_pos, T, d->ring, D, s));
            KCALL(conv1d_decode(conv, hist, d->d_slot, d->d_pos, T, d->ring, ly.conv_w, D, gs->K, s));
            KCALL(l2norm_forward(conv, T, D, gs->n_k, gs->d_k, qscale, s));
            KCALL(l2norm_forward(conv + KD, T, D, gs->n_k, gs->d_k, 1.0f, s));
            KCALL(gated_delta_decode(o, conv, conv + KD, conv + 2 * KD, qkv + D + VD, qkv + D + VD + gs->n_v, ly.a_neg,
                                     ly.dt_bias, d->d_cu, d->d_sslot, d->d_spos, &ds, state, snap, DECODE_STATE_SNAPS,
                                     s));
            KCALL(gated_rmsnorm_forward(y, o, qkv + D, LIN_IN, ly.gnorm, T, gs->n_v, gs->d_v, eps, s));
            KCALL(blas_matmul(x, BLAS_BF16, y, 0, ly.w_lin_out, 1, NULL, T, C, VD, 0, 0, 0, 1.0f, 1.0f, s));
        } else {
            size_t at = (size_t)d->attn_idx[l] * layer;
            bf16 *kc = (bf16 *)d->kc + at, *vc = (bf16 *)d->vc + at;
            KCALL(blas_linear_forward(qkv, BLAS_BF16, h, ly.w_qkv, NULL, T, QKV, C, s));
            KCALL(gated_attn_split_forward(q, gate, k, v, qkv, T, NH, NKV, HD, s));
            KCALL(rmsnorm_qk_forward(q, NULL, q, ly.q_norm, T * NH, k, NULL, k, ly.k_norm, T * NKV, HD, eps, s));
            KCALL(gated_attn_rope_forward(q, k, d->d_pos, target_gpu_inv_freq(d->t), T, NH, NKV, HD, R, s));
            KCALL(decode_attn_append(kc, vc, k, v, d->d_slot, d->d_pos, T, d->max_len, NKV, HD, s));
            KCALL(decode_attn_forward(att, q, kc, vc, d->d_slot, d->d_pos, T, d->max_len, NH, NKV, HD, scale, s));
            KCALL(gated_attn_gate_forward(att, gate, (int64_t)T * NH * HD, s));
            KCALL(blas_matmul(x, BLAS_BF16, att, 0, ly.w_o, 1, NULL, T, C, NH * HD, 0, 0, 0, 1.0f, 1.0f, s));
        }
        if (step_mlp_gpu(d, &ly, l, T, states, err, err_len)) return -1;
    }
    if (last && plane_to_host(d, last, x, plane, err, err_len)) return -1;
    CCALL(cudaStreamSynchronize(s));
    note_snapshots(d, n_seq, slots, cu);
    return 0;
}

static int set_head_gpu(struct decode *d, const float *norm, const float *lm_head, char *err, int err_len) {
    int C = d->c->hidden_size, V = d->c->vocab_size, ok = 1;
    if (V % 8)
        return err_fail(err, err_len, "decode: the GPU LM head needs the vocabulary size a multiple of 8 (16-byte "
                        "GEMM rows), the config has %d", V);
    CCALL(cudaSetDevice(d->dev));
    d->d_norm = dalloc(d, (size_t)C * 4, &ok);
    d->d_head = dalloc(d, (size_t)V * C * 2, &ok);
    d->d_xr = dalloc(d, (size_t)d->max_rows * C * 2, &ok);
    d->d_xn = dalloc(d, (size_t)d->max_rows * C * 2, &ok);
    d->d_logits = dalloc(d, (size_t)d->max_rows * V * 4, &ok);
    d->d_arg = dalloc(d, (size_t)d->max_rows * 4, &ok);
    if (!ok)
        return err_fail(err, err_len, "decode: out of GPU memory for the LM head (%.2f GiB) and %d rows of logits",
                        (double)V * C * 2 / (1 << 30), d->max_rows);
    /* bf16 of the host fp32 head, a slice at a time (bounded host staging) */
    size_t chunk = (size_t)1 << 24, n = (size_t)V * C;
    bf16 *stage = malloc(chunk * 2);
    if (!stage) return err_fail(err, err_len, "decode: out of host memory");
    for (size_t at = 0; at < n; at += chunk) {
        size_t m = n - at < chunk ? n - at : chunk;
        bf16_from_floats(stage, lm_head + at, m);
        cudaError_t e = cudaMemcpy(d->d_head + at, stage, m * 2, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            free(stage);
            return err_fail(err, err_len, "decode: cudaMemcpy of the LM head: %s", cudaGetErrorString(e));
        }
    }
    free(stage);
    CCALL(cudaMemcpy(d->d_norm, norm, (size_t)C * 4, cudaMemcpyHostToDevice));
    return 0;
}

/* d_logits (n_rows, V) = LM head · final norm of the chosen rows of the last step's x; asynchronous. */
static int head_gpu(struct decode *d, int n_rows, const int32_t *rows, char *err, int err_len) {
    int C = d->c->hidden_size, V = d->c->vocab_size;
    cudaStream_t s = d->s;
    CCALL(cudaSetDevice(d->dev));
    for (int i = 0; i < n_rows; i++)
        CCALL(cudaMemcpyAsync(d->d_xr + (size_t)i * C, (const bf16 *)d->x + (size_t)rows[i] * C, (size_t)C * 2,
                              cudaMemcpyDeviceToDevice, s));
    KCALL(rmsnorm_forward(d->d_xn, NULL, d->d_xr, d->d_norm, n_rows, C, (float)d->c->rms_norm_eps, s));
    KCALL(blas_linear_forward(d->d_logits, BLAS_F32, d->d_xn, d->d_head, NULL, n_rows, V, C, s));
    return 0;
}

static int logits_gpu(struct decode *d, int n_rows, const int32_t *rows, float *logits, char *err, int err_len) {
    if (head_gpu(d, n_rows, rows, err, err_len)) return -1;
    CCALL(cudaMemcpyAsync(logits, d->d_logits, (size_t)n_rows * d->c->vocab_size * 4, cudaMemcpyDeviceToHost, d->s));
    CCALL(cudaStreamSynchronize(d->s));
    return 0;
}

/* The same logits left on the device, their rows' argmax (kernels/argmax.h) to the host. */
static int argmax_gpu(struct decode *d, int n_rows, const int32_t *rows, int32_t *ids, char *err, int err_len) {
    if (head_gpu(d, n_rows, rows, err, err_len)) return -1;
    KCALL(argmax_rows(d->d_arg, d->d_logits, n_rows, d->c->vocab_size, d->s));
    CCALL(cudaMemcpyAsync(ids, d->d_arg, (size_t)n_rows * 4, cudaMemcpyDeviceToHost, d->s));
    CCALL(cudaStreamSynchronize(d->s));
    return 0;
}
#undef KCALL
#undef CCALL
#endif

/* ---------------------------------------------------------------- the interface */

int decode_extend(struct decode *d, int n_seq, const int *slots, const int32_t *ids, const int32_t *cu,
                  float *states, float *last, char *err, int err_len) {
    if (n_seq < 1 || cu[0] != 0) return err_fail(err, err_len, "decode: %d sequences, cu[0] = %d", n_seq, cu[0]);
    int T = cu[n_seq];
    if (T < 1 || T > d->max_step)
        return err_fail(err, err_len, "decode: %d new tokens in one step, the plan allows 1..%d", T, d->max_step);
    for (int i = 0; i < n_seq; i++) {
        int s = slots[i], m = cu[i + 1] - cu[i];
        if (s < 0 || s >= d->n_slots) return err_fail(err, err_len, "decode: slot %d of %d", s, d->n_slots);
        if (m < 0) return err_fail(err, err_len, "decode: cu[%d] > cu[%d]", i, i + 1);
        if (d->len[s] + m > d->max_len)
            return err_fail(err, err_len, "decode: slot %d would hold %d tokens, the plan allows %d", s, d->len[s] + m,
                            d->max_len);
        for (int j = 0; j < i; j++)
            if (slots[j] == s) return err_fail(err, err_len, "decode: slot %d twice in one step", s);
        for (int r = cu[i]; r < cu[i + 1]; r++) {
            d->row_slot[r] = s;
            d->row_pos[r] = d->len[s] + (r - cu[i]);
        }
    }
    /* ids are checked here for both devices (the GPU gather cannot report one) */
    for (int r = 0; r < T; r++)
        if (ids[r] < 0 || ids[r] >= d->c->vocab_size)
            return err_fail(err, err_len, "decode: token %d of the step is %d, outside the vocabulary [0, %d)", r,
                            (int)ids[r], d->c->vocab_size);
    int rc;
#ifdef DFLASH_CUDA
    if (d->dev >= 0)
        rc = d->hybrid ? extend_gpu_hybrid(d, n_seq, slots, cu, T, ids, states, last, err, err_len)
                       : extend_gpu(d, T, ids, states, last, err, err_len);
    else
#endif
        rc = d->hybrid ? extend_cpu_hybrid(d, n_seq, slots, cu, T, ids, states, last, err, err_len)
                       : extend_cpu(d, T, ids, states, last, err, err_len);
    if (rc) return -1;
    d->last_T = T;
    for (int i = 0; i < n_seq; i++) d->len[slots[i]] += cu[i + 1] - cu[i];
    return 0;
}

int decode_set_head(struct decode *d, const float *norm, const float *lm_head, int max_rows, char *err, int err_len) {
    if (d->norm_h) return err_fail(err, err_len, "decode: the head is already set");
    if (max_rows < 1) return err_fail(err, err_len, "decode: %d logit rows per call", max_rows);
    d->norm_h = norm;
    d->head_h = lm_head;
    d->max_rows = max_rows;
#ifdef DFLASH_CUDA
    if (d->dev >= 0) return set_head_gpu(d, norm, lm_head, err, err_len);
#endif
    d->logits_one = malloc(sizeof(float) * (size_t)d->c->vocab_size);
    if (!d->logits_one) return err_fail(err, err_len, "decode: out of memory for a row of logits");
    return 0;
}

static int head_rows_check(const struct decode *d, const char *fn, int n_rows, const int32_t *rows, char *err,
                           int err_len) {
    if (!d->norm_h) return err_fail(err, err_len, "decode: %s needs decode_set_head first", fn);
    if (n_rows < 1 || n_rows > d->max_rows)
        return err_fail(err, err_len, "decode: %d logit rows, the plan allows 1..%d", n_rows, d->max_rows);
    for (int i = 0; i < n_rows; i++)
        if (rows[i] < 0 || rows[i] >= d->last_T)
            return err_fail(err, err_len, "decode: logit row %d is not a row of the last step (%d rows)", rows[i],
                            d->last_T);
    return 0;
}

int decode_logits(struct decode *d, int n_rows, const int32_t *rows, float *logits, char *err, int err_len) {
    if (head_rows_check(d, "decode_logits", n_rows, rows, err, err_len)) return -1;
#ifdef DFLASH_CUDA
    if (d->dev >= 0) return logits_gpu(d, n_rows, rows, logits, err, err_len);
#endif
    logits_cpu(d, n_rows, rows, logits);
    return 0;
}

int decode_argmax(struct decode *d, int n_rows, const int32_t *rows, int32_t *ids, char *err, int err_len) {
    if (head_rows_check(d, "decode_argmax", n_rows, rows, err, err_len)) return -1;
#ifdef DFLASH_CUDA
    if (d->dev >= 0) return argmax_gpu(d, n_rows, rows, ids, err, err_len);
#endif
    for (int i = 0; i < n_rows; i++) {
        logits_cpu(d, 1, rows + i, d->logits_one);
        argmax_rows_ref(ids + i, d->logits_one, 1, d->c->vocab_size);
    }
    return 0;
}
