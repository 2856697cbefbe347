/*
 * kernels/bench/ba_fwd_plan.cuh — the set 7 forward's plan path (block_attn_forward_ws) against its in-kernel
 * set-up (bench only), included by kernels/bench/block_attn_bench.cu, which calls ba_fwd_plan_report() at the end
 * of main when BA_FWD_PLAN=1.
 *
 * "PLAN ws": the library's wgmma forward (ba_wg_forward_ws) without and with the plan workspace, whole calls (plan
 * kernels included), timed alternately, L2 flushed before each, medians of 10 after 3 warm-ups each, TFLOP/s on
 * the visible pairs as the bench counts them.
 *
 * Then bitwise checks (all N blocks, not only the 32 anchors the bench validates): with the workspace against
 * without it, out and lse; the same on 11 small / awkward shapes (bfp_shape_check: odd n_kv, B 1..64, d_h 64,
 * windows, padding anchors, interleaved documents). Both paths do the same per-row arithmetic in the same order,
 * so bitwise equality is expected; the path without the workspace is validated against the CPU reference by the
 * bench and the GPU test. Overwrites out / lse.
 */
#ifndef KERNELS_BENCH_BA_FWD_PLAN_CUH
#define KERNELS_BENCH_BA_FWD_PLAN_CUH
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "kernels/block_attn.h"
#include "kernels/block_attn_wg.h"

static double bfp_median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

/* The plan path against the in-kernel set-up on small and awkward shapes (odd n_kv, B up to 64, d_h 64,
 * windows, interleaved documents that take the doc-id path, padding anchors), bitwise, random data. Prints
 * one PLAN line; returns the number of shapes that differ or fail. */
static int bfp_shape_check() {
    struct shp { block_attn_config c; int doclen, interleave; };
    const shp shapes[] = {
        {{97, 5, 16, 4, 2, 64, 0, 0, 0}, 30, 0},        {{97, 5, 16, 4, 2, 64, 32, 1, 0}, 30, 0},
        {{97, 7, 8, 8, 2, 128, 40, 0, 0}, 50, 0},       {{1, 1, 1, 2, 1, 128, 0, 1, 0}, 1, 0},
        {{1025, 37, 16, 32, 8, 128, 0, 0, 0}, 200, 0},  {{97, 5, 32, 2, 1, 64, 0, 1, 0}, 30, 0},
        {{130, 3, 64, 1, 1, 64, 48, 1, 0}, 40, 0},      {{600, 20, 16, 12, 3, 128, 256, 1, 0}, 150, 0},
        {{2048, 64, 16, 32, 8, 128, 2048, 1, 0}, 3, 1}, {{2048, 61, 16, 24, 6, 128, 512, 1, 0}, 300, 0},
        {{3000, 40, 16, 32, 8, 64, 1024, 0, 0}, 700, 0},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    int bad = 0;
    std::string which;
    uint64_t rng = 7;
    for (int si = 0; si < ns; si++) {
        block_attn_config c = shapes[si].c;
        c.scale = 1.0f / sqrtf((float)c.d_h);
        const size_t R = (size_t)c.N * c.B, nq = R * c.n_h * c.d_h, nk = ((size_t)c.T + R) * c.n_kv * c.d_h;
        const size_t nl = R * c.n_h;
        std::vector<int32_t> doc(c.T), anc(c.N);
        int id = 0, left = 0;
        for (int p = 0; p < c.T; p++) {
            if (shapes[si].interleave) {
                doc[p] = p >= c.T - 40 ? -1 : (int)(kernels_rng_next(&rng) % shapes[si].doclen);
            } else {
                if (left == 0) { left = 1 + (int)(kernels_rng_next(&rng) % (2 * shapes[si].doclen)); id++; }
                left--;
                doc[p] = p >= c.T - c.T / 10 && c.T > 10 ? -1 : id;
            }
        }
        for (int b = 0; b < c.N; b++) anc[b] = b % 7 == 6 ? 0 : (int)(kernels_rng_next(&rng) % c.T);   /* some padding */
        std::sort(anc.begin(), anc.end());
        std::vector<bf16> hq(nq), hk(nk), hv(nk);
        for (auto &x : hq) x = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 8388608.0 - 1.0));
        for (auto &x : hk) x = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 8388608.0 - 1.0));
        for (auto &x : hv) x = float_to_bf16((float)((kernels_rng_next(&rng) >> 40) / 8388608.0 - 1.0));
        bf16 *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
        float *dl = NULL;
        int32_t *da = NULL, *dd = NULL;
        cudaMalloc(&dq, nq * 2); cudaMalloc(&dk, nk * 2); cudaMalloc(&dv, nk * 2); cudaMalloc(&dout, nq * 2);
        cudaMalloc(&dl, nl * 4); cudaMalloc(&da, 4 * (size_t)c.N); cudaMalloc(&dd, 4 * (size_t)c.T);
        cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dk, hk.data(), nk * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dv, hv.data(), nk * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(da, anc.data(), 4 * (size_t)c.N, cudaMemcpyHostToDevice);
        cudaMemcpy(dd, doc.data(), 4 * (size_t)c.T, cudaMemcpyHostToDevice);
        const size_t wsb = block_attn_forward_workspace_bytes(&c);
        void *ws = NULL;
        cudaMalloc(&ws, wsb);
        cudaMemset(ws, 0xab, wsb);   /* garbage: the plan must write everything it reads */
        std::vector<bf16> o[2];
        std::vector<float> l[2];
        bool ok = true;
        for (int run = 0; run < 2 && ok; run++) {   /* run 0: no workspace, 1: the plan workspace */
            cudaMemset(dout, 0xff, nq * 2);
            cudaMemset(dl, 0xff, nl * 4);
            const int rc = ba_wg_forward_ws(&c, dq, dk, dv, da, dd, dout, dl, run ? ws : NULL, 0);
            const cudaError_t e = cudaDeviceSynchronize();
            if (rc || e != cudaSuccess) {
                printf("PLAN shape %d: run %d failed: %s\n", si, run, rc ? kernels_error() : cudaGetErrorString(e));
                ok = false;
                break;
            }
            o[run].resize(nq);
            l[run].resize(nl);
            cudaMemcpy(o[run].data(), dout, nq * 2, cudaMemcpyDeviceToHost);
            cudaMemcpy(l[run].data(), dl, nl * 4, cudaMemcpyDeviceToHost);
        }
        if (ok) ok = !memcmp(o[0].data(), o[1].data(), nq * 2) && !memcmp(l[0].data(), l[1].data(), nl * 4);
        if (!ok) {
            bad++;
            which += " " + std::to_string(si);
        }
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dl); cudaFree(da); cudaFree(dd); cudaFree(ws);
    }
    printf("PLAN shape check, with vs without the workspace (%d shapes, bitwise): %s%s\n", ns,
           bad ? "DIFFERS in" : "all equal", which.c_str());
    return bad;
}

/* Visible (query, key) pairs over all query heads, as the bench counts them (FLOPs = 4·d_h per pair). */
static double bfp_pairs(const block_attn_config *c, const int32_t *d_a, const int32_t *d_doc) {
    std::vector<int32_t> an(c->N), dc(c->T);
    cudaMemcpy(an.data(), d_a, 4 * (size_t)c->N, cudaMemcpyDeviceToHost);
    cudaMemcpy(dc.data(), d_doc, 4 * (size_t)c->T, cudaMemcpyDeviceToHost);
    double pairs = 0;
    for (int b = 0; b < c->N; b++) {
        const int a = an[b], d = dc[a];
        int ctx = 0;
        for (int p = c->window > 0 ? std::max(0, a - c->window) : 0; p < a && d != -1; p++) ctx += dc[p] == d;
        for (int j = 0; j < c->B; j++) pairs += ctx + (c->causal ? j + 1 : c->B);
    }
    return pairs * c->n_h;
}

/* out / lse of one call into o_h / l_h (ws NULL: the in-kernel set-up). 0 or -1. */
static int bfp_run(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *a,
                   const int32_t *doc, bf16 *o, float *l, void *ws, std::vector<bf16> &o_h, std::vector<float> &l_h) {
    const size_t R = (size_t)c->N * c->B, nq = R * c->n_h * c->d_h, nl = R * c->n_h;
    cudaMemset(o, 0xff, nq * 2);
    cudaMemset(l, 0xff, nl * 4);
    const int rc = ba_wg_forward_ws(c, q, k, v, a, doc, o, l, ws, 0);
    const cudaError_t e = cudaDeviceSynchronize();
    if (rc || e != cudaSuccess) return -1;
    o_h.resize(nq);
    l_h.resize(nl);
    cudaMemcpy(o_h.data(), o, nq * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(l_h.data(), l, nl * 4, cudaMemcpyDeviceToHost);
    return 0;
}

static void ba_fwd_plan_report(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                               const int32_t *a, const int32_t *doc, bf16 *o, float *l) {
    const size_t wsb = block_attn_forward_workspace_bytes(c);
    void *ws = NULL, *flush = NULL;
    if (cudaMalloc(&ws, wsb) != cudaSuccess || cudaMalloc(&flush, 256 << 20) != cudaSuccess) {
        printf("PLAN SUMMARY: cudaMalloc failed\n");
        return;
    }
    cudaMemset(ws, 0xab, wsb);   /* garbage: the plan must write everything it reads */

    /* without against with the workspace, whole calls, alternately, L2 flushed before each */
    std::vector<double> ms[2];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    bool tok = true;
    for (int it = 0; it < 13 && tok; it++)
        for (int w = 0; w < 2 && tok; w++) {
            cudaMemset(flush, it, 256 << 20);
            cudaEventRecord(e0, 0);
            const int rc = ba_wg_forward_ws(c, q, k, v, a, doc, o, l, w ? ws : NULL, 0);   /* as the public entries */
            cudaEventRecord(e1, 0);
            tok = !rc && cudaEventSynchronize(e1) == cudaSuccess;
            float t = 0;
            cudaEventElapsedTime(&t, e0, e1);
            if (it >= 3) ms[w].push_back(t);
        }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    const double pairs = bfp_pairs(c, a, doc), fl = pairs * c->d_h * 4.0;
    char tline[256];
    if (tok)
        snprintf(tline, sizeof tline, "block_attn_forward %.3f ms %.1f TFLOP/s, _ws %.3f ms %.1f TFLOP/s (x%.3f)",
                 bfp_median(ms[0]), fl / bfp_median(ms[0]) / 1e9, bfp_median(ms[1]), fl / bfp_median(ms[1]) / 1e9,
                 bfp_median(ms[0]) / bfp_median(ms[1]));
    else
        snprintf(tline, sizeof tline, "timing FAILED: %s", kernels_error());
    printf("PLAN ws: %s\n", tline);

    /* full-size bitwise check: with the workspace against without it */
    std::vector<bf16> o0, o1;
    std::vector<float> l0, l1;
    std::string eq;
    if (bfp_run(c, q, k, v, a, doc, o, l, NULL, o0, l0)) {
        eq = "run without the workspace FAILED";
    } else if (bfp_run(c, q, k, v, a, doc, o, l, ws, o1, l1)) {
        eq = "run with the workspace FAILED";
    } else {
        size_t dO = 0, dL = 0;
        for (size_t i = 0; i < o0.size(); i++) dO += memcmp(&o0[i], &o1[i], 2) != 0;
        for (size_t i = 0; i < l0.size(); i++) dL += memcmp(&l0[i], &l1[i], 4) != 0;
        eq = dO || dL ? "DIFF" : "eq";
        if (dO || dL) printf("PLAN full-size: with the workspace differs (out %zu of %zu, lse %zu of %zu)\n", dO, o0.size(),
                             dL, l0.size());
    }
    printf("PLAN full-size, with vs without the workspace (all %d blocks, bitwise): %s\n", c->N, eq.c_str());
    const int bad = bfp_shape_check();
    cudaFree(ws);
    cudaFree(flush);
    printf("PLAN SUMMARY: %s; full-size %s; shapes %s\n", tline, eq.c_str(), bad ? "DIFF" : "eq");
}
#endif
