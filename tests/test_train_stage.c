/*
 * tests/test_train_stage.c — dflash-train as a process (issue 16 items 4-6), on the tiny model of
 * dflash-mkmodel (H 64, vocab 512, 4 layers; captured layers 1,3), CPU, --tokens 512, a 2-layer
 * drafter with block 4 and 16 anchors.
 *
 * - pipeline_and_exact_resume: the real pipeline dflash-shm + dflash-metrics + dflash-pack
 *   (--val-frac 0.1 --val-every 4) + dflash-target + dflash-hspack + dflash-train.
 *   Run A reaches --max-steps 30: checkpoints step-8/16/24/30, state/train.json (step 30, next_seq =
 *   30 train seqs + whole validation passes), per-step metric records and one val record per pass
 *   in metrics.jsonl. Run B: dflash-train is SIGKILLed between checkpoints, every stage and the
 *   rings are dropped, the pipeline restarts on fresh rings from the seq the trainer asks for
 *   (state/train.json, read back by dflash-train --print-next-seq; dflash-pack --resume-from-seq,
 *   dflash-hspack --start-seq) and dflash-train
 *   --resume prints that seq; its final checkpoint equals A's byte for byte (weights, optimizer
 *   state, guard, step, next_seq), and so do the exports. The val records with val_batches = V show
 *   that the batch descriptor's split travelled through dflash-target and dflash-hspack.
 * - A test producer writes features items into the ring directly for the rest:
 *   bad_features (k, H, layer ids, layout that do not match the drafter; features of another target of the
 *   same shape, issue 24; token ids outside the target's vocabulary), bad_target_and_mask (a mask
 *   token outside the embedding, a target directory whose embedding does not match its config),
 *   checkpoints (a truncated newest checkpoint is skipped with a log line naming it and the older
 *   one is used; a checkpoint of another configuration is refused naming the field, nothing
 *   overwritten), nonfinite (a NaN features item: --max-nonfinite 1 stops with the line naming the
 *   step, --max-nonfinite 2 skips that step and finishes).
 * - short_stream_fails / resume_at_max_steps_exports (issue 24): a stream ending before --max-steps (or with a
 *   partial --grad-accum accumulation) fails with one line; a resume at --max-steps writes the exports again.
 * Every failure must be exit 1 with exactly one error line.
 */
#include "core/desc.h"
#include "shm/ring.h"
#include "test_ring_util.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>

static char g_dir[600], g_model[700], g_badmodel[700], g_data[700], g_othermodel[700];

#define TOKENS "512"
#define H 64

static int run_wait(const char *log, const char *const argv[]) {
    pid_t pid = fork();
    if (pid < 0) return -1;
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

static int count_str(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, what)) != NULL; p++) n++;
    return n;
}

/* Wait for pid to exit within secs (SIGKILL and fail otherwise); returns the exit status. */
static int wait_for(pid_t pid, double secs, const char *what) {
    double t0 = tr_now();
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (tr_now() - t0 > secs) {
            kill(pid, SIGKILL);
            tr_wait(pid);
            ck_abort_msg("%s did not finish within %.0f s", what, secs);
        }
        usleep(5000);
    }
}

static void stop(pid_t pid, int sig) {
    if (pid <= 0) return;
    kill(pid, sig);
    tr_wait(pid);
}

/* dflash-shm for run with the given rings (NULL-terminated), host payloads; waits until running. */
static pid_t start_shm(const char *run, const char *const rings[]) {
    const char *argv[16] = {test_bin("dflash-shm"), "--run", run, "--host-only"};
    int n = 4;
    for (int i = 0; rings[i]; i++) { argv[n++] = "--ring"; argv[n++] = rings[i]; }
    argv[n] = NULL;
    char log[800], path[800];
    snprintf(log, sizeof log, "%s.shm.log", run);
    pid_t pid = test_spawn_log(log, argv);
    snprintf(path, sizeof path, "%s/shm.json", run);
    double t0 = tr_now();
    for (;;) {
        char *s = test_slurp(path, NULL);
        int ok = s && strstr(s, "\"running\"");
        free(s);
        if (ok) return pid;
        int st;
        ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "dflash-shm exited during start-up");
        ck_assert_msg(tr_now() - t0 < 10, "dflash-shm did not come up");
        usleep(5000);
    }
}

static void shutdown_shm(const char *run, pid_t pid) {
    const char *argv[] = {test_bin("dflash-shm"), "--run", run, "--shutdown", NULL};
    char log[800];
    snprintf(log, sizeof log, "%s.shm.log", run);
    ck_assert_int_eq(run_wait(log, argv), 0);
    ck_assert_int_eq(wait_for(pid, 10, "dflash-shm"), 0);
}

#define FEATURES_SPEC "features:slots=2,bytes=406272,desc=2048,dev=host"
static const char *const g_rings3[] = {"batches:slots=4,bytes=12804,desc=232,dev=host",
                                       "hidden:slots=2,bytes=406272,desc=2048,dev=host", FEATURES_SPEC, NULL};
static const char *const g_rings1[] = {FEATURES_SPEC, NULL};

/* Spawn a stage with its output appended to <run>.<tag>.log; extra is NULL-terminated. */
static pid_t spawn(const char *run, const char *tag, const char *bin, const char *const extra[]) {
    const char *argv[64] = {test_bin(bin), "--run", run};
    int n = 3;
    for (int i = 0; extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    char log[800];
    snprintf(log, sizeof log, "%s.%s.log", run, tag);
    return test_spawn_log(log, argv);
}

/* dflash-train with the suite's drafter and extra flags (NULL-terminated). */
static pid_t spawn_train(const char *run, const char *tag, const char *model, const char *const extra[]) {
    const char *argv[64] = {"--device", "cpu", "--target-model", model, "--tokens", TOKENS, "--target-layer-ids", "1,3",
                            "--block-size", "4", "--max-anchors", "16", "--layer-types", "sliding,sliding",
                            "--sliding-window", "64", "--mask-token-id", "511", "--heartbeat-s", "0.2"};
    int n = 20;
    for (int i = 0; extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    return spawn(run, tag, "dflash-train", argv);
}

static char *read_log(const char *run, const char *tag) {
    char path[800];
    snprintf(path, sizeof path, "%s.%s.log", run, tag);
    char *s = test_slurp(path, NULL);
    ck_assert_msg(s != NULL, "no %s", path);
    return s;
}

/* The log has exactly one error line (" E dflash-train[") and it contains want. */
static void expect_one_error(const char *log, const char *want) {
    ck_assert_msg(count_str(log, " E dflash-train[") == 1, "expected one error line, log:\n%s", log);
    const char *e = strstr(log, " E dflash-train[");
    const char *eol = strchr(e, '\n');
    ck_assert_msg(strstr(e, want) && (!eol || strstr(e, want) < eol), "the error line lacks '%s':\n%s", want, log);
}

static int64_t json_int(const char *text, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(text, k);
    ck_assert_msg(p != NULL, "no %s in %s", key, text);
    return strtoll(p + strlen(k), NULL, 10);
}

/* Files in <run>/checkpoints (0 when it is missing or empty). */
static int count_ckpts(const char *run) {
    char path[900];
    snprintf(path, sizeof path, "%s/checkpoints", run);
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static int file_exists(const char *run, const char *rel) {
    char path[900];
    snprintf(path, sizeof path, "%s/%s", run, rel);
    return access(path, F_OK) == 0;
}

/* ---------------------------------------------------------------- a features producer */

struct fprod {
    const char *run;
    int n;                 /* items 0..n-1 */
    int k, layers[4], h;   /* what the descriptors say */
    int nan_seq;           /* this item's states are NaN (-1: none) */
    int drain;             /* mark the ring drained at the end */
    enum desc_layout layout;   /* 0: concat */
    int id_mod;            /* input ids are < this (0: 500, inside the vocabulary) */
    int val_mod;           /* > 0: item q is a val batch when q % val_mod == val_mod - 1 */
    const char *target;    /* the model directory the items name as their target (NULL: g_model) */
};

static float fval(uint64_t seq, int l, int t, int h) {
    return 0.5f * sinf(0.1f * (float)seq + 0.37f * (float)t + 0.11f * (float)h + (float)l);
}

static int produce(void *arg) {
    struct fprod *p = arg;
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *r = ring_attach(p->run, "features", RING_PRODUCER, 5000, err, sizeof err);
    if (!r) { fprintf(stderr, "producer: %s\n", err); return 1; }
    for (int q = 0; q < p->n; q++) {
        struct ring_slot s;
        int rc;
        double t0 = tr_now();
        while ((rc = ring_acquire_write(r, 200, &s)) == RING_TIMEOUT)
            if (tr_now() - t0 > 20) return 2;   /* the trainer left (it failed, as some tests want) */
        if (rc) return 3;
        struct desc_features d;
        memset(&d, 0, sizeof d);
        enum { T = 100, D = 2 };
        d.batch.seq = (uint64_t)q;
        d.batch.split = p->val_mod && q % p->val_mod == p->val_mod - 1 ? DESC_SPLIT_VAL : DESC_SPLIT_TRAIN;
        d.batch.n_tokens = T;
        d.batch.budget = 512;
        d.batch.n_docs = D;
        d.layout = p->layout ? p->layout : DESC_LAYOUT_CONCAT;   /* split has the same sizes; values stay concat */
        d.n_layers = (uint32_t)p->k;
        for (int i = 0; i < p->k; i++) d.layers[i] = p->layers[i];
        d.dtype = DESC_DTYPE_F32;
        d.hidden_size = (uint32_t)p->h;
        if (desc_target_id_of_model(p->target ? p->target : g_model, &d.target_id, err, sizeof err)) return 7;
        desc_features_layout(&d);
        if (d.batch.payload_bytes > s.payload_cap) return 4;
        uint8_t *pay = s.payload;
        memset(pay, 0, d.batch.payload_bytes);
        struct desc_batch_arrays a;
        desc_batch_arrays(&d.batch, pay, &a);
        int cu[D + 1] = {0, 60, T};
        uint32_t n_loss = 0;
        for (int doc = 0; doc < D; doc++) {
            a.row_ids[doc] = q * D + doc;
            a.cu_seqlens[doc] = cu[doc];
            for (int t = cu[doc]; t < cu[doc + 1]; t++) {
                a.input_ids[t] = (int32_t)(((uint64_t)q * 13 + (uint64_t)t * 7) % (uint64_t)(p->id_mod ? p->id_mod : 500));
                a.position_ids[t] = t - cu[doc];
                a.doc_ids[t] = doc;
                a.loss_mask[t] = t - cu[doc] >= 2;
                n_loss += a.loss_mask[t];
            }
        }
        a.cu_seqlens[D] = T;
        d.batch.n_loss = n_loss;
        float *st = (float *)(pay + d.off_states), *last = (float *)(pay + d.off_last);
        for (int t = 0; t < T; t++)
            for (int l = 0; l <= p->k; l++)
                for (int h = 0; h < p->h; h++) {
                    float v = q == p->nan_seq ? NAN : fval((uint64_t)q, l, t, h);
                    if (l < p->k) st[((size_t)t * p->k + l) * p->h + h] = v;
                    else last[(size_t)t * p->h + h] = v;
                }
        size_t len;
        if (desc_features_encode(&d, s.desc, s.desc_cap, &len, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 5; }
        if (ring_publish(r, &s, (uint64_t)q, (uint32_t)len, d.batch.payload_bytes)) return 6;
    }
    if (p->drain) ring_mark_drained(r);
    ring_close(r);
    return 0;
}

static struct fprod good_prod(const char *run, int n) {
    return (struct fprod){run, n, 2, {1, 3}, H, -1, 1, 0, 0, 0, NULL};
}

/* ---------------------------------------------------------------- (a) + (b): the pipeline, exact resume */

struct pipe { pid_t shm, metrics, pack, target, hspack; };

static void start_upstream(const char *run, struct pipe *p, int64_t from_seq, int with_metrics) {
    p->shm = start_shm(run, g_rings3);
    p->metrics = 0;
    if (with_metrics) {
        const char *m[] = {"--progress-s", "0", "--plot-every-s", "0", "--stall-s", "0", NULL};
        p->metrics = spawn(run, "metrics", "dflash-metrics", m);
        char sock[800];
        snprintf(sock, sizeof sock, "%s/bus/metrics.sock", run);
        double t0 = tr_now();
        while (access(sock, F_OK) != 0) {
            ck_assert_msg(tr_now() - t0 < 10, "dflash-metrics did not bind %s", sock);
            usleep(5000);
        }
    }
    char seq[32];
    snprintf(seq, sizeof seq, "%lld", (long long)from_seq);
    const char *pk[] = {"--data", g_data, "--tokens", TOKENS, "--window", "64", "--seed", "1", "--vocab-size", "512",
                        "--epochs", "0", "--val-frac", "0.1", "--val-every", "4",
                        from_seq > 0 ? "--resume-from-seq" : NULL, seq, NULL};
    p->pack = spawn(run, "pack", "dflash-pack", pk);
    const char *tg[] = {"--model", g_model, "--tokens", TOKENS, "--layers", "1,3", "--device", "cpu", "--heartbeat-s",
                        "0.2", NULL};
    p->target = spawn(run, "target", "dflash-target", tg);
    const char *hs[] = {"--device", "cpu", "--tokens", TOKENS, "--wait-ms", "10000", "--heartbeat-s", "0.2",
                        "--start-seq", seq, NULL};
    p->hspack = spawn(run, "hspack", "dflash-hspack", hs);
}

/* Drop the upstream stages (the packer never ends: --epochs 0) and the rings. */
static void stop_upstream(const char *run, struct pipe *p, int sig) {
    stop(p->pack, sig);
    stop(p->target, sig);
    stop(p->hspack, sig);
    shutdown_shm(run, p->shm);
    if (p->metrics) ck_assert_int_eq(wait_for((kill(p->metrics, SIGTERM), p->metrics), 20, "dflash-metrics"), 3);
}

static const char *const g_train_a[] = {"--max-steps", "30", "--ckpt-every", "8", "--keep", "0", "--wait-ms", "10000",
                                        NULL};

START_TEST(pipeline_and_exact_resume) {
    /* ---- run A: uninterrupted */
    char runa[700], runb[700];
    snprintf(runa, sizeof runa, "%s/run", test_tmpdir("train-a"));
    snprintf(runb, sizeof runb, "%s/run", test_tmpdir("train-b"));
    struct pipe pa;
    start_upstream(runa, &pa, 0, 1);
    pid_t ta = spawn_train(runa, "train", g_model, g_train_a);
    ck_assert_int_eq(wait_for(ta, 30, "dflash-train (run A)"), 0);
    stop_upstream(runa, &pa, SIGTERM);
    char *log = read_log(runa, "train");
    ck_assert_msg(strstr(log, "training done: 30 steps, 0 skipped"), "%s", log);
    ck_assert_msg(strstr(log, "dflash-train: needs batch seq 0 next (step 0)"), "%s", log);
    ck_assert(file_exists(runa, "checkpoints/step-8.ckpt") && file_exists(runa, "checkpoints/step-16.ckpt") &&
              file_exists(runa, "checkpoints/step-30.ckpt"));
    ck_assert(file_exists(runa, "export/zlab/model.safetensors"));
    char path[900];
    snprintf(path, sizeof path, "%s/state/train.json", runa);
    char *state = test_slurp(path, NULL);
    ck_assert_ptr_nonnull(state);
    ck_assert_int_eq(json_int(state, "step"), 30);
    /* 30 train seqs plus whole validation passes (after train batches 4, 8, ..., 28: 7 passes of V) */
    int64_t next_a = json_int(state, "next_seq"), val_seqs = next_a - 30;
    ck_assert_msg(val_seqs > 0 && val_seqs % 7 == 0, "next_seq %lld", (long long)next_a);
    /* the pipelines' resume handshake reads the same number (pipelines/lib.sh train_next_seq) */
    char plog_path[900];
    snprintf(plog_path, sizeof plog_path, "%s.print-next-seq.log", runa);
    unlink(plog_path);
    const char *pns[] = {test_bin("dflash-train"), "--run", runa, "--print-next-seq", NULL};
    ck_assert_int_eq(run_wait(plog_path, pns), 0);
    char *printed = test_slurp(plog_path, NULL), want_line[32];
    snprintf(want_line, sizeof want_line, "%lld\n", (long long)next_a);
    ck_assert_msg(printed && !strcmp(printed, want_line), "--print-next-seq printed '%s', train.json says %lld",
                  printed ? printed : "(nothing)", (long long)next_a);
    free(printed);
    const char *pns_b[] = {test_bin("dflash-train"), "--run", runb, "--print-next-seq", NULL};   /* no train.json yet */
    ck_assert_int_eq(run_wait(plog_path, pns_b), 1);
    int V = (int)(val_seqs / 7);
    free(state);
    /* the bus: a metric record per step (loss, accuracies, EAL, lr, grad norm, tokens/s, step time, skipped),
     * one val record per pass */
    snprintf(path, sizeof path, "%s/metrics.jsonl", runa);
    char *m = test_slurp(path, NULL);
    ck_assert_msg(m != NULL, "no metrics.jsonl");
    int n_train = 0, n_val = 0;
    for (char *line = m, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = 0;
        if (!strstr(line, "\"stage\":\"dflash-train\"") || !strstr(line, "\"kind\":\"metric\"")) continue;
        if (strstr(line, "\"val_loss\"")) {
            ck_assert_msg(strstr(line, "\"val_full_acc\"") && strstr(line, "\"val_eal\"") &&
                          strstr(line, "\"val_position_1_acc\"") && strstr(line, "\"val_position_3_acc\""), "%s", line);
            char want[32];
            snprintf(want, sizeof want, "\"val_batches\":%d.0", V);
            ck_assert_msg(strstr(line, want), "a pass of %d batches expected: %s", V, line);
            ck_assert_msg(!strstr(line, "\"loss\""), "%s", line);
            n_val++;
        } else {
            const char *keys[] = {"\"loss\"", "\"eal\"", "\"full_acc\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\"",
                                  "\"step_s\"", "\"skipped_steps\"", "\"position_1_acc\"", "\"position_3_acc\""};
            for (int i = 0; i < 10; i++) ck_assert_msg(strstr(line, keys[i]), "no %s in %s", keys[i], line);
            n_train++;
        }
    }
    free(m);
    ck_assert_msg(n_train >= 25 && n_train <= 30, "%d step records", n_train);   /* the bus may drop the first */
    ck_assert_msg(n_val >= 5 && n_val <= 7, "%d val records", n_val);
    free(log);

    /* ---- run B: SIGKILL between checkpoints, resume on fresh rings from the seq the trainer asks for */
    struct pipe pb;
    start_upstream(runb, &pb, 0, 0);
    pid_t tb = spawn_train(runb, "train", g_model, g_train_a);
    char logb[800];
    snprintf(logb, sizeof logb, "%s.train.log", runb);
    double t0 = tr_now();
    for (;;) {   /* past checkpoint 8, before checkpoint 16 */
        char *s = test_slurp(logb, NULL);
        int there = s && strstr(s, "step 12:");
        free(s);
        if (there) break;
        int st;
        ck_assert_msg(waitpid(tb, &st, WNOHANG) == 0, "run B's trainer ended before step 12");
        ck_assert_msg(tr_now() - t0 < 30, "run B's trainer did not reach step 12");
        usleep(1000);
    }
    ck_assert_int_eq(kill(tb, SIGKILL), 0);
    ck_assert_int_eq(tr_wait(tb), 128 + SIGKILL);
    ck_assert(!file_exists(runb, "checkpoints/step-30.ckpt"));
    stop_upstream(runb, &pb, SIGKILL);
    snprintf(path, sizeof path, "%s/state/train.json", runb);
    state = test_slurp(path, NULL);
    ck_assert_ptr_nonnull(state);
    int64_t step_b = json_int(state, "step"), next_b = json_int(state, "next_seq");
    free(state);
    ck_assert_msg(step_b == 8 || step_b == 16, "killed at step %lld", (long long)step_b);
    /* a checkpoint after train batch 4j: the seq it needs opens a validation pass, so the restarted packer
     * seeks into val batches and the resumed trainer evaluates that pass again, changing no weight */
    ck_assert_int_eq(next_b, step_b + step_b / 4 * V - V);
    ck_assert_int_eq(next_b % (4 + V), 4);
    start_upstream(runb, &pb, next_b, 0);
    const char *resume[] = {"--max-steps", "30", "--ckpt-every", "8", "--keep", "0", "--wait-ms", "10000", "--resume",
                            NULL};
    tb = spawn_train(runb, "train2", g_model, resume);
    ck_assert_int_eq(wait_for(tb, 30, "dflash-train (run B, resumed)"), 0);
    stop_upstream(runb, &pb, SIGTERM);
    log = read_log(runb, "train2");
    char want[128];
    snprintf(want, sizeof want, "dflash-train: needs batch seq %lld next (step %lld)", (long long)next_b, (long long)step_b);
    ck_assert_msg(strstr(log, want), "no '%s' in:\n%s", want, log);
    ck_assert_msg(strstr(log, "resuming from") && strstr(log, "training done: 30 steps"), "%s", log);
    free(log);
    /* bit for bit: the whole final checkpoint (weights, optimizer moments, guard, step, next_seq) */
    char pa_[900], pb_[900];
    snprintf(pa_, sizeof pa_, "%s/checkpoints/step-30.ckpt", runa);
    snprintf(pb_, sizeof pb_, "%s/checkpoints/step-30.ckpt", runb);
    size_t la, lb;
    char *ca = test_slurp(pa_, &la), *cb = test_slurp(pb_, &lb);
    ck_assert_msg(ca && cb, "missing final checkpoints");
    ck_assert_uint_eq(la, lb);
    ck_assert_msg(!memcmp(ca, cb, la), "run B's final checkpoint differs from run A's");
    free(ca);
    free(cb);
    snprintf(pa_, sizeof pa_, "%s/export/zlab/model.safetensors", runa);
    snprintf(pb_, sizeof pb_, "%s/export/zlab/model.safetensors", runb);
    ca = test_slurp(pa_, &la);
    cb = test_slurp(pb_, &lb);
    ck_assert_msg(ca && cb && la == lb && !memcmp(ca, cb, la), "the exports differ");
    free(ca);
    free(cb);
}
END_TEST

/* ---------------------------------------------------------------- (c) bad input */

/* One trainer against a producer of prod's items; returns the trainer's exit status, log in *log. */
static int train_against(const char *tag, struct fprod prod, const char *const extra[], char **log, char *run_out) {
    char run[700];
    snprintf(run, sizeof run, "%s/run", test_tmpdir(tag));
    if (run_out) strcpy(run_out, run);
    pid_t shm = start_shm(run, g_rings1);
    prod.run = run;
    pid_t pp = tr_fork(produce, &prod);
    pid_t t = spawn_train(run, "train", g_model, extra);
    int rc = wait_for(t, 20, "dflash-train");
    stop(pp, SIGKILL);
    shutdown_shm(run, shm);
    *log = read_log(run, "train");
    return rc;
}

START_TEST(bad_features) {
    const char *const ex[] = {"--max-steps", "4", "--wait-ms", "5000", NULL};
    char *log, run[700];
    struct fprod p = good_prod(NULL, 4);
    p.layers[1] = 2;   /* another captured layer than the drafter's 3 */
    ck_assert_int_eq(train_against("train-ids", p, ex, &log, run), 1);
    expect_one_error(log, "features seq 0: features: captured layer 1 is z-lab id 2, the drafter expects 3");
    ck_assert(count_ckpts(run) == 0 && !file_exists(run, "export/zlab/model.safetensors"));
    free(log);
    p = good_prod(NULL, 4);
    p.k = 1;
    ck_assert_int_eq(train_against("train-k", p, ex, &log, run), 1);
    expect_one_error(log, "features: 1 captured layers, the drafter expects k=2");
    free(log);
    p = good_prod(NULL, 4);
    p.h = 32;
    ck_assert_int_eq(train_against("train-h", p, ex, &log, run), 1);
    expect_one_error(log, "features: hidden size 32, the drafter's target has H=64");
    free(log);
    p = good_prod(NULL, 4);
    p.layout = DESC_LAYOUT_SPLIT;
    ck_assert_int_eq(train_against("train-layout", p, ex, &log, run), 1);
    expect_one_error(log, "features: layout split, the drafter expects concat");
    free(log);
    p = good_prod(NULL, 4);
    p.target = g_othermodel;   /* issue 24: same shape (H 64, the tiny preset), another target (seed) */
    ck_assert_int_eq(train_against("train-target", p, ex, &log, run), 1);
    expect_one_error(log, "features seq 0: computed by another target (id ");
    ck_assert(count_ckpts(run) == 0);
    free(log);
    p = good_prod(NULL, 4);
    p.id_mod = 700;   /* token ids past the target's vocabulary of 512 */
    ck_assert_int_eq(train_against("train-vocab", p, ex, &log, run), 1);
    expect_one_error(log, "is outside [0, 512)");
    free(log);
}
END_TEST

START_TEST(bad_target_and_mask) {
    char run[700];
    snprintf(run, sizeof run, "%s/run", test_tmpdir("train-mask"));
    const char *mask[] = {"--max-steps", "4", "--mask-token-id", "512", "--wait-ms", "100", NULL};
    ck_assert_int_eq(wait_for(spawn_train(run, "train", g_model, mask), 20, "dflash-train"), 1);
    char *log = read_log(run, "train");
    expect_one_error(log, "mask token id 512 is outside the embedding [0, 512)");
    free(log);
    const char *ex[] = {"--max-steps", "4", "--wait-ms", "100", NULL};
    ck_assert_int_eq(wait_for(spawn_train(run, "train2", g_badmodel, ex), 20, "dflash-train"), 1);
    log = read_log(run, "train2");
    expect_one_error(log, "model.embed_tokens.weight");
    free(log);
    ck_assert_int_eq(count_ckpts(run), 0);
}
END_TEST

START_TEST(checkpoints) {
    const char *const ex[] = {"--max-steps", "12", "--ckpt-every", "4", "--keep", "0", "--wait-ms", "5000", NULL};
    char *log, run[700], path[900];
    ck_assert_int_eq(train_against("train-ckpt", good_prod(NULL, 12), ex, &log, run), 0);
    ck_assert_msg(strstr(log, "training done: 12 steps"), "%s", log);
    free(log);
    ck_assert(file_exists(run, "checkpoints/step-4.ckpt") && file_exists(run, "checkpoints/step-8.ckpt"));
    /* a truncated newest checkpoint: skipped with a line naming it, the one before is used */
    snprintf(path, sizeof path, "%s/checkpoints/step-12.ckpt", run);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(truncate(path, sb.st_size / 2), 0);
    const char *resume[] = {"--max-steps", "12", "--ckpt-every", "4", "--keep", "0", "--wait-ms", "100", "--resume", NULL};
    ck_assert_int_eq(wait_for(spawn_train(run, "resume", g_model, resume), 20, "dflash-train"), 1);   /* no rings */
    log = read_log(run, "resume");
    ck_assert_msg(strstr(log, "step-12.ckpt") && strstr(log, " W dflash-train["), "no skip line:\n%s", log);
    ck_assert_msg(strstr(log, "needs batch seq 8 next (step 8)"), "%s", log);
    free(log);
    ck_assert_int_eq(stat(path, &sb), 0);
    off_t trunc_size = sb.st_size;
    /* another configuration: refused, the field named, nothing written */
    snprintf(path, sizeof path, "%s/state/train.json", run);
    char *state0 = test_slurp(path, NULL);
    const char *other[] = {"--max-steps", "12", "--ckpt-every", "4", "--keep", "0", "--wait-ms", "100", "--resume",
                           "--lr", "0.0003", NULL};
    ck_assert_int_eq(wait_for(spawn_train(run, "other", g_model, other), 20, "dflash-train"), 1);
    log = read_log(run, "other");
    expect_one_error(log, "field lr");
    free(log);
    char *state1 = test_slurp(path, NULL);
    ck_assert_str_eq(state0, state1);
    free(state0);
    free(state1);
    snprintf(path, sizeof path, "%s/checkpoints/step-12.ckpt", run);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_size, trunc_size);
}
END_TEST

/* ---------------------------------------------------------------- (d) the non-finite guard */

START_TEST(nonfinite) {
    char *log, run[700];
    struct fprod p = good_prod(NULL, 6);
    p.nan_seq = 2;
    const char *stop1[] = {"--max-steps", "5", "--max-nonfinite", "1", "--wait-ms", "5000", NULL};
    ck_assert_int_eq(train_against("train-nan1", p, stop1, &log, run), 1);
    expect_one_error(log, "step 2: ");
    ck_assert_msg(strstr(log, "non-finite steps in a row, stopping"), "%s", log);
    free(log);
    const char *skip[] = {"--max-steps", "5", "--max-nonfinite", "2", "--wait-ms", "5000", NULL};
    ck_assert_int_eq(train_against("train-nan2", p, skip, &log, run), 0);
    ck_assert_msg(strstr(log, "step 2: ") && strstr(log, "skipped (1 in a row, 1 in total)"), "%s", log);
    ck_assert_msg(strstr(log, "training done: 5 steps, 1 skipped"), "%s", log);
    free(log);
}
END_TEST

/* Val items are not micro-batches: with --grad-accum 2 and the pattern T T T V ..., 12 items (9 train) hold
 * --max-steps 4 optimizer steps (train seqs 0,1 | 2,4 | 5,6 | 8,9) and 2 validation passes, one falling between
 * the micro-batches of a step (seq 3, between train seqs 2 and 4), and a NaN in a
 * val item does not trip the guard (nothing of it reaches the gradients; its val_loss is reported as is). */
START_TEST(val_items_are_not_micro_batches) {
    char *log, run[700];
    struct fprod p = good_prod(NULL, 12);
    p.val_mod = 4;
    const char *ex[] = {"--max-steps", "4", "--grad-accum", "2", "--ckpt-every", "2", "--keep", "0", "--wait-ms", "5000",
                        "--max-nonfinite", "1", NULL};
    ck_assert_int_eq(train_against("train-val", p, ex, &log, run), 0);
    ck_assert_msg(strstr(log, "training done: 4 steps, 0 skipped, 2 validation passes"), "%s", log);
    ck_assert_msg(strstr(log, "validation after step 1 (seqs 3..3, 1 batches)"), "%s", log);   /* mid-step */
    free(log);
    char path[900];
    snprintf(path, sizeof path, "%s/state/train.json", run);
    char *state = test_slurp(path, NULL);
    ck_assert_int_eq(json_int(state, "step"), 4);
    ck_assert_int_eq(json_int(state, "next_seq"), 10);
    free(state);
    p.nan_seq = 3;   /* a val item */
    ck_assert_int_eq(train_against("train-valnan", p, ex, &log, run), 0);
    ck_assert_msg(strstr(log, "training done: 4 steps, 0 skipped"), "%s", log);
    ck_assert_msg(strstr(log, "val loss nan") || strstr(log, "val loss -nan"), "%s", log);
    free(log);
}
END_TEST

/* ---------------------------------------------------------------- (e) never a short success (issue 24) */

/* A stream that ends before --max-steps is a failure with one line saying how many steps were trained (it was
 * "training done" with exit 0), nothing exported; with --grad-accum a last partial accumulation is not applied
 * as a step (it was, silently: --max-steps 3 --grad-accum 4 over 6 batches reported "training done: 2 steps"). */
START_TEST(short_stream_fails) {
    char *log, run[700];
    const char *ex[] = {"--max-steps", "10", "--wait-ms", "5000", NULL};
    ck_assert_int_eq(train_against("train-short", good_prod(NULL, 6), ex, &log, run), 1);
    expect_one_error(log, "training incomplete: the features stream ended after 6 of --max-steps 10 optimizer steps;");
    ck_assert_msg(!strstr(log, "training done"), "%s", log);
    ck_assert(!file_exists(run, "export/zlab/model.safetensors"));
    free(log);
    const char *acc[] = {"--max-steps", "3", "--grad-accum", "4", "--wait-ms", "5000", NULL};
    ck_assert_int_eq(train_against("train-short-acc", good_prod(NULL, 6), acc, &log, run), 1);
    expect_one_error(log, "ended after 1 of --max-steps 3 optimizer steps and 2 of the 4 batches of step 2 (a partial "
                          "accumulation is not applied)");
    ck_assert(!file_exists(run, "export/zlab/model.safetensors"));
    free(log);
    char path[900];
    snprintf(path, sizeof path, "%s/state/train.json", run);
    char *state = test_slurp(path, NULL);
    ck_assert_int_eq(json_int(state, "step"), 0);   /* no checkpoint of a step that was not asked for */
    free(state);
}
END_TEST

/* A run resumed at --max-steps (the trainer died after its final checkpoint, before or while writing the exports)
 * writes the exports again from that checkpoint and exits 0, without rings (it used to exit 0 with no export). */
START_TEST(resume_at_max_steps_exports) {
    char *log, run[700], path[900];
    const char *ex[] = {"--max-steps", "4", "--ckpt-every", "2", "--keep", "0", "--wait-ms", "5000", NULL};
    ck_assert_int_eq(train_against("train-late", good_prod(NULL, 4), ex, &log, run), 0);
    free(log);
    snprintf(path, sizeof path, "%s/export/zlab/model.safetensors", run);
    size_t la, lb;
    char *a = test_slurp(path, &la);
    ck_assert_ptr_nonnull(a);
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/export'", run);
    ck_assert_int_eq(system(cmd), 0);
    const char *resume[] = {"--max-steps", "4", "--ckpt-every", "2", "--keep", "0", "--wait-ms", "100", "--resume", NULL};
    ck_assert_int_eq(wait_for(spawn_train(run, "again", g_model, resume), 30, "dflash-train (resumed at the end)"), 0);
    log = read_log(run, "again");
    ck_assert_msg(strstr(log, "already at step 4") && strstr(log, "exports written"), "%s", log);
    free(log);
    char *b = test_slurp(path, &lb);
    ck_assert_msg(b && la == lb && !memcmp(a, b, la), "the export written again differs from the first");
    ck_assert(file_exists(run, "export/speculators/model.safetensors"));
    free(a);
    free(b);
}
END_TEST

/* ---------------------------------------------------------------- set-up */

static int make_models(void) {
    snprintf(g_dir, sizeof g_dir, "%s/dflash-test-train-stage-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_dir)) return -1;
    snprintf(g_model, sizeof g_model, "%s/model", g_dir);
    snprintf(g_data, sizeof g_data, "%s/data.jsonl", g_dir);
    snprintf(g_badmodel, sizeof g_badmodel, "%s/badmodel", g_dir);
    char log[800], m32[700];
    snprintf(log, sizeof log, "%s/mkmodel.log", g_dir);
    snprintf(m32, sizeof m32, "%s/model32", g_dir);
    const char *a[] = {test_bin("dflash-mkmodel"), "--out", g_model, "--dataset", g_data, "--preset", "tiny", "--dtype",
                       "f32", "--seed", "42", "--threads", "1", "--samples", "120", "--median-len", "96",
                       "--len-sigma", "0.6", "--min-len", "16", "--max-len", "400", "--prompt-frac", "0.3", NULL};
    if (run_wait(log, a)) return -1;
    const char *b[] = {test_bin("dflash-mkmodel"), "--out", m32, "--preset", "tiny", "--hidden", "32", "--dtype", "f32",
                       "--seed", "7", "--threads", "1", NULL};
    if (run_wait(log, b)) return -1;
    /* badmodel: the tiny model's config (H 64) over the H 32 model's tensors */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s'/*.json '%s'/ && cp '%s'/model.safetensors '%s'/", g_badmodel,
             g_model, g_badmodel, m32, g_badmodel);
    if (system(cmd) != 0) return -1;
    /* othermodel: the same shape, another target (its config.json says another rope_theta) */
    snprintf(g_othermodel, sizeof g_othermodel, "%s/othermodel", g_dir);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && sed -i 's/\"rope_theta\": [0-9.e+]*/\"rope_theta\": 10000.0/' '%s/config.json' "
             "&& ! cmp -s '%s/config.json' '%s/config.json'", g_model, g_othermodel, g_othermodel, g_model, g_othermodel);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
    if (make_models()) {
        fprintf(stderr, "test_train_stage: dflash-mkmodel failed (see %s/mkmodel.log)\n", g_dir);
        return 1;
    }
    Suite *s = suite_create("train_stage");
    TCase *tc = tcase_create("train_stage");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, pipeline_and_exact_resume);
    tcase_add_test(tc, bad_features);
    tcase_add_test(tc, bad_target_and_mask);
    tcase_add_test(tc, checkpoints);
    tcase_add_test(tc, short_stream_fails);
    tcase_add_test(tc, resume_at_max_steps_exports);
    tcase_add_test(tc, nonfinite);
    tcase_add_test(tc, val_items_are_not_micro_batches);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
