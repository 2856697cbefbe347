/*
 * tests/gpu/test_lmhead_loss.c — lmhead_loss_forward/backward on the GPU against the CPU reference
 * (kernels/lmhead_loss.h): KL and CE, no weights, exp-decay and D-PACE, a vocabulary tail with several
 * chunks and the single-chunk path, a size of 1, the pruned-head gather, and the trainer's budget mode by padding
 * with the per-row argmaxes of lmhead_loss_ws_rows (budget_one).
 *
 * Tolerances (style.md low-precision rule): the device rounds the normed target state and both logit
 * rows to bf16, so the reference is also run in that precision (round_bf16 = 1). The kernel's error
 * against the fp32 reference must be at most 2x the bf16 reference's error for the loss, per-row
 * losses and weights, and 3x for dxn (a gradient), each plus a floor of 1e-6 of the value's scale for
 * cases where the baseline happens to be ~0. Agreement counts: total exact; correct within 1% of the
 * total of the bf16 reference (bf16 logits tie often, and fp32-vs-double accumulation can flip a tie).
 */
#include <cuda_runtime_api.h>

#include "kernels/blas.h"
#include "kernels/lmhead_loss.h"
#include "k1util.h"


static void one(int T, int N, int B, int D, int V, int loss, int weighting, int chunk, uint64_t seed) {
    lmhead_loss_config c = {T, N, B, D, V, loss, weighting, 4.0f, 0.5f, 1e-6f};
    int R = N * B;
    uint64_t rng = seed;
    size_t nx = (size_t)R * D, nh = (size_t)V * D, nl = (size_t)T * D;
    bf16 *xb = malloc(2 * nx), *hb = malloc(2 * nh), *vb = malloc(2 * nh), *lb = malloc(2 * nl);
    float *x = malloc(4 * nx), *h = malloc(4 * nh), *vh = malloc(4 * nh), *last = malloc(4 * nl), *w = malloc(4 * (size_t)D);
    /* logits of std ~ 3: x, heads ~ U(-1,1)·k so that the softmax is neither flat nor one-hot */
    float sc = sqrtf(27.0f / D);
    k1_fill_bf16(&rng, xb, x, nx, -1, 1);
    k1_fill_bf16(&rng, hb, h, nh, -sc, sc);
    k1_fill_bf16(&rng, vb, vh, nh, -sc, sc);
    k1_fill_bf16(&rng, lb, last, nl, -3, 3);
    for (int e = 0; e < D; e++) w[e] = test_rng_uniform(&rng, 0.5f, 1.5f);
    int32_t *anchors = malloc(4 * (size_t)N);
    uint8_t *valid = malloc((size_t)N), *mask = malloc((size_t)T);
    for (int p = 0; p < T; p++) mask[p] = test_rng_next(&rng) % 10 < 7;
    for (int b = 0; b < N; b++) {
        valid[b] = b < N - N / 8;   /* the last eighth are padding slots */
        anchors[b] = valid[b] && T > B ? (int)(test_rng_next(&rng) % (uint64_t)(T - B)) : 0;
    }
    float L32, Lbf, *rl32 = malloc(4 * (size_t)R), *rlbf = malloc(4 * (size_t)R), *rw32 = malloc(4 * (size_t)R),
          *rwbf = malloc(4 * (size_t)R), *dx32 = malloc(4 * nx), *dxbf = malloc(4 * nx);
    int32_t *c32 = malloc(4 * (size_t)B), *t32 = malloc(4 * (size_t)B), *cbf = malloc(4 * (size_t)B), *tbf = malloc(4 * (size_t)B);
    char err[256];
    ck_assert_msg(lmhead_loss_forward_ref(&c, x, h, vh, w, last, anchors, valid, mask, 0, &L32, rl32, rw32, c32, t32, err,
                                          sizeof err) == 0, "%s", err);
    ck_assert(lmhead_loss_forward_ref(&c, x, h, vh, w, last, anchors, valid, mask, 1, &Lbf, rlbf, rwbf, cbf, tbf, err,
                                      sizeof err) == 0);
    ck_assert(lmhead_loss_backward_ref(&c, x, h, vh, w, last, anchors, valid, mask, 0, rw32, dx32, err, sizeof err) == 0);
    ck_assert(lmhead_loss_backward_ref(&c, x, h, vh, w, last, anchors, valid, mask, 1, rwbf, dxbf, err, sizeof err) == 0);

    bf16 *d_x = k1_upload(xb, 2 * nx), *d_h = k1_upload(hb, 2 * nh), *d_vh = k1_upload(vb, 2 * nh), *d_last = k1_upload(lb, 2 * nl);
    float *d_w = k1_upload(w, 4 * (size_t)D);
    int32_t *d_a = k1_upload(anchors, 4 * (size_t)N);
    uint8_t *d_valid = k1_upload(valid, (size_t)N), *d_mask = k1_upload(mask, (size_t)T);
    float *d_L, *d_rl, *d_rw, *d_dx;
    int32_t *d_c, *d_t;
    K1_CUDA(cudaMalloc((void **)&d_L, 4));
    K1_CUDA(cudaMalloc((void **)&d_rl, 4 * (size_t)R));
    K1_CUDA(cudaMalloc((void **)&d_rw, 4 * (size_t)R));
    K1_CUDA(cudaMalloc((void **)&d_dx, 4 * nx));
    K1_CUDA(cudaMalloc((void **)&d_c, 4 * (size_t)B));
    K1_CUDA(cudaMalloc((void **)&d_t, 4 * (size_t)B));
    K1_CUDA(cudaMemset(d_dx, 0xff, 4 * nx));   /* poison */
    K1_CUDA(cudaMemset(d_rl, 0xff, 4 * (size_t)R));
    lmhead_loss_ws *ws;
    ck_assert_msg(lmhead_loss_ws_init(&ws, &c, chunk) == 0, "%s", kernels_error());
    ck_assert_msg(lmhead_loss_forward(ws, &c, d_x, d_h, d_vh, d_w, d_last, d_a, d_valid, d_mask, d_L, d_rl, d_rw, d_c, d_t,
                                      0) == 0, "%s", kernels_error());
    ck_assert_msg(lmhead_loss_backward(ws, &c, d_x, d_h, d_vh, d_rw, d_dx, 0) == 0, "%s", kernels_error());
    K1_CUDA(cudaDeviceSynchronize());
    float Lg, *rlg = malloc(4 * (size_t)R), *rwg = malloc(4 * (size_t)R), *dxg = malloc(4 * nx);
    int32_t *cg = malloc(4 * (size_t)B), *tg = malloc(4 * (size_t)B);
    K1_CUDA(cudaMemcpy(&Lg, d_L, 4, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(rlg, d_rl, 4 * (size_t)R, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(rwg, d_rw, 4 * (size_t)R, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(dxg, d_dx, 4 * nx, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(cg, d_c, 4 * (size_t)B, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(tg, d_t, 4 * (size_t)B, cudaMemcpyDeviceToHost));

    double eL = fabs((double)Lg - L32), bL = fabs((double)Lbf - L32);
    double erl = k1_max_abs_diff(rlg, rl32, R), brl = k1_max_abs_diff(rlbf, rl32, R);
    double erw = k1_max_abs_diff(rwg, rw32, R), brw = k1_max_abs_diff(rwbf, rw32, R);
    double edx = k1_max_abs_diff(dxg, dx32, nx), bdx = k1_max_abs_diff(dxbf, dx32, nx);
    fprintf(stderr, "T=%d N=%d B=%d D=%d V=%d loss=%d w=%d chunk=%d: L %.6g (err %.3g, bf16 ref %.3g) row_loss %.3g/%.3g "
            "weight %.3g/%.3g dxn %.3g/%.3g (max %.3g)\n", T, N, B, D, V, loss, weighting, chunk, L32, eL, bL, erl, brl, erw,
            brw, edx, bdx, k1_max_abs(dx32, nx));
    ck_assert_msg(eL <= 2 * bL + 1e-6 * fabs(L32) + 1e-7, "loss: err %.4g > 2 x %.4g", eL, bL);
    ck_assert_msg(erl <= 2 * brl + 1e-6 * k1_max_abs(rl32, R) + 1e-7, "row_loss: err %.4g > 2 x %.4g", erl, brl);
    ck_assert_msg(erw <= 2 * brw + 1e-6 * k1_max_abs(rw32, R) + 1e-7, "row_weight: err %.4g > 2 x %.4g", erw, brw);
    ck_assert_msg(edx <= 3 * bdx + 1e-6 * k1_max_abs(dx32, nx) + 1e-9, "dxn: err %.4g > 3 x %.4g", edx, bdx);
    for (int j = 0; j < B; j++) {
        ck_assert_int_eq(tg[j], t32[j]);
        ck_assert_msg(abs(cg[j] - cbf[j]) <= tbf[j] / 100 + 1, "correct[%d]: gpu %d, bf16 ref %d of %d", j, cg[j], cbf[j], tbf[j]);
    }
    lmhead_loss_ws_free(ws);
    cudaFree(d_x); cudaFree(d_h); cudaFree(d_vh); cudaFree(d_last); cudaFree(d_w); cudaFree(d_a); cudaFree(d_valid);
    cudaFree(d_mask); cudaFree(d_L); cudaFree(d_rl); cudaFree(d_rw); cudaFree(d_dx); cudaFree(d_c); cudaFree(d_t);
    free(xb); free(hb); free(vb); free(lb); free(x); free(h); free(vh); free(last); free(w); free(anchors); free(valid);
    free(mask); free(rl32); free(rlbf); free(rw32); free(rwbf); free(dx32); free(dxbf); free(c32); free(t32); free(cbf);
    free(tbf); free(rlg); free(rwg); free(dxg); free(cg); free(tg);
}

START_TEST(lmhead_gpu_small) {
    one(97, 5, 16, 64, 1000, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_NONE, 256, 1);        /* 4 chunks, tail of 232 */
    one(97, 5, 16, 64, 1000, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_NONE, 0, 2);          /* one chunk: logits reused */
    one(97, 5, 16, 64, 1001, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 512, 3);
    one(97, 5, 16, 64, 999, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 0, 4);
    one(17, 1, 16, 8, 1, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_NONE, 8, 5);              /* V = 1, one block */
}
END_TEST

START_TEST(lmhead_gpu_larger) {
    one(2048, 8, 16, 512, 32000, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 8192, 6);
    one(2048, 8, 16, 512, 32000, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 0, 7);
}
END_TEST


/* The trainer's budget mode on the device (drafter_gpu.c): the batch of T rows packed against budget > T runs the
 * device loss at T' = budget on last and loss_mask padded with zeros; anchors up to budget - B - 1 (< T), so blocks
 * run past T. Against lmhead_*_mode_ref at T with mode {budget}: the same rule as one(), the row masks exactly,
 * and the per-row argmaxes of lmhead_loss_ws_rows against lmhead_argmax_ref on the supervised rows (bf16 ties
 * may flip a few: at most 1% + 1 of them). sfa: the sample_from_anchor mode (lmhead_loss_forward_mode). */
static void budget_one(int T, int budget, int N, int B, int D, int V, int loss, int weighting, int sfa, uint64_t seed) {
    lmhead_loss_config c = {T, N, B, D, V, loss, weighting, 4.0f, 0.5f, 1e-6f}, cg = c;
    cg.T = budget;
    lmhead_loss_mode md = {budget, sfa};
    int R = N * B;
    uint64_t rng = seed;
    size_t nx = (size_t)R * D, nh = (size_t)V * D, nl = (size_t)T * D, nlp = (size_t)budget * D;
    bf16 *xb = malloc(2 * nx), *hb = malloc(2 * nh), *vb = malloc(2 * nh), *lb = calloc(nlp, 2);
    float *x = malloc(4 * nx), *h = malloc(4 * nh), *vh = malloc(4 * nh), *last = malloc(4 * nl), *w = malloc(4 * (size_t)D);
    float sc = sqrtf(27.0f / D);
    k1_fill_bf16(&rng, xb, x, nx, -1, 1);
    k1_fill_bf16(&rng, hb, h, nh, -sc, sc);
    k1_fill_bf16(&rng, vb, vh, nh, -sc, sc);
    k1_fill_bf16(&rng, lb, last, nl, -3, 3);   /* rows T..budget-1 of lb stay 0 */
    for (int e = 0; e < D; e++) w[e] = test_rng_uniform(&rng, 0.5f, 1.5f);
    int32_t *anchors = malloc(4 * (size_t)N);
    uint8_t *valid = malloc((size_t)N), *mask = calloc((size_t)budget, 1);
    for (int p = 0; p < T; p++) mask[p] = test_rng_next(&rng) % 10 < 7;
    int amax = budget - B < T ? budget - B : T;
    for (int b = 0; b < N; b++) {
        valid[b] = b < N - N / 8;
        anchors[b] = valid[b] ? (int)(test_rng_next(&rng) % (uint64_t)amax) : 0;
    }
    anchors[0] = amax - 1;   /* a block that runs past T */
    float L32, Lbf, *rl32 = malloc(4 * (size_t)R), *rlbf = malloc(4 * (size_t)R), *rw32 = malloc(4 * (size_t)R),
          *rwbf = malloc(4 * (size_t)R), *dx32 = malloc(4 * nx), *dxbf = malloc(4 * nx);
    int32_t c32[64], t32[64], cbf[64], tbf[64], *pred = malloc(4 * (size_t)R), *tgt = malloc(4 * (size_t)R);
    uint8_t *rmask = malloc((size_t)R);
    char err[256];
    ck_assert_msg(lmhead_loss_forward_mode_ref(&c, &md, x, h, vh, w, last, anchors, valid, mask, 0, &L32, rl32, rw32, c32,
                                               t32, err, sizeof err) == 0, "%s", err);
    ck_assert(lmhead_loss_forward_mode_ref(&c, &md, x, h, vh, w, last, anchors, valid, mask, 1, &Lbf, rlbf, rwbf, cbf, tbf,
                                           err, sizeof err) == 0);
    ck_assert(lmhead_loss_backward_mode_ref(&c, &md, x, h, vh, w, last, anchors, valid, mask, 0, rw32, dx32, err,
                                            sizeof err) == 0);
    ck_assert(lmhead_loss_backward_mode_ref(&c, &md, x, h, vh, w, last, anchors, valid, mask, 1, rwbf, dxbf, err,
                                            sizeof err) == 0);
    ck_assert(lmhead_argmax_ref(&c, &md, x, h, vh, w, last, anchors, valid, mask, 1, pred, tgt, rmask, err, sizeof err) == 0);

    bf16 *d_x = k1_upload(xb, 2 * nx), *d_h = k1_upload(hb, 2 * nh), *d_vh = k1_upload(vb, 2 * nh), *d_last = k1_upload(lb, 2 * nlp);
    float *d_w = k1_upload(w, 4 * (size_t)D);
    int32_t *d_a = k1_upload(anchors, 4 * (size_t)N);
    uint8_t *d_valid = k1_upload(valid, (size_t)N), *d_mask = k1_upload(mask, (size_t)budget);
    float *d_L = k1_malloc(4), *d_rl = k1_malloc(4 * (size_t)R), *d_rw = k1_malloc(4 * (size_t)R), *d_dx = k1_malloc(4 * nx);
    int32_t *d_c = k1_malloc(4 * (size_t)B), *d_t = k1_malloc(4 * (size_t)B);
    k1_poison(d_dx, 4 * nx);
    k1_poison(d_rl, 4 * (size_t)R);
    lmhead_loss_ws *ws;
    ck_assert_msg(lmhead_loss_ws_init(&ws, &cg, 0) == 0, "%s", kernels_error());
    ck_assert_msg(lmhead_loss_forward_mode(ws, &cg, sfa, d_x, d_h, d_vh, d_w, d_last, d_a, d_valid, d_mask, d_L, d_rl, d_rw,
                                           d_c, d_t, 0) == 0, "%s", kernels_error());
    const int32_t *d_arg;
    const uint8_t *d_rmask;
    lmhead_loss_ws_rows(ws, &d_arg, &d_rmask);
    ck_assert(d_arg != NULL && d_rmask != NULL);
    int32_t *arg = malloc(8 * (size_t)R);
    uint8_t *gmask = malloc((size_t)R);
    K1_CUDA(cudaMemcpy(arg, d_arg, 8 * (size_t)R, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(gmask, d_rmask, (size_t)R, cudaMemcpyDeviceToHost));
    ck_assert_msg(lmhead_loss_backward(ws, &cg, d_x, d_h, d_vh, d_rw, d_dx, 0) == 0, "%s", kernels_error());
    K1_CUDA(cudaDeviceSynchronize());
    float Lg, *rlg = malloc(4 * (size_t)R), *rwg = malloc(4 * (size_t)R), *dxg = malloc(4 * nx);
    int32_t cgg[64], tgg[64];
    K1_CUDA(cudaMemcpy(&Lg, d_L, 4, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(rlg, d_rl, 4 * (size_t)R, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(rwg, d_rw, 4 * (size_t)R, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(dxg, d_dx, 4 * nx, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(cgg, d_c, 4 * (size_t)B, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(tgg, d_t, 4 * (size_t)B, cudaMemcpyDeviceToHost));
    double eL = fabs((double)Lg - L32), bL = fabs((double)Lbf - L32);
    double erl = k1_max_abs_diff(rlg, rl32, R), brl = k1_max_abs_diff(rlbf, rl32, R);
    double erw = k1_max_abs_diff(rwg, rw32, R), brw = k1_max_abs_diff(rwbf, rw32, R);
    double edx = k1_max_abs_diff(dxg, dx32, nx), bdx = k1_max_abs_diff(dxbf, dx32, nx);
    fprintf(stderr, "budget mode T=%d budget=%d N=%d B=%d D=%d V=%d loss=%d w=%d sfa=%d: L %.6g (err %.3g, bf16 ref %.3g) "
            "row_loss %.3g/%.3g weight %.3g/%.3g dxn %.3g/%.3g\n", T, budget, N, B, D, V, loss, weighting, sfa, L32, eL, bL,
            erl, brl, erw, brw, edx, bdx);
    ck_assert_msg(eL <= 2 * bL + 1e-6 * fabs(L32) + 1e-7, "loss: err %.4g > 2 x %.4g", eL, bL);
    ck_assert_msg(erl <= 2 * brl + 1e-6 * k1_max_abs(rl32, R) + 1e-7, "row_loss: err %.4g > 2 x %.4g", erl, brl);
    ck_assert_msg(erw <= 2 * brw + 1e-6 * k1_max_abs(rw32, R) + 1e-7, "row_weight: err %.4g > 2 x %.4g", erw, brw);
    ck_assert_msg(edx <= 3 * bdx + 1e-6 * k1_max_abs(dx32, nx) + 1e-9, "dxn: err %.4g > 3 x %.4g", edx, bdx);
    int sup = 0, bad_p = 0, bad_t = 0;
    for (int r = 0; r < R; r++) {
        ck_assert_msg(gmask[r] == rmask[r], "row %d: device mask %d, reference %d", r, gmask[r], rmask[r]);
        if (!rmask[r]) continue;
        sup++;
        bad_p += arg[2 * r] != pred[r];
        bad_t += arg[2 * r + 1] != tgt[r];
    }
    ck_assert_msg(sup > 0, "no supervised row");
    ck_assert_msg(bad_p <= sup / 100 + 1 && bad_t <= sup / 100 + 1, "argmax: %d pred and %d tgt of %d rows differ", bad_p,
                  bad_t, sup);
    for (int j = 0; j < B; j++) ck_assert_int_eq(tgg[j], t32[j]);
    /* every row's argmax (lmhead_loss_ws_set_all_rows: dflash-eval's proposals), the loss bitwise unchanged */
    lmhead_loss_ws_set_all_rows(ws, 1);
    ck_assert_msg(lmhead_loss_forward_mode(ws, &cg, sfa, d_x, d_h, d_vh, d_w, d_last, d_a, d_valid, d_mask, d_L, d_rl, d_rw,
                                           d_c, d_t, 0) == 0, "%s", kernels_error());
    float La;
    K1_CUDA(cudaMemcpy(arg, d_arg, 8 * (size_t)R, cudaMemcpyDeviceToHost));
    K1_CUDA(cudaMemcpy(&La, d_L, 4, cudaMemcpyDeviceToHost));
    ck_assert_msg(memcmp(&La, &Lg, 4) == 0, "all rows: loss %.9g, supervised rows only %.9g", La, Lg);
    int bad_all = 0;
    for (int r = 0; r < R; r++) bad_all += arg[2 * r] != pred[r];
    ck_assert_msg(bad_all <= R / 100 + 1, "all rows: %d of %d draft argmaxes differ from the reference", bad_all, R);
    lmhead_loss_ws_free(ws);
    cudaFree(d_x); cudaFree(d_h); cudaFree(d_vh); cudaFree(d_last); cudaFree(d_w); cudaFree(d_a); cudaFree(d_valid);
    cudaFree(d_mask); cudaFree(d_L); cudaFree(d_rl); cudaFree(d_rw); cudaFree(d_dx); cudaFree(d_c); cudaFree(d_t);
    free(xb); free(hb); free(vb); free(lb); free(x); free(h); free(vh); free(last); free(w); free(anchors); free(valid);
    free(mask); free(rl32); free(rlbf); free(rw32); free(rwbf); free(dx32); free(dxbf); free(pred); free(tgt); free(rmask);
    free(arg); free(gmask); free(rlg); free(rwg); free(dxg);
}

START_TEST(lmhead_gpu_budget_mode) {
    budget_one(90, 128, 6, 16, 64, 1000, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 0, 11);
    budget_one(90, 128, 6, 16, 64, 1000, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 0, 12);
    budget_one(1000, 1024, 32, 16, 256, 4096, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 0, 13);
    /* sample_from_anchor: slot 0 supervised, targets from last[p], exp-decay from j = 0 */
    budget_one(90, 128, 6, 16, 64, 1000, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 1, 14);
    budget_one(90, 128, 6, 16, 64, 1000, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_DPACE, 1, 15);
    budget_one(1000, 1024, 32, 16, 256, 4096, LMHEAD_LOSS_CE, LMHEAD_WEIGHT_NONE, 1, 16);
}
END_TEST

/* The workspace plan: one chunk by default when the logits fit, chunks beyond the cap; an explicit
 * chunk wins (>= V: one chunk); a negative chunk or one not a multiple of 8 is refused. */
START_TEST(lmhead_gpu_plan) {
    lmhead_loss_config c = {2048, 8, 16, 64, 32000, LMHEAD_LOSS_KL, LMHEAD_WEIGHT_EXP_DECAY, 4.0f, 0.5f, 1e-6f};
    lmhead_loss_ws *ws = NULL;
    ck_assert_msg(lmhead_loss_ws_init(&ws, &c, 0) == 0, "%s", kernels_error());
    ck_assert_int_eq(lmhead_loss_ws_chunk(ws), 32000);
    lmhead_loss_ws_free(ws);
    c.N = 512;
    c.V = 152000;   /* 2 x 8192 x 152000 bf16 = 5 GB > LMHEAD_SINGLE_CHUNK_MAX_BYTES */
    ck_assert_msg(lmhead_loss_ws_init(&ws, &c, 0) == 0, "%s", kernels_error());
    ck_assert_int_eq(lmhead_loss_ws_chunk(ws), LMHEAD_VOCAB_CHUNK);
    lmhead_loss_ws_free(ws);
    c.N = 8;
    c.V = 32000;
    ck_assert_msg(lmhead_loss_ws_init(&ws, &c, 8192) == 0, "%s", kernels_error());
    ck_assert_int_eq(lmhead_loss_ws_chunk(ws), 8192);
    lmhead_loss_ws_free(ws);
    ck_assert_msg(lmhead_loss_ws_init(&ws, &c, 1024) == 0, "%s", kernels_error());
    ck_assert_int_eq(lmhead_loss_ws_chunk(ws), 1024);
    lmhead_loss_ws_free(ws);
    ck_assert_int_eq(lmhead_loss_ws_init(&ws, &c, -8), -1);
    ck_assert_ptr_null(ws);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "vocab_chunk=-8"));
    ck_assert_int_eq(lmhead_loss_ws_init(&ws, &c, 1020), -1);
    ck_assert_ptr_null(ws);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "vocab_chunk=1020"));
}
END_TEST

START_TEST(lmhead_gpu_prune) {
    enum { VT = 1000, VD = 300, D = 64 };
    int64_t d2t[VD];
    for (int d = 0; d < VD; d++) d2t[d] = 3 * d + (d % 3) - d;   /* ids 3d + d%3, ascending */
    uint64_t rng = 9;
    bf16 *full = malloc(2 * VT * D), *out = malloc(2 * VD * D);
    float *ff = malloc(4 * VT * D), *pf = malloc(4 * VD * D);
    k1_fill_bf16(&rng, full, ff, (size_t)VT * D, -1, 1);
    char err[256];
    ck_assert(lmhead_prune_ref(ff, VT, D, d2t, VD, pf, err, sizeof err) == 0);
    bf16 *d_full = k1_upload(full, 2 * VT * D), *d_out;
    int64_t *d_d2t = k1_upload(d2t, sizeof d2t);
    K1_CUDA(cudaMalloc((void **)&d_out, 2 * VD * D));
    ck_assert(lmhead_prune(d_full, VT, D, d_d2t, VD, d_out, 0) == 0);
    K1_CUDA(cudaMemcpy(out, d_out, 2 * VD * D, cudaMemcpyDeviceToHost));
    for (int i = 0; i < VD * D; i++) ck_assert_float_eq(bf16_to_float(out[i]), pf[i]);
    cudaFree(d_full); cudaFree(d_out); cudaFree(d_d2t);
    free(full); free(out); free(ff); free(pf);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_lmhead_loss");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, lmhead_gpu_small);
    tcase_add_test(tc, lmhead_gpu_larger);
    tcase_add_test(tc, lmhead_gpu_prune);
    tcase_add_test(tc, lmhead_gpu_plan);
    tcase_add_test(tc, lmhead_gpu_budget_mode);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
