/*
 * kernels/bench/ba_fwd_trace.cuh — the set 7 forward's per-CTA phase trace (bench only), included by
 * kernels/bench/block_attn_bench.cu, which calls ba_fwd_trace_report() at the end of main when BA_FWD_TRACE=1.
 *
 * Runs ba_wg_forward_traced (kernels/block_attn_wg.h: the kernel DFLASH_BLOCK_ATTN_WG_FWD picks, built with
 * %globaltimer / clock64 stamps per CTA) once after two untraced warm-ups, and prints lines starting with
 * "TRACE": per-CTA phase times (set-up = entry to Q + set-up done, loop, epilogue; mean / median), the
 * per-tile wait (cp.async wait + barrier, or the mbarrier waits; clock64 cycles converted with each CTA's own
 * cycles-per-ns), the SMs' busy fraction (sum of CTA durations / (#SMs × kernel span)), the gaps between
 * consecutive CTAs on one SM, and the tail (kernel end minus the median SM's last CTA end). The stamps add a
 * few instructions per tile, so the traced kernel is slightly slower than the timed one (span printed).
 *
 * Then a full-size check (all N blocks, not only the 32 anchors the bench validates): the selected kernel's
 * out and lse against the default's ("3x", the variable unset for that call), bitwise, and the same on 11
 * small / awkward shapes (bft_shape_check: odd n_kv, B 1..64, d_h 64, windows, padding anchors, interleaved
 * documents). Candidates 10 .. 15 do the same per-row arithmetic in the same order, so bitwise equality is
 * expected; the default itself is validated against the CPU reference by the GPU test. Overwrites out / lse.
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

/* The selected kernel against the default ("3x") on small and awkward shapes (odd n_kv, B up to 64, d_h 64,
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
    const char *sel = getenv("DFLASH_BLOCK_ATTN_WG_FWD");
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
        std::vector<bf16> o[2];
        std::vector<float> l[2];
        bool ok = true;
        for (int run = 0; run < 2 && ok; run++) {   /* run 0: the default, 1: the selected value */
            if (run == 0) unsetenv("DFLASH_BLOCK_ATTN_WG_FWD");
            else if (sel) setenv("DFLASH_BLOCK_ATTN_WG_FWD", keep.c_str(), 1);
            cudaMemset(dout, 0xff, nq * 2);
            cudaMemset(dl, 0xff, nl * 4);
            const int rc = ba_wg_forward(&c, dq, dk, dv, da, dd, dout, dl, 0);
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
        if (sel) setenv("DFLASH_BLOCK_ATTN_WG_FWD", keep.c_str(), 1);
        if (ok) ok = !memcmp(o[0].data(), o[1].data(), nq * 2) && !memcmp(l[0].data(), l[1].data(), nl * 4);
        if (!ok) {
            bad++;
            which += " " + std::to_string(si);
        }
        cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(dout); cudaFree(dl); cudaFree(da); cudaFree(dd);
    }
    printf("TRACE %s shape check vs default (%d shapes, bitwise): %s%s\n", name.c_str(), ns,
           bad ? "DIFFERS in" : "all equal", which.c_str());
    return bad;
}

static void ba_fwd_trace_report(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *a, const int32_t *doc, bf16 *o, float *l) {
    const char *sel = getenv("DFLASH_BLOCK_ATTN_WG_FWD");
    const std::string name = sel && sel[0] ? sel : "3x(default)";
    int n_cta = 0;
    if (ba_wg_forward_traced(c, q, k, v, a, doc, o, l, NULL, &n_cta, 0)) {
        printf("TRACE SUMMARY %s: %s\n", name.c_str(), kernels_error());
        return;
    }
    const int S = 16;
    unsigned long long *d_tr = NULL;
    if (cudaMalloc(&d_tr, (size_t)n_cta * S * 8) != cudaSuccess) {
        printf("TRACE SUMMARY %s: cudaMalloc failed\n", name.c_str());
        return;
    }
    cudaMemset(d_tr, 0, (size_t)n_cta * S * 8);
    int rc = 0;
    for (int it = 0; it < 3 && !rc; it++)   /* two warm-ups, then the traced run (the last one) */
        rc = ba_wg_forward_traced(c, q, k, v, a, doc, o, l, d_tr, &n_cta, 0);
    cudaError_t e = cudaDeviceSynchronize();
    if (rc || e != cudaSuccess) {
        printf("TRACE SUMMARY %s: run failed: %s\n", name.c_str(), rc ? kernels_error() : cudaGetErrorString(e));
        cudaFree(d_tr);
        return;
    }
    std::vector<unsigned long long> tr((size_t)n_cta * S);
    cudaMemcpy(tr.data(), d_tr, tr.size() * 8, cudaMemcpyDeviceToHost);
    cudaFree(d_tr);
    int n_sm = 0;
    cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0);

    unsigned long long t_min = ~0ull, t_max = 0;
    std::vector<double> setup, loop, epi, tot, per_tile, wait_tile, wait_frac, epi_spread, ghz;
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
    /* full-size bitwise check against the default */
    const size_t R = (size_t)c->N * c->B, nq = R * c->n_h * c->d_h, nl = R * c->n_h;
    std::vector<bf16> o1(nq), o2(nq);
    std::vector<float> l1(nl), l2(nl);
    std::string keep = sel ? sel : "";
    unsetenv("DFLASH_BLOCK_ATTN_WG_FWD");
    cudaMemset(o, 0xff, nq * 2);
    cudaMemset(l, 0xff, nl * 4);
    rc = ba_wg_forward(c, q, k, v, a, doc, o, l, 0);
    if (sel) setenv("DFLASH_BLOCK_ATTN_WG_FWD", keep.c_str(), 1);
    e = cudaDeviceSynchronize();
    if (rc || e != cudaSuccess) {
        printf("TRACE %s full-size check: default run failed\n", name.c_str());
        printf("TRACE SUMMARY %s: %s, full-size FAILED\n", name.c_str(), sum);
        return;
    }
    cudaMemcpy(o1.data(), o, nq * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(l1.data(), l, nl * 4, cudaMemcpyDeviceToHost);
    cudaMemset(o, 0xff, nq * 2);
    cudaMemset(l, 0xff, nl * 4);
    rc = ba_wg_forward(c, q, k, v, a, doc, o, l, 0);
    e = cudaDeviceSynchronize();
    if (rc || e != cudaSuccess) {
        printf("TRACE %s full-size check: run failed\n", name.c_str());
        printf("TRACE SUMMARY %s: %s, full-size FAILED\n", name.c_str(), sum);
        return;
    }
    cudaMemcpy(o2.data(), o, nq * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(l2.data(), l, nl * 4, cudaMemcpyDeviceToHost);
    size_t dO = 0, dL = 0;
    for (size_t i = 0; i < nq; i++) dO += memcmp(&o1[i], &o2[i], 2) != 0;
    for (size_t i = 0; i < nl; i++) dL += memcmp(&l1[i], &l2[i], 4) != 0;
    printf("TRACE %s full-size vs default (all %d blocks): %s (out %zu of %zu differ, lse %zu of %zu)\n", name.c_str(),
           c->N, dO || dL ? "DIFFERS" : "bitwise equal", dO, nq, dL, nl);
    const int bad = bft_shape_check(name);
    printf("TRACE SUMMARY %s: %s, full-size %s, shapes %s\n", name.c_str(), sum, dO || dL ? "DIFF" : "eq",
           bad ? "DIFF" : "eq");
}
#endif
