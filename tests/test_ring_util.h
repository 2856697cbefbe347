/*
 * tests/test_ring_util.h — helpers for the ring suites (tests/test_ring.c, tests/test_ring_mp.c,
 * tests/gpu/test_ring_gpu.c): start and stop a real dflash-shm, fork worker processes that die
 * with the test, the item pattern every producer writes and every consumer checks, and the
 * "no segment left behind" check.
 *
 * Item pattern: payload byte i of seq s is (s * 131 + i * 7 + (s >> 8)) & 0xff, length
 * 16 + s % 200 bytes (or a fixed length for big payloads); the descriptor holds seq, length and
 * the FNV-1a checksum of the payload, so a consumer verifies each item without shared state.
 */
#ifndef TESTS_TEST_RING_UTIL_H
#define TESTS_TEST_RING_UTIL_H

#include "shm/ring.h"
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

struct item_desc { uint64_t seq, len, sum; };

static inline uint64_t item_fnv(const uint8_t *p, uint64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
static inline uint64_t item_len(uint64_t seq) { return 16 + seq % 200; }
static inline void item_fill(uint8_t *p, uint64_t seq, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)(seq * 131 + i * 7 + (seq >> 8));
}
/* Write item seq into a host slot (descriptor + payload). */
static inline void item_write(struct ring_slot *s, uint64_t seq) {
    uint64_t n = item_len(seq);
    item_fill(s->payload, seq, n);
    struct item_desc d = {seq, n, item_fnv(s->payload, n)};
    memcpy(s->desc, &d, sizeof d);
}
/* 1 if the host slot holds a complete, correct item. */
static inline int item_check(const struct ring_slot *s) {
    struct item_desc d;
    if (s->desc_len != sizeof d || s->payload_len != item_len(s->seq)) return 0;
    memcpy(&d, s->desc, sizeof d);
    if (d.seq != s->seq || d.len != s->payload_len) return 0;
    uint8_t ref[256];
    item_fill(ref, s->seq, d.len);
    return memcmp(ref, s->payload, d.len) == 0 && item_fnv(s->payload, d.len) == d.sum;
}

static inline double tr_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Anonymous shared memory that forked children see (zeroed). */
static inline void *tr_shared(size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ck_assert_msg(p != MAP_FAILED, "mmap shared %zu bytes failed", bytes);
    return p;
}

/* Fork a worker that dies with the test process (PDEATHSIG) and _exits with fn's return. */
static inline pid_t tr_fork(int (*fn)(void *), void *arg) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(fn(arg));
    }
    return pid;
}

/* Wait for pid; returns its exit code, or 128 + signal. */
static inline int tr_wait(pid_t pid) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Start dflash-shm for run with up to 3 --ring specs (NULL-terminated), wait until every ring
 * can be attached (observer), and return its pid. */
static inline pid_t tr_start_shm(const char *run, const char *spec1, const char *spec2, const char *extra) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        const char *argv[12];
        int n = 0;
        argv[n++] = test_bin("dflash-shm");
        argv[n++] = "--run";
        argv[n++] = run;
        argv[n++] = "--ring";
        argv[n++] = spec1;
        if (spec2) { argv[n++] = "--ring"; argv[n++] = spec2; }
        if (extra) argv[n++] = extra;
        argv[n] = NULL;
        execv(argv[0], (char **)argv);
        fprintf(stderr, "execv(%s) failed: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    /* Ready once shm.json says running (written after every ring exists and the socket is bound). */
    char path[700];
    snprintf(path, sizeof path, "%s/shm.json", run);
    double t0 = tr_now();
    for (;;) {
        FILE *f = fopen(path, "r");
        if (f) {
            char buf[4096];
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            fclose(f);
            buf[n] = 0;
            if (strstr(buf, "\"running\"")) break;
        }
        int st;
        ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "dflash-shm exited during start-up (status %d)", st);
        ck_assert_msg(tr_now() - t0 < 10, "dflash-shm did not write %s within 10 s", path);
        usleep(10000);
    }
    return pid;
}

/* SIGTERM dflash-shm and require a clean exit 0 (every ring drained and empty: a signal then
 * closes and unlinks them). */
static inline void tr_stop_shm(pid_t pid) {
    ck_assert_int_eq(kill(pid, SIGTERM), 0);
    ck_assert_int_eq(tr_wait(pid), 0);
}

/* End the run explicitly (`dflash-shm --run RUN --shutdown`: close and unlink every ring whatever
 * they hold) and require exit 0 from both. For tests that stop a stream mid-way, where SIGTERM
 * would keep the rings for a restart and exit 3. */
static inline void tr_shutdown_shm(const char *run, pid_t pid) {
    pid_t c = fork();
    ck_assert_int_ge(c, 0);
    if (c == 0) {
        execl(test_bin("dflash-shm"), "dflash-shm", "--run", run, "--shutdown", (char *)NULL);
        _exit(127);
    }
    ck_assert_int_eq(tr_wait(c), 0);
    ck_assert_int_eq(tr_wait(pid), 0);
}

/* Number of /dev/shm segments of this run (must be 0 after dflash-shm stopped). */
static inline int tr_count_segments(const char *run) {
    char id[128], err[256], prefix[200];
    ck_assert_msg(ring_run_id(run, id, sizeof id, err, sizeof err) == 0, "%s", err);
    snprintf(prefix, sizeof prefix, "dflash.%s.", id);
    DIR *d = opendir("/dev/shm");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
}

/* A run directory under a fresh temp dir. */
static inline const char *tr_run(const char *tag) {
    static char run[4][600];
    static int which;
    char *out = run[which++ & 3];
    snprintf(out, sizeof run[0], "%s/run", test_tmpdir(tag));
    ck_assert_int_eq(mkdir(out, 0755), 0);
    return out;
}

/* Silence the ring log hook in children that expect recoveries (keeps test logs short). */
static inline void tr_quiet(void *ctx, const char *line) { (void)ctx; (void)line; }

#endif /* TESTS_TEST_RING_UTIL_H */
