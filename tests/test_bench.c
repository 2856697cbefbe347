/*
 * tests/test_bench.c — scripts/bench.sh --cpu-smoke (issue 21): the --gpu benchmark's phases and report on the
 * CPU (tiny model, --device cpu, pipelines/train.sh once per variant: adamw and muon 5 optimizer steps, muon
 * --grad-accum 4 three), so the parser and the table are checked where no GPU is:
 *   - exit 0; phases.tsv names every phase, the pipeline ok, the GPU benchmarks skipped (CPU build) or ok;
 *   - summary.txt has the table header and every figure of the issue (ceilings, target alone, trainer alone,
 *     steady and launch-to-last rates, launch to the first step, MFU, busy/wait and peak GPU memory per stage),
 *     each row with a value and a "covers" text; the pipeline's rates are positive numbers and the steady rate
 *     is at least the launch-to-last rate (it excludes start-up);
 *   - RESULTS-entry.md has the date/commit title and the shape line; --results none appends nowhere else;
 *   - with BENCH_DEVICE=cuda:0 in a build whose trainer cannot run there, the pipeline phase is skipped with a
 *     one-line reason (and the script still exits 0).
 * A few seconds on 2 cores.
 */
#include "test_e2e_util.h"

static const char *bench_script(void) {
    static char path[PATH_MAX];
    snprintf(path, sizeof path, "scripts/bench.sh");
    if (access(path, R_OK) == 0) return path;
    const char *bin = getenv("DFLASH_BIN");
    snprintf(path, sizeof path, "%s/../../scripts/bench.sh", bin ? bin : "build/bin");
    return path;
}

/* BUILD for bench.sh: the directory above DFLASH_BIN (make test sets DFLASH_BIN=$(BUILD)/bin) */
static void set_build_env(const char *outdir, const char *device) {
    const char *bin = getenv("DFLASH_BIN");
    char build[PATH_MAX];
    snprintf(build, sizeof build, "%s/..", bin ? bin : "build/bin");
    ck_assert_int_eq(setenv("BUILD", build, 1), 0);
    ck_assert_int_eq(setenv("OUT_DIR", outdir, 1), 0);
    if (device) ck_assert_int_eq(setenv("BENCH_DEVICE", device, 1), 0);
    else unsetenv("BENCH_DEVICE");
}

/* the row of summary.txt whose figure column is FIGURE (after "part | "), or NULL */
static const char *find_row(const char *text, const char *part, const char *figure, char *row, size_t cap) {
    char needle[200];
    snprintf(needle, sizeof needle, "\n%s", part);
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle)) {
        const char *e = strchr(p + 1, '\n');
        size_t n = e ? (size_t)(e - p - 1) : strlen(p + 1);
        if (n >= cap) n = cap - 1;
        memcpy(row, p + 1, n);
        row[n] = 0;
        char *bar = strchr(row, '|');
        if (!bar) continue;
        const char *f = bar + 1;
        while (*f == ' ') f++;
        if (!strncmp(f, figure, strlen(figure)) && (f[strlen(figure)] == ' ' || f[strlen(figure)] == '|')) return row;
    }
    return NULL;
}

/* value column (third) of a row: a number (spaces as thousands separators removed), or -1 for n/a */
static double row_value(const char *row) {
    const char *p = strchr(row, '|');
    ck_assert_ptr_nonnull(p);
    p = strchr(p + 1, '|');
    ck_assert_ptr_nonnull(p);
    const char *e = strchr(p + 1, '|');
    ck_assert_ptr_nonnull(e);
    char v[64];
    size_t k = 0;
    for (const char *q = p + 1; q < e && k < sizeof v - 1; q++)
        if (*q != ' ') v[k++] = *q;
    v[k] = 0;
    if (!strcmp(v, "n/a")) return -1;
    char *end;
    double d = strtod(v, &end);
    ck_assert_msg(end != v && !*end, "value column '%s' of row: %s", v, row);
    return d;
}

/* the fourth '|' is followed by the covers text: non-empty */
static void assert_covers(const char *row) {
    const char *p = row;
    for (int i = 0; i < 4; i++) {
        p = strchr(p, '|');
        ck_assert_msg(p != NULL, "row has fewer than 5 columns: %s", row);
        p++;
    }
    while (*p == ' ') p++;
    ck_assert_msg(strlen(p) > 3, "row without a covers text: %s", row);
}

START_TEST(smoke_prints_every_figure) {
    char dir[600], out[700], log[700], path[900], tail[4096], row[1024];
    static char text[1 << 16];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("bench"));
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(log, sizeof log, "%s/bench.log", dir);
    set_build_env(out, NULL);
    const char *argv[] = {"bash", bench_script(), "--cpu-smoke", "--results", "none", NULL};
    double t0 = tr_now();
    int rc = e2e_wait(e2e_start(log, NULL, NULL, NULL, argv), 150, log, "bench.sh --cpu-smoke");
    e2e_tail(log, tail, sizeof tail);
    ck_assert_msg(rc == 0, "bench.sh --cpu-smoke exited %d:\n%s", rc, tail);

    snprintf(path, sizeof path, "%s/phases.tsv", out);
    e2e_slurp(path, text, sizeof text);
    static const char *phases[] = {"ceiling\t", "target\t", "train\t", "model\tok", "pipeline\tok"};
    for (int i = 0; i < 5; i++) ck_assert_msg(strstr(text, phases[i]), "phases.tsv has no '%s':\n%s", phases[i], text);
    ck_assert_msg(!strstr(text, "FAILED"), "a phase failed:\n%s", text);

    snprintf(path, sizeof path, "%s/summary.txt", out);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "part     | figure"), "no table header:\n%s", text);
    static const char *rows[][2] = {
        {"ceiling", "bf16 GEMM peak"}, {"ceiling", "device-to-device copy"},
        {"target", "target forward alone"}, {"target", "MFU vs measured GEMM peak"}, {"target", "peak GPU memory"},
        {"train", "trainer alone"}, {"train", "MFU vs measured GEMM peak"}, {"train", "launch to first optimizer step"},
        {"train", "peak GPU memory"},
        {"pipeline", "steady rate"}, {"pipeline", "launch to last optimizer step"},
        {"pipeline", "launch to first optimizer step"}, {"pipeline", "MFU vs measured GEMM peak (steady)"},
        {"pipeline", "dflash-pack busy / wait"}, {"pipeline", "dflash-target busy / wait"},
        {"pipeline", "dflash-hspack busy / wait"}, {"pipeline", "dflash-train busy / wait"},
        {"pipeline", "dflash-shm peak GPU memory"}, {"pipeline", "dflash-target peak GPU memory"},
        {"pipeline", "dflash-train peak GPU memory"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ck_assert_msg(find_row(text, rows[i][0], rows[i][1], row, sizeof row), "no row '%s | %s' in:\n%s", rows[i][0],
                      rows[i][1], text);
        (void)row_value(row);
        assert_covers(row);
    }
    find_row(text, "pipeline", "steady rate", row, sizeof row);
    double steady = row_value(row);
    find_row(text, "pipeline", "launch to last optimizer step", row, sizeof row);
    double whole = row_value(row);
    find_row(text, "pipeline", "launch to first optimizer step", row, sizeof row);
    double first = row_value(row);
    ck_assert_msg(steady > 0 && whole > 0 && first > 0, "pipeline figures: steady %g, launch-to-last %g, first %g",
                  steady, whole, first);
    ck_assert_msg(steady >= whole, "the steady rate %g is below the launch-to-last rate %g", steady, whole);
    find_row(text, "pipeline", "dflash-train busy / wait", row, sizeof row);
    double busy = row_value(row);
    ck_assert_msg(busy > 0 && busy <= 100, "dflash-train busy %g%%", busy);

    snprintf(path, sizeof path, "%s/RESULTS-entry.md", out);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "## scripts/bench.sh --smoke") && strstr(text, ", commit ") && strstr(text, "\nShape: tiny"),
                  "RESULTS-entry.md:\n%s", text);
    fprintf(stderr, "test_bench: --cpu-smoke in %.1f s: steady %.0f tok/s, launch-to-last %.0f tok/s, first step %.1f s\n",
            tr_now() - t0, steady, whole, first);
}
END_TEST

START_TEST(pipeline_skipped_without_gpu_trainer) {
    char dir[600], out[700], log[700], path[900], tail[4096];
    static char text[1 << 16];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("bench-skip"));
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(log, sizeof log, "%s/bench.log", dir);
    set_build_env(out, "cuda:0");
    const char *argv[] = {"bash", bench_script(), "--cpu-smoke", "--only", "pipeline", "--results", "none", NULL};
    int rc = e2e_wait(e2e_start(log, NULL, NULL, NULL, argv), 60, log, "bench.sh --only pipeline on cuda:0");
    e2e_tail(log, tail, sizeof tail);
    ck_assert_msg(rc == 0, "exited %d:\n%s", rc, tail);
    snprintf(path, sizeof path, "%s/phases.tsv", out);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "pipeline\tskipped\t0\tdflash-train has no GPU path: "), "phases.tsv:\n%s", text);
    ck_assert_msg(strchr(text, '\n') == text + strlen(text) - 1, "not one line:\n%s", text);
    snprintf(path, sizeof path, "%s/summary.txt", out);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "skipped: dflash-train has no GPU path"), "the table does not say why:\n%s", text);
}
END_TEST

int main(void) {
    Suite *s = suite_create("bench");
    TCase *tc = tcase_create("bench");
    tcase_set_timeout(tc, 240);   /* three pipeline runs (issue 28: adamw, muon, muon-ga4), ~35 s on 2 loaded cores */
    tcase_add_test(tc, smoke_prints_every_figure);
    tcase_add_test(tc, pipeline_skipped_without_gpu_trainer);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
