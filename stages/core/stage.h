/*
 * stages/core/stage.h — what every stage main does the same way: the common flags (--run,
 * --device), the run directory and log file, and orderly shutdown on SIGINT/SIGTERM.
 *
 * A stage main: log_init(name); add STAGE_COMMON_FLAGS(&common) to its flag table; parse; then
 * stage_start(&common) which creates the run directory, opens logs/<stage>.log, resolves the
 * device and installs the signal handlers. The hot loop polls stage_stopping() between items.
 */
#ifndef STAGES_CORE_STAGE_H
#define STAGES_CORE_STAGE_H

#include <signal.h>

/* Exit statuses every stage uses: 0 = finished (end of stream), 1 = failed, 2 = bad command
 * line, STAGE_EXIT_STOPPED = stopped by a signal (SIGINT/SIGTERM) before end of stream; the run
 * is not finished (a supervisor treats it as "stopped", not "done", and may start it again). */
#define STAGE_EXIT_STOPPED 3

struct stage_common {
    const char *run_dir;   /* --run DIR (required by stages that use a run) */
    const char *device;    /* --device cpu|cuda:N|auto (auto: cuda:0 when a GPU is present) */
    int cuda_device;       /* resolved: -1 for cpu, else the CUDA ordinal */
    int share_group;       /* --share-group: run files group-readable (0750/0640) instead of private */
};

#define STAGE_COMMON_FLAGS(c) \
    { "run", FLAG_STRING, &(c)->run_dir, "run directory (created if missing)", 1, 0 }, \
    { "device", FLAG_STRING, &(c)->device, "cpu, cuda:N, or auto (cuda:0 when a GPU is present)", 1, 0 }, \
    { "share-group", FLAG_BOOL, &(c)->share_group, "make the run directory and files group-readable (0750/0640; " \
      "default private: 0700/0600)", 1, 0 }

/* Defaults: run_dir NULL, device "auto", share_group 0. */
void stage_common_defaults(struct stage_common *c);

/* Resolve "cpu" | "cuda:N" | "auto" to -1 or N. Returns 0, or -1 with a reason (e.g. a CUDA
 * device asked for in a build without CUDA, or N >= the device count). */
int stage_parse_device(const char *s, int *cuda_device, char *err, int err_len);

/* Set the permissions of what this process creates (fs_set_share_group, and the umask to 077 or
 * 027 so files other code creates follow), create the run directory (if run_dir is set; one owned
 * by another user is refused), open logs/<stage>.log, resolve the device, and install
 * SIGINT/SIGTERM handlers that set the stop flag. Exits 2 with a one-line error when
 * --run is missing and require_run is set, or the device is invalid. */
void stage_start(struct stage_common *c, int require_run);

/* True once SIGINT or SIGTERM arrived. Async-signal-safe to read. */
int stage_stopping(void);
/* The signal that set the flag (0 if none). */
int stage_stop_signal(void);

#endif /* STAGES_CORE_STAGE_H */
