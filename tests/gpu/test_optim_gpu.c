/*
 * tests/gpu/test_optim_gpu.c — the GPU optimizers (train/optim_gpu.h) on a plain table of device tensors against the
 * CPU optimizer (train/optim.h, whose AdamW is kernels/adamw_ref.c): Muon by shape batches (the issue-28 path) and
 * one matrix at a time (the path before it), AdamW as one multi-tensor launch, the one-launch gradient norm.
 *
 * The table mixes shapes in an order that tests the grouping: three 64x128, two tall 128x64 (the transposed
 * Newton–Schulz forms), one 96x96, two 8x24 (a tiny batch), two 1-D tensors (AdamW) and a frozen 32x32, interleaved.
 * Each step: the grads (re-uploaded, fixed per step) are scaled by 1/A = 0.5 and clipped to 1.0 (their norm is
 * ~10, so the clip is active), then one optimizer step; three steps so the momentum matters.
 *
 * Tolerances (style.md's rule): the reference is the CPU optimizer with muon_bf16 = 0 (Newton–Schulz in fp32), the
 * baseline the CPU optimizer with muon_bf16 = 1 (bf16 at torch's rounding points, the GPU's precision). Per Muon
 * matrix, the GPU's max weight error against the reference must be at most 2x the baseline's; the batched and
 * per-matrix GPU paths may differ from each other by at most 2x the baseline's error too (they differ only in the
 * cuBLASLt algorithm's accumulation order). Exact where the arithmetic is the same: the momentum buffers and the
 * AdamW tensors of the two GPU paths are bitwise equal, the bf16 copies are bf16(w) exactly, the frozen tensor
 * never moves, and the batched gradient norm equals the per-tensor launches' bit for bit. Against the CPU the
 * elementwise state (momentum, AdamW w/m/v) differs by FMA contraction only: test_adamw.c's bounds.
 */
#include <cuda_runtime_api.h>

#include "kernels/adamw.h"
#include "kernels/common.h"
#include "tests/gpu/k1util.h"
#include "train/optim.h"
#include "train/optim_gpu.h"

#define NT 11

struct spec {
    const char *name;
    int ndim;
    int64_t r, c;
    int trainable, is_matrix;
};

static const struct spec muon_table[NT] = {
    {"a.0", 2, 64, 128, 1, 1}, {"t.0", 2, 128, 64, 1, 1}, {"n.0", 1, 128, 1, 1, 0}, {"a.1", 2, 64, 128, 1, 1},
    {"s.0", 2, 96, 96, 1, 1},  {"w.0", 2, 8, 24, 1, 1},   {"t.1", 2, 128, 64, 1, 1}, {"f.0", 2, 32, 32, 0, 1},
    {"a.2", 2, 64, 128, 1, 1}, {"n.1", 1, 40, 1, 1, 0},   {"w.1", 2, 8, 24, 1, 1},
};

/* One optimizer run: host tensors (w, g), the host optim, and on the GPU the device tensors and the optim_gpu. */
struct orun {
    int n;
    int64_t numel[NT];
    float *w[NT], *g[NT];
    struct optim_tensor t[NT];
    struct optim o;
    float *dw[NT], *dg[NT];
    bf16 *dcopy[NT];
    struct optim_gpu *og;
};

static void orun_init(struct orun *r, const struct spec *sp, int n, enum optim_kind kind, int muon_bf16, int gpu,
                      int batched, int misalign) {
    char err[512];
    memset(r, 0, sizeof *r);
    r->n = n;
    uint64_t rng = 0xabc;
    for (int i = 0; i < n; i++) {
        r->numel[i] = sp[i].ndim == 1 ? sp[i].r : sp[i].r * sp[i].c;
        r->w[i] = malloc(4 * (size_t)r->numel[i]);
        r->g[i] = malloc(4 * (size_t)r->numel[i]);
        test_rng_fill(&rng, r->w[i], (size_t)r->numel[i], -0.1f, 0.1f);
        r->t[i] = (struct optim_tensor){sp[i].name, sp[i].ndim, {sp[i].r, sp[i].ndim == 2 ? sp[i].c : 0}, r->w[i],
                                        sp[i].trainable ? r->g[i] : NULL, sp[i].trainable, sp[i].is_matrix};
    }
    struct optim_config oc;
    optim_config_default(&oc);
    oc.kind = kind;
    oc.lr = 3e-3;
    oc.muon_bf16 = muon_bf16;
    ck_assert_msg(optim_init(&r->o, r->t, n, &oc, err, sizeof err) == 0, "%s", err);
    if (!gpu) return;
    struct optim_gpu_tensor dev[NT];
    for (int i = 0; i < n; i++) {
        /* misalign: tensor 4's device pointers (3 chunks and a tail) start one float in, forcing AdamW's scalar path */
        int off = misalign && i == 4;
        r->dw[i] = (float *)k1_malloc(4 * (size_t)(r->numel[i] + 1)) + off;
        r->dg[i] = (float *)k1_malloc(4 * (size_t)(r->numel[i] + 1)) + off;
        r->dcopy[i] = (bf16 *)k1_malloc(2 * (size_t)(r->numel[i] + 1)) + off;
        K1_CUDA(cudaMemcpy(r->dw[i], r->w[i], 4 * (size_t)r->numel[i], cudaMemcpyHostToDevice));
        k1_poison(r->dcopy[i], 2 * (size_t)r->numel[i]);
        /* frozen tensors: the Muon run hands its pointers (and checks they never move), the AdamW runs hand NULL as
         * drafter_gpu does for tables it keeps no fp32 copy of */
        int no_ptr = !sp[i].trainable && kind == OPTIM_ADAMW;
        dev[i] = (struct optim_gpu_tensor){no_ptr ? NULL : r->dw[i], sp[i].trainable ? r->dg[i] : NULL, r->dcopy[i]};
    }
    r->og = optim_gpu_init_table(&r->o, dev, 0, stderr, err, sizeof err);
    ck_assert_msg(r->og != NULL, "optim_gpu_init_table: %s", err);
    optim_gpu_set_muon_batched(r->og, batched);
}

static void orun_free(struct orun *r, int misalign) {
    optim_gpu_free(r->og);
    for (int i = 0; i < r->n; i++) {
        int off = misalign && i == 4;
        if (r->dw[i]) cudaFree(r->dw[i] - off), cudaFree(r->dg[i] - off), cudaFree(r->dcopy[i] - off);
        free(r->w[i]);
        free(r->g[i]);
    }
    optim_free(&r->o);
}

/* The step's gradients (the same for every run), U(-amp, amp). */
static void fill_grads(struct orun *r, int step, float amp) {
    for (int i = 0; i < r->n; i++) {
        uint64_t rng = 1000 + 31 * (uint64_t)step + (uint64_t)i;
        test_rng_fill(&rng, r->g[i], (size_t)r->numel[i], -amp, amp);
    }
}

/* One optimizer step with grad scale s and clip max_norm; returns the pre-clip norm. */
static double orun_step(struct orun *r, int step, float amp, float s, double max_norm) {
    char err[512];
    fill_grads(r, step, amp);
    double norm;
    if (r->og) {
        for (int i = 0; i < r->n; i++)
            K1_CUDA(cudaMemcpy(r->dg[i], r->g[i], 4 * (size_t)r->numel[i], cudaMemcpyHostToDevice));
        ck_assert_msg(optim_gpu_grad_norm_start(r->og, s, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(optim_gpu_grad_norm_wait(r->og, &norm, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(optim_gpu_step(r->og, 1.0, max_norm, err, sizeof err) == 0, "%s", err);
        K1_CUDA(cudaDeviceSynchronize());
        for (int i = 0; i < r->n; i++)
            K1_CUDA(cudaMemcpy(r->w[i], r->dw[i], 4 * (size_t)r->numel[i], cudaMemcpyDeviceToHost));
        ck_assert_msg(optim_gpu_download_state(r->og, err, sizeof err) == 0, "%s", err);
    } else {
        optim_scale_grads(r->t, r->n, s);
        norm = optim_clip_grad_norm(r->t, r->n, max_norm);
        ck_assert_msg(optim_step(&r->o, 1.0, err, sizeof err) == 0, "%s", err);
    }
    return norm;
}

/* the bf16 copies on the device are bf16(w) exactly */
static void check_copies(struct orun *r, const char *what) {
    for (int i = 0; i < r->n; i++) {
        if (!r->t[i].trainable) continue;
        bf16 *c = malloc(2 * (size_t)r->numel[i]);
        K1_CUDA(cudaMemcpy(c, r->dcopy[i], 2 * (size_t)r->numel[i], cudaMemcpyDeviceToHost));
        for (int64_t e = 0; e < r->numel[i]; e++)
            ck_assert_msg(c[e] == float_to_bf16(r->w[i][e]), "%s: %s copy[%lld] = 0x%04x, bf16(w) = 0x%04x", what,
                          r->t[i].name, (long long)e, c[e], float_to_bf16(r->w[i][e]));
        free(c);
    }
}

static double maxdiff(const float *a, const float *b, int64_t n) { return k1_max_abs_diff(a, b, (size_t)n); }

START_TEST(muon_batched_matches_cpu) {
    struct orun ref, emu, gb, gm;
    orun_init(&ref, muon_table, NT, OPTIM_MUON_ADAMW, 0, 0, 0, 0);
    orun_init(&emu, muon_table, NT, OPTIM_MUON_ADAMW, 1, 0, 0, 0);
    orun_init(&gb, muon_table, NT, OPTIM_MUON_ADAMW, 1, 1, 1, 0);
    orun_init(&gm, muon_table, NT, OPTIM_MUON_ADAMW, 1, 1, 0, 0);
    struct orun gs;   /* batched, the symmetric Newton–Schulz products (64 and 96 blocks; 8x24 keeps the full ones) */
    orun_init(&gs, muon_table, NT, OPTIM_MUON_ADAMW, 1, 1, 1, 0);
    optim_gpu_set_ns_symmetric(gs.og, 1);
    /* the groups: 64x128 x3, 128x64 x2, 96x96, 8x24 x2 -> 4 shape batches, 8 matrices */
    ck_assert_int_eq(optim_gpu_muon_batches(gb.og), 4);
    ck_assert_int_eq(optim_gpu_muon_batches(gm.og), 8);
    float *frozen0 = malloc(4 * 32 * 32);
    memcpy(frozen0, gb.w[7], 4 * 32 * 32);
    int ok = 1;
    for (int s = 0; s < 3; s++) {
        double nr = orun_step(&ref, s, 1.0f, 0.5f, 1.0), ne = orun_step(&emu, s, 1.0f, 0.5f, 1.0);
        double nb = orun_step(&gb, s, 1.0f, 0.5f, 1.0), nm = orun_step(&gm, s, 1.0f, 0.5f, 1.0);
        (void)orun_step(&gs, s, 1.0f, 0.5f, 1.0);
        fprintf(stderr, "step %d: grad norm cpu %.12g gpu batched %.12g per-matrix %.12g\n", s, nr, nb, nm);
        ck_assert_msg(nr == ne, "the two CPU runs' norms differ");
        ck_assert_msg(nb == nm, "two identical GPU norms differ: %.17g vs %.17g", nb, nm);
        ck_assert_msg(fabs(nb - nr) <= 1e-12 * nr, "GPU norm %.17g, CPU %.17g", nb, nr);
        ck_assert_msg(nr > 2.0, "the clip is not active (norm %g)", nr);
        for (int i = 0; i < NT; i++) {
            const char *nm_ = muon_table[i].name;
            if (!muon_table[i].trainable) {
                ck_assert_msg(!memcmp(gb.w[i], frozen0, 4 * 32 * 32), "the frozen tensor moved");
                continue;
            }
            if (!muon_table[i].is_matrix) {   /* AdamW: the same launch on both GPU paths */
                ck_assert_msg(!memcmp(gb.w[i], gm.w[i], 4 * (size_t)gb.numel[i]), "%s: AdamW differs between paths", nm_);
                ck_assert(test_allclose(nm_, gb.w[i], emu.w[i], (size_t)gb.numel[i], 1e-7, 1e-6));
                continue;
            }
            /* momentum: elementwise, bitwise equal on both GPU paths, FMA-close to the CPU */
            ck_assert_msg(!memcmp(gb.o.mom[i], gm.o.mom[i], 4 * (size_t)gb.numel[i]), "%s: momentum differs", nm_);
            ck_assert(test_allclose("momentum", gb.o.mom[i], emu.o.mom[i], (size_t)gb.numel[i], 1e-7, 1e-5));
            double eb = maxdiff(gb.w[i], ref.w[i], gb.numel[i]), em = maxdiff(gm.w[i], ref.w[i], gb.numel[i]);
            double ee = maxdiff(emu.w[i], ref.w[i], gb.numel[i]), ebm = maxdiff(gb.w[i], gm.w[i], gb.numel[i]);
            double es = maxdiff(gs.w[i], ref.w[i], gb.numel[i]);
            int good = eb <= 2 * ee && em <= 2 * ee && ebm <= 2 * ee && es <= 2 * ee && ee > 0;
            fprintf(stderr, "step %d %-4s max err vs fp32: batched %.3e, per-matrix %.3e, symmetric %.3e, bf16 "
                    "emulation %.3e; batched vs per-matrix %.3e%s%s\n", s, nm_, eb, em, es, ee, ebm,
                    ebm == 0 ? " (bitwise)" : "", good ? "" : "  FAIL");
            ok &= good;
        }
        check_copies(&gb, "batched");
        check_copies(&gm, "per-matrix");
        check_copies(&gs, "symmetric");
    }
    ck_assert_msg(ok, "a Muon matrix exceeds the rule (2x the bf16 emulation's error) above");
    ck_assert_int_eq(gb.o.muon_step, 3);
    ck_assert_int_eq(gb.o.adamw_step, 3);
    /* FLOPs of the table: 5 x (4 m^2 n + 2 m^3) per matrix */
    double fl = 0;
    int64_t mn[8][2] = {{64, 128}, {64, 128}, {64, 128}, {64, 128}, {64, 128}, {96, 96}, {8, 24}, {8, 24}};
    for (int k = 0; k < 8; k++) fl += 5 * (4.0 * mn[k][0] * mn[k][0] * mn[k][1] + 2.0 * mn[k][0] * mn[k][0] * mn[k][0]);
    ck_assert_double_eq(optim_gpu_muon_flops(gb.og), fl);
    free(frozen0);
    orun_free(&ref, 0);
    orun_free(&emu, 0);
    orun_free(&gb, 0);
    orun_free(&gm, 0);
    orun_free(&gs, 0);
}
END_TEST

/* og_sym_mirror_batched against og_sym_mirror_ref, bitwise, on 3 matrices of m = 2, 66 (a partial 32-tile) and 96 with
 * a stride past m*m; the lower and diagonal blocks and the gap between matrices are untouched. */
START_TEST(sym_mirror_matches_ref) {
    const int ms[3] = {2, 66, 96};
    for (int k = 0; k < 3; k++) {
        int m = ms[k], nb = 3;
        long long stride = (long long)m * m + 8;
        size_t n = (size_t)stride * nb;
        bf16 *h = malloc(2 * n), *want = malloc(2 * n), *got = malloc(2 * n);
        uint64_t rng = 77 + (uint64_t)m;
        for (size_t i = 0; i < n; i++) h[i] = float_to_bf16(test_rng_uniform(&rng, -1.0f, 1.0f));
        memcpy(want, h, 2 * n);
        og_sym_mirror_ref(want, m, nb, stride);
        bf16 *d = k1_malloc(2 * n);
        K1_CUDA(cudaMemcpy(d, h, 2 * n, cudaMemcpyHostToDevice));
        K1_LAUNCH(og_sym_mirror_batched(d, m, nb, stride, 0));
        K1_CUDA(cudaMemcpy(got, d, 2 * n, cudaMemcpyDeviceToHost));
        ck_assert_msg(memcmp(got, want, 2 * n) == 0, "m %d: the mirrored matrices differ from the reference", m);
        ck_assert_msg(memcmp(got, h, 2 * n) != 0, "m %d: nothing was mirrored", m);
        cudaFree(d);
        free(h); free(want); free(got);
    }
    ck_assert_int_eq(og_sym_mirror_batched(NULL, 3, 1, 9, 0), -1);   /* odd m refused */
}
END_TEST

/* AdamW for every tensor (kind OPTIM_ADAMW) as one multi-tensor launch against adamw_step_ref (through the CPU
 * optimizer): sizes of 1, a tail, exactly one chunk, several chunks with a tail, a matrix; the 3-chunk tensor misaligned (the
 * scalar path); clip active and a grad scale of 1/4. */
static const struct spec adamw_table[] = {
    {"x.0", 1, 1, 1, 1, 0},          {"x.1", 1, 97, 1, 1, 0},   {"x.2", 1, 1025, 1, 1, 0},
    {"x.3", 1, ADAMW_CHUNK, 1, 1, 0}, {"x.4", 1, 2 * ADAMW_CHUNK + 5, 1, 1, 0}, {"m.0", 2, 64, 40, 1, 1},
    {"f.0", 2, 16, 16, 0, 1},
};

static void adamw_case(int misalign) {
    const int n = (int)(sizeof adamw_table / sizeof adamw_table[0]);
    struct orun c, g;
    orun_init(&c, adamw_table, n, OPTIM_ADAMW, 1, 0, 1, 0);
    orun_init(&g, adamw_table, n, OPTIM_ADAMW, 1, 1, 1, misalign);
    for (int s = 0; s < 3; s++) {
        double nc = orun_step(&c, s, 0.5f, 0.25f, 1.0), ng = orun_step(&g, s, 0.5f, 0.25f, 1.0);
        ck_assert_msg(fabs(nc - ng) <= 1e-12 * nc, "norm cpu %.17g gpu %.17g", nc, ng);
        ck_assert_msg(nc > 2.0, "the clip is not active (norm %g)", nc);
        for (int i = 0; i < n; i++) {
            if (!adamw_table[i].trainable) continue;
            char what[64];
            snprintf(what, sizeof what, "step %d %s master", s, adamw_table[i].name);
            ck_assert(test_allclose(what, g.w[i], c.w[i], (size_t)c.numel[i], 1e-7, 1e-6));
            /* test_adamw.c's bounds: m can cancel (absolute 4 ulp of the operands), v relative */
            ck_assert(test_allclose("m", g.o.m[i], c.o.m[i], (size_t)c.numel[i], 4e-9, 1e-6));
            ck_assert(test_allclose("v", g.o.v[i], c.o.v[i], (size_t)c.numel[i], 1e-12, 1e-6));
        }
        check_copies(&g, misalign ? "adamw (misaligned)" : "adamw");
    }
    ck_assert_int_eq(g.o.adamw_step, 3);
    ck_assert_int_eq(g.o.muon_step, 0);
    orun_free(&c, 0);
    orun_free(&g, misalign);
}

START_TEST(adamw_multi_matches_ref) { adamw_case(0); }
END_TEST

START_TEST(adamw_multi_misaligned_matches_ref) { adamw_case(1); }
END_TEST

/* The one-launch norm (og_grad_sumsq_multi) against the per-tensor launches it replaced (og_scale + og_sumsq_f32),
 * bit for bit, on tensors from 1 element to more than 256·OG_PARTIALS. */
START_TEST(grad_norm_multi_bitwise) {
    const size_t sizes[] = {1, 300, 65536 + 17, 256 * OG_PARTIALS * 3 + 5, 4096};
    const int nt = 5;
    float *d1[5], *d2[5];
    og_vec tab[5];
    uint64_t rng = 77;
    for (int i = 0; i < nt; i++) {
        float *h = k1_randn(&rng, sizes[i], -3, 3);
        d1[i] = k1_upload(h, 4 * sizes[i]);
        d2[i] = k1_upload(h, 4 * sizes[i]);
        tab[i] = (og_vec){d1[i], sizes[i]};
        free(h);
    }
    og_vec *dtab = k1_upload(tab, sizeof tab);
    double *part = k1_malloc(8 * OG_PARTIALS * nt), *out = k1_malloc(16);
    K1_LAUNCH(og_grad_sumsq_multi(dtab, nt, 0.375f, part, out, NULL, 0));
    for (int i = 0; i < nt; i++) {
        K1_LAUNCH(og_scale(d2[i], sizes[i], 0.375f, 0));
        K1_LAUNCH(og_sumsq_f32(d2[i], sizes[i], part, out + 1, NULL, i > 0, 0));
    }
    double h[2];
    K1_CUDA(cudaMemcpy(h, out, 16, cudaMemcpyDeviceToHost));
    fprintf(stderr, "sumsq multi %.17g, per tensor %.17g\n", h[0], h[1]);
    ck_assert_msg(h[0] == h[1], "multi %.17g, per tensor %.17g", h[0], h[1]);
    for (int i = 0; i < nt; i++) {
        float *a = malloc(4 * sizes[i]), *b = malloc(4 * sizes[i]);
        K1_CUDA(cudaMemcpy(a, d1[i], 4 * sizes[i], cudaMemcpyDeviceToHost));
        K1_CUDA(cudaMemcpy(b, d2[i], 4 * sizes[i], cudaMemcpyDeviceToHost));
        ck_assert_msg(!memcmp(a, b, 4 * sizes[i]), "the scaled gradient %d differs", i);
        free(a), free(b);
        cudaFree(d1[i]), cudaFree(d2[i]);
    }
    cudaFree(dtab), cudaFree(part), cudaFree(out);
}
END_TEST

int main(void) {
    Suite *s = suite_create("optim_gpu");
    TCase *tc = tcase_create("optim_gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, muon_batched_matches_cpu);
    tcase_add_test(tc, sym_mirror_matches_ref);
    tcase_add_test(tc, adamw_multi_matches_ref);
    tcase_add_test(tc, adamw_multi_misaligned_matches_ref);
    tcase_add_test(tc, grad_norm_multi_bitwise);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
