/*
 * stages/model/target.c — the target model: load, plan, forward with capture (target.h).
 *
 * One code path per device, same structure: the CPU path calls the kernels' fp32 references
 * (`*_forward_ref`), the GPU path the bf16 launchers on one stream. Weights are fused at load
 * ([q;k;v], [gate;up]) so each projection is one GEMM; residual adds ride on the GEMM epilogue
 * (beta = 1). All activation buffers are sized once from max_tokens at load; the forward only
 * runs. Invariant: after target_forward returns 0 on a GPU, every write to the caller's
 * buffers has completed (the stream is synchronised), so publishing a ring slot is safe.
 */
#include "model/target.h"
#include "core/err.h"
#include "core/log.h"
#include "model/gdn.h"
#include "core/safetensors.h"
#include "model/weights.h"

#include "kernels/attention.h"
#include "kernels/conv1d.h"
#include "kernels/embedding.h"
#include "kernels/gated_attn.h"
#include "kernels/gated_delta.h"
#include "kernels/gated_rmsnorm.h"
#include "kernels/l2norm.h"
#include "kernels/gemm.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#ifdef DFLASH_CUDA
#include "kernels/blas.h"
#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which form of the gated delta rule the GPU forward runs, fixed at build time (make GDN_SPLIT=1): 0, the one-kernel
 * gated_delta_forward (validated); 1, gated_delta_forward_split with its planned workspace (written 2026-12-07, not
 * yet run on a GPU). Flip the Makefile's default once tests/gpu/test_gdn_kernels passes the split form and
 * gated_delta_bench / target_bench show it faster. */
#ifndef DFLASH_GDN_SPLIT
#define DFLASH_GDN_SPLIT 0
#endif

/* One decoder layer. CPU: every pointer is host fp32. GPU: matrices are device bf16, norm
 * weights device fp32. */
struct target_layer {
    void *w_qkv;      /* (QKV, C), QKV = (NH + 2·NKV)·HD, rows [q; k; v] */
    void *w_o;        /* (C, NH·HD) */
    void *w_gu;       /* (2·I, C), rows [gate; up] */
    void *w_down;     /* (C, I) */
    float *ln_in;     /* (C) */
    float *ln_post;   /* (C) */
    float *q_norm;    /* (HD) Qwen3 only, else NULL */
    float *k_norm;    /* (HD) Qwen3 only, else NULL */
    /* Qwen3.5. Every RMSNorm weight above is stored as the effective (1 + w) of
     * Qwen3_5RMSNorm, one fp32 add at load as transformers does. A full-attention layer's w_qkv
     * has rows [q_proj (NH·2·HD, per head [query; gate]); k; v]. A linear (Gated DeltaNet) layer
     * has no w_qkv / w_o / q_norm / k_norm but (matrices bf16 on a GPU, the rest fp32): */
    int linear;       /* 1: Gated DeltaNet */
    void *w_lin_in;   /* (LIN_IN, C) rows [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a] */
    float *conv_w;    /* (conv_dim, K) */
    float *a_neg;     /* (NV) -exp(A_log) */
    float *dt_bias;   /* (NV) */
    float *gnorm;     /* (d_v) gated RMSNorm weight (plain, not 1 + w) */
    void *w_lin_out;  /* (C, NV·d_v) out_proj */
};

struct target {
    struct model_config cfg;
    int dev;                       /* -1 CPU */
    int max_tokens;
    int n_capture;
    int capture[TARGET_MAX_CAPTURE];
    int bf16_points;               /* target_options.cpu_bf16_points */
    size_t esize;                  /* 4 (CPU fp32) or 2 (GPU bf16) */
    size_t weight_bytes, work_bytes;

    void *embed;                   /* (V, C) */
    struct target_layer *layers;   /* (n_layers) */
    float *inv_freq_h;             /* (HD/2) host */
    float *inv_freq;               /* (HD/2) host (CPU) or device (GPU) */

    /* working memory, planned from max_tokens (Tm) */
    void *x;                       /* (Tm, C) residual stream */
    void *h;                       /* (Tm, C) normed input of attention / MLP */
    void *qkv;                     /* (Tm, QKV) */
    void *q, *k, *v;               /* (Tm, NH·HD), (Tm, NKV·HD) x2 */
    void *att;                     /* (Tm, NH·HD) */
    void *gu;                      /* (Tm, 2·I) */
    void *act;                     /* (Tm, I) */
    int32_t *ids, *pos, *cu;       /* device copies (GPU only): (Tm), (Tm), (Tm+1) */
    /* Qwen3.5 only: */
    void *gate;                    /* (Tm, NH·HD) attention output gate (fp32 CPU, bf16 GPU) */
    float *lin_conv;               /* (Tm, conv_dim) conv + silu output, fp32 on both devices */
    void *lin_y;                   /* (Tm, NV·d_v) gated-norm output, the input of out_proj */
    float *lin_state;              /* (NV·d_k·d_v) recurrent state of one document (CPU) */
    float *lin_o;                  /* (Tm, NV·d_v) fp32 gated delta rule output (GPU) */
    void *lin_ws;                  /* gated_delta_forward_split's workspace for Tm tokens (GPU) */
    size_t lin_ws_bytes;
#ifdef DFLASH_CUDA
    cudaStream_t stream;
    /* target_timing: events recorded at phase boundaries of the last forward, and their phases */
    int timing, n_ev, max_ev;
    cudaEvent_t *ev;
    int *ev_phase;                 /* (max_ev) the phase that ENDS at event i */
#endif
};

/* ---------------------------------------------------------------- shapes */

static int n_qkv(const struct model_config *c) {
    int q_rows = c->arch == HF_ARCH_QWEN3_5 ? 2 * c->num_attention_heads : c->num_attention_heads;   /* + gate */
    return (q_rows + 2 * c->num_key_value_heads) * c->head_dim;
}

static int is_hybrid(const struct model_config *c) { return c->arch == HF_ARCH_QWEN3_5; }

static struct gdn_shape gdn_shape_of(const struct model_config *c) {
    struct gdn_shape s = {c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                          c->linear_value_head_dim, c->linear_conv_kernel_dim};
    return s;
}

void target_options_defaults(struct target_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->cuda_device = -1;
    opt->max_tokens = 8192;
    opt->n_capture = 0;
}

static int check_shape_config(const struct model_config *c, int dev, char *err, int err_len) {
    if (c->arch != HF_ARCH_QWEN3 && c->arch != HF_ARCH_LLAMA && c->arch != HF_ARCH_QWEN3_5)
        return err_fail(err, err_len, "target: unsupported architecture '%s'", c->architecture);
    if (is_hybrid(c)) {
        int R = hf_config_rotary_dim(c);
        if (c->num_hidden_layers > HF_MAX_LAYERS || R < 2 || R % 2 || R > c->head_dim || c->linear_num_key_heads < 1 ||
            c->linear_num_value_heads < 1 || c->linear_num_value_heads % c->linear_num_key_heads ||
            c->linear_key_head_dim < 1 || c->linear_value_head_dim < 1 || c->linear_conv_kernel_dim < 1)
            return err_fail(err, err_len, "target: inconsistent Qwen3.5 sizes (layers %d, rotary dims %d of head_dim "
                            "%d, linear heads k %d / v %d, dims k %d / v %d, conv kernel %d)", c->num_hidden_layers, R,
                            c->head_dim, c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                            c->linear_value_head_dim, c->linear_conv_kernel_dim);
    }
    if (c->vocab_size < 1 || c->hidden_size < 1 || c->intermediate_size < 1 || c->num_hidden_layers < 1 ||
        c->num_attention_heads < 1 || c->num_key_value_heads < 1 || c->head_dim < 2 || c->head_dim % 2)
        return err_fail(err, err_len, "target: config sizes must be positive and head_dim even (hidden %d, "
                    "intermediate %d, layers %d, heads %d, kv heads %d, head_dim %d)", c->hidden_size,
                    c->intermediate_size, c->num_hidden_layers, c->num_attention_heads,
                    c->num_key_value_heads, c->head_dim);
    if (c->num_attention_heads % c->num_key_value_heads)
        return err_fail(err, err_len, "target: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                    c->num_attention_heads, c->num_key_value_heads);
    if (dev >= 0 && is_hybrid(c)) {
        /* The Gated DeltaNet kernels' head layouts (the GPU attention checks its own head_dim). */
        char why[256];
        if (gated_delta_check_shape(c->linear_num_key_heads, c->linear_num_value_heads, c->linear_key_head_dim,
                                    c->linear_value_head_dim, why, sizeof why))
            return err_fail(err, err_len, "target: %s: %s", c->architecture, why);
        if (c->head_dim % 8)
            return err_fail(err, err_len, "target: the GPU path needs head_dim a multiple of 8 (the q/k norm), the "
                            "config has %d", c->head_dim);
        int lin_in = hf_config_linear_in_dim(c), vd = c->linear_num_value_heads * c->linear_value_head_dim;
        if (lin_in % 8 || vd % 8)
            return err_fail(err, err_len, "target: the GPU GEMMs need 16-byte rows: the Gated DeltaNet projection "
                            "width %d (2·k heads·k dim + 2·v heads·v dim + 2·v heads) and linear_num_value_heads · "
                            "linear_value_head_dim %d must be multiples of 8", lin_in, vd);
    }
    if (dev >= 0) {
        char aerr[200];
        if (attention_shape_supported(c->num_attention_heads, c->num_key_value_heads, c->head_dim, aerr, sizeof aerr))
            return err_fail(err, err_len, "target: %s", aerr);
        if (c->hidden_size % 8 || c->intermediate_size % 8)
            return err_fail(err, err_len, "target: the GPU path needs hidden_size and intermediate_size multiples "
                        "of 8 (got %d, %d)", c->hidden_size, c->intermediate_size);
    }
    return 0;
}

static int set_capture(struct target *t, const struct target_options *opt, char *err, int err_len) {
    int n = t->cfg.num_hidden_layers;
    if (opt->n_capture < 0 || opt->n_capture > TARGET_MAX_CAPTURE)
        return err_fail(err, err_len, "target: %d captured layers requested, at most %d", opt->n_capture,
                    TARGET_MAX_CAPTURE);
    if (opt->n_capture == 0) {
        t->n_capture = TARGET_DEFAULT_DRAFT_LAYERS;
        if (hf_zlab_layer_ids(n, t->n_capture, t->capture))
            return err_fail(err, err_len, "target: the z-lab default layer ids for %d draft layers do not fit a "
                        "%d-layer target; pass the layer ids explicitly", t->n_capture, n);
        return 0;
    }
    t->n_capture = opt->n_capture;
    for (int i = 0; i < opt->n_capture; i++) {
        if (opt->capture[i] < 0 || opt->capture[i] >= n)
            return err_fail(err, err_len, "target: captured layer id %d is outside [0, %d) (z-lab ids: output of "
                        "decoder layer i)", opt->capture[i], n);
        t->capture[i] = opt->capture[i];
    }
    return 0;
}

/* ---------------------------------------------------------------- memory */

static void *mem_alloc(struct target *t, size_t bytes, size_t *tally) {
    void *p = NULL;
    if (bytes == 0) bytes = 16;
#ifdef DFLASH_CUDA
    if (t->dev >= 0) {
        if (cudaMalloc(&p, bytes) != cudaSuccess) { (void)cudaGetLastError(); return NULL; }
        *tally += bytes;
        return p;
    }
#endif
    (void)t;
    p = malloc(bytes);
    if (p) *tally += bytes;
    return p;
}

static void mem_free(struct target *t, void *p) {
    if (!p) return;
#ifdef DFLASH_CUDA
    if (t->dev >= 0) { cudaFree(p); return; }
#endif
    (void)t;
    free(p);
}

/* The split gated delta rule's workspace for Tm tokens, planned for the most documents Tm tokens can hold (0 with
 * the one-kernel form): alloc_all allocates it and target_plan_bytes counts it, from this one formula. */
static size_t gdn_split_ws_bytes(const struct gdn_shape *gs, size_t Tm) {
    if (!DFLASH_GDN_SPLIT) return 0;
    struct gated_delta_shape ws = {(int)Tm, (int)Tm, gs->n_k, gs->n_v, gs->d_k, gs->d_v, 0, 0, 0};
    return gated_delta_split_workspace_bytes((int)Tm, (int)Tm, &ws);
}

static int alloc_all(struct target *t, char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, HD = (size_t)c->head_dim;
    size_t NH = (size_t)c->num_attention_heads, NKV = (size_t)c->num_key_value_heads;
    size_t QKV = (size_t)n_qkv(c), Tm = (size_t)t->max_tokens, es = t->esize;
    size_t *wb = &t->weight_bytes, *kb = &t->work_bytes;
    int L = c->num_hidden_layers;

    t->layers = calloc((size_t)L, sizeof *t->layers);
    if (!t->layers) return err_fail(err, err_len, "target: out of host memory for %d layers", L);
    t->embed = mem_alloc(t, (size_t)c->vocab_size * C * es, wb);
    int ok = t->embed != NULL;
    struct gdn_shape gs = gdn_shape_of(c);
    size_t LIN_IN = 0, CONV = 0, VD = 0;
    if (is_hybrid(c)) {
        LIN_IN = (size_t)gdn_in_dim(&gs);
        CONV = (size_t)gdn_conv_dim(&gs);
        VD = (size_t)gs.n_v * gs.d_v;
    }
    for (int l = 0; ok && l < L; l++) {
        struct target_layer *ly = &t->layers[l];
        if (is_hybrid(c) && c->layer_linear[l]) {
            ly->linear = 1;
            ok = (ly->w_lin_in = mem_alloc(t, LIN_IN * C * es, wb)) && (ly->conv_w = mem_alloc(t, CONV * gs.K * 4, wb)) &&
                 (ly->a_neg = mem_alloc(t, (size_t)gs.n_v * 4, wb)) && (ly->dt_bias = mem_alloc(t, (size_t)gs.n_v * 4, wb)) &&
                 (ly->gnorm = mem_alloc(t, (size_t)gs.d_v * 4, wb)) && (ly->w_lin_out = mem_alloc(t, C * VD * es, wb)) &&
                 (ly->w_gu = mem_alloc(t, 2 * I * C * es, wb)) && (ly->w_down = mem_alloc(t, C * I * es, wb)) &&
                 (ly->ln_in = mem_alloc(t, C * 4, wb)) && (ly->ln_post = mem_alloc(t, C * 4, wb));
            continue;
        }
        ok = (ly->w_qkv = mem_alloc(t, QKV * C * es, wb)) && (ly->w_o = mem_alloc(t, C * NH * HD * es, wb)) &&
             (ly->w_gu = mem_alloc(t, 2 * I * C * es, wb)) && (ly->w_down = mem_alloc(t, C * I * es, wb)) &&
             (ly->ln_in = mem_alloc(t, C * 4, wb)) && (ly->ln_post = mem_alloc(t, C * 4, wb));
        if (ok && c->qk_norm)
            ok = (ly->q_norm = mem_alloc(t, HD * 4, wb)) && (ly->k_norm = mem_alloc(t, HD * 4, wb));
    }
    if (!ok)
        return err_fail(err, err_len, "target: cannot allocate %s memory for the weights (%.2f GB allocated so far)",
                    t->dev >= 0 ? "GPU" : "host", (double)t->weight_bytes / 1e9);
    ok = (t->x = mem_alloc(t, Tm * C * es, kb)) && (t->h = mem_alloc(t, Tm * C * es, kb)) &&
         (t->qkv = mem_alloc(t, Tm * (QKV > LIN_IN ? QKV : LIN_IN) * es, kb)) && (t->q = mem_alloc(t, Tm * NH * HD * es, kb)) &&
         (t->k = mem_alloc(t, Tm * NKV * HD * es, kb)) && (t->v = mem_alloc(t, Tm * NKV * HD * es, kb)) &&
         (t->att = mem_alloc(t, Tm * NH * HD * es, kb)) && (t->gu = mem_alloc(t, Tm * 2 * I * es, kb)) &&
         (t->act = mem_alloc(t, Tm * I * es, kb)) && (t->inv_freq = mem_alloc(t, HD / 2 * 4, kb));
    if (ok && is_hybrid(c))
        ok = (t->gate = mem_alloc(t, Tm * NH * HD * es, kb)) && (t->lin_conv = mem_alloc(t, Tm * CONV * 4, kb)) &&
             (t->lin_y = mem_alloc(t, Tm * VD * es, kb)) &&
             (t->dev >= 0 ? (t->lin_o = mem_alloc(t, Tm * VD * 4, kb)) != NULL
                          : (t->lin_state = mem_alloc(t, (size_t)gs.n_v * gs.d_k * gs.d_v * 4, kb)) != NULL);
    if (ok && is_hybrid(c) && t->dev >= 0 && (t->lin_ws_bytes = gdn_split_ws_bytes(&gs, Tm)) > 0)
        ok = (t->lin_ws = mem_alloc(t, t->lin_ws_bytes, kb)) != NULL;
    if (ok && t->dev >= 0)
        ok = (t->ids = mem_alloc(t, Tm * 4, kb)) && (t->pos = mem_alloc(t, Tm * 4, kb)) &&
             (t->cu = mem_alloc(t, (Tm + 1) * 4, kb));
    if (!ok)
        return err_fail(err, err_len, "target: cannot allocate %s working memory for %d tokens (%.2f GB of weights "
                    "already held); lower --tokens", t->dev >= 0 ? "GPU" : "host", t->max_tokens,
                    (double)t->weight_bytes / 1e9);
    t->inv_freq_h = malloc(HD / 2 * sizeof(float));
    if (!t->inv_freq_h) return err_fail(err, err_len, "target: out of host memory");
    return 0;
}

static size_t nz16(size_t x) { return x ? x : 16; }

void target_plan_bytes(const struct model_config *c, int max_tokens, int gpu, size_t *weight_bytes,
                       size_t *work_bytes) {
    /* alloc_all's arithmetic, allocation by allocation (a zero-byte allocation counts 16) */
#define Z(x) nz16((size_t)(x))
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, HD = (size_t)c->head_dim;
    size_t NH = (size_t)c->num_attention_heads, NKV = (size_t)c->num_key_value_heads;
    size_t QKV = (size_t)n_qkv(c), Tm = (size_t)max_tokens, es = gpu ? 2 : 4, wb = 0, kb = 0;
    struct gdn_shape gs = gdn_shape_of(c);
    size_t LIN_IN = 0, CONV = 0, VD = 0;
    if (is_hybrid(c)) {
        LIN_IN = (size_t)gdn_in_dim(&gs);
        CONV = (size_t)gdn_conv_dim(&gs);
        VD = (size_t)gs.n_v * gs.d_v;
    }
    wb += Z((size_t)c->vocab_size * C * es);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        if (is_hybrid(c) && c->layer_linear[l]) {
            wb += Z(LIN_IN * C * es) + Z(CONV * gs.K * 4) + 2 * Z((size_t)gs.n_v * 4) + Z((size_t)gs.d_v * 4) +
                  Z(C * VD * es) + Z(2 * I * C * es) + Z(C * I * es) + 2 * Z(C * 4);
            continue;
        }
        wb += Z(QKV * C * es) + Z(C * NH * HD * es) + Z(2 * I * C * es) + Z(C * I * es) + 2 * Z(C * 4);
        if (c->qk_norm) wb += 2 * Z(HD * 4);
    }
    kb += 2 * Z(Tm * C * es) + Z(Tm * (QKV > LIN_IN ? QKV : LIN_IN) * es) + 2 * Z(Tm * NH * HD * es) +
          2 * Z(Tm * NKV * HD * es) + Z(Tm * 2 * I * es) + Z(Tm * I * es) + Z(HD / 2 * 4);
    if (is_hybrid(c))
        kb += Z(Tm * NH * HD * es) + Z(Tm * CONV * 4) + Z(Tm * VD * es) +
              (gpu ? Z(Tm * VD * 4) : Z((size_t)gs.n_v * gs.d_k * gs.d_v * 4));
    if (is_hybrid(c) && gpu && gdn_split_ws_bytes(&gs, Tm) > 0) kb += Z(gdn_split_ws_bytes(&gs, Tm));
    if (gpu) kb += 2 * Z(Tm * 4) + Z((Tm + 1) * 4);
#undef Z
    *weight_bytes = wb;
    *work_bytes = kb;
}

void target_free(struct target *t) {
    if (!t) return;
#ifdef DFLASH_CUDA
    if (t->dev >= 0) cudaSetDevice(t->dev);
#endif
    if (t->layers) {
        for (int l = 0; l < t->cfg.num_hidden_layers; l++) {
            struct target_layer *ly = &t->layers[l];
            mem_free(t, ly->w_qkv); mem_free(t, ly->w_o); mem_free(t, ly->w_gu); mem_free(t, ly->w_down);
            mem_free(t, ly->ln_in); mem_free(t, ly->ln_post); mem_free(t, ly->q_norm); mem_free(t, ly->k_norm);
            mem_free(t, ly->w_lin_in); mem_free(t, ly->conv_w); mem_free(t, ly->a_neg); mem_free(t, ly->dt_bias);
            mem_free(t, ly->gnorm); mem_free(t, ly->w_lin_out);
        }
        free(t->layers);
    }
    mem_free(t, t->embed);
    void *bufs[] = {t->x, t->h, t->qkv, t->q, t->k, t->v, t->att, t->gu, t->act, t->inv_freq, t->ids, t->pos, t->cu,
                    t->gate, t->lin_conv, t->lin_y, t->lin_state, t->lin_o, t->lin_ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) mem_free(t, bufs[i]);
    free(t->inv_freq_h);
#ifdef DFLASH_CUDA
    for (int i = 0; t->ev && i < t->max_ev; i++)
        if (t->ev[i]) cudaEventDestroy(t->ev[i]);
    free(t->ev);
    free(t->ev_phase);
    if (t->dev >= 0 && t->stream) cudaStreamDestroy(t->stream);
#endif
    free(t);
}

/* Common start of target_load / target_init_random: config checks, capture ids, device, stream,
 * allocation, RoPE table. */
static struct target *target_new(const struct model_config *cfg, const struct target_options *opt,
                                 char *err, int err_len) {
    if (check_shape_config(cfg, opt->cuda_device, err, err_len)) return NULL;
    if (opt->max_tokens < 1) { err_fail(err, err_len, "target: max_tokens must be >= 1, got %d", opt->max_tokens); return NULL; }
    if (opt->cpu_bf16_points && (opt->cuda_device >= 0 || !is_hybrid(cfg))) {
        err_fail(err, err_len, "target: cpu_bf16_points is for the CPU forward of a Qwen3.5 hybrid (asked for %s, %s)",
                 opt->cuda_device >= 0 ? "a GPU" : "the CPU", cfg->architecture);
        return NULL;
    }
#ifndef DFLASH_CUDA
    if (opt->cuda_device >= 0) {
        err_fail(err, err_len, "target: CUDA device %d requested but this build has no CUDA", opt->cuda_device);
        return NULL;
    }
#endif
    struct target *t = calloc(1, sizeof *t);
    if (!t) { err_fail(err, err_len, "target: out of host memory"); return NULL; }
    t->cfg = *cfg;
    t->dev = opt->cuda_device;
    t->max_tokens = opt->max_tokens;
    t->bf16_points = opt->cpu_bf16_points;
    t->esize = t->dev >= 0 ? 2 : 4;
    if (set_capture(t, opt, err, err_len)) { free(t); return NULL; }
#ifdef DFLASH_CUDA
    if (t->dev >= 0) {
        cudaError_t e = cudaSetDevice(t->dev);
        if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            err_fail(err, err_len, "target: cannot use CUDA device %d: %s", t->dev, cudaGetErrorString(e));
            free(t);
            return NULL;
        }
        if (blas_init(0)) { err_fail(err, err_len, "target: %s", kernels_error()); target_free(t); return NULL; }
    }
#endif
    if (alloc_all(t, err, err_len)) { target_free(t); return NULL; }
    int hd2 = cfg->head_dim / 2;
    double *inv = calloc((size_t)hd2, sizeof *inv);   /* Qwen3.5 fills only the rotary_dim/2 first */
    if (!inv) { err_fail(err, err_len, "target: out of host memory"); target_free(t); return NULL; }
    hf_rope_inv_freq(cfg, inv);
    for (int i = 0; i < hd2; i++) t->inv_freq_h[i] = (float)inv[i];
    free(inv);
#ifdef DFLASH_CUDA
    if (t->dev >= 0) {
        cudaError_t e = cudaMemcpy(t->inv_freq, t->inv_freq_h, (size_t)hd2 * 4, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) { err_fail(err, err_len, "target: cudaMemcpy: %s", cudaGetErrorString(e)); target_free(t); return NULL; }
        return t;
    }
#endif
    memcpy(t->inv_freq, t->inv_freq_h, (size_t)hd2 * 4);
    return t;
}

/* ---------------------------------------------------------------- loading */

/* Fetch tensor `name` of shape [rows, cols] (cols 0: 1-D [rows]) into the host staging buffer at
 * element offset `at`, as fp32 (CPU and norm weights) or bf16 (GPU matrices). */
static int fetch(const struct hf_weights *w, const char *name, int64_t rows, int64_t cols, int as_bf16,
                 void *stage, size_t at, char *err, int err_len) {
    int64_t shape[2] = {rows, cols};
    int nd = cols ? 2 : 1;
    if (as_bf16) return weights_get_bf16(w, name, nd, shape, (bf16 *)stage + at, err, err_len);
    return weights_get_f32(w, name, nd, shape, (float *)stage + at, err, err_len);
}

/* Copy `bytes` of the staging buffer to dst (host or device). */
static int put(struct target *t, void *dst, const void *stage, size_t bytes, char *err, int err_len) {
#ifdef DFLASH_CUDA
    if (t->dev >= 0) {
        cudaError_t e = cudaMemcpy(dst, stage, bytes, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) return err_fail(err, err_len, "target: cudaMemcpy of weights: %s", cudaGetErrorString(e));
        return 0;
    }
#endif
    (void)t; (void)err; (void)err_len;
    memcpy(dst, stage, bytes);
    return 0;
}

static int load_weights(struct target *t, const struct hf_weights *w, char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    int64_t C = c->hidden_size, I = c->intermediate_size, HD = c->head_dim, V = c->vocab_size;
    int64_t NH = c->num_attention_heads, NKV = c->num_key_value_heads, QKV = n_qkv(c);
    int gpu = t->dev >= 0;
    size_t es = t->esize;
    /* The staging buffer holds the largest single destination: the embedding or a fused matrix. */
    size_t stage_elems = (size_t)(V * C);
    if ((size_t)(QKV * C) > stage_elems) stage_elems = (size_t)(QKV * C);
    if ((size_t)(2 * I * C) > stage_elems) stage_elems = (size_t)(2 * I * C);
    if ((size_t)(C * NH * HD) > stage_elems) stage_elems = (size_t)(C * NH * HD);
    void *stage = NULL;   /* CPU: fetch straight into the destination */
    if (gpu && !(stage = malloc(stage_elems * 4)))
        return err_fail(err, err_len, "target: out of host memory for a %.2f GB staging buffer", stage_elems * 4 / 1e9);

    char name[256];
    int rc = -1;
#define FETCH(nm, rows, cols, bf, dst, at) \
    (fetch(w, (nm), (rows), (cols), (bf), gpu ? stage : (void *)(dst), (size_t)(at), err, err_len))
    /* On the CPU `dst` is the destination itself and `at` the element offset in it; on the GPU
     * the staging buffer gets the same layout and is copied once the destination is complete. */
    if (FETCH("model.embed_tokens.weight", V, C, gpu, t->embed, 0)) goto out;
    if (gpu && put(t, t->embed, stage, (size_t)(V * C) * es, err, err_len)) goto out;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        struct target_layer *ly = &t->layers[l];
        static const char *qkv_names[3] = {"q_proj", "k_proj", "v_proj"};
        int64_t qkv_rows[3] = {NH * HD, NKV * HD, NKV * HD};
        size_t at = 0;
        for (int j = 0; j < 3; j++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, qkv_names[j]);
            if (FETCH(name, qkv_rows[j], C, gpu, ly->w_qkv, at)) goto out;
            at += (size_t)(qkv_rows[j] * C);
        }
        if (gpu && put(t, ly->w_qkv, stage, at * es, err, err_len)) goto out;
        snprintf(name, sizeof name, "model.layers.%d.self_attn.o_proj.weight", l);
        if (FETCH(name, C, NH * HD, gpu, ly->w_o, 0)) goto out;
        if (gpu && put(t, ly->w_o, stage, (size_t)(C * NH * HD) * es, err, err_len)) goto out;
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate_proj.weight", l);
        if (FETCH(name, I, C, gpu, ly->w_gu, 0)) goto out;
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        if (FETCH(name, I, C, gpu, ly->w_gu, I * C)) goto out;
        if (gpu && put(t, ly->w_gu, stage, (size_t)(2 * I * C) * es, err, err_len)) goto out;
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        if (FETCH(name, C, I, gpu, ly->w_down, 0)) goto out;
        if (gpu && put(t, ly->w_down, stage, (size_t)(C * I) * es, err, err_len)) goto out;
        /* norm weights are fp32 on both devices */
        struct { const char *fmt; float *dst; int64_t n; } norms[4] = {
            {"model.layers.%d.input_layernorm.weight", ly->ln_in, C},
            {"model.layers.%d.post_attention_layernorm.weight", ly->ln_post, C},
            {"model.layers.%d.self_attn.q_norm.weight", ly->q_norm, HD},
            {"model.layers.%d.self_attn.k_norm.weight", ly->k_norm, HD},
        };
        for (int j = 0; j < (c->qk_norm ? 4 : 2); j++) {
            snprintf(name, sizeof name, norms[j].fmt, l);
            if (FETCH(name, norms[j].n, 0, 0, norms[j].dst, 0)) goto out;
            if (gpu && put(t, norms[j].dst, stage, (size_t)norms[j].n * 4, err, err_len)) goto out;
        }
    }
#undef FETCH
    /* Not used by the forward, but a checkpoint without them is not the model the config names. */
    {
        const struct st_tensor *tn;
        int64_t sh_norm[1] = {C}, sh_head[2] = {V, C};
        if (weights_lookup(w, "model.norm.weight", 1, sh_norm, &tn, err, err_len)) goto out;
        if (!c->tie_word_embeddings && weights_lookup(w, "lm_head.weight", 2, sh_head, &tn, err, err_len)) goto out;
    }
    rc = 0;
out:
    free(stage);
    return rc;
}

/* Qwen3.5 / 3.6: tensors under "model." (Qwen3_5ForCausalLM) or "model.language_model."
 * (Qwen3_5ForConditionalGeneration); the vision tower and the MTP layers are not read. Every
 * Qwen3_5RMSNorm weight is kept as its effective 1 + w, A_log as -exp(A_log), both in fp32 on the
 * host before the copy. CPU: fp32 straight into the destinations. GPU: matrices through a bf16
 * host staging buffer (one tensor at a time, copied to its slice of the fused destination), small
 * vectors through an fp32 one. */
struct hyb_loader {
    struct target *t;     /* NULL: check only (names, shapes, dtypes; nothing read or allocated) */
    const struct hf_weights *w;
    void *stage;          /* GPU: host staging, as large as the largest tensor; NULL on the CPU */
    char *err;
    int err_len;
};

/* Matrix [rows, cols] (or a 3-D conv weight when k3 > 0: [rows, 1, k3], kept fp32) into dst at
 * element offset `at`: bf16 on a GPU unless fp32 is asked (f32 = 1). */
static int hyb_get(struct hyb_loader *L, const char *name, int64_t rows, int64_t cols, int64_t k3, void *dst,
                   size_t at, int f32) {
    int64_t sh[3] = {rows, k3 > 0 ? 1 : cols, k3};
    int nd = k3 > 0 ? 3 : cols ? 2 : 1;
    size_t n = (size_t)rows * (size_t)(k3 > 0 ? k3 : cols ? cols : 1);
    struct target *t = L->t;
    if (!t) {
        const struct st_tensor *tn;
        return weights_lookup(L->w, name, nd, sh, &tn, L->err, L->err_len);
    }
    if (t->dev < 0) return weights_get_f32(L->w, name, nd, sh, (float *)dst + at, L->err, L->err_len);
    if (f32) {
        if (weights_get_f32(L->w, name, nd, sh, (float *)L->stage, L->err, L->err_len)) return -1;
        return put(t, (float *)dst + at, L->stage, n * 4, L->err, L->err_len);
    }
    if (weights_get_bf16(L->w, name, nd, sh, (bf16 *)L->stage, L->err, L->err_len)) return -1;
    return put(t, (bf16 *)dst + at, L->stage, n * 2, L->err, L->err_len);
}

/* fp32 vector [n] into dst after `fix` (0: as stored, 1: 1 + w, 2: -exp(w)). */
static int hyb_vec(struct hyb_loader *L, const char *name, int64_t n, float *dst, int fix) {
    int64_t sh[1] = {n};
    if (!L->t) {
        const struct st_tensor *tn;
        return weights_lookup(L->w, name, 1, sh, &tn, L->err, L->err_len);
    }
    float *h = L->t->dev < 0 ? dst : (float *)L->stage;
    if (weights_get_f32(L->w, name, 1, sh, h, L->err, L->err_len)) return -1;
    for (int64_t i = 0; i < n; i++) h[i] = fix == 1 ? 1.0f + h[i] : fix == 2 ? -expf(h[i]) : h[i];
    return L->t->dev < 0 ? 0 : put(L->t, dst, h, (size_t)n * 4, L->err, L->err_len);
}

/* t NULL: check that every tensor the config needs is present with its shape and a floating dtype
 * (target_load runs this before anything is allocated, so a mismatched checkpoint is refused with
 * the tensor named before the GPU holds a byte of it). */
static int load_weights_hybrid(struct target *t, const struct model_config *c, const struct hf_weights *w,
                               char *err, int err_len) {
    int64_t C = c->hidden_size, I = c->intermediate_size, HD = c->head_dim, V = c->vocab_size;
    int64_t NH = c->num_attention_heads, NKV = c->num_key_value_heads;
    struct gdn_shape gs = gdn_shape_of(c);
    int64_t VD = (int64_t)gs.n_v * gs.d_v, CONV = gdn_conv_dim(&gs), NV = gs.n_v;
    const char *pre = c->nested ? "model.language_model." : "model.";
    struct hyb_loader L = {t, w, NULL, err, err_len};
    struct target_layer none;
    memset(&none, 0, sizeof none);
    if (t && t->dev >= 0) {
        int64_t big = V * C;   /* the largest single tensor (bf16) or vector (fp32) */
        int64_t cand[] = {2 * NH * HD * C, C * NH * HD, CONV * C, C * VD, I * C};
        for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) big = cand[i] > big ? cand[i] : big;
        size_t bytes = (size_t)big * 2;
        size_t vec = (size_t)(CONV * gs.K > C ? CONV * gs.K : C) * 4;
        if (vec > bytes) bytes = vec;
        if (!(L.stage = malloc(bytes)))
            return err_fail(err, err_len, "target: out of host memory for a %.2f GB staging buffer", bytes / 1e9);
    }
    char name[320];
    int rc = -1;
#define NAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
#define MAT(rows, cols, dst, at) do { if (hyb_get(&L, name, (rows), (cols), 0, (dst), (size_t)(at), 0)) goto out; } while (0)
#define VEC(n, dst, fix) do { if (hyb_vec(&L, name, (n), (dst), (fix))) goto out; } while (0)
    NAME("%sembed_tokens.weight", pre);
    MAT(V, C, t ? t->embed : NULL, 0);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        struct target_layer *ly = t ? &t->layers[l] : &none;
        if (c->layer_linear[l]) {
            void *wi = ly->w_lin_in;
            NAME("%slayers.%d.linear_attn.in_proj_qkv.weight", pre, l); MAT(CONV, C, wi, 0);
            NAME("%slayers.%d.linear_attn.in_proj_z.weight", pre, l);   MAT(VD, C, wi, CONV * C);
            NAME("%slayers.%d.linear_attn.in_proj_b.weight", pre, l);   MAT(NV, C, wi, (CONV + VD) * C);
            NAME("%slayers.%d.linear_attn.in_proj_a.weight", pre, l);   MAT(NV, C, wi, (CONV + VD + NV) * C);
            NAME("%slayers.%d.linear_attn.conv1d.weight", pre, l);
            if (hyb_get(&L, name, CONV, 0, gs.K, ly->conv_w, 0, 1)) goto out;
            NAME("%slayers.%d.linear_attn.A_log", pre, l);              VEC(NV, ly->a_neg, 2);  /* -A_log.float().exp() */
            NAME("%slayers.%d.linear_attn.dt_bias", pre, l);            VEC(NV, ly->dt_bias, 0);
            NAME("%slayers.%d.linear_attn.norm.weight", pre, l);        VEC(gs.d_v, ly->gnorm, 0);
            NAME("%slayers.%d.linear_attn.out_proj.weight", pre, l);    MAT(C, VD, ly->w_lin_out, 0);
        } else {
            void *wq = ly->w_qkv;
            NAME("%slayers.%d.self_attn.q_proj.weight", pre, l);  MAT(2 * NH * HD, C, wq, 0);
            NAME("%slayers.%d.self_attn.k_proj.weight", pre, l);  MAT(NKV * HD, C, wq, 2 * NH * HD * C);
            NAME("%slayers.%d.self_attn.v_proj.weight", pre, l);  MAT(NKV * HD, C, wq, (2 * NH + NKV) * HD * C);
            NAME("%slayers.%d.self_attn.o_proj.weight", pre, l);  MAT(C, NH * HD, ly->w_o, 0);
            NAME("%slayers.%d.self_attn.q_norm.weight", pre, l);  VEC(HD, ly->q_norm, 1);
            NAME("%slayers.%d.self_attn.k_norm.weight", pre, l);  VEC(HD, ly->k_norm, 1);
        }
        NAME("%slayers.%d.mlp.gate_proj.weight", pre, l);  MAT(I, C, ly->w_gu, 0);
        NAME("%slayers.%d.mlp.up_proj.weight", pre, l);    MAT(I, C, ly->w_gu, I * C);
        NAME("%slayers.%d.mlp.down_proj.weight", pre, l);  MAT(C, I, ly->w_down, 0);
        NAME("%slayers.%d.input_layernorm.weight", pre, l);           VEC(C, ly->ln_in, 1);
        NAME("%slayers.%d.post_attention_layernorm.weight", pre, l);  VEC(C, ly->ln_post, 1);
    }
    {
        const struct st_tensor *tn;
        int64_t sh_norm[1] = {C}, sh_head[2] = {V, C};
        if (weights_lookup(w, NAME("%snorm.weight", pre), 1, sh_norm, &tn, err, err_len)) goto out;
        if (!c->tie_word_embeddings && weights_lookup(w, "lm_head.weight", 2, sh_head, &tn, err, err_len)) goto out;
    }
    rc = 0;
#undef VEC
#undef MAT
#undef NAME
out:
    free(L.stage);
    return rc;
}

struct target *target_load(const char *model_dir, const struct target_options *opt, char *err, int err_len) {
    struct model_config cfg;
    if (hf_config_load(&cfg, model_dir, err, err_len)) return NULL;
    struct hf_weights w;
    if (hf_weights_open(&w, model_dir, err, err_len)) return NULL;
    if (is_hybrid(&cfg)) {
        /* the config's shapes against the kernels and every tensor against the config, before any
         * allocation; then one line for what the text model does not read */
        if (check_shape_config(&cfg, opt->cuda_device, err, err_len) || load_weights_hybrid(NULL, &cfg, &w, err, err_len)) {
            hf_weights_close(&w);
            return NULL;
        }
        int n_vis = 0, n_mtp = 0;
        for (int i = 0; i < w.n_tensors; i++) {
            const char *nm = w.tensors[i]->name;
            n_vis += strncmp(nm, "model.visual.", 13) == 0 || strncmp(nm, "visual.", 7) == 0;
            n_mtp += strncmp(nm, "mtp.", 4) == 0;
        }
        if (n_vis || n_mtp)
            log_info("target: %d vision-tower tensors (model.visual.*) and %d multi-token-prediction tensors (mtp.*) "
                     "ignored: the target reads the text model only", n_vis, n_mtp);
    }
    struct target *t = target_new(&cfg, opt, err, err_len);
    if (t && (is_hybrid(&cfg) ? load_weights_hybrid(t, &t->cfg, &w, err, err_len) : load_weights(t, &w, err, err_len))) {
        target_free(t);
        t = NULL;
    }
    hf_weights_close(&w);
    return t;
}

/* Host random fill: uniform with the given mean and standard deviation. */
static void host_fill(float *p, size_t n, uint64_t *rng, float mean, float std) {
    float a = std * 1.7320508f;
    for (size_t i = 0; i < n; i++) {
        double u = (double)(kernels_rng_next(rng) >> 11) * (1.0 / 9007199254740992.0);
        p[i] = mean + a * (float)(2.0 * u - 1.0);
    }
}

/* Qwen3.5 random weights: matrices and the conv uniform with `std`, effective norm weights
 * (1 + w) and dt_bias 1 ± 0.17, -exp(A_log) in -(0.5 ± 0.17) (a decay that neither forgets at once
 * nor never). On a GPU the matrices are bf16 and generated on the device (another generator than
 * the host's: a GPU model and a CPU model of the same seed differ; compare them through files). */
static struct target *init_random_hybrid(struct target *t, uint64_t seed, float std, char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, HD = (size_t)c->head_dim;
    size_t NH = (size_t)c->num_attention_heads, QKV = (size_t)n_qkv(c);
    struct gdn_shape gs = gdn_shape_of(c);
    size_t LIN_IN = (size_t)gdn_in_dim(&gs), CONV = (size_t)gdn_conv_dim(&gs), VD = (size_t)gs.n_v * gs.d_v;
    uint64_t key = seed * KERNELS_RNG_GAMMA + 1;
    struct { void *p; size_t n; float mean, sd; int mat; } list[12];
    for (int l = -1; l < c->num_hidden_layers; l++) {
        int n = 0;
#define PUT(ptr, cnt, m, s, mt) do { list[n].p = (ptr); list[n].n = (cnt); list[n].mean = (m); list[n].sd = (s); \
                                     list[n].mat = (mt); n++; } while (0)
        if (l < 0) {
            PUT(t->embed, (size_t)c->vocab_size * C, 0.0f, std, 1);
        } else {
            struct target_layer *ly = &t->layers[l];
            if (ly->linear) {
                PUT(ly->w_lin_in, LIN_IN * C, 0.0f, std, 1);
                PUT(ly->conv_w, CONV * (size_t)gs.K, 0.0f, std, 0);
                PUT(ly->a_neg, (size_t)gs.n_v, -0.5f, 0.1f, 0);
                PUT(ly->dt_bias, (size_t)gs.n_v, 1.0f, 0.1f, 0);
                PUT(ly->gnorm, (size_t)gs.d_v, 1.0f, 0.1f, 0);
                PUT(ly->w_lin_out, C * VD, 0.0f, std, 1);
            } else {
                PUT(ly->w_qkv, QKV * C, 0.0f, std, 1);
                PUT(ly->w_o, C * NH * HD, 0.0f, std, 1);
                PUT(ly->q_norm, HD, 1.0f, 0.1f, 0);
                PUT(ly->k_norm, HD, 1.0f, 0.1f, 0);
            }
            PUT(ly->w_gu, 2 * I * C, 0.0f, std, 1);
            PUT(ly->w_down, C * I, 0.0f, std, 1);
            PUT(ly->ln_in, C, 1.0f, 0.1f, 0);
            PUT(ly->ln_post, C, 1.0f, 0.1f, 0);
        }
#undef PUT
        for (int j = 0; j < n; j++) {
            key += 0x632BE59BD9B4E019ull;
#ifdef DFLASH_CUDA
            if (t->dev >= 0) {
                int r = list[j].mat ? target_fill_random_bf16(list[j].p, list[j].n, key, list[j].mean, list[j].sd, t->stream)
                                    : target_fill_random_f32(list[j].p, list[j].n, key, list[j].mean, list[j].sd, t->stream);
                if (r) { err_fail(err, err_len, "target: %s", kernels_error()); target_free(t); return NULL; }
                continue;
            }
#endif
            uint64_t rng = key;
            host_fill(list[j].p, list[j].n, &rng, list[j].mean, list[j].sd);
        }
    }
#ifdef DFLASH_CUDA
    if (t->dev >= 0) {
        cudaError_t e = cudaStreamSynchronize(t->stream);
        if (e != cudaSuccess) { err_fail(err, err_len, "target: random init: %s", cudaGetErrorString(e)); target_free(t); return NULL; }
    }
#endif
    (void)err; (void)err_len;
    return t;
}

struct target *target_init_random(const struct model_config *cfg, const struct target_options *opt,
                                  uint64_t seed, float std, char *err, int err_len) {
    struct target *t = target_new(cfg, opt, err, err_len);
    if (!t) return NULL;
    if (is_hybrid(&t->cfg)) return init_random_hybrid(t, seed, std, err, err_len);
    const struct model_config *c = &t->cfg;
    size_t C = (size_t)c->hidden_size, I = (size_t)c->intermediate_size, HD = (size_t)c->head_dim;
    size_t NH = (size_t)c->num_attention_heads, QKV = (size_t)n_qkv(c);
    struct { void *p; size_t n; int norm; } list[8];
    uint64_t key = seed * KERNELS_RNG_GAMMA + 1;
    for (int l = -1; l < c->num_hidden_layers; l++) {
        int n = 0;
        if (l < 0) {
            list[n].p = t->embed; list[n].n = (size_t)c->vocab_size * C; list[n++].norm = 0;
        } else {
            struct target_layer *ly = &t->layers[l];
            list[n].p = ly->w_qkv; list[n].n = QKV * C; list[n++].norm = 0;
            list[n].p = ly->w_o; list[n].n = C * NH * HD; list[n++].norm = 0;
            list[n].p = ly->w_gu; list[n].n = 2 * I * C; list[n++].norm = 0;
            list[n].p = ly->w_down; list[n].n = C * I; list[n++].norm = 0;
            list[n].p = ly->ln_in; list[n].n = C; list[n++].norm = 1;
            list[n].p = ly->ln_post; list[n].n = C; list[n++].norm = 1;
            if (c->qk_norm) {
                list[n].p = ly->q_norm; list[n].n = HD; list[n++].norm = 1;
                list[n].p = ly->k_norm; list[n].n = HD; list[n++].norm = 1;
            }
        }
        for (int j = 0; j < n; j++) {
            key += 0x632BE59BD9B4E019ull;
            float mean = list[j].norm ? 1.0f : 0.0f, sd = list[j].norm ? 0.1f : std;
#ifdef DFLASH_CUDA
            if (t->dev >= 0) {
                int r = list[j].norm ? target_fill_random_f32(list[j].p, list[j].n, key, mean, sd, t->stream)
                                     : target_fill_random_bf16(list[j].p, list[j].n, key, mean, sd, t->stream);
                if (r) { err_fail(err, err_len, "target: %s", kernels_error()); target_free(t); return NULL; }
                continue;
            }
#endif
            uint64_t rng = key;
            host_fill(list[j].p, list[j].n, &rng, mean, sd);
        }
    }
#ifdef DFLASH_CUDA
    if (t->dev >= 0) {
        cudaError_t e = cudaStreamSynchronize(t->stream);
        if (e != cudaSuccess) { err_fail(err, err_len, "target: random init: %s", cudaGetErrorString(e)); target_free(t); return NULL; }
    }
#endif
    return t;
}

/* ---------------------------------------------------------------- accessors */

const struct model_config *target_config(const struct target *t) { return &t->cfg; }
int target_device(const struct target *t) { return t->dev; }
int target_max_tokens(const struct target *t) { return t->max_tokens; }
int target_n_capture(const struct target *t) { return t->n_capture; }
const int *target_capture(const struct target *t) { return t->capture; }
size_t target_elem_bytes(const struct target *t) { return t->esize; }
size_t target_weight_bytes(const struct target *t) { return t->weight_bytes; }
size_t target_work_bytes(const struct target *t) { return t->work_bytes; }
#ifdef DFLASH_CUDA
cudaStream_t target_stream(const struct target *t) { return t->stream; }

int target_timing(struct target *t, int on, char *err, int err_len) {
    if (t->dev < 0) return err_fail(err, err_len, "target_timing: the CPU path has no device phases");
    if (on && !t->ev) {
        t->max_ev = 8 * t->cfg.num_hidden_layers + 2;
        t->ev = calloc((size_t)t->max_ev, sizeof *t->ev);
        t->ev_phase = calloc((size_t)t->max_ev, sizeof *t->ev_phase);
        if (!t->ev || !t->ev_phase) return err_fail(err, err_len, "target_timing: out of host memory");
        for (int i = 0; i < t->max_ev; i++)
            if (cudaEventCreate(&t->ev[i]) != cudaSuccess)
                return err_fail(err, err_len, "target_timing: cudaEventCreate failed");
    }
    t->timing = on;
    t->n_ev = 0;
    return 0;
}

int target_phase_ms(struct target *t, double *ms, char *err, int err_len) {
    for (int i = 1; i < t->n_ev; i++) {
        float e = 0;
        cudaError_t ce = cudaEventElapsedTime(&e, t->ev[i - 1], t->ev[i]);
        if (ce != cudaSuccess) return err_fail(err, err_len, "target_phase_ms: %s", cudaGetErrorString(ce));
        ms[t->ev_phase[i]] += e;
    }
    return 0;
}

/* Record the end of `phase` (the first call of a forward marks its start). */
static void tmark(struct target *t, int phase) {
    if (!t->timing || t->n_ev >= t->max_ev) return;
    t->ev_phase[t->n_ev] = phase;
    cudaEventRecord(t->ev[t->n_ev++], t->stream);
}
#endif

double target_flops(const struct target *t, const int32_t *cu_seqlens, int n_docs) {
    const struct model_config *c = &t->cfg;
    double C = c->hidden_size, I = c->intermediate_size, HD = c->head_dim, NH = c->num_attention_heads;
    if (is_hybrid(c)) {
        /* matmuls of each layer kind + full attention pairs + the DeltaNet recurrence (per token and
         * value head: decay, Sᵀk, rank-1 update, Sᵀq over d_k·d_v: ~8 FLOPs per state entry) */
        struct gdn_shape gs = gdn_shape_of(c);
        double T = cu_seqlens[n_docs] - cu_seqlens[0], pairs = 0, total = 0;
        for (int d = 0; d < n_docs; d++) {
            double len = cu_seqlens[d + 1] - cu_seqlens[d];
            pairs += len * (len + 1) / 2;
        }
        for (int l = 0; l < c->num_hidden_layers; l++) {
            if (c->layer_linear[l])
                total += 2.0 * T * (C * gdn_in_dim(&gs) + (double)gs.n_v * gs.d_v * C + 3.0 * I * C) +
                         8.0 * T * gs.n_v * gs.d_k * gs.d_v;
            else
                total += 2.0 * T * (C * n_qkv(c) + NH * HD * C + 3.0 * I * C) + 4.0 * HD * NH * pairs;
        }
        return total;
    }
    double per_layer = C * n_qkv(c) + NH * HD * C + 3.0 * I * C;
    double T = cu_seqlens[n_docs] - cu_seqlens[0], pairs = 0;
    for (int d = 0; d < n_docs; d++) {
        double len = cu_seqlens[d + 1] - cu_seqlens[d];
        pairs += len * (len + 1) / 2;
    }
    return c->num_hidden_layers * (2.0 * per_layer * T + 4.0 * HD * NH * pairs);
}

/* ---------------------------------------------------------------- forward */

int target_check_batch(const struct target *t, const struct target_batch *b, char *err, int err_len) {
    unsigned long long seq = (unsigned long long)b->seq;
    int T = b->n_tokens;
    if (T < 1 || T > t->max_tokens)
        return err_fail(err, err_len, "batch seq %llu: %d tokens, but the target's working memory is planned for 1..%d "
                    "(raise --tokens)", seq, T, t->max_tokens);
    if (b->n_docs < 1 || b->n_docs > T)
        return err_fail(err, err_len, "batch seq %llu: n_docs %d must be in [1, %d]", seq, b->n_docs, T);
    if (attention_check_cu_seqlens(b->cu_seqlens, b->n_docs, T, NULL))
        return err_fail(err, err_len, "batch seq %llu: %s", seq, kernels_error());
    if (b->cu_seqlens[b->n_docs] != T)
        return err_fail(err, err_len, "batch seq %llu: cu_seqlens[%d] = %d must equal n_tokens %d (no padding rows)", seq,
                    b->n_docs, (int)b->cu_seqlens[b->n_docs], T);
    for (int i = 0; i < T; i++) {
        if (b->input_ids[i] < 0 || b->input_ids[i] >= t->cfg.vocab_size)
            return err_fail(err, err_len, "batch seq %llu: input_ids[%d] = %d is outside the vocabulary [0, %d)", seq, i,
                        (int)b->input_ids[i], t->cfg.vocab_size);
        if (b->position_ids[i] < 0)
            return err_fail(err, err_len, "batch seq %llu: position_ids[%d] = %d is negative", seq, i,
                        (int)b->position_ids[i]);
    }
    const struct model_config *c = &t->cfg;
    if (is_hybrid(c) && (c->image_token_id > 0 || c->video_token_id > 0))
        for (int i = 0; i < T; i++)
            if (b->input_ids[i] == c->image_token_id || b->input_ids[i] == c->video_token_id)
                return err_fail(err, err_len, "batch seq %llu: input_ids[%d] = %d is the %s placeholder token (%s); "
                                "vision inputs are not supported, the target takes text only", seq, i,
                                (int)b->input_ids[i], b->input_ids[i] == c->image_token_id ? "image" : "video",
                                b->input_ids[i] == c->image_token_id ? "image_token_id" : "video_token_id");
    return 0;
}

/* Split qkv (T, QKV) into dense q, k, v (CPU). */
static void qkv_split_host(float *q, float *k, float *v, const float *qkv, int T, int NH, int NKV, int HD) {
    size_t nq = (size_t)NH * HD, nk = (size_t)NKV * HD, row = nq + 2 * nk;
    for (int t = 0; t < T; t++) {
        const float *r = qkv + (size_t)t * row;
        memcpy(q + (size_t)t * nq, r, nq * sizeof(float));
        memcpy(k + (size_t)t * nk, r + nq, nk * sizeof(float));
        memcpy(v + (size_t)t * nk, r + nq + nk, nk * sizeof(float));
    }
}

static int forward_cpu(struct target *t, const struct target_batch *b, float *states, float *last,
                       char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    int T = b->n_tokens, C = c->hidden_size, I = c->intermediate_size, HD = c->head_dim;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, QKV = n_qkv(c), L = c->num_hidden_layers;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    float *x = t->x, *h = t->h, *qkv = t->qkv, *q = t->q, *k = t->k, *v = t->v, *att = t->att;
    float *gu = t->gu, *act = t->act;
    size_t plane = (size_t)T * C;

    if (embedding_forward_ref(x, b->input_ids, t->embed, T, C, c->vocab_size))
        return err_fail(err, err_len, "batch seq %llu: %s", (unsigned long long)b->seq, kernels_error());
    for (int l = 0; l < L; l++) {
        struct target_layer *ly = &t->layers[l];
        rmsnorm_forward_ref(h, NULL, x, ly->ln_in, T, C, eps);
        gemm_forward_ref(qkv, h, 0, ly->w_qkv, 1, T, QKV, C, 1.0f, 0.0f);
        qkv_split_host(q, k, v, qkv, T, NH, NKV, HD);
        if (c->qk_norm) {
            rmsnorm_forward_ref(q, NULL, q, ly->q_norm, T * NH, HD, eps);
            rmsnorm_forward_ref(k, NULL, k, ly->k_norm, T * NKV, HD, eps);
        }
        rope_forward_ref(q, k, b->position_ids, t->inv_freq, T, NH, NKV, HD);
        if (attention_forward_ref(att, NULL, q, k, v, b->cu_seqlens, b->n_docs, T, NH, NKV, HD, scale))
            return err_fail(err, err_len, "batch seq %llu: %s", (unsigned long long)b->seq, kernels_error());
        gemm_forward_ref(x, att, 0, ly->w_o, 1, T, C, NH * HD, 1.0f, 1.0f);      /* x += att · W_oᵀ */
        rmsnorm_forward_ref(h, NULL, x, ly->ln_post, T, C, eps);
        gemm_forward_ref(gu, h, 0, ly->w_gu, 1, T, 2 * I, C, 1.0f, 0.0f);
        swiglu_forward_ref(act, gu, gu + I, T, I, 2 * I);
        gemm_forward_ref(x, act, 0, ly->w_down, 1, T, C, I, 1.0f, 1.0f);        /* x += act · W_downᵀ */
        for (int j = 0; j < t->n_capture; j++)
            if (t->capture[j] == l) memcpy(states + (size_t)j * plane, x, plane * sizeof(float));
    }
    if (last) memcpy(last, x, plane * sizeof(float));
    return 0;
}

#ifdef DFLASH_CUDA
#define KCALL(call) do { if ((call) != 0) return err_fail(err, err_len, "batch seq %llu: %s", \
                                                       (unsigned long long)b->seq, kernels_error()); } while (0)
#define CCALL(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return err_fail(err, err_len, \
                         "batch seq %llu: %s: %s", (unsigned long long)b->seq, #call, cudaGetErrorString(e_)); } while (0)

/* Layer l's MLP block on x (x += down(swiglu(gate_up(norm(x))))) and its captured plane into states, with the
 * phase marks of both (the same in every family's GPU forward). */
static int layer_mlp_gpu(struct target *t, const struct target_batch *b, const struct target_layer *ly, int l,
                         bf16 *states, char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    int T = b->n_tokens, C = c->hidden_size, I = c->intermediate_size;
    float eps = (float)c->rms_norm_eps;
    bf16 *x = t->x, *h = t->h, *gu = t->gu, *act = t->act;
    cudaStream_t s = t->stream;
    size_t plane = (size_t)T * C;
    KCALL(rmsnorm_forward(h, NULL, x, ly->ln_post, T, C, eps, s));
    KCALL(blas_linear_forward(gu, BLAS_BF16, h, ly->w_gu, NULL, T, 2 * I, C, s));
    KCALL(swiglu_forward(act, gu, gu + I, T, I, 2 * I, s));
    KCALL(blas_matmul(x, BLAS_BF16, act, 0, ly->w_down, 1, NULL, T, C, I, 0, 0, 0, 1.0f, 1.0f, s));
    tmark(t, TARGET_PH_MLP);
    for (int j = 0; j < t->n_capture; j++)
        if (t->capture[j] == l)
            CCALL(cudaMemcpyAsync(states + (size_t)j * plane, x, plane * 2, cudaMemcpyDefault, s));
    tmark(t, TARGET_PH_COPY);
    return 0;
}

static int forward_gpu(struct target *t, const struct target_batch *b, bf16 *states, bf16 *last,
                       char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    int T = b->n_tokens, C = c->hidden_size, HD = c->head_dim;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, QKV = n_qkv(c), L = c->num_hidden_layers;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    bf16 *x = t->x, *h = t->h, *qkv = t->qkv, *q = t->q, *k = t->k, *v = t->v, *att = t->att;
    cudaStream_t s = t->stream;
    size_t plane = (size_t)T * C;
    int max_seqlen = 0;
    if (attention_check_cu_seqlens(b->cu_seqlens, b->n_docs, T, &max_seqlen))
        return err_fail(err, err_len, "batch seq %llu: %s", (unsigned long long)b->seq, kernels_error());

    CCALL(cudaSetDevice(t->dev));
    CCALL(cudaMemcpyAsync(t->ids, b->input_ids, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(t->pos, b->position_ids, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(t->cu, b->cu_seqlens, (size_t)(b->n_docs + 1) * 4, cudaMemcpyHostToDevice, s));
    t->n_ev = 0;
    tmark(t, TARGET_PH_EMBED);
    KCALL(embedding_forward(x, t->ids, t->embed, T, C, c->vocab_size, s));
    tmark(t, TARGET_PH_EMBED);
    for (int l = 0; l < L; l++) {
        struct target_layer *ly = &t->layers[l];
        KCALL(rmsnorm_forward(h, NULL, x, ly->ln_in, T, C, eps, s));
        KCALL(blas_linear_forward(qkv, BLAS_BF16, h, ly->w_qkv, NULL, T, QKV, C, s));
        KCALL(target_qkv_split(q, k, v, qkv, T, NH, NKV, HD, s));
        if (c->qk_norm) {
            /* both per-head norms in one launch (bitwise the two separate calls) */
            KCALL(rmsnorm_qk_forward(q, NULL, q, ly->q_norm, T * NH, k, NULL, k, ly->k_norm, T * NKV, HD, eps, s));
        }
        KCALL(rope_forward(q, k, t->pos, t->inv_freq, T, NH, NKV, HD, s));
        KCALL(attention_forward(att, NULL, q, k, v, t->cu, b->n_docs, max_seqlen, T, NH, NKV, HD, scale, s));
        /* x += att · W_oᵀ: the residual add in the GEMM epilogue, rounded to bf16 once */
        KCALL(blas_matmul(x, BLAS_BF16, att, 0, ly->w_o, 1, NULL, T, C, NH * HD, 0, 0, 0, 1.0f, 1.0f, s));
        tmark(t, TARGET_PH_FULL);
        if (layer_mlp_gpu(t, b, ly, l, states, err, err_len)) return -1;
    }
    if (last) CCALL(cudaMemcpyAsync(last, x, plane * 2, cudaMemcpyDefault, s));
    tmark(t, TARGET_PH_COPY);
    /* The caller publishes the output right after we return (design.md §4): every write must be done. */
    CCALL(cudaStreamSynchronize(s));
    return 0;
}
/* Qwen3.5 / 3.6 hybrid on the GPU: the CPU path's layer order (forward_cpu_hybrid) with the
 * kernels/ launchers, bf16 activations, fp32 inside the Gated DeltaNet (conv output, normalised
 * q/k, recurrent state, delta-rule output) until the gated norm rounds its output for out_proj. */
static int forward_gpu_hybrid(struct target *t, const struct target_batch *b, bf16 *states, bf16 *last,
                              char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    int T = b->n_tokens, C = c->hidden_size, HD = c->head_dim;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, QKV = n_qkv(c), L = c->num_hidden_layers;
    int R = hf_config_rotary_dim(c), ND = b->n_docs;
    struct gdn_shape gs = gdn_shape_of(c);
    int LIN_IN = gdn_in_dim(&gs), VD = gs.n_v * gs.d_v, CONV = gdn_conv_dim(&gs), KD = gs.n_k * gs.d_k;
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD), qscale = 1.0f / sqrtf((float)gs.d_k);
    bf16 *x = t->x, *h = t->h, *qkv = t->qkv, *q = t->q, *k = t->k, *v = t->v, *att = t->att;
    bf16 *gate = t->gate, *y = t->lin_y;
    float *conv = t->lin_conv, *o = t->lin_o;
    struct gated_delta_shape ds = {T, ND, gs.n_k, gs.n_v, gs.d_k, gs.d_v, CONV, CONV, LIN_IN};
    cudaStream_t s = t->stream;
    size_t plane = (size_t)T * C;
    int max_seqlen = 0;
    if (attention_check_cu_seqlens(b->cu_seqlens, ND, T, &max_seqlen))
        return err_fail(err, err_len, "batch seq %llu: %s", (unsigned long long)b->seq, kernels_error());

    CCALL(cudaSetDevice(t->dev));
    CCALL(cudaMemcpyAsync(t->ids, b->input_ids, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(t->pos, b->position_ids, (size_t)T * 4, cudaMemcpyHostToDevice, s));
    CCALL(cudaMemcpyAsync(t->cu, b->cu_seqlens, (size_t)(ND + 1) * 4, cudaMemcpyHostToDevice, s));
    t->n_ev = 0;
    tmark(t, TARGET_PH_EMBED);
    KCALL(embedding_forward(x, t->ids, t->embed, T, C, c->vocab_size, s));
    tmark(t, TARGET_PH_EMBED);
    for (int l = 0; l < L; l++) {
        struct target_layer *ly = &t->layers[l];
        KCALL(rmsnorm_forward(h, NULL, x, ly->ln_in, T, C, eps, s));
        if (ly->linear) {
            /* [qkv | z | b | a] = h · W_inᵀ; conv + silu and the l2 norms in fp32; the delta rule with
             * its state restarted at every document start (cu_seqlens on the device) */
            KCALL(blas_linear_forward(qkv, BLAS_BF16, h, ly->w_lin_in, NULL, T, LIN_IN, C, s));
            tmark(t, TARGET_PH_LIN_PROJ);
            KCALL(conv1d_forward(conv, qkv, LIN_IN, ly->conv_w, t->cu, ND, T, CONV, gs.K, s));
            KCALL(l2norm_forward(conv, T, CONV, gs.n_k, gs.d_k, qscale, s));
            KCALL(l2norm_forward(conv + KD, T, CONV, gs.n_k, gs.d_k, 1.0f, s));
            tmark(t, TARGET_PH_LIN_CONV);
#if DFLASH_GDN_SPLIT
            KCALL(gated_delta_forward_split(o, conv, conv + KD, conv + 2 * KD, qkv + CONV + VD,
                                            qkv + CONV + VD + gs.n_v, ly->a_neg, ly->dt_bias, t->cu, &ds, t->lin_ws,
                                            t->lin_ws_bytes, s));
#else
            KCALL(gated_delta_forward(o, conv, conv + KD, conv + 2 * KD, qkv + CONV + VD, qkv + CONV + VD + gs.n_v,
                                      ly->a_neg, ly->dt_bias, t->cu, &ds, s));
#endif
            tmark(t, TARGET_PH_LIN_DELTA);
            KCALL(gated_rmsnorm_forward(y, o, qkv + CONV, LIN_IN, ly->gnorm, T, gs.n_v, gs.d_v, eps, s));
            KCALL(blas_matmul(x, BLAS_BF16, y, 0, ly->w_lin_out, 1, NULL, T, C, VD, 0, 0, 0, 1.0f, 1.0f, s));
        } else {
            KCALL(blas_linear_forward(qkv, BLAS_BF16, h, ly->w_qkv, NULL, T, QKV, C, s));
            KCALL(gated_attn_split_forward(q, gate, k, v, qkv, T, NH, NKV, HD, s));
            KCALL(rmsnorm_qk_forward(q, NULL, q, ly->q_norm, T * NH, k, NULL, k, ly->k_norm, T * NKV, HD, eps, s));
            KCALL(gated_attn_rope_forward(q, k, t->pos, t->inv_freq, T, NH, NKV, HD, R, s));
            KCALL(attention_forward(att, NULL, q, k, v, t->cu, ND, max_seqlen, T, NH, NKV, HD, scale, s));
            KCALL(gated_attn_gate_forward(att, gate, (int64_t)T * NH * HD, s));
            KCALL(blas_matmul(x, BLAS_BF16, att, 0, ly->w_o, 1, NULL, T, C, NH * HD, 0, 0, 0, 1.0f, 1.0f, s));
        }
        tmark(t, ly->linear ? TARGET_PH_LIN_OUT : TARGET_PH_FULL);   /* the input norm counts with its mixer */
        if (layer_mlp_gpu(t, b, ly, l, states, err, err_len)) return -1;
    }
    if (last) CCALL(cudaMemcpyAsync(last, x, plane * 2, cudaMemcpyDefault, s));
    tmark(t, TARGET_PH_COPY);
    CCALL(cudaStreamSynchronize(s));
    return 0;
}
#undef KCALL
#undef CCALL
#endif

/* target_options.cpu_bf16_points: n values rounded to bf16 in place, where the GPU forward stores bf16 */
static void bf16_point(const struct target *t, float *p, size_t n) {
    if (t->bf16_points)
        for (size_t i = 0; i < n; i++) p[i] = bf16_round(p[i]);
}

/* Qwen3.5 / 3.6 hybrid (CPU, fp32): see gdn.h for the Gated DeltaNet; the full-attention layer is
 * Qwen3's with a (1 + w) q/k norm, partial rotary and the output gate att ⊙ sigmoid(gate). */
static int forward_cpu_hybrid(struct target *t, const struct target_batch *b, float *states, float *last,
                              char *err, int err_len) {
    const struct model_config *c = &t->cfg;
    int T = b->n_tokens, C = c->hidden_size, I = c->intermediate_size, HD = c->head_dim;
    int NH = c->num_attention_heads, NKV = c->num_key_value_heads, QKV = n_qkv(c), L = c->num_hidden_layers;
    int R = hf_config_rotary_dim(c);
    struct gdn_shape gs = gdn_shape_of(c);
    int LIN_IN = gdn_in_dim(&gs), VD = gs.n_v * gs.d_v, CONV = gdn_conv_dim(&gs);
    float eps = (float)c->rms_norm_eps, scale = 1.0f / sqrtf((float)HD);
    float *x = t->x, *h = t->h, *qkv = t->qkv, *q = t->q, *k = t->k, *v = t->v, *att = t->att;
    float *gu = t->gu, *act = t->act;
    size_t plane = (size_t)T * C;

    if (embedding_forward_ref(x, b->input_ids, t->embed, T, C, c->vocab_size))
        return err_fail(err, err_len, "batch seq %llu: %s", (unsigned long long)b->seq, kernels_error());
    bf16_point(t, x, plane);
    for (int l = 0; l < L; l++) {
        struct target_layer *ly = &t->layers[l];
        rmsnorm_forward_ref(h, NULL, x, ly->ln_in, T, C, eps);
        bf16_point(t, h, plane);
        if (ly->linear) {
            gemm_forward_ref(qkv, h, 0, ly->w_lin_in, 1, T, LIN_IN, C, 1.0f, 0.0f);
            bf16_point(t, qkv, (size_t)T * LIN_IN);
            for (int d = 0; d < b->n_docs; d++) {   /* every state restarts at a document boundary */
                int s0 = b->cu_seqlens[d], len = b->cu_seqlens[d + 1] - s0;
                if (len > 0)
                    gdn_forward_doc((float *)t->lin_y + (size_t)s0 * VD, qkv + (size_t)s0 * LIN_IN, LIN_IN, len, &gs, ly->conv_w,
                                    ly->a_neg, ly->dt_bias, ly->gnorm, eps, t->lin_conv + (size_t)s0 * CONV,
                                    t->lin_state);
            }
            bf16_point(t, (float *)t->lin_y, (size_t)T * VD);
            gemm_forward_ref(x, t->lin_y, 0, ly->w_lin_out, 1, T, C, VD, 1.0f, 1.0f);   /* x += y · W_outᵀ */
        } else {
            gemm_forward_ref(qkv, h, 0, ly->w_qkv, 1, T, QKV, C, 1.0f, 0.0f);
            bf16_point(t, qkv, (size_t)T * QKV);
            gated_attn_split_forward_ref(q, t->gate, k, v, qkv, T, NH, NKV, HD);
            rmsnorm_forward_ref(q, NULL, q, ly->q_norm, T * NH, HD, eps);
            rmsnorm_forward_ref(k, NULL, k, ly->k_norm, T * NKV, HD, eps);
            bf16_point(t, q, (size_t)T * NH * HD);
            bf16_point(t, k, (size_t)T * NKV * HD);
            gated_attn_rope_forward_ref(q, b->position_ids, t->inv_freq, T, NH, HD, R);
            gated_attn_rope_forward_ref(k, b->position_ids, t->inv_freq, T, NKV, HD, R);
            bf16_point(t, q, (size_t)T * NH * HD);
            bf16_point(t, k, (size_t)T * NKV * HD);
            if (attention_forward_ref(att, NULL, q, k, v, b->cu_seqlens, b->n_docs, T, NH, NKV, HD, scale))
                return err_fail(err, err_len, "batch seq %llu: %s", (unsigned long long)b->seq, kernels_error());
            bf16_point(t, att, (size_t)T * NH * HD);
            gated_attn_gate_forward_ref(att, t->gate, (int64_t)T * NH * HD);
            bf16_point(t, att, (size_t)T * NH * HD);
            gemm_forward_ref(x, att, 0, ly->w_o, 1, T, C, NH * HD, 1.0f, 1.0f);      /* x += att · W_oᵀ */
        }
        bf16_point(t, x, plane);
        rmsnorm_forward_ref(h, NULL, x, ly->ln_post, T, C, eps);
        bf16_point(t, h, plane);
        gemm_forward_ref(gu, h, 0, ly->w_gu, 1, T, 2 * I, C, 1.0f, 0.0f);
        bf16_point(t, gu, (size_t)T * 2 * I);
        swiglu_forward_ref(act, gu, gu + I, T, I, 2 * I);
        bf16_point(t, act, (size_t)T * I);
        gemm_forward_ref(x, act, 0, ly->w_down, 1, T, C, I, 1.0f, 1.0f);
        bf16_point(t, x, plane);
        for (int j = 0; j < t->n_capture; j++)
            if (t->capture[j] == l) memcpy(states + (size_t)j * plane, x, plane * sizeof(float));
    }
    if (last) memcpy(last, x, plane * sizeof(float));
    return 0;
}

int target_forward(struct target *t, const struct target_batch *b, void *states, void *last,
                   char *err, int err_len) {
    if (target_check_batch(t, b, err, err_len)) return -1;
#ifdef DFLASH_CUDA
    if (t->dev >= 0)
        return is_hybrid(&t->cfg) ? forward_gpu_hybrid(t, b, states, last, err, err_len)
                                  : forward_gpu(t, b, states, last, err, err_len);
#endif
    if (is_hybrid(&t->cfg)) return forward_cpu_hybrid(t, b, states, last, err, err_len);
    return forward_cpu(t, b, states, last, err, err_len);
}

/* ---------------------------------------------------------------- CPU weight views (model/decode.c) */

int target_cpu_layer(const struct target *t, int l, struct target_layer_view *out, char *err, int err_len) {
    if (t->dev >= 0) return err_fail(err, err_len, "target: the CPU weight view of a GPU target (cuda:%d)", t->dev);
    if (l < 0 || l >= t->cfg.num_hidden_layers)
        return err_fail(err, err_len, "target: layer %d of %d", l, t->cfg.num_hidden_layers);
    const struct target_layer *ly = &t->layers[l];
    *out = (struct target_layer_view){ly->w_qkv, ly->w_o, ly->w_gu, ly->w_down, ly->ln_in, ly->ln_post, ly->q_norm,
                                      ly->k_norm, ly->linear, ly->w_lin_in, ly->conv_w, ly->a_neg, ly->dt_bias,
                                      ly->gnorm, ly->w_lin_out};
    return 0;
}

const float *target_cpu_embed(const struct target *t) { return t->dev >= 0 ? NULL : t->embed; }
const float *target_cpu_inv_freq(const struct target *t) { return t->dev >= 0 ? NULL : t->inv_freq; }

#ifdef DFLASH_CUDA
/* ---------------------------------------------------------------- GPU weight views (model/decode.c) */

int target_gpu_layer(const struct target *t, int l, struct target_gpu_layer_view *out, char *err, int err_len) {
    if (t->dev < 0) return err_fail(err, err_len, "target: the GPU weight view of a CPU target");
    if (l < 0 || l >= t->cfg.num_hidden_layers)
        return err_fail(err, err_len, "target: layer %d of %d", l, t->cfg.num_hidden_layers);
    const struct target_layer *ly = &t->layers[l];
    *out = (struct target_gpu_layer_view){ly->w_qkv, ly->w_o, ly->w_gu, ly->w_down, ly->ln_in, ly->ln_post,
                                          ly->q_norm, ly->k_norm, ly->linear, ly->w_lin_in, ly->w_lin_out,
                                          ly->conv_w, ly->a_neg, ly->dt_bias, ly->gnorm};
    return 0;
}

const bf16 *target_gpu_embed(const struct target *t) { return t->dev >= 0 ? t->embed : NULL; }
const float *target_gpu_inv_freq(const struct target *t) { return t->dev >= 0 ? t->inv_freq : NULL; }
#endif
