/*
 * stages/train/dp_nccl.h — the GPU path of the trainer ranks (issue 29; dp.h has the contract): one NCCL
 * communicator over the W ranks, gradients summed in fp32 with ncclAllReduce on the drafter's stream.
 *
 * - NCCL is loaded at run time (dlopen libnccl.so.2) only when W > 1, so a one-rank trainer never needs it.
 * - The NCCL id goes from rank 0 to the others through a file on the run directory's filesystem (rank 0 writes
 *   `<dir>/nccl-<launch>.id` atomically; `launch` names this launch: Slurm's job and step, Open MPI's job, or the
 *   launcher's pid), which every rank of a job shares (one host, or a shared filesystem across hosts). No MPI is
 *   needed in a GPU build, whose machine has no Open MPI libraries.
 * - Every collective is waited for with a bound: the stream and ncclCommGetAsyncError are polled; past
 *   timeout_s the communicator is aborted (ncclCommAbort) and the call returns -1 with a sentence saying a rank
 *   stopped answering, so a dead rank never leaves the others in a silent hang. Set NCCL_NVLS_ENABLE=0 (the
 *   scripts do).
 * Not run on a GPU yet (written 2026-12-03): tests/gpu has no two-GPU test; see the issue.
 * Library code: nothing exits; errors are one sentence in err. Without DFLASH_CUDA every call returns -1.
 */
#ifndef STAGES_TRAIN_DP_NCCL_H
#define STAGES_TRAIN_DP_NCCL_H

#include <stddef.h>
#include <stdint.h>

struct dp_nccl;

/* On CUDA device `device` (made current): load NCCL, exchange the id through id_dir, init the
 * communicator. NULL with a sentence. */
struct dp_nccl *dp_nccl_open(int rank, int world, int device, const char *id_dir, double timeout_s, char *err,
                             int err_len);
void dp_nccl_close(struct dp_nccl *n);
/* In-place fp32 sum over ranks of n_bufs device buffers (one NCCL group) on `stream` (a cudaStream_t; NULL: the
 * communicator's own), waited for. 0, or -1 with a sentence. */
int dp_nccl_sum_dev_f32(struct dp_nccl *n, float *const *bufs, const size_t *counts, int n_bufs, void *stream,
                        char *err, int err_len);
/* Host values through a device scratch: sum of n (<= 256) doubles, max of one int64, min and max of one
 * uint64 (*lo, *hi). */
int dp_nccl_sum_host_f64(struct dp_nccl *n, double *x, size_t count, char *err, int err_len);
int dp_nccl_max_host_i64(struct dp_nccl *n, int64_t *x, char *err, int err_len);
int dp_nccl_minmax_host_u64(struct dp_nccl *n, uint64_t x, uint64_t *lo, uint64_t *hi, char *err, int err_len);

#endif /* STAGES_TRAIN_DP_NCCL_H */
