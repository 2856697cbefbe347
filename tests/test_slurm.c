/*
 * tests/test_slurm.c — several hosts (issue 29, topology (c)): pipelines/slurm-train.sh run under a fake srun
 * (tests/fake-slurm/srun, first on PATH, starting each "node"'s task as a local process with SLURM_PROCID,
 * SLURM_NODEID, ... set) in a fake 2-node allocation (SLURM_JOB_ID, SLURM_NNODES, SLURM_JOB_NODELIST), on the tiny
 * CPU model:
 *   - plan_hosts: the plan's ranks/hosts keys, their conflicts refused with one line, a host plan (same hash);
 *   - shard_window: the seq shard arithmetic and dflash-hspack's reorder window stepping over other hosts' seqs;
 *   - two_hosts: 2 host chains (each packing every batch, publishing its rank's seqs) and 2 trainer ranks launched
 *     by mpirun inside the allocation (Open MPI starts its daemons through the fake srun) end bit-identical (final
 *     checkpoint and z-lab export bytes) to one host, one rank, --grad-accum 2; then rank 1 SIGKILLed mid-run:
 *     every rank stops, the host chains are restarted for the next round, and the run (or the same command run
 *     again) still ends bit-identical; host 1's dflash-hspack SIGKILLed mid-run is restarted alone by its host chain
 *     and the end is the same too.
 * What the fake srun cannot test: a real Slurm controller, separate machines (every "node" shares this host's
 * /dev/shm, hostname and loopback network), GPUs and NCCL between nodes.
 */
#include "core/shard.h"
#include "hspack/hspack.h"
#include "plan/plan.h"

#include "test_e2e_util.h"
#include "testutil.h"

#include <check.h>
#include <dirent.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static char g_model[600], g_data[600], g_base[512], g_fake[PATH_MAX];

static void make_inputs(void) {
    if (g_model[0]) return;
    e2e_tiny_inputs("slurm", g_base, g_model, g_data);
    /* the fake srun's directory, absolute (the script and mpirun find srun through PATH) */
    char rel[PATH_MAX];
    snprintf(rel, sizeof rel, "%s", e2e_script("../tests/fake-slurm/srun"));
    ck_assert_msg(realpath(rel, g_fake) != NULL, "no fake srun at %s", rel);
    *strrchr(g_fake, '/') = 0;
}

/* the trainer flags of every run here: 12 steps x 2 batches, as tests/test_scale.c */
#define TRAIN_FLAGS(ckpt) "--", "--grad-accum", "2", "--mask-token-id", "511", "--layer-types", "full,full", \
    "--block-size", "4", "--max-anchors", "16", "--optimizer", "adamw", "--lr", "5e-3", "--ckpt-every", ckpt

static pid_t start_one_host(const char *run) {
    char out[800];
    snprintf(out, sizeof out, "%s.out", run);
    const char *argv[] = {"bash", e2e_script("train.sh"), g_model, g_data, "--run", run, "--device", "cpu", "--tokens",
                          "256", "--steps", "12", TRAIN_FLAGS("0"), NULL};
    return e2e_start(out, NULL, "0", NULL, argv);
}

/* slurm-train.sh in a fake 2-node allocation: the batch script's environment as sbatch sets it, the fake srun
 * first on PATH. */
static pid_t start_two_hosts(const char *run, const char *ckpt_every) {
    char out[800], path[PATH_MAX + 4200], log[800], steps[800];
    snprintf(out, sizeof out, "%s.out", run);
    snprintf(log, sizeof log, "%s.srun.log", run);
    snprintf(steps, sizeof steps, "%s.srun.steps", run);
    snprintf(path, sizeof path, "%s:%s", g_fake, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    setenv("PATH", path, 1);
    setenv("SLURM_JOB_ID", "4242", 1);
    setenv("SLURM_JOBID", "4242", 1);
    setenv("SLURM_NNODES", "2", 1);
    setenv("SLURM_JOB_NUM_NODES", "2", 1);
    setenv("SLURM_JOB_NODELIST", "fakenode[0-1]", 1);
    setenv("SLURM_NODELIST", "fakenode[0-1]", 1);
    setenv("SLURM_TASKS_PER_NODE", "1(x2)", 1);
    setenv("SLURM_JOB_CPUS_PER_NODE", "1(x2)", 1);
    setenv("SLURM_NODEID", "0", 1);   /* the batch script runs on the allocation's first node */
    setenv("FAKE_SRUN_LOG", log, 1);
    setenv("FAKE_SRUN_STEPS", steps, 1);
    unsetenv("SLURM_STEP_NUM_TASKS");   /* a batch script is no step: dflash-train must not read it */
    const char *argv[] = {"bash", e2e_script("slurm-train.sh"), g_model, g_data, "--run", run, "--ranks-per-node", "1",
                          "--device", "cpu", "--tokens", "256", "--steps", "12", TRAIN_FLAGS(ckpt_every), NULL};
    return e2e_start(out, NULL, "0", NULL, argv);
}

/* nothing of the run, its host directories included, is left (processes, segments) */
static void nothing_left(const char *run, const char *what) {
    char h[800];
    e2e_nothing_left(run, what);
    for (int i = 0; i < 2; i++) {
        snprintf(h, sizeof h, "%s/hosts/%d", run, i);
        e2e_nothing_left(h, what);
    }
}

START_TEST(plan_hosts) {
    make_inputs();
    char err[1024];
    struct plan_inputs in = {.model = g_model, .data = g_data, .device = "cpu", .tokens = 256, .layer_types = "full,full",
                             .block_size = 4, .steps = 3, .seed = -1, .grad_accum = 4};
    struct plan one, p, hp, q;
    ck_assert_msg(plan_make(&in, &one, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(one.ranks, 1);
    ck_assert_int_eq(one.hosts, 1);
    ck_assert_int_eq(one.host, -1);
    in.ranks = 4;
    in.hosts = 2;
    ck_assert_msg(plan_make(&in, &p, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_ne(p.hash, one.hash);   /* ranks and hosts are the run's geometry */
    ck_assert_int_eq(plan_rank_host(&p, 0), 0);
    ck_assert_int_eq(plan_rank_host(&p, 1), 0);
    ck_assert_int_eq(plan_rank_host(&p, 2), 1);
    ck_assert_int_eq(plan_rank_host(&p, 3), 1);
    /* host 1's plan: the run's hash (its rings are accepted by the ranks, which read the run's plan), its shard */
    ck_assert_msg(plan_for_host(&p, 1, &hp, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(plan_compute_hash(&hp), p.hash);
    struct seq_shard sh;
    plan_shard(&hp, &sh);
    ck_assert(sh.period == 4 && sh.lo == 2 && sh.hi == 4);
    plan_shard(&p, &sh);
    ck_assert(seq_shard_is_all(&sh));
    char path[800], text[8192];
    snprintf(path, sizeof path, "%s/host-plan.json", g_base);
    ck_assert_msg(plan_write(&hp, path, err, sizeof err) == 0, "%s", err);
    e2e_slurp(path, text, sizeof text);
    ck_assert_msg(strstr(text, "\"ranks\": 4") && strstr(text, "\"hosts\": 2") && strstr(text, "\"host\": 1"), "%s", text);
    ck_assert_msg(plan_read(path, 1, &q, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(q.host, 1);
    ck_assert_uint_eq(q.hash, p.hash);
    /* conflicts: one sentence each */
    ck_assert_int_eq(plan_for_host(&hp, 0, &q, err, sizeof err), -1);    /* a host plan of a host plan */
    ck_assert_msg(strstr(err, "host 1's plan"), "%s", err);
    ck_assert_int_eq(plan_for_host(&p, 2, &q, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "outside the plan's 2 hosts"), "%s", err);
    ck_assert_int_eq(plan_for_host(&one, 0, &q, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "no hosts"), "%s", err);
    in.ranks = 3;
    ck_assert_int_eq(plan_make(&in, &q, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "3 trainer ranks do not divide over 2 hosts"), "%s", err);
    in.ranks = 8;
    ck_assert_int_eq(plan_make(&in, &q, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "grad_accum 4") && strstr(err, "8 trainer ranks"), "%s", err);
    /* a hand-edited host key outside the hosts, or without hosts, is refused on read */
    char *h1 = strstr(text, "\"host\": 1");
    ck_assert_ptr_nonnull(h1);
    h1[8] = '7';
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    ck_assert_int_eq(plan_read(path, 0, &q, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "host 7 is outside the plan's 2 hosts"), "%s", err);
}
END_TEST

START_TEST(shard_window) {
    struct seq_shard s;
    ck_assert_int_eq(seq_shard_host(&s, 6, 3, 1), 0);   /* 6 ranks on 3 hosts: host 1 has ranks 2, 3 */
    uint64_t want[] = {2, 3, 8, 9, 14, 15};
    uint64_t seq = 0;
    for (int i = 0; i < 6; i++) {
        seq = seq_shard_next(&s, seq);
        ck_assert_uint_eq(seq, want[i]);
        ck_assert(seq_shard_owns(&s, seq));
        seq++;
    }
    ck_assert(!seq_shard_owns(&s, 4) && !seq_shard_owns(&s, 7));
    ck_assert_int_eq(seq_shard_host(&s, 5, 2, 0), -1);
    ck_assert_int_eq(seq_shard_host(&s, 4, 2, 2), -1);

    /* the reorder window of host 1 of 2 (2 ranks): starting at seq 4 (a resume) it expects 5, 7, 9, ... */
    char err[512];
    struct hspack_window w;
    ck_assert_int_eq(hspack_window_init(&w, 3, 0, 4, err, sizeof err), 0);
    ck_assert_int_eq(seq_shard_host(&s, 2, 2, 1), 0);
    ck_assert_msg(hspack_window_set_shard(&w, &s, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(w.next, 5);
    ck_assert_int_eq(hspack_window_put(&w, 7, HSPACK_HELD, 0, err, sizeof err), 0);   /* out of order */
    ck_assert_ptr_null(hspack_window_peek(&w));
    ck_assert_int_eq(hspack_window_put(&w, 6, HSPACK_HELD, 1, err, sizeof err), -1);  /* another host's seq */
    ck_assert_msg(strstr(err, "seq 6 is not this chain's"), "%s", err);
    ck_assert_int_eq(hspack_window_put(&w, 5, HSPACK_HELD, 1, err, sizeof err), 0);
    struct hspack_entry e;
    ck_assert_int_eq(hspack_window_take(&w, &e), 0);
    ck_assert_uint_eq(e.seq, 5);
    ck_assert_uint_eq(w.next, 7);   /* over 6 */
    ck_assert_int_eq(hspack_window_take(&w, &e), 0);
    ck_assert_uint_eq(e.seq, 7);
    ck_assert_uint_eq(w.next, 9);
    ck_assert(hspack_window_is_dup(&w, 7));
    ck_assert_int_eq(hspack_window_put(&w, 9, HSPACK_HELD, 0, err, sizeof err), 0);
    ck_assert_int_eq(hspack_window_set_shard(&w, &s, err, sizeof err), -1);   /* not on a window holding seqs */
}
END_TEST

/* A trainer rank must run where its host's chain runs (RUN/hosts/H/node), and the world must be the plan's ranks:
 * each refused with one line before anything is loaded. */
START_TEST(ranks_refused) {
    make_inputs();
    char run[700], cmd[8192], log[800];
    static char buf[1 << 16];
    snprintf(run, sizeof run, "%s/refuse", g_base);
    snprintf(log, sizeof log, "%s/refuse.log", g_base);
    const char *bin = getenv("DFLASH_BIN") ? getenv("DFLASH_BIN") : "build/bin";
    snprintf(cmd, sizeof cmd, "( %s/dflash-plan %s %s --run %s --hosts 2 --ranks 2 --device cpu --tokens 256 --steps 2 "
             "-- --grad-accum 2 --layer-types full,full --block-size 4 && %s/dflash-plan --run %s/hosts/1 --from %s "
             "--host 1 && mkdir -p %s/hosts/0 && hostname >%s/hosts/0/node && echo elsewhere >%s/hosts/1/node ) >%s 2>&1",
             bin, g_model, g_data, run, bin, run, run, run, run, run, log);
    ck_assert_msg(system(cmd) == 0, "making the plans failed: see %s", log);
    /* world 1 against the plan's 2 ranks */
    snprintf(cmd, sizeof cmd, "%s/dflash-train --run %s --mask-token-id 511 --max-anchors 16 >%s 2>&1", bin, run, log);
    ck_assert_int_ne(system(cmd), 0);
    e2e_slurp(log, buf, sizeof buf);
    ck_assert_msg(strstr(buf, "says 2 trainer ranks but this one was launched as rank 0 of 1"), "%s", buf);
    /* rank 1 where host 1's chain is not */
    if (system("command -v mpirun >/dev/null 2>&1") != 0) ck_abort_msg("mpirun not found (openmpi-bin)");
    snprintf(cmd, sizeof cmd, "env -u SLURM_JOB_ID -u SLURM_JOBID -u SLURM_NNODES -u SLURM_JOB_NODELIST mpirun -np 2 "
             "--oversubscribe --bind-to none %s %s/dflash-train --run %s --mask-token-id 511 --max-anchors 16 >%s 2>&1",
             getuid() == 0 ? "--allow-run-as-root" : "", bin, run, log);
    ck_assert_int_ne(system(cmd), 0);
    e2e_slurp(log, buf, sizeof buf);
    ck_assert_msg(strstr(buf, "rank 1 runs on node ") && strstr(buf, "but host 1's chain (whose rings it reads) runs on "
                  "node elsewhere"), "%s", buf);
    ck_assert_msg(!strstr(buf, "rank 0 runs on node"), "rank 0 is where host 0's chain is:\n%s", buf);
}
END_TEST

START_TEST(two_hosts) {
    make_inputs();
    if (system("command -v mpirun >/dev/null 2>&1") != 0)
        ck_abort_msg("mpirun not found: Open MPI comes from scripts/install-deps.sh (openmpi-bin)");
    char one[700], two[700], rkill[700], path[1000];
    static char buf[1 << 18];
    snprintf(one, sizeof one, "%s/one", g_base);
    snprintf(two, sizeof two, "%s/two", g_base);
    snprintf(rkill, sizeof rkill, "%s/rank-kill", g_base);

    double t0 = now_s();
    e2e_finish(start_one_host(one), one, "1 host, 1 rank, --grad-accum 2", 150, NULL, 0);
    nothing_left(one, "1 host");
    double t1 = now_s();
    e2e_finish(start_two_hosts(two, "0"), two, "slurm-train.sh, 2 fake hosts", 150, NULL, 0);
    double t2 = now_s();
    /* the plan says 2 hosts and 2 ranks; each host ran its chain in its own directory on its own rings */
    snprintf(path, sizeof path, "%s/plan.json", two);
    e2e_slurp(path, buf, sizeof buf);
    ck_assert_msg(strstr(buf, "\"ranks\": 2") && strstr(buf, "\"hosts\": 2") && !strstr(buf, "\"host\":"), "%s", buf);
    for (int h = 0; h < 2; h++) {
        snprintf(path, sizeof path, "%s/hosts/%d/plan.json", two, h);
        e2e_slurp(path, buf, sizeof buf);
        char want[80];
        snprintf(want, sizeof want, "\"host\": %d", h);
        ck_assert_msg(strstr(buf, want), "%s: %s", path, buf);
        /* the packer packed all 24 batches and published its host's 12; hspack expected exactly those */
        snprintf(path, sizeof path, "%s/hosts/%d/logs/dflash-pack.out", two, h);
        e2e_slurp(path, buf, sizeof buf);
        snprintf(want, sizeof want, "publishes the seqs s with %d <= s %% 2 < %d", h, h + 1);
        ck_assert_msg(strstr(buf, want) && strstr(buf, "24 batches (0 of them val; 12 of other hosts not published)"),
                      "host %d's packer:\n%.3000s", h, buf);
        snprintf(path, sizeof path, "%s/hosts/%d/logs/dflash-hspack.out", two, h);
        e2e_slurp(path, buf, sizeof buf);
        ck_assert_msg(strstr(buf, "end of stream: 12 items out"), "host %d's hspack:\n%.3000s", h, buf);
    }
    /* each rank read its host's rings; Open MPI started its daemons through srun (its Slurm launch path) */
    snprintf(path, sizeof path, "%s/logs/dflash-train.out", two);
    e2e_slurp(path, buf, sizeof buf);
    ck_assert_msg(strstr(buf, "rank 0 of 2: host 0 of 2 of the plan") && strstr(buf, "rank 1 of 2: host 1 of 2 of the plan"),
                  "the ranks' host directories:\n%.3000s", buf);
    snprintf(path, sizeof path, "%s.srun.log", two);
    e2e_slurp(path, buf, sizeof buf);
    ck_assert_msg(strstr(buf, "2 tasks: bash ") && strstr(buf, "--host-chain") && strstr(buf, "2 tasks: orted ") &&
                  strstr(buf, "(srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 --overlap bash "),
                  "the fake srun's steps:\n%s", buf);
    e2e_assert_same_run(one, two, "2 hosts x 1 rank vs 1 host, 1 rank, --grad-accum 2");
    nothing_left(two, "2 hosts");
    fprintf(stderr, "test_slurm: slurm-train.sh on 2 fake hosts == 1 host, 1 rank --grad-accum 2: bit-identical "
            "(%.1f s vs %.1f s)\n", t2 - t1, t1 - t0);

    /* host 1's dflash-hspack SIGKILLed after step 2: its host chain restarts it alone (its window resumes at host 1's
     * next seq, stepping over host 0's), no round restart, and the end is the same */
    char hkill[700], hdir[800];
    snprintf(hkill, sizeof hkill, "%s/hspack-kill", g_base);
    snprintf(hdir, sizeof hdir, "%s/hosts/1", hkill);
    pid_t p = start_two_hosts(hkill, "0");
    e2e_wait_step(hkill, 2, p, "hspack kill");
    int hp = e2e_read_pid(hdir, "dflash-hspack");
    ck_assert_int_gt(hp, 0);
    ck_assert_int_eq(kill(hp, SIGKILL), 0);
    e2e_finish(p, hkill, "hspack kill on host 1", 150, NULL, 0);
    snprintf(path, sizeof path, "%s/logs/hosts.out", hkill);
    e2e_slurp(path, buf, sizeof buf);
    ck_assert_msg(strstr(buf, "dflash-hspack died of signal 9; starting it again"), "hspack kill:\n%.3000s", buf);
    snprintf(path, sizeof path, "%s.out", hkill);
    e2e_slurp(path, buf, sizeof buf);
    ck_assert_msg(!strstr(buf, "restarting the chain"), "a host's hspack death restarted the round:\n%.3000s", buf);
    e2e_assert_same_run(one, hkill, "host 1's hspack killed vs 1 host, 1 rank --grad-accum 2");
    nothing_left(hkill, "hspack kill");
    double t3 = now_s();
    fprintf(stderr, "test_slurm: host 1's dflash-hspack SIGKILLed after step 2: restarted alone, bit-identical (%.1f s)\n",
            t3 - t2);

    /* rank 1 (on fake host 1) SIGKILLed after step 4 (checkpoints every 3 steps): mpirun stops rank 0 and names
     * rank 1; the script stops both host chains and starts the next round from rank 0's checkpoint (or, when
     * mpirun's status is not a death, the same command again resumes) */
    p = start_two_hosts(rkill, "3");
    e2e_wait_step(rkill, 4, p, "rank kill");
    int rp = 0;
    for (int i = 0; i < 100 && !rp; i++) { rp = e2e_rank_pid(rkill, 1); if (!rp) usleep(20000); }
    ck_assert_msg(rp > 0, "rank kill: no process of rank 1 found");
    ck_assert_int_eq(kill(rp, SIGKILL), 0);
    snprintf(path, sizeof path, "%s.out", rkill);
    int rc = e2e_wait(p, 150, path, "rank kill");
    if (rc != 0)
        e2e_finish(start_two_hosts(rkill, "3"), rkill, "rank kill, the same command again", 150, NULL, 0);
    e2e_slurp(path, buf, sizeof buf);
    ck_assert_msg(strstr(buf, "process rank 1 "), "rank kill: no line names rank 1:\n%.3000s", buf);
    ck_assert_msg(strstr(buf, "round 4242.1.2") || strstr(buf, "round 4242.2.1"),
                  "rank kill: no second round of host chains:\n%.3000s", buf);
    e2e_assert_same_run(one, rkill, "rank 1 killed on host 1 vs 1 host, 1 rank --grad-accum 2");
    nothing_left(rkill, "rank kill");
    fprintf(stderr, "test_slurm: trainer rank 1 SIGKILLed after step 4: every host chain restarted, resumed, "
            "bit-identical (%.1f s)\n", now_s() - t3);
}
END_TEST

int main(void) {
    Suite *s = suite_create("slurm");
    TCase *tc = tcase_create("slurm");
    tcase_set_timeout(tc, 400);
    tcase_add_unchecked_fixture(tc, make_inputs, NULL);
    tcase_add_test(tc, plan_hosts);
    tcase_add_test(tc, shard_window);
    tcase_add_test(tc, ranks_refused);
    tcase_add_test(tc, two_hosts);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
