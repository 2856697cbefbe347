/*
 * tests/gpu/test_dp_nccl.c — the GPU path of the trainer ranks (stages/train/dp_nccl.h; issue 29), two ranks as
 * two forked processes on cuda:0 and cuda:1 (needs a machine with 2 GPUs: nvidia-h200-x2; on one GPU the test
 * says so on stderr and checks only that one rank refuses nothing it should not):
 *   - sum: each rank fills 3 device buffers with rank-dependent values (exact in fp32); after
 *     dp_nccl_sum_dev_f32 both ranks hold the exact elementwise sum; a host f64 sum, an i64 max and a u64 min/max
 *     give the expected values on both ranks;
 *   - a rank that leaves: rank 1 exits before the collective; rank 0's sum returns -1 within its 5 s bound (plus
 *     slack; or sooner, when NCCL reports the lost peer) with a sentence saying so, instead of hanging.
 * Run with NCCL_NVLS_ENABLE=0 (gpu-machine.md).
 */
#include "train/dp_nccl.h"

#include "tests/test_ring_util.h"
#include "tests/testutil.h"

#include <check.h>
#include <cuda_runtime_api.h>

static int n_devices(void) {
    volatile int *shared = tr_shared(sizeof(int));
    pid_t c = fork();
    if (c == 0) { int n = 0; cudaGetDeviceCount(&n); *shared = n; _exit(0); }
    ck_assert_int_eq(tr_wait(c), 0);
    return *shared;
}

/* one rank: returns 0 when every check passed, else a line number */
static int rank_main(int rank, const char *dir, int leave_early, volatile double *secs, char *msg, size_t cap) {
    char err[400];
    struct dp_nccl *n = dp_nccl_open(rank, 2, rank, dir, 5, err, sizeof err);
    if (!n) { snprintf(msg, cap, "rank %d: %s", rank, err); return __LINE__; }
    if (leave_early && rank == 1) _exit(0);   /* gone before the collective: no destroy, no answer */
    if (leave_early) sleep(1);
    enum { N0 = 1000, N1 = 1, N2 = 70001 };
    size_t counts[3] = {N0, N1, N2};
    float *bufs[3];
    for (int b = 0; b < 3; b++) {
        float *h = malloc(counts[b] * sizeof(float));
        for (size_t i = 0; i < counts[b]; i++) h[i] = (float)((int)(i % 1000) * (rank + 1)) + 0.5f * (float)rank;
        if (cudaMalloc((void **)&bufs[b], counts[b] * sizeof(float)) != cudaSuccess) return __LINE__;
        cudaMemcpy(bufs[b], h, counts[b] * sizeof(float), cudaMemcpyHostToDevice);
        free(h);
    }
    double t0 = tr_now();
    int rc = dp_nccl_sum_dev_f32(n, bufs, counts, 3, NULL, err, sizeof err);
    *secs = tr_now() - t0;
    if (leave_early) {   /* rank 0: the bound, not a hang */
        snprintf(msg, cap, "%s", err);
        return rc == -1 && (strstr(err, "no answer") || strstr(err, "a rank died")) ? 0 : __LINE__;
    }
    if (rc) { snprintf(msg, cap, "rank %d: %s", rank, err); return __LINE__; }
    for (int b = 0; b < 3; b++) {
        float *h = malloc(counts[b] * sizeof(float));
        cudaMemcpy(h, bufs[b], counts[b] * sizeof(float), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < counts[b]; i++) {
            float want = (float)((int)(i % 1000) * 3) + 0.5f;   /* rank 0 + rank 1, exact */
            if (h[i] != want) { snprintf(msg, cap, "rank %d buf %d [%zu] = %g, want %g", rank, b, i, h[i], want); return __LINE__; }
        }
        free(h);
        cudaFree(bufs[b]);
    }
    double x[3] = {1.0 + rank, 10.0 * rank, 0.25};
    if (dp_nccl_sum_host_f64(n, x, 3, err, sizeof err) || x[0] != 3.0 || x[1] != 10.0 || x[2] != 0.5) {
        snprintf(msg, cap, "rank %d: f64 sum %g %g %g %s", rank, x[0], x[1], x[2], err);
        return __LINE__;
    }
    int64_t m = 100 + rank;
    if (dp_nccl_max_host_i64(n, &m, err, sizeof err) || m != 101) { snprintf(msg, cap, "max %lld %s", (long long)m, err); return __LINE__; }
    uint64_t lo, hi;
    if (dp_nccl_minmax_host_u64(n, 7 + (uint64_t)rank, &lo, &hi, err, sizeof err) || lo != 7 || hi != 8) {
        snprintf(msg, cap, "minmax %llu %llu %s", (unsigned long long)lo, (unsigned long long)hi, err);
        return __LINE__;
    }
    dp_nccl_close(n);
    return 0;
}

struct shared { double secs[2]; int line[2]; char msg[2][600]; };

static void run_two(int leave_early) {
    const char *dir = test_tmpdir("dp-nccl");
    struct shared *sh = (struct shared *)tr_shared(sizeof *sh);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            setenv("NCCL_NVLS_ENABLE", "0", 1);
            sh->line[r] = rank_main(r, dir, leave_early, &sh->secs[r], sh->msg[r], sizeof sh->msg[r]);
            _exit(0);
        }
    }
    for (int r = 0; r < 2; r++) ck_assert_int_eq(tr_wait(pid[r]), 0);
    for (int r = 0; r < (leave_early ? 1 : 2); r++)
        ck_assert_msg(sh->line[r] == 0, "rank %d failed at line %d: %s", r, sh->line[r], sh->msg[r]);
    if (leave_early) {
        ck_assert_msg(sh->secs[0] < 60, "rank 0 waited %.1f s for a rank that left (bound 5 s)", sh->secs[0]);
        fprintf(stderr, "test_dp_nccl: rank 1 left; rank 0 returned after %.1f s: %s\n", sh->secs[0], sh->msg[0]);
    }
}

START_TEST(two_ranks_sum) {
    if (n_devices() < 2) { fprintf(stderr, "test_dp_nccl: fewer than 2 GPUs: run it on nvidia-h200-x2\n"); return; }
    run_two(0);
}
END_TEST

START_TEST(rank_leaves_bounded) {
    if (n_devices() < 2) { fprintf(stderr, "test_dp_nccl: fewer than 2 GPUs: run it on nvidia-h200-x2\n"); return; }
    run_two(1);
}
END_TEST

int main(void) {
    Suite *s = suite_create("dp_nccl");
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, two_ranks_sum);
    tcase_add_test(tc, rank_leaves_bounded);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
