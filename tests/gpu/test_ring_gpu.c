/*
 * tests/gpu/test_ring_gpu.c — rings with GPU payloads across processes (design.md §4 "GPU
 * payloads"; issue 3 "done when" on the GPU machine).
 *
 * A real dflash-shm owns the ring and its cudaMalloc buffers. Producers and consumers are forked
 * children that initialise CUDA themselves (the test process never touches CUDA, so fork is
 * safe) and open the IPC handles through ring_attach.
 * - producer_killed_after_publish: a producer writes a 16 MB pattern with cudaMemcpyAsync,
 *   publishes with ring_publish_stream and is SIGKILLed; a consumer started afterwards reads it
 *   intact (checksum), is itself SIGKILLed while holding it, and a third process gets it again
 *   (deliveries == 2) and verifies it once more.
 * - producer_killed_mid_write: a producer killed while its slot is WRITING leaves nothing
 *   visible; the slot is recovered to FREE.
 */
#include <cuda_runtime_api.h>

#include "tests/test_ring_util.h"

#define GPU_BYTES (16u << 20)

static const char *g_run;
static int g_pipe[2];

struct gpu_desc { uint64_t seq, len, sum; };

static void pattern(uint8_t *p, uint64_t n, uint64_t seq) {
    for (uint64_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 2654435761u >> 7) ^ (seq * 97) ^ (i >> 12));
}

static struct ring *attach_child(int role) {
    char err[512];
    ring_set_log(tr_quiet, NULL);
    struct ring *r = ring_attach(g_run, "hidden", role, 5000, err, sizeof err);
    if (!r) fprintf(stderr, "attach: %s\n", err);
    return r;
}

/* Write seq 7's pattern into a slot from the GPU side, publish, report, hang. */
static int producer_publish_main(void *arg) {
    (void)arg;
    struct ring *r = attach_child(RING_PRODUCER);
    if (!r) return 10;
    struct ring_slot s;
    if (ring_acquire_write(r, 5000, &s) != 0 || !s.on_device || s.payload_cap < GPU_BYTES) return 11;
    uint8_t *host = malloc(GPU_BYTES);
    pattern(host, GPU_BYTES, 7);
    cudaStream_t st;
    if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) return 12;
    if (cudaMemcpyAsync(s.payload, host, GPU_BYTES, cudaMemcpyHostToDevice, st) != cudaSuccess) return 13;
    struct gpu_desc d = {7, GPU_BYTES, item_fnv(host, GPU_BYTES)};
    memcpy(s.desc, &d, sizeof d);
    if (ring_publish_stream(r, &s, 7, sizeof d, GPU_BYTES, st) != 0) { fprintf(stderr, "%s\n", ring_error()); return 14; }
    char c = 1;
    if (write(g_pipe[1], &c, 1) != 1) return 15;
    for (;;) pause();
}

/* Read the item back to the host and verify it; hang while holding it when arg != NULL. */
static int consumer_verify_main(void *arg) {
    struct ring *r = attach_child(RING_CONSUMER);
    if (!r) return 20;
    struct ring_slot s;
    int rc = ring_acquire_read(r, 5000, &s);
    if (rc != 0) { fprintf(stderr, "acquire_read: %d %s\n", rc, ring_error()); return 21; }
    struct gpu_desc d;
    memcpy(&d, s.desc, sizeof d);
    if (!s.on_device || s.seq != 7 || d.seq != 7 || s.payload_len != GPU_BYTES || d.len != GPU_BYTES) return 22;
    uint8_t *host = malloc(GPU_BYTES), *ref = malloc(GPU_BYTES);
    if (cudaMemcpy(host, s.payload, GPU_BYTES, cudaMemcpyDeviceToHost) != cudaSuccess) return 23;
    pattern(ref, GPU_BYTES, 7);
    if (item_fnv(host, GPU_BYTES) != d.sum || memcmp(host, ref, GPU_BYTES) != 0) { fprintf(stderr, "checksum mismatch\n"); return 24; }
    int expect_deliveries = arg ? 1 : 2;
    if ((int)s.deliveries != expect_deliveries) { fprintf(stderr, "deliveries %u\n", s.deliveries); return 25; }
    if (arg) {
        char c = 1;
        if (write(g_pipe[1], &c, 1) != 1) return 26;
        for (;;) pause();
    }
    if (ring_release(r, &s) != 0) return 27;
    ring_close(r);
    return 0;
}

START_TEST(producer_killed_after_publish) {
    g_run = tr_run("ringgpu");
    pid_t shm = tr_start_shm(g_run, "hidden:slots=2,bytes=16M,desc=64,dev=cuda:0", NULL, NULL);
    ck_assert_int_eq(pipe(g_pipe), 0);
    char c;
    pid_t p = tr_fork(producer_publish_main, NULL);
    ck_assert_int_eq(read(g_pipe[0], &c, 1), 1);
    kill(p, SIGKILL);
    ck_assert_int_eq(tr_wait(p), 128 + SIGKILL);
    pid_t a = tr_fork(consumer_verify_main, (void *)1);   /* reads it, then is killed holding it */
    ck_assert_int_eq(read(g_pipe[0], &c, 1), 1);
    kill(a, SIGKILL);
    ck_assert_int_eq(tr_wait(a), 128 + SIGKILL);
    pid_t b = tr_fork(consumer_verify_main, NULL);       /* gets it again and verifies */
    ck_assert_int_eq(tr_wait(b), 0);
    char err[512];
    struct ring *o = ring_attach(g_run, "hidden", RING_OBSERVER, 1000, err, sizeof err);
    ck_assert_msg(o != NULL, "%s", err);
    struct ring_status st;
    ring_get_status(o, &st);
    ring_close(o);
    ck_assert_uint_eq(st.redelivered, 1);
    ck_assert_uint_eq(st.consumed, 1);
    ck_assert_int_eq(st.device, 0);
    tr_shutdown_shm(g_run, shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

static int producer_half_main(void *arg) {
    (void)arg;
    struct ring *r = attach_child(RING_PRODUCER);
    if (!r) return 30;
    struct ring_slot s;
    if (ring_acquire_write(r, 5000, &s) != 0) return 31;
    if (cudaMemset(s.payload, 0xab, GPU_BYTES / 2) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) return 32;
    char c = 1;
    if (write(g_pipe[1], &c, 1) != 1) return 33;
    for (;;) pause();
}

static int consumer_expect_nothing_main(void *arg) {
    (void)arg;
    struct ring *r = attach_child(RING_CONSUMER);
    if (!r) return 40;
    struct ring_slot s;
    int rc = ring_acquire_read(r, 500, &s);
    ring_close(r);
    return rc == RING_TIMEOUT ? 0 : 41;
}

START_TEST(producer_killed_mid_write) {
    g_run = tr_run("ringgpuw");
    pid_t shm = tr_start_shm(g_run, "hidden:slots=2,bytes=16M,desc=64,dev=cuda:0", NULL, NULL);
    ck_assert_int_eq(pipe(g_pipe), 0);
    char c;
    pid_t p = tr_fork(producer_half_main, NULL);
    ck_assert_int_eq(read(g_pipe[0], &c, 1), 1);
    kill(p, SIGKILL);
    ck_assert_int_eq(tr_wait(p), 128 + SIGKILL);
    pid_t q = tr_fork(consumer_expect_nothing_main, NULL);
    ck_assert_int_eq(tr_wait(q), 0);
    char err[512];
    struct ring *o = ring_attach(g_run, "hidden", RING_OBSERVER, 1000, err, sizeof err);
    ck_assert_msg(o != NULL, "%s", err);
    struct ring_status st;
    ring_get_status(o, &st);
    ring_close(o);
    ck_assert_uint_eq(st.recovered_writes, 1);
    ck_assert_uint_eq(st.n_free, 2);
    tr_shutdown_shm(g_run, shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ring_gpu");
    TCase *tc = tcase_create("ring_gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, producer_killed_after_publish);
    tcase_add_test(tc, producer_killed_mid_write);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
