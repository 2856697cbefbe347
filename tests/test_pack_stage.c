/*
 * tests/test_pack_stage.c — the real dflash-pack binary (via test_bin): --index and bad input
 * (one line naming file and line), a deterministic --out-dir stream, resume after SIGKILL equal
 * to an uninterrupted run (--out-dir and over a real `batches` ring served by dflash-shm, with a
 * consumer in the test), --resume-from-seq, and a changed flag refusing the saved cursor.
 */
#include "core/bus.h"
#include "core/dataset.h"
#include "core/desc.h"
#include "core/fsutil.h"
#include "shm/ring.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

/* ---------------------------------------------------------------- processes */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Start argv (NULL-terminated) with stdout+stderr appended to log; dies with the test. */
static pid_t spawn(char *const argv[], const char *log) { return test_spawn_log(log, (const char *const *)argv); }

/* Wait up to timeout_s; returns the exit code, 128 + signal, or fails the test on timeout. */
static int wait_exit(pid_t pid, double timeout_s) {
    double t0 = now_s();
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        ck_assert_int_eq(r, 0);
        if (now_s() - t0 > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            ck_abort_msg("process %d did not exit within %.0f s", (int)pid, timeout_s);
        }
        usleep(2000);
    }
}

static int run(char *const argv[], const char *log, double timeout_s) { return wait_exit(spawn(argv, log), timeout_s); }

static int count_lines_with(const char *path, const char *needle) {
    char *t = test_slurp(path, NULL);
    int n = 0;
    for (char *p = t; p && (p = strstr(p, needle)); p++) n++;
    free(t);
    return n;
}

/* ---------------------------------------------------------------- data */

/* n JSONL rows, lengths 1..max_len, 30% prompt without loss. */
static void write_jsonl(const char *path, int n, int max_len, uint64_t seed) {
    FILE *f = fopen(path, "wb");
    ck_assert(f != NULL);
    uint64_t s = seed;
    for (int r = 0; r < n; r++) {
        int len = 1 + (int)(test_rng_next(&s) % (uint64_t)max_len), prompt = len * 3 / 10;
        fprintf(f, "{\"input_ids\": [");
        for (int i = 0; i < len; i++) fprintf(f, "%s%d", i ? "," : "", (int)(test_rng_next(&s) % 1000));
        fprintf(f, "], \"loss_mask\": [");
        for (int i = 0; i < len; i++) fprintf(f, "%s%d", i ? "," : "", i >= prompt);
        fprintf(f, "]}\n");
    }
    fclose(f);
}

/* One batch file of --out-dir: its descriptor and payload views into the file bytes (the payload
 * starts DESC_ALIGN-aligned in the file, and slurp's malloc is 16-aligned: copy before typed use). */
struct bfile { char *bytes; size_t len; const char *desc; uint32_t desc_len; const char *payload; uint64_t payload_len; };

static int read_batch_file(const char *dir, uint64_t seq, struct bfile *b) {
    char path[700];
    snprintf(path, sizeof path, "%s/batch-%012llu.bin", dir, (unsigned long long)seq);
    b->bytes = test_slurp(path, &b->len);
    if (!b->bytes) return -1;
    ck_assert_uint_ge(b->len, 32);
    ck_assert(!memcmp(b->bytes, "DFBATCH\n", 8));
    uint32_t v;
    uint64_t off;
    memcpy(&v, b->bytes + 8, 4);
    ck_assert_uint_eq(v, 1);
    memcpy(&b->desc_len, b->bytes + 12, 4);
    memcpy(&b->payload_len, b->bytes + 16, 8);
    memcpy(&off, b->bytes + 24, 8);
    ck_assert_uint_eq(off % DESC_ALIGN, 0);
    ck_assert_uint_ge(off, 32 + b->desc_len);
    ck_assert_uint_eq(b->len, off + b->payload_len);
    b->desc = b->bytes + 32;
    b->payload = b->bytes + off;
    return 0;
}

static uint64_t done_count(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/DONE", dir);
    char *t = test_slurp(path, NULL);
    ck_assert_msg(t != NULL, "%s missing", path);
    uint64_t n = strtoull(t, NULL, 10);
    free(t);
    return n;
}

/* Every batch of dir a equals the one of dir b, for seqs [from, n); and b has exactly those. */
static void same_stream(const char *a, const char *b, uint64_t from, uint64_t n) {
    for (uint64_t s = from; s < n; s++) {
        struct bfile x, y;
        ck_assert_msg(read_batch_file(a, s, &x) == 0, "%s: batch %llu missing", a, (unsigned long long)s);
        ck_assert_msg(read_batch_file(b, s, &y) == 0, "%s: batch %llu missing", b, (unsigned long long)s);
        ck_assert_msg(x.len == y.len && !memcmp(x.bytes, y.bytes, x.len), "batch %llu differs between %s and %s",
                      (unsigned long long)s, a, b);
        free(x.bytes);
        free(y.bytes);
    }
    struct bfile z;
    ck_assert_msg(read_batch_file(b, n, &z) != 0, "%s has a batch past %llu", b, (unsigned long long)n);
    ck_assert_msg(from == 0 || read_batch_file(b, from - 1, &z) != 0, "%s has a batch before %llu", b, (unsigned long long)from);
}

struct env { char dir[512], data[600], idx[600], pack[600], log[600]; };

static void env_init(struct env *e, const char *tag, int rows) {
    snprintf(e->dir, sizeof e->dir, "%s", test_tmpdir(tag));
    snprintf(e->data, sizeof e->data, "%s/d.jsonl", e->dir);
    snprintf(e->idx, sizeof e->idx, "%s/d.idx", e->dir);
    snprintf(e->pack, sizeof e->pack, "%s", test_bin("dflash-pack"));
    snprintf(e->log, sizeof e->log, "%s/test.log", e->dir);
    ck_assert_msg(access(e->pack, X_OK) == 0, "%s is not built", e->pack);
    write_jsonl(e->data, rows, 600, 99);
    char *argv[] = {e->pack, "--data", e->data, "--index", e->idx, NULL};
    ck_assert_int_eq(run(argv, e->log, 60), 0);
}

/* ---------------------------------------------------------------- tests */

START_TEST(bad_input_one_line) {
    const char *dir = test_tmpdir("packbad");
    char data[600], idx[600], log[600], run_dir[600], want[700];
    snprintf(data, sizeof data, "%s/bad.jsonl", dir);
    snprintf(idx, sizeof idx, "%s/bad.idx", dir);
    snprintf(log, sizeof log, "%s/out.log", dir);
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    FILE *f = fopen(data, "wb");
    fputs("{\"input_ids\": [1, 2], \"loss_mask\": [0, 1]}\n{\"input_ids\": [1, 2], \"loss_mask\": [0, 1, 1]}\n"
          "{\"input_ids\": [4, 5000], \"loss_mask\": [1, 1]}\n", f);
    fclose(f);
    char *pack = (char *)test_bin("dflash-pack");
    char *a1[] = {pack, "--data", data, "--index", idx, NULL};
    ck_assert_int_eq(run(a1, log, 30), 1);
    snprintf(want, sizeof want, "%s:2: input_ids has 2 tokens but loss_mask has 3", data);
    ck_assert_int_eq(count_lines_with(log, want), 1);
    ck_assert(access(idx, F_OK) != 0);
    /* skip: the bad line is counted and listed in the log; the vocab check removes line 3 too */
    char *a2[] = {pack, "--data", data, "--index", idx, "--on-bad-sample", "skip", "--vocab-size", "1000", NULL};
    ck_assert_int_eq(run(a2, log, 30), 0);
    ck_assert_int_eq(count_lines_with(log, "skipped bad sample"), 2);
    snprintf(want, sizeof want, "%s:3: input_ids[1] = 5000 is >= --vocab-size 1000", data);
    ck_assert_int_eq(count_lines_with(log, want), 1);
    ck_assert_int_eq(count_lines_with(log, "1 samples, 2 tokens, 2 bad samples skipped"), 1);
    /* an index with a token past --vocab-size names the row */
    char *a3[] = {pack, "--data", data, "--index", idx, "--on-bad-sample", "skip", NULL};
    ck_assert_int_eq(run(a3, log, 30), 0);
    char *a4[] = {pack, "--run", run_dir, "--data", idx, "--vocab-size", "1000", "--out-dir", run_dir, NULL};
    ck_assert_int_eq(run(a4, log, 30), 1);
    snprintf(want, sizeof want, "%s: row 1: input_ids[1] = 5000 is >= --vocab-size 1000", idx);
    ck_assert_int_eq(count_lines_with(log, want), 1);
    /* a corrupt index is refused */
    int fd = open(idx, O_WRONLY);
    ck_assert_int_eq(pwrite(fd, "junk", 4, 4096 + 8), 4);
    close(fd);
    char *a5[] = {pack, "--run", run_dir, "--data", idx, "--out-dir", run_dir, NULL};
    ck_assert_int_eq(run(a5, log, 30), 1);
    ck_assert_int_eq(count_lines_with(log, "corrupt index"), 1);
    /* flag errors exit 2 */
    char *a6[] = {pack, "--run", run_dir, "--data", idx, "--shard", "3/3", NULL};
    ck_assert_int_eq(run(a6, log, 30), 2);
    char *a7[] = {pack, "--run", run_dir, "--data", idx, "--on-bad-sample", "maybe", NULL};
    ck_assert_int_eq(run(a7, log, 30), 2);
    ck_assert_int_eq(count_lines_with(log, "--on-bad-sample: expected one of fail|skip, got 'maybe'"), 1);
}
END_TEST

START_TEST(out_dir_deterministic) {
    struct env e;
    env_init(&e, "packdet", 700);
    char run1[600], run2[600], out1[600], out2[600];
    snprintf(run1, sizeof run1, "%s/run1", e.dir);
    snprintf(run2, sizeof run2, "%s/run2", e.dir);
    snprintf(out1, sizeof out1, "%s/out1", e.dir);
    snprintf(out2, sizeof out2, "%s/out2", e.dir);
    /* the same stream from JSONL and from the index */
    char *a1[] = {e.pack, "--run", run1, "--data", e.idx, "--tokens", "2048", "--epochs", "2", "--seed", "5", "--out-dir", out1, NULL};
    char *a2[] = {e.pack, "--run", run2, "--data", e.data, "--tokens", "2048", "--epochs", "2", "--seed", "5", "--out-dir", out2, NULL};
    ck_assert_int_eq(run(a1, e.log, 60), 0);
    ck_assert_int_eq(run(a2, e.log, 60), 0);
    uint64_t n = done_count(out1);
    ck_assert_uint_gt(n, 100);
    ck_assert_uint_eq(done_count(out2), n);
    same_stream(out1, out2, 0, n);
    /* every batch decodes and satisfies the packing convention */
    for (uint64_t s = 0; s < n; s++) {
        struct bfile b;
        struct desc_batch d;
        char err[256];
        ck_assert_int_eq(read_batch_file(out1, s, &b), 0);
        ck_assert_msg(desc_batch_decode(b.desc, b.desc_len, b.payload_len, &d, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(d.seq, s);
        ck_assert_uint_le(d.n_tokens, 2048);
        void *aligned = aligned_alloc(DESC_ALIGN, (b.payload_len + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
        memcpy(aligned, b.payload, b.payload_len);
        ck_assert_msg(desc_batch_check_payload(&d, aligned, 1000, err, sizeof err) == 0, "%s", err);
        free(aligned);
        free(b.bytes);
    }
    /* the stage reports its padding at the end */
    ck_assert_int_ge(count_lines_with(e.log, "end of stream at seq"), 2);
}
END_TEST


/* --val-frac/--val-every: the last rows are held out into val batches (split = val), one pass after
 * every N-th train batch; --resume-from-seq into the middle of a pass continues the same stream. */
START_TEST(out_dir_validation_split) {
    struct env e;
    env_init(&e, "packval", 300);
    char run1[600], run2[600], out1[600], out2[600];
    snprintf(run1, sizeof run1, "%s/run1", e.dir);
    snprintf(run2, sizeof run2, "%s/run2", e.dir);
    snprintf(out1, sizeof out1, "%s/out1", e.dir);
    snprintf(out2, sizeof out2, "%s/out2", e.dir);
    char *a1[] = {e.pack, "--run", run1, "--data", e.idx, "--tokens", "2048", "--epochs", "1", "--val-frac", "0.2",
                  "--val-every", "3", "--out-dir", out1, NULL};
    ck_assert_int_eq(run(a1, e.log, 60), 0);
    uint64_t n = done_count(out1), V = 0, n_train = 0;
    enum desc_split *split = calloc(n, sizeof *split);
    for (uint64_t q = 0; q < n; q++) {
        struct bfile b;
        struct desc_batch d;
        char err[256];
        ck_assert_int_eq(read_batch_file(out1, q, &b), 0);
        ck_assert_msg(desc_batch_decode(b.desc, b.desc_len, b.payload_len, &d, err, sizeof err) == 0, "%s", err);
        split[q] = d.split;
        void *al = aligned_alloc(DESC_ALIGN, (b.payload_len + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
        memcpy(al, b.payload, b.payload_len);
        struct desc_batch_arrays a;
        desc_batch_arrays(&d, al, &a);
        for (uint32_t i = 0; i < d.n_docs; i++)
            ck_assert_msg(d.split == DESC_SPLIT_VAL ? a.row_ids[i] >= 240 : a.row_ids[i] < 240, "seq %llu row %lld",
                          (unsigned long long)q, (long long)a.row_ids[i]);
        free(al);
        free(b.bytes);
        n_train += d.split == DESC_SPLIT_TRAIN;
    }
    while (3 + V < n && split[3 + V] == DESC_SPLIT_VAL) V++;
    ck_assert_uint_ge(V, 1);
    for (uint64_t q = 0; q < n; q++) ck_assert_int_eq(split[q], q % (3 + V) >= 3 ? DESC_SPLIT_VAL : DESC_SPLIT_TRAIN);
    ck_assert_uint_eq(n, n_train + n_train / 3 * V);
    free(split);
    ck_assert_int_ge(count_lines_with(e.log, "validation: the last 60 rows held out"), 1);
    char from[32];
    snprintf(from, sizeof from, "%llu", (unsigned long long)(3 + V + 3 + 1));
    char *a2[] = {e.pack, "--run", run2, "--data", e.idx, "--tokens", "2048", "--epochs", "1", "--val-frac", "0.2",
                  "--val-every", "3", "--resume-from-seq", from, "--out-dir", out2, NULL};
    ck_assert_int_eq(run(a2, e.log, 60), 0);
    same_stream(out1, out2, 3 + V + 3 + 1, n);
    /* --val-frac without --val-every: one line, exit 1 */
    char *a3[] = {e.pack, "--run", run2, "--data", e.idx, "--val-frac", "0.2", "--out-dir", out2, NULL};
    ck_assert_int_eq(run(a3, e.log, 60), 1);
    ck_assert_int_eq(count_lines_with(e.log, "--val-frac 0.2 needs --val-every N"), 1);
}
END_TEST

/* Start the packer, SIGKILL it once the out dir holds at least `at` batches, and return. */
static void kill_after(char *const argv[], const char *log, const char *out, uint64_t at) {
    pid_t pid = spawn(argv, log);
    char path[700];
    snprintf(path, sizeof path, "%s/batch-%012llu.bin", out, (unsigned long long)at);
    double t0 = now_s();
    while (access(path, F_OK) != 0) {
        int st;
        ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "dflash-pack ended before batch %llu", (unsigned long long)at);
        ck_assert_msg(now_s() - t0 < 60, "batch %llu never appeared", (unsigned long long)at);
        usleep(200);
    }
    kill(pid, SIGKILL);
    ck_assert_int_eq(wait_exit(pid, 10), 128 + SIGKILL);
}

START_TEST(out_dir_resume_after_sigkill) {
    struct env e;
    env_init(&e, "packkill", 600);
    char ref_run[600], ref_out[600], run_dir[600], out[600], cursor[700];
    snprintf(ref_run, sizeof ref_run, "%s/ref", e.dir);
    snprintf(ref_out, sizeof ref_out, "%s/ref-out", e.dir);
    snprintf(run_dir, sizeof run_dir, "%s/run", e.dir);
    snprintf(out, sizeof out, "%s/out", e.dir);
    snprintf(cursor, sizeof cursor, "%s/state/pack.cursor", run_dir);
    char *ref[] = {e.pack, "--run", ref_run, "--data", e.idx, "--tokens", "1024", "--epochs", "3", "--window", "64", "--out-dir", ref_out, NULL};
    ck_assert_int_eq(run(ref, e.log, 60), 0);
    uint64_t n = done_count(ref_out);
    ck_assert_uint_gt(n, 150);
    char *cmd[] = {e.pack, "--run", run_dir, "--data", e.idx, "--tokens", "1024", "--epochs", "3", "--window", "64", "--out-dir", out, NULL};
    kill_after(cmd, e.log, out, n / 4);
    kill_after(cmd, e.log, out, n / 2);        /* killed twice, in different epochs */
    ck_assert(access(cursor, F_OK) == 0);
    ck_assert_int_eq(run(cmd, e.log, 60), 0);
    ck_assert_uint_eq(done_count(out), n);
    same_stream(ref_out, out, 0, n);
    ck_assert_int_ge(count_lines_with(e.log, "resuming from"), 2);
    /* started again after the end: nothing more, still exit 0 */
    ck_assert_int_eq(run(cmd, e.log, 60), 0);
    ck_assert_uint_eq(done_count(out), n);

    /* --resume-from-seq S into a fresh out dir: exactly batches S.. of the reference */
    char out2[600];
    snprintf(out2, sizeof out2, "%s/out2", e.dir);
    char sbuf[32];
    uint64_t S = n / 3 + 1;
    snprintf(sbuf, sizeof sbuf, "%llu", (unsigned long long)S);
    char *cmd2[] = {e.pack, "--run", run_dir, "--data", e.idx, "--tokens", "1024", "--epochs", "3", "--window", "64", "--out-dir", out2,
                    "--resume-from-seq", sbuf, NULL};
    kill_after(cmd2, e.log, out2, S + (n - S) / 2);
    /* the same command again (still with --resume-from-seq S) continues instead of rewinding */
    ck_assert_int_eq(run(cmd2, e.log, 60), 0);
    ck_assert_int_eq(count_lines_with(e.log, "already rewound to --resume-from-seq"), 1);
    same_stream(ref_out, out2, S, n);

    /* a changed packing flag refuses the saved cursor with a hint */
    char *cmd3[] = {e.pack, "--run", run_dir, "--data", e.idx, "--tokens", "1000", "--epochs", "3", "--out-dir", out2, NULL};
    ck_assert_int_eq(run(cmd3, e.log, 60), 1);
    ck_assert_int_eq(count_lines_with(e.log, "another dataset or other packing flags"), 1);
}
END_TEST

/* ---------------------------------------------------------------- over a real ring */

static void ring_log_quiet(void *ctx, const char *line) { (void)ctx; (void)line; }

/* A metrics sink on the run's bus socket, as dflash-metrics binds it. */
static int bind_sink(const char *run) {
    char addr[1024], err[256];
    ck_assert_msg(bus_address(run, addr, sizeof addr, err, sizeof err) == 0, "%s", err);
    int s = nn_socket(AF_SP, NN_PULL);
    ck_assert_int_ge(s, 0);
    int to = 200;
    ck_assert_int_eq(nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to), 0);
    ck_assert_msg(nn_bind(s, addr) >= 0, "nn_bind(%s): %s", addr, nn_strerror(nn_errno()));
    return s;
}

/* Receive records until one of `kind` from dflash-pack arrives (fails after timeout_s). */
static void wait_record(int sink, enum bus_kind kind, struct bus_record *r, double timeout_s) {
    double t0 = now_s();
    while (now_s() - t0 < timeout_s) {
        void *msg = NULL;
        int n = nn_recv(sink, &msg, NN_MSG, 0);
        if (n < 0) continue;
        char err[256];
        int rc = bus_decode(msg, (size_t)n, r, err, sizeof err);
        nn_freemsg(msg);
        ck_assert_msg(rc == 0, "bad record from the stage: %s", err);
        if (r->kind == kind && !strcmp(r->stage, "dflash-pack")) return;
    }
    ck_abort_msg("no %s record from dflash-pack within %.0f s", bus_kind_name(kind), timeout_s);
}

START_TEST(ring_resume_after_sigkill) {
    struct env e;
    env_init(&e, "packring", 800);
    char ref_run[600], ref_out[600], run_dir[600], spec[256], shm_log[700];
    snprintf(ref_run, sizeof ref_run, "%s/ref", e.dir);
    snprintf(ref_out, sizeof ref_out, "%s/ref-out", e.dir);
    snprintf(run_dir, sizeof run_dir, "%s/run", e.dir);
    snprintf(shm_log, sizeof shm_log, "%s/shm.log", e.dir);
    char *ref[] = {e.pack, "--run", ref_run, "--data", e.idx, "--tokens", "1024", "--epochs", "2", "--out-dir", ref_out, NULL};
    ck_assert_int_eq(run(ref, e.log, 60), 0);
    uint64_t n = done_count(ref_out);
    ck_assert_uint_gt(n, 100);

    char err[512];
    ck_assert_int_eq(run_dir_init(run_dir, err, sizeof err), 0);   /* the consumer and the sink need it first */
    int sink = bind_sink(run_dir);
    char *shm = (char *)test_bin("dflash-shm");
    ck_assert_msg(access(shm, X_OK) == 0, "%s is not built", shm);
    /* the ring as dflash-pack --print-ring-spec sizes it */
    char spec_path[700];
    snprintf(spec_path, sizeof spec_path, "%s/spec.txt", e.dir);
    char *ps[] = {e.pack, "--tokens", "1024", "--print-ring-spec", NULL};
    ck_assert_int_eq(run(ps, spec_path, 10), 0);
    char *spec_text = test_slurp(spec_path, NULL);
    ck_assert_msg(sscanf(spec_text, "%255s", spec) == 1 && !strncmp(spec, "batches:slots=4,bytes=", 22), "%s", spec_text);
    free(spec_text);
    char *shm_argv[] = {shm, "--run", run_dir, "--ring", spec, NULL};
    pid_t shm_pid = spawn(shm_argv, shm_log);
    char *cmd[] = {e.pack, "--run", run_dir, "--data", e.idx, "--tokens", "1024", "--epochs", "2", NULL};
    pid_t pack = spawn(cmd, e.log);

    ring_set_log(ring_log_quiet, NULL);
    struct ring *r = ring_attach(run_dir, "batches", RING_CONSUMER, 20000, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    /* SIGTERM while the ring is full (no consumer yet): the packer stops cleanly, saying the run is
     * not finished (exit STAGE_EXIT_STOPPED, 3), and does not mark the ring drained */
    double t0 = now_s();
    for (;;) {
        struct ring_status st;
        ring_get_status(r, &st);
        if (st.n_ready == 4) break;
        ck_assert_msg(now_s() - t0 < 30, "the ring never filled up");
        usleep(1000);
    }
    /* metrics: a heartbeat while it waits (about every second), and a summary at exit */
    struct bus_record rec;
    /* the first heartbeat goes out at start (the sink sees the stage at once); one sent while the
     * ring is full shows it */
    double th = now_s();
    do {
        ck_assert_msg(now_s() - th < 10, "no heartbeat with occ_batches == 4");
        wait_record(sink, BUS_KIND_HEARTBEAT, &rec, 10);
        ck_assert(bus_record_get(&rec, BUS_K_TOKENS_PER_S, -1) >= 0);
        ck_assert(bus_record_get(&rec, "occ_batches", -1) >= 0);
    } while (bus_record_get(&rec, "occ_batches", -1) != 4);
    kill(pack, SIGTERM);
    /* read while it exits, as dflash-metrics does: nanomsg drops a record still queued on a pipe
     * whose sender has closed, so a sink that is not reading at that moment loses the summary */
    wait_record(sink, BUS_KIND_SUMMARY, &rec, 5);
    ck_assert_int_eq(wait_exit(pack, 10), 3);
    ck_assert_int_eq(count_lines_with(e.log, "stopped by signal 15 before seq 4"), 1);
    ck_assert_int_eq(count_lines_with(e.log, "stopped by SIGTERM before end of stream"), 1);
    ck_assert_int_eq(ring_is_drained(r), 0);
    ck_assert(bus_record_get(&rec, BUS_K_ITEMS_OUT, -1) == 4);
    ck_assert(bus_record_get(&rec, "next_seq", -1) == 4);
    double pad = bus_record_get(&rec, "padding_frac", -1);
    ck_assert_msg(pad >= 0 && pad < 0.5, "padding_frac %g", pad);
    ck_assert(bus_record_get(&rec, "dropped_samples", -1) == 0);
    ck_assert(bus_record_get(&rec, "truncated_samples", -1) >= 0);
    pack = spawn(cmd, e.log);
    uint8_t *seen = calloc(n, 1);
    uint64_t got = 0, dups = 0, kills = 0, last = 0;
    for (;;) {
        struct ring_slot s;
        int rc = ring_acquire_read(r, 20000, &s);
        if (rc == RING_END) break;
        ck_assert_msg(rc == 0, "ring_acquire_read: %d %s", rc, ring_error());
        ck_assert_uint_lt(s.seq, n);
        struct bfile b;
        ck_assert_int_eq(read_batch_file(ref_out, s.seq, &b), 0);
        ck_assert_msg(s.desc_len == b.desc_len && !memcmp(s.desc, b.desc, b.desc_len), "seq %llu: descriptor differs",
                      (unsigned long long)s.seq);
        ck_assert_msg(s.payload_len == b.payload_len && !memcmp(s.payload, b.payload, b.payload_len),
                      "seq %llu: payload differs", (unsigned long long)s.seq);
        free(b.bytes);
        if (seen[s.seq]) dups++;   /* allowed only as an identical re-publish after a kill */
        else {
            ck_assert_msg(s.seq == 0 || seen[s.seq - 1], "seq %llu before seq %llu", (unsigned long long)s.seq,
                          (unsigned long long)s.seq - 1);
            seen[s.seq] = 1;
            got++;
        }
        last = s.seq;
        ck_assert_int_eq(ring_release(r, &s), 0);
        if ((got == n / 3 && kills == 0) || (got == 2 * n / 3 && kills == 1)) {
            kill(pack, SIGKILL);   /* the ring is full behind us: the packer is mid-stream */
            ck_assert_int_eq(wait_exit(pack, 10), 128 + SIGKILL);
            kills++;
            pack = spawn(cmd, e.log);
        }
    }
    ck_assert_uint_eq(kills, 2);
    ck_assert_uint_eq(got, n);
    ck_assert_uint_eq(last, n - 1);
    ck_assert_uint_le(dups, kills);
    ck_assert_int_eq(wait_exit(pack, 20), 0);
    ring_close(r);
    nn_close(sink);
    free(seen);
    kill(shm_pid, SIGTERM);
    ck_assert_int_eq(wait_exit(shm_pid, 20), 0);
    ck_assert_int_ge(count_lines_with(e.log, "resuming from"), 3);
    ck_assert_int_ge(count_lines_with(e.log, "end of stream at seq"), 2);
}
END_TEST

int main(void) {
    Suite *s = suite_create("pack_stage");
    TCase *tc = tcase_create("pack_stage");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, bad_input_one_line);
    tcase_add_test(tc, out_dir_deterministic);
    tcase_add_test(tc, out_dir_validation_split);
    tcase_add_test(tc, out_dir_resume_after_sigkill);
    tcase_add_test(tc, ring_resume_after_sigkill);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
