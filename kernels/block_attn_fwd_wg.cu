/*
 * kernels/block_attn_fwd_wg.cu — the Hopper wgmma (sm_90a) anchored block attention forward that
 * block_attn_forward runs (kernels/block_attn_wg.h; contract and masks in kernels/block_attn.h,
 * dflash-reference.md §6). The kernels and their launch code are in kernels/block_attn_fwd_wg.cuh; this file
 * holds the entry points. The kernel template's two knobs are both the library's, chosen by the call:
 * PLAN (a workspace was given) and FREE (B is 16, 32 or 64).
 *
 * One CTA of NWG = 3 warpgroups per (3 consecutive blocks b0.., kv head g). Warpgroup w owns block
 * b0 + w's 64 query rows (row r -> head g·G + r/B, slot r%B; rows >= G·B and blocks past N compute on
 * zero Q and are never stored), kept in shared memory as 128B-swizzled K-major panels
 * (kernels/wgmma.cuh). Sorted anchors are ~16 tokens apart, so the blocks' context ranges (each
 * narrowed to the first..last key of its document inside [max(0, a-W), a)) nearly coincide: the CTA
 * merges them into at most NWG segments (ranges closer than one tile merge), walks them in 64-key
 * tiles, then walks the blocks' own keys packed BP = B rounded up to 16/32/64 rows per block (64/BP
 * blocks per tile). Each K/V tile is loaded once (NST = 4 stages, prefetch distance 2) and serves every
 * warpgroup whose keys it holds; the others skip it.
 *
 * Per tile and warpgroup: S = Q·Kᵀ with d_h/16 × wgmma m64nNKk16 (NK = 64, or BP on block tiles),
 * both operands from shared memory; masks only where the tile is not fully visible; online softmax in
 * fp32, base 2 with the scale folded into one FMA before ex2.approx; P rounded to bf16
 * (cvt.rn.bf16x2) straight from the accumulator into A fragments; O += P·V with NK/16 × wgmma
 * m64n(d_h)k16, A from registers, V MN-major (the V tile is stored like K, [key][d] panels, LBO =
 * panel bytes). The P·V group is left in flight across the next tile's barrier and waited by the next
 * S (or by a skip), which is why stage t-2, not t-1, is the one refilled at tile t. lse is saved in
 * natural log; out in bf16.
 *
 * Context masks by range: the set-up also counts the document's keys in each block's window; when every
 * block of the CTA has them as one contiguous run [lo, hi) (packed documents, the normal case; CTA-uniform
 * flag sCont) a context tile needs no doc ids (not even loaded), no ballots, and on an edge tile two integer
 * compares per element; full tiles none (faster than doc-id ballots on every tile: kernels/bench/RESULTS.md).
 * Interleaved documents fall back to the doc-id ballots per tile.
 *
 * Set-up per CTA: one scan of the union of the blocks' windows by all threads (doc ids), per-warp
 * partial first/last keys and counts, then warp 0 reduces, sorts (NWG <= 3, compile-time indices)
 * and merges. The tile walk, the loads and the masks were checked against the reference visibility
 * by a host emulation (every visible (row, key) pair multiplied exactly once, no masked-in zero row).
 *
 * Invariants: every wgmma / fence / commit / wait is executed by all 128 threads of a warpgroup
 * (every branch around them is warpgroup-uniform); accumulator arrays have compile-time indices
 * (ptxas: no spills, no serialized-wgmma notes; the cap is 168 registers at 3 warpgroups).
 * Shared memory: 3 Q tiles of 64 × d_h + 2·NST K/V tiles of 64 × d_h bf16 + 1 KB: 177 KB at d_h 128
 * — one CTA per SM, which registers impose anyway.
 *
 * Epilogue: out staged in the warpgroup's own Q tile (free once its last wgmma is waited; same swizzled layout,
 * conflict-free 4-byte writes), a named barrier per warpgroup, then 16-byte stores (16 threads per 256-byte
 * output row): 4-byte stores straight from the accumulators write each row in half-sector pieces.
 *
 * Plan path (block_attn_forward_ws, kernels/block_attn.h: d_ws != NULL). The set-up above costs ~4.6 µs per
 * CTA and is the same for every kv head of a block group, and CTAs in (group, head) order leave a long tail
 * (a per-CTA trace on the H200). So: wf_plan_kernel (one CTA of 384 threads per group of 3 blocks: wf_setup
 * itself, the same thread count, so the same record) writes one 96-byte record per group (sLo, sHi, the merged
 * segments, their count, the context tile count, the contiguity flag, the blocks' doc ids, the tile count, the
 * group) and the group's tile count; wf_order_kernel (one CTA, PDL) ranks the groups by decreasing tile count,
 * ties by group index, and copies each record to its rank's slot; the main kernel (PDL, griddepcontrol.wait
 * first) maps blockIdx.x -> (rank blockIdx.x / n_kv, kv head blockIdx.x % n_kv), so the hardware's in-order
 * dispatch is a longest-first list schedule, and its set-up is one 96-byte load and a barrier before the Q and
 * first K/V loads. Same per-row arithmetic as the in-kernel path: out and lse bitwise equal (the bench's
 * BA_FWD_PLAN=1 report and the GPU test compare them).
 *
 * K/V tiles by TMA: per-thread cp.async would take 2 048 16-byte copies per tile, and issuing them took about
 * a quarter of a tile's time. Host: two CUtensorMap (K, V: bf16, dims {d_h, n_kv, T + N·B}, box {64, 1, 64} =
 * one 128B-swizzled 64-row panel, OOB zero fill) per launch from cuTensorMapEncodeTiled (the runtime's driver
 * entry point, no -lcuda), passed as a __grid_constant__ parameter. Device: one mbarrier per stage (count 1);
 * tid 0 arrives with expect_tx (2 · d_h/64 · 8 KB) and issues one box per panel of K and of V; every thread
 * waits on the stage's phase (t / NST) & 1 before the per-tile barrier (which still guarantees that stage
 * (t - 2) % NST is no longer read when it is refilled). A context tile is 64 rows from its first key: rows past
 * the segment end are real keys instead of zeros, but outside every block's [lo, hi) (checked by a host
 * emulation: 200 000 random merges, 33 M extra rows, none visible), so P = 0 there. Block tiles by TMA only
 * when B = BP (16, 32, 64: the blocks' keys are 64 consecutive rows), else by cp.async with rows past the
 * blocks zero-filled (all TMA tiles precede them, so the phase count stays t / NST). Q and the doc ids
 * (ballot path) by cp.async. ptxas d_h 128: 157 registers (plan path 155).
 *
 * Free-running warpgroups (FREE, where B is 16, 32 or 64; else the barrier walk above): a per-tile
 * __syncthreads keeps the three warpgroups in lockstep (all S, then all softmax with the tensor cores idle,
 * then all P·V) and puts the next tile's issue on one warpgroup's path. With FREE the CTA has a fourth,
 * producer warpgroup (setmaxnreg: 24 registers; the three consumers 160) and no barrier is shared in the walk:
 * every consumer waits each tile's full mbarrier (skipped tiles too) and, once its last wgmma on tile u is
 * retired (the wait inside its next step), arrives on u's stage's empty mbarrier (count NWG, one arrival per
 * warpgroup, nothing returned to wait for); the producer's thread 0 waits that phase and issues tile u + NST
 * (prefetch distance NST = 4, not NST - 2). The producer warpgroup takes part in the set-up's barriers only
 * (wf_setup<NWG, true>: its threads scan nothing). Q keeps one cp.async group per warpgroup, waited with a
 * named barrier before the walk; in the ballot path (interleaved documents) the doc ids are read from global
 * memory. FREE needs B = BP because its block tiles come by TMA too. Same per-row arithmetic as the barrier
 * walk: out and lse bitwise equal (bench: full size and 11 shapes; GPU test on every case). FREE: 128
 * registers at launch (512 threads), consumers up to 148 of their 160 after setmaxnreg (SASS), the producer 24;
 * no spills.
 *
 * The measurements behind each choice above, and the candidates that lost, are in kernels/bench/RESULTS.md.
 */
#include "kernels/block_attn_fwd_wg.cuh"
#include "kernels/block_attn_wg.h"

/* Workspace of block_attn_forward_ws (kernels/block_attn.h): the plan, laid out at wf_ws_ints. */
extern "C" size_t block_attn_forward_workspace_bytes(const block_attn_config *c) {
    if (!c || c->N <= 0) return 0;
    return wf_ws_ints((c->N + WF_GROUP - 1) / WF_GROUP) * sizeof(int);
}

/* ws != NULL: the plan path (workspace of block_attn_forward_workspace_bytes bytes, 16-byte aligned). */
extern "C" int ba_wg_forward_ws(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, void *ws,
                                cudaStream_t stream) {
    if (ws && (uintptr_t)ws % 16) return kernels_fail("ba_wg_forward: the workspace is not 16-byte aligned");
    if (c->d_h == 128) return wf_select<128>(c, q, k, v, anchors, doc_ids, out, lse, ws, stream);
    if (c->d_h == 64) return wf_select<64>(c, q, k, v, anchors, doc_ids, out, lse, ws, stream);
    return kernels_fail("ba_wg_forward: d_h=%d, expected 64 or 128", c->d_h);
}

extern "C" int ba_wg_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                             const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse,
                             cudaStream_t stream) {
    return ba_wg_forward_ws(c, q, k, v, anchors, doc_ids, out, lse, NULL, stream);
}
