/*
 * kernels/bench/rmsnorm_bench.cu — RMSNorm forward, fused residual forward, backward, and the q/k norm's
 * one-launch pair (kernels/rmsnorm.h).
 *
 * Build: make BUILD=build-rn build-rn/bench/rmsnorm_bench   Run: build-rn/bench/rmsnorm_bench
 * This file includes kernels/rmsnorm_impl.cuh (the library's kernels and launch helpers, no external symbol;
 * the entry points rmsnorm_forward etc. link from the library) and kernels/bench/rmsnorm_variants.cuh, whose
 * bench_backward / bench_qk_backward run the variant chosen by
 * g_rms_var / g_rms_cfg / g_rms_piece. Variants: "def", the library's
 * backward since round 5 (the backward with dw column sums in registers, round 4's "variant 10", shape 2:
 * 512 threads, 1 CTA/SM); "v4" = the previous default backward (K1e: dw sums in
 * shared memory, 3 blocks/SM), bench-only now. The forward is the same under both (timed once). Earlier
 * variants (1-3, 5-9, round 4's shapes 3-4) left the library in round 5: code in git a149d55, numbers in
 * RESULTS.md (runs 1-9). "def shape 1" (bench-only g_rms_cfg = 1: 256 threads, 2/SM) is validated
 * (dw, dx bitwise the default's) and timed beside the default.
 * Each variant is validated against the CPU reference (y, h, rstd, dx, dx+=, dw, dw bitwise repeatable,
 * ticket reset) before it is timed; the default's dx and dx+= are compared bit for bit with v4's
 * ("dx=v4"). Timing: single = one launch after an L2 flush, event-bracketed (bench_ms); stream = NSTREAM
 * = 20 launches back to back on one stream over rotating buffer sets (> 160 MB between two uses of a set,
 * so every launch reads from DRAM), time / 20: the rate inside a training step without the ~3 µs floor of
 * a lone launch. dw pieces (g_rms_piece, timing only, dw wrong): walk (v4 only; "nan" for def) / walk+part /
 * final / no PDL (validated), with dx only and dx+dw: where dw's cost goes. "empty" = one empty launch.
 * The q/k norm (rmsnorm_qk_forward / rmsnorm_qk_backward, q 262144x128 + k 65536x128): y, rstd, dx, dx+=
 * must be bitwise two separate calls'; dw against the reference and repeatable; both tickets reset; then
 * two calls vs one launch, single and stream, for fwd, dx+dw, dx+=,dw, dx only.
 * Bytes counted (bf16 tensors of N·C): forward read x + write y = 2; fused read x, r + write r, y = 4;
 * backward read dy, x + write dx = 3 (dx+= 4). Ceiling ~4.1 TB/s; target >= 80%. The SUMMARY lines
 * close the output (the tail is what gets read), then every FAILED validation (or "all validations ok").
 */
#include "kernels/rmsnorm_impl.cuh"
#include "rmsnorm_variants.cuh"
#include "k1bench.cuh"

#include <math.h>
#include <string.h>
#include <vector>

/* max over i of |got - ref| / (atol + rtol·|ref|): <= 1 passes. */
static double worst(const float *got, const float *ref, size_t n, double atol, double rtol) {
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]) / (atol + rtol * fabs((double)ref[i]));
        if (!(d <= m)) m = d;
    }
    return m;
}
static void down_bf16(float *h, const bf16 *d, size_t n) {
    bf16 *t = (bf16 *)malloc(2 * n + 2);
    BENCH_CUDA(cudaMemcpy(t, d, 2 * n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) h[i] = bf16_to_float(t[i]);
    free(t);
}
static double rms(const float *a, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * a[i];
    return sqrt(s / (n ? n : 1));
}

#define NSTREAM 20   /* launches per stream timing */
#define NMEAS 5
#define NPIECE 6
static const char *piece_names[NPIECE] = {"dx only", "walk", "walk+part", "dx+dw", "final", "no PDL"};
static const char *var_names[2] = {"def", "v4"};   /* g_rms_var 10 / 4 */
struct shape_result {
    int N, C, ok[2];
    double gbs[2][NMEAS];    /* single launch after an L2 flush, GB/s; 0: not timed */
    double sgbs[2][NMEAS];   /* stream timing (NSTREAM launches back to back over rotating sets), GB/s */
    double us[2][NPIECE];    /* dw pieces, microseconds */
    double s1us[2];          /* the default's bench-only shape 1 (g_rms_cfg = 1), dx+dw µs single / stream; -1 failed */
    double empty_us;
    int nsets;
    int dx_same[2];          /* the default's dx (=, +=) bitwise variant 4's: 1, 0, -1 (not compared) */
};

/* Buffer sets for the stream timing: the op's tensors NSTREAM launches rotate over, so that the
 * launches between two uses of a set touch well over the 50 MB L2 and every launch reads from DRAM. */
struct stream_sets {
    int n;
    bf16 *x[64], *dy[64], *dx[64], *r[64], *y[64];
    float *rstd[64];
};

/* Median over reps of (NSTREAM launches back to back on stream 0, fn(k % nsets) for k < NSTREAM,
 * one L2 flush before them, event-bracketed) / NSTREAM, in ms: the op's rate inside a training
 * step, without the per-launch floor of a lone launch. */
template <typename F>
static double stream_ms(F fn, int nsets, int reps = 5) {
    cudaEvent_t a, b;
    BENCH_CUDA(cudaEventCreate(&a));
    BENCH_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < nsets; i++) fn(i);
    BENCH_CUDA(cudaDeviceSynchronize());
    std::vector<float> t;
    for (int i = 0; i < reps; i++) {
        bench_flush_l2();
        BENCH_CUDA(cudaEventRecord(a, 0));
        for (int k = 0; k < NSTREAM; k++) fn(k % nsets);
        BENCH_CUDA(cudaEventRecord(b, 0));
        BENCH_CUDA(cudaEventSynchronize(b));
        float ms;
        BENCH_CUDA(cudaEventElapsedTime(&ms, a, b));
        t.push_back(ms / NSTREAM);
    }
    BENCH_CUDA(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}
static char failed_list[4096];   /* every FAILED validation, repeated at the end of the output */
static int bench_failed;

__global__ void bench_empty_kernel(int) {}

/* a launcher's status as a validation line (a refused launch fails the variant, not the bench) */
static int call_ok(int *ok, const char *what, int rc) {
    if (rc == 0) return 1;
    printf("validate %-40s launch FAILED: %s\n", what, kernels_error());
    snprintf(failed_list + strlen(failed_list), sizeof failed_list - strlen(failed_list), "  %s (launch)\n", what);
    fflush(stdout);
    *ok = 0;
    bench_failed = 1;
    return 0;
}

/* validation line; clears *ok on failure instead of exiting */
static void vcheck(int *ok, const char *what, double err, double tol) {
    printf("validate %-40s max err %.3g (tol %.3g) %s\n", what, err, tol, err <= tol ? "ok" : "FAILED");
    fflush(stdout);
    if (!(err <= tol)) {
        *ok = 0;
        bench_failed = 1;
        snprintf(failed_list + strlen(failed_list), sizeof failed_list - strlen(failed_list), "  %s: max err %.3g\n", what,
                 err);
    }
}

static double timed(const char *name, const char *shp, double bytes, double ms) {
    bench_report_bytes(name, shp, ms, bytes);
    return bytes / (ms * 1e-3) / 1e9;
}

static void set_variant(int v) {
    g_rms_var = v ? 4 : 10;
}

static void one(int N, int C, struct shape_result *res) {
    size_t n = (size_t)N * C;
    float *hx, *hr, *hdy, *hw = (float *)malloc(4 * C);
    bf16 *x = bench_rand_bf16(n, -2, 2, 1, &hx), *r0 = bench_rand_bf16(n, -2, 2, 2, &hr), *dy = bench_rand_bf16(n, -1, 1, 3, &hdy);
    bf16 *y, *dx, *r;
    for (int c = 0; c < C; c++) hw[c] = 0.5f + (float)c / C;
    float *w, *rstd, *dw, *scr;
    BENCH_CUDA(cudaMalloc(&y, 2 * n));
    BENCH_CUDA(cudaMalloc(&r, 2 * n));
    BENCH_CUDA(cudaMalloc(&dx, 2 * n));
    BENCH_CUDA(cudaMalloc(&w, 4 * C));
    BENCH_CUDA(cudaMalloc(&dw, 4 * C));
    BENCH_CUDA(cudaMalloc(&rstd, 4 * (size_t)N));
    BENCH_CUDA(cudaMalloc(&scr, 4 * rmsnorm_backward_scratch_floats(N, C)));
    BENCH_CUDA(cudaMemset(scr, 0, 4 * rmsnorm_backward_scratch_floats(N, C)));   /* once (rmsnorm.h) */
    BENCH_CUDA(cudaMemcpy(w, hw, 4 * C, cudaMemcpyHostToDevice));

    float *ref = (float *)malloc(4 * n), *refh = (float *)malloc(4 * n), *refyh = (float *)malloc(4 * n);
    float *refrs = (float *)malloc(4 * (size_t)N);
    float *got = (float *)malloc(4 * n), *grs = (float *)malloc(4 * (size_t)N), *gdw = (float *)malloc(4 * C);
    float *gdw1 = (float *)malloc(4 * C);
    unsigned short *bits = (unsigned short *)malloc(2 * n), *v4dx = (unsigned short *)malloc(2 * n),
                   *v4dxa = (unsigned short *)malloc(2 * n), *ddx = (unsigned short *)malloc(2 * n),
                   *ddxa = (unsigned short *)malloc(2 * n);
    res->dx_same[0] = res->dx_same[1] = -1;
    struct stream_sets ss;
    {
        double per = 6.0 * (double)n;   /* bytes one backward touches: dy, x read, dx written */
        int k = 1 + (int)ceil(160e6 / per);
        ss.n = k < 2 ? 2 : k > 64 ? 64 : k;
        res->nsets = ss.n;
        for (int i = 0; i < ss.n; i++) {
            BENCH_CUDA(cudaMalloc(&ss.x[i], 2 * n));
            BENCH_CUDA(cudaMalloc(&ss.dy[i], 2 * n));
            BENCH_CUDA(cudaMalloc(&ss.dx[i], 2 * n));
            BENCH_CUDA(cudaMalloc(&ss.r[i], 2 * n));
            BENCH_CUDA(cudaMalloc(&ss.y[i], 2 * n));
            BENCH_CUDA(cudaMalloc(&ss.rstd[i], 4 * (size_t)N));
            BENCH_CUDA(cudaMemcpy(ss.x[i], x, 2 * n, cudaMemcpyDeviceToDevice));
            BENCH_CUDA(cudaMemcpy(ss.dy[i], dy, 2 * n, cudaMemcpyDeviceToDevice));
            BENCH_CUDA(cudaMemcpy(ss.r[i], r0, 2 * n, cudaMemcpyDeviceToDevice));
            BENCH_CUDA(cudaMemset(ss.dx[i], 0, 2 * n));
        }
    }
    rmsnorm_forward_ref(ref, refrs, hx, hw, N, C, 1e-6f);
    for (size_t i = 0; i < n; i++) refh[i] = bf16_round(hx[i] + hr[i]);
    rmsnorm_forward_ref(refyh, NULL, refh, hw, N, C, 1e-6f);

    char shp[64];
    snprintf(shp, sizeof shp, "N=%d C=%d", N, C);
    res->N = N;
    res->C = C;
    for (int v = 1; v >= 0; v--) {   /* v4 first: the default's dx is compared with it */
        set_variant(v);
        const char *vn = var_names[v];
        char what[96];
        int ok = 1;
        BENCH_CUDA(cudaMemset(y, 0xff, 2 * n));
        BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, y, n);
        BENCH_CUDA(cudaMemcpy(grs, rstd, 4 * (size_t)N, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "%s forward y %s", vn, shp);
        vcheck(&ok, what, worst(got, ref, n, 1e-2, 1.6e-2), 1.0);
        snprintf(what, sizeof what, "%s forward rstd %s", vn, shp);
        vcheck(&ok, what, worst(grs, refrs, N, 0, 1e-4), 1.0);
        BENCH_CUDA(cudaMemcpy(r, r0, 2 * n, cudaMemcpyDeviceToDevice));
        BENCH_CUDA(cudaMemset(y, 0xff, 2 * n));
        BENCH_OK(rmsnorm_residual_forward(y, r, NULL, x, w, N, C, 1e-6f, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, r, n);
        snprintf(what, sizeof what, "%s residual h (exact) %s", vn, shp);
        vcheck(&ok, what, memcmp(got, refh, 4 * n) ? 2.0 : 0.0, 1.0);
        down_bf16(got, y, n);
        snprintf(what, sizeof what, "%s residual y %s", vn, shp);
        vcheck(&ok, what, worst(got, refyh, n, 1e-2, 1.6e-2), 1.0);

        /* backward against the reference fed the GPU's rstd (as tests/gpu/test_rmsnorm.c does) */
        float *rdx = (float *)malloc(4 * n), *rdw = (float *)calloc(C, 4);
        rmsnorm_backward_ref(rdx, rdw, hdy, hx, hw, grs, N, C, 0);
        double dx_atol = 1e-2 * rms(rdx, n), dw_atol = 1e-3 * sqrt((double)N);
        BENCH_CUDA(cudaMemset(dx, 0xff, 2 * n));
        BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
        snprintf(what, sizeof what, "%s backward %s", vn, shp);
        if (!call_ok(&ok, what, bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0))) {
            free(rdx); free(rdw);
            res->ok[v] = 0;
            continue;
        }
        BENCH_CUDA(cudaDeviceSynchronize());
        BENCH_CUDA(cudaMemcpy(v ? v4dx : ddx, dx, 2 * n, cudaMemcpyDeviceToHost));
        down_bf16(got, dx, n);
        BENCH_CUDA(cudaMemcpy(gdw, dw, 4 * C, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "%s backward dx %s", vn, shp);
        vcheck(&ok, what, worst(got, rdx, n, dx_atol, 1.6e-2), 1.0);
        snprintf(what, sizeof what, "%s backward dw %s", vn, shp);
        vcheck(&ok, what, worst(gdw, rdw, C, dw_atol, 1e-3), 1.0);
        BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
        BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
        BENCH_CUDA(cudaMemcpy(gdw1, dw, 4 * C, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "%s backward dw deterministic %s", vn, shp);
        vcheck(&ok, what, memcmp(gdw, gdw1, 4 * C) ? 2.0 : 0.0, 1.0);
        unsigned hdr = 1;
        BENCH_CUDA(cudaMemcpy(&hdr, scr, 4, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "%s bwd ticket reset %s", vn, shp);
        vcheck(&ok, what, hdr ? 2.0 : 0.0, 1.0);
        /* dx += onto a known dx */
        BENCH_CUDA(cudaMemcpy(dx, r0, 2 * n, cudaMemcpyDeviceToDevice));
        BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 1, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        BENCH_CUDA(cudaMemcpy(v ? v4dxa : ddxa, dx, 2 * n, cudaMemcpyDeviceToHost));
        down_bf16(got, dx, n);
        for (size_t i = 0; i < n; i++) rdx[i] += hr[i];
        snprintf(what, sizeof what, "%s backward dx+= %s", vn, shp);
        vcheck(&ok, what, worst(got, rdx, n, dx_atol + 1e-2, 1.6e-2), 1.0);
        if (v == 0) {
            res->dx_same[0] = !memcmp(ddx, v4dx, 2 * n);
            res->dx_same[1] = !memcmp(ddxa, v4dxa, 2 * n);
            printf("default dx bitwise = v4 %s: dx %s, dx+= %s\n", shp, res->dx_same[0] ? "yes" : "NO", res->dx_same[1] ? "yes" : "NO");
        }
        res->ok[v] = ok;
        if (!ok) {
            printf("%s %s: FAILED validation, not timed\n", vn, shp);
            free(rdx); free(rdw);
            continue;
        }

        double b = 2.0 * n, *g = res->gbs[v], *sg = res->sgbs[v];
        char name[64];
        if (v == 0) {   /* the forward is the same under both */
            g[0] = timed("rmsnorm_forward", shp, 2 * b, bench_ms([&]() { BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0)); }));
            g[1] = timed("rmsnorm_residual_forward", shp, 4 * b,
                         bench_ms([&]() { BENCH_OK(rmsnorm_residual_forward(y, r, rstd, x, w, N, C, 1e-6f, 0)); }));
            BENCH_CUDA(cudaMemcpy(rstd, grs, 4 * (size_t)N, cudaMemcpyHostToDevice));   /* the fused form rewrote rstd */
        }
        snprintf(name, sizeof name, "%s rmsnorm_backward dx only", vn);
        g[2] = timed(name, shp, 3 * b, bench_ms([&]() { BENCH_OK(bench_backward(dx, NULL, dy, x, w, rstd, scr, N, C, 0, 0)); }));
        snprintf(name, sizeof name, "%s rmsnorm_backward dx+dw (3 B)", vn);
        g[3] = timed(name, shp, 3 * b, bench_ms([&]() { BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); }));
        snprintf(name, sizeof name, "%s rmsnorm_backward dx+=,dw (4 B)", vn);
        g[4] = timed(name, shp, 4 * b, bench_ms([&]() { BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 1, 0)); }));
        for (int i = 0; i < ss.n; i++) BENCH_CUDA(cudaMemcpy(ss.rstd[i], grs, 4 * (size_t)N, cudaMemcpyHostToDevice));
        if (v == 0) {
            sg[0] = 2 * b / (stream_ms([&](int i) { BENCH_OK(rmsnorm_forward(ss.y[i], ss.rstd[i], ss.x[i], w, N, C, 1e-6f, 0)); }, ss.n) * 1e-3) / 1e9;
            sg[1] = 4 * b / (stream_ms([&](int i) { BENCH_OK(rmsnorm_residual_forward(ss.y[i], ss.r[i], ss.rstd[i], ss.x[i], w, N, C, 1e-6f, 0)); }, ss.n) * 1e-3) / 1e9;
            for (int i = 0; i < ss.n; i++) BENCH_CUDA(cudaMemcpy(ss.rstd[i], grs, 4 * (size_t)N, cudaMemcpyHostToDevice));
        }
        sg[2] = 3 * b / (stream_ms([&](int i) { BENCH_OK(bench_backward(ss.dx[i], NULL, ss.dy[i], ss.x[i], w, ss.rstd[i], scr, N, C, 0, 0)); }, ss.n) * 1e-3) / 1e9;
        sg[3] = 3 * b / (stream_ms([&](int i) { BENCH_OK(bench_backward(ss.dx[i], dw, ss.dy[i], ss.x[i], w, ss.rstd[i], scr, N, C, 0, 0)); }, ss.n) * 1e-3) / 1e9;
        sg[4] = 4 * b / (stream_ms([&](int i) { BENCH_OK(bench_backward(ss.dx[i], dw, ss.dy[i], ss.x[i], w, ss.rstd[i], scr, N, C, 1, 0)); }, ss.n) * 1e-3) / 1e9;
        printf("%s stream (%d launches, %d sets) %s: fwd %.1f resid %.1f dx %.1f dx+dw %.1f dx+=,dw %.1f GB/s\n", vn, NSTREAM, ss.n,
               shp, sg[0], sg[1], sg[2], sg[3], sg[4]);
        if (v == 0 && C <= 8192) {   /* the bench-only shape 1 (256 threads, 2/SM) against the default shape 2 */
            g_rms_cfg = 1;
            int okc = 1;
            BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
            BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
            BENCH_CUDA(cudaMemcpy(gdw, dw, 4 * C, cudaMemcpyDeviceToHost));
            snprintf(what, sizeof what, "def shape 1 dw %s", shp);
            vcheck(&okc, what, worst(gdw, rdw, C, dw_atol, 1e-3), 1.0);
            BENCH_CUDA(cudaMemcpy(bits, dx, 2 * n, cudaMemcpyDeviceToHost));
            snprintf(what, sizeof what, "def shape 1 dx bitwise %s", shp);
            vcheck(&okc, what, memcmp(bits, ddx, 2 * n) ? 2.0 : 0.0, 1.0);
            if (okc) {
                res->s1us[0] = 1e3 * bench_ms([&]() { BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); });
                res->s1us[1] = 1e3 * stream_ms([&](int k) { BENCH_OK(bench_backward(ss.dx[k], dw, ss.dy[k], ss.x[k], w, ss.rstd[k], scr, N, C, 0, 0)); }, ss.n);
                printf("def shape 1 %s: dx+dw %.2f us single, %.2f us stream\n", shp, res->s1us[0], res->s1us[1]);
            } else
                res->s1us[0] = res->s1us[1] = -1;
            g_rms_cfg = 2;
        }
        if (C <= 8192) {   /* dw pieces (timing only): where dx+dw's extra time over dx goes */
            double *u = res->us[v];
            u[0] = 3 * b / (g[2] * 1e9) * 1e6;
            u[3] = 3 * b / (g[3] * 1e9) * 1e6;
            const char *pc[4] = {"1", "2", "3", "4"};
            const int slot[4] = {1, 2, 4, 5};
            for (int i = 0; i < 4; i++) {
                if (v == 0 && slot[i] == 1) {   /* the walk alone: variant 4's piece only (rmsnorm_variants.cuh) */
                    u[1] = NAN;
                    continue;
                }
                g_rms_piece = atoi(pc[i]);
                snprintf(name, sizeof name, "%s dw piece: %s", vn, piece_names[slot[i]]);
                double ms = bench_ms([&]() { BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); });
                printf("%-34s %-34s %9.4f ms\n", name, shp, ms);
                u[slot[i]] = ms * 1e3;
            }
            g_rms_piece = 0;
            /* piece 4 (the sum kernel without PDL) is a correct backward: validate it too */
            BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
            g_rms_piece = 4;
            BENCH_OK(bench_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
            g_rms_piece = 0;
            BENCH_CUDA(cudaMemcpy(gdw, dw, 4 * C, cudaMemcpyDeviceToHost));
            snprintf(what, sizeof what, "%s backward dw (no PDL) %s", vn, shp);
            int ok4 = 1;
            vcheck(&ok4, what, worst(gdw, rdw, C, dw_atol, 1e-3), 1.0);
            unsigned h2 = 1;
            BENCH_CUDA(cudaMemcpy(&h2, scr, 4, cudaMemcpyDeviceToHost));
            if (h2) { printf("%s %s: ticket header %u after the pieces\n", vn, shp, h2); bench_failed = 1; }
        }
        free(rdx); free(rdw);
    }
    g_rms_var = 10;
    res->empty_us = 1e3 * bench_ms([&]() { bench_empty_kernel<<<1, 32>>>(0); });
    printf("%-34s %-34s %9.4f ms\n", "empty kernel launch (floor)", shp, res->empty_us * 1e-3);
    cudaFree(x); cudaFree(r0); cudaFree(r); cudaFree(dy); cudaFree(y); cudaFree(dx); cudaFree(w); cudaFree(dw);
    cudaFree(rstd); cudaFree(scr);
    for (int i = 0; i < ss.n; i++) {
        cudaFree(ss.x[i]); cudaFree(ss.dy[i]); cudaFree(ss.dx[i]); cudaFree(ss.r[i]); cudaFree(ss.y[i]); cudaFree(ss.rstd[i]);
    }
    free(hx); free(hr); free(hdy); free(hw); free(ref); free(refh); free(refyh); free(refrs);
    free(got); free(grs); free(gdw); free(gdw1); free(bits); free(v4dx); free(v4dxa); free(ddx); free(ddxa);
}

/* The q/k norm: q [Nq, C] and k [Nk, C] as two single calls against rmsnorm_qk_forward/_backward (one
 * launch). Validated (y, rstd, dx, dx+= bitwise the separate calls'; dw against the reference and
 * deterministic; both tickets reset), then timed single and stream. Bytes: the two tensors' together. */
struct qk_result {
    int ok;
    double us[2][4];   /* [separate, fused][fwd, dx+dw, dx+=,dw, dx only] single-launch µs */
    double sus[2][4];  /* the same, stream (NSTREAM back to back over rotating sets) */
};
static void qk(int Nq, int Nk, int C, struct qk_result *res) {
    const int Nt[2] = {Nq, Nk};
    size_t n[2] = {(size_t)Nq * C, (size_t)Nk * C};
    float *hx[2], *hdy[2], *hw[2], *ref[2], *refrs[2];
    bf16 *x[2], *dy[2], *y[2], *dx[2];
    float *w[2], *rstd[2], *dw[2];
    for (int t = 0; t < 2; t++) {
        x[t] = bench_rand_bf16(n[t], -2, 2, 11 + t, &hx[t]);
        dy[t] = bench_rand_bf16(n[t], -1, 1, 13 + t, &hdy[t]);
        hw[t] = (float *)malloc(4 * C);
        for (int c = 0; c < C; c++) hw[t][c] = 0.5f + (float)((c * 7 + 3 * t) % C) / C;
        BENCH_CUDA(cudaMalloc(&y[t], 2 * n[t]));
        BENCH_CUDA(cudaMalloc(&dx[t], 2 * n[t]));
        BENCH_CUDA(cudaMalloc(&w[t], 4 * C));
        BENCH_CUDA(cudaMalloc(&dw[t], 4 * C));
        BENCH_CUDA(cudaMalloc(&rstd[t], 4 * (size_t)Nt[t]));
        BENCH_CUDA(cudaMemcpy(w[t], hw[t], 4 * C, cudaMemcpyHostToDevice));
        ref[t] = (float *)malloc(4 * n[t]);
        refrs[t] = (float *)malloc(4 * (size_t)Nt[t]);
        rmsnorm_forward_ref(ref[t], refrs[t], hx[t], hw[t], Nt[t], C, 1e-6f);
    }
    const size_t sf = rmsnorm_qk_backward_scratch_floats(Nq, Nk, C);
    float *scr, *scrq, *scrk;   /* the fused call's scratch; the separate calls' */
    BENCH_CUDA(cudaMalloc(&scr, 4 * sf));
    BENCH_CUDA(cudaMemset(scr, 0, 4 * sf));
    BENCH_CUDA(cudaMalloc(&scrq, 4 * rmsnorm_backward_scratch_floats(Nq, C)));
    BENCH_CUDA(cudaMemset(scrq, 0, 4 * rmsnorm_backward_scratch_floats(Nq, C)));
    BENCH_CUDA(cudaMalloc(&scrk, 4 * rmsnorm_backward_scratch_floats(Nk, C)));
    BENCH_CUDA(cudaMemset(scrk, 0, 4 * rmsnorm_backward_scratch_floats(Nk, C)));
    char shp[64], what[128];
    snprintf(shp, sizeof shp, "q %dx%d + k %dx%d", Nq, C, Nk, C);
    int ok = 1;
    /* separate calls: the reference bits */
    unsigned short *sy[2], *sdx[2], *sdxa[2], *fb[2];
    float *srs[2], *frs[2], *gdw = (float *)malloc(4 * C), *gdw2 = (float *)malloc(4 * C);
    for (int t = 0; t < 2; t++) {
        sy[t] = (unsigned short *)malloc(2 * n[t]); sdx[t] = (unsigned short *)malloc(2 * n[t]);
        sdxa[t] = (unsigned short *)malloc(2 * n[t]); fb[t] = (unsigned short *)malloc(2 * n[t]);
        srs[t] = (float *)malloc(4 * (size_t)Nt[t]); frs[t] = (float *)malloc(4 * (size_t)Nt[t]);
    }
    auto sep_fwd = [&]() {
        BENCH_OK(rmsnorm_forward(y[0], rstd[0], x[0], w[0], Nq, C, 1e-6f, 0));
        BENCH_OK(rmsnorm_forward(y[1], rstd[1], x[1], w[1], Nk, C, 1e-6f, 0));
    };
    auto qk_fwd = [&]() { BENCH_OK(rmsnorm_qk_forward(y[0], rstd[0], x[0], w[0], Nq, y[1], rstd[1], x[1], w[1], Nk, C, 1e-6f, 0)); };
    auto sep_bwd = [&](float *dwq, float *dwk, int acc) {
        BENCH_OK(bench_backward(dx[0], dwq, dy[0], x[0], w[0], rstd[0], scrq, Nq, C, acc, 0));
        BENCH_OK(bench_backward(dx[1], dwk, dy[1], x[1], w[1], rstd[1], scrk, Nk, C, acc, 0));
    };
    auto qk_bwd = [&](float *dwq, float *dwk, int acc) {
        BENCH_OK(bench_qk_backward(dx[0], dwq, dy[0], x[0], w[0], rstd[0], Nq, dx[1], dwk, dy[1], x[1], w[1], rstd[1], Nk, scr, C,
                                     acc, 0));
    };
    sep_fwd();
    BENCH_CUDA(cudaDeviceSynchronize());
    for (int t = 0; t < 2; t++) {
        BENCH_CUDA(cudaMemcpy(sy[t], y[t], 2 * n[t], cudaMemcpyDeviceToHost));
        BENCH_CUDA(cudaMemcpy(srs[t], rstd[t], 4 * (size_t)Nt[t], cudaMemcpyDeviceToHost));
        BENCH_CUDA(cudaMemset(y[t], 0xff, 2 * n[t]));
        BENCH_CUDA(cudaMemset(rstd[t], 0xff, 4 * (size_t)Nt[t]));
    }
    qk_fwd();
    BENCH_CUDA(cudaDeviceSynchronize());
    for (int t = 0; t < 2; t++) {
        BENCH_CUDA(cudaMemcpy(fb[t], y[t], 2 * n[t], cudaMemcpyDeviceToHost));
        BENCH_CUDA(cudaMemcpy(frs[t], rstd[t], 4 * (size_t)Nt[t], cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "qk forward y, rstd bitwise [%c] %s", "qk"[t], shp);
        vcheck(&ok, what, memcmp(fb[t], sy[t], 2 * n[t]) || memcmp(frs[t], srs[t], 4 * (size_t)Nt[t]) ? 2.0 : 0.0, 1.0);
        float *g = (float *)malloc(4 * n[t]);
        down_bf16(g, y[t], n[t]);
        snprintf(what, sizeof what, "qk forward y vs reference [%c] %s", "qk"[t], shp);
        vcheck(&ok, what, worst(g, ref[t], n[t], 1e-2, 1.6e-2), 1.0);
        free(g);
    }
    for (int acc = 0; acc < 2; acc++) {
        for (int t = 0; t < 2; t++) BENCH_CUDA(cudaMemset(dx[t], 0, 2 * n[t]));
        sep_bwd(dw[0], dw[1], acc);
        BENCH_CUDA(cudaDeviceSynchronize());
        for (int t = 0; t < 2; t++) BENCH_CUDA(cudaMemcpy(acc ? sdxa[t] : sdx[t], dx[t], 2 * n[t], cudaMemcpyDeviceToHost));
        for (int t = 0; t < 2; t++) BENCH_CUDA(cudaMemset(dx[t], 0, 2 * n[t]));
        qk_bwd(dw[0], dw[1], acc);
        BENCH_CUDA(cudaDeviceSynchronize());
        for (int t = 0; t < 2; t++) {
            BENCH_CUDA(cudaMemcpy(fb[t], dx[t], 2 * n[t], cudaMemcpyDeviceToHost));
            snprintf(what, sizeof what, "qk backward dx%s bitwise [%c] %s", acc ? "+=" : "", "qk"[t], shp);
            vcheck(&ok, what, memcmp(fb[t], acc ? sdxa[t] : sdx[t], 2 * n[t]) ? 2.0 : 0.0, 1.0);
        }
    }
    for (int t = 0; t < 2; t++) {   /* dw against the reference, twice: deterministic */
        float *rdx = (float *)malloc(4 * n[t]), *rdw = (float *)calloc(C, 4);
        rmsnorm_backward_ref(rdx, rdw, hdy[t], hx[t], hw[t], frs[t], Nt[t], C, 0);
        for (int k = 0; k < 2; k++) {
            BENCH_CUDA(cudaMemset(dw[0], 0, 4 * C));
            BENCH_CUDA(cudaMemset(dw[1], 0, 4 * C));
            qk_bwd(dw[0], dw[1], 0);
            BENCH_CUDA(cudaMemcpy(k ? gdw2 : gdw, dw[t], 4 * C, cudaMemcpyDeviceToHost));
        }
        snprintf(what, sizeof what, "qk backward dw [%c] %s", "qk"[t], shp);
        vcheck(&ok, what, worst(gdw, rdw, C, 1e-3 * sqrt((double)Nt[t]), 1e-3), 1.0);
        snprintf(what, sizeof what, "qk backward dw deterministic [%c] %s", "qk"[t], shp);
        vcheck(&ok, what, memcmp(gdw, gdw2, 4 * C) ? 2.0 : 0.0, 1.0);
        free(rdx); free(rdw);
    }
    unsigned hdr[2] = {1, 1};
    BENCH_CUDA(cudaMemcpy(hdr, scr, 8, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "qk tickets reset %s", shp);
    vcheck(&ok, what, hdr[0] || hdr[1] ? 2.0 : 0.0, 1.0);
    res->ok = ok;
    if (ok) {
        /* stream sets: copies of x, dy, dx (and y, rstd) per tensor */
        const double per = 6.0 * (double)(n[0] + n[1]);
        int ns = 1 + (int)ceil(160e6 / per);
        ns = ns < 2 ? 2 : ns > 32 ? 32 : ns;
        std::vector<bf16 *> sx[2], sdy[2], sdxs[2], sys[2];
        std::vector<float *> srst[2];
        for (int t = 0; t < 2; t++)
            for (int i = 0; i < ns; i++) {
                bf16 *a, *b2, *c2, *d2;
                float *e2;
                BENCH_CUDA(cudaMalloc(&a, 2 * n[t])); BENCH_CUDA(cudaMalloc(&b2, 2 * n[t]));
                BENCH_CUDA(cudaMalloc(&c2, 2 * n[t])); BENCH_CUDA(cudaMalloc(&d2, 2 * n[t]));
                BENCH_CUDA(cudaMalloc(&e2, 4 * (size_t)Nt[t]));
                BENCH_CUDA(cudaMemcpy(a, x[t], 2 * n[t], cudaMemcpyDeviceToDevice));
                BENCH_CUDA(cudaMemcpy(b2, dy[t], 2 * n[t], cudaMemcpyDeviceToDevice));
                BENCH_CUDA(cudaMemset(c2, 0, 2 * n[t]));
                BENCH_CUDA(cudaMemcpy(e2, rstd[t], 4 * (size_t)Nt[t], cudaMemcpyDeviceToDevice));
                sx[t].push_back(a); sdy[t].push_back(b2); sdxs[t].push_back(c2); sys[t].push_back(d2); srst[t].push_back(e2);
            }
        float *rstd_keep[2];
        for (int t = 0; t < 2; t++) {   /* the forward timings rewrite rstd with the same values: keep a copy anyway */
            BENCH_CUDA(cudaMalloc(&rstd_keep[t], 4 * (size_t)Nt[t]));
            BENCH_CUDA(cudaMemcpy(rstd_keep[t], rstd[t], 4 * (size_t)Nt[t], cudaMemcpyDeviceToDevice));
        }
        for (int f = 0; f < 2; f++) {
            double *u = res->us[f], *su = res->sus[f];
            u[0] = 1e3 * bench_ms([&]() { if (f) qk_fwd(); else sep_fwd(); });
            u[1] = 1e3 * bench_ms([&]() { if (f) qk_bwd(dw[0], dw[1], 0); else sep_bwd(dw[0], dw[1], 0); });
            u[2] = 1e3 * bench_ms([&]() { if (f) qk_bwd(dw[0], dw[1], 1); else sep_bwd(dw[0], dw[1], 1); });
            u[3] = 1e3 * bench_ms([&]() { if (f) qk_bwd(NULL, NULL, 0); else sep_bwd(NULL, NULL, 0); });
            auto sfwd = [&](int i) {
                if (f) BENCH_OK(rmsnorm_qk_forward(sys[0][i], srst[0][i], sx[0][i], w[0], Nq, sys[1][i], srst[1][i], sx[1][i], w[1], Nk, C, 1e-6f, 0));
                else {
                    BENCH_OK(rmsnorm_forward(sys[0][i], srst[0][i], sx[0][i], w[0], Nq, C, 1e-6f, 0));
                    BENCH_OK(rmsnorm_forward(sys[1][i], srst[1][i], sx[1][i], w[1], Nk, C, 1e-6f, 0));
                }
            };
            auto sbwd = [&](int i, float *a0, float *a1, int acc) {
                if (f) BENCH_OK(bench_qk_backward(sdxs[0][i], a0, sdy[0][i], sx[0][i], w[0], srst[0][i], Nq, sdxs[1][i], a1, sdy[1][i],
                                                    sx[1][i], w[1], srst[1][i], Nk, scr, C, acc, 0));
                else {
                    BENCH_OK(bench_backward(sdxs[0][i], a0, sdy[0][i], sx[0][i], w[0], srst[0][i], scrq, Nq, C, acc, 0));
                    BENCH_OK(bench_backward(sdxs[1][i], a1, sdy[1][i], sx[1][i], w[1], srst[1][i], scrk, Nk, C, acc, 0));
                }
            };
            su[0] = 1e3 * stream_ms(sfwd, ns);
            su[1] = 1e3 * stream_ms([&](int i) { sbwd(i, dw[0], dw[1], 0); }, ns);
            su[2] = 1e3 * stream_ms([&](int i) { sbwd(i, dw[0], dw[1], 1); }, ns);
            su[3] = 1e3 * stream_ms([&](int i) { sbwd(i, NULL, NULL, 0); }, ns);
            printf("qk %s %s: fwd %.2f dx+dw %.2f dx+=,dw %.2f dx %.2f us single; stream %.2f %.2f %.2f %.2f us (%d sets)\n",
                   f ? "one launch" : "two calls ", shp, u[0], u[1], u[2], u[3], su[0], su[1], su[2], su[3], ns);
        }
        for (int t = 0; t < 2; t++) {
            cudaFree(rstd_keep[t]);
            for (int i = 0; i < ns; i++) { cudaFree(sx[t][i]); cudaFree(sdy[t][i]); cudaFree(sdxs[t][i]); cudaFree(sys[t][i]); cudaFree(srst[t][i]); }
        }
    }
    for (int t = 0; t < 2; t++) {
        cudaFree(x[t]); cudaFree(dy[t]); cudaFree(y[t]); cudaFree(dx[t]); cudaFree(w[t]); cudaFree(dw[t]); cudaFree(rstd[t]);
        free(hx[t]); free(hdy[t]); free(hw[t]); free(ref[t]); free(refrs[t]);
        free(sy[t]); free(sdx[t]); free(sdxa[t]); free(fb[t]); free(srs[t]); free(frs[t]);
    }
    cudaFree(scr); cudaFree(scrq); cudaFree(scrk);
    free(gdw); free(gdw2);
}

int main(void) {
    struct shape_result res[4];
    struct qk_result qr;
    memset(res, 0, sizeof res);
    memset(&qr, 0, sizeof qr);
    one(1000, 1032, &res[0]);        /* awkward: C/8 = 129, a tail past a power-of-two group */
    one(8192 * 8, 128, &res[1]);     /* k norm */
    one(8192 * 32, 128, &res[2]);    /* q norm: 8192 tokens × 32 heads */
    qk(8192 * 32, 8192 * 8, 128, &qr);   /* q and k norm together (rmsnorm_qk_*) */
    one(8192, 4096, &res[3]);        /* hidden norm of the standard batch */
    printf("\ndw pieces, microseconds (median; walk = row walk with its dw sums, no partial store; walk+part = plus the "
           "partial store; final = the cross-block sum kernel alone; no PDL = dx+dw with that kernel launched plainly)\n");
    printf("%-18s %-4s", "shape", "var");
    for (int m = 0; m < NPIECE; m++) printf(" %9s", piece_names[m]);
    printf(" %9s\n", "empty");
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < 2; v++) {
            printf("%7dx%-10d %-4s", res[i].N, res[i].C, var_names[v]);
            if (!res[i].ok[v]) { printf(" FAILED validation\n"); continue; }
            for (int m = 0; m < NPIECE; m++) printf(" %9.2f", res[i].us[v][m]);
            printf(" %9.2f\n", res[i].empty_us);
        }
    /* the compact part the lead reads */
    printf("\nSUMMARY rmsnorm %% of %.0f GB/s, single launch | stream (%d back-to-back launches, rotating sets); cols fwd resid dx "
           "dx+dw dx+=,dw; def = default (shape 2 with dw), v4 = variant 4 (fwd = def's)\n", BENCH_PEAK_GBS, NSTREAM);
    for (int i = 0; i < 4; i++)
        for (int v = 0; v < 2; v++) {
            printf("SUMMARY %7dx%-4d %-3s", res[i].N, res[i].C, var_names[v]);
            if (!res[i].ok[v]) { printf(" FAILED validation\n"); continue; }
            for (int m = 0; m < NMEAS; m++)
                if (res[i].gbs[v][m] > 0) printf(" %5.1f", 100 * res[i].gbs[v][m] / BENCH_PEAK_GBS);
                else printf(" %5s", "-");
            printf(" |");
            for (int m = 0; m < NMEAS; m++)
                if (res[i].sgbs[v][m] > 0) printf(" %5.1f", 100 * res[i].sgbs[v][m] / BENCH_PEAK_GBS);
                else printf(" %5s", "-");
            if (v == 0)
                printf("  dx=v4 %s/%s s1 %.1f/%.1fus", res[i].dx_same[0] < 0 ? "n/a" : res[i].dx_same[0] ? "yes" : "NO",
                       res[i].dx_same[1] < 0 ? "n/a" : res[i].dx_same[1] ? "yes" : "NO", res[i].s1us[0], res[i].s1us[1]);
            printf("\n");
        }
    printf("SUMMARY us dx-only/dx+dw/walk/walk+part/final: def | v4, empty launch\n");
    for (int i = 0; i < 4; i++) {
        const double *a = res[i].us[0], *c = res[i].us[1];
        printf("SUMMARY %7dx%-4d %.1f/%.1f/%.1f/%.1f/%.1f | %.1f/%.1f/%.1f/%.1f/%.1f e%.1f\n", res[i].N, res[i].C, a[0], a[3], a[1], a[2],
               a[4], c[0], c[3], c[1], c[2], c[4], res[i].empty_us);
    }
    {
        const double qb = 2.0 * (double)(8192 * 32 + 8192 * 8) * 128;   /* bytes of one bf16 tensor pair */
        const double mult[4] = {2, 3, 4, 3};
        printf("SUMMARY qk q262144+k65536 x128, %% of peak single | stream: fwd dx+dw dx+=,dw dx; two calls vs one launch\n");
        for (int f = 0; f < 2; f++) {
            printf("SUMMARY qk %-10s", f ? "one launch" : "two calls");
            if (!qr.ok) { printf(" FAILED validation\n"); continue; }
            for (int m = 0; m < 4; m++) printf(" %5.1f", 100 * mult[m] * qb / (qr.us[f][m] * 1e-6) / 1e9 / BENCH_PEAK_GBS);
            printf(" |");
            for (int m = 0; m < 4; m++) printf(" %5.1f", 100 * mult[m] * qb / (qr.sus[f][m] * 1e-6) / 1e9 / BENCH_PEAK_GBS);
            printf("\n");
        }
    }
    printf("%s", failed_list[0] ? "FAILED validations:\n" : "SUMMARY all validations ok\n");
    printf("%s", failed_list);
    return bench_failed ? 1 : 0;
}
