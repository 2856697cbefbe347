/*
 * tests/gpu/test_gdn_kernels.c — the Gated DeltaNet and gated-attention kernels of the Qwen3.5 /
 * Qwen3.6 target (kernels/gated_delta.h, conv1d.h, l2norm.h, gated_rmsnorm.h, gated_attn.h), each
 * on its own against its CPU reference on fresh seeded inputs. Documents of 1, 63, 64, 65 and 1000
 * tokens packed in one batch: a chunk boundary inside a document (64, 65, 1000) and at a document
 * start (the 64-token document starts at row 64... every document restarts the chunking), and
 * documents independent bitwise (each alone gives the rows it gives packed). The decode step's pair
 * (conv1d_decode over the slots' rings, gated_delta_decode from the slots' states) over a schedule of steps of
 * 1..64 rows per sequence against the whole-sequence references, and each sequence's last state snapshot bitwise
 * its live state.
 *
 * The gated delta rule in both forms: gated_delta_forward (one kernel) and gated_delta_forward_split (chunk-local
 * solves, the sequential walk, the intra-chunk output), each against the recurrence with its own CPU twin as the
 * 2x baseline, the split form with a poisoned workspace.
 *
 * Tolerances: the gated delta rule is fp32 in and out; its reference is the per-token recurrence
 * with double reductions. style.md's 2× rule: the kernel's max error against it is at most twice
 * that of the same chunked algorithm run in plain fp32 on the CPU (gated_delta_forward_chunked_ref),
 * plus 1e-6 of the output scale (a few fp32 ulps: the GPU sums the d_k dots in 8 strided partial
 * sums and contracts FMAs, so its rounding is not the CPU's term for term). conv1d and l2norm are
 * fp32 outputs of ≤ 16-term / d-term sums: rtol 1e-5. gated RMSNorm, rope and gate write bf16: one
 * rounding, rtol 1.6e-2 (style.md's bf16 bound). NaN fails every comparison (outputs poisoned).
 */
#include "kernels/conv1d.h"
#include "kernels/gated_attn.h"
#include "kernels/gated_delta.h"
#include "kernels/gated_rmsnorm.h"
#include "kernels/l2norm.h"
#include "k1util.h"
#include "tests/gdn_inputs.h"

static const int awkward[] = {1, 63, 64, 65, 1000};

/* The gdn_inputs on the device: conv rows fp32, b|a rows bf16, per-head vectors, cu_seqlens. */
struct gdn_dev {
    float *conv, *a_neg, *dt_bias, *o;
    bf16 *ba;
    int32_t *cu;
};

static void gdn_dev_upload(struct gdn_dev *d, struct gdn_inputs *g) {
    size_t T = (size_t)g->s.T;
    d->conv = k1_upload(g->conv, 4 * T * g->conv_dim);
    d->ba = k1_upload_bf16(g->ba, T * 2 * g->s.n_v);   /* already bf16 values: the round trip is exact */
    d->a_neg = k1_upload(g->a_neg, 4 * (size_t)g->s.n_v);
    d->dt_bias = k1_upload(g->dt_bias, 4 * (size_t)g->s.n_v);
    d->cu = k1_upload(g->cu, 4 * (size_t)(g->s.n_docs + 1));
    d->o = k1_malloc(4 * T * g->s.n_v * g->s.d_v);
    k1_poison(d->o, 4 * T * g->s.n_v * g->s.d_v);
}

static void gdn_dev_free(struct gdn_dev *d) {
    cudaFree(d->conv); cudaFree(d->ba); cudaFree(d->a_neg); cudaFree(d->dt_bias); cudaFree(d->cu); cudaFree(d->o);
}

/* The forward on the device: the one-kernel form, or (split) gated_delta_forward_split with a workspace of
 * exactly the bytes it asks for. */
static void launch_forward(int split, float *o, const float *c, const bf16 *ba, const struct gdn_dev *d,
                           const int32_t *cu, const struct gated_delta_shape *s) {
    const int kd = s->n_k * s->d_k;
    if (!split) {
        K1_LAUNCH(gated_delta_forward(o, c, c + kd, c + 2 * kd, ba, ba + s->n_v, d->a_neg, d->dt_bias, cu, s, 0));
    } else {
        size_t wb = gated_delta_split_workspace_bytes(s->T, s->n_docs, s);
        ck_assert_msg(wb > 0, "split workspace of 0 bytes for T %d", s->T);
        void *ws = k1_malloc(wb);
        k1_poison(ws, wb);   /* every value read from it must have been written this call */
        K1_LAUNCH(gated_delta_forward_split(o, c, c + kd, c + 2 * kd, ba, ba + s->n_v, d->a_neg, d->dt_bias, cu, s,
                                            ws, wb, 0));
        K1_CUDA(cudaDeviceSynchronize());
        cudaFree(ws);
    }
    K1_CUDA(cudaDeviceSynchronize());
}

static void run_gpu(struct gdn_dev *d, const struct gdn_inputs *g, int split) {
    launch_forward(split, d->o, d->conv, d->ba, d, d->cu, &g->s);
}

/* One layout over documents of the given lengths, the one-kernel form (split 0) or the split form (split 1): max
 * error against the per-token recurrence within 2x that of the same algorithm in plain fp32 on the CPU (the
 * chunked reference, or the split reference), plus 1e-6 of the scale; documents independent bitwise. */
static void gated_delta_case_form(int n_k, int n_v, int d_k, int d_v, const int *lens, int nd, uint64_t seed,
                                  int split) {
    struct gdn_inputs g;
    gdn_inputs_make(&g, lens, nd, n_k, n_v, d_k, d_v, seed);
    struct gdn_dev d;
    gdn_dev_upload(&d, &g);
    run_gpu(&d, &g, split);
    size_t n = (size_t)g.s.T * n_v * d_v;
    float *ref = malloc(4 * n), *base = malloc(4 * n), *got = malloc(4 * n), *st = malloc(4 * (size_t)n_v * d_k * d_v);
    K1_CUDA(cudaMemcpy(got, d.o, 4 * n, cudaMemcpyDeviceToHost));
    gated_delta_forward_ref(ref, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias, g.cu, &g.s, st);
    (split ? gated_delta_forward_split_ref : gated_delta_forward_chunked_ref)(
        base, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias, g.cu, &g.s, st);
    double scale = k1_max_abs(ref, n), e_gpu = k1_max_abs_diff(got, ref, n), e_base = k1_max_abs_diff(base, ref, n);
    double bound = 2 * e_base + 1e-6 * scale;
    fprintf(stderr, "gated_delta%s n_k %d n_v %d d_k %d d_v %d T %d: scale %.3g, gpu err %.3g, fp32 %s err %.3g, "
            "bound %.3g\n", split ? " (split)" : "", n_k, n_v, d_k, d_v, g.s.T, scale, e_gpu,
            split ? "split" : "chunked", e_base, bound);
    ck_assert(scale > 0.01);
    if (!(e_gpu <= bound)) test_allclose("gated_delta", got, ref, n, bound, 0);   /* prints the worst pairs */
    ck_assert_msg(e_gpu <= bound, "gated delta: GPU max error %.3g > bound %.3g", e_gpu, bound);

    /* documents independent, bitwise: each document alone (its rows at offset 0) */
    for (int di = 0; di < nd; di++) {
        int s0 = g.cu[di], len = lens[di];
        if (len == 0) continue;
        struct gated_delta_shape s1 = g.s;
        s1.T = len;
        s1.n_docs = 1;
        int32_t cu1[2] = {0, len};
        int32_t *dcu = k1_upload(cu1, sizeof cu1);
        float *o1 = k1_malloc(4 * (size_t)len * n_v * d_v);
        float *c = d.conv + (size_t)s0 * g.conv_dim;
        bf16 *ba = d.ba + (size_t)s0 * 2 * n_v;
        launch_forward(split, o1, c, ba, &d, dcu, &s1);
        float *one = malloc(4 * (size_t)len * n_v * d_v);
        K1_CUDA(cudaMemcpy(one, o1, 4 * (size_t)len * n_v * d_v, cudaMemcpyDeviceToHost));
        ck_assert_msg(memcmp(one, got + (size_t)s0 * n_v * d_v, 4 * (size_t)len * n_v * d_v) == 0,
                      "document %d (len %d) alone differs from its rows in the packed batch", di, len);
        free(one); cudaFree(o1); cudaFree(dcu);
    }
    free(ref); free(base); free(got); free(st);
    gdn_dev_free(&d);
    gdn_inputs_free(&g);
}

static void gated_delta_case(int n_k, int n_v, int d_k, int d_v, const int *lens, int nd, uint64_t seed) {
    gated_delta_case_form(n_k, n_v, d_k, d_v, lens, nd, seed, 0);
    gated_delta_case_form(n_k, n_v, d_k, d_v, lens, nd, seed, 1);
}

START_TEST(gated_delta_tiny_layout) {
    gated_delta_case(2, 4, 8, 12, awkward, 5, 1);   /* qwen3.5-tiny: d_v 12 < one 64-column tile */
}
END_TEST

START_TEST(gated_delta_mid_layout) {
    gated_delta_case(1, 2, 64, 80, awkward, 5, 2);  /* a partial second value tile (64 + 16 columns) */
    int single[] = {1};
    gated_delta_case(2, 2, 32, 32, single, 1, 3);   /* T = 1 */
}
END_TEST

START_TEST(gated_delta_27b_layout) {
    gated_delta_case(16, 48, 128, 128, awkward, 5, 4);   /* Qwen3.6-27B: 16 key / 48 value heads of 128 */
}
END_TEST

START_TEST(gated_delta_refuses_layouts) {
    struct gated_delta_shape s = {4, 1, 2, 4, 192, 128, 2 * 2 * 192 + 512, 2 * 2 * 192 + 512, 8};
    float *x = k1_malloc(4096);
    ck_assert_int_eq(gated_delta_forward(x, x, x, x, (bf16 *)x, (bf16 *)x, x, x, (int32_t *)x, &s, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "linear_key_head_dim"));
    ck_assert_int_eq(gated_delta_forward_split(x, x, x, x, (bf16 *)x, (bf16 *)x, x, x, (int32_t *)x, &s, x, 4096, 0), -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "linear_key_head_dim"));
    /* a layout it takes, with a workspace smaller than it asks for: refused before any launch */
    struct gated_delta_shape ok = {64, 1, 1, 2, 16, 16, 64, 64, 4};
    ck_assert(gated_delta_split_workspace_bytes(64, 1, &ok) > 4096);
    ck_assert_int_eq(gated_delta_forward_split(x, x, x, x, (bf16 *)x, (bf16 *)x, x, x, (int32_t *)x, &ok, x, 4096, 0),
                     -1);
    ck_assert_ptr_nonnull(strstr(kernels_error(), "workspace"));
    cudaFree(x);
}
END_TEST

static void conv_case(int D, int K, int stride, uint64_t seed) {
    int nd = 5, T = 0;
    int32_t cu[6] = {0};
    for (int d = 0; d < nd; d++) cu[d + 1] = T += awkward[d];
    size_t nx = (size_t)T * stride, n = (size_t)T * D;
    float *x = k1_randn(&seed, nx, -2, 2), *w = k1_randn(&seed, (size_t)D * K, -0.7f, 0.7f);
    float *ref = malloc(4 * n), *got = malloc(4 * n);
    bf16 *dx = k1_upload_bf16(x, nx);
    float *dw = k1_upload(w, 4 * (size_t)D * K), *dy = k1_malloc(4 * n);
    int32_t *dcu = k1_upload(cu, sizeof cu);
    k1_poison(dy, 4 * n);
    K1_LAUNCH(conv1d_forward(dy, dx, stride, dw, dcu, nd, T, D, K, 0));
    K1_CUDA(cudaDeviceSynchronize());
    K1_CUDA(cudaMemcpy(got, dy, 4 * n, cudaMemcpyDeviceToHost));
    conv1d_forward_ref(ref, x, stride, w, cu, nd, T, D, K);
    ck_assert_msg(test_allclose("conv1d", got, ref, n, 1e-6, 1e-5), "conv1d D=%d K=%d", D, K);
    free(x); free(w); free(ref); free(got);
    cudaFree(dx); cudaFree(dw); cudaFree(dy); cudaFree(dcu);
}

START_TEST(conv1d_shapes) {
    conv_case(80, 4, 80 + 48 + 8, 1);         /* qwen3.5-tiny's conv channels inside its fused row */
    conv_case(10240, 4, 10240 + 6144 + 96, 2);   /* Qwen3.6-27B's */
    conv_case(33, 1, 33, 3);
    conv_case(7, 9, 8, 4);
}
END_TEST

/* The decode step over tests/gdn_inputs.h's schedule (document d in slot d, several sequences per step). */
static void decode_case(int n_k, int n_v, int d_k, int d_v, uint64_t seed) {
    static const int sizes[] = {5, 1, 17, 3, 64, 1, 2, 40};
    struct gdn_inputs g;
    gdn_inputs_make(&g, awkward, 5, n_k, n_v, d_k, d_v, seed);
    const int D = g.conv_dim, K = 4, n_snap = 17, W = 64 + n_snap + K - 1, kd = n_k * d_k, T = g.s.T;
    const size_t SS = (size_t)n_v * d_k * d_v, VD = (size_t)n_v * d_v;
    struct gdn_step steps[128];
    int n = gdn_schedule(g.cu, 5, sizes, 8, steps, 128);
    ck_assert_int_gt(n, 3);
    /* the conv's input: the conv rows themselves, rounded to bf16 as the ring holds them */
    float *x = malloc(4 * (size_t)T * D), *w = k1_randn(&seed, (size_t)D * K, -0.7f, 0.7f);
    memcpy(x, g.conv, 4 * (size_t)T * D);
    for (size_t i = 0; i < (size_t)T * D; i++) x[i] = bf16_round(x[i]);
    float *cref = malloc(4 * (size_t)T * D), *ref = malloc(4 * (size_t)T * VD), *base = malloc(4 * (size_t)T * VD);
    float *st = malloc(4 * SS), *got = malloc(4 * (size_t)T * VD), *hs = malloc(4 * (size_t)T * 2 * n_v + 4);
    conv1d_forward_ref(cref, x, D, w, g.cu, 5, T, D, K);
    gated_delta_forward_ref(ref, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias, g.cu, &g.s,
                            st);
    gated_delta_forward_chunked_ref(base, GDN_Q(&g), GDN_K(&g), GDN_V(&g), GDN_B(&g), GDN_A(&g), g.a_neg, g.dt_bias,
                                    g.cu, &g.s, st);
    bf16 *hist = k1_malloc(2 * (size_t)5 * W * D);
    k1_poison(hist, 2 * (size_t)5 * W * D);   /* a ring row read before it is written is a NaN */
    float *dw = k1_upload(w, 4 * (size_t)D * K), *dy = k1_malloc(4 * (size_t)T * D);
    float *dconv = k1_malloc(4 * (size_t)T * D);
    float *dan = k1_upload(g.a_neg, 4 * (size_t)n_v), *ddt = k1_upload(g.dt_bias, 4 * (size_t)n_v);
    float *dstate = k1_malloc(4 * 5 * SS), *dsnap = k1_malloc(4 * 5 * n_snap * SS);
    float *dout = k1_malloc(4 * (size_t)T * VD);
    K1_CUDA(cudaMemset(dstate, 0, 4 * 5 * SS));
    int32_t *dslot = k1_malloc(4 * (size_t)T), *dpos = k1_malloc(4 * (size_t)T);
    int32_t *dcu = k1_malloc(4 * (GDN_MAX_SEQ + 1));
    int32_t *dss = k1_malloc(4 * GDN_MAX_SEQ), *dsp = k1_malloc(4 * GDN_MAX_SEQ), slot[1200], pos[1200];
    float *xs = malloc(4 * (size_t)T * D), *ys = malloc(4 * (size_t)T * D), *os = malloc(4 * (size_t)T * VD);
    float *live = malloc(4 * SS), *sn = malloc(4 * SS);
    for (int k = 0; k < n; k++) {
        struct gdn_step *p = &steps[k];
        gdn_row_slots(p, slot, pos);
        K1_CUDA(cudaMemcpy(dslot, slot, 4 * (size_t)p->T, cudaMemcpyHostToDevice));
        K1_CUDA(cudaMemcpy(dpos, pos, 4 * (size_t)p->T, cudaMemcpyHostToDevice));
        K1_CUDA(cudaMemcpy(dcu, p->cu, 4 * (size_t)(p->n_seq + 1), cudaMemcpyHostToDevice));
        K1_CUDA(cudaMemcpy(dss, p->slot, 4 * (size_t)p->n_seq, cudaMemcpyHostToDevice));
        K1_CUDA(cudaMemcpy(dsp, p->pos, 4 * (size_t)p->n_seq, cudaMemcpyHostToDevice));
        /* conv: the step's rows into the rings, then the rows' conv */
        gdn_gather(xs, x, D, D, p);
        bf16 *dx = k1_upload_bf16(xs, (size_t)p->T * D);   /* already bf16 values: exact */
        K1_LAUNCH(conv1d_decode_append(hist, dx, D, dslot, dpos, p->T, W, D, 0));
        K1_LAUNCH(conv1d_decode(dy, hist, dslot, dpos, p->T, W, dw, D, K, 0));
        K1_CUDA(cudaMemcpy(ys, dy, 4 * (size_t)p->T * D, cudaMemcpyDeviceToHost));
        gdn_gather(xs, cref, D, D, p);
        ck_assert_msg(test_allclose("conv1d_decode", ys, xs, (size_t)p->T * D, 1e-6, 1e-5), "step %d", k);
        cudaFree(dx);
        /* the gated delta rule from the slots' states */
        gdn_gather(xs, g.conv, D, D, p);
        K1_CUDA(cudaMemcpy(dconv, xs, 4 * (size_t)p->T * D, cudaMemcpyHostToDevice));
        gdn_gather(hs, g.ba, 2 * n_v, 2 * n_v, p);
        bf16 *dba = k1_upload_bf16(hs, (size_t)p->T * 2 * n_v);
        struct gated_delta_shape s = g.s;
        s.T = p->T;
        s.n_docs = p->n_seq;
        K1_LAUNCH(gated_delta_decode(dout, dconv, dconv + kd, dconv + 2 * kd, dba, dba + n_v, dan, ddt, dcu, dss, dsp,
                                     &s, dstate, dsnap, n_snap, 0));
        K1_CUDA(cudaDeviceSynchronize());
        K1_CUDA(cudaMemcpy(os, dout, 4 * (size_t)p->T * VD, cudaMemcpyDeviceToHost));
        for (int r = 0; r < p->T; r++) memcpy(got + (size_t)p->rows[r] * VD, os + (size_t)r * VD, 4 * VD);
        for (int i = 0; i < p->n_seq; i++) {   /* the last row's snapshot is the live state, bit for bit */
            int last = p->pos[i] + p->cu[i + 1] - p->cu[i] - 1;
            K1_CUDA(cudaMemcpy(live, dstate + (size_t)p->slot[i] * SS, 4 * SS, cudaMemcpyDeviceToHost));
            K1_CUDA(cudaMemcpy(sn, dsnap + ((size_t)p->slot[i] * n_snap + last % n_snap) * SS, 4 * SS,
                               cudaMemcpyDeviceToHost));
            ck_assert_msg(!memcmp(live, sn, 4 * SS), "step %d slot %d: snapshot of position %d is not the live state",
                          k, p->slot[i], last);
        }
        cudaFree(dba);
        free(p->rows);
    }
    size_t no = (size_t)T * VD;
    double scale = k1_max_abs(ref, no), e_gpu = k1_max_abs_diff(got, ref, no), e_base = k1_max_abs_diff(base, ref, no);
    double bound = 2 * e_base + 1e-6 * scale;
    fprintf(stderr, "gated_delta_decode n_k %d n_v %d d_k %d d_v %d, %d steps: scale %.3g, gpu err %.3g, fp32 chunked "
            "err %.3g, bound %.3g\n", n_k, n_v, d_k, d_v, n, scale, e_gpu, e_base, bound);
    ck_assert(scale > 0.01);
    if (!(e_gpu <= bound)) test_allclose("gated_delta_decode", got, ref, no, bound, 0);
    ck_assert_msg(e_gpu <= bound, "gated delta decode: GPU max error %.3g > bound %.3g", e_gpu, bound);
    free(x); free(w); free(cref); free(ref); free(base); free(st); free(got); free(hs); free(xs); free(ys); free(os);
    free(live); free(sn);
    cudaFree(hist); cudaFree(dw); cudaFree(dy); cudaFree(dconv); cudaFree(dan); cudaFree(ddt); cudaFree(dstate);
    cudaFree(dsnap); cudaFree(dout); cudaFree(dslot); cudaFree(dpos); cudaFree(dcu); cudaFree(dss); cudaFree(dsp);
    gdn_inputs_free(&g);
}

START_TEST(decode_step_layouts) {
    decode_case(2, 4, 8, 12, 11);        /* qwen3.5-tiny */
    decode_case(16, 48, 128, 128, 12);   /* Qwen3.6-27B */
}
END_TEST

START_TEST(l2norm_shapes) {
    int shapes[][3] = {{1193, 2, 8}, {1193, 32, 128}, {5, 3, 100}};
    for (int s = 0; s < 3; s++) {
        int N = shapes[s][0], H = shapes[s][1], d = shapes[s][2], stride = H * d + 5;
        uint64_t seed = 20 + s;
        size_t n = (size_t)N * stride;
        float *x = k1_randn(&seed, n, -1, 1), *got = malloc(4 * n);
        float *dx = k1_upload(x, 4 * n);
        float scale = s == 1 ? 1.0f / sqrtf((float)d) : 1.0f;
        K1_LAUNCH(l2norm_forward(dx, N, stride, H, d, scale, 0));
        K1_CUDA(cudaDeviceSynchronize());
        K1_CUDA(cudaMemcpy(got, dx, 4 * n, cudaMemcpyDeviceToHost));
        l2norm_forward_ref(x, N, stride, H, d, scale);   /* the 5 pad columns stay as they were on both */
        ck_assert_msg(test_allclose("l2norm", got, x, n, 1e-7, 1e-5), "l2norm N=%d H=%d d=%d", N, H, d);
        free(x); free(got); cudaFree(dx);
    }
}
END_TEST

START_TEST(gated_rmsnorm_shapes) {
    int shapes[][3] = {{1193, 4, 12}, {1193, 48, 128}, {1, 1, 1}};
    for (int s = 0; s < 3; s++) {
        int T = shapes[s][0], H = shapes[s][1], d = shapes[s][2], zs = H * d + 8;
        uint64_t seed = 30 + s;
        size_t n = (size_t)T * H * d;
        float *o = k1_randn(&seed, n, -0.3f, 0.3f), *z = k1_randn(&seed, (size_t)T * zs, -4, 4);
        float *w = k1_randn(&seed, (size_t)d, 0.5f, 1.5f), *ref = malloc(4 * n), *got = malloc(4 * n);
        float *dO = k1_upload(o, 4 * n), *dw = k1_upload(w, 4 * (size_t)d);
        bf16 *dz = k1_upload_bf16(z, (size_t)T * zs), *dy = k1_malloc(2 * n);
        k1_poison(dy, 2 * n);
        K1_LAUNCH(gated_rmsnorm_forward(dy, dO, dz, zs, dw, T, H, d, 1e-6f, 0));
        K1_CUDA(cudaDeviceSynchronize());
        k1_download_bf16(got, dy, n);
        gated_rmsnorm_forward_ref(ref, o, z, zs, w, T, H, d, 1e-6f);
        ck_assert_msg(test_allclose("gated_rmsnorm", got, ref, n, 1e-3, 1.6e-2), "gated_rmsnorm T=%d H=%d d=%d", T, H, d);
        free(o); free(z); free(w); free(ref); free(got);
        cudaFree(dO); cudaFree(dw); cudaFree(dz); cudaFree(dy);
    }
}
END_TEST

static void attn_case(int T, int NH, int NKV, int HD, int R, uint64_t seed) {
    size_t row = 2 * (size_t)NH * HD + 2 * (size_t)NKV * HD, nq = (size_t)T * NH * HD, nk = (size_t)T * NKV * HD;
    float *qkv = k1_randn(&seed, (size_t)T * row, -2, 2);
    bf16 *dqkv = k1_upload_bf16(qkv, (size_t)T * row);
    float *q = malloc(4 * nq), *g = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nk);
    float *gq = malloc(4 * nq), *gg = malloc(4 * nq), *gk = malloc(4 * nk), *gv = malloc(4 * nk);
    bf16 *dq = k1_malloc(2 * nq), *dg = k1_malloc(2 * nq), *dk = k1_malloc(2 * nk), *dv = k1_malloc(2 * nk);
    k1_poison(dq, 2 * nq); k1_poison(dg, 2 * nq); k1_poison(dk, 2 * nk); k1_poison(dv, 2 * nk);
    K1_LAUNCH(gated_attn_split_forward(dq, dg, dk, dv, dqkv, T, NH, NKV, HD, 0));
    K1_CUDA(cudaDeviceSynchronize());
    gated_attn_split_forward_ref(q, g, k, v, qkv, T, NH, NKV, HD);
    k1_download_bf16(gq, dq, nq); k1_download_bf16(gg, dg, nq); k1_download_bf16(gk, dk, nk); k1_download_bf16(gv, dv, nk);
    ck_assert_msg(!memcmp(gq, q, 4 * nq) && !memcmp(gg, g, 4 * nq) && !memcmp(gk, k, 4 * nk) && !memcmp(gv, v, 4 * nk),
                  "split T=%d NH=%d NKV=%d HD=%d: not an exact copy", T, NH, NKV, HD);
    /* partial rope on the split q, k (bf16 values on both sides) */
    int32_t *pos = malloc(4 * (size_t)T);
    for (int t = 0; t < T; t++) pos[t] = t % 3 == 2 ? 200000 + t : t % 777;   /* large angles too */
    float *inv = malloc(4 * (size_t)(R / 2));
    for (int i = 0; i < R / 2; i++) inv[i] = 1.0f / powf(10000000.0f, (float)(2 * i) / (float)R);
    int32_t *dpos = k1_upload(pos, 4 * (size_t)T);
    float *dinv = k1_upload(inv, 4 * (size_t)(R / 2));
    K1_LAUNCH(gated_attn_rope_forward(dq, dk, dpos, dinv, T, NH, NKV, HD, R, 0));
    K1_CUDA(cudaDeviceSynchronize());
    gated_attn_rope_forward_ref(q, pos, inv, T, NH, HD, R);
    gated_attn_rope_forward_ref(k, pos, inv, T, NKV, HD, R);
    k1_download_bf16(gq, dq, nq); k1_download_bf16(gk, dk, nk);
    ck_assert_msg(test_allclose("rope q", gq, q, nq, 1e-3, 1.6e-2), "rope T=%d HD=%d R=%d", T, HD, R);
    ck_assert_msg(test_allclose("rope k", gk, k, nk, 1e-3, 1.6e-2), "rope T=%d HD=%d R=%d", T, HD, R);
    /* gate: q ⊙ sigmoid(gate) in place (q plays the attention output) */
    for (size_t i = 0; i < nq; i++) q[i] = gq[i];
    K1_LAUNCH(gated_attn_gate_forward(dq, dg, (int64_t)nq, 0));
    K1_CUDA(cudaDeviceSynchronize());
    gated_attn_gate_forward_ref(q, g, (int64_t)nq);
    k1_download_bf16(gq, dq, nq);
    ck_assert_msg(test_allclose("gate", gq, q, nq, 1e-3, 1.6e-2), "gate T=%d", T);
    free(qkv); free(q); free(g); free(k); free(v); free(gq); free(gg); free(gk); free(gv); free(pos); free(inv);
    cudaFree(dqkv); cudaFree(dq); cudaFree(dg); cudaFree(dk); cudaFree(dv); cudaFree(dpos); cudaFree(dinv);
}

START_TEST(gated_attn_shapes) {
    attn_case(1193, 4, 2, 16, 8, 1);      /* qwen3.5-tiny */
    attn_case(1193, 24, 4, 256, 64, 2);   /* Qwen3.6-27B: rotary 64 of 256 */
    attn_case(1, 1, 1, 2, 2, 3);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_gdn_kernels");
    TCase *tc = tcase_create("gpu_gdn_kernels");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, gated_delta_tiny_layout);
    tcase_add_test(tc, gated_delta_mid_layout);
    tcase_add_test(tc, gated_delta_27b_layout);
    tcase_add_test(tc, gated_delta_refuses_layouts);
    tcase_add_test(tc, conv1d_shapes);
    tcase_add_test(tc, decode_step_layouts);
    tcase_add_test(tc, l2norm_shapes);
    tcase_add_test(tc, gated_rmsnorm_shapes);
    tcase_add_test(tc, gated_attn_shapes);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
