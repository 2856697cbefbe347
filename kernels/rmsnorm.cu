/*
 * kernels/rmsnorm.cu — RMSNorm forward (plain, fused residual, the q/k norm's two tensors in one launch)
 * and backward (kernels/rmsnorm.h).
 *
 * Paths (one per size range; nothing is chosen at run time otherwise; other variants live only in
 * kernels/bench/rmsnorm_variants.cuh):
 * - C <= 8192: register-resident kernels (each row held in registers, one DRAM read of every input
 *   byte, all of a thread's 16-byte loads in flight). Forward: two rows per row group of <= 32 lanes
 *   when the grid exceeds a wave (more bytes in flight per thread). Backward: dw's column sums in
 *   fp32 registers of the threads that own the columns (dw nearly free inside the row walk), R rows
 *   per step, 512 threads and 1 CTA per SM (256 and 2 when dw is NULL), a balanced grid with one
 *   partial row per CTA, then the cross-CTA sum by the last CTA to finish (C <= 256, ticket) or the
 *   many-slice kernel rmsnorm_backward_dw_sum_kernel<4, 256> with PDL. See rms_backward_rows.
 * - C > 8192: two-pass kernels (dx in two passes over the row, dw by chunked column sums and an
 *   in-order reduce): rows too wide for registers.
 * - q/k norm (rmsnorm_qk_forward / rmsnorm_qk_backward): both tensors in one launch, CTAs split
 *   between q rows and k rows (none straddles), the single-tensor kernels' per-row code (same bits
 *   for y, rstd, dx); the backward for C <= 256 (q/k head dims), else two single calls.
 * dw is bitwise repeatable: every summation order is a function of (N, C) only.
 *
 * Scratch: [0, RMS_SCR_HDR) is a header whose words 0 (and 1 for the q/k backward's k tensor) are
 * ticket counters (zero between calls, so the caller zeroes the scratch once); partials follow.
 *
 * The kernels and the launch helpers the bench shares are in kernels/rmsnorm_impl.cuh; this file holds the
 * entry points and the launch code only they use.
 */
#include "kernels/rmsnorm.h"
#include "kernels/rmsnorm_impl.cuh"
#include "kernels/vec.cuh"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- launchers */

/* Resident 256-thread blocks of the forward per wave: 8 per SM (cached per process). */
static int rms_wave_blocks(void) {
    static int nsm;
    if (!nsm) {
        int dev = 0, n = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            n <= 0)
            n = 132;
        nsm = n;
    }
    return nsm * (2048 / RMS_THREADS);
}

template <bool RESID>
static int forward_launch(const char *name, bf16 *y, bf16 *resid, float *rstd, const bf16 *x, const float *w,
                          int N, int C, float eps, cudaStream_t stream) {
    if (check_args(name, y, x, resid, N, C)) return -1;
    if (!vec_aligned16(w)) return kernels_fail("%s: w must be 16-byte aligned", name);
    if (N == 0) return 0;
    int C8 = C / 8;
    if (C <= RMS_REG_MAX_C) {
        int G, V;
        reg_shape(C8, 4, &G, &V);
        unsigned blocks = (unsigned)((N + RMS_THREADS / G - 1) / (RMS_THREADS / G));
        if (G <= 32 && blocks > (unsigned)rms_wave_blocks()) {   /* K1c: two rows per group */
            const int rows = 2 * (RMS_THREADS / G);
            blocks = (unsigned)((N + rows - 1) / rows);
#define RMS_FWD2(g, v) rmsnorm_forward_rows_kernel<g, v, RESID, 2><<<blocks, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps)
            switch (G * 8 + V) {
            case 8 * 8 + 1: RMS_FWD2(8, 1); break;   case 8 * 8 + 2: RMS_FWD2(8, 2); break;   case 8 * 8 + 4: RMS_FWD2(8, 4); break;
            case 16 * 8 + 1: RMS_FWD2(16, 1); break; case 16 * 8 + 2: RMS_FWD2(16, 2); break; case 16 * 8 + 4: RMS_FWD2(16, 4); break;
            case 32 * 8 + 1: RMS_FWD2(32, 1); break; case 32 * 8 + 2: RMS_FWD2(32, 2); break; case 32 * 8 + 4: RMS_FWD2(32, 4); break;
            default: return kernels_fail("%s: no two-row kernel for G=%d V=%d", name, G, V);
            }
#undef RMS_FWD2
        } else {
#define RMS_FWD(g, v) rmsnorm_forward_kernel<g, v, RESID><<<blocks, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps)
            RMS_DISPATCH(G, V, RMS_FWD)
#undef RMS_FWD
        }
    } else if (C8 >= 32)
        rmsnorm_forward_twopass_kernel<32, RESID><<<(N + 7) / 8, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps);
    else if (C8 >= 16)
        rmsnorm_forward_twopass_kernel<16, RESID><<<(N + 15) / 16, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps);
    else
        rmsnorm_forward_twopass_kernel<8, RESID><<<(N + 31) / 32, RMS_THREADS, 0, stream>>>(y, resid, rstd, x, w, N, C, eps);
    KERNELS_CHECK_LAUNCH(name);
    return 0;
}

extern "C" int rmsnorm_forward(bf16 *y, float *rstd, const bf16 *x, const float *w, int N, int C, float eps,
                               cudaStream_t stream) {
    return forward_launch<false>("rmsnorm_forward", y, NULL, rstd, x, w, N, C, eps, stream);
}

extern "C" int rmsnorm_residual_forward(bf16 *y, bf16 *resid, float *rstd, const bf16 *x, const float *w,
                                        int N, int C, float eps, cudaStream_t stream) {
    if (!resid) return kernels_fail("rmsnorm_residual_forward: resid must not be NULL");
    return forward_launch<true>("rmsnorm_residual_forward", y, resid, rstd, x, w, N, C, eps, stream);
}

/* The q/k norm forward in one launch for C <= 1024 (row groups of <= 32 lanes: the two-row kernel's
 * per-row arithmetic, so y and rstd are bitwise those of two rmsnorm_forward calls, which run the same
 * or the one-row kernel with the same arithmetic); larger C: two rmsnorm_forward calls. */
extern "C" int rmsnorm_qk_forward(bf16 *yq, float *rstdq, const bf16 *xq, const float *wq, int Nq, bf16 *yk, float *rstdk,
                                  const bf16 *xk, const float *wk, int Nk, int C, float eps, cudaStream_t stream) {
    if (check_args("rmsnorm_qk_forward (q)", yq, xq, wq, Nq, C) || check_args("rmsnorm_qk_forward (k)", yk, xk, wk, Nk, C))
        return -1;
    int G, V;
    reg_shape(C / 8, 4, &G, &V);
    if (C > RMS_REG_MAX_C || G > 32)
        return rmsnorm_forward(yq, rstdq, xq, wq, Nq, C, eps, stream) || rmsnorm_forward(yk, rstdk, xk, wk, Nk, C, eps, stream)
                   ? -1 : 0;
    if (Nq + Nk == 0) return 0;
    const int rows = 2 * (RMS_THREADS / G);
    rms_qk_fwd_args a = {{yq, yk}, {rstdq, rstdk}, {xq, xk}, {wq, wk}, {Nq, Nk}, {(Nq + rows - 1) / rows, (Nk + rows - 1) / rows}};
    const unsigned blocks = (unsigned)(a.nb[0] + a.nb[1]);
#define RMS_QKF(g, v) rmsnorm_qk_forward_kernel<g, v, 2><<<blocks, RMS_THREADS, 0, stream>>>(a, C, eps)
    switch (G * 8 + V) {
    case 8 * 8 + 1: RMS_QKF(8, 1); break;   case 8 * 8 + 2: RMS_QKF(8, 2); break;   case 8 * 8 + 4: RMS_QKF(8, 4); break;
    case 16 * 8 + 1: RMS_QKF(16, 1); break; case 16 * 8 + 2: RMS_QKF(16, 2); break; case 16 * 8 + 4: RMS_QKF(16, 4); break;
    case 32 * 8 + 1: RMS_QKF(32, 1); break; case 32 * 8 + 2: RMS_QKF(32, 2); break; case 32 * 8 + 4: RMS_QKF(32, 4); break;
    default: return kernels_fail("rmsnorm_qk_forward: no kernel for G=%d V=%d", G, V);
    }
#undef RMS_QKF
    KERNELS_CHECK_LAUNCH("rmsnorm_qk_forward");
    return 0;
}

extern "C" size_t rmsnorm_backward_scratch_floats(int N, int C) {
    if (C <= 0 || N < 0) return 0;
    return RMS_SCR_HDR + rms_partial_rows(N, C) * C;
}

extern "C" size_t rmsnorm_qk_backward_scratch_floats(int Nq, int Nk, int C) {
    if (C <= 0 || Nq < 0 || Nk < 0) return 0;
    return RMS_SCR_HDR + (rms_partial_rows(Nq, C) + rms_partial_rows(Nk, C)) * C;
}

/* The register-resident backward (C <= RMS_REG_MAX_C); dw nullable. The row walk (one launch), then for
 * dw and C > RMS_LAST_MAX_C rmsnorm_backward_dw_sum_kernel<4, 256> over the nb partials with PDL.
 * Shape: with dw 512 threads, 1 CTA per SM (rms_rows_shape); dx alone 256 threads, 2 per SM. */
static int backward_rows_launch(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                             unsigned *ticket, float *part, int N, int C, int accumulate_dx, cudaStream_t stream) {
    int G, V, T, R, per_sm;
    rms_rows_shape(C, dw != NULL, 512, &G, &V, &T, &R, &per_sm);
    const int RS = T / G * R;
    int steps = (N + RS - 1) / RS, target = RMS_SMS * per_sm;
    if (steps < 1) steps = 1;
    const int kk = (steps + target - 1) / target, nb = (steps + kk - 1) / kk;
    const int fin = C <= RMS_LAST_MAX_C ? RMS_FIN_LAST : RMS_FIN_PDL;
    const size_t smem = dw && T / G > 1 ? (size_t)(T / G) * C * sizeof(float) : 0;
    {
#define RMS_ROWS_K(g, v, r, t, mb, d) rmsnorm_backward_rows_kernel<g, v, r, t, mb, d>
#define RMS_ROWS_L(g, v, r, t, mb, d)                                                                                     \
    do {                                                                                                               \
        if (rms_smem_optin<RMS_ROWS_K(g, v, r, t, mb, d)>(smem)) return -1;                                               \
        RMS_ROWS_K(g, v, r, t, mb, d)<<<nb, t, smem, stream>>>(dx, dw, part, ticket, dy, x, w, rstd, N, C, accumulate_dx,  \
                                                          fin);                                                        \
    } while (0)
#define RMS_ROWS_GV(g, v)                                                                                                 \
    do {                                                                                                               \
        if (!dw) RMS_ROWS_L(g, v, 2, 256, 2, false);                                                                      \
        else RMS_ROWS_L(g, v, 2, 512, 1, true);                                                                           \
    } while (0)
        switch (G * 8 + V) {
        case 8 * 8 + 1: RMS_ROWS_GV(8, 1); break;
        case 8 * 8 + 2: RMS_ROWS_GV(8, 2); break;
        case 16 * 8 + 2: RMS_ROWS_GV(16, 2); break;
        case 32 * 8 + 2: RMS_ROWS_GV(32, 2); break;
        case 64 * 8 + 2: RMS_ROWS_GV(64, 2); break;
        case 128 * 8 + 2: RMS_ROWS_GV(128, 2); break;
        case 256 * 8 + 2: RMS_ROWS_GV(256, 2); break;
        case 256 * 8 + 4:   /* V = 4: one shape (T 512, 1/SM, R 1) */
            if (dw) RMS_ROWS_L(256, 4, 1, 512, 1, true);
            else RMS_ROWS_L(256, 4, 1, 512, 1, false);
            break;
        default: return kernels_fail("rmsnorm_backward: no kernel for G=%d V=%d", G, V);
        }
#undef RMS_ROWS_GV
#undef RMS_ROWS_L
#undef RMS_ROWS_K
        KERNELS_CHECK_LAUNCH("rmsnorm_backward");
    }
    if (!dw || fin != RMS_FIN_PDL) return 0;
    return rms_launch_sum(rmsnorm_backward_dw_sum_kernel<4, 256>, (C / 4 + 3) / 4, 1024, 1, stream, dw, part, nb, C);
}

/* One tensor's backward on (ticket, partials) (rmsnorm_backward's scratch layout, or one tensor's half
 * of rmsnorm_qk_backward's). Arguments checked by the caller. */
static int backward_impl(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                         unsigned *ticket, float *part, int N, int C, int accumulate_dx, cudaStream_t stream) {
    if (N == 0) return 0;
    if (C <= RMS_REG_MAX_C) return backward_rows_launch(dx, dw, dy, x, w, rstd, ticket, part, N, C, accumulate_dx, stream);
    /* C > RMS_REG_MAX_C: the two-pass kernels (a size path; the dw sums chunk by chunk, no ticket) */
    const int C8 = C / 8;
    if (C8 >= 32)
        rmsnorm_backward_twopass_kernel<32><<<(N + 7) / 8, RMS_THREADS, 0, stream>>>(dx, dy, x, w, rstd, N, C, accumulate_dx);
    else if (C8 >= 16)
        rmsnorm_backward_twopass_kernel<16><<<(N + 15) / 16, RMS_THREADS, 0, stream>>>(dx, dy, x, w, rstd, N, C, accumulate_dx);
    else
        rmsnorm_backward_twopass_kernel<8><<<(N + 31) / 32, RMS_THREADS, 0, stream>>>(dx, dy, x, w, rstd, N, C, accumulate_dx);
    KERNELS_CHECK_LAUNCH("rmsnorm_backward");
    if (dw) {
        int chunks = dw_chunks(N), rows = (N + chunks - 1) / chunks;
        dim3 grid((C8 + 7) / 8, chunks);
        rmsnorm_backward_dw_kernel<<<grid, 256, 0, stream>>>(part, dy, x, rstd, N, C, rows);
        KERNELS_CHECK_LAUNCH("rmsnorm_backward (dw partials)");
        rmsnorm_backward_dw_reduce_kernel<<<(C + 255) / 256, 256, 0, stream>>>(dw, part, chunks, C);
        KERNELS_CHECK_LAUNCH("rmsnorm_backward (dw reduce)");
    }
    return 0;
}

extern "C" int rmsnorm_backward(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w,
                                const float *rstd, float *scratch, int N, int C, int accumulate_dx,
                                cudaStream_t stream) {
    if (check_bwd("rmsnorm_backward", dx, dw, dy, x, w, scratch, N, C)) return -1;
    return backward_impl(dx, dw, dy, x, w, rstd, dw ? (unsigned *)scratch : NULL, dw ? scratch + RMS_SCR_HDR : NULL, N, C,
                         accumulate_dx, stream);
}

/* Scratch layout of the q/k backward: header (word 0 q's ticket, word 1 k's), q's partials
 * [rms_partial_rows(Nq, C), C], then k's: the tickets sit at fixed places whatever Nq, Nk, so one
 * scratch serves every smaller (Nq, Nk) as rmsnorm_backward's does. */
extern "C" int rmsnorm_qk_backward(bf16 *dxq, float *dwq, const bf16 *dyq, const bf16 *xq, const float *wq,
                                   const float *rstdq, int Nq, bf16 *dxk, float *dwk, const bf16 *dyk, const bf16 *xk,
                                   const float *wk, const float *rstdk, int Nk, float *scratch, int C, int accumulate_dx,
                                   cudaStream_t stream) {
    if (check_bwd("rmsnorm_qk_backward (q)", dxq, dwq, dyq, xq, wq, scratch, Nq, C) ||
        check_bwd("rmsnorm_qk_backward (k)", dxk, dwk, dyk, xk, wk, scratch, Nk, C))
        return -1;
    if (!dwq != !dwk) return kernels_fail("rmsnorm_qk_backward: dwq and dwk are both given or both NULL");
    const bool dw = dwq != NULL;
    unsigned *tq = dw ? (unsigned *)scratch : NULL, *tk = dw ? (unsigned *)scratch + 1 : NULL;
    float *pq = dw ? scratch + RMS_SCR_HDR : NULL, *pk = dw ? pq + rms_partial_rows(Nq, C) * C : NULL;
    if (C > RMS_LAST_MAX_C || Nq == 0 || Nk == 0)   /* two launches (each a no-op when its N is 0) */
        return backward_impl(dxq, dwq, dyq, xq, wq, rstdq, tq, pq, Nq, C, accumulate_dx, stream) ||
                       backward_impl(dxk, dwk, dyk, xk, wk, rstdk, tk, pk, Nk, C, accumulate_dx, stream)
                   ? -1 : 0;
    /* one launch: the default's row walk and shape for each tensor, the CTAs split between them in
     * proportion to their row steps, every CTA the same number of steps (±1) across both, the total
     * within one wave (132 × CTAs per SM); a function of (Nq, Nk, C, shape): dw deterministic */
    int G, V, T, R, per_sm;
    rms_rows_shape(C, dw, 512, &G, &V, &T, &R, &per_sm);
    const int RS = T / G * R, sq = (Nq + RS - 1) / RS, sk = (Nk + RS - 1) / RS, target = RMS_SMS * per_sm;
    int kk = (sq + sk + target - 1) / target, nbq, nbk;
    for (;; kk++) {
        nbq = (sq + kk - 1) / kk;
        nbk = (sk + kk - 1) / kk;
        if (nbq + nbk <= target) break;
    }
    rms_qk_bwd_args a = {{dxq, dxk}, {dwq, dwk}, {pq, pk}, {tq, tk}, {dyq, dyk}, {xq, xk}, {wq, wk}, {rstdq, rstdk}, {Nq, Nk},
                         {nbq, nbk}};
    const unsigned blocks = (unsigned)(nbq + nbk);
    const size_t smem = dw && T / G > 1 ? (size_t)(T / G) * C * sizeof(float) : 0;   /* <= 32 KB at C <= 256 (+ 8 KB static) */
#define RMS_QKB(g, v)                                                                                                  \
    do {                                                                                                               \
        if (!dw) rmsnorm_qk_backward_rows_kernel<g, v, 2, 256, 2, false><<<blocks, 256, 0, stream>>>(a, C, accumulate_dx); \
        else {                                                                                                         \
            if (rms_smem_optin<rmsnorm_qk_backward_rows_kernel<g, v, 2, 512, 1, true>>(smem)) return -1;            \
            rmsnorm_qk_backward_rows_kernel<g, v, 2, 512, 1, true><<<blocks, 512, smem, stream>>>(a, C, accumulate_dx); \
        }                                                                                                              \
    } while (0)
    switch (G * 8 + V) {   /* C <= RMS_LAST_MAX_C = 256: C/8 <= 32, G <= 16 */
    case 8 * 8 + 1: RMS_QKB(8, 1); break;
    case 8 * 8 + 2: RMS_QKB(8, 2); break;
    case 16 * 8 + 2: RMS_QKB(16, 2); break;
    default: return kernels_fail("rmsnorm_qk_backward: no kernel for G=%d V=%d", G, V);
    }
#undef RMS_QKB
    KERNELS_CHECK_LAUNCH("rmsnorm_qk_backward");
    return 0;
}
