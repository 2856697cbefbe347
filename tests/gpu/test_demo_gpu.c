/*
 * tests/gpu/test_demo_gpu.c — `make run` on the GPU machine (issue 27 item 0): pipelines/demo.sh with its
 * defaults (300 steps on the tiny learnable target, head dim 16) on --device cuda:0, then on --device cpu, in
 * temporary run directories. The GPU run must finish (exit 0, DONE, state/train.json at step 300, both exports
 * passed by the checker), its τ must rise as the CPU run's does (above 1.5 at step 300) and lie within ±0.05 of
 * the CPU run's τ at step 300 (the bound: the bf16 GPU path and the fp32 CPU path train the same
 * drafter on the same batches), with the drafter's proposal KV-cached on both (on the GPU through
 * DFLASH_GPU_DRAFTER_CACHE=1 until that path is validated). Nothing of either run may be left. The demo's tiny model has head dim 16: the
 * GPU attention of the target (kernels/attention_mma.cu) and of the drafter (kernels/block_attn_simt.cu) run
 * it. Runs on the GPU machine (scripts/gpu-run.sh; DFLASH_BIN names the CUDA build's bin/, pipelines/ sits two
 * levels above it). About a minute (CPU run ~25 s on 2 cores).
 */
#include "tests/test_e2e_util.h"

static double tau_at(const char *run, const char *name) {
    char path[900], text[8192];
    snprintf(path, sizeof path, "%s/eval/%s.json", run, name);
    e2e_slurp(path, text, sizeof text);
    const char *p = strstr(text, "\"tau\":");
    ck_assert_msg(p != NULL, "%s: no tau", path);
    return strtod(p + 6, NULL);
}

/* demo.sh --device DEV into a fresh run directory: checks it finished; returns τ at step 300 */
static double demo_on(const char *dev, const char *tag) {
    char run[600], out[700], path[900], text[8192], tail[4096];
    snprintf(run, sizeof run, "%s/demo", test_tmpdir(tag));
    snprintf(out, sizeof out, "%s.out", run);
    const char *argv[] = {"bash", e2e_script("demo.sh"), "--run", run, "--device", dev, NULL};
    double t0 = tr_now();
    int rc = e2e_wait(e2e_start(out, NULL, NULL, NULL, argv), 280, out, tag);
    double dt = tr_now() - t0;
    e2e_tail(out, tail, sizeof tail);
    ck_assert_msg(rc == 0, "demo on %s exited %d:\n%s", dev, rc, tail);
    snprintf(path, sizeof path, "%s/DONE", run);
    ck_assert_msg(access(path, F_OK) == 0, "demo on %s: no DONE", dev);
    snprintf(path, sizeof path, "%s/state/train.json", run);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "\"step\": 300"), "%s: %s", path, text);
    snprintf(path, sizeof path, "%s/summary.txt", run);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "export/zlab --check          ok") && strstr(text, "export/speculators --check   ok"),
                  "demo on %s: exports not passed by the checker:\n%s", dev, text);
    const double t50 = tau_at(run, "tau-step-50"), t300 = tau_at(run, "tau-step-300");
    /* the drafter's proposal ran KV-cached on both devices (on the GPU: DFLASH_GPU_DRAFTER_CACHE=1, set below) */
    snprintf(path, sizeof path, "%s/eval/tau-step-300.json", run);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "\"drafter_cache\": true") || strstr(text, "\"drafter_cache\":true"),
                  "demo on %s: the drafter's proposal was not cached: %s", dev, text);
    fprintf(stderr, "test_demo_gpu: demo.sh --device %s in %.1f s: tau %.3f (step 50) -> %.3f (step 300)\n", dev, dt,
            t50, t300);
    e2e_nothing_left(run, tag);
    return t300;
}

START_TEST(demo_runs_on_the_gpu) {
    /* the GPU drafter's cached proposal (export/drafter_cache.h) is validated here: τ within the bound with it */
    ck_assert_int_eq(setenv("DFLASH_GPU_DRAFTER_CACHE", "1", 1), 0);
    const double tg = demo_on("cuda:0", "demo-gpu");
    const double tc = demo_on("cpu", "demo-cpu");
    ck_assert_msg(tg > 1.5, "GPU run: tau at step 300 %.3f, expected > 1.5 (it rises on the CPU)", tg);
    ck_assert_msg(fabs(tg - tc) <= 0.05, "tau at step 300: GPU %.3f vs CPU %.3f, expected within 0.05", tg, tc);
}
END_TEST

int main(void) {
    Suite *s = suite_create("gpu_demo");
    TCase *tc = tcase_create("gpu_demo");
    tcase_set_timeout(tc, 290);
    tcase_add_test(tc, demo_runs_on_the_gpu);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
