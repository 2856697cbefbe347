/*
 * tests/gpu/test_rmsnorm.c — GPU RMSNorm (kernels/rmsnorm.h) against the CPU reference on the same
 * bf16-rounded inputs: plain, fused residual, q/k-norm shapes (C = 64, 128), tails of every row-group
 * size (C/8 = 1, 3, 17, 33), N = 1, and the production shape [8192, 4096]; backward dx (plain and
 * accumulate) and dw (deterministic: two runs bit-identical). The register-resident kernels (default
 * for C <= 8192) are covered for every row-group width 8..256 and 1, 2, 4 vectors per lane (C = 1032,
 * 6152, 8192 add the 64/256-wide groups with partial rows), and with more row steps than the
 * backward's 264 blocks (N = 10007, 2001: several steps per block, a partial last step). The first,
 * two-pass kernels (DFLASH_RMSNORM_KERNEL=1, the revert switch; always for C > 8192) run too.
 * K1c's default (two rows per row group of <= 32 lanes when the grid exceeds a wave; the dw sum by
 * programmatic dependent launch) is covered for groups of 8, 16 and 32 lanes, 1, 2 and 4 vectors,
 * partial vectors and a partial last block; K1b's path (DFLASH_RMSNORM_KERNEL=2) runs on the same
 * shapes, so a revert lands on tested code. K1e's backward (variant 4, the default) runs on every
 * shape above: dw summed by the last block (C <= 256) or by the PDL sum kernel (C > 256), with
 * several row steps per block; after each call the scratch's ticket header must be back to zero, and
 * one scratch serves calls of several N in a row (rmsnorm_gpu_scratch_reuse). K1c's backward
 * (DFLASH_RMSNORM_KERNEL=3) keeps its own case. The round-2 backward candidates (DFLASH_RMSNORM_KERNEL=5:
 * clusters of 4 adding their dw sums through distributed shared memory, 6: clusters of 8, 7: the dw sum
 * after a grid barrier of a cooperative launch, 8: 5 + 7) run on shapes that take every dw ending
 * (last block, PDL kernel, grid barrier), V = 1, 2 and 4, grids with idle blocks (fewer row steps than
 * a cluster), several steps per block, and the scratch reuse (rmsnorm_gpu_round2_paths); the bench
 * switches DFLASH_RMSNORM_DW_PIECE=4 (dw sum kernel without PDL) and DFLASH_RMSNORM_CARVEOUT (a
 * shared-memory carveout hint) must give correct results too (rmsnorm_gpu_no_pdl_and_carveout).
 * Round 3's variant 9 (DFLASH_RMSNORM_KERNEL=9: the many-slice dw sum kernel, its NQ = 2 / 4 / 8 forms,
 * launched with and without PDL; the occupancy-sized two-row forward) runs the same checks, and its
 * forward must be bitwise variant 4's (rmsnorm_gpu_v9_*).
 *
 * Tolerances: y is one bf16 rounding of an fp32 value (≤ 2^-9 relative): rtol 1.6e-2, atol 1e-2.
 * rstd: fp32 sum of squares vs double, rtol 1e-4. dx = rstd·(w·dy − x̂·m) cancels, so its absolute
 * error scales with rstd·|w·dy|, not |dx|: atol 1e-2·rms(ref). dw sums N products in fp32 in a
 * different order than the reference's fp32 running sum; |dw| ~ sqrt(N)/2: atol 1e-3·sqrt(N), rtol 1e-3.
 */
#include "kernels/rmsnorm.h"
#include "k1util.h"

static void one(int N, int C, int resid, uint64_t seed) {
    size_t n = (size_t)N * C;
    float *x = k1_randn(&seed, n, -3, 3), *r = k1_randn(&seed, n, -3, 3), *w = k1_randn(&seed, C, 0.5f, 1.5f);
    float *dy = k1_randn(&seed, n, -1, 1), *dx0 = k1_randn(&seed, n, -1, 1);
    float *y = malloc(4 * n), *rstd = malloc(4 * (size_t)N), *got = malloc(4 * n), *dx = malloc(4 * n);
    float *dw = calloc(C, 4), *grstd = malloc(4 * (size_t)N), *gdw = malloc(4 * (size_t)C);
    bf16 *d_x = k1_upload_bf16(x, n), *d_r = k1_upload_bf16(r, n), *d_dy = k1_upload_bf16(dy, n);
    bf16 *d_dx = k1_upload_bf16(dx0, n), *d_y = k1_malloc(2 * n);
    float *d_w = k1_upload(w, 4 * (size_t)C), *d_rstd = k1_malloc(4 * (size_t)N), *d_dw = k1_malloc(4 * (size_t)C);
    float *d_scr = k1_malloc(4 * rmsnorm_backward_scratch_floats(N, C));
    K1_CUDA(cudaMemset(d_scr, 0, 4 * rmsnorm_backward_scratch_floats(N, C)));   /* once, as rmsnorm.h asks */
    k1_poison(d_y, 2 * n);
    char what[96];
    snprintf(what, sizeof what, "N=%d C=%d resid=%d", N, C, resid);
    if (resid) {
        K1_LAUNCH(rmsnorm_residual_forward(d_y, d_r, d_rstd, d_x, d_w, N, C, 1e-6f, 0));
        /* the GPU rounds h = x + r to bf16 before normalising; so does the reference input */
        for (size_t i = 0; i < n; i++) r[i] = bf16_round(x[i] + r[i]);
        float *gh = malloc(4 * n);
        k1_download_bf16(gh, d_r, n);
        ck_assert(test_allclose("residual h", gh, r, n, 0, 0));   /* exact: same fp32 add, same rounding */
        free(gh);
        rmsnorm_forward_ref(y, rstd, r, w, N, C, 1e-6f);
    } else {
        K1_LAUNCH(rmsnorm_forward(d_y, d_rstd, d_x, d_w, N, C, 1e-6f, 0));
        rmsnorm_forward_ref(y, rstd, x, w, N, C, 1e-6f);
    }
    K1_CUDA(cudaDeviceSynchronize());
    k1_download_bf16(got, d_y, n);
    ck_assert_msg(test_allclose(what, got, y, n, 1e-2, 1.6e-2), "%s: y", what);
    K1_CUDA(cudaMemcpy(grstd, d_rstd, 4 * (size_t)N, cudaMemcpyDeviceToHost));
    ck_assert_msg(test_allclose("rstd", grstd, rstd, N, 0, 1e-4), "%s: rstd", what);

    /* backward (input of the norm: x, or h for the fused form), accumulate onto dx0 */
    const float *xin = resid ? r : x;
    bf16 *d_in = resid ? d_r : d_x;
    K1_CUDA(cudaMemset(d_dw, 0, 4 * (size_t)C));
    K1_LAUNCH(rmsnorm_backward(d_dx, d_dw, d_dy, d_in, d_w, d_rstd, d_scr, N, C, 1, 0));
    K1_CUDA(cudaDeviceSynchronize());
    memcpy(dx, dx0, 4 * n);
    rmsnorm_backward_ref(dx, dw, dy, xin, w, grstd, N, C, 1);
    k1_download_bf16(got, d_dx, n);
    ck_assert_msg(test_allclose("dx", got, dx, n, 1e-2 * k1_rms(dx, n), 1.6e-2), "%s: dx", what);
    K1_CUDA(cudaMemcpy(gdw, d_dw, 4 * (size_t)C, cudaMemcpyDeviceToHost));
    ck_assert_msg(test_allclose("dw", gdw, dw, C, 1e-3 * sqrt((double)N), 1e-3),
                  "%s: dw", what);
    /* dw is deterministic: a second run into zeroed dw gives identical bits */
    float *gdw2 = malloc(4 * (size_t)C);
    K1_CUDA(cudaMemset(d_dw, 0, 4 * (size_t)C));
    K1_LAUNCH(rmsnorm_backward(d_dx, d_dw, d_dy, d_in, d_w, d_rstd, d_scr, N, C, 0, 0));
    K1_CUDA(cudaMemcpy(gdw2, d_dw, 4 * (size_t)C, cudaMemcpyDeviceToHost));
    ck_assert(memcmp(gdw, gdw2, 4 * (size_t)C) == 0);
    unsigned hdr[32];
    K1_CUDA(cudaMemcpy(hdr, d_scr, sizeof hdr, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 32; i++) ck_assert_msg(hdr[i] == 0, "%s: scratch header word %d = %u after the call", what, i, hdr[i]);
    /* accumulate_dx = 0 overwrites */
    float *dxp = malloc(4 * n);
    rmsnorm_backward_ref(dxp, NULL, dy, xin, w, grstd, N, C, 0);
    k1_download_bf16(got, d_dx, n);
    ck_assert_msg(test_allclose("dx (overwrite)", got, dxp, n, 1e-2 * k1_rms(dxp, n), 1.6e-2), "%s: dx overwrite", what);
    free(dxp); free(gdw2);
    cudaFree(d_x); cudaFree(d_r); cudaFree(d_dy); cudaFree(d_dx); cudaFree(d_y); cudaFree(d_w); cudaFree(d_rstd);
    cudaFree(d_dw); cudaFree(d_scr);
    free(x); free(r); free(w); free(dy); free(dx0); free(y); free(rstd); free(got); free(dx); free(dw); free(grstd); free(gdw);
}

START_TEST(rmsnorm_gpu_shapes) {
    int shapes[][2] = {{1, 8}, {3, 24}, {37, 136}, {5, 264}, {1000, 128}, {513, 64}, {64, 4096}, {2, 16384}};
    for (int s = 0; s < 8; s++) {
        one(shapes[s][0], shapes[s][1], 0, 10 + s);
        one(shapes[s][0], shapes[s][1], 1, 20 + s);
    }
}
END_TEST

START_TEST(rmsnorm_gpu_register_shapes) {
    int shapes[][2] = {{7, 1032}, {300, 6152}, {3, 8192}, {10007, 136}, {2001, 4096}, {33, 2048}, {9, 512}};
    for (int s = 0; s < 7; s++) {
        one(shapes[s][0], shapes[s][1], 0, 40 + s);
        one(shapes[s][0], shapes[s][1], 1, 50 + s);
    }
}
END_TEST

START_TEST(rmsnorm_gpu_twopass) {
    setenv("DFLASH_RMSNORM_KERNEL", "1", 1);
    int shapes[][2] = {{1, 8}, {37, 136}, {5, 264}, {513, 64}, {64, 4096}, {7, 1032}};
    for (int s = 0; s < 6; s++) {
        one(shapes[s][0], shapes[s][1], 0, 60 + s);
        one(shapes[s][0], shapes[s][1], 1, 70 + s);
    }
    unsetenv("DFLASH_RMSNORM_KERNEL");
}
END_TEST

START_TEST(rmsnorm_gpu_production) {
    one(8192, 4096, 0, 30);
    one(8192, 4096, 1, 31);
    one(8192 * 32, 128, 0, 32);   /* q norm of 8192 tokens × 32 heads */
}
END_TEST

/* more than one wave of 256-thread blocks (8 per SM) at one row per group: the two-row kernel */
static const int two_row_shapes[][2] = {{40001, 128}, {50003, 64}, {40000, 136}, {36000, 256}, {20001, 512}, {9001, 1024}};

START_TEST(rmsnorm_gpu_two_row_groups) {
    for (int s = 0; s < 6; s++) {
        one(two_row_shapes[s][0], two_row_shapes[s][1], 0, 80 + s);
        one(two_row_shapes[s][0], two_row_shapes[s][1], 1, 90 + s);
    }
}
END_TEST

START_TEST(rmsnorm_gpu_k1b_path) {
    setenv("DFLASH_RMSNORM_KERNEL", "2", 1);
    for (int s = 0; s < 6; s++) one(two_row_shapes[s][0], two_row_shapes[s][1], s % 2, 100 + s);
    one(2001, 4096, 1, 110);
    unsetenv("DFLASH_RMSNORM_KERNEL");
}
END_TEST

START_TEST(rmsnorm_gpu_k1c_path) {
    setenv("DFLASH_RMSNORM_KERNEL", "3", 1);
    for (int s = 0; s < 6; s++) one(two_row_shapes[s][0], two_row_shapes[s][1], s % 2, 120 + s);
    one(2001, 4096, 1, 130);
    one(3, 8192, 0, 131);
    unsetenv("DFLASH_RMSNORM_KERNEL");
}
END_TEST

/* One scratch, sized for the largest N, serves a sequence of backward calls of different N at one C
 * (the ticket must be reset by every call, the partials region must fit): each dw matches that of a
 * call on a fresh scratch bit for bit. */
static void reuse(int C, uint64_t seed) {
    const int Ns[] = {40001, 1000, 1, 40001, 12345, 257};
    const int Nmax = 40001;
    size_t n = (size_t)Nmax * C, fl = 0;
    for (int i = 0; i < 6; i++) {
        size_t f = rmsnorm_backward_scratch_floats(Ns[i], C);
        ck_assert(f <= rmsnorm_backward_scratch_floats(Nmax, C));
        if (f > fl) fl = f;
    }
    float *x = k1_randn(&seed, n, -3, 3), *w = k1_randn(&seed, C, 0.5f, 1.5f), *dy = k1_randn(&seed, n, -1, 1);
    bf16 *d_x = k1_upload_bf16(x, n), *d_dy = k1_upload_bf16(dy, n), *d_dx = k1_malloc(2 * n);
    float *d_w = k1_upload(w, 4 * (size_t)C), *d_rstd = k1_malloc(4 * (size_t)Nmax), *d_dw = k1_malloc(4 * (size_t)C);
    float *d_y = k1_malloc(2 * n), *shared = k1_malloc(4 * fl), *fresh = k1_malloc(4 * fl);
    float *a = malloc(4 * (size_t)C), *b = malloc(4 * (size_t)C);
    K1_CUDA(cudaMemset(shared, 0, 4 * fl));
    K1_LAUNCH(rmsnorm_forward((bf16 *)d_y, d_rstd, d_x, d_w, Nmax, C, 1e-6f, 0));
    for (int i = 0; i < 6; i++) {
        K1_CUDA(cudaMemset(d_dw, 0, 4 * (size_t)C));
        K1_LAUNCH(rmsnorm_backward(d_dx, d_dw, d_dy, d_x, d_w, d_rstd, shared, Ns[i], C, 0, 0));
        K1_CUDA(cudaMemcpy(a, d_dw, 4 * (size_t)C, cudaMemcpyDeviceToHost));
        K1_CUDA(cudaMemset(fresh, 0, 4 * fl));
        K1_CUDA(cudaMemset(d_dw, 0, 4 * (size_t)C));
        K1_LAUNCH(rmsnorm_backward(d_dx, d_dw, d_dy, d_x, d_w, d_rstd, fresh, Ns[i], C, 0, 0));
        K1_CUDA(cudaMemcpy(b, d_dw, 4 * (size_t)C, cudaMemcpyDeviceToHost));
        ck_assert_msg(memcmp(a, b, 4 * (size_t)C) == 0, "C=%d N=%d: dw on a reused scratch differs", C, Ns[i]);
        double s = 0;
        for (int c = 0; c < C; c++) s += fabs(a[c]);
        ck_assert_msg(s > 0, "C=%d N=%d: dw is all zero", C, Ns[i]);
    }
    cudaFree(d_x); cudaFree(d_dy); cudaFree(d_dx); cudaFree(d_w); cudaFree(d_rstd); cudaFree(d_dw); cudaFree(d_y);
    cudaFree(shared); cudaFree(fresh);
    free(x); free(w); free(dy); free(a); free(b);
}

START_TEST(rmsnorm_gpu_scratch_reuse) {
    reuse(128, 140);    /* dw summed by the last block */
    reuse(1024, 141);   /* dw summed by the PDL kernel */
}
END_TEST

/* variants 5-8 (round 2): every backward ending, V = 1 / 2 / 4, N = 1 and 3 (blocks with no row step),
 * several row steps per block; forward = variant 4's, run again by one() */
START_TEST(rmsnorm_gpu_round2_paths) {
    static const int shapes[][2] = {{40001, 128}, {1, 64}, {3, 8192}, {2001, 4096}, {300, 6152}, {10007, 136}, {7, 1032}, {9001, 1024}};
    static const char *vars[] = {"5", "6", "7", "8"};
    const int v = _i;   /* one variant per loop iteration: each gets its own timeout */
    setenv("DFLASH_RMSNORM_KERNEL", vars[v], 1);
    for (int s = 0; s < 8; s++) one(shapes[s][0], shapes[s][1], (s + v) % 2, 200 + 10 * v + s);
    reuse(128, 240 + v);
    reuse(1024, 250 + v);
    unsetenv("DFLASH_RMSNORM_KERNEL");
}
END_TEST

/* DFLASH_RMSNORM_DW_PIECE=4: variant 4 with the dw sum kernel launched without PDL (a correct
 * backward, measured by the bench against the PDL launch); and the carveout hint, which must not
 * change results */
START_TEST(rmsnorm_gpu_no_pdl_and_carveout) {
    setenv("DFLASH_RMSNORM_DW_PIECE", "4", 1);
    one(2001, 4096, 0, 300);
    one(3, 8192, 1, 301);
    one(40001, 128, 0, 302);
    unsetenv("DFLASH_RMSNORM_DW_PIECE");
    setenv("DFLASH_RMSNORM_CARVEOUT", "28", 1);
    one(2001, 4096, 1, 303);
    setenv("DFLASH_RMSNORM_KERNEL", "5", 1);
    one(2001, 4096, 0, 304);
    unsetenv("DFLASH_RMSNORM_KERNEL");
    unsetenv("DFLASH_RMSNORM_CARVEOUT");
    one(2001, 4096, 0, 305);
}
END_TEST

/* Round 3, variant 9 (DFLASH_RMSNORM_KERNEL=9): variant 4 with the many-slice dw sum kernel for
 * C > 256 (DFLASH_RMSNORM_FIN_NQ = 4, its default, and the bench's 2 and 8) and the occupancy-sized
 * two-row forward. Every dw ending (last block at C <= 256, the new sum kernel), V = 1 / 2 / 4, N = 1
 * and 3, several steps per block, nb > 256 slices (8192 x 4096: 391 blocks), the scratch reuse; the
 * sum kernel launched without PDL (DW_PIECE=4, as a device without PDL would) is a correct backward. */
static const int v9_shapes[][2] = {{40001, 128}, {1, 64}, {3, 8192}, {2001, 4096}, {300, 6152}, {10007, 136},
                                   {7, 1032}, {9001, 1024}, {20000, 256}, {20001, 136}, {8192, 4096}};

START_TEST(rmsnorm_gpu_v9_paths) {
    setenv("DFLASH_RMSNORM_KERNEL", "9", 1);
    for (int s = 0; s < 11; s++) one(v9_shapes[s][0], v9_shapes[s][1], s % 2, 400 + s);
    reuse(128, 420);
    reuse(1024, 421);
    unsetenv("DFLASH_RMSNORM_KERNEL");
}
END_TEST

START_TEST(rmsnorm_gpu_v9_nq_and_no_pdl) {
    static const char *nq[] = {"2", "8"};
    setenv("DFLASH_RMSNORM_KERNEL", "9", 1);
    for (int i = 0; i < 2; i++) {
        setenv("DFLASH_RMSNORM_FIN_NQ", nq[i], 1);
        one(2001, 4096, i, 430 + i);
        one(9001, 1024, 1 - i, 432 + i);
        one(300, 6152, 0, 434 + i);
        reuse(1024, 436 + i);
    }
    unsetenv("DFLASH_RMSNORM_FIN_NQ");
    setenv("DFLASH_RMSNORM_DW_PIECE", "4", 1);   /* no PDL: griddepcontrol.wait must be a no-op */
    one(2001, 4096, 0, 440);
    one(3, 8192, 1, 441);
    one(8192, 4096, 0, 442);
    unsetenv("DFLASH_RMSNORM_DW_PIECE");
    unsetenv("DFLASH_RMSNORM_KERNEL");
}
END_TEST

/* Variant 9's forward takes other kernels/grids than variant 4's on some shapes (two-row at 4 blocks
 * per SM; two-row from the queried one-row occupancy: C = 136 / 256 at ~20000 rows) but computes every
 * row the same way: y, rstd and the fused h must be bitwise variant 4's. */
static void fwd_same(int N, int C, int resid, uint64_t seed) {
    size_t n = (size_t)N * C;
    float *x = k1_randn(&seed, n, -3, 3), *r = k1_randn(&seed, n, -3, 3), *w = k1_randn(&seed, C, 0.5f, 1.5f);
    bf16 *d_x = k1_upload_bf16(x, n), *d_r0 = k1_upload_bf16(r, n), *d_r = k1_malloc(2 * n), *d_y = k1_malloc(2 * n);
    float *d_w = k1_upload(w, 4 * (size_t)C), *d_rstd = k1_malloc(4 * (size_t)N);
    float *y[2], *h[2], *rs[2];
    for (int v = 0; v < 2; v++) {
        setenv("DFLASH_RMSNORM_KERNEL", v ? "9" : "4", 1);
        y[v] = malloc(4 * n);
        h[v] = malloc(4 * n);
        rs[v] = malloc(4 * (size_t)N);
        k1_poison(d_y, 2 * n);
        k1_poison(d_rstd, 4 * (size_t)N);
        K1_CUDA(cudaMemcpy(d_r, d_r0, 2 * n, cudaMemcpyDeviceToDevice));
        if (resid) K1_LAUNCH(rmsnorm_residual_forward(d_y, d_r, d_rstd, d_x, d_w, N, C, 1e-6f, 0));
        else K1_LAUNCH(rmsnorm_forward(d_y, d_rstd, d_x, d_w, N, C, 1e-6f, 0));
        K1_CUDA(cudaDeviceSynchronize());
        k1_download_bf16(y[v], d_y, n);
        k1_download_bf16(h[v], d_r, n);
        K1_CUDA(cudaMemcpy(rs[v], d_rstd, 4 * (size_t)N, cudaMemcpyDeviceToHost));
    }
    unsetenv("DFLASH_RMSNORM_KERNEL");
    ck_assert_msg(memcmp(y[0], y[1], 4 * n) == 0, "N=%d C=%d resid=%d: v9 y differs from v4", N, C, resid);
    ck_assert_msg(memcmp(rs[0], rs[1], 4 * (size_t)N) == 0, "N=%d C=%d resid=%d: v9 rstd differs from v4", N, C, resid);
    ck_assert_msg(memcmp(h[0], h[1], 4 * n) == 0, "N=%d C=%d resid=%d: v9 h differs from v4", N, C, resid);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += fabs(y[1][i]);
    ck_assert_msg(s > 0 && s == s, "N=%d C=%d: y is zero or NaN", N, C);
    for (int v = 0; v < 2; v++) { free(y[v]); free(h[v]); free(rs[v]); }
    cudaFree(d_x); cudaFree(d_r0); cudaFree(d_r); cudaFree(d_y); cudaFree(d_w); cudaFree(d_rstd);
    free(x); free(r); free(w);
}

START_TEST(rmsnorm_gpu_v9_forward_bitwise) {
    static const int shapes[][2] = {{65536, 128}, {20000, 256}, {20001, 136}, {40001, 128}, {50003, 64}, {36000, 256},
                                    {9001, 1024}, {1000, 1032}};
    for (int s = 0; s < 8; s++) {
        fwd_same(shapes[s][0], shapes[s][1], 0, 500 + s);
        fwd_same(shapes[s][0], shapes[s][1], 1, 510 + s);
    }
}
END_TEST

START_TEST(rmsnorm_gpu_preconditions) {
    bf16 *x = k1_malloc(4096);
    float *w = k1_malloc(4096);
    ck_assert_int_eq(rmsnorm_forward(x, NULL, x, w, 4, 12, 1e-6f, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of 8"));
    ck_assert_int_eq(rmsnorm_backward(x, w, x, x, w, w, NULL, 4, 16, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "alias"));
    cudaFree(x); cudaFree(w);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_rmsnorm");
    TCase *tc = tcase_create("gpu_rmsnorm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rmsnorm_gpu_shapes);
    tcase_add_test(tc, rmsnorm_gpu_register_shapes);
    tcase_add_test(tc, rmsnorm_gpu_twopass);
    tcase_add_test(tc, rmsnorm_gpu_production);
    tcase_add_test(tc, rmsnorm_gpu_two_row_groups);
    tcase_add_test(tc, rmsnorm_gpu_k1b_path);
    tcase_add_test(tc, rmsnorm_gpu_k1c_path);
    tcase_add_test(tc, rmsnorm_gpu_scratch_reuse);
    tcase_add_loop_test(tc, rmsnorm_gpu_round2_paths, 0, 4);
    tcase_add_test(tc, rmsnorm_gpu_no_pdl_and_carveout);
    tcase_add_test(tc, rmsnorm_gpu_v9_paths);
    tcase_add_test(tc, rmsnorm_gpu_v9_nq_and_no_pdl);
    tcase_add_test(tc, rmsnorm_gpu_v9_forward_bitwise);
    tcase_add_test(tc, rmsnorm_gpu_preconditions);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
