/*
 * kernels/bench/block_attn_wg_bench.cuh — bench-only entries into the wgmma block attention backward, for
 * kernels/bench/block_attn_bench.cu. Included after kernels/block_attn_bwd_wg.cuh (whose launch template it
 * instantiates with the plain elementwise, which the library does not launch); the library's entry points
 * (ba_wg_forward_ws, ba_wg_backward) link from its archive. The bench's set 7 forward is the library's
 * (ba_wg_forward_ws).
 *
 * Backward (ba_bench_wg_backward, ba_wg_backward_timed): BA_BENCH_WG_M, read per call: unset or empty = the
 * library's kernels; "0" = the plain elementwise (bench 84: kernel 2's loads before the products, kernel 3's
 * own window scan; bitwise equal but for P below 2^-126), the library's run-time alternative until issue 13.
 * ba_wg_backward_timed records ev[0..4] on stream before Di, the plan, dK/dV, dQ and after dQ.
 */
#ifndef KERNELS_BENCH_BLOCK_ATTN_WG_BENCH_CUH
#define KERNELS_BENCH_BLOCK_ATTN_WG_BENCH_CUH

#include <cstdlib>
#include <cstring>

namespace {

/* BA_BENCH_WG_M -> 1 for the plain elementwise ("0"), 0 for the library's; -1 with kernels_fail otherwise */
int wb_parse_plain(void) {
    const char *e = getenv("BA_BENCH_WG_M");
    if (!e || !e[0]) return 0;
    if (!strcmp(e, "0")) return 1;
    return kernels_fail("ba_bench_wg_backward: BA_BENCH_WG_M=%s, expected 0 or unset (the library's)", e);
}

int wb_bench_launch(int plain, const wb_opts &o, const block_attn_config *c, const bf16 *q, const bf16 *k,
                    const bf16 *v, const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                    const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    if (c->d_h == 128)
        return plain ? wb_launch<128, false>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream)
                     : wb_launch<128, true>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    if (c->d_h == 64)
        return plain ? wb_launch<64, false>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream)
                     : wb_launch<64, true>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    return kernels_fail("ba_bench_wg_backward: d_h=%d, expected 64 or 128", c->d_h);
}

}  // namespace

static int ba_bench_wg_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                                const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    const int plain = wb_parse_plain();
    if (plain < 0) return -1;
    const wb_opts o = {NULL};
    return wb_bench_launch(plain, o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
}

static int ba_wg_backward_timed(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                                const float *lse, float *dq, float *dk, float *dv, cudaEvent_t ev[5],
                                cudaStream_t stream) {
    const int plain = wb_parse_plain();
    if (plain < 0) return -1;
    const wb_opts o = {ev};
    return wb_bench_launch(plain, o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
}

#endif /* KERNELS_BENCH_BLOCK_ATTN_WG_BENCH_CUH */
