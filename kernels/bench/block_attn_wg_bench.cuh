/*
 * kernels/bench/block_attn_wg_bench.cuh — bench-only entries into the wgmma block attention, for
 * kernels/bench/block_attn_bench.cu and kernels/bench/ba_fwd_trace.cuh. Included after
 * kernels/block_attn_fwd_wg.cuh and kernels/block_attn_bwd_wg.cuh (whose templates it instantiates with the
 * knobs the library does not use); the library's entry points (ba_wg_forward, ...) link from its archive.
 *
 * Forward (ba_bench_wg_forward, ba_wg_forward_traced): BA_BENCH_WG_FWD in the bench's environment, read per
 * call: unset or empty = the library's kernel; "3" = session 2's default (doc-id ballots on every context
 * tile, 4-byte stores, cp.async, the barrier walk), the library's run-time alternative until issue 13.
 * ba_wg_forward_traced adds the per-CTA phase trace (d_h 128 only): *n_cta gets the grid size; trace
 * (device, n_cta × 32 u64, or NULL to ask only n_cta) gets per CTA: [0] smid, [1] entry, [2] Q and set-up
 * done, [3] loop end, [4] warpgroup 0's epilogue end (%globaltimer ns), [5] / [6] clock64 at entry / end
 * (thread 0), [7] tiles walked, [8 + w] clock cycles warpgroup w's thread 0 spent at the per-tile wait
 * (+ barrier + the next tile's load issue), [12], [13] warpgroups 1, 2's epilogue end (0 when not live);
 * [16 + w], [19 + w] the cycles of [8 + w] at the cp.async wait and at the barrier (free-running
 * warpgroups, where B is 16, 32 or 64: at the stage's full mbarrier, and in the stage releases); [22 + w]
 * cycles waiting for S (and the previous P·V) inside the tile steps.
 *
 * Backward (ba_bench_wg_backward, ba_wg_backward_timed): BA_BENCH_WG_M, read per call: unset or empty = the
 * library's kernels; "0" = the plain elementwise (bench 84: kernel 2's loads before the products, kernel 3's
 * own window scan; bitwise equal but for P below 2^-126), the library's run-time alternative until issue 13.
 * ba_wg_backward_timed records ev[0..4] on stream before Di, the plan, dK/dV, dQ and after dQ; probe 0: the
 * real backward; 1 skips every product (loads, scans and barriers only), 2 the softmax math: the results are
 * then garbage, timing only (d_h 128 only).
 */
#ifndef KERNELS_BENCH_BLOCK_ATTN_WG_BENCH_CUH
#define KERNELS_BENCH_BLOCK_ATTN_WG_BENCH_CUH

#include <cstdlib>
#include <cstring>

namespace {

struct wf_opt {
    bool fast;   /* default: range masks where documents are contiguous, staged epilogue; false: "3" */
    bool tma;    /* the default: K/V tiles by TMA ("3": cp.async) */
    bool free_run;   /* the default where B is 16, 32 or 64: free-running warpgroups and a producer warpgroup */
};

template <int HD, bool TRACE>
int wf_select_opt(wf_opt op, const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
              const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, void *ws,
              unsigned long long *trace, cudaStream_t stream) {
#define WF_GO(F, P, X, M) wf_launch<HD, WF_GROUP, F, F, P, TRACE, X, M>(c, q, k, v, anchors, doc_ids, out, lse, ws, trace, stream)
    if (op.free_run && (c->B == 16 || c->B == 32 || c->B == 64))   /* block tiles by TMA need B = BP */
        return ws ? WF_GO(true, true, true, true) : WF_GO(true, false, true, true);
    if (ws) return op.tma ? WF_GO(true, true, true, false) : WF_GO(false, true, false, false);
    return op.tma ? WF_GO(true, false, true, false) : WF_GO(false, false, false, false);
#undef WF_GO
}

/* BA_BENCH_WG_FWD -> options; -1 with kernels_fail on an unknown value */
int wf_parse(wf_opt *op) {
    const char *e = getenv("BA_BENCH_WG_FWD");
    op->fast = op->tma = op->free_run = true;
    if (!e || !e[0]) return 0;
    if (!strcmp(e, "3")) op->fast = op->tma = op->free_run = false;
    else return kernels_fail("ba_bench_wg_forward: BA_BENCH_WG_FWD=%s, expected 3 or unset (the library's)", e);
    return 0;
}

/* BA_BENCH_WG_M -> 1 for the plain elementwise ("0"), 0 for the library's; -1 with kernels_fail otherwise */
int wb_parse_plain(void) {
    const char *e = getenv("BA_BENCH_WG_M");
    if (!e || !e[0]) return 0;
    if (!strcmp(e, "0")) return 1;
    return kernels_fail("ba_bench_wg_backward: BA_BENCH_WG_M=%s, expected 0 or unset (the library's)", e);
}

template <int PROBE>
int wb_bench_launch(int plain, const wb_opts &o, const block_attn_config *c, const bf16 *q, const bf16 *k,
                    const bf16 *v, const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                    const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    if (c->d_h == 128)
        return plain ? wb_launch<128, PROBE, false>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream)
                     : wb_launch<128, PROBE, true>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    if (c->d_h == 64 && PROBE == 0)
        return plain ? wb_launch<64, 0, false>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream)
                     : wb_launch<64, 0, true>(o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    return kernels_fail("ba_bench_wg_backward: d_h=%d, expected 64 or 128 (the probes: 128)", c->d_h);
}

}  // namespace

static int ba_bench_wg_forward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                               const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, void *ws,
                               cudaStream_t stream) {
    wf_opt op;
    if (wf_parse(&op)) return -1;
    if (ws && (uintptr_t)ws % 16) return kernels_fail("ba_bench_wg_forward: the workspace is not 16-byte aligned");
    if (c->d_h == 128) return wf_select_opt<128, false>(op, c, q, k, v, anchors, doc_ids, out, lse, ws, NULL, stream);
    if (c->d_h == 64) return wf_select_opt<64, false>(op, c, q, k, v, anchors, doc_ids, out, lse, ws, NULL, stream);
    return kernels_fail("ba_bench_wg_forward: d_h=%d, expected 64 or 128", c->d_h);
}

static int ba_wg_forward_traced(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *anchors, const int32_t *doc_ids, bf16 *out, float *lse, void *ws,
                                unsigned long long *trace, int *n_cta, cudaStream_t stream) {
    *n_cta = (c->N + WF_GROUP - 1) / WF_GROUP * c->n_kv;
    if (!trace) return 0;
    wf_opt op;
    if (wf_parse(&op)) return -1;
    if (ws && (uintptr_t)ws % 16) return kernels_fail("ba_wg_forward_traced: the workspace is not 16-byte aligned");
    if (c->d_h == 128) return wf_select_opt<128, true>(op, c, q, k, v, anchors, doc_ids, out, lse, ws, trace, stream);
    return kernels_fail("ba_wg_forward_traced: d_h=%d, only 128 is traced", c->d_h);
}

static int ba_bench_wg_backward(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                                const float *lse, float *dq, float *dk, float *dv, cudaStream_t stream) {
    const int plain = wb_parse_plain();
    if (plain < 0) return -1;
    const wb_opts o = {NULL};
    return wb_bench_launch<0>(plain, o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
}

static int ba_wg_backward_timed(const block_attn_config *c, const bf16 *q, const bf16 *k, const bf16 *v,
                                const int32_t *anchors, const int32_t *doc_ids, const bf16 *out, const bf16 *dout,
                                const float *lse, float *dq, float *dk, float *dv, int probe, cudaEvent_t ev[5],
                                cudaStream_t stream) {
    const int plain = wb_parse_plain();
    if (plain < 0) return -1;
    if (probe < 0 || probe > 2) return kernels_fail("ba_wg_backward_timed: probe=%d, expected 0, 1 or 2", probe);
    const wb_opts o = {ev};
    if (probe == 1) return wb_bench_launch<1>(plain, o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    if (probe == 2) return wb_bench_launch<2>(plain, o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
    return wb_bench_launch<0>(plain, o, c, q, k, v, anchors, doc_ids, out, dout, lse, dq, dk, dv, stream);
}

#endif /* KERNELS_BENCH_BLOCK_ATTN_WG_BENCH_CUH */
