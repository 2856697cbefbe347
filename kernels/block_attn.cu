/*
 * kernels/block_attn.cu — DFlash anchored block attention on the device (kernels/block_attn.h): the public
 * launchers. They validate the config and the pointers once (ba_check_device) and run the Hopper wgmma
 * (sm_90a) kernels of kernels/block_attn_fwd_wg.cu and kernels/block_attn_bwd_wg.cu (entries in
 * kernels/block_attn_wg.h) on the shapes they take, and the plain fp32 kernels of kernels/block_attn_simt.cu
 * (entries in kernels/block_attn_simt.h) on the other shapes block_attn_shape_supported accepts. The choice is
 * a fixed function of the shape (ba_use_wg below; kernels/block_attn.h), never of a timing. The mma.sync sets
 * that preceded the wgmma kernels (3, 5, 6) live only in kernels/bench/block_attn_mma.cuh, their numbers in
 * kernels/bench/RESULTS.md.
 *
 * Preconditions the wgmma kernels rely on: d_h 64 or 128 (whole 64-element swizzled panels), (n_h / n_kv)·B
 * <= 64 (a GQA group's query rows of one block fill one 64-row tile: row r -> head g·G + r/B, slot r % B),
 * 16-byte aligned pointers (cp.async / TMA / vector loads). The SIMT kernels: d_h 16, 32, 64, 128 or 256, any
 * (n_h / n_kv)·B, 16-byte aligned pointers.
 */
#include "kernels/block_attn.h"
#include "kernels/block_attn_simt.h"
#include "kernels/block_attn_wg.h"

#include <cstdint>

namespace {

constexpr int BA_ROWS = 64;   /* query rows of one tile: (n_h / n_kv)·B must fit */

/* The wgmma kernels take d_h 64 or 128 with (n_h/n_kv)·B <= 64; block_attn_simt.cu the rest. */
bool ba_use_wg(const block_attn_config *c) {
    return (c->d_h == 64 || c->d_h == 128) && (c->n_h / c->n_kv) * c->B <= BA_ROWS;
}

int ba_check_device(const block_attn_config *c, const void *const *ptrs, int nptr, const char *who) {
    char err[320];
    if (block_attn_shape_supported(c, err, sizeof err)) return kernels_fail("%s: %s", who, err);
    for (int i = 0; i < nptr; i++)
        if ((uintptr_t)ptrs[i] % 16) return kernels_fail("%s: pointer argument %d is not 16-byte aligned", who, i);
    return 0;
}

}  // namespace

/* ---------------------------------------------------------------- launchers */

extern "C" int block_attn_forward(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                                  const int32_t *d_anchors, const int32_t *d_doc_ids, bf16 *d_out, float *d_lse,
                                  cudaStream_t stream) {
    const void *ptrs[] = {d_q, d_k, d_v, d_out};
    if (ba_check_device(c, ptrs, 4, "block_attn_forward")) return -1;
    if (!ba_use_wg(c)) return ba_simt_forward(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_lse, stream);
    return ba_wg_forward_ws(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_lse, NULL, stream);
}

extern "C" int block_attn_forward_ws(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                                     const int32_t *d_anchors, const int32_t *d_doc_ids, bf16 *d_out, float *d_lse,
                                     void *d_ws, cudaStream_t stream) {
    const void *ptrs[] = {d_q, d_k, d_v, d_out, d_ws};
    if (ba_check_device(c, ptrs, d_ws ? 5 : 4, "block_attn_forward_ws")) return -1;
    /* the SIMT kernels plan nothing: the workspace goes unused */
    if (!ba_use_wg(c)) return ba_simt_forward(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_lse, stream);
    return ba_wg_forward_ws(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_lse, d_ws, stream);
}

extern "C" int block_attn_backward(const block_attn_config *c, const bf16 *d_q, const bf16 *d_k, const bf16 *d_v,
                                   const int32_t *d_anchors, const int32_t *d_doc_ids, const bf16 *d_out,
                                   const bf16 *d_dout, const float *d_lse, float *d_dq, float *d_dk, float *d_dv,
                                   cudaStream_t stream) {
    const void *ptrs[] = {d_q, d_k, d_v, d_out, d_dout, d_dq, d_dk, d_dv};
    if (ba_check_device(c, ptrs, 8, "block_attn_backward")) return -1;
    if (!ba_use_wg(c))
        return ba_simt_backward(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_dout, d_lse, d_dq, d_dk, d_dv, stream);
    return ba_wg_backward(c, d_q, d_k, d_v, d_anchors, d_doc_ids, d_out, d_dout, d_lse, d_dq, d_dk, d_dv, stream);
}
