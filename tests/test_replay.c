/*
 * tests/test_replay.c — dflash-replay and its module stages/record/replay.h.
 *
 * Module: permutations are permutations, seeded, different per epoch, identity in order;
 * replay_reseq changes only seq, epoch and the plan hash (the replaying run's, issue 25).
 * Stage (real processes, host rings; the recording is made with record_write_file from features
 * items built by the hspack conversion, i.e. what dflash-hspack --record writes):
 * - in order: every replayed item is bit-exact the recorded one (descriptor and payload);
 * - shuffled, 2 epochs: seqs 0..2N-1 in order, position p carries the item the seeded
 *   permutation says, bytes equal except seq/epoch in the descriptor;
 * - a flipped byte, a truncated shard, a shard of another model, another model asked for, no
 *   index: a one-line error naming the batch and file, and nothing damaged reaches the ring;
 *   --on-bad skip publishes the rest with contiguous seqs and counts the skip;
 * - SIGKILL mid-replay and the same command again: every position exactly once downstream.
 */
#include "test_hspack_items.h"

#include "core/record.h"
#include "hspack/hspack.h"
#include "record/replay.h"

#include <sys/wait.h>

#define N_IT 10

static uint8_t g_desc[N_IT][DESC_MAX_BYTES];
static size_t g_dlen[N_IT];
static uint8_t g_pay[N_IT][HI_CAP] __attribute__((aligned(256)));
static uint64_t g_plen[N_IT];

/* A recording of N_IT concat features items in dir; the originals stay in g_*. */
static void make_recording(const char *dir) {
    static uint8_t hdesc[DESC_MAX_BYTES], hpay[HI_CAP] __attribute__((aligned(256)));
    char err[1024];
    for (int q = 0; q < N_IT; q++) {
        size_t hl = hi_make((uint64_t)q, hdesc, sizeof hdesc, hpay, NULL);
        struct hspack_want w = {DESC_LAYOUT_CONCAT, 0, 0, {0}};
        struct hspack_plan p;
        ck_assert_msg(hspack_plan(hdesc, hl, HI_CAP, &w, HI_CAP, &p, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(hspack_convert_host(&p, hpay, g_pay[q], err, sizeof err), 0);
        memcpy(g_desc[q], p.out_desc, p.out_desc_len);
        g_dlen[q] = p.out_desc_len;
        g_plen[q] = p.out.batch.payload_bytes;
        ck_assert_msg(record_write_file(dir, (uint64_t)q, DESC_KIND_FEATURES, g_desc[q], (uint32_t)g_dlen[q], g_pay[q],
                                        g_plen[q], 0, err, sizeof err) == 0, "%s", err);
    }
    ck_assert_int_eq(record_index_write(dir, err, sizeof err), N_IT);
}

static pid_t spawn_replay(const char *run, const char **extra) {
    char path[800];
    snprintf(path, sizeof path, "%s/replay.out", run);
    const char *argv[40] = {test_bin("dflash-replay"), "--run", run, "--device", "cpu", "--wait-ms", "10000", "--heartbeat-s", "0.2"};
    int n = 9;
    for (int i = 0; extra[i] && n < 39; i++) argv[n++] = extra[i];
    return test_spawn_log(path, argv);
}

static const char *start(const char *tag, pid_t *shm, char *rec, size_t rec_len) {
    const char *run = tr_run(tag);
    char spec[200];
    snprintf(spec, sizeof spec, "features:slots=8,bytes=%d,desc=4k,dev=host", HI_CAP);   /* > the 6 items a failing replay leaves */
    *shm = tr_start_shm(run, spec, NULL, NULL);
    ring_set_log(tr_quiet, NULL);
    snprintf(rec, rec_len, "%s/rec", run);
    ck_assert_int_eq(mkdir(rec, 0755), 0);
    make_recording(rec);
    return run;
}

/* Read items from features until RING_END (or, with until_exit, until that pid exited and the
 * ring is empty). got[pos] = the original item index the payload equals, -1 if none. Returns
 * the count; checks seqs are 0, 1, 2, ... in order (dedup: repeats dropped, counted in *dups). */
static int consume(const char *run, int *got, int max, int dedup, int *dups, pid_t until_exit, int sleep_us,
                   int kill_after, pid_t *victim) {
    char err[512];
    struct ring *r = ring_attach(run, "features", RING_CONSUMER, 5000, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int n = 0, exited = 0;
    double t0 = tr_now();
    for (;;) {
        struct ring_slot s;
        int rc = ring_acquire_read(r, 100, &s);
        ck_assert_msg(tr_now() - t0 < 40, "consumer: no end within 40 s (%d items)", n);
        if (rc == RING_TIMEOUT) {
            if (until_exit && exited) break;
            if (until_exit && waitpid(until_exit, NULL, WNOHANG) == until_exit) exited = 1;
            continue;
        }
        if (rc == RING_END) break;
        ck_assert_int_eq(rc, 0);
        if ((int)s.seq < n) {
            ck_assert_msg(dedup, "seq %llu again", (unsigned long long)s.seq);
            (*dups)++;
            ck_assert_int_eq(ring_release(r, &s), 0);
            continue;
        }
        ck_assert_msg((int)s.seq == n, "seq %llu, expected %d", (unsigned long long)s.seq, n);
        ck_assert_int_lt(n, max);
        got[n] = -1;
        for (int q = 0; q < N_IT; q++)
            if (s.payload_len == g_plen[q] && !memcmp(s.payload, g_pay[q], g_plen[q])) got[n] = q;
        /* the descriptor is the original one with this seq (and epoch) */
        struct desc_features f;
        ck_assert_msg(desc_features_decode(s.desc, s.desc_len, s.payload_cap, &f, err, sizeof err) == 0, "%s", err);
        if (got[n] >= 0) {
            uint8_t want[DESC_MAX_BYTES];
            size_t wl = g_dlen[got[n]];
            memcpy(want, g_desc[got[n]], wl);
            ck_assert_int_eq(replay_reseq(want, &wl, sizeof want, s.seq, f.batch.epoch, 0, err, sizeof err), 0);
            ck_assert_msg(wl == s.desc_len && !memcmp(want, s.desc, wl), "seq %llu: descriptor differs beyond seq/epoch",
                          (unsigned long long)s.seq);
        }
        n++;
        if (kill_after && n == kill_after && victim && *victim) { ck_assert_int_eq(kill(*victim, SIGKILL), 0); *victim = 0; }
        if (sleep_us) usleep((useconds_t)sleep_us);
        ck_assert_int_eq(ring_release(r, &s), 0);
    }
    ring_close(r);
    return n;
}

START_TEST(permutations) {
    uint64_t a[50], b[50], c[50];
    replay_permutation(50, 7, 0, 0, a);
    for (int i = 0; i < 50; i++) ck_assert_uint_eq(a[i], (uint64_t)i);
    replay_permutation(50, 7, 0, 1, a);
    replay_permutation(50, 7, 0, 1, b);
    replay_permutation(50, 7, 1, 1, c);
    int same_ab = 1, same_ac = 1, ident = 1, seen[50] = {0};
    for (int i = 0; i < 50; i++) {
        same_ab &= a[i] == b[i];
        same_ac &= a[i] == c[i];
        ident &= a[i] == (uint64_t)i;
        ck_assert_uint_lt(a[i], 50);
        ck_assert(!seen[a[i]]);
        seen[a[i]] = 1;
    }
    ck_assert(same_ab && !same_ac && !ident);
}
END_TEST

START_TEST(reseq_stamps_plan) {
    uint8_t desc[DESC_MAX_BYTES], pay[HI_CAP];
    struct desc_hidden d, h;
    size_t len = hi_make(5, desc, sizeof desc, pay, &d);
    char err[512];
    ck_assert_int_eq(replay_reseq(desc, &len, sizeof desc, 42, 2, 0xc0ffeeull, err, sizeof err), 0);
    ck_assert_msg(desc_hidden_decode(desc, len, 0, &h, err, sizeof err) == 0, "%s", err);
    ck_assert_uint_eq(h.batch.seq, 42);
    ck_assert_uint_eq(h.batch.epoch, d.batch.epoch + 2);
    ck_assert_uint_eq(h.batch.plan, 0xc0ffeeull);
    h.batch.seq = d.batch.seq;   /* nothing else moved */
    h.batch.epoch = d.batch.epoch;
    h.batch.plan = d.batch.plan;
    ck_assert_int_eq(memcmp(&h.batch, &d.batch, sizeof h.batch), 0);
    ck_assert_int_eq(memcmp(h.layers, d.layers, sizeof h.layers), 0);
    ck_assert_uint_eq(h.off_states, d.off_states);
}
END_TEST

START_TEST(in_order_bit_exact) {
    pid_t shm;
    char rec[800];
    const char *run = start("replay-order", &shm, rec, sizeof rec);
    const char *a[] = {"--dir", rec, NULL};
    pid_t rp = spawn_replay(run, a);
    int got[N_IT], dups = 0;
    ck_assert_int_eq(consume(run, got, N_IT, 0, &dups, 0, 0, 0, NULL), N_IT);
    for (int p = 0; p < N_IT; p++) ck_assert_int_eq(got[p], p);
    ck_assert_int_eq(tr_wait(rp), 0);
    tr_stop_shm(shm);
}
END_TEST

START_TEST(shuffled_epochs) {
    pid_t shm;
    char rec[800];
    const char *run = start("replay-shuffle", &shm, rec, sizeof rec);
    const char *a[] = {"--dir", rec, "--epochs", "2", "--shuffle", "--seed", "7", NULL};
    pid_t rp = spawn_replay(run, a);
    int got[2 * N_IT], dups = 0;
    ck_assert_int_eq(consume(run, got, 2 * N_IT, 0, &dups, 0, 0, 0, NULL), 2 * N_IT);
    ck_assert_int_eq(tr_wait(rp), 0);
    uint64_t perm[N_IT];
    int moved = 0;
    for (int e = 0; e < 2; e++) {
        replay_permutation(N_IT, 7, (uint32_t)e, 1, perm);
        for (int i = 0; i < N_IT; i++) {
            ck_assert_int_eq(got[e * N_IT + i], (int)perm[i]);
            moved += perm[i] != (uint64_t)i;
        }
    }
    ck_assert_int_gt(moved, 0);
    tr_stop_shm(shm);
}
END_TEST

/* Drain what a failed replay left in features; returns the original indexes seen. */
static int drain(const char *run, int *got) {
    char err[512];
    struct ring *r = ring_attach(run, "features", RING_CONSUMER, 5000, err, sizeof err);
    ck_assert_msg(r != NULL, "%s", err);
    int n = 0;
    struct ring_slot s;
    while (ring_acquire_read(r, 100, &s) == 0) {
        got[n] = -1;
        for (int q = 0; q < N_IT; q++)
            if (s.payload_len == g_plen[q] && !memcmp(s.payload, g_pay[q], g_plen[q])) got[n] = q;
        n++;
        ck_assert_int_eq(ring_release(r, &s), 0);
    }
    ring_close(r);
    return n;
}

static void copy_file(const char *from, const char *to) {
    static uint8_t buf[1 << 16];
    FILE *f = fopen(from, "rb"), *g = fopen(to, "wb");
    ck_assert(f && g);
    size_t n = fread(buf, 1, sizeof buf, f);
    ck_assert_uint_eq(fwrite(buf, 1, n, g), n);
    fclose(f);
    fclose(g);
}

START_TEST(damaged_and_foreign_recordings) {
    pid_t shm;
    char rec[800], path[900], logp[900], bak[1000], err[1024];
    const char *run = start("replay-bad", &shm, rec, sizeof rec);
    snprintf(logp, sizeof logp, "%s/logs/dflash-replay.log", run);
    int got[N_IT];
    /* 1. one data byte of item 3 flipped: items 0..2 go out, then exit 1 naming batch and file */
    record_path(path, sizeof path, rec, 3);
    snprintf(bak, sizeof bak, "%s.orig", path);
    copy_file(path, bak);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, -10, SEEK_END), 0);
    int c = fgetc(f);
    ck_assert_int_eq(fseek(f, -10, SEEK_END), 0);
    fputc(c ^ 0x10, f);
    fclose(f);
    const char *a1[] = {"--dir", rec, NULL};
    ck_assert_int_eq(tr_wait(spawn_replay(run, a1)), 1);
    char *log = test_slurp_static(logp);
    ck_assert_msg(log && strstr(log, "item-000000000003.safetensors (batch seq 3)") && strstr(log, "checksum"), "%s",
                  log ? log : "(no log)");
    ck_assert_int_eq(drain(run, got), 3);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(got[i], i);
    char flipped[1000];
    snprintf(flipped, sizeof flipped, "%s.flipped", path);
    copy_file(path, flipped);
    copy_file(bak, path);
    /* 3. a truncated shard */
    record_path(path, sizeof path, rec, 5);
    snprintf(bak, sizeof bak, "%s.orig", path);
    copy_file(path, bak);
    ck_assert_int_eq(truncate(path, 3000), 0);
    unlink(logp);
    const char *a3[] = {"--dir", rec, "--start-pos", "0", NULL};
    ck_assert_int_eq(tr_wait(spawn_replay(run, a3)), 1);
    log = test_slurp_static(logp);
    ck_assert_msg(log && strstr(log, "batch seq 5: ") && strstr(log, "item-000000000005.safetensors") && strstr(log, "truncated"),
                  "%s", log ? log : "");
    ck_assert_int_eq(drain(run, got), 5);
    copy_file(bak, path);
    /* 4. a shard of another model under a good name: refused before it reaches the ring */
    static uint8_t hd[DESC_MAX_BYTES], hp[HI_CAP] __attribute__((aligned(256)));
    size_t hl = hi_make(6, hd, sizeof hd, hp, NULL);
    char other[900];
    snprintf(other, sizeof other, "%s/other", run);
    ck_assert_int_eq(mkdir(other, 0755), 0);
    ck_assert_msg(record_write_file(other, 6, DESC_KIND_HIDDEN, hd, (uint32_t)hl, hp, HI_CAP, 0, err, sizeof err) == 0, "%s", err);
    record_path(path, sizeof path, rec, 6);
    snprintf(bak, sizeof bak, "%s.orig", path);
    copy_file(path, bak);
    char op[900];
    record_path(op, sizeof op, other, 6);
    copy_file(op, path);
    unlink(logp);
    ck_assert_int_eq(tr_wait(spawn_replay(run, a3)), 1);
    log = test_slurp_static(logp);
    ck_assert_msg(log && strstr(log, "batch seq 6") && strstr(log, "belongs to another model") && strstr(log, "kind=hidden"),
                  "%s", log ? log : "");
    ck_assert_int_eq(drain(run, got), 6);
    copy_file(bak, path);
    record_path(path, sizeof path, rec, 3);
    copy_file(flipped, path);
    /* 2. (last: it ends the stream on the ring) item 3 flipped again, --on-bad skip: the rest goes
     * out with contiguous seqs, the skip is counted */
    unlink(logp);
    const char *a2[] = {"--dir", rec, "--on-bad", "skip", "--start-pos", "0", NULL};
    pid_t rp = spawn_replay(run, a2);
    int dups = 0, got2[N_IT];
    ck_assert_int_eq(consume(run, got2, N_IT, 0, &dups, 0, 0, 0, NULL), N_IT - 1);
    ck_assert_int_eq(tr_wait(rp), 0);
    for (int i = 0; i < N_IT - 1; i++) ck_assert_int_eq(got2[i], i < 3 ? i : i + 1);
    log = test_slurp_static(logp);
    ck_assert_msg(log && strstr(log, "damaged item skipped (1 so far), batch seq 3") && strstr(log, "1 items skipped as damaged"), "%s",
                  log ? log : "(no log)");
    /* 5. the trainer expects another model; 6. no index */
    char out[900];
    snprintf(out, sizeof out, "%s/replay.out", run);
    unlink(out);
    const char *a5[] = {"--dir", rec, "--hidden-size", "16", NULL};
    ck_assert_int_eq(tr_wait(spawn_replay(run, a5)), 1);
    const char *a6[] = {"--dir", run, NULL};
    ck_assert_int_eq(tr_wait(spawn_replay(run, a6)), 1);
    log = test_slurp_static(out);
    ck_assert_msg(log && strstr(log, "belongs to another model: expected layers=(any) H=16") &&
                  strstr(log, "not a complete recording"), "%s", log ? log : "");
    tr_stop_shm(shm);
}
END_TEST

START_TEST(sigkill_and_restart) {
    enum { E = 3 };
    pid_t shm;
    char rec[800];
    const char *run = start("replay-kill", &shm, rec, sizeof rec);
    const char *a[] = {"--dir", rec, "--epochs", "3", NULL};
    pid_t rp = spawn_replay(run, a);
    volatile int *res = tr_shared((2 + E * N_IT) * sizeof(int));
    pid_t c = fork();
    ck_assert_int_ge(c, 0);
    if (c == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int got[E * N_IT], dups = 0;
        pid_t victim = rp;
        res[0] = consume(run, got, E * N_IT, 1, &dups, 0, 3000, 8, &victim);
        res[1] = dups;
        for (int i = 0; i < res[0]; i++) res[2 + i] = got[i];
        _exit(0);
    }
    int st;
    ck_assert_int_eq(waitpid(rp, &st, 0), rp);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "replay should have been SIGKILLed");
    rp = spawn_replay(run, a);
    ck_assert_int_eq(tr_wait(c), 0);
    ck_assert_int_eq(tr_wait(rp), 0);
    ck_assert_msg(res[0] == E * N_IT, "distinct items %d of %d", res[0], E * N_IT);
    ck_assert_int_le(res[1], 1);
    for (int p = 0; p < E * N_IT; p++) ck_assert_int_eq(res[2 + p], p % N_IT);
    char path[900];
    snprintf(path, sizeof path, "%s/logs/dflash-replay.log", run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "resuming at position"), "%s", log ? log : "");
    tr_stop_shm(shm);
}
END_TEST

int main(void) {
    Suite *s = suite_create("replay");
    TCase *m = tcase_create("module");
    tcase_set_timeout(m, 10);
    tcase_add_test(m, permutations);
    tcase_add_test(m, reseq_stamps_plan);
    suite_add_tcase(s, m);
    TCase *t = tcase_create("stage");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, in_order_bit_exact);
    tcase_add_test(t, shuffled_epochs);
    tcase_add_test(t, damaged_and_foreign_recordings);
    tcase_add_test(t, sigkill_and_restart);
    suite_add_tcase(s, t);
    return test_run_suite(s);
}
