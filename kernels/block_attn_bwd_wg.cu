/*
 * kernels/block_attn_bwd_wg.cu — the Hopper wgmma (sm_90a) backward of DFlash anchored block attention
 * that block_attn_backward runs (contract in kernels/block_attn.h, entry in kernels/block_attn_wg.h). The kernels
 * and their launch code are in kernels/block_attn_bwd_wg.cuh; this file holds the entry point.
 *
 * A deterministic three-kernel structure, every GEMM a wgmma (kernels/wgmma.cuh):
 *   1. Di = rowsum(dO ⊙ O) per (head, row) into the first n_h·R floats of dq (scratch);
 *   2. per (128 context keys, kv head): a CTA of two warpgroups, warpgroup w owns keys 64w..64w+63 (M = 64).
 *      The CTA scans the anchors for the blocks that see one of its keys (in block order, so the sums are
 *      deterministic) and, per visiting block, loads its 64 query rows (Q, dO, lse, Di; cp.async, a 4-stage
 *      pipeline) shared by both warpgroups, then per warpgroup (skipped when none of its keys is seen):
 *        Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ            (wg_mma_ss<64,0,0>, both operands K-major panels)
 *        Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) masked, dSᵀ = Pᵀ ⊙ (dPᵀ − Di)   (registers, per column)
 *        dV += Pᵀ·dO, dK += dSᵀ·Q          (wg_mma_rs<HD,1>: A = bf16 registers, B = MN-major panels)
 *      as four commit groups, so Pᵀ is computed while dPᵀ runs and dSᵀ while dV runs. dK is scaled by the
 *      softmax scale once, at the store. Load balance: a plan kernel first counts each tile's visits (into
 *      dq's scratch after Di) and kernel 2's CTAs take the tiles longest first (tiles near a document's
 *      start are seen by every later block of it). The scan keeps each visiting block's anchor and doc id
 *      in shared memory (no dependent global loads at each visit).
 *   3. per (block, kv head), one warpgroup: dQ = scale · Σ dS·K over the block's key tiles (context tiles of
 *      its narrowed range, then the block tile; S = Q·Kᵀ and dP = dO·Vᵀ recomputed with wg_mma_ss, dQ with
 *      wg_mma_rs and K as an MN-major operand), then dK, dV of the block's own keys (only this CTA sees
 *      them) with kernel 2's visit on the block tile. Di is recomputed here from O and dO, because other
 *      CTAs overwrite the dq scratch. K/V tiles double buffered by cp.async (one barrier per tile); the
 *      block tile's S, dP, dQ products use N = 16 or 32 keys when B fits (wb_dq_tile<HD, NKEY>).
 * Configuration (each choice and its times at the standard shape: kernels/bench/RESULTS.md):
 *   kernel 2: two warpgroups per CTA sharing each visit's query tile (one CTA per SM), pipelined across
 *     visits (wb_kv_visit_p): a visit returns with its dK product in flight, the next visit's Sᵀ, dPᵀ queue
 *     behind it (no tensor-pipe drain at each visit's barrier); 4 stages, loads 2 visits ahead (a buffer is
 *     refilled once every warpgroup's dK reading it has retired), issued after the visit's Sᵀ and dPᵀ wgmmas
 *     (wb_kv_visit_p's hook) with the query rows' gmem offsets computed once per thread (LA): loads issued
 *     before the products delayed the tensor pipe's work behind the load issue;
 *   kernel 3: two blocks per CTA (wb_q2_kernel), one warpgroup per block, the context K/V
 *     tiles loaded once for both (union of the two ranges), double buffered (tile t + 1 loaded while tile t
 *     is used); its set-up from a plan (QR): wb_qplan_kernel (between kernels 2 and 3) scans each block's anchor window once
 *     (not once per kv head: 8x fewer scans at the standard shape) and leaves a 16-byte record in the block's
 *     own dq rows; a kernel 3 CTA reads its two records instead of anchor -> doc id -> scan -> two barriers;
 *   the fast elementwise (FM) in kernel 2's visits and kernel 3's tiles: branch-free masks (a select per
 *     element at most, none on full dQ tiles: a block's visible context keys are one contiguous range when
 *     its document is, checked once per block; doc ids are then not read), exp2 as one FFMA + ex2.approx.ftz
 *     with lse·log2(e) precomputed (kernel 2: by the Di kernel into dq's scratch after the plan), rows past
 *     the used ones masked by an exponent of −inf, lse / Di / slots read as pairs. The same values as the
 *     plain elementwise (bitwise, except P below 2^-126, flushed to 0); when dq is too small to hold
 *     lse·log2(e) (tiny shapes) kernel 2 runs the plain elementwise (a size path, not a choice).
 * Template knobs: wb_kv_kernel<HD, FM, LA>, wb_q2_kernel<HD, FM, QR>, wb_launch<HD, FM>; FM, LA and QR are true
 * on the library's path. Kernel 2 with FM = LA = false is the size path above. Kernel 3 with FM = QR = false
 * (the plain elementwise, with its own window scan) is launched only by kernels/bench (BA_BENCH_WG_M=0, through
 * wb_launch<HD, false>); the library instantiates its d_h 64 copy without launching it, because without it in
 * the module ptxas gives the d_h 64 kernel 3 other register numbers (wb_launch's codegen anchor).
 * Not done: a staged store of dQ / the block's dK, dV: each warp store already writes whole 32-byte sectors
 * (4 lanes × float2 of one row), so staging through smem would save instructions, not DRAM or L2 traffic.
 * Row mapping of a 64-row query tile: row r -> head g·G + r/B, slot r % B; rows >= G·B are
 * zero-filled and masked. Tiles are 64 rows × HD bf16 stored as HD/64 128B-swizzled panels of 8 KB.
 * P and dS are rounded to bf16 for the products (the reference's tolerance assumes it).
 */
#include "kernels/block_attn_bwd_wg.cuh"
#include "kernels/block_attn_wg.h"

extern "C" int ba_wg_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                              const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                              const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    const wb_opts o = {NULL};
    if (c->d_h == 128) return wb_launch<128>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    if (c->d_h == 64) return wb_launch<64>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    return kernels_fail("ba_wg_backward: d_h=%d, expected 64 or 128", c->d_h);
}
