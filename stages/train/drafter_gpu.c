/*
 * stages/train/drafter_gpu.c — the GPU training step of the DFlash drafter (train/drafter.h, DFLASH_CUDA part;
 * issue 20). Launcher for launcher the sequence of drafter_step_cpu (drafter.c), in bf16 with fp32 masters,
 * gradients, statistics and loss, over the kernels/<op>.cu launchers and the cuBLASLt wrapper.
 *
 * Memory: drafter_gpu_init lists every device buffer (plan_add), sums them, makes one cudaMalloc and prints the
 * plan. The only device memory outside it is cuBLASLt's workspace (blas_init, 64 MiB) and the LM-head loss
 * workspace (lmhead_loss_ws_init, opaque; measured with cudaMemGetInfo around its allocation and printed).
 *
 * Context at the budget: every context-side op (fc, hidden_norm, the k/v projections of the context, the
 * attention's context keys, the loss's target rows) runs over Tc = budget rows; rows T..Tc-1 are padding
 * (features and last 0, loss mask 0, doc id -1, position 0). A doc id of -1 is visible to no query
 * (kernels/block_attn.h), the masked rows carry no loss, and zero features give zero context rows, so the result
 * equals the CPU step on T rows, while every GEMM and kernel shape depends only on (budget, N, B, model): the
 * cuBLASLt heuristic runs once per shape at the first step (drafter_gpu_warmup front-loads it), never later.
 *
 * Precision points (the CPU path is fp32 throughout): features, activations and the bf16 weight copies are bf16;
 * GEMMs accumulate in fp32 and round their output to bf16, except the gradient GEMMs into the fp32 accumulators
 * (weights' g, dL/dxn1 of the three projections, dL/dctx of all layers) which stay fp32 and are rounded to bf16
 * once when consumed. Residual adds are fused into the o_proj / down_proj GEMMs (beta = 1 on a copy of the
 * residual): one rounding of (GEMM + residual) in fp32. Block attention returns fp32 dq, dk, dv, rounded to bf16
 * for the rope and q/k-norm backward.
 *
 * Determinism: every kernel the step uses is bitwise repeatable for given inputs and shapes — cuBLASLt with a
 * cached algorithm (no split-K atomics are requested; the heuristic's choice for a shape is fixed per process and
 * the same on every run of one build on one GPU), rmsnorm_backward / rmsnorm_qk_backward (fixed-order dw
 * partials), block_attn_backward (no atomics), lmhead_loss (per-row reductions, one-block weights kernel),
 * anchors (key order), swiglu / rope / cast / embedding (elementwise), the glue kernels (drafter_gpu.cu: data
 * movement, the per-element noise, an integer EAL sum). tests/gpu/test_train_gpu.c runs one step twice and
 * compares gradients bit for bit.
 */
#ifdef DFLASH_CUDA
#include "train/drafter.h"
#include "train/drafter_gpu.h"

#include "core/err.h"
#include "model/hfconfig.h"

#include "kernels/anchors.h"
#include "kernels/blas.h"
#include "kernels/block_attn.h"
#include "kernels/cast.h"
#include "kernels/embedding.h"
#include "kernels/lmhead_loss.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LP_IN_LN, LP_Q, LP_K, LP_V, LP_O, LP_QN, LP_KN, LP_POST_LN, LP_GATE, LP_UP, LP_DOWN, LP_N };
_Static_assert((int)LP_N == (int)DRAFTER_LT_N && (int)LP_DOWN == (int)DRAFTER_LT_DOWN && (int)LP_QN == (int)DRAFTER_LT_QN,
               "layer tensor order");

/* metrics buffer, 4-byte words: loss (f32), K, eal_sum, eal_count, correct[B], total[B] */
enum { MB_LOSS = 0, MB_K = 1, MB_EAL_SUM = 2, MB_EAL_COUNT = 3, MB_CORRECT = 4 };
#define MB_WORDS(B) (MB_CORRECT + 2 * (B))

#define DG_TM_MAX 1024
#define DG_METRIC_SLOTS 256   /* steps (micro-batches) whose metrics can wait for one drafter_gpu_metrics */
struct dg_layer {
    bf16 *xin, *xn1, *qraw, *q, *kraw, *k, *v, *o, *h, *xn2, *gate, *up, *act;
    float *rstd1, *rstdq, *rstdk, *lse, *rstd2;
};

struct plan_entry {
    void **pp;
    size_t bytes;
    const char *name;
};

struct drafter_gpu {
    struct drafter *d;
    const struct drafter_config *c;
    cudaStream_t s;
    int n;
    struct drafter_gpu_param *p;
    int i_fc, i_hnorm, i_norm, i_embed, i_lm, i_vnorm, i_vlm;
    int (*li)[LP_N];                   /* (L) parameter index of each layer tensor */
    /* planned memory */
    struct plan_entry *plan;
    int n_plan, cap_plan;
    void *base;
    size_t bytes, lm_ws_bytes, blas_ws_bytes;
    /* buffers */
    struct drafter_gpu_inputs in;
    float *inv_freq;
    bf16 *hid_used, *ctx_fc, *ctx;
    float *rstd_c;
    struct dg_layer *L;
    bf16 *x_out, *xn;
    float *rstd_f;
    int32_t *pos, *tok, *anchors;
    uint8_t *valid;
    float *row_loss, *row_weight;
    int32_t *mbuf;
    bf16 *dx, *dh, *dxn, *dxn1, *dact, *dgate, *dup, *dout, *dq, *dk, *dv, *dqraw, *dkraw, *dctx, *dctx_fc;
    float *dxn_f, *dq_f, *dk_f, *dv_f, *dctx_f;
    void *anchors_ws, *attn_ws;
    float *rms_scratch, *qk_scratch;
    lmhead_loss_ws *lmws;
    /* phase timing (drafter_gpu_timing) */
    int tm_on, tm_n;
    cudaEvent_t tm_ev[DG_TM_MAX];
    int tm_tag[DG_TM_MAX];
    /* host */
    int32_t *h_mbuf;                   /* pinned (DG_METRIC_SLOTS, MB_WORDS): one slot per pending step */
    cudaEvent_t ev;
    int metrics_pending, last_T, last_budget;
    void *h_stage;                     /* host staging of drafter_gpu_load_batch */
    size_t h_stage_bytes;
};

#define CU(call, what) do { cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) return err_fail(err, err_len, "%s: %s: %s", fn, (what), cudaGetErrorString(e_)); } while (0)
#define KL(call) do { if ((call)) return err_fail(err, err_len, "%s: %s", fn, kernels_error()); } while (0)

static int plan_add(struct drafter_gpu *g, void *pp, size_t bytes, const char *name) {
    if (g->n_plan == g->cap_plan) {
        int cap = g->cap_plan ? 2 * g->cap_plan : 128;
        struct plan_entry *np = realloc(g->plan, sizeof *np * (size_t)cap);
        if (!np) return -1;
        g->plan = np;
        g->cap_plan = cap;
    }
    g->plan[g->n_plan++] = (struct plan_entry){(void **)pp, bytes, name};
    return 0;
}

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

static void print_plan(const struct drafter_gpu *g, FILE *f) {
    const struct drafter_config *c = g->c;
    fprintf(f, "dflash-train gpu memory plan: T_max=%d N=%d B=%d H=%d I=%d n_h=%d n_kv=%d d_h=%d L=%d k=%d V_t=%d V_d=%d\n",
            c->T_max, c->N, c->B, c->H, c->I, c->n_h, c->n_kv, c->d_h, c->L, c->k, c->V_t, c->V_d);
    /* one line per distinct region name (the layers' buffers are summed over layers) */
    for (int i = 0; i < g->n_plan; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++) seen = !strcmp(g->plan[j].name, g->plan[i].name);
        if (seen) continue;
        size_t sum = 0;
        int cnt = 0;
        for (int j = i; j < g->n_plan; j++)
            if (!strcmp(g->plan[j].name, g->plan[i].name)) {
                sum += align256(g->plan[j].bytes);
                cnt++;
            }
        fprintf(f, "  %-34s %4d x  %12.3f MiB\n", g->plan[i].name, cnt, sum / 1048576.0);
    }
    fprintf(f, "  %-34s        %12.3f MiB\n", "lmhead loss workspace (measured)", g->lm_ws_bytes / 1048576.0);
    fprintf(f, "  %-34s        %12.3f MiB\n", "cuBLASLt workspace", g->blas_ws_bytes / 1048576.0);
    fprintf(f, "  total planned %.3f MiB (%.3f GiB)\n", (g->bytes + g->lm_ws_bytes + g->blas_ws_bytes) / 1048576.0,
            (g->bytes + g->lm_ws_bytes + g->blas_ws_bytes) / 1073741824.0);
}

size_t drafter_gpu_planned_bytes(const struct drafter_gpu *g) { return g->bytes + g->lm_ws_bytes + g->blas_ws_bytes; }
const struct drafter_gpu_inputs *drafter_gpu_inputs(const struct drafter_gpu *g) { return &g->in; }
int drafter_gpu_n_params(const struct drafter_gpu *g) { return g->n; }
const struct drafter_gpu_param *drafter_gpu_param(const struct drafter_gpu *g, int i) {
    return i >= 0 && i < g->n ? &g->p[i] : NULL;
}
cudaStream_t drafter_gpu_stream(const struct drafter_gpu *g) { return g->s; }

int drafter_gpu_memory(const struct drafter_gpu *g, size_t *in_use, size_t *total, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_memory";
    (void)g;
    size_t f, t;
    CU(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
    *in_use = t - f;
    *total = t;
    return 0;
}

void drafter_gpu_free(struct drafter_gpu *g) {
    if (!g) return;
    if (g->base) cudaFree(g->base);
    if (g->lmws) lmhead_loss_ws_free(g->lmws);
    if (g->h_mbuf) cudaFreeHost(g->h_mbuf);
    if (g->ev) cudaEventDestroy(g->ev);
    for (int i = 0; i < DG_TM_MAX; i++)
        if (g->tm_ev[i]) cudaEventDestroy(g->tm_ev[i]);
    free(g->h_stage);
    free(g->plan);
    free(g->p);
    free(g->li);
    free(g->L);
    free(g);
}

static int param_index(const struct drafter *d, const char *name) {
    const struct drafter_param *p = drafter_param_find(d, name);
    return p ? (int)(p - drafter_param(d, 0)) : -1;
}

/* Write the sentence, free the partial drafter_gpu, return NULL. */
static struct drafter_gpu *init_fail(struct drafter_gpu *g, char *err, int err_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static struct drafter_gpu *init_fail(struct drafter_gpu *g, char *err, int err_len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (err && err_len > 0) vsnprintf(err, (size_t)err_len, fmt, ap);
    va_end(ap);
    drafter_gpu_free(g);
    return NULL;
}

struct drafter_gpu *drafter_gpu_init(struct drafter *d, cudaStream_t stream, FILE *plan, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_init";
    const struct drafter_config *c = drafter_config_of(d);
    const int H = c->H, I = c->I, QD = c->n_h * c->d_h, KD = c->n_kv * c->d_h, kH = c->k * H;
    if (H % 8 || I % 8 || QD % 8 || KD % 8 || kH % 8) {
        err_fail(err, err_len, "%s: H=%d, I=%d, n_h·d_h=%d and n_kv·d_h=%d must be multiples of 8 (cuBLASLt and the "
                 "vector kernels)", fn, H, I, QD, KD);
        return NULL;
    }
    {   /* the block attention's shapes (kernels/block_attn.h); T and N do not matter here */
        block_attn_config ac = {1, 1, c->B, c->n_h, c->n_kv, c->d_h, 0, 0, 1.0f};
        char aerr[320];
        if (block_attn_shape_supported(&ac, aerr, sizeof aerr)) {
            err_fail(err, err_len, "%s: %s (n_h=%d n_kv=%d B=%d)", fn, aerr, c->n_h, c->n_kv, c->B);
            return NULL;
        }
    }
    struct drafter_gpu *g = calloc(1, sizeof *g);
    if (!g) {
        err_fail(err, err_len, "%s: out of memory", fn);
        return NULL;
    }
    g->d = d;
    g->c = c;
    g->s = stream;
    g->n = drafter_n_params(d);
    g->p = calloc((size_t)g->n, sizeof *g->p);
    g->li = calloc((size_t)c->L, sizeof *g->li);
    g->L = calloc((size_t)c->L, sizeof *g->L);
    if (!g->p || !g->li || !g->L) return init_fail(g, err, err_len, "%s: out of memory", fn);
    g->i_fc = param_index(d, "fc.weight");
    g->i_hnorm = param_index(d, "hidden_norm.weight");
    g->i_norm = param_index(d, "norm.weight");
    g->i_embed = param_index(d, "embed_tokens.weight");
    g->i_lm = param_index(d, "lm_head.weight");
    g->i_vnorm = param_index(d, "verifier_norm.weight");
    g->i_vlm = param_index(d, "verifier_lm_head.weight");
    int bad = g->i_fc < 0 || g->i_hnorm < 0 || g->i_norm < 0 || g->i_embed < 0 || g->i_lm < 0 || g->i_vnorm < 0 ||
              g->i_vlm < 0;
    for (int l = 0; l < c->L; l++)
        for (int j = 0; j < LP_N; j++) {
            char name[96];
            snprintf(name, sizeof name, "layers.%d.%s", l, drafter_layer_tensor_names[j]);
            g->li[l][j] = param_index(d, name);
            bad |= g->li[l][j] < 0;
        }
    if (bad) return init_fail(g, err, err_len, "%s: the drafter's parameter table lacks a tensor the GPU step uses", fn);

    /* ---- the plan */
    const int T = c->T_max, N = c->N, B = c->B, R = N * B, KV = T + R, nh = c->n_h, nkv = c->n_kv, dh = c->d_h;
    int fail = 0;
#define P(ptr, bytes, name) (fail |= plan_add(g, &(ptr), (bytes), (name)))
    for (int i = 0; i < g->n; i++) {
        struct drafter_gpu_param *q = &g->p[i];
        q->host = drafter_param(d, i);
        size_t ne = (size_t)q->host->numel;
        int frozen2d = !q->host->trainable && q->host->ndim == 2;
        if (i == g->i_vlm) continue;   /* aliases lm_head (drafter.c keeps them equal; checked at upload) */
        if (!frozen2d) P(q->w, 4 * ne, q->host->trainable ? "master weights fp32" : "frozen norms fp32");
        if (q->host->trainable) P(q->g, 4 * ne, "gradients fp32");
        if (q->host->ndim == 2) P(q->copy, 2 * ne, q->host->trainable ? "weight copies bf16" : "frozen embedding/heads bf16");
    }
    size_t b2 = 2, b4 = 4;
    P(g->in.input_ids, b4 * T, "inputs");
    P(g->in.position_ids, b4 * T, "inputs");
    P(g->in.doc_ids, b4 * T, "inputs");
    P(g->in.loss_mask, (size_t)T, "inputs");
    P(g->in.hidden, b2 * T * kH, "inputs: features bf16");
    P(g->in.last, b2 * T * H, "inputs: last layer bf16");
    P(g->inv_freq, b4 * dh / 2, "rope inv_freq");
    if (c->noise > 0) P(g->hid_used, b2 * T * kH, "features after noise");
    P(g->ctx_fc, b2 * T * H, "context");
    P(g->ctx, b2 * T * H, "context");
    P(g->rstd_c, b4 * T, "context");
    for (int l = 0; l < c->L; l++) {
        struct dg_layer *a = &g->L[l];
        P(a->xin, b2 * R * H, "layer activations (R,H)");
        P(a->xn1, b2 * R * H, "layer activations (R,H)");
        P(a->h, b2 * R * H, "layer activations (R,H)");
        P(a->xn2, b2 * R * H, "layer activations (R,H)");
        P(a->qraw, b2 * R * QD, "layer activations q/o");
        P(a->q, b2 * R * QD, "layer activations q/o");
        P(a->o, b2 * R * QD, "layer activations q/o");
        P(a->kraw, b2 * KV * KD, "layer activations k/v");
        P(a->k, b2 * KV * KD, "layer activations k/v");
        P(a->v, b2 * KV * KD, "layer activations k/v");
        P(a->gate, b2 * R * I, "layer activations MLP");
        P(a->up, b2 * R * I, "layer activations MLP");
        P(a->act, b2 * R * I, "layer activations MLP");
        P(a->rstd1, b4 * R, "layer statistics fp32");
        P(a->rstd2, b4 * R, "layer statistics fp32");
        P(a->rstdq, b4 * R * nh, "layer statistics fp32");
        P(a->rstdk, b4 * KV * nkv, "layer statistics fp32");
        P(a->lse, b4 * R * nh, "layer statistics fp32");
    }
    P(g->x_out, b2 * R * H, "final state");
    P(g->xn, b2 * R * H, "final state");
    P(g->rstd_f, b4 * R, "final state");
    P(g->pos, b4 * KV, "block inputs");
    P(g->tok, b4 * R, "block inputs");
    P(g->anchors, b4 * N, "block inputs");
    P(g->valid, (size_t)N, "block inputs");
    P(g->row_loss, b4 * R, "loss rows");
    P(g->row_weight, b4 * R, "loss rows");
    P(g->mbuf, b4 * MB_WORDS(B), "metrics");
    P(g->dx, b2 * R * H, "backward (R,H) bf16");
    P(g->dh, b2 * R * H, "backward (R,H) bf16");
    P(g->dxn, b2 * R * H, "backward (R,H) bf16");
    P(g->dxn1, b2 * R * H, "backward (R,H) bf16");
    P(g->dxn_f, b4 * R * H, "backward (R,H) fp32");
    P(g->dact, b2 * R * I, "backward MLP bf16");
    P(g->dgate, b2 * R * I, "backward MLP bf16");
    P(g->dup, b2 * R * I, "backward MLP bf16");
    P(g->dout, b2 * R * QD, "backward q/o");
    P(g->dq, b2 * R * QD, "backward q/o");
    P(g->dqraw, b2 * R * QD, "backward q/o");
    P(g->dq_f, b4 * R * QD, "backward q fp32");
    P(g->dk, b2 * KV * KD, "backward k/v bf16");
    P(g->dv, b2 * KV * KD, "backward k/v bf16");
    P(g->dkraw, b2 * KV * KD, "backward k/v bf16");
    P(g->dk_f, b4 * KV * KD, "backward k/v fp32");
    P(g->dv_f, b4 * KV * KD, "backward k/v fp32");
    P(g->dctx_f, b4 * T * H, "backward context");
    P(g->dctx, b2 * T * H, "backward context");
    P(g->dctx_fc, b2 * T * H, "backward context");
    P(g->anchors_ws, anchors_workspace_bytes(T), "workspaces");
    block_attn_config ac = {T, N, B, nh, nkv, dh, 0, 0, 1.0f};
    P(g->attn_ws, block_attn_forward_workspace_bytes(&ac), "workspaces");
    int rows_h = R > T ? R : T;
    P(g->rms_scratch, b4 * rmsnorm_backward_scratch_floats(rows_h, H), "workspaces");
    P(g->qk_scratch, b4 * rmsnorm_qk_backward_scratch_floats(R * nh, KV * nkv, dh), "workspaces");
#undef P
    if (fail) return init_fail(g, err, err_len, "%s: out of memory building the plan", fn);
    size_t total = 0;
    for (int i = 0; i < g->n_plan; i++) total += align256(g->plan[i].bytes);
    g->bytes = total;
    cudaError_t ce = cudaMalloc(&g->base, total);
    if (ce != cudaSuccess) {
        char msg[160];
        snprintf(msg, sizeof msg, "%.1f MiB: %s", total / 1048576.0, cudaGetErrorString(ce));
        return init_fail(g, err, err_len, "drafter_gpu_init: cudaMalloc of the planned device memory (%s)", msg);
    }
    size_t off = 0;
    for (int i = 0; i < g->n_plan; i++) {
        *g->plan[i].pp = (char *)g->base + off;
        off += align256(g->plan[i].bytes);
    }
    g->p[g->i_vlm].copy = g->p[g->i_lm].copy;
    /* the rmsnorm backward scratches must be zero once; the rest is written before it is read */
    if (cudaMemset(g->base, 0, total) != cudaSuccess)
        return init_fail(g, err, err_len, "%s: cudaMemset of the planned memory failed", fn);

    /* workspaces allocated by their modules, measured */
    size_t free0, free1, tot;
    if (blas_init(0)) return init_fail(g, err, err_len, "drafter_gpu_init: blas_init: %s", kernels_error());
    g->blas_ws_bytes = (size_t)64 << 20;
    lmhead_loss_config lc = {T, N, B, H, c->V_d, c->loss, c->weighting, c->gamma, c->alpha, c->eps};
    if (cudaMemGetInfo(&free0, &tot) != cudaSuccess)
        return init_fail(g, err, err_len, "%s: cudaMemGetInfo failed", fn);
    if (lmhead_loss_ws_init(&g->lmws, &lc, 0))
        return init_fail(g, err, err_len, "drafter_gpu_init: lmhead_loss_ws_init: %s", kernels_error());
    if (cudaMemGetInfo(&free1, &tot) != cudaSuccess)
        return init_fail(g, err, err_len, "%s: cudaMemGetInfo failed", fn);
    g->lm_ws_bytes = free0 > free1 ? free0 - free1 : 0;
    if (cudaMallocHost((void **)&g->h_mbuf, 4 * (size_t)MB_WORDS(B) * DG_METRIC_SLOTS) != cudaSuccess ||
        cudaEventCreateWithFlags(&g->ev, cudaEventDisableTiming) != cudaSuccess)
        return init_fail(g, err, err_len, "%s: pinned metrics buffer or event creation failed", fn);
    g->h_stage_bytes = (size_t)T * (kH + H) * 2;
    g->h_stage = malloc(g->h_stage_bytes);
    if (!g->h_stage) return init_fail(g, err, err_len, "%s: out of memory for the host staging buffer", fn);

    /* rope inverse frequencies, drafter.c's */
    float invf[DRAFTER_MAX_HALF_HEAD];
    if (dh / 2 > DRAFTER_MAX_HALF_HEAD) return init_fail(g, err, err_len, "%s: head dim too large", fn);
    drafter_rope_inv_freq(c, invf);
    if (cudaMemcpy(g->inv_freq, invf, 4 * (size_t)(dh / 2), cudaMemcpyHostToDevice) != cudaSuccess)
        return init_fail(g, err, err_len, "%s: upload of inv_freq failed", fn);
    if (drafter_gpu_upload_weights(g, err, err_len)) {
        drafter_gpu_free(g);
        return NULL;
    }
    if (plan) print_plan(g, plan);
    return g;
}

/* ---------------------------------------------------------------- weights */

int drafter_gpu_upload_weights(struct drafter_gpu *g, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_upload_weights";
    size_t maxn = 0;
    for (int i = 0; i < g->n; i++)
        if ((size_t)g->p[i].host->numel > maxn) maxn = (size_t)g->p[i].host->numel;
    const struct drafter_param *lm = g->p[g->i_lm].host, *vlm = g->p[g->i_vlm].host;
    if (lm->numel != vlm->numel || memcmp(lm->w, vlm->w, sizeof(float) * (size_t)lm->numel))
        return err_fail(err, err_len, "%s: lm_head and verifier_lm_head differ; the GPU path keeps one copy of them", fn);
    bf16 *tmp = malloc(2 * maxn + 2);
    if (!tmp) return err_fail(err, err_len, "%s: out of memory", fn);
    int rc = 0;
    for (int i = 0; i < g->n && !rc; i++) {
        struct drafter_gpu_param *q = &g->p[i];
        size_t ne = (size_t)q->host->numel;
        if (i == g->i_vlm) continue;
        if (q->w && cudaMemcpy(q->w, q->host->w, 4 * ne, cudaMemcpyHostToDevice) != cudaSuccess) rc = -1;
        if (q->copy && !rc) {
            bf16_from_floats(tmp, q->host->w, ne);
            if (cudaMemcpy(q->copy, tmp, 2 * ne, cudaMemcpyHostToDevice) != cudaSuccess) rc = -1;
        }
        if (rc) err_fail(err, err_len, "%s: copying %s to the device failed", fn, q->host->name);
    }
    free(tmp);
    return rc;
}

int drafter_gpu_download_weights(struct drafter_gpu *g, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_download_weights";
    CU(cudaStreamSynchronize(g->s), "stream");
    for (int i = 0; i < g->n; i++) {
        struct drafter_gpu_param *q = &g->p[i];
        if (!q->host->trainable) continue;
        CU(cudaMemcpy(q->host->w, q->w, 4 * (size_t)q->host->numel, cudaMemcpyDeviceToHost), q->host->name);
    }
    return 0;
}

int drafter_gpu_download_grads(struct drafter_gpu *g, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_download_grads";
    CU(cudaStreamSynchronize(g->s), "stream");
    for (int i = 0; i < g->n; i++) {
        struct drafter_gpu_param *q = &g->p[i];
        if (!q->g) continue;
        CU(cudaMemcpy(q->host->g, q->g, 4 * (size_t)q->host->numel, cudaMemcpyDeviceToHost), q->host->name);
    }
    return 0;
}

int drafter_gpu_zero_grad(struct drafter_gpu *g, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_zero_grad";
    for (int i = 0; i < g->n; i++)
        if (g->p[i].g) CU(cudaMemsetAsync(g->p[i].g, 0, 4 * (size_t)g->p[i].host->numel, g->s), g->p[i].host->name);
    return 0;
}

int drafter_gpu_refresh_copies(struct drafter_gpu *g, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_refresh_copies";
    for (int i = 0; i < g->n; i++) {
        struct drafter_gpu_param *q = &g->p[i];
        if (q->host->trainable && q->copy) KL(cast_f32_to_bf16(q->copy, q->w, (size_t)q->host->numel, g->s));
    }
    return 0;
}

/* ---------------------------------------------------------------- batch */

int drafter_gpu_load_batch(struct drafter_gpu *g, const struct drafter_batch *b, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_load_batch";
    const struct drafter_config *c = g->c;
    if (b->T < 1 || b->T > c->T_max || b->budget < b->T || b->budget > c->T_max)
        return err_fail(err, err_len, "%s: batch of %d tokens with budget %d, expected 1 <= T <= budget <= %d", fn, b->T,
                        b->budget, c->T_max);
    if (!b->input_ids || !b->loss_mask || !b->position_ids || !b->doc_ids || !b->hidden || !b->last)
        return err_fail(err, err_len, "%s: a batch array is NULL", fn);
    for (int t = 0; t < b->T; t++) {
        if (b->input_ids[t] < 0 || b->input_ids[t] >= c->V_t)
            return err_fail(err, err_len, "%s: input_ids[%d]=%d is outside the embedding [0, %d)", fn, t, b->input_ids[t],
                            c->V_t);
        if (b->position_ids[t] < 0)
            return err_fail(err, err_len, "%s: position_ids[%d]=%d is negative", fn, t, b->position_ids[t]);
    }
    const size_t T = (size_t)b->T, kH = (size_t)c->k * c->H, H = (size_t)c->H;
    bf16 *hs = g->h_stage, *ls = hs + T * kH;
    bf16_from_floats(hs, b->hidden, T * kH);
    bf16_from_floats(ls, b->last, T * H);
    CU(cudaStreamSynchronize(g->s), "stream");
    CU(cudaMemcpy(g->in.input_ids, b->input_ids, 4 * T, cudaMemcpyHostToDevice), "input_ids");
    CU(cudaMemcpy(g->in.position_ids, b->position_ids, 4 * T, cudaMemcpyHostToDevice), "position_ids");
    CU(cudaMemcpy(g->in.doc_ids, b->doc_ids, 4 * T, cudaMemcpyHostToDevice), "doc_ids");
    CU(cudaMemcpy(g->in.loss_mask, b->loss_mask, T, cudaMemcpyHostToDevice), "loss_mask");
    CU(cudaMemcpy(g->in.hidden, hs, 2 * T * kH, cudaMemcpyHostToDevice), "hidden");
    CU(cudaMemcpy(g->in.last, ls, 2 * T * H, cudaMemcpyHostToDevice), "last");
    return 0;
}

/* ---------------------------------------------------------------- phase timing */

static const char *const phase_names[DRAFTER_GPU_PH_N] = {"inputs", "context (fc, hidden_norm)", "layer GEMMs",
                                                           "layer norms/rope/swiglu/casts", "block attention fwd",
                                                           "block attention bwd", "loss (fwd+bwd, metrics)"};
const char *drafter_gpu_phase_name(int ph) { return ph >= 0 && ph < DRAFTER_GPU_PH_N ? phase_names[ph] : "?"; }

int drafter_gpu_timing(struct drafter_gpu *g, int on, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_timing";
    if (on && !g->tm_ev[0])
        for (int i = 0; i < DG_TM_MAX; i++) CU(cudaEventCreate(&g->tm_ev[i]), "event");
    g->tm_on = on;
    return 0;
}

/* the segment that starts here belongs to phase ph (-1: the step ends) */
static void tm_mark(struct drafter_gpu *g, int ph) {
    if (!g->tm_on || g->tm_n >= DG_TM_MAX) return;
    if (g->tm_n > 0 && g->tm_tag[g->tm_n - 1] == ph) return;   /* same phase continues */
    cudaEventRecord(g->tm_ev[g->tm_n], g->s);
    g->tm_tag[g->tm_n++] = ph;
}
#define MARK(ph) tm_mark(g, (ph))

int drafter_gpu_phase_times(struct drafter_gpu *g, double *ms, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_phase_times";
    if (!g->tm_on || g->tm_n < 2) return err_fail(err, err_len, "%s: no timed step (call drafter_gpu_timing first)", fn);
    CU(cudaEventSynchronize(g->tm_ev[g->tm_n - 1]), "event");
    for (int i = 0; i + 1 < g->tm_n; i++) {
        float t;
        CU(cudaEventElapsedTime(&t, g->tm_ev[i], g->tm_ev[i + 1]), "elapsed");
        if (g->tm_tag[i] >= 0) ms[g->tm_tag[i]] += t;
    }
    return 0;
}

/* ---------------------------------------------------------------- step */

#define DW(i) (g->p[(i)].w)
#define DG(i) (g->p[(i)].g)
#define DC(i) (g->p[(i)].copy)
#define LW(l, j) DW(g->li[l][j])
#define LG(l, j) DG(g->li[l][j])
#define LC(l, j) DC(g->li[l][j])

int drafter_step_gpu(struct drafter_gpu *g, int T, int budget, uint64_t seed, uint64_t step, int train,
                     struct drafter_metrics *m, char *err, int err_len) {
    static const char fn[] = "drafter_step_gpu";
    const struct drafter_config *c = g->c;
    if (T < 1 || budget < T || budget > c->T_max)
        return err_fail(err, err_len, "%s: batch of %d tokens with budget %d, expected 1 <= T <= budget <= %d", fn, T,
                        budget, c->T_max);
    if (budget <= c->B)
        return err_fail(err, err_len, "%s: budget %d must exceed the block size %d", fn, budget, c->B);
    if (g->metrics_pending >= DG_METRIC_SLOTS)
        return err_fail(err, err_len, "%s: %d steps' metrics are pending; call drafter_gpu_metrics", fn, g->metrics_pending);
    cudaStream_t s = g->s;
    const int Tc = budget, N = c->N, B = c->B, R = N * B, H = c->H, I = c->I, kH = c->k * H;
    const int nh = c->n_h, nkv = c->n_kv, dh = c->d_h, QD = nh * dh, KD = nkv * dh, KV = Tc + R;
    const float eps = c->eps;
    const size_t pad = (size_t)(Tc - T);

    g->tm_n = 0;
    MARK(DRAFTER_GPU_PH_INPUTS);
    /* pad the context to the budget (see the top of the file) */
    if (pad) {
        CU(cudaMemsetAsync(g->in.input_ids + T, 0, 4 * pad, s), "pad input_ids");
        CU(cudaMemsetAsync(g->in.position_ids + T, 0, 4 * pad, s), "pad position_ids");
        CU(cudaMemsetAsync(g->in.doc_ids + T, 0xff, 4 * pad, s), "pad doc_ids");
        CU(cudaMemsetAsync(g->in.loss_mask + T, 0, pad, s), "pad loss_mask");
        CU(cudaMemsetAsync(g->in.hidden + (size_t)T * kH, 0, 2 * pad * kH, s), "pad hidden");
        CU(cudaMemsetAsync(g->in.last + (size_t)T * H, 0, 2 * pad * H, s), "pad last");
    }
    /* anchors (§5) against the budget, block tokens and positions, embedding */
    KL(anchors_forward(g->in.loss_mask, Tc, B, N, seed, step, g->anchors, g->valid, g->mbuf + MB_K, g->anchors_ws, s));
    KL(dg_block_inputs(g->pos, g->tok, g->anchors, g->in.input_ids, g->in.position_ids, Tc, N, B,
                       (int32_t)c->mask_token_id, s));
    KL(embedding_forward(g->L[0].xin, g->tok, DC(g->i_embed), R, H, c->V_t, s));
    const bf16 *hid = g->in.hidden;
    if (train && c->noise > 0) {
        KL(dg_noise(g->hid_used, g->in.hidden, T, Tc, kH, drafter_noise_base(seed, step), c->noise, s));
        hid = g->hid_used;
    }
    MARK(DRAFTER_GPU_PH_CONTEXT);
    /* context */
    KL(blas_linear_forward(g->ctx_fc, BLAS_BF16, hid, DC(g->i_fc), NULL, Tc, H, kH, s));
    KL(rmsnorm_forward(g->ctx, g->rstd_c, g->ctx_fc, DW(g->i_hnorm), Tc, H, eps, s));

    block_attn_config ac = {Tc, N, B, nh, nkv, dh, 0, 0, 1.0f / sqrtf((float)dh)};
    for (int l = 0; l < c->L; l++) {
        struct dg_layer *a = &g->L[l];
        int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        ac.window = sliding ? c->sliding_window : 0;
        ac.causal = sliding && !c->sliding_window_non_causal;
        MARK(DRAFTER_GPU_PH_ELEM);
        KL(rmsnorm_forward(a->xn1, a->rstd1, a->xin, LW(l, LP_IN_LN), R, H, eps, s));
        MARK(DRAFTER_GPU_PH_GEMM);
        KL(blas_linear_forward(a->qraw, BLAS_BF16, a->xn1, LC(l, LP_Q), NULL, R, QD, H, s));
        KL(blas_linear_forward(a->kraw, BLAS_BF16, g->ctx, LC(l, LP_K), NULL, Tc, KD, H, s));
        KL(blas_linear_forward(a->kraw + (size_t)Tc * KD, BLAS_BF16, a->xn1, LC(l, LP_K), NULL, R, KD, H, s));
        KL(blas_linear_forward(a->v, BLAS_BF16, g->ctx, LC(l, LP_V), NULL, Tc, KD, H, s));
        KL(blas_linear_forward(a->v + (size_t)Tc * KD, BLAS_BF16, a->xn1, LC(l, LP_V), NULL, R, KD, H, s));
        MARK(DRAFTER_GPU_PH_ELEM);
        KL(rmsnorm_qk_forward(a->q, a->rstdq, a->qraw, LW(l, LP_QN), R * nh, a->k, a->rstdk, a->kraw, LW(l, LP_KN),
                              KV * nkv, dh, eps, s));
        KL(rope_forward(a->q, NULL, g->pos + Tc, g->inv_freq, R, nh, 0, dh, s));
        KL(rope_forward(a->k, NULL, g->pos, g->inv_freq, KV, nkv, 0, dh, s));
        MARK(DRAFTER_GPU_PH_ATTN_FWD);
        KL(block_attn_forward_ws(&ac, a->q, a->k, a->v, g->anchors, g->in.doc_ids, a->o, a->lse, g->attn_ws, s));
        MARK(DRAFTER_GPU_PH_GEMM);
        /* h = x + o_proj(attn): the residual is the GEMM's C */
        CU(cudaMemcpyAsync(a->h, a->xin, 2 * (size_t)R * H, cudaMemcpyDeviceToDevice, s), "residual copy");
        KL(blas_matmul(a->h, BLAS_BF16, a->o, 0, LC(l, LP_O), 1, NULL, R, H, QD, 0, 0, 0, 1.0f, 1.0f, s));
        MARK(DRAFTER_GPU_PH_ELEM);
        KL(rmsnorm_forward(a->xn2, a->rstd2, a->h, LW(l, LP_POST_LN), R, H, eps, s));
        MARK(DRAFTER_GPU_PH_GEMM);
        KL(blas_linear_forward(a->gate, BLAS_BF16, a->xn2, LC(l, LP_GATE), NULL, R, I, H, s));
        KL(blas_linear_forward(a->up, BLAS_BF16, a->xn2, LC(l, LP_UP), NULL, R, I, H, s));
        MARK(DRAFTER_GPU_PH_ELEM);
        KL(swiglu_forward(a->act, a->gate, a->up, R, I, I, s));
        MARK(DRAFTER_GPU_PH_GEMM);
        bf16 *xo = l + 1 < c->L ? g->L[l + 1].xin : g->x_out;
        CU(cudaMemcpyAsync(xo, a->h, 2 * (size_t)R * H, cudaMemcpyDeviceToDevice, s), "residual copy");
        KL(blas_matmul(xo, BLAS_BF16, a->act, 0, LC(l, LP_DOWN), 1, NULL, R, H, I, 0, 0, 0, 1.0f, 1.0f, s));
    }
    MARK(DRAFTER_GPU_PH_ELEM);
    KL(rmsnorm_forward(g->xn, g->rstd_f, g->x_out, DW(g->i_norm), R, H, eps, s));

    MARK(DRAFTER_GPU_PH_LOSS);
    /* loss and metrics (§7, §8) */
    lmhead_loss_config lc = {Tc, N, B, H, c->V_d, c->loss, c->weighting, c->gamma, c->alpha, eps};
    float *d_loss = (float *)(g->mbuf + MB_LOSS);
    /* without a backward (validation, dflash-eval's proposals) every row's argmax: a proposal's rows predict
     * positions past the batch, which the loss does not supervise; training folds the supervised rows only */
    lmhead_loss_ws_set_all_rows(g->lmws, !train);
    KL(lmhead_loss_forward_mode(g->lmws, &lc, c->sample_from_anchor, g->xn, DC(g->i_lm), DC(g->i_vlm), DW(g->i_vnorm),
                                g->in.last, g->anchors, g->valid, g->in.loss_mask, d_loss, g->row_loss, g->row_weight,
                                g->mbuf + MB_CORRECT, g->mbuf + MB_CORRECT + B, s));
    const int32_t *d_arg;
    const uint8_t *d_rmask;
    lmhead_loss_ws_rows(g->lmws, &d_arg, &d_rmask);
    KL(dg_eal(g->mbuf + MB_EAL_SUM, g->mbuf + MB_EAL_COUNT, d_arg, d_rmask, N, B, c->sample_from_anchor ? 0 : 1, s));
    CU(cudaMemcpyAsync(g->h_mbuf + (size_t)g->metrics_pending * MB_WORDS(B), g->mbuf, 4 * MB_WORDS(B),
                       cudaMemcpyDeviceToHost, s), "metrics copy");
    CU(cudaEventRecord(g->ev, s), "metrics event");
    g->metrics_pending++;
    g->last_T = T;
    g->last_budget = budget;

    if (train) {
        KL(lmhead_loss_backward(g->lmws, &lc, g->xn, DC(g->i_lm), DC(g->i_vlm), g->row_weight, g->dxn_f, s));
        MARK(DRAFTER_GPU_PH_ELEM);
        KL(cast_f32_to_bf16(g->dxn, g->dxn_f, (size_t)R * H, s));
        KL(rmsnorm_backward(g->dx, DG(g->i_norm), g->dxn, g->x_out, DW(g->i_norm), g->rstd_f, g->rms_scratch, R, H, 0, s));
        CU(cudaMemsetAsync(g->dctx_f, 0, 4 * (size_t)Tc * H, s), "dctx zero");
        for (int l = c->L - 1; l >= 0; l--) {
            struct dg_layer *a = &g->L[l];
            int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
            ac.window = sliding ? c->sliding_window : 0;
            ac.causal = sliding && !c->sliding_window_non_causal;
            MARK(DRAFTER_GPU_PH_GEMM);
            /* MLP */
            KL(blas_linear_backward_dx(g->dact, BLAS_BF16, g->dx, LC(l, LP_DOWN), R, H, I, 0, s));
            KL(blas_linear_backward_dw(LG(l, LP_DOWN), BLAS_F32, g->dx, a->act, R, H, I, 1, s));
            MARK(DRAFTER_GPU_PH_ELEM);
            KL(swiglu_backward(g->dgate, g->dup, g->dact, a->gate, a->up, R, I, I, s));
            MARK(DRAFTER_GPU_PH_GEMM);
            KL(blas_linear_backward_dx(g->dxn_f, BLAS_F32, g->dgate, LC(l, LP_GATE), R, I, H, 0, s));
            KL(blas_linear_backward_dx(g->dxn_f, BLAS_F32, g->dup, LC(l, LP_UP), R, I, H, 1, s));
            KL(blas_linear_backward_dw(LG(l, LP_GATE), BLAS_F32, g->dgate, a->xn2, R, I, H, 1, s));
            KL(blas_linear_backward_dw(LG(l, LP_UP), BLAS_F32, g->dup, a->xn2, R, I, H, 1, s));
            MARK(DRAFTER_GPU_PH_ELEM);
            KL(cast_f32_to_bf16(g->dxn, g->dxn_f, (size_t)R * H, s));
            CU(cudaMemcpyAsync(g->dh, g->dx, 2 * (size_t)R * H, cudaMemcpyDeviceToDevice, s), "dh copy");
            KL(rmsnorm_backward(g->dh, LG(l, LP_POST_LN), g->dxn, a->h, LW(l, LP_POST_LN), a->rstd2, g->rms_scratch, R,
                                H, 1, s));
            MARK(DRAFTER_GPU_PH_GEMM);
            /* attention */
            KL(blas_linear_backward_dx(g->dout, BLAS_BF16, g->dh, LC(l, LP_O), R, H, QD, 0, s));
            KL(blas_linear_backward_dw(LG(l, LP_O), BLAS_F32, g->dh, a->o, R, H, QD, 1, s));
            MARK(DRAFTER_GPU_PH_ATTN_BWD);
            KL(block_attn_backward(&ac, a->q, a->k, a->v, g->anchors, g->in.doc_ids, a->o, g->dout, a->lse, g->dq_f,
                                   g->dk_f, g->dv_f, s));
            MARK(DRAFTER_GPU_PH_ELEM);
            KL(cast_f32_to_bf16(g->dq, g->dq_f, (size_t)R * QD, s));
            KL(cast_f32_to_bf16(g->dk, g->dk_f, (size_t)KV * KD, s));
            KL(cast_f32_to_bf16(g->dv, g->dv_f, (size_t)KV * KD, s));
            KL(rope_backward(g->dq, NULL, g->pos + Tc, g->inv_freq, R, nh, 0, dh, s));
            KL(rope_backward(g->dk, NULL, g->pos, g->inv_freq, KV, nkv, 0, dh, s));
            KL(rmsnorm_qk_backward(g->dqraw, LG(l, LP_QN), g->dq, a->qraw, LW(l, LP_QN), a->rstdq, R * nh, g->dkraw,
                                   LG(l, LP_KN), g->dk, a->kraw, LW(l, LP_KN), a->rstdk, KV * nkv, g->qk_scratch, dh, 0,
                                   s));
            MARK(DRAFTER_GPU_PH_GEMM);
            /* projections: block rows from xn1, context rows from ctx */
            const bf16 *dkb = g->dkraw + (size_t)Tc * KD, *dvb = g->dv + (size_t)Tc * KD;
            KL(blas_linear_backward_dx(g->dxn_f, BLAS_F32, g->dqraw, LC(l, LP_Q), R, QD, H, 0, s));
            KL(blas_linear_backward_dx(g->dxn_f, BLAS_F32, dkb, LC(l, LP_K), R, KD, H, 1, s));
            KL(blas_linear_backward_dx(g->dxn_f, BLAS_F32, dvb, LC(l, LP_V), R, KD, H, 1, s));
            KL(blas_linear_backward_dw(LG(l, LP_Q), BLAS_F32, g->dqraw, a->xn1, R, QD, H, 1, s));
            KL(blas_linear_backward_dw(LG(l, LP_K), BLAS_F32, dkb, a->xn1, R, KD, H, 1, s));
            KL(blas_linear_backward_dw(LG(l, LP_V), BLAS_F32, dvb, a->xn1, R, KD, H, 1, s));
            KL(blas_linear_backward_dx(g->dctx_f, BLAS_F32, g->dkraw, LC(l, LP_K), Tc, KD, H, 1, s));
            KL(blas_linear_backward_dx(g->dctx_f, BLAS_F32, g->dv, LC(l, LP_V), Tc, KD, H, 1, s));
            KL(blas_linear_backward_dw(LG(l, LP_K), BLAS_F32, g->dkraw, g->ctx, Tc, KD, H, 1, s));
            KL(blas_linear_backward_dw(LG(l, LP_V), BLAS_F32, g->dv, g->ctx, Tc, KD, H, 1, s));
            MARK(DRAFTER_GPU_PH_ELEM);
            /* residual: dx_in = dh + input_layernorm backward */
            KL(cast_f32_to_bf16(g->dxn1, g->dxn_f, (size_t)R * H, s));
            CU(cudaMemcpyAsync(g->dx, g->dh, 2 * (size_t)R * H, cudaMemcpyDeviceToDevice, s), "dx copy");
            KL(rmsnorm_backward(g->dx, LG(l, LP_IN_LN), g->dxn1, a->xin, LW(l, LP_IN_LN), a->rstd1, g->rms_scratch, R, H,
                                1, s));
        }
        MARK(DRAFTER_GPU_PH_CONTEXT);
        /* context: hidden_norm then fc (the block input is the frozen embedding: dx stops) */
        KL(cast_f32_to_bf16(g->dctx, g->dctx_f, (size_t)Tc * H, s));
        KL(rmsnorm_backward(g->dctx_fc, DG(g->i_hnorm), g->dctx, g->ctx_fc, DW(g->i_hnorm), g->rstd_c, g->rms_scratch, Tc,
                            H, 0, s));
        KL(blas_linear_backward_dw(DG(g->i_fc), BLAS_F32, g->dctx_fc, hid, Tc, H, kH, 1, s));
    }
    MARK(-1);
    if (m) return drafter_gpu_metrics(g, m, err, err_len);
    return 0;
}

int drafter_gpu_metrics(struct drafter_gpu *g, struct drafter_metrics *m, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_metrics";
    if (!g->metrics_pending) return err_fail(err, err_len, "%s: no step has run since the last call", fn);
    CU(cudaEventSynchronize(g->ev), "metrics event");   /* the last copy; the stream orders the earlier ones */
    const int B = g->c->B;
    drafter_metrics_zero(m, B);
    for (int k = 0; k < g->metrics_pending; k++) {
        const int32_t *w = g->h_mbuf + (size_t)k * MB_WORDS(B);
        struct drafter_metrics one;
        float loss;
        memcpy(&loss, &w[MB_LOSS], 4);
        drafter_metrics_zero(&one, B);
        one.loss_sum = loss;
        one.loss_count = 1;
        for (int j = 0; j < B; j++) {
            one.correct[j] = w[MB_CORRECT + j];
            one.total[j] = w[MB_CORRECT + B + j];
            if (j >= (g->c->sample_from_anchor ? 0 : 1)) {
                one.full_correct += one.correct[j];
                one.full_total += one.total[j];
            }
        }
        one.eal_sum = w[MB_EAL_SUM];
        one.eal_count = w[MB_EAL_COUNT];
        one.eal_marginal = lmhead_eal(w + MB_CORRECT, w + MB_CORRECT + B, B);
        one.n_anchors = w[MB_K];
        if (g->metrics_pending == 1) *m = one;
        else drafter_metrics_add(m, &one);
    }
    g->metrics_pending = 0;
    return 0;
}

int drafter_gpu_warmup(struct drafter_gpu *g, int budget, char *err, int err_len) {
    static const char fn[] = "drafter_gpu_warmup";
    const struct drafter_config *c = g->c;
    if (budget <= c->B || budget > c->T_max)
        return err_fail(err, err_len, "%s: budget %d outside (%d, %d]", fn, budget, c->B, c->T_max);
    size_t T = (size_t)budget;
    CU(cudaMemsetAsync(g->in.input_ids, 0, 4 * T, g->s), "inputs");
    CU(cudaMemsetAsync(g->in.position_ids, 0, 4 * T, g->s), "inputs");
    CU(cudaMemsetAsync(g->in.doc_ids, 0, 4 * T, g->s), "inputs");
    CU(cudaMemsetAsync(g->in.loss_mask, 1, T, g->s), "inputs");
    CU(cudaMemsetAsync(g->in.hidden, 0, 2 * T * c->k * c->H, g->s), "inputs");
    CU(cudaMemsetAsync(g->in.last, 0, 2 * T * c->H, g->s), "inputs");
    struct drafter_metrics m;
    if (drafter_step_gpu(g, budget, budget, 0, 0, 1, &m, err, err_len)) return -1;
    return drafter_gpu_zero_grad(g, err, err_len);
}

void drafter_gpu_last_step(const struct drafter_gpu *g, struct drafter_gpu_last *out) {
    memset(out, 0, sizeof *out);
    out->T = g->last_T;
    out->budget = g->last_budget;
    out->N = g->c->N;
    out->B = g->c->B;
    out->H = g->c->H;
    out->xn = g->xn;
    out->ctx = g->ctx;
    for (int l = 0; l < g->c->L; l++) out->layer_out[l] = l + 1 < g->c->L ? g->L[l + 1].xin : g->x_out;
    out->anchors = g->anchors;
    out->valid = g->valid;
    out->row_loss = g->row_loss;
    out->row_weight = g->row_weight;
    const uint8_t *rmask;
    lmhead_loss_ws_rows(g->lmws, &out->arg, &rmask);
}
#endif /* DFLASH_CUDA */
