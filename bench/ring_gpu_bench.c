/*
 * bench/ring_gpu_bench.c — GPU-ring hand-off latency and bandwidth between two processes
 * (shm/ring.h, GPU payloads through CUDA IPC). Runs on the GPU machine.
 *
 *   make BUILD=build build/bench/ring_gpu_bench && build/bench/ring_gpu_bench [--iters N]
 *
 * Self-contained: the parent (which never touches CUDA, so fork is safe) forks an owner process
 * that creates two GPU rings `ping` and `pong` on cuda:0 (as dflash-shm would), then two
 * processes A and B that attach to both. Per iteration A claims a ping slot, writes it on the
 * GPU, publishes after syncing its stream (ring_publish_stream); B acquires it, reads it on the
 * GPU into its own buffer, syncs, releases, and answers on pong the same way; A waits for the
 * answer. One-way hand-off = round trip / 2. Variants:
 *   variant 1  host-only hand-off: no GPU work, rings used as plain signals (the futex floor).
 *   variant 2  4 KB payload: cudaMemsetAsync by the writer, cudaMemcpyAsync D2D by the reader,
 *              each followed by a stream sync (the latency a stage pays per item).
 *   variant 3  64 MB payload: the same with full-size copies; GB/s = payload bytes per one-way
 *              hand-off time (napkin: each hand-off moves 64 MB written + 64 MB copied, against
 *              ~4.1 TB/s D2D on the H200: about 30 us of copy time per direction).
 * The first iterations are warm-up; B validates the first byte of every warm-up item with a small
 * D2H copy. Prints median and p99 of the per-iteration one-way time.
 */
#include "shm/ring.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

#define WARM 20

static char g_run[256];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void quiet(void *ctx, const char *line) { (void)ctx; fprintf(stderr, "ring: %s\n", line); }

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); _exit(3); } } while (0)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static struct ring *att(const char *name, int role) {
    char err[512];
    struct ring *r = ring_attach(g_run, name, role, 10000, err, sizeof err);
    if (!r) { fprintf(stderr, "attach %s: %s\n", name, err); _exit(2); }
    return r;
}

/* Write one item into ring `out` (GPU work per variant), then take one from `in`. */
static void send(struct ring *out, uint64_t seq, int variant, size_t bytes, cudaStream_t st) {
    struct ring_slot s;
    int rc;
    while ((rc = ring_acquire_write(out, 1000, &s)) == RING_TIMEOUT) {}
    if (rc != 0) { fprintf(stderr, "acquire_write: %d %s\n", rc, ring_error()); _exit(4); }
    if (variant == 1) {   /* no GPU work: plain publish, no stream sync */
        if (ring_publish(out, &s, seq, 0, 0) != 0) _exit(5);
        return;
    }
    CK(cudaMemsetAsync(s.payload, (int)(seq & 0xff), bytes, st));
    if (ring_publish_stream(out, &s, seq, 0, bytes, st) != 0) _exit(5);
}

static void recv_one(struct ring *in, uint64_t seq, int variant, size_t bytes, void *scratch, cudaStream_t st) {
    struct ring_slot s;
    int rc;
    while ((rc = ring_acquire_read_seq(in, seq, 1000, &s)) == RING_TIMEOUT) {}
    if (rc != 0) { fprintf(stderr, "acquire_read: %d %s\n", rc, ring_error()); _exit(6); }
    if (variant >= 2) {
        CK(cudaMemcpyAsync(scratch, s.payload, bytes, cudaMemcpyDeviceToDevice, st));
        if (seq < WARM) {
            uint8_t b = 0;
            CK(cudaMemcpyAsync(&b, scratch, 1, cudaMemcpyDeviceToHost, st));
            CK(cudaStreamSynchronize(st));
            if (b != (uint8_t)(seq & 0xff)) { fprintf(stderr, "seq %llu: byte %u, expected %u\n", (unsigned long long)seq, b, (unsigned)(seq & 0xff)); _exit(7); }
        }
        CK(cudaStreamSynchronize(st));
    }
    if (ring_release(in, &s) != 0) _exit(8);
}

static int side(int is_a, int variant, size_t bytes, int iters, int result_fd) {
    ring_set_log(quiet, NULL);
    CK(cudaSetDevice(0));
    struct ring *ping_w = is_a ? att("ping", RING_PRODUCER) : att("pong", RING_PRODUCER);
    struct ring *pong_r = is_a ? att("pong", RING_CONSUMER) : att("ping", RING_CONSUMER);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, bytes));
    double *t = calloc((size_t)iters, sizeof *t);
    for (int i = 0; i < WARM + iters; i++) {
        double t0 = now_s();
        if (is_a) {
            send(ping_w, (uint64_t)i, variant, bytes, st);
            recv_one(pong_r, (uint64_t)i, variant, bytes, scratch, st);
        } else {
            recv_one(pong_r, (uint64_t)i, variant, bytes, scratch, st);
            send(ping_w, (uint64_t)i, variant, bytes, st);
        }
        if (i >= WARM) t[i - WARM] = (now_s() - t0) / 2;
    }
    if (is_a && write(result_fd, t, sizeof(double) * (size_t)iters) != (ssize_t)(sizeof(double) * (size_t)iters)) return 9;
    ring_close(ping_w);
    ring_close(pong_r);
    return 0;
}

static int owner(size_t bytes, int ready_fd, int stop_fd) {
    ring_set_log(quiet, NULL);
    char err[512];
    struct ring_spec sp = {.n_slots = 2, .payload_bytes = bytes, .desc_bytes = 64, .device = 0, .n_producers = 1};
    snprintf(sp.name, sizeof sp.name, "ping");
    struct ring *a = ring_create(g_run, &sp, err, sizeof err);
    if (!a) { fprintf(stderr, "owner: %s\n", err); return 1; }
    snprintf(sp.name, sizeof sp.name, "pong");
    struct ring *b = ring_create(g_run, &sp, err, sizeof err);
    if (!b) { fprintf(stderr, "owner: %s\n", err); ring_close(a); return 1; }
    char c = 1;
    if (write(ready_fd, &c, 1) != 1) return 1;
    if (read(stop_fd, &c, 1) < 0) {}   /* parent closes the pipe when done */
    ring_close(a);
    ring_close(b);
    return 0;
}

static pid_t spawn(int (*fn)(int, int, size_t, int, int), int a0, int a1, size_t bytes, int iters, int fd) {
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        _exit(fn(a0, a1, bytes, iters, fd));
    }
    return pid;
}

static int side_tramp(int is_a, int variant, size_t bytes, int iters, int fd) { return side(is_a, variant, bytes, iters, fd); }

static int run_variant(int variant, size_t bytes, int iters) {
    int ready[2], stop[2], res[2];
    if (pipe(ready) || pipe(stop) || pipe(res)) { perror("pipe"); return 1; }
    pid_t o = fork();
    if (o == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(stop[1]);
        _exit(owner(bytes, ready[1], stop[0]));
    }
    close(stop[0]);
    close(ready[1]);   /* so a failed owner reads as EOF */
    char c;
    if (read(ready[0], &c, 1) != 1) { fprintf(stderr, "owner failed to create the rings\n"); waitpid(o, NULL, 0); return 1; }
    pid_t a = spawn(side_tramp, 1, variant, bytes, iters, res[1]);
    pid_t b = spawn(side_tramp, 0, variant, bytes, iters, res[1]);
    close(res[1]);
    double *t = calloc((size_t)iters, sizeof *t);
    size_t want = sizeof(double) * (size_t)iters, got = 0;
    ssize_t k;
    while (got < want && (k = read(res[0], (char *)t + got, want - got)) > 0) got += (size_t)k;
    int sa = 0, sb = 0, so = 0;
    waitpid(a, &sa, 0);
    waitpid(b, &sb, 0);
    close(stop[1]);
    waitpid(o, &so, 0);
    if (got != want || sa || sb || so) { fprintf(stderr, "variant %d failed (A %d, B %d, owner %d)\n", variant, sa, sb, so); return 1; }
    qsort(t, (size_t)iters, sizeof *t, cmp_d);
    double med = t[iters / 2], p99 = t[(size_t)(iters * 0.99)];
    printf("%-7d %10zu %7d %12.1f %12.1f %12.0f %10.2f\n", variant, bytes, iters, med * 1e6, p99 * 1e6, 1.0 / med,
           variant >= 2 ? bytes / med / 1e9 : 0.0);
    close(ready[0]);
    close(res[0]);
    free(t);
    return 0;
}

int main(int argc, char **argv) {
    int iters = 2000;
    if (argc > 2 && !strcmp(argv[1], "--iters")) iters = atoi(argv[2]);
    if (iters < 10) iters = 10;
    snprintf(g_run, sizeof g_run, "/tmp/dflash-ring-gpu-bench-XXXXXX");
    if (!mkdtemp(g_run)) { perror("mkdtemp"); return 1; }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("GPU ring hand-off between two processes on cuda:0 (one-way = round trip / 2)\n");
    printf("%-7s %10s %7s %12s %12s %12s %10s\n", "variant", "bytes", "iters", "median us", "p99 us", "items/s", "GB/s");
    int rc = run_variant(1, 4096, iters) || run_variant(2, 4096, iters) || run_variant(3, 64u << 20, iters / 10 < 50 ? 50 : iters / 10);
    rmdir(g_run);
    return rc;
}
#else
int main(void) {
    printf("ring_gpu_bench: built without CUDA; nothing to measure\n");
    return 0;
}
#endif
