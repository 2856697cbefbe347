/*
 * stages/train/dp.c — data-parallel ranks (dp.h): Open MPI collectives when built with DFLASH_MPI,
 * one rank otherwise.
 */
#include "train/dp.h"

#include "core/err.h"
#include "train/dp_nccl.h"

#include <stdlib.h>
#include <string.h>
#ifdef DFLASH_MPI
#include <mpi.h>
#endif

uint64_t dp_hash(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

/* The world size the launcher announces (Open MPI, PMIx, Slurm's srun), or 1. */
static int launcher_env(const char *const *keys, int dflt) {
    for (int i = 0; keys[i]; i++) {
        const char *v = getenv(keys[i]);
        if (v && *v) return atoi(v);
    }
    return dflt;
}
static int launcher_world(void) {
    static const char *const keys[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS", NULL};
    int w = launcher_env(keys, 1);
    return w > 0 ? w : 1;
}
#ifndef DFLASH_MPI
static int launcher_rank(void) {
    static const char *const keys[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    return launcher_env(keys, 0);
}
#endif

int dp_local_rank(void) {
    static const char *const keys[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
    int r = launcher_env(keys, 0);
    return r > 0 ? r : 0;
}

int dp_use_nccl(struct dp *d, int device, const char *id_dir, double timeout_s, char *err, int err_len) {
    if (d->world <= 1) return 0;
    d->nccl = dp_nccl_open(d->rank, d->world, device, id_dir, timeout_s, err, err_len);
    return d->nccl ? 0 : -1;
}

int dp_init(struct dp *d, int *argc, char ***argv, char *err, int err_len) {
    memset(d, 0, sizeof *d);
    d->world = 1;
    int want = launcher_world();
#ifdef DFLASH_MPI
    if (want > 1) {
        int prov;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &prov) != MPI_SUCCESS)
            return err_fail(err, err_len, "MPI_Init failed (launched by mpirun with %d ranks)", want);
        d->inited = 1;
        /* a failed collective returns an error to the caller (one line), not a silent hang or abort */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &d->world);
        d->mpi = 1;
    }
    return 0;
#else
    (void)argc, (void)argv;
    if (want > 1) {   /* the caller decides: NCCL on the GPU path, or a refusal */
        d->world = want;
        d->rank = launcher_rank();
        if (d->rank < 0 || d->rank >= want)
            return err_fail(err, err_len, "the launcher says rank %d of %d", d->rank, want);
    }
    (void)err, (void)err_len;
    return 0;
#endif
}

#ifdef DFLASH_MPI
static int mpi_fail(int rc, const char *what, char *err, int err_len) {
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return err_fail(err, err_len, "%s over the trainer ranks failed: %s (a rank died?)", what, s);
}
#endif

int dp_sum_f32(struct dp *d, float *x, size_t n, char *err, int err_len) {
    if (d->world <= 1 || n == 0) return 0;
#ifdef DFLASH_MPI
    /* in chunks: MPI counts are int */
    for (size_t o = 0; o < n; o += (size_t)1 << 30) {
        int c = (int)(n - o < ((size_t)1 << 30) ? n - o : ((size_t)1 << 30));
        int rc = MPI_Allreduce(MPI_IN_PLACE, x + o, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "the gradient sum", err, err_len);
    }
    return 0;
#else
    (void)x;
    return err_fail(err, err_len, "no MPI in this build");
#endif
}

int dp_sum_f64(struct dp *d, double *x, size_t n, char *err, int err_len) {
    if (d->world <= 1 || n == 0) return 0;
    if (d->nccl) return dp_nccl_sum_host_f64(d->nccl, x, n, err, err_len);
#ifdef DFLASH_MPI
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "the metrics sum", err, err_len);
#else
    (void)x;
    return err_fail(err, err_len, "no MPI in this build");
#endif
}

int dp_max_i64(struct dp *d, int64_t *x, char *err, int err_len) {
    if (d->world <= 1) return 0;
    if (d->nccl) return dp_nccl_max_host_i64(d->nccl, x, err, err_len);
#ifdef DFLASH_MPI
    int rc = MPI_Allreduce(MPI_IN_PLACE, x, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "the data position", err, err_len);
#else
    (void)x;
    return err_fail(err, err_len, "no MPI in this build");
#endif
}

int dp_check_same(struct dp *d, uint64_t hash, const char *what, char *err, int err_len) {
    if (d->world <= 1) return 0;
    if (d->nccl) {
        uint64_t lo, hi;
        if (dp_nccl_minmax_host_u64(d->nccl, hash, &lo, &hi, err, err_len)) return -1;
        if (lo != hi)
            return err_fail(err, err_len, "the ranks' %s differ (hashes from %016llx to %016llx; this rank %d: %016llx)",
                            what, (unsigned long long)lo, (unsigned long long)hi, d->rank, (unsigned long long)hash);
        return 0;
    }
#ifdef DFLASH_MPI
    uint64_t root = hash;
    int rc = MPI_Bcast(&root, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "the start-up check", err, err_len);
    int bad = root != hash ? d->rank : -1, first = -1;
    rc = MPI_Allreduce(&bad, &first, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "the start-up check", err, err_len);
    if (first >= 0)
        return err_fail(err, err_len, "rank %d's %s differ from rank 0's (hash %016llx on this rank %d, %016llx on rank "
                        "0)", first, what, (unsigned long long)hash, d->rank, (unsigned long long)root);
    return 0;
#else
    (void)hash, (void)what;
    return err_fail(err, err_len, "no MPI in this build");
#endif
}

void dp_finish(struct dp *d) {
    dp_nccl_close(d->nccl);
    d->nccl = NULL;
#ifdef DFLASH_MPI
    if (d->inited) MPI_Finalize();
#endif
    d->inited = 0;
}

void dp_abort(struct dp *d, int code) {
#ifdef DFLASH_MPI
    if (d->inited && d->world > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    (void)d, (void)code;
}
