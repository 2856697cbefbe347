/*
 * kernels/bench/rmsnorm_bench.cu — RMSNorm forward, fused residual forward, backward (kernels/rmsnorm.h).
 *
 * Build: make BUILD=build-rn build-rn/bench/rmsnorm_bench   Run: build-rn/bench/rmsnorm_bench
 * The variants are the library's two kernel paths, picked through DFLASH_RMSNORM_KERNEL (read by the
 * launchers at every call):
 * Variant 1: two passes (row group of 8/16/32 lanes, the second pass re-reads the row from L1/L2;
 *            dw by a separate column-reduction kernel over dy and x, 256 row chunks). Measured on the
 *            H200 (K1): forward 58%, fused 73%, dx 55%, dx+dw 34%, q-norm dx+dw 47% at C=4096/128.
 * Variant 2: register-resident (the default for C <= 8192): a group of G = 8..256 threads holds its
 *            row in registers (V <= 4 16-byte vectors per thread, all loads in flight at once); the
 *            backward walks rows with a fixed grid of 264 blocks, prefetches the next row, and sums
 *            dw per thread in fp32, then per block (fixed order) and across blocks (fixed order).
 * Variant 3 (K1c; DFLASH_RMSNORM_KERNEL=3): variant 2, plus two rows per row group in the forward
 *            when groups are <= 32 lanes and the grid exceeds one wave (C = 128: 64 rows per block
 *            instead of 32), plus the dw sum kernel launched with programmatic dependent launch
 *            (PDL) behind the dx kernel. H200: 8192x4096 dx+dw 70.1%, q norm 77.1%, k norm 50.4%.
 * Variant 4 (K1e, the default; forward = variant 3): backward with the dw column sums in shared
 *            memory (80 registers: 3 blocks per SM, not 2 at 108), a balanced grid (every block the
 *            same number of row steps), the old dx of dx += loaded before the row reduction, and
 *            the cross-block dw sum done by the last block to finish (ticket in scratch, C <= 256)
 *            or by a 1024-thread PDL kernel with 16 loads in flight per thread (C > 256).
 * Variants 5-8 (round 2, candidates behind DFLASH_RMSNORM_KERNEL; forward = variant 4's, so only the
 *            backward is timed): 5 = 4 with clusters of 4 CTAs that add their shared-memory dw sums
 *            through distributed shared memory (one partial per cluster: 4x fewer partial bytes); 6 =
 *            clusters of 8; 7 = 4 with the cross-block dw sum after a grid barrier in the same kernel
 *            (cooperative launch, no second kernel, every C); 8 = 5 + 7.
 * Variant 9 (round 3): 4 with (a) the cross-block dw sum (C > 256) by rmsnorm_backward_dw_final2_kernel:
 *            CTAs of NQ float4 columns x 256 (or 128) slices, 1-4 loads per thread, shuffle trees;
 *            DFLASH_RMSNORM_FIN_NQ = 2 / 4 (default) / 8 timed side by side; its dw order differs from
 *            4's (deterministic, not bitwise 4's); (b) the forward's two-row choice against the one-row
 *            kernel's queried occupancy, and two-row kernels held to 4 blocks per SM: y, rstd, h must be
 *            bitwise 4's (checked, "v9 forward+resid bitwise = v4").
 * Round 3 fix: the fused forward's timing loop rewrites rstd (with the rstd of x + k·r); the "dw (no
 * PDL)" validation after it ran on that rstd and FAILED on every shape (a bench bug, not the library's:
 * the library never launches the sum kernel without PDL). rstd is now restored after the forward timings.
 * The output ends with every FAILED validation repeated (or "all validations ok").
 * dw pieces (variants 4-9, DFLASH_RMSNORM_DW_PIECE, timing only, dw wrong): "walk" = the row walk with
 * its shared-memory dw sums but no partial store, "walk+part" = plus the partial store, "final" = the
 * PDL sum kernel alone, "no PDL" = the full dx+dw with that kernel launched plainly (validated); with
 * "dx only" and the full dx+dw they split dw's cost into the shared-memory sums in the loop, the
 * partial store, and the cross-block sum with its launch/wait. "empty" is an
 * empty kernel launch timed the same way (L2 flush, events): the floor of any one launch; "empty x2"
 * two launches in a row. "cv 28/44/100%" = dx+dw with DFLASH_RMSNORM_CARVEOUT (the dw kernel's preferred
 * shared-memory carveout; 28% ~ the 64 KB that 3 blocks need, 100% = all shared memory, least L1):
 * whether dw's dynamic shared memory costs L1 room for the loads in flight.
 * Every variant is validated against the CPU reference (y, h, rstd, dx, dw) before it is timed; a
 * variant that fails is reported, not timed, and the bench exits 1 at the end. The hidden norm
 * (8192 x 4096) runs last and a summary table closes the output (the tail is what gets read).
 * Bytes counted (bf16 tensors of N·C): forward read x + write y = 2; fused read x, r + write r, y = 4;
 * backward read dy, x + write dx = 3 (dx+dw also 3: a fused dw reads nothing more; variant 1 reads
 * dy, x twice, so its "3 of 5"). Ceiling ~4.1 TB/s; target >= 80%.
 */
#include "kernels/rmsnorm.h"
#include "k1bench.cuh"

#include <math.h>
#include <string.h>

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

#define NVAR 9
#define NMEAS 5
#define NPIECE 6
static const char *meas_names[NMEAS] = {"fwd", "resid", "dx", "dx+dw", "dx+=,dw"};
static const char *piece_names[NPIECE] = {"dx only", "walk", "walk+part", "dx+dw", "final", "no PDL"};
struct shape_result {
    int N, C, ok[NVAR + 1];
    double gbs[NVAR + 1][NMEAS];   /* 0: not timed */
    double us[NVAR + 1][NPIECE];   /* dw pieces, microseconds (variants 4-8) */
    double empty_us, empty2_us;
    double cv[NVAR + 1][3];        /* dx+dw microseconds under DFLASH_RMSNORM_CARVEOUT = 28, 44, 100 */
    double nq_us[3][2];            /* variant 9, DFLASH_RMSNORM_FIN_NQ = 2, 4, 8: dx+dw, final alone (µs; 0 = n/a, -1 failed) */
    int fwd_same;                  /* variant 9's forward y, rstd, h bitwise variant 4's: 1, 0, or -1 (not compared) */
};
static char failed_list[4096];   /* every FAILED validation, repeated at the end of the output */
static const char *cv_names[3] = {"28", "44", "100"};
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

    /* references: y = norm(x); h = bf16(x + r), yh = norm(h); dx, dw of norm(x) */
    float *ref = (float *)malloc(4 * n), *refh = (float *)malloc(4 * n), *refyh = (float *)malloc(4 * n);
    float *refrs = (float *)malloc(4 * (size_t)N), *refdx = (float *)malloc(4 * n), *refdw = (float *)calloc(C, 4);
    float *got = (float *)malloc(4 * n), *grs = (float *)malloc(4 * (size_t)N), *gdw = (float *)malloc(4 * C);
    float *gdw1 = (float *)malloc(4 * C);
    /* variant 4's forward outputs, raw bits (y, rstd, h, y of the fused form): variant 9's must equal them */
    unsigned short *f4y = (unsigned short *)malloc(2 * n), *f4h = (unsigned short *)malloc(2 * n), *f4yh = (unsigned short *)malloc(2 * n);
    unsigned short *f9 = (unsigned short *)malloc(2 * n);
    float *f4rs = (float *)malloc(4 * (size_t)N);
    res->fwd_same = -1;
    rmsnorm_forward_ref(ref, refrs, hx, hw, N, C, 1e-6f);
    for (size_t i = 0; i < n; i++) refh[i] = bf16_round(hx[i] + hr[i]);
    rmsnorm_forward_ref(refyh, NULL, refh, hw, N, C, 1e-6f);
    rmsnorm_backward_ref(refdx, refdw, hdy, hx, hw, refrs, N, C, 0);
    double dx_atol = 1e-2 * rms(refdx, n), dw_atol = 1e-3 * sqrt((double)N);

    char shp[64];
    snprintf(shp, sizeof shp, "N=%d C=%d", N, C);
    res->N = N;
    res->C = C;
    for (int v = 1; v <= NVAR; v++) {
        char env[2] = {(char)('0' + v), 0};
        setenv("DFLASH_RMSNORM_KERNEL", env, 1);
        char what[96];
        int ok = 1;
        BENCH_CUDA(cudaMemset(y, 0xff, 2 * n));
        BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, y, n);
        BENCH_CUDA(cudaMemcpy(grs, rstd, 4 * (size_t)N, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "v%d forward y %s", v, shp);
        vcheck(&ok, what, worst(got, ref, n, 1e-2, 1.6e-2), 1.0);
        snprintf(what, sizeof what, "v%d forward rstd %s", v, shp);
        vcheck(&ok, what, worst(grs, refrs, N, 0, 1e-4), 1.0);
        int same = 1;
        if (v == 4) {
            BENCH_CUDA(cudaMemcpy(f4y, y, 2 * n, cudaMemcpyDeviceToHost));
            memcpy(f4rs, grs, 4 * (size_t)N);
        } else if (v == 9) {
            BENCH_CUDA(cudaMemcpy(f9, y, 2 * n, cudaMemcpyDeviceToHost));
            same &= !memcmp(f9, f4y, 2 * n) && !memcmp(grs, f4rs, 4 * (size_t)N);
        }

        BENCH_CUDA(cudaMemcpy(r, r0, 2 * n, cudaMemcpyDeviceToDevice));
        BENCH_CUDA(cudaMemset(y, 0xff, 2 * n));
        BENCH_OK(rmsnorm_residual_forward(y, r, NULL, x, w, N, C, 1e-6f, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        if (v == 4) {
            BENCH_CUDA(cudaMemcpy(f4h, r, 2 * n, cudaMemcpyDeviceToHost));
            BENCH_CUDA(cudaMemcpy(f4yh, y, 2 * n, cudaMemcpyDeviceToHost));
        } else if (v == 9) {
            BENCH_CUDA(cudaMemcpy(f9, r, 2 * n, cudaMemcpyDeviceToHost));
            same &= !memcmp(f9, f4h, 2 * n);
            BENCH_CUDA(cudaMemcpy(f9, y, 2 * n, cudaMemcpyDeviceToHost));
            same &= !memcmp(f9, f4yh, 2 * n);
            res->fwd_same = same;
            snprintf(what, sizeof what, "v9 forward+resid bitwise = v4 %s", shp);
            int okb = 1;   /* reported, and it keeps the flip off; the variant is still timed */
            vcheck(&okb, what, same ? 0.0 : 2.0, 1.0);
        }
        down_bf16(got, r, n);
        snprintf(what, sizeof what, "v%d residual h (exact) %s", v, shp);
        vcheck(&ok, what, memcmp(got, refh, 4 * n) ? 2.0 : 0.0, 1.0);
        down_bf16(got, y, n);
        snprintf(what, sizeof what, "v%d residual y %s", v, shp);
        vcheck(&ok, what, worst(got, refyh, n, 1e-2, 1.6e-2), 1.0);

        /* backward against the reference fed the GPU's rstd (as tests/gpu/test_rmsnorm.c does) */
        float *rdx = (float *)malloc(4 * n), *rdw = (float *)calloc(C, 4);
        rmsnorm_backward_ref(rdx, rdw, hdy, hx, hw, grs, N, C, 0);
        BENCH_CUDA(cudaMemset(dx, 0xff, 2 * n));
        BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
        snprintf(what, sizeof what, "v%d backward %s", v, shp);
        if (!call_ok(&ok, what, rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0))) {
            free(rdx); free(rdw);
            res->ok[v] = 0;
            printf("v%d %s: FAILED validation, not timed\n", v, shp);
            continue;
        }
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, dx, n);
        BENCH_CUDA(cudaMemcpy(gdw, dw, 4 * C, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "v%d backward dx %s", v, shp);
        vcheck(&ok, what, worst(got, rdx, n, dx_atol, 1.6e-2), 1.0);
        snprintf(what, sizeof what, "v%d backward dw %s", v, shp);
        vcheck(&ok, what, worst(gdw, rdw, C, dw_atol, 1e-3), 1.0);
        BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
        BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
        BENCH_CUDA(cudaMemcpy(gdw1, dw, 4 * C, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "v%d backward dw deterministic %s", v, shp);
        vcheck(&ok, what, memcmp(gdw, gdw1, 4 * C) ? 2.0 : 0.0, 1.0);
        unsigned hdr = 1;
        BENCH_CUDA(cudaMemcpy(&hdr, scr, 4, cudaMemcpyDeviceToHost));
        snprintf(what, sizeof what, "v%d bwd ticket reset %s", v, shp);
        vcheck(&ok, what, hdr ? 2.0 : 0.0, 1.0);
        /* dx += onto a known dx: dx0 + dx (the accumulate form that is timed below) */
        BENCH_CUDA(cudaMemcpy(dx, r0, 2 * n, cudaMemcpyDeviceToDevice));
        BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 1, 0));
        BENCH_CUDA(cudaDeviceSynchronize());
        down_bf16(got, dx, n);
        for (size_t i = 0; i < n; i++) rdx[i] += hr[i];
        snprintf(what, sizeof what, "v%d backward dx+= %s", v, shp);
        vcheck(&ok, what, worst(got, rdx, n, dx_atol + 1e-2, 1.6e-2), 1.0);
        free(rdx); free(rdw);
        res->ok[v] = ok;
        if (!ok) {
            printf("v%d %s: FAILED validation, not timed\n", v, shp);
            continue;
        }

        double b = 2.0 * n, *g = res->gbs[v];
        char name[64];
        if (v <= 4 || v == 9) {   /* variants 5-8 run variant 4's forward */
            snprintf(name, sizeof name, "v%d rmsnorm_forward", v);
            g[0] = timed(name, shp, 2 * b, bench_ms([&]() { BENCH_OK(rmsnorm_forward(y, rstd, x, w, N, C, 1e-6f, 0)); }));
            snprintf(name, sizeof name, "v%d rmsnorm_residual_forward", v);
            g[1] = timed(name, shp, 4 * b,
                         bench_ms([&]() { BENCH_OK(rmsnorm_residual_forward(y, r, rstd, x, w, N, C, 1e-6f, 0)); }));
            /* the fused forward just rewrote rstd with the rstd of h = x + k·r: put x's back, or the
             * backward validated below (dw without PDL) runs on the wrong rstd (round 3's FAILED lines) */
            BENCH_CUDA(cudaMemcpy(rstd, grs, 4 * (size_t)N, cudaMemcpyHostToDevice));
        }
        snprintf(name, sizeof name, "v%d rmsnorm_backward dx only", v);
        g[2] = timed(name, shp, 3 * b,
                     bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, NULL, dy, x, w, rstd, scr, N, C, 0, 0)); }));
        snprintf(name, sizeof name, "v%d rmsnorm_backward dx+dw (3 B)", v);
        g[3] = timed(name, shp, 3 * b,
                     bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); }));
        snprintf(name, sizeof name, "v%d rmsnorm_backward dx+=,dw (4 B)", v);
        g[4] = timed(name, shp, 4 * b,
                     bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 1, 0)); }));
        if (v >= 4 && C <= 8192) {   /* dw pieces (timing only): where dx+dw's extra time over dx goes */
            double *u = res->us[v];
            u[0] = 3 * b / (g[2] * 1e9) * 1e6;
            u[3] = 3 * b / (g[3] * 1e9) * 1e6;
            const char *pc[4] = {"1", "2", "3", "4"};
            const int slot[4] = {1, 2, 4, 5};
            for (int i = 0; i < 4; i++) {
                setenv("DFLASH_RMSNORM_DW_PIECE", pc[i], 1);
                snprintf(name, sizeof name, "v%d dw piece: %s", v, piece_names[slot[i]]);
                double ms = bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); });
                printf("%-34s %-34s %9.4f ms\n", name, shp, ms);
                u[slot[i]] = ms * 1e3;
            }
            unsetenv("DFLASH_RMSNORM_DW_PIECE");
            /* piece 4 (the sum kernel without PDL) is a correct backward: validate it too */
            {
                float *rdw2 = (float *)calloc(C, 4);
                rmsnorm_backward_ref(got, rdw2, hdy, hx, hw, grs, N, C, 0);
                BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
                setenv("DFLASH_RMSNORM_DW_PIECE", "4", 1);
                BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
                unsetenv("DFLASH_RMSNORM_DW_PIECE");
                BENCH_CUDA(cudaMemcpy(gdw, dw, 4 * C, cudaMemcpyDeviceToHost));
                snprintf(what, sizeof what, "v%d backward dw (no PDL) %s", v, shp);
                int ok4 = 1;
                vcheck(&ok4, what, worst(gdw, rdw2, C, dw_atol, 1e-3), 1.0);
                free(rdw2);
            }
            /* the shared-memory carveout hint (same kernels, same results: a timing question only) */
            for (int i = 0; i < 3; i++) {
                setenv("DFLASH_RMSNORM_CARVEOUT", cv_names[i], 1);
                snprintf(name, sizeof name, "v%d dx+dw carveout %s%%", v, cv_names[i]);
                if (rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)) {   /* e.g. a cooperative grid no longer resident */
                    printf("%-34s %-34s launch refused: %s\n", name, shp, kernels_error());
                    res->cv[v][i] = -1;
                    continue;
                }
                double ms = bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); });
                printf("%-34s %-34s %9.4f ms\n", name, shp, ms);
                res->cv[v][i] = ms * 1e3;
            }
            unsetenv("DFLASH_RMSNORM_CARVEOUT");
            BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));   /* puts the hint back to the default */
            if (v == 9 && C > 256) {   /* the round-3 dw sum kernel's shapes (C <= 256: the last block sums, as v4) */
                const char *nqs[3] = {"2", "4", "8"};
                float *rdw3 = (float *)calloc(C, 4);
                rmsnorm_backward_ref(got, rdw3, hdy, hx, hw, grs, N, C, 0);
                for (int i = 0; i < 3; i++) {
                    setenv("DFLASH_RMSNORM_FIN_NQ", nqs[i], 1);
                    int okq = 1;
                    BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
                    BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
                    BENCH_CUDA(cudaMemcpy(gdw, dw, 4 * C, cudaMemcpyDeviceToHost));
                    snprintf(what, sizeof what, "v9 dw, dw sum NQ=%s %s", nqs[i], shp);
                    vcheck(&okq, what, worst(gdw, rdw3, C, dw_atol, 1e-3), 1.0);
                    BENCH_CUDA(cudaMemset(dw, 0, 4 * C));
                    BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0));
                    BENCH_CUDA(cudaMemcpy(gdw1, dw, 4 * C, cudaMemcpyDeviceToHost));
                    snprintf(what, sizeof what, "v9 dw deterministic NQ=%s %s", nqs[i], shp);
                    vcheck(&okq, what, memcmp(gdw, gdw1, 4 * C) ? 2.0 : 0.0, 1.0);
                    if (!okq) { res->nq_us[i][0] = res->nq_us[i][1] = -1; continue; }
                    res->nq_us[i][0] = 1e3 * bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); });
                    setenv("DFLASH_RMSNORM_DW_PIECE", "3", 1);
                    res->nq_us[i][1] = 1e3 * bench_ms([&]() { BENCH_OK(rmsnorm_backward(dx, dw, dy, x, w, rstd, scr, N, C, 0, 0)); });
                    unsetenv("DFLASH_RMSNORM_DW_PIECE");
                    printf("%-34s %-34s dx+dw %8.2f us, final alone %8.2f us\n", what, shp, res->nq_us[i][0], res->nq_us[i][1]);
                }
                unsetenv("DFLASH_RMSNORM_FIN_NQ");
                free(rdw3);
            }
            /* the pieces leave the ticket header alone (no ticket taken): check, for the next calls */
            unsigned h2 = 1;
            BENCH_CUDA(cudaMemcpy(&h2, scr, 4, cudaMemcpyDeviceToHost));
            if (h2) { printf("v%d %s: ticket header %u after the pieces\n", v, shp, h2); bench_failed = 1; }
        }
    }
    unsetenv("DFLASH_RMSNORM_KERNEL");
    res->empty_us = 1e3 * bench_ms([&]() { bench_empty_kernel<<<1, 32>>>(0); });
    res->empty2_us = 1e3 * bench_ms([&]() { bench_empty_kernel<<<1, 32>>>(0); bench_empty_kernel<<<1, 32>>>(1); });
    printf("%-34s %-34s %9.4f ms (x2: %.4f ms)\n", "empty kernel launch (floor)", shp, res->empty_us * 1e-3,
           res->empty2_us * 1e-3);
    cudaFree(x); cudaFree(r0); cudaFree(r); cudaFree(dy); cudaFree(y); cudaFree(dx); cudaFree(w); cudaFree(dw);
    cudaFree(rstd); cudaFree(scr);
    free(hx); free(hr); free(hdy); free(hw); free(ref); free(refh); free(refyh); free(refrs); free(refdx); free(refdw);
    free(got); free(grs); free(gdw); free(gdw1); free(f4y); free(f4h); free(f4yh); free(f9); free(f4rs);
}

int main(void) {
    setenv("DFLASH_KERNELS_BENCH", "1", 1);   /* enables the timing-only dw pieces (kernels/rmsnorm.cu) */
    struct shape_result res[4];
    memset(res, 0, sizeof res);
    one(1000, 1032, &res[0]);        /* awkward: C/8 = 129, a tail past a power-of-two group */
    one(8192 * 8, 128, &res[1]);     /* k norm */
    one(8192 * 32, 128, &res[2]);    /* q norm: 8192 tokens × 32 heads */
    one(8192, 4096, &res[3]);        /* hidden norm of the standard batch: last, so it shows in the tail */
    printf("\ndw pieces, microseconds (median; walk = row walk with shared-memory dw sums, no partial store; "
           "walk+part = plus the partial store; final = the PDL cross-block sum kernel alone; no PDL = dx+dw with "
           "that kernel launched plainly; empty = one empty launch, x2 = two; cv N%% = dx+dw with the dw kernel's "
           "shared-memory carveout hint at N%%)\n");
    printf("%-18s %-3s", "shape", "var");
    for (int m = 0; m < NPIECE; m++) printf(" %9s", piece_names[m]);
    printf(" %9s %9s %9s %9s %9s\n", "empty", "empty x2", "cv 28%", "cv 44%", "cv 100%");
    for (int i = 0; i < 4; i++)
        for (int v = 4; v <= NVAR; v++) {
            char shp[32];
            snprintf(shp, sizeof shp, "%dx%d", res[i].N, res[i].C);
            printf("%-18s v%-2d", shp, v);
            if (!res[i].ok[v]) { printf(" FAILED validation\n"); continue; }
            for (int m = 0; m < NPIECE; m++) printf(" %9.2f", res[i].us[v][m]);
            printf(" %9.2f %9.2f %9.2f %9.2f %9.2f\n", res[i].empty_us, res[i].empty2_us, res[i].cv[v][0], res[i].cv[v][1],
                   res[i].cv[v][2]);
        }
    printf("\nv9 dw sum kernel by NQ float4 columns per CTA (DFLASH_RMSNORM_FIN_NQ; 4 = v9's default), microseconds: "
           "dx+dw / the sum kernel alone; compare v4's dx+dw and final above\n");
    for (int i = 0; i < 4; i++) {
        if (res[i].C <= 256) continue;
        printf("%-18s", "");
        printf("%dx%d", res[i].N, res[i].C);
        for (int q = 0; q < 3; q++)
            if (res[i].nq_us[q][0] < 0) printf("   NQ=%c FAILED", "248"[q]);
            else printf("   NQ=%c %7.2f / %6.2f", "248"[q], res[i].nq_us[q][0], res[i].nq_us[q][1]);
        printf("   (v4 %7.2f / %6.2f)\n", res[i].us[4][3], res[i].us[4][4]);
    }
    printf("v9 forward (y, rstd, h) bitwise = v4:");
    for (int i = 0; i < 4; i++)
        printf("  %dx%d %s", res[i].N, res[i].C, res[i].fwd_same < 0 ? "n/a" : res[i].fwd_same ? "yes" : "NO");
    printf("\n");
    printf("\nsummary, %% of %.0f GB/s (v1 two-pass, v2 K1b register-resident, v3 K1c, v4 K1e default; v5-8 "
           "round-2 backward candidates: 5 clusters of 4, 6 clusters of 8, 7 grid-barrier dw sum, 8 = 5 + 7, "
           "their forward is v4's; v9 round 3: v4 + the many-slice dw sum kernel (C > 256) + the occupancy-sized "
           "two-row forward; target 80%%)\n", BENCH_PEAK_GBS);
    printf("%-18s %-3s", "shape", "var");
    for (int m = 0; m < NMEAS; m++) printf(" %8s", meas_names[m]);
    printf("\n");
    for (int i = 0; i < 4; i++)
        for (int v = 1; v <= NVAR; v++) {
            char shp[32];
            snprintf(shp, sizeof shp, "%dx%d", res[i].N, res[i].C);
            printf("%-18s v%-2d", shp, v);
            if (!res[i].ok[v]) { printf(" FAILED validation\n"); continue; }
            for (int m = 0; m < NMEAS; m++)
                if (res[i].gbs[v][m] > 0) printf(" %7.1f%%", 100 * res[i].gbs[v][m] / BENCH_PEAK_GBS);
                else printf(" %8s", "-");
            printf("\n");
        }
    printf("%s", failed_list[0] ? "FAILED validations:\n" : "all validations ok\n");
    printf("%s", failed_list);
    return bench_failed ? 1 : 0;
}
