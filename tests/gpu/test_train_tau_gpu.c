/*
 * tests/gpu/test_train_tau_gpu.c — a quality test of the GPU trainer that can fail on a real bug (issue 28 item 8):
 * the drafter trained on the GPU drafts as well as the one trained on the CPU from the same batches.
 *
 * pipelines/demo.sh on a tiny learnable target whose head dim the GPU kernels take (MODEL_SHAPE: the demo's
 * dflash-mkmodel tiny, hidden 64, MLP 128, vocab 512, with one head of 64 instead of 4 of 16 (the drafter takes the
 * target's heads); the demo's learnable init and its sampled dataset), twice with the same seeds: every stage on
 * the CPU, and the same with the trainer alone on cuda:0 (TRAIN_DEVICE; the target, packer and hspack stay on the
 * CPU, so both trainers read the same fp32 features over host rings, batch for batch). 300 AdamW steps each (the demo's recipe), the two runs at once; τ on the 12
 * held-out prompts by dflash-eval (speculative decoding against the target, on the CPU) of the step-300
 * checkpoint. Passes when both runs exit 0, τ(GPU) is within ±0.05 of τ(CPU), and both are at least 0.3 above the
 * untrained drafter's τ (TAU_UNTRAINED, measured once on the CPU). Measured on the CPU machine (2026-12-03, every
 * stage on the CPU): τ 1.345 at step 150, 1.755 at step 300; a run takes ~2.5 min on 2 loaded cores. (Hidden 128
 * with 2 heads of 64 learned too slowly for the bound: 1.199 and 1.273.) Replaces test_train_gpu's 50-step loss
 * curve check, which compared single-batch losses that cross back and forth under bf16 (6.2% apart at step 43).
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

/* τ at `step` from RUN/eval/tau.dat ("step tau" lines); NAN when absent. */
static double tau_at(const char *run, int step) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/eval/tau.dat", run);
    FILE *f = fopen(path, "r");
    if (!f) return NAN;
    int s;
    double t, r = NAN;
    while (fscanf(f, "%d %lf", &s, &t) == 2)
        if (s == step) r = t;
    fclose(f);
    return r;
}

START_TEST(tau_gpu_matches_cpu) {
    char base[] = "/tmp/dflash-tau-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(base));
    char cpu[PATH_MAX], gpu[PATH_MAX];
    snprintf(cpu, sizeof cpu, "%s/cpu", base);
    snprintf(gpu, sizeof gpu, "%s/gpu", base);
    /* both at once (their rings carry the run id): the CPU stages of the two runs share the machine's cores */
    const char *const ck[] = {"--ckpt-every", "300", NULL};
    pid_t pc = start_demo(cpu, "cpu", "300", ck), pg = start_demo(gpu, "cuda:0", "300", ck);
    int rc_c = wait_demo(pc, cpu), rc_g = wait_demo(pg, gpu);
    ck_assert_msg(rc_c == 0 && rc_g == 0, "demo.sh exited %d (CPU trainer) and %d (GPU trainer); logs above", rc_c,
                  rc_g);
    double tc = tau_at(cpu, 300), tg = tau_at(gpu, 300);
    fprintf(stderr, "tau at step 300: CPU trainer %.3f, GPU trainer %.3f (|diff| %.3f, allowed 0.05; untrained %.3f)\n",
            tc, tg, fabs(tg - tc), TAU_UNTRAINED);
    ck_assert_msg(isfinite(tc) && isfinite(tg), "a tau is missing (see %s/*/eval/tau.dat)", base);
    ck_assert_msg(fabs(tg - tc) <= 0.05, "tau GPU %.3f, CPU %.3f: %.3f apart (allowed 0.05)", tg, tc, fabs(tg - tc));
    ck_assert_msg(tc >= TAU_UNTRAINED + 0.3 && tg >= TAU_UNTRAINED + 0.3,
                  "not learned: tau CPU %.3f, GPU %.3f, untrained %.3f (need +0.3)", tc, tg, TAU_UNTRAINED);
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
