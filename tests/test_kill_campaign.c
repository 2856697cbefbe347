/*
 * tests/test_kill_campaign.c — the kill campaign of issues 14 and 18, bounded for CI: the training
 * demo (pipelines/demo.sh --device cpu, tiny model, 40 steps, a checkpoint every 5, no τ
 * evaluation, ~4 s) runs once cleanly, then DFLASH_KILL_TRIALS (default 5) seeded trials (seed
 * DFLASH_KILL_SEED, default 1) each signal one or two stages at once, chosen among dflash-pack,
 * dflash-target, dflash-hspack, dflash-metrics and dflash-shm, with SIGKILL (or, one trial in
 * four, SIGTERM: a compute stage then exits 3, STAGE_EXIT_STOPPED, and dflash-shm keeps its rings),
 * at a random moment (after a random checkpoint, plus up to 150 ms). lib.sh restarts each alone
 * with the same command. Every trial must finish (exit 0, DONE) within 120 s with the trainer never
 * restarted (it saw one uninterrupted stream: one "needs batch seq" line) and a final checkpoint and
 * z-lab export byte-identical to the clean run's, i.e. the trainer saw the identical batch sequence;
 * no process and no segment of the run may be left.
 */
#include "test_e2e_util.h"

static pid_t start_demo(const char *run) {
    char out[700];
    snprintf(out, sizeof out, "%s.out", run);
    const char *argv[] = {"bash", e2e_script("demo.sh"), "--run", run, "--device", "cpu", "--", "--ckpt-every", "5", NULL};
    return e2e_start(out, E2E_STEPS, "0", NULL, argv);
}

static int count_in(const char *path, const char *needle) {
    static char text[1 << 20];
    e2e_slurp(path, text, sizeof text);
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
    return n;
}

static void finish_and_check(const char *run, const char *ref, pid_t demo, const char *what) {
    char out[700], tail[4096], a[900], b[900];
    snprintf(out, sizeof out, "%s.out", run);
    int rc = e2e_wait(demo, 120, out, what);
    e2e_tail(out, tail, sizeof tail);
    ck_assert_msg(rc == 0, "%s: the demo exited %d; end of %s:\n%s", what, rc, out, tail);
    snprintf(a, sizeof a, "%s/DONE", run);
    ck_assert_msg(access(a, F_OK) == 0, "%s: no DONE", what);
    snprintf(a, sizeof a, "%s/logs/dflash-train.out", run);
    ck_assert_msg(count_in(a, "needs batch seq") == 1, "%s: the trainer was restarted (%d starts)", what,
                  count_in(a, "needs batch seq"));
    if (ref) {
        snprintf(a, sizeof a, "%s/checkpoints/step-%s.ckpt", ref, E2E_STEPS);
        snprintf(b, sizeof b, "%s/checkpoints/step-%s.ckpt", run, E2E_STEPS);
        ck_assert_msg(e2e_same_file(a, b), "%s: the final checkpoint differs from the clean run's:\n%s", what, tail);
        snprintf(a, sizeof a, "%s/export/zlab/model.safetensors", ref);
        snprintf(b, sizeof b, "%s/export/zlab/model.safetensors", run);
        ck_assert_msg(e2e_same_file(a, b), "%s: the z-lab export differs from the clean run's", what);
    }
    e2e_nothing_left(run, what);
}

START_TEST(kill_campaign) {
    const char *base = test_tmpdir("killcamp");
    const char *e = getenv("DFLASH_KILL_TRIALS");
    int trials = e && *e ? atoi(e) : 5;
    e = getenv("DFLASH_KILL_SEED");
    uint64_t rng = (e && *e ? strtoull(e, NULL, 10) : 1) * 0x9E3779B97F4A7C15ull + 1;
    char run0[600];
    snprintf(run0, sizeof run0, "%s/clean", base);
    finish_and_check(run0, NULL, start_demo(run0), "clean run");
    static const char *stages[] = {"dflash-pack", "dflash-target", "dflash-hspack", "dflash-metrics", "dflash-shm"};
    enum { N_STAGES = 5 };
    int n_kill = 0, n_term = 0;
    for (int t = 0; t < trials; t++) {
        char run[600], cmd[4000];
        snprintf(run, sizeof run, "%s/trial%02d", base, t);
        /* same model and dataset as the clean run (demo.sh skips dflash-mkmodel/dflash-sample when they exist) */
        snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp -r '%s/model' '%s/data.jsonl' '%s/held-out.jsonl' '%s/'", run, run0,
                 run0, run0, run);
        ck_assert_int_eq(system(cmd), 0);
        int k = t % 2 ? 2 : 1;   /* one stage, then two at once, alternately */
        /* trial t always hits stages[t % 5] (5 trials cover all five), a second random one alongside on odd t */
        int a = t % N_STAGES, b = (a + 1 + (int)(test_rng_next(&rng) % (N_STAGES - 1))) % N_STAGES;
        int sig = test_rng_next(&rng) % 4 == 0 ? SIGTERM : SIGKILL;
        int at = 5 * (1 + (int)(test_rng_next(&rng) % 3));   /* after checkpoint 5..15 of 40 (the packer is still running) */
        useconds_t delay = (useconds_t)(test_rng_next(&rng) % 150000);
        const char *who[2] = {stages[a], stages[b]};
        pid_t demo = start_demo(run);
        double t0 = tr_now();
        while (!e2e_exists("%s/checkpoints/step-%d.ckpt", run, at)) {
            int st;
            ck_assert_msg(waitpid(demo, &st, WNOHANG) == 0, "trial %d: the demo ended before step %d", t, at);
            ck_assert_msg(tr_now() - t0 < 60, "trial %d: no checkpoint of step %d after 60 s", t, at);
            usleep(2000);
        }
        usleep(delay);
        char what[300];
        int off = snprintf(what, sizeof what, "trial %d (after step %d + %u ms):", t, at, delay / 1000);
        for (int i = 0; i < k; i++) {
            int pid = e2e_read_pid(run, who[i]);
            if (pid > 0 && kill(pid, sig) == 0) {
                off += snprintf(what + off, sizeof what - (size_t)off, " %s %s", sig == SIGKILL ? "SIGKILL" : "SIGTERM", who[i]);
                if (sig == SIGKILL) n_kill++; else n_term++;
            } else {
                off += snprintf(what + off, sizeof what - (size_t)off, " (%s not running)", who[i]);
            }
        }
        fprintf(stderr, "test_kill_campaign: %s\n", what);
        finish_and_check(run, run0, demo, what);
    }
    fprintf(stderr, "test_kill_campaign: %d trials, %d SIGKILL and %d SIGTERM delivered: every final drafter bit-identical "
                    "to the clean run's, no stray process or segment\n", trials, n_kill, n_term);
    ck_assert_int_gt(n_kill + n_term, trials / 2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("kill_campaign");
    TCase *tc = tcase_create("demo");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, kill_campaign);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
