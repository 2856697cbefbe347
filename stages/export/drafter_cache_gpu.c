/*
 * stages/export/drafter_cache_gpu.c — the KV-cached block proposal of the drafter on a GPU
 * (stages/export/drafter_cache.h, second half). The ops are drafter_cache.c's, in drafter_step_gpu's kernels: the
 * context rows committed since the last proposal are projected into the slot's per-layer caches, then the B block
 * rows run through the layers against them, the LM head's logits of the draft rows are picked on the device and
 * B-1 ids come back.
 */
#ifdef DFLASH_CUDA
#include "export/drafter_cache.h"

#include "core/err.h"
#include "kernels/argmax.h"
#include "kernels/blas.h"
#include "kernels/decode_attn.h"
#include "kernels/embedding.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


struct drafter_cache_gpu {
    struct drafter *d;
    struct drafter_gpu *g;
    const struct drafter_config *c;
    cudaStream_t s;
    int n_slots, max_len, cap, V_d;
    const int64_t *d2t;
    /* device weights (the drafter_gpu's): bf16 copies of matrices, fp32 norm weights */
    const bf16 *fc, *embed, *lm;
    const float *hnorm, *norm;
    const bf16 *lc[DRAFTER_MAX_LAYERS][DRAFTER_LT_N];
    const float *lw[DRAFTER_MAX_LAYERS][DRAFTER_LT_N];
    /* the one allocation and its regions */
    void *base;
    size_t bytes;
    bf16 *kc, *vc;                     /* (L, n_slots, cap, n_kv, d_h) each */
    float *inv_freq;                   /* (d_h/2) */
    bf16 *hid, *cfc, *ctx, *ck, *cv;   /* (C, k·H), (C, H) x2, (C, KD) x2 */
    bf16 *x, *xn1, *h, *xn2, *xn;      /* (B, H) */
    bf16 *qraw, *q, *o;                /* (B, QD) */
    bf16 *kraw, *bk, *bv;              /* (B, KD) */
    bf16 *gate, *up, *act;             /* (B, I) */
    float *logits;                     /* (B, V_d) */
    int32_t *ids, *ints;               /* ids (B); ints: slot (C), cpos (C), bslot (B), bpos (B), qpos (B), tok (B) */
    /* pinned host staging */
    bf16 *h_hid;                       /* (C, k·H) */
    int32_t *h_ints, *h_ids;           /* as ints; (B) */
    int64_t *seq;                      /* (n_slots) */
    int *rows;                         /* (n_slots) */
    struct drafter_cache_stats st;
};

#define CU(call, what) do { cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) return err_fail(err, err_len, "%s: %s: %s", fn, (what), cudaGetErrorString(e_)); } while (0)
#define KL(call) do { if ((call)) return err_fail(err, err_len, "%s: %s", fn, kernels_error()); } while (0)

/* offsets into ints / h_ints */
#define I_SLOT(dc) 0
#define I_CPOS(dc) (DCACHE_GPU_CHUNK)
#define I_BSLOT(dc) (2 * DCACHE_GPU_CHUNK)
#define I_BPOS(dc) (2 * DCACHE_GPU_CHUNK + (dc)->c->B)
#define I_QPOS(dc) (2 * DCACHE_GPU_CHUNK + 2 * (dc)->c->B)
#define I_TOK(dc) (2 * DCACHE_GPU_CHUNK + 3 * (dc)->c->B)
#define I_WBPOS(dc) (2 * DCACHE_GPU_CHUNK + 4 * (dc)->c->B)   /* I_BPOS, I_QPOS less a sliding layer's first row */
#define I_WQPOS(dc) (2 * DCACHE_GPU_CHUNK + 5 * (dc)->c->B)
#define N_INTS(dc) (2 * DCACHE_GPU_CHUNK + 6 * (dc)->c->B)

void drafter_cache_gpu_free(struct drafter_cache_gpu *dc) {
    if (!dc) return;
    if (dc->s) cudaStreamSynchronize(dc->s);
    cudaFree(dc->base);
    cudaFreeHost(dc->h_hid);
    cudaFreeHost(dc->h_ints);
    cudaFreeHost(dc->h_ids);
    free(dc->seq);
    free(dc->rows);
    free(dc);
}

static struct drafter_cache_gpu *init_fail(struct drafter_cache_gpu *dc, char *err, int err_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static struct drafter_cache_gpu *init_fail(struct drafter_cache_gpu *dc, char *err, int err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && err_len > 0) vsnprintf(err, (size_t)err_len, fmt, ap);
    va_end(ap);
    drafter_cache_gpu_free(dc);
    return NULL;
}

/* The device tensor called name of numel elements: its bf16 copy (matrix) or fp32 master (vector). */
static int dev_weight(struct drafter_gpu *g, struct drafter *d, const char *name, int64_t numel, int matrix,
                      const bf16 **copy, const float **w) {
    const struct drafter_param *p = drafter_param_find(d, name);
    if (!p || p->numel != numel) return -1;
    const struct drafter_gpu_param *q = drafter_gpu_param(g, (int)(p - drafter_param(d, 0)));
    if (!q || q->host != p) return -1;
    if (matrix) {
        if (!q->copy) return -1;
        *copy = q->copy;
    } else {
        if (!q->w) return -1;
        *w = q->w;
    }
    return 0;
}

struct region {
    void **p;
    size_t bytes;
    const char *name;
};

struct drafter_cache_gpu *drafter_cache_gpu_init(struct drafter *d, struct drafter_gpu *g, int n_slots, int max_len,
                                                 FILE *plan, char *err, int err_len) {
    const struct drafter_config *c = drafter_config_of(d);
    const int H = c->H, kH = c->k * H, QD = c->n_h * c->d_h, KD = c->n_kv * c->d_h, NI = c->I, B = c->B, L = c->L;
    const int C = DCACHE_GPU_CHUNK;
    if (n_slots < 1 || max_len < 1)
        return init_fail(NULL, err, err_len, "drafter_cache_gpu: %d slots of %d tokens, expected >= 1 of each", n_slots,
                         max_len);
    if (c->d_h % 16 || c->d_h > 256)
        return init_fail(NULL, err, err_len, "drafter_cache_gpu: head dim %d; the decode attention and rope take "
                         "multiples of 16 up to 256", c->d_h);
    if (H % 8 || NI % 8 || c->n_h % c->n_kv)
        return init_fail(NULL, err, err_len, "drafter_cache_gpu: hidden %d, MLP %d (multiples of 8 expected), %d query "
                         "heads over %d kv heads", H, NI, c->n_h, c->n_kv);
    struct drafter_cache_gpu *dc = calloc(1, sizeof *dc);
    if (!dc) return init_fail(NULL, err, err_len, "drafter_cache_gpu: out of memory");
    dc->d = d;
    dc->g = g;
    dc->c = c;
    dc->s = drafter_gpu_stream(g);
    dc->n_slots = n_slots;
    dc->max_len = max_len;
    dc->cap = max_len + B;
    const struct drafter_param *lmp = drafter_param_find(d, "lm_head.weight");
    dc->V_d = lmp ? (int)lmp->shape[0] : 0;
    if (!lmp || dc->V_d % 8)
        return init_fail(dc, err, err_len, "drafter_cache_gpu: draft vocabulary %d; the LM head's logits need a "
                         "multiple of 8", dc->V_d);
    if (dev_weight(g, d, "fc.weight", (int64_t)H * kH, 1, &dc->fc, NULL) ||
        dev_weight(g, d, "hidden_norm.weight", H, 0, NULL, &dc->hnorm) ||
        dev_weight(g, d, "norm.weight", H, 0, NULL, &dc->norm) ||
        dev_weight(g, d, "embed_tokens.weight", (int64_t)c->V_t * H, 1, &dc->embed, NULL) ||
        dev_weight(g, d, "lm_head.weight", (int64_t)dc->V_d * H, 1, &dc->lm, NULL))
        return init_fail(dc, err, err_len, "drafter_cache_gpu: the device drafter lacks fc, hidden_norm, norm, "
                         "embed_tokens or lm_head in the expected shape");
    for (int l = 0; l < L; l++)   /* matrices as the GEMMs read them (bf16 copies), the norms' fp32 weights */
        for (int j = 0; j < DRAFTER_LT_N; j++) {
            const struct drafter_param *p = drafter_layer_param(d, l, j);
            const struct drafter_gpu_param *q = drafter_gpu_param(g, (int)(p - drafter_param(d, 0)));
            if (!q || q->host != p || !(p->ndim == 2 ? (void *)q->copy : (void *)q->w))
                return init_fail(dc, err, err_len, "drafter_cache_gpu: the device drafter has no layers.%d.%s", l,
                                 drafter_layer_tensor_names[j]);
            dc->lc[l][j] = q->copy;
            dc->lw[l][j] = q->w;
        }
    struct drafter_last ls;
    drafter_last_step(d, &ls);
    dc->d2t = ls.d2t;

    size_t cache = (size_t)L * n_slots * (size_t)dc->cap * KD;
    struct region rg[] = {
        {(void **)&dc->kc, 2 * cache, "keys cache bf16"},
        {(void **)&dc->vc, 2 * cache, "values cache bf16"},
        {(void **)&dc->inv_freq, 4 * (size_t)(c->d_h / 2), "rope inv_freq"},
        {(void **)&dc->hid, 2 * (size_t)C * kH, "context features bf16"},
        {(void **)&dc->cfc, 2 * (size_t)C * H, "context fc"},
        {(void **)&dc->ctx, 2 * (size_t)C * H, "context normed"},
        {(void **)&dc->ck, 2 * (size_t)C * KD, "context keys"},
        {(void **)&dc->cv, 2 * (size_t)C * KD, "context values"},
        {(void **)&dc->x, 2 * (size_t)B * H, "block x"},
        {(void **)&dc->xn1, 2 * (size_t)B * H, "block xn1"},
        {(void **)&dc->h, 2 * (size_t)B * H, "block h"},
        {(void **)&dc->xn2, 2 * (size_t)B * H, "block xn2"},
        {(void **)&dc->xn, 2 * (size_t)B * H, "block xn"},
        {(void **)&dc->qraw, 2 * (size_t)B * QD, "block q raw"},
        {(void **)&dc->q, 2 * (size_t)B * QD, "block q"},
        {(void **)&dc->o, 2 * (size_t)B * QD, "block attention out"},
        {(void **)&dc->kraw, 2 * (size_t)B * KD, "block k raw"},
        {(void **)&dc->bk, 2 * (size_t)B * KD, "block k"},
        {(void **)&dc->bv, 2 * (size_t)B * KD, "block v"},
        {(void **)&dc->gate, 2 * (size_t)B * NI, "block gate"},
        {(void **)&dc->up, 2 * (size_t)B * NI, "block up"},
        {(void **)&dc->act, 2 * (size_t)B * NI, "block act"},
        {(void **)&dc->logits, 4 * (size_t)B * dc->V_d, "draft logits fp32"},
        {(void **)&dc->ids, 4 * (size_t)B, "draft ids"},
        {(void **)&dc->ints, 4 * (size_t)N_INTS(dc), "slots, positions, tokens"},
    };
    int nr = (int)(sizeof rg / sizeof rg[0]);
    size_t total = 0;
    for (int i = 0; i < nr; i++) total += (rg[i].bytes + 255) / 256 * 256;
    cudaError_t e = cudaMalloc(&dc->base, total);
    if (e != cudaSuccess)
        return init_fail(dc, err, err_len, "drafter_cache_gpu: %.1f MB for %d slots x %d tokens x %d layers: %s",
                         (double)total / 1e6, n_slots, max_len, L, cudaGetErrorString(e));
    dc->bytes = total;
    size_t off = 0;
    for (int i = 0; i < nr; i++) {
        *rg[i].p = (char *)dc->base + off;
        if (plan) fprintf(plan, "drafter cache (GPU): %-26s %10.2f MB\n", rg[i].name, (double)rg[i].bytes / 1e6);
        off += (rg[i].bytes + 255) / 256 * 256;
    }
    if (plan) fprintf(plan, "drafter cache (GPU): total %.2f MB (%d slots x %d tokens)\n", (double)total / 1e6,
                      n_slots, max_len);
    e = cudaMallocHost((void **)&dc->h_hid, 2 * (size_t)C * kH);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&dc->h_ints, 4 * (size_t)N_INTS(dc));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&dc->h_ids, 4 * (size_t)B);
    if (e != cudaSuccess)
        return init_fail(dc, err, err_len, "drafter_cache_gpu: pinned staging: %s", cudaGetErrorString(e));
    dc->seq = malloc(sizeof *dc->seq * (size_t)n_slots);
    dc->rows = calloc((size_t)n_slots, sizeof *dc->rows);
    float *inv = malloc(sizeof(float) * (size_t)(c->d_h / 2));
    if (!dc->seq || !dc->rows || !inv) {
        free(inv);
        return init_fail(dc, err, err_len, "drafter_cache_gpu: out of memory");
    }
    for (int s = 0; s < n_slots; s++) dc->seq[s] = -1;
    drafter_rope_inv_freq(c, inv);
    e = cudaMemcpyAsync(dc->inv_freq, inv, sizeof(float) * (size_t)(c->d_h / 2), cudaMemcpyHostToDevice, dc->s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(dc->s);
    free(inv);
    if (e != cudaSuccess)
        return init_fail(dc, err, err_len, "drafter_cache_gpu: rope table upload: %s", cudaGetErrorString(e));
    return dc;
}

size_t drafter_cache_gpu_planned_bytes(const struct drafter_cache_gpu *dc) { return dc->bytes; }

void drafter_cache_gpu_get_stats(const struct drafter_cache_gpu *dc, struct drafter_cache_stats *s) { *s = dc->st; }

int drafter_cache_gpu_xn(const struct drafter_cache_gpu *dc, float *xn, char *err, int err_len) {
    static const char fn[] = "drafter_cache_gpu_xn";
    size_t n = (size_t)dc->c->B * dc->c->H;
    bf16 *h = malloc(2 * n);
    if (!h) return err_fail(err, err_len, "%s: out of memory", fn);
    cudaError_t e = cudaMemcpyAsync(h, dc->xn, 2 * n, cudaMemcpyDeviceToHost, dc->s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(dc->s);
    if (e == cudaSuccess) floats_from_bf16(xn, h, n);
    free(h);
    if (e != cudaSuccess) return err_fail(err, err_len, "%s: %s", fn, cudaGetErrorString(e));
    return 0;
}

static bf16 *cache_at(bf16 *base, const struct drafter_cache_gpu *dc, int l) {
    return base + (size_t)l * dc->n_slots * dc->cap * dc->c->n_kv * dc->c->d_h;
}

/* Project context rows [r0, r1) of slot's sequence into its caches (drafter_cache.c's project_context). */
static int project_context(struct drafter_cache_gpu *dc, int slot, const float *states, int rows, int r0, int r1,
                           char *err, int err_len) {
    static const char fn[] = "drafter_cache_gpu";
    const struct drafter_config *c = dc->c;
    const int H = c->H, k = c->k, kH = k * H, KD = c->n_kv * c->d_h;
    cudaStream_t s = dc->s;
    for (int t0 = r0; t0 < r1; t0 += DCACHE_GPU_CHUNK) {
        int m = r1 - t0 < DCACHE_GPU_CHUNK ? r1 - t0 : DCACHE_GPU_CHUNK;
        if (t0 > r0) CU(cudaStreamSynchronize(s), "context pass");   /* the staging buffers are refilled */
        int32_t *hs = dc->h_ints + I_SLOT(dc), *hp = dc->h_ints + I_CPOS(dc);
        for (int i = 0; i < m; i++) {
            hs[i] = slot;
            hp[i] = t0 + i;
            for (int q = 0; q < k; q++)
                bf16_from_floats(dc->h_hid + (size_t)i * kH + (size_t)q * H, states + ((size_t)q * rows + t0 + i) * H,
                                 (size_t)H);
        }
        CU(cudaMemcpyAsync(dc->hid, dc->h_hid, 2 * (size_t)m * kH, cudaMemcpyHostToDevice, s), "features upload");
        CU(cudaMemcpyAsync(dc->ints, dc->h_ints, 4 * 2 * (size_t)DCACHE_GPU_CHUNK, cudaMemcpyHostToDevice, s),
           "positions upload");
        const int32_t *d_slot = dc->ints + I_SLOT(dc), *d_pos = dc->ints + I_CPOS(dc);
        KL(blas_linear_forward(dc->cfc, BLAS_BF16, dc->hid, dc->fc, NULL, m, H, kH, s));
        KL(rmsnorm_forward(dc->ctx, NULL, dc->cfc, dc->hnorm, m, H, c->eps, s));
        for (int l = 0; l < c->L; l++) {
            KL(blas_linear_forward(dc->cv, BLAS_BF16, dc->ctx, dc->lc[l][DRAFTER_LT_K], NULL, m, KD, H, s));   /* raw keys */
            KL(rmsnorm_forward(dc->ck, NULL, dc->cv, dc->lw[l][DRAFTER_LT_KN], m * c->n_kv, c->d_h, c->eps, s));
            KL(rope_forward(dc->ck, NULL, d_pos, dc->inv_freq, m, c->n_kv, 0, c->d_h, s));
            KL(blas_linear_forward(dc->cv, BLAS_BF16, dc->ctx, dc->lc[l][DRAFTER_LT_V], NULL, m, KD, H, s));
            KL(decode_attn_append(cache_at(dc->kc, dc, l), cache_at(dc->vc, dc, l), dc->ck, dc->cv, d_slot, d_pos, m,
                                  dc->cap, c->n_kv, c->d_h, s));
        }
        dc->st.ctx_rows += m;
    }
    return 0;
}

int drafter_cache_gpu_propose(struct drafter_cache_gpu *dc, int slot, int64_t seq, const int32_t *cv, int n,
                              const float *states, int rows, int32_t *draft, char *err, int err_len) {
    static const char fn[] = "drafter_cache_gpu";
    const struct drafter_config *c = dc->c;
    const int H = c->H, B = c->B, QD = c->n_h * c->d_h, KD = c->n_kv * c->d_h, NI = c->I, a = n - 1;
    cudaStream_t s = dc->s;
    if (slot < 0 || slot >= dc->n_slots)
        return err_fail(err, err_len, "%s: slot %d outside the plan's %d", fn, slot, dc->n_slots);
    if (n < 1 || a + B > dc->cap)
        return err_fail(err, err_len, "%s: %d committed tokens + block %d exceed the plan (%d tokens)", fn, n, B,
                        dc->max_len);
    if (rows < a || !states)
        return err_fail(err, err_len, "%s: features of %d rows for %d committed tokens", fn, rows, n);
    if (cv[a] < 0 || cv[a] >= c->V_t)
        return err_fail(err, err_len, "%s: the anchor token %d is outside the embedding [0, %d)", fn, cv[a], c->V_t);
    if (dc->seq[slot] != seq || dc->rows[slot] > a) {   /* a new sequence in the slot, or it went back */
        dc->seq[slot] = seq;
        dc->rows[slot] = 0;
        dc->st.resets++;
    }
    /* the previous proposal's synchronisation (its ids) ordered every earlier use of the staging buffers; the
     * block's ints below have their own part of h_ints */
    if (project_context(dc, slot, states, rows, dc->rows[slot], a, err, err_len)) return -1;
    dc->rows[slot] = a;

    /* a sliding layer sees the context rows lo.. (drafter_cache.c's rule): its attention reads the slot's cache from
     * row lo on (the pointer moved by lo rows: one proposal is one slot) with positions less lo */
    const int lo = c->sliding_window > 0 && a - c->sliding_window > 0 ? a - c->sliding_window : 0;
    /* the block: the anchor token, then the mask token; positions a + j; every query at a + B - 1 (a causal
     * layer: a + j) */
    int32_t *hb = dc->h_ints + I_BSLOT(dc);
    for (int j = 0; j < B; j++) {
        hb[j] = slot;                                   /* I_BSLOT */
        hb[B + j] = a + j;                              /* I_BPOS */
        hb[2 * B + j] = a + B - 1;                      /* I_QPOS (non-causal) */
        hb[3 * B + j] = j == 0 ? cv[a] : (int32_t)c->mask_token_id;   /* I_TOK */
        hb[4 * B + j] = a + j - lo;                     /* I_WBPOS */
        hb[5 * B + j] = a + B - 1 - lo;                 /* I_WQPOS */
    }
    CU(cudaMemcpyAsync(dc->ints + I_BSLOT(dc), hb, 4 * 6 * (size_t)B, cudaMemcpyHostToDevice, s), "block upload");
    const int32_t *d_bslot = dc->ints + I_BSLOT(dc), *d_bpos = dc->ints + I_BPOS(dc), *d_qpos = dc->ints + I_QPOS(dc);
    const int32_t *d_wbpos = dc->ints + I_WBPOS(dc), *d_wqpos = dc->ints + I_WQPOS(dc);
    KL(embedding_forward(dc->x, dc->ints + I_TOK(dc), dc->embed, B, H, c->V_t, s));
    const float scale = 1.0f / sqrtf((float)c->d_h);
    for (int l = 0; l < c->L; l++) {
        const bf16 *const *w = dc->lc[l];
        const float *const *nw = dc->lw[l];
        int causal = c->layer_type[l] == DRAFTER_LAYER_SLIDING && !c->sliding_window_non_causal;
        KL(rmsnorm_forward(dc->xn1, NULL, dc->x, nw[DRAFTER_LT_IN_LN], B, H, c->eps, s));
        KL(blas_linear_forward(dc->qraw, BLAS_BF16, dc->xn1, w[DRAFTER_LT_Q], NULL, B, QD, H, s));
        KL(blas_linear_forward(dc->kraw, BLAS_BF16, dc->xn1, w[DRAFTER_LT_K], NULL, B, KD, H, s));
        KL(blas_linear_forward(dc->bv, BLAS_BF16, dc->xn1, w[DRAFTER_LT_V], NULL, B, KD, H, s));
        KL(rmsnorm_forward(dc->q, NULL, dc->qraw, nw[DRAFTER_LT_QN], B * c->n_h, c->d_h, c->eps, s));
        KL(rmsnorm_forward(dc->bk, NULL, dc->kraw, nw[DRAFTER_LT_KN], B * c->n_kv, c->d_h, c->eps, s));
        KL(rope_forward(dc->q, dc->bk, d_bpos, dc->inv_freq, B, c->n_h, c->n_kv, c->d_h, s));
        /* the block's keys right after the visible context (rows a..a+B-1; the next proposal's context rows
         * overwrite them) */
        bf16 *K = cache_at(dc->kc, dc, l), *V = cache_at(dc->vc, dc, l);
        KL(decode_attn_append(K, V, dc->bk, dc->bv, d_bslot, d_bpos, B, dc->cap, c->n_kv, c->d_h, s));
        const int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING, off = sliding ? lo : 0;
        const int32_t *qp = causal ? (off ? d_wbpos : d_bpos) : (off ? d_wqpos : d_qpos);
        const size_t shift = (size_t)off * c->n_kv * c->d_h;
        KL(decode_attn_forward(dc->o, dc->q, K + shift, V + shift, d_bslot, qp, B, dc->cap, c->n_h, c->n_kv, c->d_h,
                               scale, s));
        /* h = x + o_proj(attn): the residual is the GEMM's C */
        CU(cudaMemcpyAsync(dc->h, dc->x, 2 * (size_t)B * H, cudaMemcpyDeviceToDevice, s), "residual copy");
        KL(blas_matmul(dc->h, BLAS_BF16, dc->o, 0, w[DRAFTER_LT_O], 1, NULL, B, H, QD, 0, 0, 0, 1.0f, 1.0f, s));
        KL(rmsnorm_forward(dc->xn2, NULL, dc->h, nw[DRAFTER_LT_POST_LN], B, H, c->eps, s));
        KL(blas_linear_forward(dc->gate, BLAS_BF16, dc->xn2, w[DRAFTER_LT_GATE], NULL, B, NI, H, s));
        KL(blas_linear_forward(dc->up, BLAS_BF16, dc->xn2, w[DRAFTER_LT_UP], NULL, B, NI, H, s));
        KL(swiglu_forward(dc->act, dc->gate, dc->up, B, NI, NI, s));
        CU(cudaMemcpyAsync(dc->x, dc->h, 2 * (size_t)B * H, cudaMemcpyDeviceToDevice, s), "residual copy");
        KL(blas_matmul(dc->x, BLAS_BF16, dc->act, 0, w[DRAFTER_LT_DOWN], 1, NULL, B, H, NI, 0, 0, 0, 1.0f, 1.0f, s));
    }
    KL(rmsnorm_forward(dc->xn, NULL, dc->x, dc->norm, B, H, c->eps, s));
    /* rows first..first+B-2 are the draft (drafter_draft_row0); argmax_rows keeps the first maximum */
    int first = drafter_draft_row0(c);
    KL(blas_linear_forward(dc->logits, BLAS_F32, dc->xn + (size_t)first * H, dc->lm, NULL, B - 1, dc->V_d, H, s));
    KL(argmax_rows(dc->ids, dc->logits, B - 1, dc->V_d, s));
    CU(cudaMemcpyAsync(dc->h_ids, dc->ids, 4 * (size_t)(B - 1), cudaMemcpyDeviceToHost, s), "draft ids");
    CU(cudaStreamSynchronize(s), "proposal");
    for (int j = 0; j < B - 1; j++) {
        int32_t p = dc->h_ids[j];
        if (p < 0 || p >= dc->V_d)
            return err_fail(err, err_len, "%s: the device argmax gave %d outside the draft vocabulary [0, %d)", fn, p,
                            dc->V_d);
        draft[j] = dc->d2t ? (int32_t)(p + dc->d2t[p]) : p;
    }
    dc->st.proposals++;
    return 0;
}
#endif /* DFLASH_CUDA */
