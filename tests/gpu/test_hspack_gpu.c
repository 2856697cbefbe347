/*
 * tests/gpu/test_hspack_gpu.c — the GPU paths of dflash-hspack (run on the GPU machine: make
 * gpu-test, then bash build/gpu/run.sh tests hspack_gpu).
 *
 * - device_layouts_bit_exact: hspack_convert_device gives exactly the bytes of
 *   hspack_convert_host (concat, split, a layer subset; a bf16 item with a tail of T = 97) for
 *   device -> same device, device -> pinned host, pinned host -> device, and, when there are two
 *   GPUs, device 0 -> device 1 (cudaMemcpy3DPeerAsync).
 * - gpu_stage_in_order: dflash-shm owns `hidden` and `features` on cuda:0 (features on cuda:1
 *   when present: the cross-GPU copy); a forked producer publishes bf16 items out of order
 *   (1 0 3 2 5 4); dflash-hspack --device cuda:0 --layout split --record DIR and dflash-record
 *   --verify all on features: every item equals the host conversion, in order, and the hspack
 *   recording is byte-identical to what the recorder wrote.
 * The test process never initialises CUDA outside the test bodies (each runs in its own fork).
 */
#include "core/desc.h"
#include "core/record.h"
#include "hspack/hspack.h"
#include "tests/test_ring_util.h"

#include <cuda_runtime_api.h>

#define T_TOK 97
#define N_DOC 3
#define K_LAY 3
#define H_DIM 64
#define CAP (256 * 1024)

static const char *g_run;

static size_t make_item(uint64_t seq, void *desc, size_t cap, uint8_t *payload, struct desc_hidden *out) {
    struct desc_hidden d;
    memset(&d, 0, sizeof d);
    d.batch.seq = seq;
    d.batch.n_tokens = T_TOK;
    d.batch.budget = 128;
    d.batch.n_docs = N_DOC;
    d.n_layers = K_LAY;
    d.layers[0] = 1; d.layers[1] = 2; d.layers[2] = 3;
    d.dtype = DESC_DTYPE_BF16;
    d.hidden_size = H_DIM;
    desc_hidden_layout(&d);
    memset(payload, 0x33, CAP);   /* garbage in the gaps */
    struct desc_batch_arrays a;
    desc_batch_arrays(&d.batch, payload, &a);
    int cu[N_DOC + 1] = {0, 20, 61, T_TOK};
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
    size_t len = 0;
    char err[512];
    if (desc_hidden_encode(&d, desc, cap, &len, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 0; }
    if (out) *out = d;
    return len;
}

START_TEST(device_layouts_bit_exact) {
    static uint8_t in[CAP] __attribute__((aligned(256))), ref[CAP] __attribute__((aligned(256)));
    uint8_t desc[DESC_MAX_BYTES];
    char err[1024];
    struct desc_hidden hd;
    size_t dl = make_item(3, desc, sizeof desc, in, &hd);
    ck_assert_uint_gt(dl, 0);
    int n_dev = 0;
    ck_assert_int_eq(cudaGetDeviceCount(&n_dev), cudaSuccess);
    ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
    cudaStream_t stream;
    ck_assert_int_eq(cudaStreamCreate(&stream), cudaSuccess);
    void *d_in, *d_out, *d_out1 = NULL, *h_pin, *h_pin2;
    ck_assert_int_eq(cudaMalloc(&d_in, CAP), cudaSuccess);
    ck_assert_int_eq(cudaMalloc(&d_out, CAP), cudaSuccess);
    ck_assert_int_eq(cudaMallocHost(&h_pin, CAP), cudaSuccess);
    ck_assert_int_eq(cudaMallocHost(&h_pin2, CAP), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(d_in, in, CAP, cudaMemcpyHostToDevice), cudaSuccess);
    if (n_dev >= 2) {
        ck_assert_int_eq(cudaSetDevice(1), cudaSuccess);
        ck_assert_int_eq(cudaMalloc(&d_out1, CAP), cudaSuccess);
        ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
    }
    struct hspack_want wants[3] = {{DESC_LAYOUT_CONCAT, 0, 0, {0}}, {DESC_LAYOUT_SPLIT, 0, 0, {0}},
                                   {DESC_LAYOUT_CONCAT, 0, 2, {3, 1}}};
    static uint8_t got[CAP];
    for (int w = 0; w < 3; w++) {
        struct hspack_plan p;
        ck_assert_msg(hspack_plan(desc, dl, CAP, &wants[w], CAP, &p, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(hspack_convert_host(&p, in, ref, err, sizeof err), 0);
        uint64_t pb = p.out.batch.payload_bytes;
        /* device -> device */
        ck_assert_int_eq(cudaMemset(d_out, 0x77, CAP), cudaSuccess);
        ck_assert_msg(hspack_convert_device(&p, d_in, 0, d_out, 0, stream, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(cudaStreamSynchronize(stream), cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(got, d_out, pb, cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_msg(memcmp(got, ref, pb) == 0, "want %d: device -> device differs from the host conversion", w);
        /* device -> pinned host */
        memset(h_pin, 0x55, CAP);
        ck_assert_msg(hspack_convert_device(&p, d_in, 0, h_pin, -1, stream, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(cudaStreamSynchronize(stream), cudaSuccess);
        ck_assert_msg(memcmp(h_pin, ref, pb) == 0, "want %d: device -> host differs", w);
        /* pinned host -> device */
        memcpy(h_pin2, in, CAP);
        ck_assert_int_eq(cudaMemset(d_out, 0x11, CAP), cudaSuccess);
        ck_assert_msg(hspack_convert_device(&p, h_pin2, -1, d_out, 0, stream, err, sizeof err) == 0, "%s", err);
        ck_assert_int_eq(cudaStreamSynchronize(stream), cudaSuccess);
        ck_assert_int_eq(cudaMemcpy(got, d_out, pb, cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_msg(memcmp(got, ref, pb) == 0, "want %d: host -> device differs", w);
        /* device 0 -> device 1 */
        if (d_out1) {
            ck_assert_msg(hspack_convert_device(&p, d_in, 0, d_out1, 1, stream, err, sizeof err) == 0, "%s", err);
            ck_assert_int_eq(cudaStreamSynchronize(stream), cudaSuccess);
            ck_assert_int_eq(cudaMemcpy(got, d_out1, pb, cudaMemcpyDefault), cudaSuccess);
            ck_assert_msg(memcmp(got, ref, pb) == 0, "want %d: cuda:0 -> cuda:1 differs", w);
        }
    }
    /* a dtype change is host-only and says so */
    struct hspack_want wf = {DESC_LAYOUT_CONCAT, DESC_DTYPE_F32, 0, {0}};
    struct hspack_plan pf;
    ck_assert_int_eq(hspack_plan(desc, dl, CAP, &wf, 2 * CAP, &pf, err, sizeof err), 0);
    ck_assert_int_eq(hspack_convert_device(&pf, d_in, 0, d_out, 0, stream, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "host only"), "%s", err);
    cudaFree(d_in);
    cudaFree(d_out);
    if (d_out1) cudaFree(d_out1);
    cudaFreeHost(h_pin);
    cudaFreeHost(h_pin2);
    cudaStreamDestroy(stream);
}
END_TEST

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

static pid_t spawn(const char *bin, const char **extra) {
    char path[800];
    snprintf(path, sizeof path, "%s/%s.out", g_run, bin);
    const char *argv[32] = {test_bin(bin), "--run", g_run, "--device", "cuda:0", "--wait-ms", "10000"};
    int n = 7;
    for (int i = 0; extra[i] && n < 31; i++) argv[n++] = extra[i];
    return test_spawn_log(path, argv);
}

static size_t file_bytes(const char *path, uint8_t *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s missing", path);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

START_TEST(gpu_stage_in_order) {
    int n_dev = 0;
    /* device count without initialising a context in this process: ask in a child */
    volatile int *shared = tr_shared(sizeof(int));
    pid_t c = fork();
    if (c == 0) { int n = 0; cudaGetDeviceCount(&n); *shared = n; _exit(0); }
    ck_assert_int_eq(tr_wait(c), 0);
    n_dev = *shared;
    g_run = tr_run("hspack-gpu");
    char spec[300];
    snprintf(spec, sizeof spec, "hidden:slots=6,bytes=%d,desc=4k,dev=cuda:0,producers=1,features:slots=4,bytes=%d,desc=4k,"
             "dev=cuda:%d", CAP, CAP, n_dev >= 2 ? 1 : 0);
    pid_t shm = tr_start_shm(g_run, spec, NULL, NULL);
    ring_set_log(tr_quiet, NULL);
    char rec[800], out[800], pa[900], pb[900], err[1024];
    snprintf(rec, sizeof rec, "%s/hsrec", g_run);
    snprintf(out, sizeof out, "%s/rec", g_run);
    const char *ha[] = {"--layout", "split", "--window", "4", "--record", rec, NULL};
    pid_t hs = spawn("dflash-hspack", ha);
    const char *ra[] = {"--ring", "features", "--kind", "features", "--verify", "all", "--strict", "--out", out, NULL};
    pid_t rc = spawn("dflash-record", ra);
    static int seqs[] = {1, 0, 3, 2, 5, 4, -1};
    ck_assert_int_eq(tr_wait(tr_fork(producer_main, seqs)), 0);
    ck_assert_int_eq(tr_wait(hs), 0);
    ck_assert_int_eq(tr_wait(rc), 0);
    static uint8_t in[CAP] __attribute__((aligned(256))), ref[CAP] __attribute__((aligned(256)));
    static uint8_t fa[CAP + 8192], fb[CAP + 8192];
    uint8_t desc[DESC_MAX_BYTES];
    struct hspack_want w = {DESC_LAYOUT_SPLIT, 0, 0, {0}};
    for (int q = 0; q <= 5; q++) {
        size_t dl = make_item((uint64_t)q, desc, sizeof desc, in, NULL);
        struct hspack_plan p;
        ck_assert_int_eq(hspack_plan(desc, dl, CAP, &w, CAP, &p, err, sizeof err), 0);
        ck_assert_int_eq(hspack_convert_host(&p, in, ref, err, sizeof err), 0);
        record_path(pa, sizeof pa, out, (uint64_t)q);
        struct record_item it;
        ck_assert_msg(record_read_file(pa, &it, err, sizeof err) == 0, "%s", err);
        ck_assert_uint_eq(it.h.desc_len, p.out_desc_len);
        ck_assert_int_eq(memcmp(it.desc, p.out_desc, p.out_desc_len), 0);
        ck_assert_msg(memcmp(it.payload, ref, p.out.batch.payload_bytes) == 0, "seq %d: GPU features differ from the host "
                      "conversion", q);
        record_item_free(&it);
        record_path(pb, sizeof pb, rec, (uint64_t)q);
        size_t na = file_bytes(pa, fa, sizeof fa), nb = file_bytes(pb, fb, sizeof fb);
        ck_assert_msg(na == nb && !memcmp(fa, fb, na), "seq %d: hspack --record and dflash-record files differ", q);
    }
    tr_stop_shm(shm);
    ck_assert_int_eq(tr_count_segments(g_run), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("hspack_gpu");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, device_layouts_bit_exact);
    tcase_add_test(tc, gpu_stage_in_order);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
