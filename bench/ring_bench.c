/*
 * bench/ring_bench.c — host-ring throughput between two processes (shm/ring.h).
 *
 *   make BUILD=build bench   (or: make build/bench/ring_bench && build/bench/ring_bench [--quick])
 *
 * The bench creates a host ring itself (as dflash-shm would), forks one producer process, and
 * the parent consumes. For 1 KB, 1 MB and 64 MB slots it reports items/s and payload GB/s:
 *   variant 1  hand-off only: the producer writes a 16-byte header and trailer, the consumer
 *              checks them (cost of claim/publish/acquire/release + cache-line traffic).
 *   variant 2  copy in + copy out: the producer memcpy's the whole payload from a private
 *              buffer into the slot, the consumer memcpy's it out (what a CPU stage that fills or
 *              drains a slot pays). Napkin: every payload byte is read twice and written twice,
 *              so payload GB/s x 4 is the memory traffic; compare with the machine's memcpy rate,
 *              printed first.
 * Every item is validated (seq in header and trailer). Each configuration runs 3 times after a
 * warm-up pass over every slot; the median is printed. There is no L2 flush: 1 MB+ payloads
 * stream through the caches anyway, and 1 KB measures the hand-off.
 */
#include "shm/ring.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#define TRAILER_XOR 0x5bd1e9955bd1e995ull

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void quiet(void *ctx, const char *line) { (void)ctx; fprintf(stderr, "ring: %s\n", line); }

static void stamp(uint8_t *p, uint64_t bytes, uint64_t seq) {
    uint64_t t = seq ^ TRAILER_XOR;
    memcpy(p, &seq, 8);
    memcpy(p + bytes - 8, &t, 8);
}
static int stamped(const uint8_t *p, uint64_t bytes, uint64_t seq) {
    uint64_t a, b;
    memcpy(&a, p, 8);
    memcpy(&b, p + bytes - 8, 8);
    return a == seq && b == (seq ^ TRAILER_XOR);
}

static int produce(const char *run, uint64_t bytes, uint64_t n_items, int variant) {
    char err[512];
    struct ring *r = ring_attach(run, "bench", RING_PRODUCER, 5000, err, sizeof err);
    if (!r) { fprintf(stderr, "producer: %s\n", err); return 1; }
    uint8_t *src = malloc(bytes);
    if (!src) return 1;
    for (uint64_t i = 0; i < bytes; i++) src[i] = (uint8_t)(i * 7);
    for (uint64_t seq = 0; seq < n_items; seq++) {
        struct ring_slot s;
        int rc;
        while ((rc = ring_acquire_write(r, 1000, &s)) == RING_TIMEOUT) {}
        if (rc != 0) { fprintf(stderr, "producer: acquire %d %s\n", rc, ring_error()); return 1; }
        if (variant == 2) memcpy(s.payload, src, bytes);
        stamp(s.payload, bytes, seq);
        if (ring_publish(r, &s, seq, 0, bytes) != 0) { fprintf(stderr, "producer: %s\n", ring_error()); return 1; }
    }
    ring_mark_drained(r);
    ring_close(r);
    free(src);
    return 0;
}

/* One run; returns seconds for the timed items (after n_warm), or -1. */
static double run_once(const char *run, uint32_t n_slots, uint64_t bytes, uint64_t n_items, int variant) {
    char err[512];
    struct ring_spec sp = {.n_slots = n_slots, .payload_bytes = bytes, .desc_bytes = 64, .device = -1, .n_producers = 1};
    snprintf(sp.name, sizeof sp.name, "bench");
    struct ring *own = ring_create(run, &sp, err, sizeof err);
    if (!own) { fprintf(stderr, "ring_create: %s\n", err); return -1; }
    uint64_t n_warm = n_slots;
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(produce(run, bytes, n_items + n_warm, variant));
    }
    struct ring *c = ring_attach(run, "bench", RING_CONSUMER, 5000, err, sizeof err);
    if (!c) { fprintf(stderr, "consumer: %s\n", err); ring_close(own); return -1; }
    uint8_t *dst = malloc(bytes);
    double t0 = 0;
    uint64_t got = 0, bad = 0;
    for (;;) {
        struct ring_slot s;
        int rc = ring_acquire_read(c, 5000, &s);
        if (rc == RING_END) break;
        if (rc != 0) { fprintf(stderr, "consumer: rc %d %s\n", rc, ring_error()); bad++; break; }
        if (variant == 2) memcpy(dst, s.payload, bytes);
        if (s.seq != got || !stamped(variant == 2 ? dst : s.payload, bytes, s.seq)) {
            if (bad < 5) fprintf(stderr, "item %llu: got seq %llu (slot %u), stamp %s\n", (unsigned long long)got, (unsigned long long)s.seq, s.index, stamped(variant == 2 ? dst : s.payload, bytes, s.seq) ? "ok" : "BAD");
            bad++;
        }
        ring_release(c, &s);
        if (++got == n_warm) t0 = now_s();
    }
    double dt = now_s() - t0;
    int st = 0;
    waitpid(pid, &st, 0);
    free(dst);
    ring_close(c);
    ring_close(own);
    if (bad || got != n_items + n_warm || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "validation failed: %llu items, %llu bad, producer status %d\n", (unsigned long long)got,
                (unsigned long long)bad, st);
        return -1;
    }
    return dt;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    ring_set_log(quiet, NULL);
    char tmpl[] = "/tmp/dflash-ring-bench-XXXXXX";
    if (!mkdtemp(tmpl)) { perror("mkdtemp"); return 1; }

    /* Reference: one process memcpy of 64 MB (read + write), the ceiling for variant 2. */
    size_t mb64 = 64u << 20;
    uint8_t *a = malloc(mb64), *b = malloc(mb64);
    memset(a, 1, mb64);
    memset(b, 2, mb64);
    double best = 1e9;
    for (int i = 0; i < 5; i++) {
        double t = now_s();
        memcpy(b, a, mb64);
        t = now_s() - t;
        if (t < best) best = t;
    }
    printf("memcpy 64 MB in one process: %.2f GB/s (bytes copied per second; traffic is 2x)\n", mb64 / best / 1e9);
    free(a);
    free(b);

    struct { const char *label; uint64_t bytes; uint32_t slots; uint64_t items; } cfg[] = {
        {"1 KB", 1024, 8, quick ? 20000 : 200000},
        {"1 MB", 1u << 20, 8, quick ? 200 : 2000},
        {"64 MB", 64ull << 20, 4, quick ? 8 : 32},
    };
    printf("%-6s %-7s %6s %9s %12s %10s\n", "slot", "variant", "slots", "items", "items/s", "GB/s");
    for (int v = 1; v <= 2; v++)
        for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
            double t[3];
            for (int rep = 0; rep < 3; rep++) {
                t[rep] = run_once(tmpl, cfg[k].slots, cfg[k].bytes, cfg[k].items, v);
                if (t[rep] < 0) { rmdir(tmpl); return 1; }
            }
            qsort(t, 3, sizeof t[0], cmp_d);
            double med = t[1];
            /* Variant 1 moves no payload bytes: its GB/s is what a stage writing in place would see,
             * so it is printed in parentheses. */
            char gbs[32];
            snprintf(gbs, sizeof gbs, v == 1 ? "(%.1f)" : "%.2f", cfg[k].items * (double)cfg[k].bytes / med / 1e9);
            printf("%-6s %-7s %6u %9llu %12.0f %10s\n", cfg[k].label, v == 1 ? "1 hand" : "2 copy", cfg[k].slots,
                   (unsigned long long)cfg[k].items, cfg[k].items / med, gbs);
        }
    rmdir(tmpl);
    return 0;
}
