/*
 * kernels/attention.cu — causal varlen GQA attention forward, flash-attention style (kernels/attention.h).
 *
 * attention_wg_kernel (sm_90a wgmma): one block of two consumer warpgroups per 128 query rows of
 * one document and one head; it walks the document's key/value tiles of 128 keys from the diagonal
 * tile down to tile 0, double-buffered in shared memory as 128B-swizzled panels (kernels/wgmma.cuh)
 * loaded with cp.async (rows past the document zero-filled, so masked probabilities multiply zeros).
 * Per tile S = Q·Kᵀ runs by wgmma with both operands in shared memory, the fp32 online softmax runs
 * in registers, and O += P·V takes P from registers; the P·V of one key tile runs while the
 * warpgroup does the softmax of the next, so the tensor cores and the softmax overlap. Scores never
 * leave registers. Why each knob the launcher fixes (PP 1, OST, LAZY, LPT):
 *  - ping-pong issue order (PP 1): warpgroup 1 issues its MMAs after warpgroup 0's, so one
 *    warpgroup's softmax runs under the other's MMAs;
 *  - staged output stores (OST): the output leaves through shared memory in coalesced 16-byte stores;
 *  - lazy rescaling (LAZY): O, l and the running max move only when a row's max grows by more than
 *    8 in log2 units, voted per warp, which skips most O rescales;
 *  - longest-first tile order (LPT): grid z counts query tiles down from the longest document's
 *    last one, so the tiles with the most keys start first and light tiles fill the tail.
 * Fast exponent: scores stay unscaled through the mask and the row max, and each probability is one
 * FFMA (s·scale·log2 e − max·scale·log2 e) and one MUFU ex2 with flush-to-zero (ex2.approx.ftz:
 * results below 2^-126 become 0, which a bf16 probability next to a row maximum of 1 cannot
 * represent anyway). The running max compares scaled maxima only (a tile's raw max is scaled first),
 * so large scaled logits cannot overflow exp2 (tests/gpu/test_attention.c has a large-logit case).
 * The kernel template is kernels/attention_wg.cuh; this file instantiates the library's knob values. The
 * template's other values are instantiated only by kernels/bench/attention_bench.cu (which includes the .cuh); the
 * kernels that lost (mma.sync, warp-specialized, ...) live in kernels/bench/attention_variants.cuh, their numbers
 * in kernels/bench/RESULTS.md.
 */
#include "kernels/attention.h"
#include "kernels/attention_mma.h"
#include "kernels/attention_wg.cuh"
#include "kernels/mma.cuh"
#include "kernels/vec.cuh"
#include "kernels/wgmma.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

extern "C" int attention_forward(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                 const int32_t *cu_seqlens, int ND, int max_seqlen, int T, int NH, int NKV,
                                 int HD, float scale, cudaStream_t stream) {
    if (NH <= 0 || NKV <= 0 || NH % NKV)
        return kernels_fail("attention_forward: NH=%d must be a positive multiple of NKV=%d", NH, NKV);
    char serr[200];
    if (attention_shape_supported(NH, NKV, HD, serr, sizeof serr)) return kernels_fail("attention_forward: %s", serr);
    if (ND < 0 || ND > 65535 || T < 0 || max_seqlen < 0 || max_seqlen > T)
        return kernels_fail("attention_forward: bad sizes ND=%d T=%d max_seqlen=%d", ND, T, max_seqlen);
    if (NH > 65535) return kernels_fail("attention_forward: NH=%d too large", NH);
    if (!vec_aligned16(out) || !vec_aligned16(q) || !vec_aligned16(k) || !vec_aligned16(v))
        return kernels_fail("attention_forward: q, k, v and out must be 16-byte aligned");
    if (!(scale > 0.0f)) return kernels_fail("attention_forward: scale must be positive, got %g", scale);
    if (ND == 0 || max_seqlen == 0) return 0;
    /* head dims the wgmma kernel does not take (a fixed function of HD, kernels/attention.h) */
    if (HD != 64 && HD != 128)
        return attention_mma_forward(out, lse, q, k, v, cu_seqlens, ND, max_seqlen, T, NH, NKV, HD, scale, stream);
    /* the wgmma kernel, two warpgroups × 64 rows, 128-key tiles, one block per SM, ping-pong issue
     * order (PP 1), staged output stores, lazy rescaling, LPT order */
    if (HD == 128)
        return launch_wg<128, true, 2, 128, 1, 1, true, true, true>(out, lse, q, k, v, cu_seqlens, ND, max_seqlen, T,
                                                                     NH, NKV, scale, stream);
    return launch_wg<64, true, 2, 128, 1, 1, true, true, true>(out, lse, q, k, v, cu_seqlens, ND, max_seqlen, T, NH,
                                                                NKV, scale, stream);
}
