/*
 * stages/train/dp.c — data-parallel ranks (dp.h): Open MPI collectives when built with DFLASH_MPI,
 * one rank otherwise.
 */
#include "train/dp.h"

#include "core/err.h"

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
static int launcher_world(void) {
    const char *keys[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", NULL};
    for (int i = 0; keys[i]; i++) {
        const char *v = getenv(keys[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 1;
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
    }
    return 0;
#else
    (void)argc, (void)argv;
    if (want > 1)
        return err_fail(err, err_len, "launched as one of %d ranks, but this dflash-train was built without MPI "
                        "(install libopenmpi-dev and build again, or start one rank)", want);
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
