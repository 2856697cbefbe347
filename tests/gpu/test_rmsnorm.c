/*
 * tests/gpu/test_rmsnorm.c — GPU RMSNorm (kernels/rmsnorm.h) against the CPU reference on the same
 * bf16-rounded inputs.
 * Covered: plain and fused residual forward; backward dx (=, +=) and dw (deterministic: two runs
 * bit-identical; the scratch's ticket header back to zero after every call); every row-group width 8..256
 * and 1, 2, 4 vectors per lane (C = 8 .. 8192 with odd multiples of 8: 24, 136, 264, 1032, 6152), N = 1,
 * 3, awkward N, more row steps than CTAs, the two-row forward (grids over a wave), both dw endings (last
 * CTA at C <= 256, the PDL sum kernel above), the production shapes, C > 8192 (the two-pass size
 * path: 12288, 16384), one scratch reused across N.
 * The q/k norm pair (rmsnorm_qk_forward / rmsnorm_qk_backward): y, rstd, dx, dx += bitwise two separate
 * calls'; dw against the reference and repeatable; both tickets reset; one tensor empty; C in the
 * one-launch range (8, 64, 128, 136, 256) and above it (512: two backward launches; 2048: two forward
 * launches too); one qk scratch reused across (Nq, Nk).
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

START_TEST(rmsnorm_gpu_shapes) {
    int shapes[][2] = {{1, 8}, {3, 24}, {37, 136}, {5, 264}, {1000, 128}, {513, 64}, {64, 4096}, {2, 16384}, {5, 12288}};
    for (int s = 0; s < 9; s++) {
        one(shapes[s][0], shapes[s][1], 0, 10 + s);
        one(shapes[s][0], shapes[s][1], 1, 20 + s);
    }
}
END_TEST

START_TEST(rmsnorm_gpu_register_shapes) {
    int shapes[][2] = {{7, 1032}, {300, 6152}, {3, 8192}, {10007, 136}, {2001, 4096}, {33, 2048}, {9, 512}, {1000, 8192},
                       {9001, 1024}, {20000, 256}, {513, 8}, {1, 64}, {777, 5120}, {5, 5128}, {300, 6144}, {2000, 4104}};
    for (int s = 0; s < 16; s++) one(shapes[s][0], shapes[s][1], s % 2, 40 + s);
}
END_TEST

/* one shape per loop iteration (each its own timeout): hidden norm (plain, fused), q norm of 8192 tokens
 * × 32 heads, k norm of 8 heads; then the Qwen3.6-27B drafter's (hidden 5120: the backward's 40 KB of
 * dynamic shared memory plus its ~8 KB static exceed the 48 KB default, round 2's "invalid argument";
 * q norm 24 heads × 256, k norm 4 heads) */
START_TEST(rmsnorm_gpu_production) {
    static const int shapes[][3] = {{8192, 4096, 0}, {8192, 4096, 1}, {8192 * 32, 128, 0}, {8192 * 8, 128, 1},
                                    {8192, 5120, 0}, {8192, 5120, 1}, {8192 * 24, 256, 0}, {8192 * 4, 256, 1}};
    one(shapes[_i][0], shapes[_i][1], shapes[_i][2], 30 + _i);
}
END_TEST

/* more than one wave of 256-thread blocks (8 per SM) at one row per group: the two-row forward */
START_TEST(rmsnorm_gpu_two_row_groups) {
    static const int shapes[][2] = {{40001, 128}, {50003, 64}, {40000, 136}, {36000, 256}, {20001, 512}, {9001, 1024}};
    for (int s = 0; s < 6; s++) one(shapes[s][0], shapes[s][1], s % 2, 80 + s);
}
END_TEST

START_TEST(rmsnorm_gpu_scratch_reuse) {
    reuse(128, 140);    /* dw summed by the last CTA */
    reuse(1032, 142);   /* dw summed by the PDL kernel */
}
END_TEST

START_TEST(rmsnorm_gpu_preconditions) {
    bf16 *x = k1_malloc(4096);
    float *w = k1_malloc(4096);
    ck_assert_int_eq(rmsnorm_forward(x, NULL, x, w, 4, 12, 1e-6f, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "multiple of 8"));
    ck_assert_int_eq(rmsnorm_backward(x, w, x, x, w, w, NULL, 4, 16, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "alias"));
    ck_assert_int_eq(rmsnorm_qk_backward(x + 64, w, x, x, w, w, 4, x + 64, NULL, x, x, w, w, 4, w, 16, 0, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "both"));
    cudaFree(x); cudaFree(w);
}
END_TEST

/* ---------------------------------------------------------------- the q/k pair */

/* Two tensors (q: t = 0, k: t = 1) of [Nt, C]: rmsnorm_qk_forward against two rmsnorm_forward calls and the
 * reference; rmsnorm_qk_backward (dx =, dx +=) against two rmsnorm_backward calls bit for bit, dw against
 * the reference (on the GPU's rstd) and repeatable; the tickets reset. */
static void qk_one(int Nq, int Nk, int C, uint64_t seed) {
    const int Nt[2] = {Nq, Nk};
    size_t n[2] = {(size_t)Nq * C, (size_t)Nk * C};
    float *hx[2], *hdy[2], *hdx0[2], *hw[2];
    bf16 *x[2], *dy[2], *dx0[2], *dx[2], *y[2];
    float *w[2], *rstd[2], *dw[2], *scrs[2];
    for (int t = 0; t < 2; t++) {
        size_t m = n[t] ? n[t] : 1;
        hx[t] = k1_randn(&seed, m, -3, 3);
        hdy[t] = k1_randn(&seed, m, -1, 1);
        hdx0[t] = k1_randn(&seed, m, -1, 1);
        hw[t] = k1_randn(&seed, C, 0.5f, 1.5f);
        x[t] = k1_upload_bf16(hx[t], m);
        dy[t] = k1_upload_bf16(hdy[t], m);
        dx0[t] = k1_upload_bf16(hdx0[t], m);
        dx[t] = k1_malloc(2 * m);
        y[t] = k1_malloc(2 * m);
        w[t] = k1_upload(hw[t], 4 * (size_t)C);
        rstd[t] = k1_malloc(4 * (size_t)(Nt[t] ? Nt[t] : 1));
        dw[t] = k1_malloc(4 * (size_t)C);
        scrs[t] = k1_malloc(4 * rmsnorm_backward_scratch_floats(Nt[t], C));
        K1_CUDA(cudaMemset(scrs[t], 0, 4 * rmsnorm_backward_scratch_floats(Nt[t], C)));
    }
    const size_t sf = rmsnorm_qk_backward_scratch_floats(Nq, Nk, C);
    float *scr = k1_malloc(4 * sf);
    K1_CUDA(cudaMemset(scr, 0, 4 * sf));
    char what[96];
    snprintf(what, sizeof what, "qk Nq=%d Nk=%d C=%d", Nq, Nk, C);
    /* forward: separate, then the pair */
    unsigned short *sb[2], *fb[2];
    float *srs[2], *frs[2];
    for (int t = 0; t < 2; t++) {
        K1_LAUNCH(rmsnorm_forward(y[t], rstd[t], x[t], w[t], Nt[t], C, 1e-6f, 0));
        sb[t] = malloc(2 * n[t] + 2); fb[t] = malloc(2 * n[t] + 2);
        srs[t] = malloc(4 * (size_t)Nt[t] + 4); frs[t] = malloc(4 * (size_t)Nt[t] + 4);
    }
    K1_CUDA(cudaDeviceSynchronize());
    for (int t = 0; t < 2; t++) {
        K1_CUDA(cudaMemcpy(sb[t], y[t], 2 * n[t], cudaMemcpyDeviceToHost));
        K1_CUDA(cudaMemcpy(srs[t], rstd[t], 4 * (size_t)Nt[t], cudaMemcpyDeviceToHost));
        k1_poison(y[t], 2 * n[t]);
        k1_poison(rstd[t], 4 * (size_t)Nt[t]);
    }
    K1_LAUNCH(rmsnorm_qk_forward(y[0], rstd[0], x[0], w[0], Nq, y[1], rstd[1], x[1], w[1], Nk, C, 1e-6f, 0));
    K1_CUDA(cudaDeviceSynchronize());
    for (int t = 0; t < 2; t++) {
        K1_CUDA(cudaMemcpy(fb[t], y[t], 2 * n[t], cudaMemcpyDeviceToHost));
        K1_CUDA(cudaMemcpy(frs[t], rstd[t], 4 * (size_t)Nt[t], cudaMemcpyDeviceToHost));
        ck_assert_msg(memcmp(fb[t], sb[t], 2 * n[t]) == 0, "%s: y[%d] differs from a separate call", what, t);
        ck_assert_msg(memcmp(frs[t], srs[t], 4 * (size_t)Nt[t]) == 0, "%s: rstd[%d] differs from a separate call", what, t);
        float *ref = malloc(4 * n[t] + 4), *rrs = malloc(4 * (size_t)Nt[t] + 4), *got = malloc(4 * n[t] + 4);
        rmsnorm_forward_ref(ref, rrs, hx[t], hw[t], Nt[t], C, 1e-6f);
        k1_download_bf16(got, y[t], n[t]);
        ck_assert_msg(test_allclose(what, got, ref, n[t], 1e-2, 1.6e-2), "%s: y[%d]", what, t);
        ck_assert_msg(test_allclose("rstd", frs[t], rrs, Nt[t], 0, 1e-4), "%s: rstd[%d]", what, t);
        free(ref); free(rrs); free(got);
    }
    /* backward dx (=, +=): separate calls' bits, then the pair's */
    for (int acc = 0; acc < 2; acc++) {
        for (int t = 0; t < 2; t++) {
            K1_CUDA(cudaMemcpy(dx[t], dx0[t], 2 * n[t], cudaMemcpyDeviceToDevice));
            K1_CUDA(cudaMemset(dw[t], 0, 4 * (size_t)C));
            K1_LAUNCH(rmsnorm_backward(dx[t], dw[t], dy[t], x[t], w[t], rstd[t], scrs[t], Nt[t], C, acc, 0));
        }
        K1_CUDA(cudaDeviceSynchronize());
        for (int t = 0; t < 2; t++) {
            K1_CUDA(cudaMemcpy(sb[t], dx[t], 2 * n[t], cudaMemcpyDeviceToHost));
            K1_CUDA(cudaMemcpy(dx[t], dx0[t], 2 * n[t], cudaMemcpyDeviceToDevice));
            K1_CUDA(cudaMemset(dw[t], 0, 4 * (size_t)C));
        }
        K1_LAUNCH(rmsnorm_qk_backward(dx[0], dw[0], dy[0], x[0], w[0], rstd[0], Nq, dx[1], dw[1], dy[1], x[1], w[1], rstd[1], Nk, scr, C,
                                      acc, 0));
        K1_CUDA(cudaDeviceSynchronize());
        for (int t = 0; t < 2; t++) {
            K1_CUDA(cudaMemcpy(fb[t], dx[t], 2 * n[t], cudaMemcpyDeviceToHost));
            ck_assert_msg(memcmp(fb[t], sb[t], 2 * n[t]) == 0, "%s: dx[%d] (acc %d) differs from a separate call", what, t, acc);
        }
        unsigned hdr[32];
        K1_CUDA(cudaMemcpy(hdr, scr, sizeof hdr, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 32; i++) ck_assert_msg(hdr[i] == 0, "%s: scratch header word %d = %u", what, i, hdr[i]);
    }
    /* dw (from the last, acc = 1, call: dw was zeroed before it) against the reference; repeatable;
     * dx += against the reference too */
    float *g1 = malloc(4 * (size_t)C), *g2 = malloc(4 * (size_t)C);
    for (int t = 0; t < 2; t++) {
        float *rdx = malloc(4 * n[t] + 4), *rdw = calloc(C, 4), *got = malloc(4 * n[t] + 4);
        memcpy(rdx, hdx0[t], 4 * n[t]);
        for (size_t i = 0; i < n[t]; i++) rdx[i] = bf16_round(rdx[i]);   /* dx0 as uploaded */
        rmsnorm_backward_ref(rdx, rdw, hdy[t], hx[t], hw[t], frs[t], Nt[t], C, 1);
        k1_download_bf16(got, dx[t], n[t]);
        ck_assert_msg(test_allclose("dx+=", got, rdx, n[t], 1e-2 * k1_rms(rdx, n[t]) + 1e-2, 1.6e-2), "%s: dx+=[%d]", what, t);
        K1_CUDA(cudaMemcpy(g1, dw[t], 4 * (size_t)C, cudaMemcpyDeviceToHost));
        ck_assert_msg(test_allclose("dw", g1, rdw, C, 1e-3 * sqrt((double)Nt[t]) + 1e-6, 1e-3), "%s: dw[%d]", what, t);
        free(rdx); free(rdw); free(got);
    }
    K1_CUDA(cudaMemcpy(g1, dw[1], 4 * (size_t)C, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemset(dw[0], 0, 4 * (size_t)C));
    K1_CUDA(cudaMemset(dw[1], 0, 4 * (size_t)C));
    K1_LAUNCH(rmsnorm_qk_backward(dx[0], dw[0], dy[0], x[0], w[0], rstd[0], Nq, dx[1], dw[1], dy[1], x[1], w[1], rstd[1], Nk, scr, C, 0, 0));
    K1_CUDA(cudaMemcpy(g2, dw[1], 4 * (size_t)C, cudaMemcpyDeviceToHost));
    ck_assert_msg(memcmp(g1, g2, 4 * (size_t)C) == 0, "%s: dw[k] not repeatable", what);
    /* dx only (dw NULL): dx bitwise the dw run's */
    for (int t = 0; t < 2; t++) K1_CUDA(cudaMemcpy(sb[t], dx[t], 2 * n[t], cudaMemcpyDeviceToHost));
    K1_LAUNCH(rmsnorm_qk_backward(dx[0], NULL, dy[0], x[0], w[0], rstd[0], Nq, dx[1], NULL, dy[1], x[1], w[1], rstd[1], Nk, NULL, C, 0, 0));
    K1_CUDA(cudaDeviceSynchronize());
    for (int t = 0; t < 2; t++) {
        K1_CUDA(cudaMemcpy(fb[t], dx[t], 2 * n[t], cudaMemcpyDeviceToHost));
        ck_assert_msg(memcmp(fb[t], sb[t], 2 * n[t]) == 0, "%s: dx[%d] without dw differs", what, t);
    }
    for (int t = 0; t < 2; t++) {
        cudaFree(x[t]); cudaFree(dy[t]); cudaFree(dx0[t]); cudaFree(dx[t]); cudaFree(y[t]); cudaFree(w[t]); cudaFree(rstd[t]);
        cudaFree(dw[t]); cudaFree(scrs[t]);
        free(hx[t]); free(hdy[t]); free(hdx0[t]); free(hw[t]); free(sb[t]); free(fb[t]); free(srs[t]); free(frs[t]);
    }
    cudaFree(scr);
    free(g1); free(g2);
}

static const int qk_shapes[][3] = {{40001, 10007, 128}, {1000, 250, 64}, {3, 1, 8}, {0, 100, 128}, {100, 0, 128}, {2001, 513, 136},
                                   {513, 129, 256}, {300, 75, 512}, {20, 5, 2048}, {8192 * 32, 8192 * 8, 128}, {7, 40001, 24},
                                   {8192 * 24, 8192 * 4, 256}};   /* the 27B drafter's q/k norm */

START_TEST(rmsnorm_gpu_qk) {
    for (int s = 0; s < 12; s++) qk_one(qk_shapes[s][0], qk_shapes[s][1], qk_shapes[s][2], 800 + s);
}
END_TEST

/* One qk scratch sized for the largest (Nq, Nk) serves smaller pairs: each dw equals that on a fresh scratch */
START_TEST(rmsnorm_gpu_qk_scratch_reuse) {
    const int C = 128, pairs[][2] = {{40001, 10007}, {1000, 4000}, {1, 1}, {40001, 10007}, {12345, 3}};
    const int NqM = 40001, NkM = 10007;
    uint64_t seed = 870;
    size_t fl = rmsnorm_qk_backward_scratch_floats(NqM, NkM, C);
    for (int i = 0; i < 5; i++) ck_assert(rmsnorm_qk_backward_scratch_floats(pairs[i][0], pairs[i][1], C) <= fl);
    const int Nt[2] = {NqM, NkM};
    bf16 *x[2], *dy[2], *dx[2];
    float *w[2], *rstd[2], *dw[2], *a[2], *b[2];
    for (int t = 0; t < 2; t++) {
        size_t n = (size_t)Nt[t] * C;
        float *hx = k1_randn(&seed, n, -3, 3), *hdy = k1_randn(&seed, n, -1, 1), *hw = k1_randn(&seed, C, 0.5f, 1.5f);
        x[t] = k1_upload_bf16(hx, n); dy[t] = k1_upload_bf16(hdy, n); dx[t] = k1_malloc(2 * n);
        w[t] = k1_upload(hw, 4 * (size_t)C); rstd[t] = k1_malloc(4 * (size_t)Nt[t]); dw[t] = k1_malloc(4 * (size_t)C);
        a[t] = malloc(4 * (size_t)C); b[t] = malloc(4 * (size_t)C);
        free(hx); free(hdy); free(hw);
    }
    K1_LAUNCH(rmsnorm_qk_forward(dx[0], rstd[0], x[0], w[0], NqM, dx[1], rstd[1], x[1], w[1], NkM, C, 1e-6f, 0));
    float *shared = k1_malloc(4 * fl), *fresh = k1_malloc(4 * fl);
    K1_CUDA(cudaMemset(shared, 0, 4 * fl));
    for (int i = 0; i < 5; i++) {
        const int q = pairs[i][0], k = pairs[i][1];
        for (int pass = 0; pass < 2; pass++) {
            float *s = pass ? fresh : shared;
            if (pass) K1_CUDA(cudaMemset(fresh, 0, 4 * fl));
            K1_CUDA(cudaMemset(dw[0], 0, 4 * (size_t)C));
            K1_CUDA(cudaMemset(dw[1], 0, 4 * (size_t)C));
            K1_LAUNCH(rmsnorm_qk_backward(dx[0], dw[0], dy[0], x[0], w[0], rstd[0], q, dx[1], dw[1], dy[1], x[1], w[1], rstd[1], k, s, C, 0, 0));
            for (int t = 0; t < 2; t++) K1_CUDA(cudaMemcpy(pass ? b[t] : a[t], dw[t], 4 * (size_t)C, cudaMemcpyDeviceToHost));
        }
        for (int t = 0; t < 2; t++) ck_assert_msg(memcmp(a[t], b[t], 4 * (size_t)C) == 0, "pair %d: dw[%d] on a reused scratch differs", i, t);
    }
    for (int t = 0; t < 2; t++) {
        cudaFree(x[t]); cudaFree(dy[t]); cudaFree(dx[t]); cudaFree(w[t]); cudaFree(rstd[t]); cudaFree(dw[t]);
        free(a[t]); free(b[t]);
    }
    cudaFree(shared); cudaFree(fresh);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_rmsnorm");
    TCase *tc = tcase_create("gpu_rmsnorm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rmsnorm_gpu_shapes);
    tcase_add_test(tc, rmsnorm_gpu_register_shapes);
    tcase_add_loop_test(tc, rmsnorm_gpu_production, 0, 8);
    tcase_add_test(tc, rmsnorm_gpu_two_row_groups);
    tcase_add_test(tc, rmsnorm_gpu_scratch_reuse);
    tcase_add_test(tc, rmsnorm_gpu_preconditions);
    suite_add_tcase(s, tc);
    /* the q/k pair in its own case: CK_RUN_CASE=gpu_rmsnorm_qk runs it alone */
    TCase *tq = tcase_create("gpu_rmsnorm_qk");
    tcase_set_timeout(tq, 120);
    tcase_add_test(tq, rmsnorm_gpu_qk);
    tcase_add_test(tq, rmsnorm_gpu_qk_scratch_reuse);
    suite_add_tcase(s, tq);
    return test_run_suite(s);
}
