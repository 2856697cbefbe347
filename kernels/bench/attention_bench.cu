/*
 * kernels/bench/attention_bench.cu — causal varlen GQA attention forward (kernels/attention.cu).
 *
 * Build: make BUILD=build-k1d build-k1d/bench/attention_bench   Run: build-k1d/bench/attention_bench
 * This file includes kernels/attention_wg.cuh (the kernel template and its launcher, no external symbol) so it
 * can launch the template with other configurations (the library runs only variant 34), and
 * kernels/bench/attention_variants.cuh for the kernels that lost (the mma.sync kernel of variants 1-7,
 * variants 8-17 and the warp-specialized kernel of variants 25-27, 29, 31). All numbered variants below but 34
 * are history, kept measurable; their numbers are in kernels/bench/RESULTS.md.
 * Variant 1: 4 warps × 1 m-tile (BR 64), BC 64, Q fragments in registers (the first library choice)
 * Variant 2: 8 warps × 1 m-tile (BR 128), BC 64
 * Variant 3: 4 warps × 2 m-tiles (BR 128), BC 32, Q re-read from shared memory
 * Variant 4: 4 warps × 2 m-tiles (BR 128), BC 64 (the library's choice in K1; 255 registers + 76
 *            bytes of spills at HD 128)
 * Variant 5: 8 warps × 2 m-tiles (BR 256), BC 32
 * Variant 6: variant 4 with the fast exponent FX (unscaled scores through mask and max, one FFMA +
 *            ex2.approx.ftz per probability; 4 bytes of spills) — the library's default until the wgmma
 *            kernel (its running max compares scaled maxima only since 2026-11-29)
 * Variant 7: variant 3 (BC 32) with FX
 * Variant 8: the K1c kernel (attention_forward_kernel2) with variant 6's tiles: mirrored m-tiles
 *            (warp w owns m16 tiles w and 7-w), only the 16-key chunks at or below each m-tile's
 *            diagonal on masked tiles, K and V waited separately on the first tile, longest-first
 *            (LPT) tile order; measured slower than variant 6 on the H200
 * Variant 9: variant 8 with the per-document tile order of variants 1-7 (isolates LPT)
 * Variant 10: variant 8 with 8 warps × 2 m-tiles (BR 256, one 256-thread block per SM)
 * Variant 11: variant 8 with BC 32
 * Variant 12: HD 64 only — kernel 2 with 8 warps × 1 m-tile (BR 128), BC 128 (no spills at HD 64;
 *            4 warps × 2 m-tiles at BC 128 spill 104 bytes)
 * Variant 13: kernel 3 (K1d): variant 6's body and grid with warp-level
 *            skipping (a warp skips key tiles above its last real row, and all tiles when its rows
 *            lie past the document) and the causal mask applied per warp; shared memory as 3 regions
 * Variant 14: kernel 3 persistent (K1d): grid = resident CTAs, a device-built
 *            work list of (document, query tile) pairs sorted by query tile descending (heads innermost),
 *            snake-assigned to CTAs; the next item's Q and first K/V tile load under the current
 *            item's last key tile, so only a CTA's first item pays the start-up latency
 * Variant 15: variant 14 without the warp-level skipping (isolates the schedule)
 * Variant 16: variant 14 with a lazy rescale: O, l and the running max change only when a row's max
 *            grows by more than 8 in log2 units, voted per warp
 * Variant 17: variant 13 with the lazy rescale
 * Variant 18: the wgmma (sm_90a) kernel attention_wg_kernel — the library's default in WA-WA2: two
 *            consumer warpgroups × 64 query rows (BR 128), BC 128 key tiles in 128B-swizzled panels
 *            (2-stage cp.async, one barrier per tile), S = Q·Kᵀ by wgmma from shared memory, P·V with
 *            P from registers, the P·V of tile n-1 overlapping the softmax of tile n inside each
 *            warpgroup; on the diagonal tile warpgroup 0 skips the P·V of the 64 keys above its rows
 * Variant 19: variant 18 without that skip
 * Variants 20-32 (WA2; bench-only since the clean-up of 2026-11-29):
 * Variant 20: variant 18 with a ping-pong issue order (named barrier 1): warpgroup 1 issues its S and
 *            P·V only after warpgroup 0 issued both (tensor-core queue S0 PV0 S1 PV1), so warpgroup 0's
 *            softmax starts a whole S earlier
 * Variant 21: variant 18 with the issue order S0 S1 PV0 PV1 (named barriers 1-3)
 * Variant 22: variant 18 with the output staged in shared memory (each warp's 16 rows in its own, no
 *            longer read, Q rows) and written in coalesced 16-byte stores
 * Variant 23: one warpgroup per block (BR 64), 64-key tiles, two blocks per SM (81 KB of shared memory
 *            each): one block's start-up (Q and first K load, the unoverlapped first S and softmax, the
 *            last P·V and the stores) runs under the other block's MMAs — aimed at short documents
 * Variant 24: variant 23 with variant 22's staged stores
 * Variant 25: attention_ws_kernel, warp-specialized: a producer warpgroup (setmaxnreg 24) loads
 *            K/V stages with cp.async and signals them through named barriers, the two consumer
 *            warpgroups (setmaxnreg 240) never meet a __syncthreads and ping-pong their MMAs
 *            (FA3), so one warpgroup's softmax runs under the other's MMAs
 * Variant 26: variant 25 without the ping-pong barriers (isolates warp specialization)
 * Variant 27: variant 25 with variant 22's staged stores
 * Variant 28: variant 18 with lazy rescaling (the running max moves only when a row's tile max exceeds
 *            it by more than 8 in log2 units; the O rescale is skipped per warp when no row moved —
 *            v16 gained 6% over v14 with it on the mma.sync kernel)
 * Variant 29: variant 25 with lazy rescaling
 * Variant 30: variant 18 with a longest-first (LPT) tile order across documents: grid z counts query
 *            tiles down from the longest document's last one (v8-v9 measured it on mma.sync)
 * Variant 31: variant 25 with staged stores, lazy rescaling and the LPT order (all knobs at once)
 * Variant 32: variant 18 with staged stores, lazy rescaling and the LPT order
 * Variants 33-37 (WA3; H200 11:40: v20 362, v22 353, v32 363 on 1-4K; v24 301 at HD 64); v34 is the
 * library's kernel since 2026-11-29 12:15 (388 TFLOP/s on 1-4K), the others are bench-only:
 * Variant 33: variant 20 (ping-pong) with staged stores
 * Variant 34: variant 20 with staged stores, lazy rescaling and the LPT order (32's knobs)
 * Variant 35: variant 33 at HD 128, variant 24 (one warpgroup, 64-key tiles, 2 blocks/SM, staged) at HD 64
 * Variant 36: variant 34 at HD 128, variant 24 at HD 64
 * Variant 37: variant 20 with staged stores and the LPT order (34 without lazy rescaling)
 * Variants 38 and 39 (the persistent kernel attention_wgp_kernel, variant 33 / 20 made persistent)
 * failed validation and were deleted: their code is in git commit b94183e.
 * DFLASH_ATTENTION_BENCH=20,21,... (variant numbers) validates and times only those variants.
 * Variants 1-5 run with FX off, as measured in K1. Since K1d the inputs of a head dim are generated
 * once (the run takes seconds, not a minute); `all` = 0 in the table below would time a variant on
 * the HD 128 log-normal batch only. Each variant is validated on two batches: the small
 * varlen one below and 200 short documents (1-100 tokens) around one of 600 (hundreds of work items,
 * so persistent variants run several items per CTA). A variant that fails its validation is reported,
 * not timed, and makes the bench exit 1 after the others ran; the last lines are a summary table.
 * After the summary: the library's attention_forward at HD 256 (24 / 4 heads, Qwen3.6-27B), 32 and 16 (the
 * demo's), where it runs kernels/attention_mma.cu (issue 27; DFLASH_ATTENTION_BENCH=0: these rows only).
 * Effective FLOPs = 4·HD·NH·Σ_docs len·(len+1)/2 (QKᵀ and PV over the causal half only).
 * Target (issue 5): >= 350 TFLOP/s at HD 128 on documents of 1-4K tokens.
 * Each variant is validated on a small varlen batch against attention_forward_ref first.
 * 2026-11-29, H200, 8192 tokens, NH 32 / NKV 8, HD 128, lognormal 1-4K documents (TFLOP/s):
 * v1 199, v2 175, v3 242, v4 254, v5 197; one 8192-token document: v1 217, v4 298. HD 64: v1 206, v4 214.
 */
#include "kernels/attention_wg.cuh"

/* This bench's number for the library's attention_forward kernel at HD 64 and 128 (attention_wg_kernel with
 * PP 1, OST, LAZY and LPT: 388 TFLOP/s on 1-4K documents at HD 128 on the H200, 2026-11-29 12:15). */
#define ATTENTION_DEFAULT_KERNEL 34
#include "attention_variants.cuh"
#include "k1bench.cuh"

#include <math.h>
#include <algorithm>
#include <vector>

typedef int (*att_fn)(bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, const int32_t *, int, int, int, int,
                      int, float, cudaStream_t);

template <int HD, int NW, int MT, int BC, bool LPT = true>
static int variant2(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND,
                    int mx, int T, int NH, int NKV, float scale, cudaStream_t s) {
    return launch2<HD, NW, MT, BC, LPT>(o, lse, q, k, v, cu, ND, mx, T, NH, NKV, scale, s);
}

template <int HD, int NW, int MT, int BC, bool PERSIST, bool SKIP = true, bool LAZY = false>
static int variant3(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND,
                    int mx, int T, int NH, int NKV, float scale, cudaStream_t s) {
    return launch3<HD, NW, MT, BC, PERSIST, SKIP, LAZY>(o, lse, q, k, v, cu, ND, mx, T, NH, NKV, scale, s);
}

template <int HD, bool SKIP = true, int NWG = 2, int BC = 128, int MINB = 1, int PP = 0, bool OST = false,
          bool LAZY = false, bool LPT = false>
static int variant_wg(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND,
                      int mx, int T, int NH, int NKV, float scale, cudaStream_t s) {
    return launch_wg<HD, SKIP, NWG, BC, MINB, PP, OST, LAZY, LPT>(o, lse, q, k, v, cu, ND, mx, T, NH, NKV, scale, s);
}

template <int HD, bool PPW = true, bool OST = false, bool LAZY = false, bool LPT = false>
static int variant_ws(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND,
                      int mx, int T, int NH, int NKV, float scale, cudaStream_t s) {
    return launch_ws<HD, true, PPW, OST, LAZY, LPT>(o, lse, q, k, v, cu, ND, mx, T, NH, NKV, scale, s);
}

/* 1 when DFLASH_ATTENTION_BENCH is unset or lists the variant number of `name` ("attention vN ...") */
static int selected(const char *name) {
    const char *e = getenv("DFLASH_ATTENTION_BENCH");
    if (!e || !*e) return 1;
    const int num = atoi(name + strlen("attention v"));
    for (const char *p = e; *p;) {
        if (atoi(p) == num) return 1;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    return 0;
}

template <int HD, int NW, int MT, int BC, bool FX = false>
static int variant(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND, int mx,
                   int T, int NH, int NKV, float scale, cudaStream_t s) {
    return launch<HD, NW, MT, BC, FX>(o, lse, q, k, v, cu, ND, mx, T, NH, NKV, scale, s);
}

/* the library's attention_forward at a fixed head dim (the other-head-dim rows after the summary) */
template <int HD>
static int lib_forward(bf16 *o, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *cu, int ND, int mx,
                       int T, int NH, int NKV, float scale, cudaStream_t s) {
    return attention_forward(o, lse, q, k, v, cu, ND, mx, T, NH, NKV, HD, scale, s);
}

/* A validation batch: host inputs (bf16-rounded), device copies and the reference output, made on
 * first use per head dim and reused by every variant. */
struct vcase { int T, ND, NH, NKV, mx; std::vector<int32_t> cu; bf16 *q, *k, *v; int32_t *dcu; float *ref; };

/* cache slot of a head dim (16, 32, 64, 128, 256) */
static int hd_slot(int HD) { return HD == 16 ? 0 : HD == 32 ? 1 : HD == 64 ? 2 : HD == 128 ? 3 : 4; }

static vcase *vcase_get(int which, int HD) {
    static vcase *cache[2][5];
    vcase *c = cache[which][hd_slot(HD)];
    if (c) return c;
    c = new vcase();
    if (which == 0) {
        c->cu = {0, 1, 70, 70, 300, 1000};
        c->T = 1003; c->NH = 4; c->NKV = 2;
    } else {   /* 200 documents of 1-100 tokens around one of 600 (after the 100th), 2 padding rows */
        uint64_t seed = 77;
        c->cu.push_back(0);
        for (int d = 0; d < 201; d++)
            c->cu.push_back(c->cu.back() + (d == 100 ? 600 : 1 + (int)(kernels_rng_next(&seed) % 100)));
        c->T = c->cu.back() + 2; c->NH = 4; c->NKV = 2;
    }
    c->ND = (int)c->cu.size() - 1;
    c->mx = 0;
    for (int d = 0; d < c->ND; d++) c->mx = std::max(c->mx, c->cu[d + 1] - c->cu[d]);
    size_t nq = (size_t)c->T * c->NH * HD, nk = (size_t)c->T * c->NKV * HD;
    float *hq, *hk, *hv;
    c->q = bench_rand_bf16(nq, -1, 1, 1 + 10 * which, &hq);
    c->k = bench_rand_bf16(nk, -1, 1, 2 + 10 * which, &hk);
    c->v = bench_rand_bf16(nk, -1, 1, 3 + 10 * which, &hv);
    BENCH_CUDA(cudaMalloc(&c->dcu, 4 * c->cu.size()));
    BENCH_CUDA(cudaMemcpy(c->dcu, c->cu.data(), 4 * c->cu.size(), cudaMemcpyHostToDevice));
    c->ref = (float *)malloc(4 * nq);
    BENCH_OK(attention_forward_ref(c->ref, NULL, hq, hk, hv, c->cu.data(), c->ND, c->T, c->NH, c->NKV, HD,
                                   1.0f / sqrtf((float)HD)));
    free(hq); free(hk); free(hv);
    cache[which][hd_slot(HD)] = c;
    return c;
}

/* 1 when the variant matches the reference on both batches (a line says so either way) */
static int validate(const char *name, att_fn fn, int HD) {
    int ok = 1;
    for (int which = 0; which < 2; which++) {
        vcase *c = vcase_get(which, HD);
        size_t nq = (size_t)c->T * c->NH * HD;
        bf16 *o;
        BENCH_CUDA(cudaMalloc(&o, 2 * nq));
        BENCH_OK(fn(o, NULL, c->q, c->k, c->v, c->dcu, c->ND, which == 0 ? 700 : c->mx, c->T, c->NH, c->NKV,
                    1.0f / sqrtf((float)HD), 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        char what[80];
        snprintf(what, sizeof what, "%s HD=%d %s", name, HD, which == 0 ? "5 docs" : "201 docs");
        /* bf16 output and bf16 probabilities: a few 1e-3 on outputs of magnitude ~0.1-1 */
        double err = bench_max_err(o, c->ref, (size_t)c->cu[c->ND] * c->NH * HD);
        int good = err <= 2e-2;
        printf("validate %-48s max err %.3g (tol %.3g) %s\n", what, err, 2e-2, good ? "ok" : "FAILED");
        fflush(stdout);
        cudaFree(o);
        ok &= good;
    }
    return ok;
}

/* Documents of log-normal length (median ~1200, clipped to [lo, hi]) packed into T tokens. */
static int make_docs(int32_t *cu, int T, int lo, int hi, uint64_t seed) {
    int nd = 0;
    cu[0] = 0;
    while (1) {
        double u1 = ((kernels_rng_next(&seed) >> 11) + 0.5) / 9007199254740992.0;
        double u2 = ((kernels_rng_next(&seed) >> 11) + 0.5) / 9007199254740992.0;
        double z = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
        int len = (int)(1200 * exp(0.6 * z));
        len = len < lo ? lo : len > hi ? hi : len;
        if (cu[nd] + len > T) len = T - cu[nd];
        if (len <= 0) break;
        cu[nd + 1] = cu[nd] + len;
        nd++;
        if (cu[nd] == T) break;
    }
    return nd;
}

/* Device inputs of the timed runs, one set per head dim (T=8192; the first call's heads: every run of one head
 * dim uses the same T, NH, NKV), made once. */
struct binputs { bf16 *q, *k, *v, *o; };
static binputs *binputs_get(int HD, int T, int NH, int NKV) {
    static binputs *cache[5];
    binputs *b = cache[hd_slot(HD)];
    if (b) return b;
    b = new binputs();
    size_t nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    b->q = bench_rand_bf16(nq, -1, 1, 4);
    b->k = bench_rand_bf16(nk, -1, 1, 5);
    b->v = bench_rand_bf16(nk, -1, 1, 6);
    BENCH_CUDA(cudaMalloc(&b->o, 2 * nq));
    cache[hd_slot(HD)] = b;
    return b;
}

/* TFLOP/s of one run (also printed) */
static double bench(const char *name, att_fn fn, int HD, const char *docs, const int32_t *cu, int ND, int T, int NH,
                    int NKV) {
    binputs *in = binputs_get(HD, T, NH, NKV);
    int32_t *dcu;
    BENCH_CUDA(cudaMalloc(&dcu, 4 * (ND + 1)));
    BENCH_CUDA(cudaMemcpy(dcu, cu, 4 * (ND + 1), cudaMemcpyHostToDevice));
    int mx = 0;
    double pairs = 0;
    for (int d = 0; d < ND; d++) {
        int len = cu[d + 1] - cu[d];
        if (len > mx) mx = len;
        pairs += (double)len * (len + 1) / 2;
    }
    float scale = 1.0f / sqrtf((float)HD);
    double ms = bench_ms([&]() { BENCH_OK(fn(in->o, NULL, in->q, in->k, in->v, dcu, ND, mx, T, NH, NKV, scale, 0)); }, 10);
    char shp[96];
    snprintf(shp, sizeof shp, "T=%d %s NH=%d NKV=%d HD=%d", T, docs, NH, NKV, HD);
    bench_report_flops(name, shp, ms, 4.0 * HD * NH * pairs);
    cudaFree(dcu);
    return 4.0 * HD * NH * pairs / (ms * 1e-3) / 1e12;
}

int main(void) {
    /* shapes: 1 = all five columns, 0 = the HD 128 log-normal batch only (plus HD 64 when f128 is NULL) */
    struct { const char *name; att_fn f128, f64; int all; } vars[] = {
        {"attention v1 4w x1 BC64", variant<128, 4, 1, 64>, variant<64, 4, 1, 64>, 1},
        {"attention v2 8w x1 BC64", variant<128, 8, 1, 64>, variant<64, 8, 1, 64>, 1},
        {"attention v3 4w x2 BC32", variant<128, 4, 2, 32>, variant<64, 4, 2, 32>, 1},
        {"attention v4 4w x2 BC64", variant<128, 4, 2, 64>, variant<64, 4, 2, 64>, 1},
        {"attention v5 8w x2 BC32", variant<128, 8, 2, 32>, variant<64, 8, 2, 32>, 1},
        {"attention v6 4w x2 BC64 FX", variant<128, 4, 2, 64, true>, variant<64, 4, 2, 64, true>, 1},
        {"attention v7 4w x2 BC32 FX", variant<128, 4, 2, 32, true>, variant<64, 4, 2, 32, true>, 1},
        {"attention v8 k2 4w x2 BC64 LPT", variant2<128, 4, 2, 64>, variant2<64, 4, 2, 64>, 1},
        {"attention v9 k2 4w x2 BC64", variant2<128, 4, 2, 64, false>, variant2<64, 4, 2, 64, false>, 1},
        {"attention v10 k2 8w x2 BC64 LPT", variant2<128, 8, 2, 64>, variant2<64, 8, 2, 64>, 1},
        {"attention v11 k2 4w x2 BC32 LPT", variant2<128, 4, 2, 32>, variant2<64, 4, 2, 32>, 1},
        {"attention v12 k2 8w x1 BC128 LPT", NULL, variant2<64, 8, 1, 128>, 0},   /* HD 64 only */
        {"attention v13 k3 4w x2 BC64 skip", variant3<128, 4, 2, 64, false>, variant3<64, 4, 2, 64, false>, 1},
        {"attention v14 k3 persist LPT", variant3<128, 4, 2, 64, true>, variant3<64, 4, 2, 64, true>, 1},
        {"attention v15 k3 persist noskip", variant3<128, 4, 2, 64, true, false>,
         variant3<64, 4, 2, 64, true, false>, 1},
        {"attention v16 k3 persist lazy", variant3<128, 4, 2, 64, true, true, true>,
         variant3<64, 4, 2, 64, true, true, true>, 1},
        {"attention v17 k3 skip lazy", variant3<128, 4, 2, 64, false, true, true>,
         variant3<64, 4, 2, 64, false, true, true>, 1},
        {"attention v18 wgmma 2wg BC128", variant_wg<128>, variant_wg<64>, 1},
        {"attention v19 wgmma 2wg noskip", variant_wg<128, false>, variant_wg<64, false>, 1},
        {"attention v20 wgmma pingpong S0PV0S1PV1", variant_wg<128, true, 2, 128, 1, 1>,
         variant_wg<64, true, 2, 128, 1, 1>, 1},
        {"attention v21 wgmma pingpong S0S1PV0PV1", variant_wg<128, true, 2, 128, 1, 2>,
         variant_wg<64, true, 2, 128, 1, 2>, 1},
        {"attention v22 wgmma staged stores", variant_wg<128, true, 2, 128, 1, 0, true>,
         variant_wg<64, true, 2, 128, 1, 0, true>, 1},
        {"attention v23 wgmma 1wg BC64 2/SM", variant_wg<128, true, 1, 64, 2>, variant_wg<64, true, 1, 64, 2>, 1},
        {"attention v24 wgmma 1wg BC64 2/SM st", variant_wg<128, true, 1, 64, 2, 0, true>,
         variant_wg<64, true, 1, 64, 2, 0, true>, 1},
        {"attention v25 wgmma warp-specialized", variant_ws<128>, variant_ws<64>, 1},
        {"attention v26 wgmma warp-spec no pingpong", variant_ws<128, false>, variant_ws<64, false>, 1},
        {"attention v27 wgmma warp-spec staged st", variant_ws<128, true, true>, variant_ws<64, true, true>, 1},
        {"attention v28 wgmma lazy rescale", variant_wg<128, true, 2, 128, 1, 0, false, true>,
         variant_wg<64, true, 2, 128, 1, 0, false, true>, 1},
        {"attention v29 wgmma warp-spec lazy", variant_ws<128, true, false, true>, variant_ws<64, true, false, true>, 1},
        {"attention v30 wgmma LPT order", variant_wg<128, true, 2, 128, 1, 0, false, false, true>,
         variant_wg<64, true, 2, 128, 1, 0, false, false, true>, 1},
        {"attention v31 warp-spec st+lazy+LPT", variant_ws<128, true, true, true, true>,
         variant_ws<64, true, true, true, true>, 1},
        {"attention v32 wgmma st+lazy+LPT", variant_wg<128, true, 2, 128, 1, 0, true, true, true>,
         variant_wg<64, true, 2, 128, 1, 0, true, true, true>, 1},
        {"attention v33 pingpong+st", variant_wg<128, true, 2, 128, 1, 1, true>,
         variant_wg<64, true, 2, 128, 1, 1, true>, 1},
        {"attention v34 pingpong+st+lazy+LPT", variant_wg<128, true, 2, 128, 1, 1, true, true, true>,
         variant_wg<64, true, 2, 128, 1, 1, true, true, true>, 1},
        {"attention v35 v33 / HD64 v24", variant_wg<128, true, 2, 128, 1, 1, true>,
         variant_wg<64, true, 1, 64, 2, 0, true>, 1},
        {"attention v36 v34 / HD64 v24", variant_wg<128, true, 2, 128, 1, 1, true, true, true>,
         variant_wg<64, true, 1, 64, 2, 0, true>, 1},
        {"attention v37 pingpong+st+LPT", variant_wg<128, true, 2, 128, 1, 1, true, false, true>,
         variant_wg<64, true, 2, 128, 1, 1, true, false, true>, 1},
    };
    const int NV = sizeof vars / sizeof vars[0];
    int ok[NV], bad = 0;
    int sel[NV];
    for (int i = 0; i < NV; i++) {
        sel[i] = selected(vars[i].name);
        if (!sel[i]) { ok[i] = 1; continue; }
        ok[i] = vars[i].f128 ? validate(vars[i].name, vars[i].f128, 128) : 1;
        ok[i] &= validate(vars[i].name, vars[i].f64, 64);
        bad += !ok[i];
    }
    int32_t cu[8200];
    const int T = 8192;
    int nd_ln = make_docs(cu, T, 1024, 4096, 42);
    int32_t cu1k[9], cu4k[3], cu8k[2];
    for (int i = 0; i <= 8; i++) cu1k[i] = i * 1024;
    for (int i = 0; i <= 2; i++) cu4k[i] = i * 4096;
    cu8k[0] = 0; cu8k[1] = 8192;
    char lognormal[48];
    snprintf(lognormal, sizeof lognormal, "%d docs 1-4K lognormal", nd_ln);
    double tf[NV][5];
    for (int i = 0; i < NV; i++) {
        tf[i][0] = tf[i][1] = tf[i][2] = tf[i][3] = tf[i][4] = 0;
        if (!ok[i] || !sel[i]) continue;
        if (vars[i].f128) {
            tf[i][0] = bench(vars[i].name, vars[i].f128, 128, lognormal, cu, nd_ln, T, 32, 8);
            if (vars[i].all) {
                tf[i][1] = bench(vars[i].name, vars[i].f128, 128, "8 docs x 1024", cu1k, 8, T, 32, 8);
                tf[i][2] = bench(vars[i].name, vars[i].f128, 128, "2 docs x 4096", cu4k, 2, T, 32, 8);
                tf[i][3] = bench(vars[i].name, vars[i].f128, 128, "1 doc x 8192", cu8k, 1, T, 32, 8);
            }
        }
        if (vars[i].all || !vars[i].f128) tf[i][4] = bench(vars[i].name, vars[i].f64, 64, lognormal, cu, nd_ln, T, 32, 8);
    }
    printf("\nsummary, TFLOP/s (T=8192, 32/8 heads; target 350 at HD 128 on 1-4K docs; 0.0 = not run)\n");
    printf("%-34s %10s %8s %8s %8s %10s\n", "variant", "HD128 ln", "8x1024", "2x4096", "1x8192", "HD64 ln");
    for (int i = 0; i < NV; i++) {
        if (!sel[i]) continue;
        if (!ok[i]) { printf("%-34s FAILED validation, not timed\n", vars[i].name); continue; }
        printf("%-34s %10.1f %8.1f %8.1f %8.1f %10.1f\n", vars[i].name, tf[i][0], tf[i][1], tf[i][2], tf[i][3],
               tf[i][4]);
    }
    printf("library default: v%d (the library's only kernel at HD 64 and 128; other variants: bench only)\n",
           ATTENTION_DEFAULT_KERNEL);
    {   /* the other head dims: attention_forward runs kernels/attention_mma.cu there (mma.sync, 4 warps x 16
         * rows, 64-key tiles; 32 at HD 256). HD 256 with Qwen3.6-27B's 24 / 4 heads, HD 16 (the demo's) with
         * 32 / 8. DFLASH_ATTENTION_BENCH=0 runs only these rows. */
        const char *e = getenv("DFLASH_ATTENTION_BENCH");
        if (!e || !*e || strchr(e, '0') == e) {
            printf("\nother head dims (library attention_forward -> kernels/attention_mma.cu), TFLOP/s:\n");
            const int hds[3] = {256, 32, 16};
            const att_fn fns[3] = {lib_forward<256>, lib_forward<32>, lib_forward<16>};
            for (int i = 0; i < 3; i++) {
                char name[64];
                snprintf(name, sizeof name, "attention mma.sync HD%d", hds[i]);
                if (!validate(name, fns[i], hds[i])) { bad++; continue; }
                const int nh = hds[i] == 256 ? 24 : 32, nkv = hds[i] == 256 ? 4 : 8;
                const double a = bench(name, fns[i], hds[i], lognormal, cu, nd_ln, T, nh, nkv);
                const double b = bench(name, fns[i], hds[i], "1 doc x 8192", cu8k, 1, T, nh, nkv);
                printf("%-34s HD %d heads %d/%d: %.1f (1-4K lognormal), %.1f (1 x 8192)\n", name, hds[i], nh, nkv, a, b);
            }
        }
    }
    return bad ? 1 : 0;
}
