/*
 * stages/core/log.h — levelled, timestamped logging for stages.
 *
 * Lines look like `2026-11-29T08:30:01.123Z I dflash-pack[1234] message` and go to stderr and,
 * once log_open_file() has been called, also to runs/<name>/logs/<stage>.log (appended, so a
 * restarted stage keeps its history). Thread-safe (one mutex); each line is written with one
 * write() so concurrent processes appending to one file do not interleave mid-line.
 */
#ifndef STAGES_CORE_LOG_H
#define STAGES_CORE_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3 };

/* Set the stage name printed on every line (and used by check.h). Call first in main. The string
 * must outlive the process (a literal). Level comes from DFLASH_LOG=debug|info|warn|error. */
void log_init(const char *stage);
/* Also append every line to `path` (created with fs_file_mode(): 0600, or 0640 with --share-group;
 * a symlink at path is refused, O_NOFOLLOW). Returns 0, or -1 with a reason in err. */
int log_open_file(const char *path, char *err, int err_len);
void log_set_level(enum log_level level);
const char *log_stage(void);

void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...)  log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...)  log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/* Write an already formatted line (no newline needed) to the log file only, not stderr. */
void log_file_only(const char *line);

#endif /* STAGES_CORE_LOG_H */
