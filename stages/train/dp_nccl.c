/*
 * stages/train/dp_nccl.c — NCCL for the trainer ranks on the GPU path (dp_nccl.h), loaded with dlopen.
 */
#include "train/dp_nccl.h"

#include "core/err.h"
#include "core/fsutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <nccl.h>
#include <time.h>

struct dp_nccl {
    void *lib;
    ncclComm_t comm;
    cudaStream_t stream;
    void *scratch;   /* device: 256 doubles */
    int rank, world;
    double timeout_s;
    ncclResult_t (*get_id)(ncclUniqueId *);
    ncclResult_t (*init_rank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*all_reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
    ncclResult_t (*async_error)(ncclComm_t, ncclResult_t *);
    ncclResult_t (*abort_comm)(ncclComm_t);
    ncclResult_t (*destroy)(ncclComm_t);
    const char *(*error_string)(ncclResult_t);
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* This launch's name: the id file of an earlier launch is never read. */
static void launch_name(char *out, size_t cap) {
    const char *job = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID"), *ns = getenv("PMIX_NAMESPACE"),
               *ompi = getenv("OMPI_MCA_ess_base_jobid");
    if (job) snprintf(out, cap, "slurm-%s.%s", job, step ? step : "0");
    else if (ns) snprintf(out, cap, "pmix-%s", ns);
    else if (ompi) snprintf(out, cap, "ompi-%s", ompi);
    else snprintf(out, cap, "ppid-%d", (int)getppid());   /* ranks forked by one local launcher */
    for (char *c = out; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '.' || *c == '-'))
            *c = '_';
}

#define SYM(field, name)                                                                                          \
    do {                                                                                                          \
        *(void **)&n->field = dlsym(n->lib, name);                                                                \
        if (!n->field) { dp_nccl_close(n); return err_fail(err, err_len, "libnccl.so.2 has no %s", name), NULL; } \
    } while (0)

/* Wait for `stream` with the bound; on a timeout or an asynchronous NCCL error, abort the communicator. */
static int wait_bounded(struct dp_nccl *n, cudaStream_t stream, const char *what, char *err, int err_len) {
    double t0 = now_s();
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady)
            return err_fail(err, err_len, "%s over the trainer ranks: %s", what, cudaGetErrorString(e));
        ncclResult_t ae = ncclSuccess;
        if (n->async_error(n->comm, &ae) != ncclSuccess || ae != ncclSuccess) {
            n->abort_comm(n->comm);
            n->comm = NULL;
            return err_fail(err, err_len, "%s over the trainer ranks failed: %s (a rank died?)", what, n->error_string(ae));
        }
        if (now_s() - t0 > n->timeout_s) {
            n->abort_comm(n->comm);
            n->comm = NULL;
            return err_fail(err, err_len, "%s over the %d trainer ranks: no answer within %.0f s (a rank died or hangs); "
                            "communicator aborted", what, n->world, n->timeout_s);
        }
        usleep(200);
    }
}

struct dp_nccl *dp_nccl_open(int rank, int world, int device, const char *id_dir, double timeout_s, char *err,
                             int err_len) {
    struct dp_nccl *n = calloc(1, sizeof *n);
    if (!n) return err_fail(err, err_len, "out of memory"), NULL;
    n->rank = rank;
    n->world = world;
    n->timeout_s = timeout_s > 0 ? timeout_s : 300;
    if (cudaSetDevice(device) != cudaSuccess) {
        free(n);
        return err_fail(err, err_len, "NCCL: cuda:%d cannot be made current", device), NULL;
    }
    n->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        err_fail(err, err_len, "%d trainer ranks on the GPU need NCCL: %s", world, dlerror());
        free(n);
        return NULL;
    }
    SYM(get_id, "ncclGetUniqueId");
    SYM(init_rank, "ncclCommInitRank");
    SYM(all_reduce, "ncclAllReduce");
    SYM(group_start, "ncclGroupStart");
    SYM(group_end, "ncclGroupEnd");
    SYM(async_error, "ncclCommGetAsyncError");
    SYM(abort_comm, "ncclCommAbort");
    SYM(destroy, "ncclCommDestroy");
    SYM(error_string, "ncclGetErrorString");
    if (cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess ||
        cudaMalloc(&n->scratch, 256 * sizeof(double)) != cudaSuccess) {
        dp_nccl_close(n);
        return err_fail(err, err_len, "NCCL: a stream and 2 KiB of device scratch could not be made"), NULL;
    }
    char launch[160], path[4096], tmp[4200];
    launch_name(launch, sizeof launch);
    snprintf(path, sizeof path, "%s/nccl-%s.id", id_dir, launch);
    ncclUniqueId id;
    if (rank == 0) {
        ncclResult_t r = n->get_id(&id);
        if (r != ncclSuccess) { dp_nccl_close(n); return err_fail(err, err_len, "ncclGetUniqueId: %s", n->error_string(r)), NULL; }
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || write(fd, &id, sizeof id) != (ssize_t)sizeof id || fsync(fd) || close(fd) || rename(tmp, path)) {
            if (fd >= 0) close(fd);
            dp_nccl_close(n);
            return err_fail(err, err_len, "%s: cannot write the NCCL id", path), NULL;
        }
    } else {
        double t0 = now_s();
        for (;;) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                ssize_t got = read(fd, &id, sizeof id);
                close(fd);
                if (got == (ssize_t)sizeof id) break;
            }
            if (now_s() - t0 > n->timeout_s) {
                dp_nccl_close(n);
                return err_fail(err, err_len, "rank %d: no NCCL id from rank 0 in %s within %.0f s (rank 0 did not start, "
                                "or the ranks do not share the run directory)", rank, path, n->timeout_s), NULL;
            }
            usleep(50000);
        }
    }
    ncclResult_t r = n->init_rank(&n->comm, world, id, rank);
    if (r != ncclSuccess) {
        n->comm = NULL;
        dp_nccl_close(n);
        return err_fail(err, err_len, "ncclCommInitRank (rank %d of %d): %s", rank, world, n->error_string(r)), NULL;
    }
    return n;
}

void dp_nccl_close(struct dp_nccl *n) {
    if (!n) return;
    if (n->comm) n->destroy(n->comm);
    if (n->scratch) cudaFree(n->scratch);
    if (n->stream) cudaStreamDestroy(n->stream);
    if (n->lib) dlclose(n->lib);
    free(n);
}

int dp_nccl_sum_dev_f32(struct dp_nccl *n, float *const *bufs, const size_t *counts, int n_bufs, void *stream,
                        char *err, int err_len) {
    if (!n->comm) return err_fail(err, err_len, "the NCCL communicator was aborted earlier");
    cudaStream_t st = stream ? (cudaStream_t)stream : n->stream;
    n->group_start();
    for (int i = 0; i < n_bufs; i++) {
        ncclResult_t r = n->all_reduce(bufs[i], bufs[i], counts[i], ncclFloat32, ncclSum, n->comm, st);
        if (r != ncclSuccess) {
            n->group_end();
            return err_fail(err, err_len, "ncclAllReduce of the gradients: %s", n->error_string(r));
        }
    }
    ncclResult_t r = n->group_end();
    if (r != ncclSuccess) return err_fail(err, err_len, "ncclGroupEnd (gradients): %s", n->error_string(r));
    return wait_bounded(n, st, "the gradient sum", err, err_len);
}

static int host_reduce(struct dp_nccl *n, void *x, size_t count, size_t size, ncclDataType_t t, ncclRedOp_t op,
                       const char *what, char *err, int err_len) {
    if (!n->comm) return err_fail(err, err_len, "the NCCL communicator was aborted earlier");
    if (count * size > 256 * sizeof(double)) return err_fail(err, err_len, "%s: %zu values is more than the scratch", what, count);
    if (cudaMemcpyAsync(n->scratch, x, count * size, cudaMemcpyHostToDevice, n->stream) != cudaSuccess)
        return err_fail(err, err_len, "%s: copy to the device failed", what);
    ncclResult_t r = n->all_reduce(n->scratch, n->scratch, count, t, op, n->comm, n->stream);
    if (r != ncclSuccess) return err_fail(err, err_len, "ncclAllReduce (%s): %s", what, n->error_string(r));
    if (cudaMemcpyAsync(x, n->scratch, count * size, cudaMemcpyDeviceToHost, n->stream) != cudaSuccess)
        return err_fail(err, err_len, "%s: copy to the host failed", what);
    return wait_bounded(n, n->stream, what, err, err_len);
}

int dp_nccl_sum_host_f64(struct dp_nccl *n, double *x, size_t count, char *err, int err_len) {
    return host_reduce(n, x, count, sizeof *x, ncclFloat64, ncclSum, "the metrics sum", err, err_len);
}

int dp_nccl_max_host_i64(struct dp_nccl *n, int64_t *x, char *err, int err_len) {
    return host_reduce(n, x, 1, sizeof *x, ncclInt64, ncclMax, "the data position", err, err_len);
}

int dp_nccl_minmax_host_u64(struct dp_nccl *n, uint64_t x, uint64_t *lo, uint64_t *hi, char *err, int err_len) {
    *lo = *hi = x;
    if (host_reduce(n, lo, 1, sizeof *lo, ncclUint64, ncclMin, "the start-up check", err, err_len)) return -1;
    return host_reduce(n, hi, 1, sizeof *hi, ncclUint64, ncclMax, "the start-up check", err, err_len);
}

#else /* no CUDA */

struct dp_nccl *dp_nccl_open(int rank, int world, int device, const char *id_dir, double timeout_s, char *err,
                             int err_len) {
    (void)rank, (void)world, (void)device, (void)id_dir, (void)timeout_s;
    return err_fail(err, err_len, "NCCL needs a build with CUDA"), NULL;
}
void dp_nccl_close(struct dp_nccl *n) { (void)n; }
int dp_nccl_sum_dev_f32(struct dp_nccl *n, float *const *bufs, const size_t *counts, int n_bufs, void *stream,
                        char *err, int err_len) {
    (void)n, (void)bufs, (void)counts, (void)n_bufs, (void)stream;
    return err_fail(err, err_len, "NCCL needs a build with CUDA");
}
int dp_nccl_sum_host_f64(struct dp_nccl *n, double *x, size_t count, char *err, int err_len) {
    (void)n, (void)x, (void)count;
    return err_fail(err, err_len, "NCCL needs a build with CUDA");
}
int dp_nccl_max_host_i64(struct dp_nccl *n, int64_t *x, char *err, int err_len) {
    (void)n, (void)x;
    return err_fail(err, err_len, "NCCL needs a build with CUDA");
}
int dp_nccl_minmax_host_u64(struct dp_nccl *n, uint64_t x, uint64_t *lo, uint64_t *hi, char *err, int err_len) {
    (void)n, (void)x, (void)lo, (void)hi;
    return err_fail(err, err_len, "NCCL needs a build with CUDA");
}
#endif
