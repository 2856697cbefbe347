/*
 * tests/test_kill_campaign.c — the kill campaign of issues 14, 18 and 24, bounded for CI: the training
 * demo (pipelines/demo.sh --device cpu, tiny model, 40 steps, a checkpoint every 5, no τ evaluation,
 * dflash-metrics' stall warning at 1 s) runs once cleanly, then DFLASH_KILL_TRIALS (default 8) seeded
 * trials (seed DFLASH_KILL_SEED, default 1; every failure names seed, trial and fault). Trial t is of kind
 * t % 8, so the default 8 cover every kind once and `make campaign` (60 trials) each about 7 times:
 *   stages      SIGKILL (or one time in four SIGTERM) one or two of pack, target, hspack, metrics, shm after a
 *               random checkpoint (+ up to 150 ms): each restarted alone, the trainer never restarted;
 *   train-early SIGKILL the trainer once before its first checkpoint, once the packer has published (issue 24:
 *               the packer continued from its cursor, hspack waited for seq 0 forever);
 *   train-twice SIGKILL the trainer after a checkpoint and again once the restarted chain runs, before the
 *               next checkpoint;
 *   train-ckpt  SIGKILL the trainer during a checkpoint write (its temporary seen) or right after the rename;
 *   train-final SIGKILL the trainer once the final checkpoint is in place (the exports may be unwritten);
 *   supervisor  SIGKILL demo.sh itself (its stages run on, orphaned) before or after a checkpoint, then run the
 *               same command again;
 *   sigterm     SIGTERM every stage (metrics and the trainer included) one after another in a random order,
 *               200-400 ms apart;
 *   sigstop     SIGSTOP one stage (pack, target, hspack or the trainer) for 2.5 s, past the stall warning
 *               (--stall-s 1), then SIGCONT: nothing gives up, nothing is restarted (the count of stall
 *               warnings is printed; a stopped packer stalls nobody while the rings hold its batches).
 * Every trial must finish (exit 0, DONE) within 120 s (a hang fails it, naming the trial), with a final
 * checkpoint and z-lab export byte-identical to the clean run's (the trainer saw the identical batch
 * sequence and trained every step asked for), and no process and no segment of the run left.
 */
#include "test_e2e_util.h"

enum { K_STAGES, K_TRAIN_EARLY, K_TRAIN_TWICE, K_TRAIN_CKPT, K_TRAIN_FINAL, K_SUPERVISOR, K_SIGTERM, K_SIGSTOP, N_KINDS };
static const char *kind_names[N_KINDS] = {"stages", "train-early", "train-twice", "train-ckpt", "train-final",
                                          "supervisor", "sigterm", "sigstop"};
#define TRIAL_S 120   /* the bound of one run of the demo */

static pid_t start_demo(const char *run) {
    char out[700];
    snprintf(out, sizeof out, "%s.out", run);
    setenv("STALL_S", "1", 1);
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

/* trainer starts in this run's log */
static int train_starts(const char *run) {
    char p[800];
    snprintf(p, sizeof p, "%s/logs/dflash-train.out", run);
    return count_in(p, "needs batch seq");
}

/* The value of a summary.txt line "KEY<spaces>VALUE" ("" when missing). */
static void summary_field(const char *run, const char *key, char *out, size_t cap) {
    static char text[1 << 16];
    char p[800];
    snprintf(p, sizeof p, "%s/summary.txt", run);
    e2e_slurp(p, text, sizeof text);
    out[0] = 0;
    for (char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        size_t n = strlen(key);
        if (strncmp(l, key, n) != 0 || l[n] != ' ') continue;
        const char *v = l + n;
        while (*v == ' ') v++;
        size_t len = strcspn(v, "\n");
        snprintf(out, cap, "%.*s", (int)len, v);
        return;
    }
}

static void finish_and_check(const char *run, const char *ref, pid_t demo, const char *what, int trainer_may_restart) {
    char out[700], tail[2500], a[900], b[900];   /* Check refuses a failure message of about 4 KiB or more */
    snprintf(out, sizeof out, "%s.out", run);
    int rc = e2e_wait(demo, TRIAL_S, out, what);
    e2e_tail(out, tail, sizeof tail);
    ck_assert_msg(rc == 0, "%s: the demo exited %d; end of %s:\n%s", what, rc, out, tail);
    snprintf(a, sizeof a, "%s/DONE", run);
    ck_assert_msg(access(a, F_OK) == 0, "%s: no DONE", what);
    if (!trainer_may_restart)
        ck_assert_msg(train_starts(run) == 1, "%s: the trainer was restarted (%d starts)", what, train_starts(run));
    /* the summary says every step asked for was trained and both exports passed the checker */
    char v[256];
    summary_field(run, "optimizer steps", v, sizeof v);
    ck_assert_msg(!strcmp(v, E2E_STEPS), "%s: summary.txt says %s optimizer steps, want %s", what, v, E2E_STEPS);
    summary_field(run, "export/zlab --check", v, sizeof v);
    ck_assert_msg(!strcmp(v, "ok"), "%s: summary.txt: export/zlab --check %s", what, v);
    summary_field(run, "export/speculators --check", v, sizeof v);
    ck_assert_msg(!strcmp(v, "ok"), "%s: summary.txt: export/speculators --check %s", what, v);
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

/* Wait (polling every 1 ms) until cond(run, arg) holds; fails the trial when the demo ends first or after 60 s. */
static void wait_until(pid_t demo, const char *run, int (*cond)(const char *, int), int arg, const char *what,
                       const char *waiting_for) {
    double t0 = tr_now();
    while (!cond(run, arg)) {
        int st;
        ck_assert_msg(waitpid(demo, &st, WNOHANG) == 0, "%s: the demo ended before %s", what, waiting_for);
        ck_assert_msg(tr_now() - t0 < 60, "%s: no %s after 60 s", what, waiting_for);
        usleep(1000);
    }
}

static int has_ckpt(const char *run, int step) { return e2e_exists("%s/checkpoints/step-%d.ckpt", run, step); }
static int packer_published(const char *run, int unused) {
    (void)unused;
    char p[800];
    snprintf(p, sizeof p, "%s/state/pack.cursor", run);
    return access(p, F_OK) == 0;
}
/* a checkpoint temporary (ckpt_save: step-N.ckpt.tmp.PID) or a checkpoint past step `after` */
static int ckpt_moment(const char *run, int after) {
    char dir[800];
    snprintf(dir, sizeof dir, "%s/checkpoints", run);
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int hit = 0;
    while (!hit && (e = readdir(d)) != NULL) {
        int step;
        if (strstr(e->d_name, ".ckpt.tmp.")) hit = 1;
        else if (sscanf(e->d_name, "step-%d.ckpt", &step) == 1 && step > after) hit = 1;
    }
    closedir(d);
    return hit;
}
static int trainer_restarted(const char *run, int starts) { return train_starts(run) >= starts; }

/* Signal a stage by its pid file; appends what was done to what. 1 when delivered. */
static int signal_stage(const char *run, const char *stage, int sig, char *what, size_t cap) {
    int pid = e2e_read_pid(run, stage);
    size_t off = strlen(what);
    if (pid > 0 && kill(pid, sig) == 0) {
        snprintf(what + off, cap - off, " %s %s", strsignal(sig), stage);
        return 1;
    }
    snprintf(what + off, cap - off, " (%s not running)", stage);
    return 0;
}

START_TEST(kill_campaign) {
    const char *base = test_tmpdir("killcamp");
    const char *e = getenv("DFLASH_KILL_TRIALS");
    int trials = e && *e ? atoi(e) : N_KINDS;
    e = getenv("DFLASH_KILL_SEED");
    unsigned long long seed = e && *e ? strtoull(e, NULL, 10) : 1;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    fprintf(stderr, "test_kill_campaign: seed %llu, %d trials\n", seed, trials);
    char run0[600];
    snprintf(run0, sizeof run0, "%s/clean", base);
    finish_and_check(run0, NULL, start_demo(run0), "clean run", 0);
    static const char *producers[] = {"dflash-pack", "dflash-target", "dflash-hspack", "dflash-metrics", "dflash-shm"};
    static const char *all[] = {"dflash-pack", "dflash-target", "dflash-hspack", "dflash-metrics", "dflash-shm", "dflash-train"};
    int n_signals = 0;
    for (int t = 0; t < trials; t++) {
        char run[600], cmd[4000], what[600];
        snprintf(run, sizeof run, "%s/trial%02d", base, t);
        /* same model and dataset as the clean run (demo.sh skips dflash-mkmodel/dflash-sample when they exist) */
        snprintf(cmd, sizeof cmd, "mkdir -m 700 '%s' && cp -r '%s/model' '%s/data.jsonl' '%s/held-out.jsonl' '%s/'", run,
                 run0, run0, run0, run);
        ck_assert_int_eq(system(cmd), 0);
        int kind = t % N_KINDS;
        int at = 5 * (1 + (int)(test_rng_next(&rng) % 3));   /* after checkpoint 5..15 of 40 */
        useconds_t delay = (useconds_t)(test_rng_next(&rng) % 150000);
        snprintf(what, sizeof what, "seed %llu trial %d (%s):", seed, t, kind_names[kind]);
        pid_t demo = start_demo(run);
        int restarts_ok = 1, delivered = 0;
        switch (kind) {
        case K_STAGES: {
            restarts_ok = 0;
            int k = (t / N_KINDS) % 2 ? 2 : 1;
            int a = (t / N_KINDS) % 5, b = (a + 1 + (int)(test_rng_next(&rng) % 4)) % 5;
            int sig = test_rng_next(&rng) % 4 == 0 ? SIGTERM : SIGKILL;
            wait_until(demo, run, has_ckpt, at, what, "checkpoint");
            usleep(delay);
            snprintf(what + strlen(what), sizeof what - strlen(what), " after step %d + %u ms:", at, delay / 1000);
            delivered += signal_stage(run, producers[a], sig, what, sizeof what);
            if (k == 2) delivered += signal_stage(run, producers[b], sig, what, sizeof what);
            break;
        }
        case K_TRAIN_EARLY:
            wait_until(demo, run, packer_published, 0, what, "packer cursor");
            usleep(delay / 3);
            snprintf(what + strlen(what), sizeof what - strlen(what), " pack running + %u ms%s:", delay / 3000,
                     has_ckpt(run, 5) ? " (step 5 already saved)" : "");
            delivered += signal_stage(run, "dflash-train", SIGKILL, what, sizeof what);
            break;
        case K_TRAIN_TWICE:
            wait_until(demo, run, has_ckpt, at, what, "checkpoint");
            usleep(delay);
            snprintf(what + strlen(what), sizeof what - strlen(what), " after step %d + %u ms:", at, delay / 1000);
            delivered += signal_stage(run, "dflash-train", SIGKILL, what, sizeof what);
            wait_until(demo, run, trainer_restarted, 2, what, "second trainer start");
            wait_until(demo, run, packer_published, 0, what, "packer cursor of the second chain");
            usleep(delay / 2);
            snprintf(what + strlen(what), sizeof what - strlen(what), ", restarted + %u ms%s:", delay / 2000,
                     has_ckpt(run, at + 5) ? " (next checkpoint already saved)" : "");
            delivered += signal_stage(run, "dflash-train", SIGKILL, what, sizeof what);
            break;
        case K_TRAIN_CKPT:
            wait_until(demo, run, ckpt_moment, at - 5, what, "checkpoint write");
            snprintf(what + strlen(what), sizeof what - strlen(what), " during the checkpoint after step %d:", at - 5);
            delivered += signal_stage(run, "dflash-train", SIGKILL, what, sizeof what);
            break;
        case K_TRAIN_FINAL:
            wait_until(demo, run, has_ckpt, atoi(E2E_STEPS), what, "final checkpoint");
            snprintf(what + strlen(what), sizeof what - strlen(what), " final checkpoint in place:");
            delivered += signal_stage(run, "dflash-train", SIGKILL, what, sizeof what);
            break;
        case K_SUPERVISOR: {
            int early = (t / N_KINDS) % 2 == 0;
            if (early) wait_until(demo, run, packer_published, 0, what, "packer cursor");
            else wait_until(demo, run, has_ckpt, at, what, "checkpoint");
            usleep(delay);
            snprintf(what + strlen(what), sizeof what - strlen(what), " %s + %u ms: SIGKILL demo.sh, then the same command",
                     early ? "pack running" : "after a checkpoint", delay / 1000);
            ck_assert_int_eq(kill(demo, SIGKILL), 0);
            tr_wait(demo);
            delivered++;
            demo = start_demo(run);
            break;
        }
        case K_SIGTERM: {
            int order[6] = {0, 1, 2, 3, 4, 5};
            for (int i = 5; i > 0; i--) {
                int j = (int)(test_rng_next(&rng) % (uint64_t)(i + 1)), x = order[i];
                order[i] = order[j];
                order[j] = x;
            }
            wait_until(demo, run, has_ckpt, 5, what, "checkpoint");
            for (int i = 0; i < 6; i++) {
                delivered += signal_stage(run, all[order[i]], SIGTERM, what, sizeof what);
                usleep(200000 + (useconds_t)(test_rng_next(&rng) % 200000));
            }
            break;
        }
        case K_SIGSTOP: {
            static const char *stoppable[] = {"dflash-pack", "dflash-target", "dflash-hspack", "dflash-train"};
            const char *who = stoppable[(t / N_KINDS + test_rng_next(&rng)) % 4];
            restarts_ok = 0;
            wait_until(demo, run, has_ckpt, 5, what, "checkpoint");
            usleep(delay);
            if (signal_stage(run, who, SIGSTOP, what, sizeof what)) {
                delivered++;
                usleep(2500000);   /* past --stall-s 1 */
                int pid = e2e_read_pid(run, who);
                ck_assert_int_eq(kill(pid, SIGCONT), 0);
                strncat(what, " for 2.5 s, SIGCONT", sizeof what - strlen(what) - 1);
            }
            break;
        }
        }
        fprintf(stderr, "test_kill_campaign: %s\n", what);
        n_signals += delivered;
        finish_and_check(run, run0, demo, what, restarts_ok);
        if (kind == K_SIGSTOP && delivered) {   /* whether the stop outlasted the rings' slack (informational) */
            char p[800];
            snprintf(p, sizeof p, "%s/logs/dflash-metrics.out", run);
            fprintf(stderr, "test_kill_campaign: %s: stall warnings logged: %d\n", what, count_in(p, "stall: "));
        }
    }
    fprintf(stderr, "test_kill_campaign: seed %llu: %d trials, %d faults delivered: every final drafter bit-identical "
                    "to the clean run's, no stray process or segment\n", seed, trials, n_signals);
    ck_assert_int_gt(n_signals, trials / 2);
}
END_TEST

int main(void) {
    const char *e = getenv("DFLASH_KILL_TRIALS");
    int trials = e && *e ? atoi(e) : N_KINDS;
    Suite *s = suite_create("kill_campaign");
    TCase *tc = tcase_create("demo");
    /* every run of the demo is bounded by TRIAL_S; a supervisor trial runs it twice */
    tcase_set_timeout(tc, (double)TRIAL_S * (trials + 2) + 60);
    tcase_add_test(tc, kill_campaign);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
