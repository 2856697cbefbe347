/*
 * tests/gpu/test_train_tau_gpu.c — a quality test of the GPU trainer that can fail on a real bug (issue 28 item 8):
 * the drafter trained on the GPU drafts and learns as well as the one trained on the CPU from the same batches.
 *
 * pipelines/demo.sh on a tiny learnable target whose head dim the GPU kernels take (MODEL_SHAPE: the demo's
 * dflash-mkmodel tiny, hidden 64, MLP 128, vocab 512, with one head of 64 instead of 4 of 16; the demo's learnable
 * init and its sampled dataset), 300 AdamW steps (the demo's recipe), for 3 trainer seeds, each twice: every stage
 * on the CPU, and the same with the trainer alone on cuda:0 (TRAIN_DEVICE; target, packer and hspack stay on the
 * CPU, so both trainers of a seed read the same fp32 features batch for batch from the same initial weights). The
 * six runs go at once. Then, per run: τ of the step-300 checkpoint on 200 held-out prompts sampled from the target
 * (dflash-eval, CPU), and the mean training loss over steps 200-299 (metrics.jsonl).
 *
 * Why 3 seeds, 200 prompts and paired means (measured on the CPU machine, 2026-12-03, CPU trainer): the one-seed,
 * 12-prompt comparison this replaces (±0.05) sat below the noise floor. The same code and seed on another CPU
 * (OpenBLAS rounding) gave τ 1.684 and 1.615; trainer seeds 42 / 7 / 1234 give τ(200 prompts) 1.699 / 1.907 / 1.943
 * and loss 1.921 / 1.757 / 1.747; at seed 42, feature noise of 1e-6 and 3e-6 (rounding-sized) moves τ to 1.719 /
 * 1.734 and the loss to 1.922 / 1.907. So the pairs share a seed, and the bounds are: the mean paired τ difference
 * within TAU_MEAN_TOL, each pair within TAU_PAIR_TOL, the mean paired loss difference within LOSS_REL_TOL relative,
 * and every run at least 0.3 above the untrained drafter's τ. A GPU trainer with a wrong gradient or update
 * misses these by far (the untrained τ is 1.0); the measured differences are printed so the bounds can be tightened.
 * Runs from the repository root on the GPU machine (scripts/gpu-run.sh sets DFLASH_BIN); the test process never
 * initialises CUDA. Run directories under /tmp (kept on failure: the logs name the cause).
 */
#include "tests/testutil.h"

#include <fcntl.h>
#include <limits.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define MODEL_SHAPE "--heads 1 --kv-heads 1 --head-dim 64"
/* τ of the untrained drafter on this target and prompts (demo.sh --steps 1 -- --lr 0 --ckpt-every 1, CPU):
 * 1.000, measured on the CPU machine, 2026-12-03 */
#define TAU_UNTRAINED 1.0
#define TAU_MEAN_TOL 0.05   /* mean over seeds of τ(GPU) - τ(CPU): the issue's ±0.05, now on a mean of pairs */
#define TAU_PAIR_TOL 0.2    /* any one seed */
#define LOSS_REL_TOL 0.05   /* mean over seeds of the steps-200..299 loss, relative */
#define N_SEEDS 3
#ifndef TAU_GPU_DEVICE
#define TAU_GPU_DEVICE "cuda:0"   /* -DTAU_GPU_DEVICE='"cpu"' checks the test's mechanics on a CPU machine (pairs equal) */
#endif
static const char *const seeds[N_SEEDS] = {"42", "7", "1234"};

static const char *demo_script(void) {
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "pipelines/demo.sh");
    if (access(path, R_OK) == 0) return path;
    const char *bin = getenv("DFLASH_BIN");   /* build/gpu/bin: the tree is three levels up */
    snprintf(path, sizeof path, "%s/../../../pipelines/demo.sh", bin ? bin : "build/bin");
    return path;
}

/* Start demo.sh --run RUN --fresh with the given trainer device and steps, extra trainer flags after "--" (output in
 * RUN.log); the child's pid. */
static pid_t start_demo(const char *run, const char *train_device, const char *steps, const char *const extra[]) {
    char log[PATH_MAX];
    snprintf(log, sizeof log, "%s.log", run);
    pid_t pid = fork();
    if (pid != 0) return pid;
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
    setenv("DEVICE", "cpu", 1);
    setenv("TRAIN_DEVICE", train_device, 1);
    setenv("MODEL_SHAPE", MODEL_SHAPE, 1);
    setenv("STEPS", steps, 1);
    setenv("DEMO_EVAL", "0", 1);   /* the test measures τ itself, on more prompts */
    const char *argv[32] = {"bash", demo_script(), "--run", run, "--fresh", "--steps", steps, "--"};
    int n = 8;
    for (int i = 0; extra[i] && n < 31; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    execvp("bash", (char *const *)argv);
    _exit(127);
}

/* Wait for a start_demo child; its exit status (the end of RUN.log printed when it is not 0). */
static int wait_demo(pid_t pid, const char *run) {
    if (pid < 0) return -1;
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (rc != 0) {
        char log[PATH_MAX], tail[4096];
        snprintf(log, sizeof log, "%s.log", run);
        FILE *f = fopen(log, "r");
        size_t got = 0;
        if (f) {
            fseek(f, 0, SEEK_END);
            long sz = ftell(f);
            fseek(f, sz > (long)sizeof tail - 1 ? sz - (long)sizeof tail + 1 : 0, SEEK_SET);
            got = fread(tail, 1, sizeof tail - 1, f);
            fclose(f);
        }
        tail[got] = 0;
        fprintf(stderr, "demo.sh --run %s exited %d; the end of its log:\n%s\n", run, rc, tail);
    }
    return rc;
}

static double json_num(const char *line, const char *key) {
    const char *p = strstr(line, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}

/* mean training loss of RUN over steps [from, to) from RUN/metrics.jsonl (the trainer's metric records); NAN when
 * a step is missing */
static double mean_loss(const char *run, int from, int to) {
    char path[PATH_MAX], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    double sum = 0;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"kind\":\"metric\"") || !strstr(line, "\"stage\":\"dflash-train\"")) continue;
        double step = json_num(line, "\"step\":"), loss = json_num(line, "\"loss\":");
        if (step >= from && step < to && isfinite(loss)) { sum += loss; n++; }
    }
    fclose(f);
    return n == to - from ? sum / n : NAN;
}

/* run a command (argv), output appended to LOG; its exit status */
static int run_cmd(const char *log, const char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) { dup2(fd, 1); dup2(fd, 2); close(fd); }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* τ of RUN's step-300 checkpoint on PROMPTS (dflash-eval --out RUN/tau-big.json); NAN on failure */
static double tau_of(const char *run, const char *prompts) {
    char bin[PATH_MAX], model[PATH_MAX], ckpt[PATH_MAX], out[PATH_MAX], log[PATH_MAX], buf[8192];
    snprintf(bin, sizeof bin, "%s", test_bin("dflash-eval"));
    snprintf(model, sizeof model, "%s/model", run);
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-300.ckpt", run);
    snprintf(out, sizeof out, "%s/tau-big.json", run);
    snprintf(log, sizeof log, "%s/tau-big.log", run);
    const char *argv[] = {bin, "--target-model", model, "--ckpt", ckpt, "--prompts", prompts, "--max-new", "24",
                          "--out", out, NULL};
    if (run_cmd(log, argv) != 0) { fprintf(stderr, "dflash-eval failed; see %s\n", log); return NAN; }
    FILE *f = fopen(out, "r");
    if (!f) return NAN;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strstr(buf, "\"tau\":");
    return p ? strtod(p + 6, NULL) : NAN;
}

START_TEST(tau_gpu_matches_cpu) {
    char base[] = "/tmp/dflash-tau-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(base));
    char runs[2][N_SEEDS][256];
    pid_t pids[2][N_SEEDS];
    for (int i = 0; i < N_SEEDS; i++)
        for (int g = 0; g < 2; g++) {
            snprintf(runs[g][i], sizeof runs[g][i], "%s/%s-%s", base, g ? "gpu" : "cpu", seeds[i]);
            const char *const extra[] = {"--ckpt-every", "300", "--seed", seeds[i], NULL};
            pids[g][i] = start_demo(runs[g][i], g ? TAU_GPU_DEVICE : "cpu", "300", extra);
        }
    int bad = 0;
    for (int i = 0; i < N_SEEDS; i++)
        for (int g = 0; g < 2; g++) bad |= wait_demo(pids[g][i], runs[g][i]) != 0;
    ck_assert_msg(!bad, "a demo.sh run failed; logs above");
    /* 200 held-out prompts sampled from the target (the same model in every run: the demo's fixed mkmodel seed) */
    char prompts[PATH_MAX], model[PATH_MAX], log[PATH_MAX], bin[PATH_MAX];
    snprintf(prompts, sizeof prompts, "%s/held-out-200.jsonl", base);
    snprintf(model, sizeof model, "%s/model", runs[0][0]);
    snprintf(log, sizeof log, "%s/sample.log", base);
    snprintf(bin, sizeof bin, "%s", test_bin("dflash-sample"));
    const char *sargv[] = {bin, "--target-model", model, "--out", prompts, "--samples", "200", "--prompt-len", "8",
                           "--gen-len", "24", "--temperature", "0.3", "--max-token", "500", "--seed", "77", NULL};
    ck_assert_msg(run_cmd(log, sargv) == 0, "dflash-sample failed; see %s", log);
    double tau[2][N_SEEDS], loss[2][N_SEEDS], dtau = 0, dloss = 0, worst = 0;
    for (int i = 0; i < N_SEEDS; i++) {
        for (int g = 0; g < 2; g++) {
            tau[g][i] = tau_of(runs[g][i], prompts);
            loss[g][i] = mean_loss(runs[g][i], 200, 300);
            ck_assert_msg(isfinite(tau[g][i]) && isfinite(loss[g][i]), "%s: tau %g, loss %g (missing; see its logs)",
                          runs[g][i], tau[g][i], loss[g][i]);
        }
        fprintf(stderr, "seed %s: tau CPU %.3f GPU %.3f (diff %+.3f); loss 200-299 CPU %.4f GPU %.4f (%+.2f%%)\n",
                seeds[i], tau[0][i], tau[1][i], tau[1][i] - tau[0][i], loss[0][i], loss[1][i],
                100 * (loss[1][i] - loss[0][i]) / loss[0][i]);
        dtau += (tau[1][i] - tau[0][i]) / N_SEEDS;
        dloss += (loss[1][i] - loss[0][i]) / loss[0][i] / N_SEEDS;
        if (fabs(tau[1][i] - tau[0][i]) > worst) worst = fabs(tau[1][i] - tau[0][i]);
    }
    fprintf(stderr, "mean paired tau difference %+.3f (allowed %.2f), worst pair %.3f (allowed %.2f), mean paired loss "
            "difference %+.2f%% (allowed %.0f%%); untrained tau %.3f\n", dtau, TAU_MEAN_TOL, worst, TAU_PAIR_TOL,
            100 * dloss, 100 * LOSS_REL_TOL, TAU_UNTRAINED);
    for (int i = 0; i < N_SEEDS; i++)
        ck_assert_msg(tau[0][i] >= TAU_UNTRAINED + 0.3 && tau[1][i] >= TAU_UNTRAINED + 0.3,
                      "seed %s not learned: tau CPU %.3f, GPU %.3f, untrained %.3f (need +0.3)", seeds[i], tau[0][i],
                      tau[1][i], TAU_UNTRAINED);
    ck_assert_msg(fabs(dtau) <= TAU_MEAN_TOL, "mean paired tau difference %.3f > %.2f", dtau, TAU_MEAN_TOL);
    ck_assert_msg(worst <= TAU_PAIR_TOL, "a seed's tau difference %.3f > %.2f", worst, TAU_PAIR_TOL);
    ck_assert_msg(fabs(dloss) <= LOSS_REL_TOL, "mean paired loss difference %.2f%% > %.0f%%", 100 * dloss,
                  100 * LOSS_REL_TOL);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);   /* kept on failure (an assert above returns first) */
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("train_tau_gpu");
    TCase *tc = tcase_create("train_tau_gpu");
    tcase_set_timeout(tc, 290);
    tcase_add_test(tc, tau_gpu_matches_cpu);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
