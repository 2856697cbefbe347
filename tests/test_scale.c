/*
 * tests/test_scale.c — scaling stages separately (issue 29), on the CPU path with the tiny model:
 *   - replicas: pipelines/train.sh --target-replicas 2 (two dflash-target processes sharing the batches ring,
 *     publishing into hidden out of order, dflash-hspack restoring the order) ends with the same final
 *     checkpoint and z-lab export bytes as one replica;
 *   - replica kill: the same with replica 1 SIGKILLed mid-run; the supervisor restarts it alone (the ring's
 *     recovery gives back what it held) and the run still ends bit-identical;
 *   - trainer ranks: train.sh --ranks 2 (mpirun -np 2, each rank taking one of a step's 2 micro-batches) ends
 *     bit-identical to one rank with --grad-accum 2; rank 1 SIGKILLed mid-run stops the job with a line naming
 *     rank 1 and the resumed run still ends bit-identical.
 */
#include "plan/plan.h"

#include "test_e2e_util.h"
#include "testutil.h"

#include <check.h>
#include <dirent.h>

static char g_model[600], g_data[600], g_base[512];

static void make_inputs(void) {
    if (g_model[0]) return;
    e2e_tiny_inputs("scale", g_base, g_model, g_data);
}

/* Start train.sh on the tiny model into RUN with R target replicas (12 steps x 2 accumulated batches). */
static pid_t start_train_ranks(const char *run, const char *replicas, const char *ranks, const char *ckpt_every) {
    char out[800];
    snprintf(out, sizeof out, "%s.out", run);
    const char *argv[] = {"bash", e2e_script("train.sh"), g_model, g_data, "--run", run, "--device", "cpu", "--tokens",
                          "256", "--steps", "12", "--target-replicas", replicas, "--ranks", ranks, "--", "--grad-accum", "2",
                          "--mask-token-id", "511", "--layer-types", "full,full", "--block-size", "4", "--max-anchors",
                          "16", "--optimizer", "adamw", "--lr", "5e-3", "--ckpt-every", ckpt_every, NULL};
    return e2e_start(out, NULL, "0", NULL, argv);
}

static pid_t start_train(const char *run, const char *replicas) { return start_train_ranks(run, replicas, "1", "0"); }

START_TEST(replicas) {
    make_inputs();
    char one[700], two[700], killed[700], tail[4096], path[900], plan[8192];
    snprintf(one, sizeof one, "%s/one", g_base);
    snprintf(two, sizeof two, "%s/two", g_base);
    snprintf(killed, sizeof killed, "%s/killed", g_base);

    e2e_finish(start_train(one, "1"), one, "1 replica", 180, tail, sizeof tail);
    e2e_nothing_left(one, "1 replica");

    e2e_finish(start_train(two, "2"), two, "2 replicas", 180, tail, sizeof tail);
    /* two processes ran; each batch was claimed by exactly one of them: their counts add up to the 24 batches */
    long in[2];
    for (int i = 0; i < 2; i++) {
        static char log[1 << 16];
        snprintf(path, sizeof path, "%s/logs/dflash-target.%d.out", two, i);
        e2e_slurp(path, log, sizeof log);
        const char *e = strstr(log, "end of stream: ");
        ck_assert_msg(e, "replica %d did not reach the end of the stream:\n%.1500s", i, log);
        in[i] = atol(e + 15);
    }
    ck_assert_msg(in[0] + in[1] == 24, "replicas took %ld + %ld batches, expected 24 in all", in[0], in[1]);
    fprintf(stderr, "test_scale: replica 0 took %ld batches, replica 1 %ld\n", in[0], in[1]);
    snprintf(path, sizeof path, "%s/plan.json", two);
    e2e_slurp(path, plan, sizeof plan);
    ck_assert_msg(strstr(plan, "\"target_replicas\": 2") && strstr(plan, "producers=2"), "%s", plan);
    e2e_assert_same_run(one, two, "2 replicas vs 1");
    e2e_nothing_left(two, "2 replicas");
    fprintf(stderr, "test_scale: --target-replicas 2 == 1 replica: bit-identical\n");

    /* replica 1 SIGKILLed mid-run: restarted alone, nothing lost */
    pid_t p = start_train(killed, "2");
    e2e_wait_step(killed, 2, p, "replica kill");
    int tp = e2e_read_pid(killed, "dflash-target.1");
    ck_assert_int_gt(tp, 0);
    ck_assert_int_eq(kill(tp, SIGKILL), 0);
    e2e_finish(p, killed, "replica kill", 180, tail, sizeof tail);
    snprintf(path, sizeof path, "%s.out", killed);
    static char all[1 << 16];
    e2e_slurp(path, all, sizeof all);
    ck_assert_msg(strstr(all, "dflash-target.1 died of signal 9; starting it again"), "%s", tail);
    ck_assert_msg(!strstr(all, "restarting the chain"), "a replica's death restarted the chain:\n%s", tail);
    e2e_assert_same_run(one, killed, "replica 1 killed vs 1 replica");
    e2e_nothing_left(killed, "replica kill");
    fprintf(stderr, "test_scale: replica 1 SIGKILLed after step 2: restarted alone, bit-identical\n");

    /* 2 trainer ranks (mpirun), each taking one of the step's 2 micro-batches: the 1-rank --grad-accum 2 run */
    if (access("/usr/bin/mpirun", X_OK) != 0 && system("command -v mpirun >/dev/null 2>&1") != 0)
        ck_abort_msg("mpirun not found: Open MPI comes from scripts/install-deps.sh (openmpi-bin)");
    char ranks[700], rkill[700];
    snprintf(ranks, sizeof ranks, "%s/ranks", g_base);
    e2e_finish(start_train_ranks(ranks, "1", "2", "0"), ranks, "2 ranks", 180, tail, sizeof tail);
    snprintf(path, sizeof path, "%s/logs/dflash-train.out", ranks);
    static char tlog[1 << 18];
    e2e_slurp(path, tlog, sizeof tlog);
    ck_assert_msg(strstr(tlog, "rank 0 of 2: initial weights identical") && strstr(tlog, "rank 1 of 2: initial weights "
                  "identical"), "2 ranks: the ranks did not both start:\n%.2000s", tlog);
    e2e_assert_same_run(one, ranks, "2 ranks vs 1 rank --grad-accum 2");
    e2e_nothing_left(ranks, "2 ranks");
    fprintf(stderr, "test_scale: 2 MPI ranks == 1 rank with --grad-accum 2: bit-identical\n");

    /* rank 1 SIGKILLed after step 4 (checkpoints every 3 steps): mpirun stops rank 0 and names rank 1; the run
     * resumes every rank from rank 0's checkpoint (the script restarts the chain, or the same command again) */
    snprintf(rkill, sizeof rkill, "%s/rank-kill", g_base);
    p = start_train_ranks(rkill, "1", "2", "3");
    e2e_wait_step(rkill, 4, p, "rank kill");
    int rp = 0;
    for (int i = 0; i < 100 && !rp; i++) { rp = e2e_rank_pid(rkill, 1); if (!rp) usleep(20000); }
    ck_assert_msg(rp > 0, "rank kill: no process of rank 1 found");
    ck_assert_int_eq(kill(rp, SIGKILL), 0);
    snprintf(path, sizeof path, "%s.out", rkill);
    int rc = e2e_wait(p, 180, path, "rank kill");
    if (rc != 0)
        e2e_finish(start_train_ranks(rkill, "1", "2", "3"), rkill, "rank kill, the same command again", 180, tail,
                   sizeof tail);
    e2e_slurp(path, all, sizeof all);
    ck_assert_msg(strstr(all, "process rank 1 "), "rank kill: no line names rank 1:\n%.3000s", all);
    e2e_assert_same_run(one, rkill, "rank 1 killed vs 1 rank --grad-accum 2");
    e2e_nothing_left(rkill, "rank kill");
    fprintf(stderr, "test_scale: trainer rank 1 SIGKILLed after step 4: stopped, resumed, bit-identical\n");
}
END_TEST

START_TEST(plan_replicas) {
    make_inputs();
    char err[1024];
    struct plan_inputs in = {.model = g_model, .data = g_data, .device = "cpu", .tokens = 256, .layer_types = "full,full",
                             .block_size = 4, .steps = 3, .seed = -1};
    struct plan p1, p3;
    ck_assert_msg(plan_make(&in, &p1, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(p1.target_replicas, 1);
    ck_assert_ptr_null(strstr(p1.rings[1], "producers="));
    in.target_replicas = 3;
    ck_assert_msg(plan_make(&in, &p3, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(p3.target_replicas, 3);
    /* hidden: producers=3 (the first replica to end cannot end the stream) and 2 more slots (one held per replica) */
    ck_assert_msg(strstr(p3.rings[1], ",producers=3"), "%s", p3.rings[1]);
    ck_assert_msg(strstr(p3.rings[1], "slots=6,"), "%s", p3.rings[1]);
    ck_assert_uint_ne(p1.hash, p3.hash);
    char path[800];
    snprintf(path, sizeof path, "%s/plan3.json", g_base);
    ck_assert_msg(plan_write(&p3, path, err, sizeof err) == 0, "%s", err);
    struct plan q;
    ck_assert_msg(plan_read(path, 1, &q, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(q.target_replicas, 3);
    ck_assert_uint_eq(q.hash, p3.hash);
    in.target_replicas = PLAN_MAX_TARGET_REPLICAS + 1;
    ck_assert_int_eq(plan_make(&in, &q, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "target replicas"), "%s", err);
}
END_TEST

int main(void) {
    Suite *s = suite_create("scale");
    TCase *tc = tcase_create("scale");
    tcase_set_timeout(tc, 600);
    tcase_add_unchecked_fixture(tc, make_inputs, NULL);
    tcase_add_test(tc, plan_replicas);
    tcase_add_test(tc, replicas);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
