/*
 * stages/core/check.c — the failure path behind the check macros (check.h): one block naming
 * stage, pid, place, call and reason, mirrored into the stage log, then exit(1) or abort().
 */
#include "core/check.h"
#include "core/log.h"

#include <errno.h>
#include <nanomsg/nn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef DFLASH_CUDA
#include "kernels/common.h"
#endif

static _Thread_local const char *pending_hint;

void check_hint(const char *hint) { pending_hint = hint; }

const char *check_errno_str(void) { return strerror(errno); }
const char *check_nn_str(void) { return nn_strerror(nn_errno()); }

static void fail_exit(void) __attribute__((noreturn));
static void fail_exit(void) {
    fflush(stdout);
    fflush(stderr);
    const char *d = getenv("DEBUG");
    if (d && d[0] == '1') abort();
    exit(1);
}

void check_fail(const char *file, int line, const char *call, const char *what, const char *hint) {
    const char *h = hint ? hint : pending_hint;
    /* The sentence first, for the user; where it happened after it (issue 24: lines that began with a C
     * expression). A library call of ours (call NULL: LIB_CHECK) already says in its sentence what failed. */
    if (call)
        log_error("%s (%s failed at %s:%d)%s%s", what ? what : "(no reason)", call, file, line, h ? "\n  hint: " : "",
                  h ? h : "");
    else
        log_error("%s (at %s:%d)%s%s", what ? what : "(no reason)", file, line, h ? "\n  hint: " : "", h ? h : "");
    fail_exit();
}

void check_die(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_error("%s (at %s:%d)%s%s", msg, file, line, pending_hint ? "\n  hint: " : "", pending_hint ? pending_hint : "");
    fail_exit();
}

#ifdef DFLASH_CUDA
const char *check_cublas_str(int status) { return cublasGetStatusString((cublasStatus_t)status); }
const char *check_kernels_str(void) { return kernels_error(); }
#endif
