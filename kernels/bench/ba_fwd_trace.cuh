/*
 * kernels/bench/ba_fwd_trace.cuh — the set 7 forward's per-CTA phase trace and its plan path's numbers (bench
 * only), included by kernels/bench/block_attn_bench.cu, which calls ba_fwd_trace_report() at the end of main when
 * BA_FWD_TRACE=1.
 *
 * Runs ba_wg_forward_traced (kernels/bench/block_attn_wg_bench.cuh: the kernel BA_BENCH_WG_FWD picks, built with
 * %globaltimer / clock64 stamps per CTA) once after two untraced warm-ups, without and with the plan workspace
 * (block_attn_forward_ws; name suffix "+ws"), and prints lines starting with "TRACE": per-CTA phase times
 * (set-up = entry to Q + set-up done, loop, epilogue; mean / median), the per-tile wait (cp.async wait +
 * barrier; clock64 cycles converted with each CTA's own cycles-per-ns), the SMs' busy fraction (sum of CTA
 * durations / (#SMs × kernel span)), the gaps between consecutive CTAs on one SM, and the tail (kernel end
 * minus the median SM's last CTA end). The stamps add a few instructions per tile, so the traced kernel is
 * slightly slower than the timed one (span printed). With the plan, the first CTAs start (PDL) before the plan
 * ends: their set-up includes that wait, and the span does not include the plan kernels.
 *
 * "TRACE ws": the calls of block_attn_forward and block_attn_forward_ws (whole calls: plan kernels included;
 * the kernel BA_BENCH_WG_FWD picks) timed alternately, L2 flushed before each, medians of 10 after 3 warm-ups each, TFLOP/s on the
 * visible pairs as the bench counts them.
 *
 * Then bitwise checks (all N blocks, not only the 32 anchors the bench validates): the selected value without
 * and with the workspace and the default with the workspace, each against the default without it (the
 * variable unset, no workspace), out and lse; the same on 11 small / awkward shapes (bft_shape_check: odd n_kv,
 * B 1..64, d_h 64, windows, padding anchors, interleaved documents). Every path does the same per-row arithmetic
 * in the same order ("3" differs from the default only in how masks are computed), so bitwise equality is
 * expected; the default itself is validated against the CPU reference by the bench and the GPU test.
 * Overwrites out / lse.
 */
#ifndef KERNELS_BENCH_BA_FWD_TRACE_CUH
#define KERNELS_BENCH_BA_FWD_TRACE_CUH
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

static double bft_median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
static double bft_mean(const std::vector<double> &v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / v.size();
}

/* The selected kernel, without and with the plan workspace, and the default with it, against the default
 * without it, on small and awkward shapes (odd n_kv, B up to 64, d_h 64,
 * windows, interleaved documents that take the doc-id path, padding anchors), bitwise, random data. Prints
 * one TRACE line; returns the number of shapes that differ or fail. */
static int bft_shape_check(const std::string &name) {
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
    const char *sel = getenv("BA_BENCH_WG_FWD");
    const std::string keep = sel ? sel : "";
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
        std::vector<bf16> o[4];
        std::vector<float> l[4];
        bool ok = true;
        /* run 0: the default, 1: the selected value, 2: the selected value with the workspace, 3: the default
         * with the workspace */
        for (int run = 0; run < 4 && ok; run++) {
            if (run == 0 || run == 3) unsetenv("BA_BENCH_WG_FWD");
            else if (sel) setenv("BA_BENCH_WG_FWD", keep.c_str(), 1);
            cudaMemset(dout, 0xff, nq * 2);
            cudaMemset(dl, 0xff, nl * 4);
            const int rc = ba_bench_wg_forward(&c, dq, dk, dv, da, dd, dout, dl, run >= 2 ? ws : NULL, 0);
            const cudaError_t e = cudaDeviceSynchronize();
            if (rc || e != cudaSuccess) {
                printf("TRACE %s shape %d: run %d failed: %s\n", name.c_str(), si, run,
                       rc ? kernels_error() : cudaGetErrorString(e));
                ok = false;
                break;
            }
            o[run].resize(nq);
            l[run].resize(nl);
            cudaMemcpy(o[run].data(), dout, nq * 2, cudaMemcpyDeviceToHost);
            cudaMemcpy(l[run].data(), dl, nl * 4, cudaMemcpyDeviceToHost);
        }
        if (sel) setenv("BA_BENCH_WG_FWD", keep.c_str(), 1);
        for (int run = 1; run < 4 && ok; run++)
            ok = !memcmp(o[0].data(), o[run].data(), nq * 2) && !memcmp(l[0].data(), l[run].data(), nl * 4);
        if (!ok) {
            bad++;
            which += " " + std::to_string(si);
        }
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dl); cudaFree(da); cudaFree(dd); cudaFree(ws);
    }
    printf("TRACE %s shape check vs default (%d shapes x {value, value+ws, default+ws}, bitwise): %s%s\n", name.c_str(),
           ns, bad ? "DIFFERS in" : "all equal", which.c_str());
    return bad;
}

/* One traced run (after two warm-ups) of the selected kernel, ws NULL or the plan workspace; prints the TRACE
 * phase lines under name and returns the compact summary ("" and a TRACE line on failure). */
static std::string bft_trace(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *a,
                             const int32_t *doc, bf16 *o, float *l, void *ws, const std::string &name) {
    int n_cta = 0;
    if (ba_wg_forward_traced(c, q, k, v, a, doc, o, l, ws, NULL, &n_cta, 0)) {
        printf("TRACE %s: %s\n", name.c_str(), kernels_error());
        return "";
    }
    const int S = 32;   /* u64 per CTA: the layout of ba_wg_forward_traced (kernels/bench/block_attn_wg_bench.cuh) */
    unsigned long long *d_tr = NULL;
    if (cudaMalloc(&d_tr, (size_t)n_cta * S * 8) != cudaSuccess) {
        printf("TRACE %s: cudaMalloc failed\n", name.c_str());
        return "";
    }
    cudaMemset(d_tr, 0, (size_t)n_cta * S * 8);
    int rc = 0;
    for (int it = 0; it < 3 && !rc; it++)   /* two warm-ups, then the traced run (the last one) */
        rc = ba_wg_forward_traced(c, q, k, v, a, doc, o, l, ws, d_tr, &n_cta, 0);
    cudaError_t e = cudaDeviceSynchronize();
    if (rc || e != cudaSuccess) {
        printf("TRACE %s: run failed: %s\n", name.c_str(), rc ? kernels_error() : cudaGetErrorString(e));
        cudaFree(d_tr);
        return "";
    }
    std::vector<unsigned long long> tr((size_t)n_cta * S);
    cudaMemcpy(tr.data(), d_tr, tr.size() * 8, cudaMemcpyDeviceToHost);
    cudaFree(d_tr);
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);

    unsigned long long t_min = ~0ull, t_max = 0;
    std::vector<double> setup, loop, epi, tot, per_tile, wait_tile, wait_frac, epi_spread, ghz;
    double wg_part[3][4] = {};   /* per warpgroup, µs per tile summed over CTAs: cp.async wait, barrier, load issue, S wait */
    double wg_tiles = 0;
    double busy = 0, tiles = 0;
    std::vector<std::vector<std::pair<unsigned long long, unsigned long long>>> per_sm(1024);   /* by %smid (not necessarily dense) */
    for (int i = 0; i < n_cta; i++) {
        const unsigned long long *r = &tr[(size_t)i * S];
        if (!r[1] || !r[4]) continue;
        t_min = std::min(t_min, r[1]);
        unsigned long long end = r[4];
        for (int w = 1; w < 3; w++) end = std::max(end, r[11 + w]);
        t_max = std::max(t_max, end);
        const double cpn = r[4] > r[1] ? (double)(r[6] - r[5]) / (double)(r[4] - r[1]) : 1.0;   /* cycles per ns */
        ghz.push_back(cpn);
        setup.push_back((r[2] - r[1]) * 1e-3);
        loop.push_back((r[3] - r[2]) * 1e-3);
        epi.push_back((end - r[3]) * 1e-3);
        epi_spread.push_back((end - r[4]) * 1e-3);
        tot.push_back((end - r[1]) * 1e-3);
        busy += (double)(end - r[1]);
        const double nt = (double)r[7];
        tiles += nt;
        double wmean = 0;
        int nw = 0;
        for (int w = 0; w < 3; w++)
            if (r[8 + w]) wmean += r[8 + w], nw++;
        wmean = nw ? wmean / nw / cpn * 1e-3 : 0;   /* µs per CTA, mean over its warpgroups */
        if (nt > 0) {
            for (int w = 0; w < 3; w++) {
                const double u = 1e-3 / cpn;   /* µs per cycle */
                wg_part[w][0] += r[16 + w] * u;
                wg_part[w][1] += r[19 + w] * u;
                wg_part[w][2] += (r[8 + w] > r[16 + w] + r[19 + w] ? r[8 + w] - r[16 + w] - r[19 + w] : 0) * u;
                wg_part[w][3] += r[22 + w] * u;
            }
            wg_tiles += nt;
            per_tile.push_back((r[3] - r[2]) * 1e-3 / nt);
            wait_tile.push_back(wmean / nt);
            wait_frac.push_back(r[3] > r[2] ? wmean / ((r[3] - r[2]) * 1e-3) : 0);
        }
        const unsigned sm = (unsigned)r[0];
        if (sm < per_sm.size()) per_sm[sm].push_back({r[1], end});
    }
    const double span = (t_max - t_min) * 1e-3;
    std::vector<double> gaps, first, last;
    for (auto &v2 : per_sm) {
        if (v2.empty()) continue;
        std::sort(v2.begin(), v2.end());
        first.push_back((v2.front().first - t_min) * 1e-3);
        last.push_back((v2.back().second - t_min) * 1e-3);
        for (size_t j = 1; j < v2.size(); j++)
            gaps.push_back(((double)v2[j].first - (double)v2[j - 1].second) * 1e-3);
    }
    std::vector<double> cnt;
    for (auto &v2 : per_sm)
        if (!v2.empty()) cnt.push_back((double)v2.size());
    if (cnt.empty()) cnt.push_back(0);
    printf("TRACE %s: %d CTAs on %d SMs (CTAs per SM: min %.0f median %.0f max %.0f), %.1f tiles per CTA, traced span "
           "%.1f us, clock %.2f GHz\n",
           name.c_str(), n_cta, n_sm, *std::min_element(cnt.begin(), cnt.end()), bft_median(cnt),
           *std::max_element(cnt.begin(), cnt.end()), tiles / std::max<size_t>(1, tot.size()), span, bft_median(ghz));
    printf("TRACE %s per CTA (us, mean/median): total %.2f/%.2f  setup+Q %.2f/%.2f  loop %.2f/%.2f  epilogue %.2f/%.2f "
           "(wg spread %.2f)\n",
           name.c_str(), bft_mean(tot), bft_median(tot), bft_mean(setup), bft_median(setup), bft_mean(loop),
           bft_median(loop), bft_mean(epi), bft_median(epi), bft_mean(epi_spread));
    printf("TRACE %s per tile (us, mean/median): loop %.3f/%.3f  wait %.3f/%.3f  (wait = %.0f%% of the loop)\n",
           name.c_str(), bft_mean(per_tile), bft_median(per_tile), bft_mean(wait_tile), bft_median(wait_tile),
           100.0 * bft_mean(wait_frac));
    if (wg_tiles > 0)   /* where each warpgroup's per-tile time goes (thread 0 of each; µs per tile) */
        for (int w = 0; w < 3; w++)
            printf("TRACE %s wg%d per tile (us): cp.async wait %.3f  barrier %.3f  load issue %.3f  S wait %.3f\n",
                   name.c_str(), w, wg_part[w][0] / wg_tiles, wg_part[w][1] / wg_tiles, wg_part[w][2] / wg_tiles,
                   wg_part[w][3] / wg_tiles);
    printf("TRACE %s SMs busy %.1f%% of #SMs x span; gap between CTAs on an SM (us) mean %.2f median %.2f max %.2f; "
           "SM first start median %.2f max %.2f; SM last end min %.1f median %.1f (tail %.1f us)\n",
           name.c_str(), 100.0 * busy * 1e-3 / ((double)n_sm * span), bft_mean(gaps), bft_median(gaps),
           gaps.empty() ? 0 : *std::max_element(gaps.begin(), gaps.end()), bft_median(first),
           first.empty() ? 0 : *std::max_element(first.begin(), first.end()),
           last.empty() ? 0 : *std::min_element(last.begin(), last.end()), bft_median(last), span - bft_median(last));

    char sum[512];   /* the compact line printed last */
    snprintf(sum, sizeof sum,
             "span %.0fus CTA setup %.2f loop %.2f epi %.2f us, tile %.2f us wait %.0f%%, busy %.0f%%, gap %.2f us, tail %.1f us",
             span, bft_mean(setup), bft_mean(loop), bft_mean(epi), bft_mean(per_tile), 100.0 * bft_mean(wait_frac),
             100.0 * busy * 1e-3 / ((double)n_sm * span), bft_mean(gaps), span - bft_median(last));
    return sum;
}

/* Visible (query, key) pairs over all query heads, as the bench counts them (FLOPs = 4·d_h per pair). */
static double bft_pairs(const block_attn_config *c, const int32_t *d_a, const int32_t *d_doc) {
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

/* out / lse of one call into o_h / l_h (ws NULL: block_attn_forward's path); the selected value, or the default
 * when dflt. 0 or -1. */
static int bft_run(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *a,
                   const int32_t *doc, bf16 *o, float *l, void *ws, bool dflt, std::vector<bf16> &o_h,
                   std::vector<float> &l_h) {
    const char *sel = getenv("BA_BENCH_WG_FWD");
    const std::string keep = sel ? sel : "";
    if (dflt) unsetenv("BA_BENCH_WG_FWD");
    const size_t R = (size_t)c->N * c->B, nq = R * c->n_h * c->d_h, nl = R * c->n_h;
    cudaMemset(o, 0xff, nq * 2);
    cudaMemset(l, 0xff, nl * 4);
    const int rc = ba_bench_wg_forward(c, q, k, v, a, doc, o, l, ws, 0);
    if (sel) setenv("BA_BENCH_WG_FWD", keep.c_str(), 1);
    const cudaError_t e = cudaDeviceSynchronize();
    if (rc || e != cudaSuccess) return -1;
    o_h.resize(nq);
    l_h.resize(nl);
    cudaMemcpy(o_h.data(), o, nq * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(l_h.data(), l, nl * 4, cudaMemcpyDeviceToHost);
    return 0;
}

static void ba_fwd_trace_report(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *a, const int32_t *doc, bf16 *o, float *l) {
    const char *sel = getenv("BA_BENCH_WG_FWD");
    const std::string name = sel && sel[0] ? sel : "default";
    const size_t wsb = block_attn_forward_workspace_bytes(c);
    void *ws = NULL, *flush = NULL;
    if (cudaMalloc(&ws, wsb) != cudaSuccess || cudaMalloc(&flush, 256 << 20) != cudaSuccess) {
        printf("TRACE SUMMARY %s: cudaMalloc failed\n", name.c_str());
        return;
    }
    cudaMemset(ws, 0xab, wsb);   /* garbage: the plan must write everything it reads */
    const std::string sum0 = bft_trace(c, q, k, v, a, doc, o, l, NULL, name);
    const std::string sum1 = bft_trace(c, q, k, v, a, doc, o, l, ws, name + "+ws");

    /* block_attn_forward against block_attn_forward_ws, whole calls, alternately, L2 flushed before each */
    std::vector<double> ms[2];
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    bool tok = true;
    for (int it = 0; it < 13 && tok; it++)
        for (int w = 0; w < 2 && tok; w++) {
            cudaMemset(flush, it, 256 << 20);
            cudaEventRecord(e0, 0);
            const int rc = ba_bench_wg_forward(c, q, k, v, a, doc, o, l, w ? ws : NULL, 0);   /* as the public entries */
            cudaEventRecord(e1, 0);
            tok = !rc && cudaEventSynchronize(e1) == cudaSuccess;
            float t = 0;
            cudaEventElapsedTime(&t, e0, e1);
            if (it >= 3) ms[w].push_back(t);
        }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    const double pairs = bft_pairs(c, a, doc), fl = pairs * c->d_h * 4.0;
    char tline[256];
    if (tok)
        snprintf(tline, sizeof tline, "block_attn_forward %.3f ms %.1f TFLOP/s, _ws %.3f ms %.1f TFLOP/s (x%.3f)",
                 bft_median(ms[0]), fl / bft_median(ms[0]) / 1e9, bft_median(ms[1]), fl / bft_median(ms[1]) / 1e9,
                 bft_median(ms[0]) / bft_median(ms[1]));
    else
        snprintf(tline, sizeof tline, "timing FAILED: %s", kernels_error());
    printf("TRACE ws %s: %s\n", name.c_str(), tline);

    /* full-size bitwise checks against the default without the workspace */
    std::vector<bf16> o0, o1;
    std::vector<float> l0, l1;
    std::string eq;
    if (bft_run(c, q, k, v, a, doc, o, l, NULL, true, o0, l0)) {
        eq = "default run FAILED";
    } else {
        static const char *const what[3] = {"value", "value+ws", "default+ws"};
        for (int r = 0; r < 3; r++) {
            if (bft_run(c, q, k, v, a, doc, o, l, r ? ws : NULL, r == 2, o1, l1)) {
                eq += std::string(eq.empty() ? "" : ", ") + what[r] + " FAILED";
                continue;
            }
            size_t dO = 0, dL = 0;
            for (size_t i = 0; i < o0.size(); i++) dO += memcmp(&o0[i], &o1[i], 2) != 0;
            for (size_t i = 0; i < l0.size(); i++) dL += memcmp(&l0[i], &l1[i], 4) != 0;
            char b[128];
            snprintf(b, sizeof b, "%s%s %s", eq.empty() ? "" : ", ", what[r], dO || dL ? "DIFF" : "eq");
            eq += b;
            if (dO || dL) printf("TRACE %s full-size: %s differs (out %zu of %zu, lse %zu of %zu)\n", name.c_str(),
                                 what[r], dO, o0.size(), dL, l0.size());
        }
    }
    printf("TRACE %s full-size vs default (all %d blocks, bitwise): %s\n", name.c_str(), c->N, eq.c_str());
    const int bad = bft_shape_check(name);
    cudaFree(ws);
    cudaFree(flush);
    printf("TRACE SUMMARY %s: %s\n", name.c_str(), sum0.c_str());
    printf("TRACE SUMMARY %s+ws: %s\n", name.c_str(), sum1.c_str());
    printf("TRACE SUMMARY %s ws: %s; full-size %s; shapes %s\n", name.c_str(), tline, eq.c_str(), bad ? "DIFF" : "eq");
}
#endif
