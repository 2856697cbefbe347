/*
 * stages/core/check.h — fail-loudly checks for stage code.
 *
 * Every call that can fail in a stage goes through one of these macros. On failure they print one
 * block to stderr (and the stage log): stage name, pid, the sentence first (the library's own error
 * string), then in parentheses the call's text and file:line (LIB_CHECK and DIE: file:line only,
 * their sentence says what failed) and, when given, a "hint:" line; then flush and exit(1). With DEBUG=1 in the
 * environment they abort() instead so a core file is kept.
 *
 * Only stage mains and stage-level glue use these. Library code in shm/, kernels/ and
 * stages/core/ never exits: it returns 0/-1 and fills a caller-supplied error buffer, and the
 * stage wraps that call with LIB_CHECK.
 */
#ifndef STAGES_CORE_CHECK_H
#define STAGES_CORE_CHECK_H

#include <stddef.h>

/* Print the failure block and exit(1) (abort() under DEBUG=1). call may be NULL (a library call of ours whose
 * sentence names what failed). Never returns. Thread-safe. */
void check_fail(const char *file, int line, const char *call, const char *what, const char *hint)
    __attribute__((noreturn));

/* Formatting variant of check_fail used by DIE. Never returns. */
void check_die(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

/* Last hint registered with check_hint(); printed under the next failure, then cleared.
 * Lets a stage say "hint: is dflash-shm running?" before a call whose usual failure it knows. */
void check_hint(const char *hint);

/* A syscall or libc call returning -1 (or a negative value) with errno set. */
#define SYS_CHECK(call) do { if ((call) < 0) check_fail(__FILE__, __LINE__, #call, check_errno_str(), NULL); } while (0)
/* An allocation returning NULL. */
#define ALLOC_CHECK(ptr) do { if ((ptr) == NULL) check_fail(__FILE__, __LINE__, #ptr, "out of memory", NULL); } while (0)
/* A library call of ours returning 0/-1 with a message in `errbuf`. */
#define LIB_CHECK(call, errbuf) do { if ((call) != 0) check_fail(__FILE__, __LINE__, NULL, (errbuf), NULL); } while (0)
/* A nanomsg call returning -1. */
#define NN_CHECK(call) do { if ((call) < 0) check_fail(__FILE__, __LINE__, #call, check_nn_str(), NULL); } while (0)
/* A msgpack-c call returning non-zero (pack functions) — the packer only fails on allocation. */
#define MSGPACK_CHECK(call) do { if ((call) != 0) check_fail(__FILE__, __LINE__, #call, "msgpack pack failed (out of memory?)", NULL); } while (0)
/* Unconditional failure with a printf-style reason. */
#define DIE(...) check_die(__FILE__, __LINE__, __VA_ARGS__)

const char *check_errno_str(void);
const char *check_nn_str(void);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#include <cublas_api.h>
#include <cublasLt.h>
const char *check_cublas_str(int status);
#define CUDA_CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) check_fail(__FILE__, __LINE__, #call, cudaGetErrorString(e_), NULL); } while (0)
#define CUBLAS_CHECK(call) do { int s_ = (int)(call); if (s_ != 0) check_fail(__FILE__, __LINE__, #call, check_cublas_str(s_), NULL); } while (0)
/* A kernel launcher of kernels/ returning 0/-1; the reason is in kernels_error(). */
#define KERNEL_CHECK(call) do { if ((call) != 0) check_fail(__FILE__, __LINE__, #call, check_kernels_str(), NULL); } while (0)
const char *check_kernels_str(void);
#endif

#ifdef DFLASH_NCCL
#include <nccl.h>
#define NCCL_CHECK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) check_fail(__FILE__, __LINE__, #call, ncclGetErrorString(r_), NULL); } while (0)
#endif

#endif /* STAGES_CORE_CHECK_H */
