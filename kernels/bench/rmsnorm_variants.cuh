/*
 * kernels/bench/rmsnorm_variants.cuh — RMSNorm backward variants that are not the library's, for
 * kernels/bench/rmsnorm_bench.cu (style.md: numbered variants live only in benchmark files).
 * Included after kernels/rmsnorm_impl.cuh (whose kernels and launch helpers they reuse):
 *   variant 4 (K1e; the library's backward until round 5 and its run-time alternative until issue
 *     13): dw sums in shared memory, 3 blocks per SM, last-block or 1024-thread PDL cross-block sum
 *     (rmsnorm_backward4_kernel, rmsnorm_backward_dw_final_kernel);
 *   the library's backward with the 256-thread, 2-per-SM shape with dw (g_rms_cfg = 1, round 4's
 *     shape 1) and its dw "pieces" (g_rms_piece: 1 the row walk alone, 2 walk + partials, 3 the sum
 *     kernel alone — dw wrong, for timing only; 4 the sum kernel without PDL — correct).
 * bench_backward / bench_qk_backward take rmsnorm_backward's / rmsnorm_qk_backward's arguments and
 * run what g_rms_var (10: the library's, 4: variant 4), g_rms_cfg and g_rms_piece select. Numbers:
 * kernels/bench/RESULTS.md.
 */
#ifndef KERNELS_BENCH_RMSNORM_VARIANTS_CUH
#define KERNELS_BENCH_RMSNORM_VARIANTS_CUH

static int g_rms_var = 10;    /* 10: the library's backward; 4: variant 4 */
static int g_rms_cfg = 2;     /* the library's row-walk shape with dw (2), or 1: 256 threads, 2 per SM */
static int g_rms_piece = 0;   /* 0: the whole backward; 1-3 timing pieces (dw wrong); 4 no PDL */

/* A bench-only end of variant 4's row walk (the library's ends are RMS_FIN_PDL and RMS_FIN_LAST):
 * piece 1 times the walk with its dw sums and stops there, dw wrong. */
#define RMS_FIN_WALK 3

/* ---------------------------------------------------------------- variant 4 (K1e)
 *
 * Why variant 3's dw cost 15 points (H200: dx 86% but dx+dw 70% at 8192×4096; 88 -> 77% at C = 128):
 * - registers: the per-thread fp32 dw sums (8·V floats) took the kernel from 80 to 108 registers,
 *   so 2 blocks of 256 per SM ran instead of 3: a third fewer bytes in flight for the whole dx pass;
 * - the dw sum kernel: one thread per column walks the nb partials with a loop of dependent adds over
 *   L2 loads (33 in a row at nb = 264), behind a second launch (PDL hid the launch, not the walk);
 * - the tail: 264 blocks over 8192 row steps is 31 or 32 steps per block, and the dx-only grid of
 *   396 over the k norm's 2048 steps 5 or 6 (the last step runs latency-bound on 17% of the blocks).
 * Variant 4 keeps variant 3's row walk and adds: the dw sums live in shared memory (each thread
 * read-modify-writes its own float4 slots per row step, so registers stay those of dx alone and 3
 * blocks fit per SM); a balanced grid, nb = ceil(steps / ceil(steps / (3·132))), so every block
 * walks the same number of steps (±1); the old dx of dx += loaded before the row statistic is
 * reduced; and the cross-block sum of the nb partials [nb, C] (scratch + RMS_SCR_HDR) by
 * - C <= RMS_LAST_MAX_C (q/k norm): the last block to finish, in the same kernel — every block
 *   writes its partial, fences, and takes a ticket from the counter in scratch[0]; the block holding
 *   the last ticket sums the partials and resets the counter to 0 (so one zeroing at allocation
 *   lasts: rmsnorm.h);
 * - larger C: a kernel of 1024-thread CTAs, 8 float4 columns × 128 slices of blocks each (every
 *   thread's few loads in flight at once), launched with PDL behind the row walk.
 * Both sums use rms_dw_final: slice j of S adds blocks [j·nb/S, (j+1)·nb/S) in index order, then
 * runs of 8 slices in order, then the runs in order — an order fixed by (N, C), never by which
 * block finished last: dw is bitwise repeatable. */

/* The cross-block dw sum for C > RMS_LAST_MAX_C, launched with PDL: CTA b takes the float4 columns
 * RMS_FIN_Q·b .. +RMS_FIN_Q−1 (32 floats) with 128 slices of blocks (C = 4096: 128 CTAs, each
 * thread ~3 loads of the nb <= 396 partials, all in flight). */
#define RMS_FIN_Q 8
__global__ void __launch_bounds__(1024) rmsnorm_backward_dw_final_kernel(float *dw, const float *partial, int nb, int C) {
    __shared__ float4 red[1024];
    const int q0 = blockIdx.x * RMS_FIN_Q, nq = min(RMS_FIN_Q, C / 4 - q0);
    /* dw before the wait: the grid this waits for never writes dw, and it started (a normal
     * launch) only after everything before it in the stream had completed */
    const float4 d = rms_dw_old(dw, q0, nq);
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    rms_dw_final<1024>(dw, d, partial, nb, C, q0, nq, red);
}

/* Variant 4 row walk. DW: partial [gridDim.x, C]
 * gets this block's Σ over its rows of dy·x̂; then fin (above). */
template <int G, int V, bool DW, int MINB>
__global__ void __launch_bounds__(RMS_THREADS, MINB)
    rmsnorm_backward4_kernel(bf16 *dx, float *dw, float *partial, unsigned *ticket, const bf16 *dy, const bf16 *x,
                             const float *w, const float *rstd, int N, int C, int accumulate, int fin) {
    extern __shared__ float4 rms_sacc4[];   /* DW: [R][2][C/8] float4, row group g's column sums */
    __shared__ float red[2][RMS_THREADS / 32];
    constexpr int R = RMS_THREADS / G;
    if constexpr (DW)
        if (fin == RMS_FIN_PDL) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    const int grp = threadIdx.x / G, lane = threadIdx.x % G, C8 = C / 8, steps = (N + R - 1) / R;
    float4 *sacc = rms_sacc4 + (size_t)grp * 2 * C8;   /* this thread's slots: c and C8 + c, c = lane + k·G */
    if constexpr (DW)
#pragma unroll
        for (int k = 0; k < V; k++) {
            int c = lane + k * G;
            if (c < C8) sacc[c] = sacc[C8 + c] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    uint4 xv[V], gv[V];
    float rs = 0.0f;
    auto load = [&](int s, uint4 *xo, uint4 *go, float &ro) {
        int row = s * R + grp;
        bool live = s < steps && row < N;
        const uint4 *xr = (const uint4 *)(x + (size_t)row * C), *dyr = (const uint4 *)(dy + (size_t)row * C);
#pragma unroll
        for (int k = 0; k < V; k++) {
            int c = lane + k * G;
            xo[k] = go[k] = make_uint4(0, 0, 0, 0);
            if (live && c < C8) {
                xo[k] = __ldg(xr + c);
                go[k] = __ldg(dyr + c);
            }
        }
        ro = live ? __ldg(rstd + row) : 0.0f;
    };
    load(blockIdx.x, xv, gv, rs);
    int p = 0;
    for (int s = blockIdx.x; s < steps; s += gridDim.x) {   /* uniform trip count across the block */
        uint4 xn[V], gn[V];
        float rn;
        load(s + gridDim.x, xn, gn, rn);
        const int row = s * R + grp;
        const bool live = row < N;
        uint4 *dxr = (uint4 *)(dx + (size_t)row * C);
        uint4 old[V];
#pragma unroll
        for (int k = 0; k < V; k++) {   /* dx +=: in flight while the statistic is reduced */
            old[k] = make_uint4(0, 0, 0, 0);
            if (accumulate && live && lane + k * G < C8) old[k] = dxr[lane + k * G];
        }
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < V; k++) {
            int c = lane + k * G;
            if (c < C8) {
                float xf[8], g[8], ww[8];
                vec_unpack8(xv[k], xf);
                vec_unpack8(gv[k], g);
                rms_load_w8(w, c, ww);
#pragma unroll
                for (int j = 0; j < 8; j++) m += ww[j] * g[j] * xf[j];
            }
        }
        m = rms_group_sum<G>(m, red[p]) * rs / (float)C;   /* mean_c(w·dy·x̂) */
        p ^= 1;
#pragma unroll
        for (int k = 0; k < V; k++) {
            int c = lane + k * G;
            if (c < C8 && live) {
                float xf[8], g[8], ww[8], o[8];
                vec_unpack8(xv[k], xf);
                vec_unpack8(gv[k], g);
                rms_load_w8(w, c, ww);
                vec_unpack8(old[k], o);   /* zeros unless accumulating */
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    xf[j] *= rs;   /* x̂ */
                    o[j] += rs * ww[j] * g[j] - xf[j] * rs * m;
                }
                dxr[c] = vec_pack8(o);
                if constexpr (DW) {
                    float4 a0 = sacc[c], a1 = sacc[C8 + c];
                    a0.x += g[0] * xf[0]; a0.y += g[1] * xf[1]; a0.z += g[2] * xf[2]; a0.w += g[3] * xf[3];
                    a1.x += g[4] * xf[4]; a1.y += g[5] * xf[5]; a1.z += g[6] * xf[6]; a1.w += g[7] * xf[7];
                    sacc[c] = a0;
                    sacc[C8 + c] = a1;
                }
            }
        }
#pragma unroll
        for (int k = 0; k < V; k++) {
            xv[k] = xn[k];
            gv[k] = gn[k];
        }
        rs = rn;
    }
    if constexpr (DW) {
        __shared__ float4 fred[RMS_THREADS];
        __shared__ unsigned last;
        __syncthreads();
        if (fin == RMS_FIN_WALK) return;   /* bench piece: the walk with its shared-memory sums only */
        const int nparts = gridDim.x;
        {
            const float *f = (const float *)rms_sacc4;
            for (int c = threadIdx.x; c < C; c += RMS_THREADS) {   /* the R row groups, fixed order */
                const size_t at = ((size_t)((c >> 2) & 1) * C8 + (c >> 3)) * 4 + (c & 3);
                float s = 0.0f;
                for (int g = 0; g < R; g++) s += f[(size_t)g * 2 * C8 * 4 + at];
                partial[(size_t)blockIdx.x * C + c] = s;
            }
        }
        if (fin == RMS_FIN_PDL) return;
        /* RMS_FIN_LAST */
        const float4 d = rms_dw_old(dw, 0, C / 4);   /* in flight during the ticket; used by the last block */
        __threadfence();   /* this block's partial is visible device-wide before its ticket is taken */
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
        __syncthreads();
        if (!last) return;
        __threadfence();
        rms_dw_final<RMS_THREADS>(dw, d, partial, nparts, C, 0, C / 4, fred);
        if (threadIdx.x == 0) *ticket = 0u;   /* ready for the next call (every other block has taken its ticket) */
    }
}

/* ---------------------------------------------------------------- launchers */

/* Variant 4: row group width G, vectors per lane V, and the balanced grid: at most 3 blocks per SM
 * (2 when V = 4: 116 registers), every block the same number of row steps (±1). A fixed function of
 * (N, C), so dw's summation order is too. */
static void bwd4_shape(int N, int C, int *G, int *V, int *nb) {
    reg_shape(C / 8, 2, G, V);
    int R = RMS_THREADS / *G, steps = (N + R - 1) / R, target = RMS_SMS * (*V <= 2 ? 3 : 2);
    if (steps < 1) steps = 1;
    int k = (steps + target - 1) / target;
    *nb = (steps + k - 1) / k;
}

/* Variant 4 (C <= RMS_REG_MAX_C); dw nullable. The row walk, then the dw sum by
 * the last block (C <= RMS_LAST_MAX_C, ticket) or rmsnorm_backward_dw_final_kernel with PDL. */
static int backward4_launch(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                            unsigned *ticket, float *part, int N, int C, int accumulate_dx, cudaStream_t stream) {
    int G, V, nb;
    bwd4_shape(N, C, &G, &V, &nb);
    const int piece = dw ? g_rms_piece : 0;
    int fin = C <= RMS_LAST_MAX_C ? RMS_FIN_LAST : RMS_FIN_PDL;
    if (piece == 1) fin = RMS_FIN_WALK;
    if (piece == 2) fin = RMS_FIN_PDL;
    const size_t smem = dw ? (size_t)(RMS_THREADS / G) * C * sizeof(float) : 0;   /* <= 32 KiB: C <= 8·G·V */
    if (piece != 3) {
#define RMS_BWD4(g, v, minb)                                                                                           \
    do {                                                                                                               \
        if (dw)                                                                                                        \
            rmsnorm_backward4_kernel<g, v, true, minb><<<nb, RMS_THREADS, smem, stream>>>(dx, dw, part, ticket, dy, x, w, \
                                                                                         rstd, N, C, accumulate_dx, fin); \
        else                                                                                                           \
            rmsnorm_backward4_kernel<g, v, false, minb><<<nb, RMS_THREADS, 0, stream>>>(dx, NULL, NULL, NULL, dy, x, w,  \
                                                                                       rstd, N, C, accumulate_dx, 0);  \
    } while (0)
        switch (G * 8 + V) {
        case 8 * 8 + 1: RMS_BWD4(8, 1, 3); break;
        case 8 * 8 + 2: RMS_BWD4(8, 2, 3); break;
        case 16 * 8 + 2: RMS_BWD4(16, 2, 3); break;
        case 32 * 8 + 2: RMS_BWD4(32, 2, 3); break;
        case 64 * 8 + 2: RMS_BWD4(64, 2, 3); break;
        case 128 * 8 + 2: RMS_BWD4(128, 2, 3); break;
        case 256 * 8 + 2: RMS_BWD4(256, 2, 3); break;
        case 256 * 8 + 4: RMS_BWD4(256, 4, 2); break;
        default: return kernels_fail("rmsnorm_backward: no variant 4 kernel for G=%d V=%d", G, V);
        }
#undef RMS_BWD4
        KERNELS_CHECK_LAUNCH("rmsnorm_backward (variant 4)");
    }
    if (!dw || (piece != 3 && (fin != RMS_FIN_PDL || piece == 2))) return 0;
    return rms_launch_sum(rmsnorm_backward_dw_final_kernel, (C / 4 + RMS_FIN_Q - 1) / RMS_FIN_Q, 1024, piece != 4, stream, dw,
                          part, nb, C);
}

/* The library's backward_rows_launch with the bench's shape (g_rms_cfg: 2 the library's 512 threads with dw,
 * 1 256 threads) and piece (g_rms_piece): 2 walk + partials, 3 the sum kernel alone, 4 no PDL; piece 1 (the walk
 * alone) is variant 4's only: the library's row walk has no bench exit. cfg 2 and piece 0: the library's. */
static int bench_backward_rows_launch(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                             unsigned *ticket, float *part, int N, int C, int accumulate_dx, cudaStream_t stream) {
    int G, V, T, R, per_sm;
    const int cfg = dw ? g_rms_cfg : 1;
    rms_rows_shape(C, dw != NULL, cfg == 1 ? 256 : 512, &G, &V, &T, &R, &per_sm);
    const int RS = T / G * R;
    int steps = (N + RS - 1) / RS, target = RMS_SMS * per_sm;
    if (steps < 1) steps = 1;
    const int kk = (steps + target - 1) / target, nb = (steps + kk - 1) / kk;
    const int piece = dw ? g_rms_piece : 0;
    if (piece == 1) return kernels_fail("rmsnorm bench: piece 1 (the walk alone) exists for variant 4 only");
    int fin = C <= RMS_LAST_MAX_C ? RMS_FIN_LAST : RMS_FIN_PDL;
    if (piece == 2) fin = RMS_FIN_PDL;
    const size_t smem = dw && T / G > 1 ? (size_t)(T / G) * C * sizeof(float) : 0;
    if (piece != 3) {
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
        else if (cfg == 1) RMS_ROWS_L(g, v, 2, 256, 2, true);                                                             \
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
    if (!dw || (piece != 3 && (fin != RMS_FIN_PDL || piece == 2))) return 0;
    return rms_launch_sum(rmsnorm_backward_dw_sum_kernel<4, 256>, (C / 4 + 3) / 4, 1024, piece != 4, stream, dw, part, nb, C);
}

/* The library's backward_impl with the bench's variant (g_rms_var: 10 the library's row walk, 4 variant 4). */
static int bench_backward_impl(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                         unsigned *ticket, float *part, int N, int C, int accumulate_dx, cudaStream_t stream) {
    if (N == 0) return 0;
    if (C <= RMS_REG_MAX_C)
        return g_rms_var == 4 ? backward4_launch(dx, dw, dy, x, w, rstd, ticket, part, N, C, accumulate_dx, stream)
                              : bench_backward_rows_launch(dx, dw, dy, x, w, rstd, ticket, part, N, C, accumulate_dx, stream);
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

static int bench_backward(bf16 *dx, float *dw, const bf16 *dy, const bf16 *x, const float *w, const float *rstd,
                          float *scratch, int N, int C, int accumulate_dx, cudaStream_t stream) {
    if (check_bwd("rmsnorm_backward", dx, dw, dy, x, w, scratch, N, C)) return -1;
    return bench_backward_impl(dx, dw, dy, x, w, rstd, dw ? (unsigned *)scratch : NULL, dw ? scratch + RMS_SCR_HDR : NULL,
                               N, C, accumulate_dx, stream);
}

static int bench_qk_backward(bf16 *dxq, float *dwq, const bf16 *dyq, const bf16 *xq, const float *wq,
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
    if (g_rms_var == 4 || C > RMS_LAST_MAX_C || Nq == 0 || Nk == 0)   /* two launches (each a no-op when its N is 0) */
        return bench_backward_impl(dxq, dwq, dyq, xq, wq, rstdq, tq, pq, Nq, C, accumulate_dx, stream) ||
                       bench_backward_impl(dxk, dwk, dyk, xk, wk, rstdk, tk, pk, Nk, C, accumulate_dx, stream)
                   ? -1 : 0;
    /* one launch: the default's row walk and shape for each tensor, the CTAs split between them in
     * proportion to their row steps, every CTA the same number of steps (±1) across both, the total
     * within one wave (132 × CTAs per SM); a function of (Nq, Nk, C, shape): dw deterministic */
    int G, V, T, R, per_sm;
    const int cfg = dw ? g_rms_cfg : 1;
    rms_rows_shape(C, dw, cfg == 1 ? 256 : 512, &G, &V, &T, &R, &per_sm);
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
    const size_t smem = dw && T / G > 1 ? (size_t)(T / G) * C * sizeof(float) : 0;   /* <= 32 KB at C <= 256 */
#define RMS_QKB(g, v)                                                                                                  \
    do {                                                                                                               \
        if (!dw) rmsnorm_qk_backward_rows_kernel<g, v, 2, 256, 2, false><<<blocks, 256, 0, stream>>>(a, C, accumulate_dx); \
        else if (cfg == 1) rmsnorm_qk_backward_rows_kernel<g, v, 2, 256, 2, true><<<blocks, 256, smem, stream>>>(a, C, accumulate_dx); \
        else rmsnorm_qk_backward_rows_kernel<g, v, 2, 512, 1, true><<<blocks, 512, smem, stream>>>(a, C, accumulate_dx); \
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

#endif /* KERNELS_BENCH_RMSNORM_VARIANTS_CUH */
