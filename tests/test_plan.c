/*
 * tests/test_plan.c — the run plan (stages/plan/plan.h, dflash-plan; issue 25):
 *   - plan_make on the tiny model: the default ids are plan_default_layer_ids for the drafter's layer count,
 *     the steps are the packer's own batch count / grad_accum (rounded up), batches = steps x grad_accum;
 *     write/read round trip, a stable hash, a hand edit refused until --rehash, bad files refused by key;
 *   - binding: a flag not given takes the plan's value, the same value passes, another is one line naming both;
 *   - stages started by hand against a plan: a different budget or layer list is refused with one line naming
 *     both values (exit 2); a ring made for another plan is refused at attach;
 *   - pipelines/train.sh: at most one line names --tokens; a 2-layer drafter without --layers trains; --steps 6
 *     -- --grad-accum 4 trains 6 optimizer steps over 24 batches;
 *   - memory_plan_refused: with a GPU stage, dflash-plan prints the job's device-memory plan and refuses one that
 *     cannot fit (one line, no plan written); trainer-only and two-GPU placements are checked by their shares.
 */
#include "core/flags.h"
#include "model/hfconfig.h"
#include "plan/plan.h"

#include "test_e2e_util.h"
#include "testutil.h"

#include <check.h>

static char g_model[600], g_data[600], g_base[512];

/* once per suite (an unchecked fixture: the forked tests inherit the paths) */
static void make_inputs(void) {
    if (g_model[0]) return;
    e2e_tiny_inputs("plan", g_base, g_model, g_data);
}

/* run argv with stdout+stderr into log; returns the exit status and the output in out */
static int run_cmd(const char *const *argv, char *out, size_t cap) {
    char log[700];
    snprintf(log, sizeof log, "%s/cmd.log", g_base);
    unlink(log);
    int rc = tr_wait(test_spawn_log(log, argv));
    e2e_slurp(log, out, cap);
    return rc;
}

/* "1,1": the default captured ids of a 2-layer drafter on the tiny 4-layer target, from the one function that
 * computes them (its formula may change; the tests follow it) */
static const char *tiny_default_ids(void) {
    static char buf[64];
    int ids[2];
    char err[256];
    ck_assert_msg(plan_default_layer_ids(4, 2, ids, err, sizeof err) == 0, "%s", err);
    return plan_format_ids(ids, 2, buf, sizeof buf);
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

START_TEST(make_write_read) {
    make_inputs();
    char err[1024], run[700], path[800];
    char cmd[2400];
    snprintf(run, sizeof run, "%s/mwr", g_base);
    ck_assert_int_eq(mkdir(run, 0700), 0);
    struct plan_inputs in = {.model = g_model, .data = g_data, .device = "cpu", .tokens = 256, .layer_types = "full,full",
                             .block_size = 4, .grad_accum = 4, .seed = -1};
    struct plan p;
    ck_assert_msg(plan_make(&in, &p, err, sizeof err) == 0, "%s", err);
    /* the default ids: the one function, for the drafter's layer count (2), on the target's 4 layers */
    int want[DESC_MAX_LAYERS];
    ck_assert_int_eq(plan_default_layer_ids(4, 2, want, err, sizeof err), 0);
    ck_assert_int_eq(p.draft_layers, 2);
    ck_assert_int_eq(p.n_ids, 2);
    ck_assert_mem_eq(p.ids, want, 2 * sizeof(int));
    int hf[2];
    ck_assert_int_eq(hf_zlab_layer_ids(4, 2, hf), 0);
    ck_assert_mem_eq(p.ids, hf, sizeof hf);
    ck_assert_int_eq(p.hidden_size, 64);
    ck_assert_int_eq(p.target_layers, 4);
    ck_assert_int_eq(p.dtype, DESC_DTYPE_F32);
    ck_assert_str_eq(p.train_device, "cpu");   /* default: the other stages' device */
    /* steps = ceil(epoch batches / 4), counted by the packer itself: one epoch's batches is what dflash-pack
     * --out-dir writes, which train.sh used to count */
    char odir[800], out[8192], n_files[64];
    snprintf(odir, sizeof odir, "%s/count", run);
    const char *pk[] = {test_bin("dflash-pack"), "--data", g_data, "--run", odir, "--out-dir", odir, "--tokens", "256",
                        "--seed", "1", "--epochs", "1", NULL};
    ck_assert_msg(run_cmd(pk, out, sizeof out) == 0, "%s", out);
    snprintf(cmd, sizeof cmd, "ls '%s' | grep -c '^batch-'", odir);
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(n_files, sizeof n_files, f));
    pclose(f);
    int64_t epoch_batches = atoll(n_files);
    ck_assert_int_gt(epoch_batches, 4);
    ck_assert_int_eq(p.steps, (epoch_batches + 3) / 4);
    ck_assert_int_eq(p.batches, p.steps * 4);
    ck_assert_int_eq(p.grad_accum, 4);
    ck_assert_int_eq(p.n_rings, 3);
    ck_assert_ptr_nonnull(strstr(p.rings[1], "hidden:"));
    ck_assert_ptr_nonnull(strstr(p.rings[1], "dev=host"));

    /* round trip: the same plan, the same hash */
    snprintf(path, sizeof path, "%s/plan.json", run);
    ck_assert_msg(plan_write(&p, path, err, sizeof err) == 0, "%s", err);
    struct plan q;
    ck_assert_msg(plan_read(path, 1, &q, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(q.hash, p.hash);
    ck_assert_uint_eq(plan_compute_hash(&q), p.hash);
    ck_assert_str_eq(q.model, p.model);
    ck_assert_int_eq(q.tokens, 256);
    ck_assert_int_eq(q.batches, p.batches);
    ck_assert_str_eq(q.train_device, "cpu");
    ck_assert_int_eq(plan_open_run(run, &q, err, sizeof err), 1);
    char empty[800];
    snprintf(empty, sizeof empty, "%s/none", run);
    ck_assert_int_eq(plan_open_run(empty, &q, err, sizeof err), 0);   /* no plan: flags alone */

    /* a hand edit: refused until dflash-plan --rehash accepts it */
    snprintf(cmd, sizeof cmd, "sed -i 's/\"tokens\": 256/\"tokens\": 512/' '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(plan_read(path, 1, &q, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "was edited") && strstr(err, "--rehash"), "%s", err);
    const char *rh[] = {test_bin("dflash-plan"), "--run", run, "--rehash", NULL};
    ck_assert_msg(run_cmd(rh, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(plan_read(path, 1, &q, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(q.tokens, 512);
    ck_assert_uint_ne(q.hash, p.hash);

    /* bad files: one sentence naming the key */
    struct { const char *sed, *needle; } bad[] = {
        {"s/\"grad_accum\": 4/\"grad_accum\": 3/", "not steps x grad_accum"},
        {"s/\"dtype\": \"f32\"/\"dtype\": \"f16\"/", "key 'dtype'"},
        {"s/\"seed\": 1,/\"seed\": 1, \"colour\": 2,/", "unknown key 'colour'"},
        {"s/\"version\": 1/\"version\": 9/", "plan version 9"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char bp[900];
        snprintf(bp, sizeof bp, "%s/bad%zu.json", run, i);
        snprintf(cmd, sizeof cmd, "sed '%s' '%s' >'%s'", bad[i].sed, path, bp);
        ck_assert_int_eq(system(cmd), 0);
        ck_assert_int_eq(plan_read(bp, 0, &q, err, sizeof err), -1);
        ck_assert_msg(strstr(err, bad[i].needle) && strstr(err, bp), "'%s': %s", bad[i].needle, err);
    }
}
END_TEST

START_TEST(binding) {
    struct plan p;
    memset(&p, 0, sizeof p);
    snprintf(p.path, sizeof p.path, "RUN/plan.json");
    char err[512];
    int v = 8192;
    ck_assert_int_eq(plan_bind_int(&p, "tokens", 0, &v, 256, "tokens", err, sizeof err), 0);
    ck_assert_int_eq(v, 256);   /* not given: the plan's */
    ck_assert_int_eq(plan_bind_int(&p, "tokens", 1, &v, 256, "tokens", err, sizeof err), 0);   /* the same value */
    v = 4096;
    ck_assert_int_eq(plan_bind_int(&p, "tokens", 1, &v, 256, "tokens", err, sizeof err), -1);
    ck_assert_str_eq(err, "--tokens 4096 conflicts with the plan's tokens 256 (RUN/plan.json): drop the flag, or write "
                          "another plan (dflash-plan)");
    int ids[4] = {1, 2}, n = 2, plan_ids[2] = {1, 3};
    ck_assert_int_eq(plan_bind_list(&p, "layers", 1, ids, &n, plan_ids, 2, "capture.layer_ids", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--layers 1,2 conflicts with the plan's capture.layer_ids 1,3"), "%s", err);
    n = 0;
    ck_assert_int_eq(plan_bind_list(&p, "layers", 0, ids, &n, plan_ids, 2, "capture.layer_ids", err, sizeof err), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_int_eq(ids[1], 3);
    snprintf(p.device, sizeof p.device, "cpu");
    snprintf(p.train_device, sizeof p.train_device, "cuda:0");   /* a GPU trainer on host rings */
    const char *dev = "auto";
    ck_assert_int_eq(plan_bind_device(&p, 0, &dev, p.device, err, sizeof err), 0);
    ck_assert_str_eq(dev, "cpu");
    dev = "cuda:1";
    ck_assert_int_eq(plan_bind_device(&p, 1, &dev, p.device, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--device cuda:1 conflicts with the plan's device cpu"), "%s", err);
    dev = "auto";
    ck_assert_int_eq(plan_bind_device(&p, 0, &dev, p.train_device, err, sizeof err), 0);
    ck_assert_str_eq(dev, "cuda:0");
    dev = "cpu";
    ck_assert_int_eq(plan_bind_device(&p, 1, &dev, p.train_device, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "--device cpu conflicts with the plan's train_device cuda:0"), "%s", err);
    char *argv[] = {"x", "--tokens=5", "--no-resume", "--", "--layers", NULL};
    ck_assert_int_eq(flags_given(5, argv, "tokens"), 1);
    ck_assert_int_eq(flags_given(5, argv, "resume"), 1);
    ck_assert_int_eq(flags_given(5, argv, "layers"), 0);   /* after "--" */
    ck_assert_int_eq(flags_given(5, argv, "token"), 0);
}
END_TEST

/* Stages started by hand against a plan: conflicts are refused with one line naming both values. */
START_TEST(stages_refuse_conflicts) {
    make_inputs();
    char run[700], out[8192];
    snprintf(run, sizeof run, "%s/hand", g_base);
    const char *pl[] = {test_bin("dflash-plan"), g_model, g_data, "--run", run, "--device", "cpu", "--tokens", "256",
                        "--steps", "3", "--", "--layer-types", "full,full", "--block-size", "4", NULL};
    ck_assert_msg(run_cmd(pl, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "3 steps x 1 = 3 batches of 256 tokens"), "%s", out);
    char n_layers[160], n_ids[160];
    snprintf(n_layers, sizeof n_layers, "--layers 0,3 conflicts with the plan's capture.layer_ids %s", tiny_default_ids());
    snprintf(n_ids, sizeof n_ids, "--target-layer-ids 0,3 conflicts with the plan's capture.layer_ids %s",
             tiny_default_ids());
    struct { const char *bin, *flag, *value, *needle; } cases[] = {
        {"dflash-target", "--tokens", "512", "--tokens 512 conflicts with the plan's tokens 256"},
        {"dflash-target", "--layers", "0,3", n_layers},
        {"dflash-pack", "--tokens", "128", "--tokens 128 conflicts with the plan's tokens 256"},
        {"dflash-hspack", "--n-layers", "3", "--n-layers 3 conflicts with the plan's"},
        {"dflash-train", "--target-layer-ids", "0,3", n_ids},
        {"dflash-train", "--max-steps", "9", "--max-steps 9 conflicts with the plan's steps 3"},
        {"dflash-train", "--tokens", "64", "--tokens 64 conflicts with the plan's tokens 256"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[] = {test_bin(cases[i].bin), "--run", run, cases[i].flag, cases[i].value, NULL};
        int rc = run_cmd(argv, out, sizeof out);
        out[1000] = 0;   /* Check's messages are bounded */
        ck_assert_msg(rc == 2, "%s %s: exit %d: %s", cases[i].bin, cases[i].flag, rc, out);
        ck_assert_msg(strstr(out, cases[i].needle), "%s: no '%s' in: %s", cases[i].bin, cases[i].needle, out);
        ck_assert_msg(count_lines(out) == 1, "%s: more than one line: %s", cases[i].bin, out);
    }
    /* the plan's values make a stage's ring spec without flags */
    const char *hs[] = {test_bin("dflash-hspack"), "--run", run, "--print-ring-spec", NULL};
    ck_assert_int_eq(run_cmd(hs, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "features:slots=4,bytes=203264,"), "%s", out);

    /* rings made for the plan carry its hash; a stage that reads another plan is refused at attach */
    char log[800];
    snprintf(log, sizeof log, "%s/shm.log", run);
    const char *shm[] = {test_bin("dflash-shm"), "--run", run, NULL};
    pid_t sp = test_spawn_log(log, shm);
    char shm_json[800];
    snprintf(shm_json, sizeof shm_json, "%s/shm.json", run);
    double t0 = tr_now();
    while (access(shm_json, F_OK) != 0 && tr_now() - t0 < 20) usleep(20000);
    ck_assert_msg(access(shm_json, F_OK) == 0, "dflash-shm did not come up");
    const char *pl2[] = {test_bin("dflash-plan"), g_model, g_data, "--run", run, "--device", "cpu", "--tokens", "256",
                         "--steps", "4", "--", "--layer-types", "full,full", "--block-size", "4", NULL};
    ck_assert_msg(run_cmd(pl2, out, sizeof out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "replaces an older plan"), "%s", out);
    const char *pk[] = {test_bin("dflash-pack"), "--run", run, "--ring-wait-ms", "2000", NULL};
    int rc = run_cmd(pk, out, sizeof out);
    out[1500] = 0;
    ck_assert_msg(rc == 1 && strstr(out, "ring 'batches' was made for run plan") &&
                  strstr(out, "this stage read plan"), "exit %d: %s", rc, out);
    const char *sd[] = {test_bin("dflash-shm"), "--run", run, "--shutdown", NULL};
    ck_assert_int_eq(run_cmd(sd, out, sizeof out), 0);
    ck_assert_int_eq(tr_wait(sp), 0);
}
END_TEST

START_TEST(train_sh_plan) {
    make_inputs();
    /* the budget is typed once: the script passes dflash-plan's flags through */
    char cmd[1200], n[32] = "";
    snprintf(cmd, sizeof cmd, "grep -c -- --tokens '%s'", e2e_script("train.sh"));
    FILE *f = popen(cmd, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(n, sizeof n, f));
    pclose(f);
    ck_assert_msg(atoi(n) <= 1, "pipelines/train.sh names --tokens on %d lines", atoi(n));

    /* a 2-layer drafter with no --layers; 6 optimizer steps of 4 accumulated batches */
    char run[700], out[800], tail[4096], summary[4096], path[900];
    snprintf(run, sizeof run, "%s/train", g_base);
    snprintf(out, sizeof out, "%s.out", run);
    const char *argv[] = {"bash", e2e_script("train.sh"), g_model, g_data, "--run", run, "--device", "cpu", "--tokens",
                          "256", "--steps", "6", "--", "--grad-accum", "4", "--mask-token-id", "511", "--layer-types",
                          "full,full", "--block-size", "4", "--max-anchors", "16", "--ckpt-every", "0", NULL};
    int rc = e2e_wait(e2e_start(out, NULL, NULL, NULL, argv), 120, out, "train.sh");
    e2e_tail(out, tail, sizeof tail);
    ck_assert_msg(rc == 0, "train.sh: exit %d:\n%s", rc, tail);
    snprintf(path, sizeof path, "%s/summary.txt", run);
    e2e_slurp(path, summary, sizeof summary);
    ck_assert_msg(strstr(summary, "optimizer steps              6\n"), "%s", summary);
    /* the trainer consumed 24 batches (its summary record on the bus) in 6 optimizer steps (its log) */
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    static char log[1 << 20];
    e2e_slurp(path, log, sizeof log);
    int found = 0;
    for (char *l = log; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        size_t n = strcspn(l, "\n");
        char line[4096];
        snprintf(line, sizeof line, "%.*s", (int)(n < sizeof line ? n : sizeof line - 1), l);
        if (strstr(line, "\"kind\":\"summary\"") && strstr(line, "\"stage\":\"dflash-train\""))
            found = strstr(line, "\"items_in\":") && atof(strstr(line, "\"items_in\":") + 11) == 24.0 ? 1 : -1;
    }
    ck_assert_msg(found == 1, "dflash-train's summary record does not say 24 items in (%d)", found);
    snprintf(path, sizeof path, "%s/logs/dflash-train.log", run);
    e2e_slurp(path, log, sizeof log);
    ck_assert_msg(strstr(log, "step 5: loss") && !strstr(log, "step 6: loss"), "%s", log);
    char want[96];
    snprintf(want, sizeof want, "target layers [%s]", tiny_default_ids());
    ck_assert_msg(strstr(log, "drafter: 2 layers") && strstr(log, want), "%s", log);
    e2e_nothing_left(run, "train.sh");
}
END_TEST

/* A target whose attention shape no GPU kernel takes (head dim 96) is refused by the plan for a GPU device, before
 * any stage starts, with the shapes taken; on the CPU it plans (issue 27). */
START_TEST(gpu_shape_refused) {
    make_inputs();
    char model[700], log[800], err[1024];
    snprintf(model, sizeof model, "%s/model-hd96", g_base);
    snprintf(log, sizeof log, "%s/mkmodel-hd96.log", g_base);
    const char *mk[] = {test_bin("dflash-mkmodel"), "--preset", "tiny", "--dtype", "f32", "--threads", "1", "--head-dim",
                        "96", "--out", model, NULL};
    ck_assert_int_eq(tr_wait(test_spawn_log(log, mk)), 0);
    struct plan p;
    struct plan_inputs in = {.model = model, .data = g_data, .device = "cuda:0", .train_device = "cpu", .tokens = 256,
                             .layer_types = "full,full", .block_size = 4, .grad_accum = 1, .seed = -1};
    ck_assert_int_eq(plan_make(&in, &p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "HD=96") && strstr(err, "16, 32, 64, 128 or 256") && !strchr(err, '\n'), "%s", err);
    in.device = "cpu";
    in.train_device = "cuda:0";
    ck_assert_int_eq(plan_make(&in, &p, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "d_h=96") && strstr(err, "drafter inherits"), "%s", err);
    in.train_device = "cpu";
    ck_assert_msg(plan_make(&in, &p, err, sizeof err) == 0, "%s", err);
    in.model = g_model;   /* the tiny model's head dim 16 plans on the GPU */
    in.device = in.train_device = "cuda:0";
    ck_assert_msg(plan_make(&in, &p, err, sizeof err) == 0, "%s", err);
}
END_TEST

/* The job's device-memory plan (issue 27): dflash-plan prints it when a stage runs on a GPU and refuses a job that
 * cannot fit with one line, before writing the plan; --gpu-gb plans for a GPU this machine lacks. */
START_TEST(memory_plan_refused) {
    make_inputs();
    char run[700], out[16384], path[800];
    snprintf(run, sizeof run, "%s/mem", g_base);
    snprintf(path, sizeof path, "%s/plan.json", run);
    const char *small[] = {test_bin("dflash-plan"), g_model, g_data, "--run", run, "--device", "cuda:0", "--tokens", "256",
                           "--layer-types", "full,full", "--block-size", "4", "--gpu-gb", "0.5", "--", "--max-anchors",
                           "16", NULL};
    ck_assert_int_eq(run_cmd(small, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "memory plan: total") && strstr(out, "does NOT fit"), "%s", out);
    const char *last = out + strlen(out) - 1;
    while (last > out && last[-1] != '\n') last--;
    ck_assert_msg(strstr(last, "dflash-plan: memory plan: the job needs") && strstr(last, "short by") &&
                  strstr(last, "--tokens") && strstr(last, "--max-anchors"), "the last line: %s", last);
    ck_assert_msg(access(path, F_OK) != 0, "a refused plan was written");
    const char *fits[] = {test_bin("dflash-plan"), g_model, g_data, "--run", run, "--device", "cuda:0", "--tokens", "256",
                          "--layer-types", "full,full", "--block-size", "4", "--gpu-gb", "141", "--", "--max-anchors",
                          "16", NULL};
    ck_assert_int_eq(run_cmd(fits, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "of 141.00 GB on one GPU (fits)") && strstr(out, "reserve  CUDA contexts"), "%s", out);
    ck_assert_int_eq(access(path, F_OK), 0);
    /* a trainer alone on the GPU: its share only; target and trainer on two GPUs: each checked */
    const char *tr[] = {test_bin("dflash-plan"), g_model, g_data, "--run", run, "--device", "cpu", "--train-device",
                        "cuda:0", "--tokens", "256", "--layer-types", "full,full", "--block-size", "4", "--gpu-gb", "1",
                        NULL};
    ck_assert_int_eq(run_cmd(tr, out, sizeof out), 1);
    ck_assert_msg(strstr(out, "dflash-plan: memory plan: the trainer needs") && strstr(out, "GPU of 1.0 GB"), "%s", out);
    const char *two[] = {test_bin("dflash-plan"), g_model, g_data, "--run", run, "--device", "cuda:0", "--train-device",
                         "cuda:1", "--tokens", "256", "--layer-types", "full,full", "--block-size", "4", "--gpu-gb", "2.5",
                         NULL};
    ck_assert_int_eq(run_cmd(two, out, sizeof out), 0);
    ck_assert_msg(strstr(out, "memory plan: target cuda:0") && strstr(out, "trainer cuda:1"), "%s", out);
    /* the CPU path plans no device memory */
    const char *cpu[] = {test_bin("dflash-plan"), g_model, g_data, "--run", run, "--device", "cpu", "--tokens", "256",
                         "--layer-types", "full,full", "--block-size", "4", "--gpu-gb", "0.5", NULL};
    ck_assert_int_eq(run_cmd(cpu, out, sizeof out), 0);
    ck_assert_msg(!strstr(out, "memory plan"), "%s", out);
}
END_TEST

int main(void) {
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 200);
    tcase_add_unchecked_fixture(tc, make_inputs, NULL);
    tcase_add_test(tc, binding);
    tcase_add_test(tc, make_write_read);
    tcase_add_test(tc, stages_refuse_conflicts);
    tcase_add_test(tc, train_sh_plan);
    tcase_add_test(tc, gpu_shape_refused);
    tcase_add_test(tc, memory_plan_refused);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
