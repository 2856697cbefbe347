/*
 * tests/gpu/test_record_gpu.c — dflash-record on a ring with GPU payloads (run on the GPU
 * machine: make gpu-test, then bash build/gpu/run.sh tests record).
 *
 * A real dflash-shm owns a `hidden` ring on cuda:0. A forked producer (which initialises CUDA
 * itself; the test process never touches CUDA, so fork is safe) copies bf16 hidden items into the
 * slots' device buffers and publishes them with ring_publish_stream: seqs 0..5 with seq 3 twice.
 * - gpu_items_recorded: dflash-record --device cuda:0 --verify all --out DIR copies each payload
 *   to the host, checks it, writes it; every file reads back byte-identical to what the producer
 *   copied in, the duplicate is dropped and counted.
 * - gpu_nan_rejected_only_when_verified: an item with a NaN state passes --verify host (GPU
 *   payloads unchecked, descriptors only) and is rejected by --verify all with a sentence.
 */
#include "core/desc.h"
#include "core/record.h"
#include "tests/test_ring_util.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>

#define T_TOK 48
#define N_DOC 2
#define K_LAY 3
#define H_DIM 64
#define CAP (256 * 1024)

static const char *g_run;
static int g_nan_seq = -1;   /* the producer writes a NaN into this seq's states */

/* Host image of bf16 hidden item seq: descriptor into desc, payload into payload (CAP bytes). */
static size_t make_item(uint64_t seq, void *desc, size_t cap, uint8_t *payload, struct desc_hidden *out) {
    struct desc_hidden d;
    memset(&d, 0, sizeof d);
    d.batch.seq = seq;
    d.batch.n_tokens = T_TOK;
    d.batch.budget = 64;
    d.batch.n_docs = N_DOC;
    d.n_layers = K_LAY;
    d.layers[0] = 1; d.layers[1] = 2; d.layers[2] = 3;
    d.dtype = DESC_DTYPE_BF16;
    d.hidden_size = H_DIM;
    desc_hidden_layout(&d);
    memset(payload, 0, CAP);
    struct desc_batch_arrays a;
    desc_batch_arrays(&d.batch, payload, &a);
    int cu[N_DOC + 1] = {0, 20, T_TOK};
    uint32_t n_loss = 0;
    for (int doc = 0; doc < N_DOC; doc++) {
        a.row_ids[doc] = (int64_t)(seq * N_DOC + (uint64_t)doc);
        a.cu_seqlens[doc] = cu[doc];
        for (int t = cu[doc]; t < cu[doc + 1]; t++) {
            a.input_ids[t] = (int32_t)((seq * 13 + (uint64_t)t) % 1000);
            a.position_ids[t] = t - cu[doc];
            a.doc_ids[t] = doc;
            a.loss_mask[t] = t - cu[doc] >= 2;
            n_loss += a.loss_mask[t];
        }
    }
    a.cu_seqlens[N_DOC] = T_TOK;
    d.batch.n_loss = n_loss;
    uint16_t *st = (uint16_t *)(payload + d.off_states), *last = (uint16_t *)(payload + d.off_last);
    for (int i = 0; i < K_LAY * T_TOK * H_DIM; i++) st[i] = (uint16_t)(0x3c00 + (seq * 7 + (uint64_t)i) % 0x300);
    for (int i = 0; i < T_TOK * H_DIM; i++) last[i] = (uint16_t)(0xbc00 + (seq + (uint64_t)i) % 0x300);
    if ((int64_t)seq == g_nan_seq) st[5] = 0x7fc0;
    size_t len = 0;
    char err[512];
    if (desc_hidden_encode(&d, desc, cap, &len, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 0; }
    if (out) *out = d;
    return len;
}

/* Forked producer: publish seqs (a list ending with -1) from device memory, then drain. */
static int producer_main(void *arg) {
    const int *seqs = arg;
    char err[512];
    ring_set_log(tr_quiet, NULL);
    if (cudaSetDevice(0) != cudaSuccess) return 10;
    struct ring *r = ring_attach(g_run, "hidden", RING_PRODUCER, 5000, err, sizeof err);
    if (!r) { fprintf(stderr, "attach: %s\n", err); return 11; }
    cudaStream_t stream;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 12;
    uint8_t *host = aligned_alloc(256, CAP);
    for (int i = 0; seqs[i] >= 0; i++) {
        struct ring_slot s;
        if (ring_acquire_write(r, 10000, &s) != 0 || !s.on_device) return 13;
        struct desc_hidden d;
        size_t dl = make_item((uint64_t)seqs[i], s.desc, s.desc_cap, host, &d);
        if (!dl) return 14;
        if (cudaMemcpyAsync(s.payload, host, d.batch.payload_bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess) return 15;
        if (ring_publish_stream(r, &s, (uint64_t)seqs[i], (uint32_t)dl, d.batch.payload_bytes, stream)) return 16;
    }
    if (ring_mark_drained(r)) return 17;
    ring_close(r);
    free(host);
    return 0;
}

static pid_t spawn_record(const char **extra) {
    char path[800];
    snprintf(path, sizeof path, "%s/record.out", g_run);
    const char *argv[24] = {test_bin("dflash-record"), "--run", g_run, "--device", "cuda:0"};
    int n = 5;
    for (int i = 0; extra[i] && n < 23; i++) argv[n++] = extra[i];
    return test_spawn_log(path, argv);
}

static pid_t start(void) {
    g_run = tr_run("record-gpu");
    char spec[200];
    snprintf(spec, sizeof spec, "hidden:slots=4,bytes=%d,desc=4k,dev=cuda:0", CAP);
    return tr_start_shm(g_run, spec, NULL, NULL);
}

START_TEST(gpu_items_recorded) {
    pid_t shm = start();
    char out[800], path[900], err[1024];
    snprintf(out, sizeof out, "%s/rec", g_run);
    const char *args[] = {"--out", out, "--verify", "all", "--kind", "hidden", "--strict", NULL};
    pid_t rec = spawn_record(args);
    static int seqs[] = {0, 1, 2, 3, 3, 4, 5, -1};
    pid_t prod = tr_fork(producer_main, seqs);
    ck_assert_int_eq(tr_wait(prod), 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    static uint8_t ref[CAP] __attribute__((aligned(256)));
    uint8_t rdesc[DESC_MAX_BYTES];
    for (int q = 0; q <= 5; q++) {
        ck_assert_int_eq(record_path(path, sizeof path, out, (uint64_t)q), 0);
        struct record_item it;
        ck_assert_msg(record_read_file(path, &it, err, sizeof err) == 0, "%s", err);
        struct desc_hidden d;
        size_t dl = make_item((uint64_t)q, rdesc, sizeof rdesc, ref, &d);
        ck_assert_uint_eq(it.h.desc_len, dl);
        ck_assert_int_eq(memcmp(it.desc, rdesc, dl), 0);
        ck_assert_uint_eq(it.h.payload_len, d.batch.payload_bytes);
        ck_assert_msg(memcmp(it.payload, ref, d.batch.payload_bytes) == 0, "seq %d: GPU payload differs on disk", q);
        record_item_free(&it);
    }
    snprintf(path, sizeof path, "%s/DONE", out);
    char *done = test_slurp_static(path);
    ck_assert_msg(done && strstr(done, "\"recorded\": 6,") && strstr(done, "\"duplicates\": 1,"), "DONE: %s", done ? done : "");
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

START_TEST(gpu_nan_rejected_only_when_verified) {
    pid_t shm = start();
    g_nan_seq = 1;
    char path[900];
    /* descriptors only: the NaN is not seen */
    const char *a1[] = {"--expect", "2", NULL};
    pid_t rec = spawn_record(a1);
    static int s1[] = {0, 1, -1};
    ck_assert_int_eq(tr_wait(tr_fork(producer_main, s1)), 0);
    ck_assert_int_eq(tr_wait(rec), 0);
    tr_shutdown_shm(g_run, shm);
    shm = start();
    const char *a2[] = {"--verify", "all", NULL};
    rec = spawn_record(a2);
    ck_assert_int_eq(tr_wait(tr_fork(producer_main, s1)), 0);
    ck_assert_int_eq(tr_wait(rec), 1);
    snprintf(path, sizeof path, "%s/logs/dflash-record.log", g_run);
    char *log = test_slurp_static(path);
    ck_assert_msg(log && strstr(log, "item rejected: seq 1: captured state value 5") && strstr(log, "is not finite"),
                  "log: %s", log ? log : "");
    tr_shutdown_shm(g_run, shm);
}
END_TEST

int main(void) {
    Suite *s = suite_create("record_gpu");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gpu_items_recorded);
    tcase_add_test(tc, gpu_nan_rejected_only_when_verified);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
