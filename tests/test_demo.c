/*
 * tests/test_demo.c — the main job as `make run` runs it: pipelines/demo.sh with its defaults (300
 * training steps on the tiny learnable target, τ measured at every checkpoint) on --device cpu in a
 * temporary run directory; checks what it produced, not what it printed:
 *   - exit 0, DONE, state/train.json at step 300, both exports present and passed by the checker
 *     (summary.txt), checkpoints every 50 steps;
 *   - τ on the held-out prompts rises: below 1.3 at step 50, above 1.5 and at least 0.3 higher at
 *     step 300; the z-lab export's τ (bf16 weights) above 1.5;
 *   - the loss falls (metrics.csv: the last step's loss below the first's), metrics.jsonl holds records
 *     of every stage, and plots/{loss,eal,tokens_per_s,tau,stages}.png exist;
 *   - nothing of the run is left; the same command again only reports.
 * About 25 s on an idle 2-core machine.
 */
#include "test_e2e_util.h"

static double tau_at(const char *run, const char *name) {
    char path[900], text[8192];
    snprintf(path, sizeof path, "%s/eval/%s.json", run, name);
    e2e_slurp(path, text, sizeof text);
    const char *p = strstr(text, "\"tau\":");
    ck_assert_msg(p != NULL, "%s: no tau", path);
    return strtod(p + 6, NULL);
}

static double csv_loss(const char *run, int last) {
    char path[900];
    static char text[1 << 20];
    snprintf(path, sizeof path, "%s/metrics.csv", run);
    e2e_slurp(path, text, sizeof text);
    char *line = strtok(text, "\n");
    ck_assert_ptr_nonnull(line);
    int col = -1, c = 0;
    for (char *p = line; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL, c++)
        if (!strncmp(p, "loss,", 5) || !strcmp(p, "loss")) { col = c; break; }
    ck_assert_msg(col >= 0, "metrics.csv has no loss column: %s", line);
    double v = -1;
    while ((line = strtok(NULL, "\n")) != NULL) {
        const char *p = line;
        for (int i = 0; i < col && p; i++) p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL;
        if (!p || *p == ',' || !*p) continue;
        v = strtod(p, NULL);
        if (!last) break;
    }
    ck_assert_msg(v > 0, "metrics.csv: no loss value");
    return v;
}

START_TEST(demo_trains_and_tau_rises) {
    char run[600], out[700], path[900], text[8192], tail[4096];
    snprintf(run, sizeof run, "%s/demo", test_tmpdir("demo"));
    snprintf(out, sizeof out, "%s.out", run);
    const char *argv[] = {"bash", e2e_script("demo.sh"), "--run", run, "--device", "cpu", NULL};
    double t0 = tr_now();
    int rc = e2e_wait(e2e_start(out, NULL, NULL, NULL, argv), 300, out, "demo");
    double dt = tr_now() - t0;
    e2e_tail(out, tail, sizeof tail);
    ck_assert_msg(rc == 0, "demo exited %d:\n%s", rc, tail);
    snprintf(path, sizeof path, "%s/DONE", run);
    ck_assert_msg(access(path, F_OK) == 0, "no DONE");
    snprintf(path, sizeof path, "%s/state/train.json", run);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "\"step\": 300"), "%s: %s", path, text);
    for (int s = 50; s <= 300; s += 50) ck_assert_msg(e2e_exists("%s/checkpoints/step-%d.ckpt", run, s), "no step-%d.ckpt", s);
    snprintf(path, sizeof path, "%s/summary.txt", run);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "export/zlab --check          ok") && strstr(text, "export/speculators --check   ok"),
                  "exports not passed by the checker:\n%s", text);
    double t50 = tau_at(run, "tau-step-50"), t300 = tau_at(run, "tau-step-300"), tz = tau_at(run, "tau-export-zlab");
    ck_assert_msg(t50 < 1.3, "tau at step 50: %g", t50);
    ck_assert_msg(t300 > 1.5 && t300 > t50 + 0.3, "tau did not rise: %g -> %g", t50, t300);
    ck_assert_msg(tz > 1.5, "tau of the z-lab export: %g", tz);
    double l0 = csv_loss(run, 0), l1 = csv_loss(run, 1);
    ck_assert_msg(l1 < l0 * 0.6, "loss %g -> %g", l0, l1);
    static const char *plots[] = {"loss", "eal", "tokens_per_s", "tau", "stages"};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/plots/%s.png", run, plots[i]);
        ck_assert_msg(access(path, F_OK) == 0, "no %s", path);
    }
    static const char *stages[] = {"dflash-pack", "dflash-target", "dflash-hspack", "dflash-train"};
    static char jl[1 << 22];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    e2e_slurp(path, jl, sizeof jl);
    for (int i = 0; i < 4; i++) {
        char needle[64];
        snprintf(needle, sizeof needle, "\"stage\":\"%s\"", stages[i]);
        ck_assert_msg(strstr(jl, needle), "metrics.jsonl has no record of %s", stages[i]);
    }
    e2e_nothing_left(run, "demo");
    fprintf(stderr, "test_demo: demo.sh in %.1f s: tau %.3f (step 50) -> %.3f (step 300), z-lab export %.3f; loss %.3f -> %.3f\n",
            dt, t50, t300, tz, l0, l1);
    /* the same command again only reports */
    rc = e2e_wait(e2e_start(out, NULL, NULL, NULL, argv), 60, out, "demo again");
    e2e_tail(out, tail, sizeof tail);
    ck_assert_msg(rc == 0 && strstr(tail, "is complete (DONE)"), "again: exit %d:\n%s", rc, tail);
}
END_TEST

int main(void) {
    Suite *s = suite_create("demo");
    TCase *tc = tcase_create("demo");
    tcase_set_timeout(tc, 400);
    tcase_add_test(tc, demo_trains_and_tau_rises);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
