/*
 * tests/gpu/test_target_qwen35_gpu.c — the Qwen3.5 / Qwen3.6 hybrid target forward on the GPU (bf16)
 * against the CPU path (fp32) on the same files (issue 27 item 4), and its documents independent
 * bitwise. Runs on the GPU machine; CUDA is initialised inside each test, never in main.
 *
 * Models (dflash-mkmodel, bf16 on disk, so both paths read bit-identical weights and the difference
 * is activation precision alone): the qwen3.5-tiny preset ([linear, full, linear, full], head dim 16,
 * DeltaNet key/value dims 8/12) and a mid-size hybrid ([linear ×3, full], hidden 256, gated
 * attention at head dim 256 with rotary 64, DeltaNet 4 key / 8 value heads of 128: the 27B's head
 * shapes). Matrix std 0.15 and embedding std 1 so every layer moves the residual stream by O(1).
 * The batch packs documents of 1, 63, 64, 65 and 1000 tokens (DeltaNet chunk boundaries inside
 * documents and at their starts; positions reset).
 *
 * Tolerance: relative L2 per captured tensor <= 3e-2, and style.md's 2x rule against a baseline: the
 * CPU forward rounded to bf16 where the GPU stores bf16 (target_options.cpu_bf16_points: the residual
 * stream, norm outputs, the projections read by the conv, gates and z, q/k/v/gate, the attention and
 * gated-norm outputs, the MLP's points; the recurrence itself is fp32). The GPU's max abs error and
 * worst token against fp32 must be at most 2x the baseline's.
 *
 * The gated attention calls kernels/attention.h at head dim 16 and 256; until the GPU attention
 * takes those head dims, these tests fail at that call with its message (the kernels of the
 * DeltaNet are tested on their own in test_gdn_kernels).
 */
#include "model/target.h"
#include "../test_ring_util.h"

#include <cuda_runtime_api.h>

static void make_model(const char *dir, int mid, char *model, size_t len) {
    snprintf(model, len, "%s/model", dir);
    char log[700];
    snprintf(log, sizeof log, "%s/mkmodel.out", dir);
    const char *argv[80] = {test_bin("dflash-mkmodel"), "--out", model, "--preset", "qwen3.5-tiny", "--dtype", "bf16",
                            "--std", "0.15", "--embed-std", "1.0", "--seed", "9", "--threads", "4"};
    int n = 0;
    while (argv[n]) n++;
    if (mid) {
        const char *more[] = {"--hidden", "256", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "256",
                              "--rotary-dim", "64", "--intermediate", "512", "--vocab", "1000", "--lin-k-heads", "4",
                              "--lin-v-heads", "8", "--lin-k-dim", "128", "--lin-v-dim", "128", "--conv-kernel", "4",
                              "--full-every", "4"};
        for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) argv[n++] = more[i];
    }
    argv[n] = NULL;
    ck_assert_msg(tr_wait(test_spawn_log(log, argv)) == 0, "dflash-mkmodel failed; see %s", log);
}

static struct target *load(const char *model, int dev, int max_tokens, int bf16_points) {
    struct target_options o;
    target_options_defaults(&o);
    o.cuda_device = dev;
    o.max_tokens = max_tokens;
    o.cpu_bf16_points = bf16_points;
    o.n_capture = 3;
    o.capture[0] = 2; o.capture[1] = 0; o.capture[2] = 1;
    char err[512];
    struct target *t = target_load(model, &o, err, sizeof err);
    ck_assert_msg(t != NULL, "target_load(%s): %s", dev < 0 ? "cpu" : "gpu", err);
    return t;
}

struct errs { double rel, max_abs, worst_row; size_t worst_t; };

/* got against the fp32 reference: relative L2, max abs error, the worst row's (token's) relative L2 */
static struct errs errs_of(const float *got, const float *ref, size_t n, int C) {
    struct errs e = {0, 0, -1, 0};
    double se = 0, sr = 0;
    for (size_t t = 0; t < n / (size_t)C; t++) {
        double rse = 0, rsr = 0;
        for (size_t i = t * C; i < (t + 1) * C; i++) {
            double d = (double)got[i] - ref[i];
            rse += d * d;
            rsr += (double)ref[i] * ref[i];
            if (fabs(d) > e.max_abs || isnan(d)) e.max_abs = isnan(d) ? NAN : fabs(d);
        }
        se += rse;
        sr += rsr;
        double r = sqrt(rse / (rsr + 1e-30));
        if (r > e.worst_row || isnan(r)) e.worst_row = r, e.worst_t = t;
    }
    e.rel = sqrt(se / (sr + 1e-30));
    return e;
}

/* style.md's rule where bf16 rounding makes a fixed element bound meaningless: the GPU's max abs error and worst
 * row against fp32 at most 2x those of the CPU forward rounded at the GPU's bf16 points (bl), and relative L2
 * <= 3e-2. A fixed per-element bound failed on single tokens whose DeltaNet head outputs are small (the gated
 * norm scales bf16 rounding up): the bf16-point CPU forward shows the same rows (mid token 66: 0.061 / 0.072). */
static int bf16_close(const char *what, const float *got, const float *bl, const float *ref, size_t n, int C) {
    struct errs g = errs_of(got, ref, n, C), b = errs_of(bl, ref, n, C);
    fprintf(stderr, "%s: GPU relative L2 %.3g, max abs %.3g, worst token %zu (row %.3g); bf16-point CPU: relative L2 "
            "%.3g, max abs %.3g, worst token %zu (row %.3g)\n", what, g.rel, g.max_abs, g.worst_t, g.worst_row, b.rel,
            b.max_abs, b.worst_t, b.worst_row);
    int ok = g.rel <= 3e-2 && g.max_abs <= 2 * b.max_abs && g.worst_row <= 2 * b.worst_row;   /* NaN fails */
    if (!ok) fprintf(stderr, "%s: beyond the bound (relative L2 <= 3e-2, max abs and worst row <= 2x the baseline's)\n",
                     what);
    return ok;
}

static const int doc_len[5] = {1, 63, 64, 65, 1000};

static void gpu_vs_cpu(int mid) {
    const char *dir = test_tmpdir(mid ? "tq35-mid" : "tq35-tiny");
    char model[700];
    make_model(dir, mid, model, sizeof model);
    int T = 0, nd = 5;
    for (int d = 0; d < nd; d++) T += doc_len[d];
    struct target *cpu = load(model, -1, T, 0), *cpu_bf = load(model, -1, T, 1), *gpu = load(model, 0, 2048, 0);
    const struct model_config *c = target_config(cpu);
    int C = c->hidden_size, k = 3;
    int32_t *ids = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4), cu[6] = {0};
    uint64_t s = 77;
    for (int d = 0, t = 0; d < nd; d++) {
        for (int i = 0; i < doc_len[d]; i++, t++) { ids[t] = (int32_t)(test_rng_next(&s) % (uint64_t)c->vocab_size); pos[t] = i; }
        cu[d + 1] = cu[d] + doc_len[d];
    }
    struct target_batch b = {3, T, nd, ids, pos, cu};
    size_t plane = (size_t)T * C, all = (size_t)(k + 1) * plane;
    float *st = malloc(all * sizeof(float)), *gf = malloc(all * sizeof(float)), *sb = malloc(all * sizeof(float));
    bf16 *gh = malloc(all * 2), *gh2 = malloc(all * 2), *d_out;
    char err[512];
    ck_assert_msg(target_forward(cpu, &b, st, st + k * plane, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(target_forward(cpu_bf, &b, sb, sb + k * plane, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(cudaMalloc((void **)&d_out, all * 2), cudaSuccess);
    ck_assert_int_eq(cudaMemset(d_out, 0xff, all * 2), cudaSuccess);   /* poison: NaN */
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_msg(target_forward(gpu, &b, d_out, d_out + k * plane, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(cudaMemcpy(gh, d_out, all * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    floats_from_bf16(gf, gh, all);
    int ok = 1;
    for (int j = 0; j <= k; j++) {
        char what[64];
        snprintf(what, sizeof what, "%s %s", mid ? "mid" : "tiny",
                 j < k ? (j == 0 ? "layer 2" : j == 1 ? "layer 0" : "layer 1") : "last");
        ok &= bf16_close(what, gf + j * plane, sb + j * plane, st + j * plane, plane, C);
    }
    ck_assert_msg(ok, "GPU hybrid forward differs from the CPU forward beyond bf16 tolerance");
    /* documents independent, bitwise: new tokens in document 3 (same length, so every GEMM runs the
     * same algorithm) leave every other document's rows of every output unchanged */
    for (int t = cu[3]; t < cu[4]; t++) ids[t] = (ids[t] * 31 + 7) % c->vocab_size;
    ck_assert_msg(target_forward(gpu, &b, d_out, d_out + k * plane, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(cudaMemcpy(gh2, d_out, all * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int changed = 0;
    for (int j = 0; j <= k; j++)
        for (int d = 0; d < nd; d++) {
            size_t off = (size_t)j * plane + (size_t)cu[d] * C, n = (size_t)doc_len[d] * C;
            int same = memcmp(gh + off, gh2 + off, n * 2) == 0;
            if (d == 3) changed |= !same;
            else ck_assert_msg(same, "%s: output %d, document %d changed when only document 3 did", mid ? "mid" : "tiny",
                               j, d);
        }
    ck_assert_msg(changed, "document 3's new tokens changed nothing");
    cudaFree(d_out);
    free(ids); free(pos); free(st); free(sb); free(gf); free(gh); free(gh2);
    target_free(cpu);
    target_free(cpu_bf);
    target_free(gpu);
}

START_TEST(qwen35_tiny_gpu_matches_cpu) { gpu_vs_cpu(0); }
END_TEST

START_TEST(qwen35_mid_gpu_matches_cpu) { gpu_vs_cpu(1); }
END_TEST

/* Seeded random weights generated on the device (the benchmark's path) at the 27B's head shapes:
 * the allocation equals target_plan_bytes (the memory plan), the forward runs and every captured
 * state is finite. */
START_TEST(qwen35_random_init_on_gpu) {
    struct model_config c;
    char err[512];
    memset(&c, 0, sizeof c);
    c.arch = HF_ARCH_QWEN3_5;
    snprintf(c.architecture, sizeof c.architecture, "Qwen3_5ForCausalLM");
    c.vocab_size = 1000; c.hidden_size = 256; c.intermediate_size = 512; c.num_hidden_layers = 4;
    c.num_attention_heads = 4; c.num_key_value_heads = 2; c.head_dim = 256; c.rotary_dim = 64; c.qk_norm = 1;
    c.rms_norm_eps = 1e-6; c.rope_theta = 1e7; c.linear_conv_kernel_dim = 4; c.linear_key_head_dim = 128;
    c.linear_value_head_dim = 128; c.linear_num_key_heads = 4; c.linear_num_value_heads = 8;
    for (int l = 0; l < 4; l++) c.layer_linear[l] = (l + 1) % 4 != 0;
    struct target_options o;
    target_options_defaults(&o);
    o.cuda_device = 0;
    o.max_tokens = 512;
    struct target *t = target_init_random(&c, &o, 5, 0.05f, err, sizeof err);
    ck_assert_msg(t != NULL, "%s", err);
    /* the memory plan's target line is exactly what the GPU path allocated */
    size_t pw = 0, pk = 0;
    target_plan_bytes(&c, 512, 1, &pw, &pk);
    ck_assert_msg(pw == target_weight_bytes(t) && pk == target_work_bytes(t), "planned %zu + %zu bytes, allocated "
                  "%zu + %zu", pw, pk, target_weight_bytes(t), target_work_bytes(t));
    int32_t ids[512], pos[512], cu[3] = {0, 100, 512};
    for (int i = 0; i < 512; i++) { ids[i] = (i * 37) % 1000; pos[i] = i < 100 ? i : i - 100; }
    struct target_batch b = {1, 512, 2, ids, pos, cu};
    size_t plane = (size_t)512 * 256;
    bf16 *d_out, *h = malloc(plane * 2 * 5);
    ck_assert_int_eq(cudaMalloc((void **)&d_out, plane * 2 * 5), cudaSuccess);
    ck_assert_msg(target_forward(t, &b, d_out, NULL, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(cudaMemcpy(h, d_out, plane * 2 * 5, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < plane * 5; i++) ck_assert_msg(isfinite(bf16_to_float(h[i])), "state %zu not finite", i);
    cudaFree(d_out);
    free(h);
    target_free(t);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_target_qwen35");
    TCase *tc = tcase_create("gpu_target_qwen35");
    tcase_set_timeout(tc, 400);
    tcase_add_test(tc, qwen35_tiny_gpu_matches_cpu);
    tcase_add_test(tc, qwen35_mid_gpu_matches_cpu);
    tcase_add_test(tc, qwen35_random_init_on_gpu);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
