/*
 * stages/train/dp.h — data-parallel trainer ranks on the CPU path (issue 29; design.md §8 "Scale").
 *
 * dflash-train runs as W ranks when launched by `mpirun -np W` (Open MPI; the build defines DFLASH_MPI
 * when pkg-config ompi-c is present in a CPU build, `make MPI=0` leaves it out) or `srun`. Without a launcher
 * it is one rank and nothing here talks to anyone. The CPU path's collectives are MPI's; the GPU path's are
 * NCCL's (dp_use_nccl, dp_nccl.h), which needs no MPI. A CPU trainer built without MPI started as one of
 * W > 1 ranks refuses to start (one line), so W copies never train W separate drafters.
 *
 * The contract (dflash-train's DESIGN carries the user side):
 * - Data: every rank of a host attaches that host's `features` ring (one host: the run's; several hosts: its
 *   host's chain's, RUN/hosts/H, which carries only that host's ranks' seqs); rank r claims only the seqs s with s % W == r
 *   (ring_set_rank). With --grad-accum A per rank, one optimizer step consumes A·W consecutive seqs and
 *   rank r takes micro-batches r, r+W, ..., so W ranks x A equal one rank with --grad-accum A·W over the
 *   same batches (validation items are refused with ranks: they would break the stride).
 * - Weights: identical at start, checked by a hash of every parameter (dp_check_same).
 * - Gradients: each rank computes its micro-batches' gradient (each from zero, added: step_cpu.c), then
 *   one fp32 sum over ranks per optimizer step (dp_sum_f32), scaled by 1/(A·W). For W = 2 and A = 1 the
 *   sum a + b is the one-rank accumulation g0 + g1 bit for bit; for more addends MPI's reduction order
 *   decides the rounding (the ranks stay identical to each other).
 * - Metrics: sums and totals reduced over ranks (dp_sum_f64) before the one record rank 0 sends.
 * - Checkpoints: rank 0 alone writes them (and state/train.json, exports), with the data position
 *   next_seq = the highest seq any rank consumed + 1 (dp_max_i64).
 * - Failure: a rank that dies is seen by mpirun, which stops the others and names the rank; the same
 *   command resumes every rank from rank 0's last checkpoint with the same assignment.
 *
 * Library code: nothing exits; errors are one sentence in err.
 */
#ifndef STAGES_TRAIN_DP_H
#define STAGES_TRAIN_DP_H

#include <stddef.h>
#include <stdint.h>

struct dp_nccl;
struct dp {
    int rank, world;   /* 0 and 1 without a launcher */
    int inited;        /* MPI_Init was called here (dp_finish finalizes) */
    int mpi;           /* 1: the collectives below go over MPI (CPU path) */
    struct dp_nccl *nccl;   /* the GPU path's communicator (dp_use_nccl): the collectives go over NCCL */
};

/* The launcher's world: under mpirun (OMPI_COMM_WORLD_SIZE/RANK, PMI) or srun (SLURM_STEP_NUM_TASKS and
 * SLURM_PROCID: set for an srun step, not for a batch script) with world > 1: MPI_Init in a build with MPI (d->mpi = 1); without MPI only rank and world are read from the
 * environment (d->mpi = 0: the caller must give the ranks NCCL, dp_use_nccl, or refuse). Otherwise rank 0 of 1.
 * 0, or -1 with a sentence. */
int dp_init(struct dp *d, int *argc, char ***argv, char *err, int err_len);
/* The GPU path: from now on the collectives go over NCCL (on CUDA device `device`; the id through id_dir,
 * every wait bounded by timeout_s; dp_nccl.h). 0, or -1 with a sentence. */
int dp_use_nccl(struct dp *d, int device, const char *id_dir, double timeout_s, char *err, int err_len);
/* In-place sum over ranks of n floats / doubles (a no-op for one rank). 0, or -1 with a sentence. dp_sum_f32 is
 * for host buffers over MPI (the CPU path); device gradients go through dp_nccl_sum_dev_f32. */
int dp_sum_f32(struct dp *d, float *x, size_t n, char *err, int err_len);
int dp_sum_f64(struct dp *d, double *x, size_t n, char *err, int err_len);
/* The max over ranks of *x, in place. */
int dp_max_i64(struct dp *d, int64_t *x, char *err, int err_len);
/* Every rank's hash equals rank 0's; -1 with "rank R's <what> differ from rank 0's (hash X vs Y)". */
int dp_check_same(struct dp *d, uint64_t hash, const char *what, char *err, int err_len);
/* This rank's index among the ranks of its host (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, ...; 0 when none is
 * set): a GPU rank uses cuda:(the plan's device + local rank). */
int dp_local_rank(void);
/* MPI_Finalize when dp_init initialized (after the last collective). */
void dp_finish(struct dp *d);
/* Stop every rank now (a rank that fails alone must not leave the others in a collective). */
void dp_abort(struct dp *d, int code);

/* FNV-1a 64 over n bytes, continuing from h (start with DP_HASH_INIT). */
#define DP_HASH_INIT 0xcbf29ce484222325ull
uint64_t dp_hash(uint64_t h, const void *p, size_t n);

#endif /* STAGES_TRAIN_DP_H */
