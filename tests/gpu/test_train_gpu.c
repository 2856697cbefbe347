/*
 * tests/gpu/test_train_gpu.c — the GPU training step (train/drafter.h drafter_step_gpu, train/optim_gpu.h) against
 * the CPU step on a small drafter: one step (forward outputs and every gradient), determinism (a step run twice is
 * bitwise equal), exact resume (a run split in two with a
 * state round trip through the host equals the straight run bit for bit), the non-finite guard with an injected
 * NaN, and the planned-memory contract (free device memory is the same before and after steps). Runs on the GPU
 * machine (scripts/gpu-run.sh); CUDA is initialised inside each test (Check forks).
 *
 * The drafter: H 256, 4 heads / 2 kv heads of 64, I 512, 3 layers (sliding W 128 causal, sliding, full), B 8,
 * N 32, V 1024, k 3, T_max 1024; batches of T 900 in 4 documents packed against budget 1024 (the GPU pads the
 * context to the budget; blocks may run past T). Matrices N(0, 0.06) so each layer moves the residual by O(1).
 *
 * Tolerances: style.md's rule. The reference is drafter_step_cpu (fp32); the baseline is emu_step below, the same
 * step with every tensor the GPU stores in bf16 rounded at the same point. The GPU's max error against the
 * reference must be at most 2x the baseline's for forward outputs (loss, final normed state) and 3x for every
 * gradient tensor. Measured on the CPU (2026-12-01, this suite's drafter and batch): the emulation's relative L2
 * error against the fp32 step is 8.3e-3 on the final state and 0.7e-2..1.7e-2 on the gradients, and without its
 * roundings it equals drafter_step_cpu bit for bit (so it mirrors the step). Every comparison is NaN-aware (a NaN or Inf anywhere fails); relative L2 errors are printed
 * beside. The training quality of the GPU path against the CPU path is tests/gpu/test_train_tau_gpu.c (τ of
 * drafters trained on the same batches; issue 28 replaced the 50-step loss-curve check here, whose per-step 5%
 * bound failed on curves that cross back and forth under bf16).
 * The one-step comparison also runs at head dim 256 with 8 / 1 heads at B 16 (the fp32 block attention, G·B =
 * 128) and at the demo's head dim 16.
 */
#include <cuda_runtime_api.h>

#include "kernels/anchors.h"
#include "kernels/block_attn.h"
#include "kernels/common.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/lmhead_loss.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"
#include "model/hfconfig.h"
#include "tests/gpu/k1util.h"
#include "train/drafter.h"
#include "train/optim.h"
#include "train/optim_gpu.h"

#define TB_T 900
#define TB_BUDGET 1024

static void small_config(struct drafter_config *c) {
    drafter_config_defaults(c);
    c->target.num_hidden_layers = 8;
    c->target.rope_theta = 1e6;
    c->target.rope_type = HF_ROPE_DEFAULT;
    c->target.head_dim = 64;
    c->H = 256;
    c->n_h = 4;
    c->n_kv = 2;
    c->d_h = 64;
    c->I = 512;
    c->eps = 1e-6f;
    c->V_t = c->V_d = 1024;
    c->B = 8;
    c->L = 3;
    c->layer_type[0] = DRAFTER_LAYER_SLIDING;
    c->layer_type[1] = DRAFTER_LAYER_SLIDING;
    c->layer_type[2] = DRAFTER_LAYER_FULL;
    c->sliding_window = 128;
    c->N = 32;
    c->T_max = TB_BUDGET;
    c->k = 3;
    c->layer_ids[0] = 1;
    c->layer_ids[1] = 3;
    c->layer_ids[2] = 6;
    c->mask_token_id = 1023;
    c->init_std = 0.06f;
}

struct sbatch {
    int32_t ids[TB_T], pos[TB_T], doc[TB_T];
    uint8_t mask[TB_T];
    float *hidden, *last;
    struct drafter_batch b;
};

static void frozen_tables(const struct drafter_config *c, float *embed, float *head, float *norm);

/* 4 documents (300, 200, 150, 250 tokens); about half the tokens past each document's first 8 supervised. The
 * last-layer rows are 10x a row of the verifier head plus noise, so every target row has one clear argmax (a
 * margin of ~10 logits): with random rows the top two target logits of some rows fall within a bf16 ulp, their
 * CE target flips under rounding, and those rows' gradients then differ wholesale between any two precisions. */
static void make_batch(struct sbatch *s, const struct drafter_config *c, uint64_t seed) {
    uint64_t rng = seed;
    int lens[4] = {300, 200, 150, 250}, p = 0;
    for (int d = 0; d < 4; d++)
        for (int i = 0; i < lens[d]; i++, p++) {
            s->doc[p] = d;
            s->pos[p] = i;
            s->ids[p] = (int32_t)(test_rng_next(&rng) % 1000);
            s->mask[p] = i >= 8 && (test_rng_next(&rng) & 1);
        }
    size_t kH = (size_t)c->k * c->H;
    s->hidden = malloc(sizeof(float) * TB_T * kH);
    s->last = malloc(sizeof(float) * TB_T * c->H);
    test_rng_fill(&rng, s->hidden, TB_T * kH, -1.5f, 1.5f);
    test_rng_fill(&rng, s->last, (size_t)TB_T * c->H, -0.05f, 0.05f);
    {
        size_t ne = (size_t)c->V_t * c->H;
        float *embed = malloc(sizeof *embed * ne), *head = malloc(sizeof *head * ne), norm[256];
        frozen_tables(c, embed, head, norm);
        for (int t = 0; t < TB_T; t++) {
            int v = (int)(test_rng_next(&rng) % (uint64_t)c->V_d);
            for (int e = 0; e < c->H; e++) s->last[(size_t)t * c->H + e] += 10.0f * head[(size_t)v * c->H + e];
        }
        free(embed);
        free(head);
    }
    /* bf16-representable, so both paths see identical features */
    for (size_t e = 0; e < TB_T * kH; e++) s->hidden[e] = bf16_round(s->hidden[e]);
    for (size_t e = 0; e < (size_t)TB_T * c->H; e++) s->last[e] = bf16_round(s->last[e]);
    s->b = (struct drafter_batch){TB_T, TB_BUDGET, s->ids, s->mask, s->pos, s->doc, s->hidden, s->last};
}

static void free_batch(struct sbatch *s) {
    free(s->hidden);
    free(s->last);
}

/* The frozen tables (the same for every drafter of this suite): embedding U(-1, 1), head U(-0.1, 0.1) (logits of
 * O(1)), final norm U(0.5, 1.5); all bf16-representable. */
static void frozen_tables(const struct drafter_config *c, float *embed, float *head, float *norm) {
    uint64_t rng = 0x5eed;
    size_t ne = (size_t)c->V_t * c->H;
    test_rng_fill(&rng, embed, ne, -1, 1);
    test_rng_fill(&rng, head, ne, -0.1f, 0.1f);
    test_rng_fill(&rng, norm, (size_t)c->H, 0.5f, 1.5f);
    for (size_t e = 0; e < ne; e++) embed[e] = bf16_round(embed[e]), head[e] = bf16_round(head[e]);
    for (int e = 0; e < c->H; e++) norm[e] = bf16_round(norm[e]);
}

/* A drafter whose every weight is bf16-representable (so the GPU's bf16 copies equal the masters at step 0). */
static struct drafter *small_drafter(const struct drafter_config *c, uint64_t seed) {
    char err[512];
    struct drafter *d = drafter_init(c, seed, err, sizeof err);
    ck_assert_msg(d != NULL, "drafter_init: %s", err);
    size_t ne = (size_t)c->V_t * c->H;
    float *embed = malloc(sizeof *embed * ne), *head = malloc(sizeof *head * ne), norm[256];
    frozen_tables(c, embed, head, norm);
    ck_assert_msg(drafter_set_frozen(d, embed, norm, head, err, sizeof err) == 0, "%s", err);
    free(embed);
    free(head);
    for (int i = 0; i < drafter_n_params(d); i++) {
        const struct drafter_param *p = drafter_param(d, i);
        for (int64_t e = 0; e < p->numel; e++) p->w[e] = bf16_round(p->w[e]);
    }
    return d;
}

static struct drafter_gpu *gpu_of(struct drafter *d) {
    char err[512];
    struct drafter_gpu *g = drafter_gpu_init(d, 0, stderr, err, sizeof err);
    ck_assert_msg(g != NULL, "drafter_gpu_init: %s", err);
    ck_assert(drafter_gpu_planned_bytes(g) > 0);
    return g;
}

/* Relative L2 error of got against ref; INFINITY when any element of got is NaN or Inf. Prints it. */
static double rel_l2(const char *what, const float *got, const float *ref, size_t n) {
    double se = 0, sr = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            fprintf(stderr, "%s: element %zu is %g\n", what, i, got[i]);
            return INFINITY;
        }
        double e = (double)got[i] - ref[i];
        se += e * e;
        sr += (double)ref[i] * ref[i];
    }
    double r = sqrt(se / (sr + 1e-30));
    fprintf(stderr, "%-44s rel L2 %.3e (ref rms %.3e)\n", what, r, sqrt(sr / (double)(n ? n : 1)));
    return r;
}

static size_t free_device_bytes(void) {
    size_t f, t;
    K1_CUDA(cudaMemGetInfo(&f, &t));
    return f;
}


/* ---------------------------------------------------------------- the bf16-emulating CPU step
 *
 * drafter_step_cpu's computation with every value the GPU path stores in bf16 rounded to bf16 at the same point
 * (drafter_gpu.c's "Precision points"), written here from the kernels/<op>_ref.c references: features after noise,
 * every GEMM output that is bf16 on the device (residual adds fused: one rounding of GEMM + residual), norms,
 * rope, attention with block_attn's round_p (P and the output, and P and dS in the backward), the loss with
 * lmhead's round_bf16 (normed target state and both logits), and the backward's bf16 tensors (dx, dh, dxn,
 * dxn1, dact, dgate, dup, dout, dq, dk, dv, dqraw, dkraw, dctx, dctx_fc); the fp32 accumulators (weight
 * gradients, dL/dxn1 and dL/dctx before their rounding) stay fp32. It is the baseline of style.md's rule. */
enum { E_IN, E_Q, E_K, E_V, E_O, E_QN, E_KN, E_POST, E_GATE, E_UP, E_DOWN, E_N };
static const char *const e_names[E_N] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};

static void rb(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}
static float *fz(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    ck_assert(p != NULL);
    return p;
}
static const struct drafter_param *pp(const struct drafter *d, const char *name) {
    const struct drafter_param *p = drafter_param_find(d, name);
    ck_assert_msg(p != NULL, "no tensor %s", name);
    return p;
}
static const struct drafter_param *lp(const struct drafter *d, int l, int j) {
    char name[96];
    snprintf(name, sizeof name, "layers.%d.%s", l, e_names[j]);
    return pp(d, name);
}

struct emu_out {
    float loss;
    float *xn;       /* (R, H) */
    float *row_loss; /* (R) */
    float **g;       /* per table entry (NULL when frozen) */
};

static void emu_step(const struct drafter *d, const struct drafter_batch *b, uint64_t seed, uint64_t step,
                     struct emu_out *out) {
    const struct drafter_config *c = drafter_config_of(d);
    const int T = b->T, N = c->N, B = c->B, R = N * B, H = c->H, I = c->I, kH = c->k * H;
    const int nh = c->n_h, nkv = c->n_kv, dh = c->d_h, QD = nh * dh, KD = nkv * dh, KV = T + R, L = c->L;
    const float eps = c->eps;
    char err[512];
    const int np = drafter_n_params(d);
    out->g = calloc((size_t)np, sizeof *out->g);
    for (int i = 0; i < np; i++)
        if (drafter_param(d, i)->g) out->g[i] = fz((size_t)drafter_param(d, i)->numel);
#define EG(p) (out->g[(p) - drafter_param(d, 0)])
    double inv[512];
    float inv_freq[512];
    struct model_config rc = c->target;
    rc.head_dim = dh;
    hf_rope_inv_freq(&rc, inv);
    for (int i = 0; i < dh / 2; i++) inv_freq[i] = (float)inv[i];

    uint8_t *maskpad = calloc((size_t)b->budget, 1);
    memcpy(maskpad, b->loss_mask, (size_t)T);
    int32_t anchors[DRAFTER_MAX_B * 64];
    uint8_t valid[DRAFTER_MAX_B * 64];
    ck_assert(N <= DRAFTER_MAX_B * 64);
    ck_assert(anchors_forward_ref(maskpad, b->budget, B, N, seed, step, anchors, valid, err, sizeof err) >= 0);
    int32_t *tok = malloc(sizeof(int32_t) * R), *pos = malloc(sizeof(int32_t) * KV);
    memcpy(pos, b->position_ids, sizeof(int32_t) * T);
    for (int bb = 0; bb < N; bb++)
        for (int j = 0; j < B; j++) {
            tok[bb * B + j] = j == 0 ? b->input_ids[anchors[bb]] : (int32_t)c->mask_token_id;
            pos[T + bb * B + j] = b->position_ids[anchors[bb]] + j;
        }
    float *hid = fz((size_t)T * kH);
    uint64_t base = drafter_noise_base(seed, step);
    for (size_t e = 0; e < (size_t)T * kH; e++) {
        float x = b->hidden[e];
        if (c->noise > 0) {
            uint64_t st = base + (uint64_t)e * 0x9E3779B97F4A7C15ull;
            double u = (kernels_rng_next(&st) >> 40) * 0x1.0p-24;
            x = x + (float)(2.0 * (u - 0.5) * c->noise);
        }
        hid[e] = bf16_round(x);
    }
    float *ctx_fc = fz((size_t)T * H), *ctx = fz((size_t)T * H), *rstd_c = fz((size_t)T);
    gemm_linear_forward_ref(ctx_fc, hid, pp(d, "fc.weight")->w, NULL, T, H, kH);
    rb(ctx_fc, (size_t)T * H);
    rmsnorm_forward_ref(ctx, rstd_c, ctx_fc, pp(d, "hidden_norm.weight")->w, T, H, eps);
    rb(ctx, (size_t)T * H);
    struct lay {
        float *xin, *xn1, *rstd1, *qraw, *rstdq, *q, *kraw, *rstdk, *k, *v, *o, *lse, *h, *xn2, *rstd2, *gate, *up, *act;
    } *A = calloc((size_t)L + 1, sizeof *A);
    for (int l = 0; l <= L; l++) A[l].xin = fz((size_t)R * H);
    ck_assert(embedding_forward_ref(A[0].xin, tok, pp(d, "embed_tokens.weight")->w, R, H, c->V_t) == 0);
    block_attn_config ac = {T, N, B, nh, nkv, dh, 0, 0, 1.0f / sqrtf((float)dh)};
    for (int l = 0; l < L; l++) {
        struct lay *a = &A[l];
        int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        ac.window = sliding ? c->sliding_window : 0;
        ac.causal = sliding && !c->sliding_window_non_causal;
        a->xn1 = fz((size_t)R * H), a->rstd1 = fz((size_t)R), a->qraw = fz((size_t)R * QD), a->rstdq = fz((size_t)R * nh);
        a->q = fz((size_t)R * QD), a->kraw = fz((size_t)KV * KD), a->rstdk = fz((size_t)KV * nkv), a->k = fz((size_t)KV * KD);
        a->v = fz((size_t)KV * KD), a->o = fz((size_t)R * QD), a->lse = fz((size_t)R * nh), a->h = fz((size_t)R * H);
        a->xn2 = fz((size_t)R * H), a->rstd2 = fz((size_t)R), a->gate = fz((size_t)R * I), a->up = fz((size_t)R * I);
        a->act = fz((size_t)R * I);
        rmsnorm_forward_ref(a->xn1, a->rstd1, a->xin, lp(d, l, E_IN)->w, R, H, eps);
        rb(a->xn1, (size_t)R * H);
        gemm_linear_forward_ref(a->qraw, a->xn1, lp(d, l, E_Q)->w, NULL, R, QD, H);
        gemm_linear_forward_ref(a->kraw, ctx, lp(d, l, E_K)->w, NULL, T, KD, H);
        gemm_linear_forward_ref(a->kraw + (size_t)T * KD, a->xn1, lp(d, l, E_K)->w, NULL, R, KD, H);
        gemm_linear_forward_ref(a->v, ctx, lp(d, l, E_V)->w, NULL, T, KD, H);
        gemm_linear_forward_ref(a->v + (size_t)T * KD, a->xn1, lp(d, l, E_V)->w, NULL, R, KD, H);
        rb(a->qraw, (size_t)R * QD), rb(a->kraw, (size_t)KV * KD), rb(a->v, (size_t)KV * KD);
        rmsnorm_forward_ref(a->q, a->rstdq, a->qraw, lp(d, l, E_QN)->w, R * nh, dh, eps);
        rmsnorm_forward_ref(a->k, a->rstdk, a->kraw, lp(d, l, E_KN)->w, KV * nkv, dh, eps);
        rb(a->q, (size_t)R * QD), rb(a->k, (size_t)KV * KD);
        rope_forward_ref(a->q, NULL, pos + T, inv_freq, R, nh, 0, dh);
        rope_forward_ref(a->k, NULL, pos, inv_freq, KV, nkv, 0, dh);
        rb(a->q, (size_t)R * QD), rb(a->k, (size_t)KV * KD);
        ck_assert_msg(block_attn_forward_ref(&ac, a->q, a->k, a->v, anchors, b->doc_ids, 1, a->o, a->lse, err,
                                             sizeof err) == 0, "%s", err);
        rb(a->o, (size_t)R * QD);
        gemm_linear_forward_ref(a->h, a->o, lp(d, l, E_O)->w, NULL, R, H, QD);
        for (size_t e = 0; e < (size_t)R * H; e++) a->h[e] = bf16_round(a->h[e] + a->xin[e]);
        rmsnorm_forward_ref(a->xn2, a->rstd2, a->h, lp(d, l, E_POST)->w, R, H, eps);
        rb(a->xn2, (size_t)R * H);
        gemm_linear_forward_ref(a->gate, a->xn2, lp(d, l, E_GATE)->w, NULL, R, I, H);
        gemm_linear_forward_ref(a->up, a->xn2, lp(d, l, E_UP)->w, NULL, R, I, H);
        rb(a->gate, (size_t)R * I), rb(a->up, (size_t)R * I);
        swiglu_forward_ref(a->act, a->gate, a->up, R, I, I);
        rb(a->act, (size_t)R * I);
        float *xo = A[l + 1].xin;
        gemm_linear_forward_ref(xo, a->act, lp(d, l, E_DOWN)->w, NULL, R, H, I);
        for (size_t e = 0; e < (size_t)R * H; e++) xo[e] = bf16_round(xo[e] + a->h[e]);
    }
    float *x_out = A[L].xin, *xn = fz((size_t)R * H), *rstd_f = fz((size_t)R);
    rmsnorm_forward_ref(xn, rstd_f, x_out, pp(d, "norm.weight")->w, R, H, eps);
    rb(xn, (size_t)R * H);
    lmhead_loss_config lc = {T, N, B, H, c->V_d, c->loss, c->weighting, c->gamma, c->alpha, eps};
    lmhead_loss_mode md = {b->budget, c->sample_from_anchor};
    float *row_loss = fz((size_t)R), *row_weight = fz((size_t)R);
    int32_t correct[DRAFTER_MAX_B], total[DRAFTER_MAX_B];
    const float *lm = pp(d, "lm_head.weight")->w, *vlm = pp(d, "verifier_lm_head.weight")->w;
    const float *vn = pp(d, "verifier_norm.weight")->w;
    ck_assert_msg(lmhead_loss_forward_mode_ref(&lc, &md, xn, lm, vlm, vn, b->last, anchors, valid, b->loss_mask, 1,
                                               &out->loss, row_loss, row_weight, correct, total, err, sizeof err) == 0,
                  "%s", err);
    out->xn = xn;
    out->row_loss = row_loss;

    /* backward */
    float *dxn_f = fz((size_t)R * H), *dxn = fz((size_t)R * H), *dx = fz((size_t)R * H), *dhg = fz((size_t)R * H);
    float *dact = fz((size_t)R * I), *dgate = fz((size_t)R * I), *dup = fz((size_t)R * I);
    float *dout = fz((size_t)R * QD), *dq = fz((size_t)R * QD), *dk = fz((size_t)KV * KD), *dv = fz((size_t)KV * KD);
    float *dqraw = fz((size_t)R * QD), *dkraw = fz((size_t)KV * KD), *dctx_f = fz((size_t)T * H);
    float *dctx_fc = fz((size_t)T * H);
    ck_assert_msg(lmhead_loss_backward_mode_ref(&lc, &md, xn, lm, vlm, vn, b->last, anchors, valid, b->loss_mask, 1,
                                                row_weight, dxn_f, err, sizeof err) == 0, "%s", err);
    memcpy(dxn, dxn_f, sizeof(float) * (size_t)R * H);
    rb(dxn, (size_t)R * H);
    rmsnorm_backward_ref(dx, EG(pp(d, "norm.weight")), dxn, x_out, pp(d, "norm.weight")->w, rstd_f, R, H, 0);
    rb(dx, (size_t)R * H);
    for (int l = L - 1; l >= 0; l--) {
        struct lay *a = &A[l];
        int sliding = c->layer_type[l] == DRAFTER_LAYER_SLIDING;
        ac.window = sliding ? c->sliding_window : 0;
        ac.causal = sliding && !c->sliding_window_non_causal;
        gemm_linear_backward_ref(dact, EG(lp(d, l, E_DOWN)), NULL, dx, a->act, lp(d, l, E_DOWN)->w, R, H, I, 0);
        rb(dact, (size_t)R * I);
        swiglu_backward_ref(dgate, dup, dact, a->gate, a->up, R, I, I);
        rb(dgate, (size_t)R * I), rb(dup, (size_t)R * I);
        gemm_linear_backward_ref(dxn_f, NULL, NULL, dgate, a->xn2, lp(d, l, E_GATE)->w, R, I, H, 0);
        gemm_linear_backward_ref(dxn_f, NULL, NULL, dup, a->xn2, lp(d, l, E_UP)->w, R, I, H, 1);
        gemm_linear_backward_ref(NULL, EG(lp(d, l, E_GATE)), NULL, dgate, a->xn2, lp(d, l, E_GATE)->w, R, I, H, 1);
        gemm_linear_backward_ref(NULL, EG(lp(d, l, E_UP)), NULL, dup, a->xn2, lp(d, l, E_UP)->w, R, I, H, 1);
        memcpy(dxn, dxn_f, sizeof(float) * (size_t)R * H);
        rb(dxn, (size_t)R * H);
        memcpy(dhg, dx, sizeof(float) * (size_t)R * H);
        rmsnorm_backward_ref(dhg, EG(lp(d, l, E_POST)), dxn, a->h, lp(d, l, E_POST)->w, a->rstd2, R, H, 1);
        rb(dhg, (size_t)R * H);
        gemm_linear_backward_ref(dout, EG(lp(d, l, E_O)), NULL, dhg, a->o, lp(d, l, E_O)->w, R, H, QD, 0);
        /* (accumulate 0 writes dw too: this step's g starts at zero and o_proj has one contribution) */
        rb(dout, (size_t)R * QD);
        ck_assert_msg(block_attn_backward_ref_prec(&ac, a->q, a->k, a->v, anchors, b->doc_ids, a->o, dout, a->lse, 1,
                                                   dq, dk, dv, err, sizeof err) == 0, "%s", err);
        rb(dq, (size_t)R * QD), rb(dk, (size_t)KV * KD), rb(dv, (size_t)KV * KD);
        rope_backward_ref(dq, NULL, pos + T, inv_freq, R, nh, 0, dh);
        rope_backward_ref(dk, NULL, pos, inv_freq, KV, nkv, 0, dh);
        rb(dq, (size_t)R * QD), rb(dk, (size_t)KV * KD);
        rmsnorm_backward_ref(dqraw, EG(lp(d, l, E_QN)), dq, a->qraw, lp(d, l, E_QN)->w, a->rstdq, R * nh, dh, 0);
        rmsnorm_backward_ref(dkraw, EG(lp(d, l, E_KN)), dk, a->kraw, lp(d, l, E_KN)->w, a->rstdk, KV * nkv, dh, 0);
        rb(dqraw, (size_t)R * QD), rb(dkraw, (size_t)KV * KD);
        gemm_linear_backward_ref(dxn_f, NULL, NULL, dqraw, a->xn1, lp(d, l, E_Q)->w, R, QD, H, 0);
        gemm_linear_backward_ref(dxn_f, NULL, NULL, dkraw + (size_t)T * KD, a->xn1, lp(d, l, E_K)->w, R, KD, H, 1);
        gemm_linear_backward_ref(dxn_f, NULL, NULL, dv + (size_t)T * KD, a->xn1, lp(d, l, E_V)->w, R, KD, H, 1);
        gemm_linear_backward_ref(NULL, EG(lp(d, l, E_Q)), NULL, dqraw, a->xn1, lp(d, l, E_Q)->w, R, QD, H, 1);
        gemm_linear_backward_ref(NULL, EG(lp(d, l, E_K)), NULL, dkraw + (size_t)T * KD, a->xn1, lp(d, l, E_K)->w, R, KD,
                                 H, 1);
        gemm_linear_backward_ref(NULL, EG(lp(d, l, E_V)), NULL, dv + (size_t)T * KD, a->xn1, lp(d, l, E_V)->w, R, KD, H,
                                 1);
        gemm_linear_backward_ref(dctx_f, EG(lp(d, l, E_K)), NULL, dkraw, ctx, lp(d, l, E_K)->w, T, KD, H, 1);
        gemm_linear_backward_ref(dctx_f, EG(lp(d, l, E_V)), NULL, dv, ctx, lp(d, l, E_V)->w, T, KD, H, 1);
        float *dxn1 = dxn;
        memcpy(dxn1, dxn_f, sizeof(float) * (size_t)R * H);
        rb(dxn1, (size_t)R * H);
        memcpy(dx, dhg, sizeof(float) * (size_t)R * H);
        rmsnorm_backward_ref(dx, EG(lp(d, l, E_IN)), dxn1, a->xin, lp(d, l, E_IN)->w, a->rstd1, R, H, 1);
        rb(dx, (size_t)R * H);
    }
    rb(dctx_f, (size_t)T * H);
    rmsnorm_backward_ref(dctx_fc, EG(pp(d, "hidden_norm.weight")), dctx_f, ctx_fc, pp(d, "hidden_norm.weight")->w,
                         rstd_c, T, H, 0);
    rb(dctx_fc, (size_t)T * H);
    gemm_linear_backward_ref(NULL, EG(pp(d, "fc.weight")), NULL, dctx_fc, hid, pp(d, "fc.weight")->w, T, H, kH, 1);
#undef EG
    for (int l = 0; l < L; l++) {
        struct lay *a = &A[l];
        float *f[] = {a->xn1, a->rstd1, a->qraw, a->rstdq, a->q, a->kraw, a->rstdk, a->k, a->v, a->o, a->lse, a->h,
                      a->xn2, a->rstd2, a->gate, a->up, a->act};
        for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    }
    for (int l = 0; l <= L; l++) free(A[l].xin);
    float *f[] = {hid, ctx_fc, ctx, rstd_c, rstd_f, row_weight, dxn_f, dxn, dx, dhg, dact, dgate, dup, dout,
                  dq, dk, dv, dqraw, dkraw, dctx_f, dctx_fc};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    free(A), free(maskpad), free(tok), free(pos);
}

static void emu_free(struct emu_out *e, int np) {
    for (int i = 0; i < np; i++) free(e->g[i]);
    free(e->g);
    free(e->xn);
    free(e->row_loss);
}

/* max |a - b|; INFINITY on any NaN or Inf in a */
static double max_err(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        double e = fabs((double)a[i] - b[i]);
        if (e > m) m = e;
    }
    return m;
}

/* root mean square of x (1e-30 at least, so ratios stay finite) */
static double rms_of(const float *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return fmax(sqrt(s / (double)(n ? n : 1)), 1e-30);
}

/* style.md's rule: max|gpu − ref| <= factor · max|emu − ref| (+ 1e-6 of the reference's max, for exact cases). */
static int rule_ok(const char *what, const float *gpu, const float *emu, const float *ref, size_t n, double factor) {
    double eg = max_err(gpu, ref, n), ee = max_err(emu, ref, n), mr = k1_max_abs(ref, n);
    int ok = eg <= factor * ee + 1e-6 * mr;
    fprintf(stderr, "%-44s max err gpu %.3e, bf16 emulation %.3e (ratio %.2f, allowed %.0fx)%s\n", what, eg, ee,
            ee > 0 ? eg / ee : 0.0, factor, ok ? "" : "  FAIL");
    return ok;
}

/* ---------------------------------------------------------------- one step against the CPU */

/* One step against the CPU; d_h > 0 replaces the head layout (n_h / n_kv heads of d_h, block B). */
static void one_step_vs_cpu_shape(int sample_from_anchor, int n_h, int n_kv, int d_h, int B) {
    struct drafter_config c;
    small_config(&c);
    if (d_h > 0) {
        c.n_h = n_h;
        c.n_kv = n_kv;
        c.d_h = c.target.head_dim = d_h;
        c.B = B;
    }
    c.sample_from_anchor = sample_from_anchor;
    if (sample_from_anchor) c.weighting = LMHEAD_WEIGHT_EXP_DECAY, c.loss = LMHEAD_LOSS_KL;
    struct drafter *d = small_drafter(&c, 11);
    struct sbatch sb;
    make_batch(&sb, &c, 21);
    char err[512];
    const uint64_t seed = 7, step = 3;
    /* GPU first (the host gradients are then overwritten by the CPU step) */
    struct drafter_gpu *g = gpu_of(d);
    ck_assert_msg(drafter_gpu_load_batch(g, &sb.b, err, sizeof err) == 0, "%s", err);
    struct drafter_metrics mg, mc;
    ck_assert_msg(drafter_step_gpu(g, TB_T, TB_BUDGET, seed, step, 1, &mg, err, sizeof err) == 0, "%s", err);
    const int np = drafter_n_params(d);
    float **gg = calloc((size_t)np, sizeof *gg);
    ck_assert_msg(drafter_gpu_download_grads(g, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        gg[i] = malloc(sizeof(float) * (size_t)p->numel);
        memcpy(gg[i], p->g, sizeof(float) * (size_t)p->numel);
    }
    struct drafter_gpu_last gl;
    drafter_gpu_last_step(g, &gl);
    const size_t RH = (size_t)c.N * c.B * c.H;
    float *xn_g = malloc(sizeof(float) * RH);
    k1_download_bf16(xn_g, gl.xn, RH);
    int32_t anch_g[64];
    K1_CUDA(cudaMemcpy(anch_g, gl.anchors, sizeof(int32_t) * (size_t)c.N, cudaMemcpyDeviceToHost));

    /* the bf16-emulating baseline, then the fp32 CPU step (the reference) */
    struct emu_out eo;
    emu_step(d, &sb.b, seed, step, &eo);
    drafter_zero_grad(d);
    ck_assert_msg(drafter_step_cpu(d, &sb.b, seed, step, 1, &mc, err, sizeof err) == 0, "%s", err);
    struct drafter_last cl;
    drafter_last_step(d, &cl);
    /* identical anchors and counts: anchors are exact on both paths */
    for (int b = 0; b < c.N; b++) ck_assert_int_eq(anch_g[b], cl.anchors[b]);
    ck_assert_int_eq(mg.n_anchors, mc.n_anchors);
    for (int j = 0; j < c.B; j++) ck_assert_int_eq(mg.total[j], mc.total[j]);
    ck_assert_int_eq(mg.eal_count, mc.eal_count);
    fprintf(stderr, "loss gpu %.6f emu %.6f cpu %.6f; full acc gpu %lld/%lld cpu %lld/%lld; eal gpu %.0f cpu %.0f\n",
            mg.loss_sum, eo.loss, mc.loss_sum, (long long)mg.full_correct, (long long)mg.full_total,
            (long long)mc.full_correct, (long long)mc.full_total, mg.eal_sum, mc.eal_sum);
    /* the loss as rows (a single scalar's error is too noisy a statistic for a ratio): the reference rows are the
     * fp32 loss of the CPU step's own final state */
    const int R = c.N * c.B;
    float *rl_g = malloc(sizeof(float) * R), *rl_c = malloc(sizeof(float) * R), *rw_c = malloc(sizeof(float) * R);
    K1_CUDA(cudaMemcpy(rl_g, gl.row_loss, sizeof(float) * R, cudaMemcpyDeviceToHost));
    {
        lmhead_loss_config lc = {TB_T, c.N, c.B, c.H, c.V_d, c.loss, c.weighting, c.gamma, c.alpha, c.eps};
        lmhead_loss_mode md = {TB_BUDGET, c.sample_from_anchor};
        float l;
        int32_t cc[DRAFTER_MAX_B], tt[DRAFTER_MAX_B];
        ck_assert_msg(lmhead_loss_forward_mode_ref(&lc, &md, cl.xn, drafter_param_find(d, "lm_head.weight")->w,
                                                   drafter_param_find(d, "verifier_lm_head.weight")->w,
                                                   drafter_param_find(d, "verifier_norm.weight")->w, sb.last, cl.anchors,
                                                   cl.valid, sb.mask, 0, &l, rl_c, rw_c, cc, tt, err, sizeof err) == 0,
                      "%s", err);
        ck_assert_msg(fabsf(l - (float)mc.loss_sum) <= 1e-6f * fabsf(l), "reference rows: loss %g vs step %g", l,
                      mc.loss_sum);
    }
    int ok = 1;
    ok &= fabs(mg.loss_sum - mc.loss_sum) <= 1e-2 * fabs(mc.loss_sum);
    ok &= rule_ok("loss rows", rl_g, eo.row_loss, rl_c, (size_t)R, 2.0);
    free(rl_g), free(rl_c), free(rw_c);
    rel_l2("xn (final normed state)", xn_g, cl.xn, RH);
    ok &= rule_ok("xn (final normed state)", xn_g, eo.xn, cl.xn, RH, 2.0);
    /* Tensors under 64 elements (the q/k norm weights at head dim 16): the max error over 16 values is too noisy a
     * statistic for a per-tensor ratio (GPU round 1, 2026-12-03, head dim 16: layer 1's q_norm at 4.4x its
     * emulation's max error while its relative L2 error, 1.7e-2, matched every other tensor's). They are compared
     * scale-free and pooled: each one's max error over its reference RMS against 3x the largest such ratio of the
     * emulation over all of them. */
    double small_emu = 0;
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g || p->numel >= 64) continue;
        small_emu = fmax(small_emu, max_err(eo.g[i], p->g, (size_t)p->numel) / rms_of(p->g, (size_t)p->numel));
    }
    for (int i = 0; i < np; i++) {
        const struct drafter_param *p = drafter_param(d, i);
        if (!p->g) continue;
        char what[96];
        snprintf(what, sizeof what, "grad %s", p->name);
        rel_l2(what, gg[i], p->g, (size_t)p->numel);
        if (p->numel < 64) {
            const double rg = max_err(gg[i], p->g, (size_t)p->numel) / rms_of(p->g, (size_t)p->numel);
            const int sok = rg <= 3.0 * small_emu;   /* NaN or Inf: max_err is INFINITY, fails */
            fprintf(stderr, "%-44s max err / ref rms gpu %.3e, bf16 emulation (pooled) %.3e (allowed 3x)%s\n", what, rg,
                    small_emu, sok ? "" : "  FAIL");
            ok &= sok;
        } else {
            ok &= rule_ok(what, gg[i], eo.g[i], p->g, (size_t)p->numel, 3.0);
        }
        free(gg[i]);
    }
    ck_assert_msg(ok, "the GPU step's error exceeds the rule (2x forward, 3x gradients) somewhere above");
    emu_free(&eo, np);
    free(gg);
    free(xn_g);
    drafter_gpu_free(g);
    free_batch(&sb);
    drafter_free(d);
}

static void one_step_vs_cpu(int sample_from_anchor) { one_step_vs_cpu_shape(sample_from_anchor, 0, 0, 0, 0); }

START_TEST(test_one_step_vs_cpu) { one_step_vs_cpu(0); }
END_TEST

/* sample_from_anchor (slot 0 supervised, targets from last[p]) with KL and exp-decay */
START_TEST(test_one_step_vs_cpu_sample_from_anchor) { one_step_vs_cpu(1); }
END_TEST

/* ---------------------------------------------------------------- determinism and planned memory */

/* Head dim 256 with a GQA group of 8 at B = 16 (G·B = 128): the Qwen3.5/3.6 drafter's attention shape on the
 * fp32 SIMT block attention (kernels/block_attn_simt.cu), rope and q/k norms at 256 */
START_TEST(test_one_step_vs_cpu_hd256) { one_step_vs_cpu_shape(0, 8, 1, 256, 16); }
END_TEST

/* The demo's head dim (16; 4 / 2 heads, B 8) */
START_TEST(test_one_step_vs_cpu_hd16) { one_step_vs_cpu_shape(0, 4, 2, 16, 8); }
END_TEST

START_TEST(test_step_twice_bitwise) {
    struct drafter_config c;
    small_config(&c);
    struct drafter *d = small_drafter(&c, 12);
    struct sbatch sb;
    make_batch(&sb, &c, 22);
    char err[512];
    struct drafter_gpu *g = gpu_of(d);
    ck_assert_msg(drafter_gpu_warmup(g, TB_BUDGET, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(drafter_gpu_load_batch(g, &sb.b, err, sizeof err) == 0, "%s", err);
    K1_CUDA(cudaDeviceSynchronize());
    size_t free0 = free_device_bytes();
    const int np = drafter_n_params(d);
    float **g1 = calloc((size_t)np, sizeof *g1);
    double loss1 = 0;
    for (int run = 0; run < 2; run++) {
        struct drafter_metrics m;
        ck_assert_msg(drafter_gpu_zero_grad(g, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(drafter_step_gpu(g, TB_T, TB_BUDGET, 5, 9, 1, &m, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(drafter_gpu_download_grads(g, err, sizeof err) == 0, "%s", err);
        ck_assert(isfinite(m.loss_sum));
        if (run == 0) loss1 = m.loss_sum;
        else ck_assert_msg(m.loss_sum == loss1, "loss %.9g then %.9g", loss1, m.loss_sum);
        for (int i = 0; i < np; i++) {
            const struct drafter_param *p = drafter_param(d, i);
            if (!p->g) continue;
            size_t bytes = sizeof(float) * (size_t)p->numel;
            if (run == 0) {
                g1[i] = malloc(bytes);
                memcpy(g1[i], p->g, bytes);
            } else {
                ck_assert_msg(!memcmp(g1[i], p->g, bytes), "gradient of %s differs between two identical steps",
                              p->name);
                free(g1[i]);
            }
        }
    }
    free(g1);
    K1_CUDA(cudaDeviceSynchronize());
    ck_assert_msg(free_device_bytes() == free0, "device memory changed across steps: %zu -> %zu free", free0,
                  free_device_bytes());
    drafter_gpu_free(g);
    free_batch(&sb);
    drafter_free(d);
}
END_TEST

/* ---------------------------------------------------------------- training runs */

#define N_BATCHES 3

struct run {
    struct drafter *d;
    struct optim_tensor *t;
    struct optim o;
    struct drafter_gpu *g;
    struct optim_gpu *og;
};

static void run_init(struct run *r, const struct drafter_config *c, int gpu) {
    char err[512];
    memset(r, 0, sizeof *r);
    r->d = small_drafter(c, 31);
    int n = drafter_n_params(r->d);
    r->t = calloc((size_t)n, sizeof *r->t);
    for (int i = 0; i < n; i++) {
        const struct drafter_param *p = drafter_param(r->d, i);
        r->t[i] = (struct optim_tensor){p->name, p->ndim, {p->shape[0], p->shape[1]}, p->w, p->g, p->trainable,
                                        p->is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    oc.lr = 3e-3;
    ck_assert_msg(optim_init(&r->o, r->t, n, &oc, err, sizeof err) == 0, "%s", err);
    if (gpu) {
        r->g = gpu_of(r->d);
        r->og = optim_gpu_init(&r->o, r->g, stderr, err, sizeof err);
        ck_assert_msg(r->og != NULL, "optim_gpu_init: %s", err);
    }
}

static void run_free(struct run *r) {
    optim_gpu_free(r->og);
    drafter_gpu_free(r->g);
    optim_free(&r->o);
    free(r->t);
    drafter_free(r->d);
}

/* One optimizer step on batch sb (one micro-batch); returns the loss; *skipped when the guard skipped it. */
static double run_step(struct run *r, struct sbatch *sb, int64_t step, struct optim_guard *guard, int *skipped) {
    char err[512], msg[256];
    struct drafter_metrics m;
    double norm;
    *skipped = 0;
    if (r->g) {
        ck_assert_msg(drafter_gpu_zero_grad(r->g, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(drafter_gpu_load_batch(r->g, &sb->b, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(drafter_step_gpu(r->g, TB_T, TB_BUDGET, 17, (uint64_t)step, 1, NULL, err, sizeof err) == 0, "%s",
                      err);
        ck_assert_msg(optim_gpu_grad_norm_start(r->og, 1.0f, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(optim_gpu_grad_norm_wait(r->og, &norm, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(drafter_gpu_metrics(r->g, &m, err, sizeof err) == 0, "%s", err);
    } else {
        drafter_zero_grad(r->d);
        ck_assert_msg(drafter_step_cpu(r->d, &sb->b, 17, (uint64_t)step, 1, &m, err, sizeof err) == 0, "%s", err);
        norm = optim_clip_grad_norm(r->t, r->o.n, 1.0);
    }
    if (guard && optim_guard_check(guard, step, m.loss_sum, norm, msg, sizeof msg) != OPTIM_GUARD_OK) {
        fprintf(stderr, "%s\n", msg);
        *skipped = 1;
        return m.loss_sum;
    }
    if (r->g) ck_assert_msg(optim_gpu_step(r->og, 1.0, 1.0, err, sizeof err) == 0, "%s", err);
    else ck_assert_msg(optim_step(&r->o, 1.0, err, sizeof err) == 0, "%s", err);
    return m.loss_sum;
}

/* The straight run of 6 steps and the run stopped after 3 (weights and optimizer state to the host, device state
 * freed, rebuilt from the host) end bit-identical. */
START_TEST(test_exact_resume) {
    struct drafter_config c;
    small_config(&c);
    struct sbatch sb[N_BATCHES];
    for (int i = 0; i < N_BATCHES; i++) make_batch(&sb[i], &c, 200 + (uint64_t)i);
    char err[512];
    struct run a, b;
    run_init(&a, &c, 1);
    run_init(&b, &c, 1);
    int sk;
    for (int s = 0; s < 6; s++) run_step(&a, &sb[s % N_BATCHES], s, NULL, &sk);
    ck_assert_msg(drafter_gpu_download_weights(a.g, err, sizeof err) == 0, "%s", err);
    for (int s = 0; s < 3; s++) run_step(&b, &sb[s % N_BATCHES], s, NULL, &sk);
    ck_assert_msg(drafter_gpu_download_weights(b.g, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(optim_gpu_download_state(b.og, err, sizeof err) == 0, "%s", err);
    optim_gpu_free(b.og);
    drafter_gpu_free(b.g);
    b.g = gpu_of(b.d);
    b.og = optim_gpu_init(&b.o, b.g, NULL, err, sizeof err);
    ck_assert_msg(b.og != NULL, "%s", err);
    for (int s = 3; s < 6; s++) run_step(&b, &sb[s % N_BATCHES], s, NULL, &sk);
    ck_assert_msg(drafter_gpu_download_weights(b.g, err, sizeof err) == 0, "%s", err);
    for (int i = 0; i < drafter_n_params(a.d); i++) {
        const struct drafter_param *pa = drafter_param(a.d, i), *pb = drafter_param(b.d, i);
        if (!pa->trainable) continue;
        ck_assert_msg(!memcmp(pa->w, pb->w, sizeof(float) * (size_t)pa->numel), "%s differs after resume", pa->name);
    }
    ck_assert_int_eq(a.o.muon_step, b.o.muon_step);
    ck_assert_int_eq(a.o.adamw_step, b.o.adamw_step);
    run_free(&a);
    run_free(&b);
    for (int i = 0; i < N_BATCHES; i++) free_batch(&sb[i]);
}
END_TEST

/* A NaN in the features makes the loss and the norm non-finite: the guard skips the step and the weights stay. */
START_TEST(test_nonfinite_guard) {
    struct drafter_config c;
    small_config(&c);
    struct sbatch sb;
    make_batch(&sb, &c, 300);
    char err[512];
    struct run r;
    run_init(&r, &c, 1);
    struct optim_guard guard;
    optim_guard_init(&guard, 3);
    int sk;
    run_step(&r, &sb, 0, &guard, &sk);
    ck_assert_int_eq(sk, 0);
    ck_assert_msg(drafter_gpu_download_weights(r.g, err, sizeof err) == 0, "%s", err);
    const struct drafter_param *fc = drafter_param_find(r.d, "fc.weight");
    float *before = malloc(sizeof(float) * (size_t)fc->numel);
    memcpy(before, fc->w, sizeof(float) * (size_t)fc->numel);
    float saved = sb.hidden[12345];
    sb.hidden[12345] = NAN;
    double loss = run_step(&r, &sb, 1, &guard, &sk);
    ck_assert_msg(sk == 1 && !isfinite(loss), "the NaN step was not skipped (loss %g)", loss);
    ck_assert_int_eq(guard.skipped_total, 1);
    ck_assert_msg(drafter_gpu_download_weights(r.g, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(!memcmp(before, fc->w, sizeof(float) * (size_t)fc->numel), "a skipped step changed fc.weight");
    sb.hidden[12345] = saved;
    loss = run_step(&r, &sb, 2, &guard, &sk);
    ck_assert_msg(sk == 0 && isfinite(loss), "training did not continue after the skipped step (loss %g)", loss);
    ck_assert_int_eq(guard.consecutive, 0);
    free(before);
    run_free(&r);
    free_batch(&sb);
}
END_TEST

int main(void) {
    Suite *s = suite_create("train_gpu");
    TCase *tc = tcase_create("train_gpu");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, test_one_step_vs_cpu);
    tcase_add_test(tc, test_one_step_vs_cpu_sample_from_anchor);
    tcase_add_test(tc, test_one_step_vs_cpu_hd256);
    tcase_add_test(tc, test_one_step_vs_cpu_hd16);
    tcase_add_test(tc, test_step_twice_bitwise);
    tcase_add_test(tc, test_exact_resume);
    tcase_add_test(tc, test_nonfinite_guard);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
