/*
 * stages/core/stage.c — common stage start-up: run directory, log file, device, signals
 * (stage.h).
 */
#include "core/stage.h"
#include "core/fsutil.h"
#include "core/log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif

static volatile sig_atomic_t g_stop_signal;

static void on_signal(int sig) { g_stop_signal = sig; }

int stage_stopping(void) { return g_stop_signal != 0; }
int stage_stop_signal(void) { return g_stop_signal; }

void stage_common_defaults(struct stage_common *c) {
    c->run_dir = NULL;
    c->device = "auto";
    c->cuda_device = -1;
    c->share_group = 0;
}

static int cuda_device_count(void) {
#ifdef DFLASH_CUDA
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) { (void)cudaGetLastError(); return 0; }
    return n;
#else
    return 0;
#endif
}

int stage_parse_device(const char *s, int *cuda_device, char *err, int err_len) {
    if (!s || !strcmp(s, "auto")) {
        *cuda_device = cuda_device_count() > 0 ? 0 : -1;
        return 0;
    }
    if (!strcmp(s, "cpu")) { *cuda_device = -1; return 0; }
    if (!strncmp(s, "cuda:", 5) || !strcmp(s, "cuda")) {
        const char *num = s[4] == ':' ? s + 5 : "0";
        char *end;
        errno = 0;
        long id = strtol(num, &end, 10);
        if (errno || end == num || *end || id < 0) { snprintf(err, err_len, "--device: bad CUDA ordinal in '%s' (expected cuda:N)", s); return -1; }
#ifndef DFLASH_CUDA
        snprintf(err, err_len, "--device %s: this build has no CUDA support (rebuild with nvcc present, or use --device cpu)", s);
        return -1;
#else
        int n = cuda_device_count();
        if (id >= n) { snprintf(err, err_len, "--device %s: only %d CUDA device(s) visible", s, n); return -1; }
        *cuda_device = (int)id;
        return 0;
#endif
    }
    snprintf(err, err_len, "--device: expected cpu, cuda:N or auto, got '%s'", s);
    return -1;
}

void stage_start(struct stage_common *c, int require_run) {
    char err[512];
    fs_set_share_group(c->share_group);
    umask(c->share_group ? 027 : 077);
    if (require_run && !c->run_dir) {
        fprintf(stderr, "%s: --run DIR is required (see --help)\n", log_stage());
        exit(2);
    }
    if (c->run_dir) {
        if (run_dir_init(c->run_dir, err, sizeof err)) { fprintf(stderr, "%s: %s\n", log_stage(), err); exit(2); }
        char path[PATH_MAX];
        char rel[256];
        snprintf(rel, sizeof rel, "logs/%s.log", log_stage());
        if (run_path(path, sizeof path, c->run_dir, rel) || log_open_file(path, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", log_stage(), err);
            exit(2);
        }
    }
    if (stage_parse_device(c->device, &c->cuda_device, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", log_stage(), err);
        exit(2);
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}
