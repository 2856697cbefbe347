/*
 * stages/core/log.c — levelled logging to stderr and the stage's log file (log.h).
 * Each line is formatted into one buffer and emitted with a single write() per sink, so lines from
 * several threads or processes never interleave mid-line (O_APPEND makes file writes atomic for
 * lines shorter than PIPE_BUF in practice).
 */
#include "core/log.h"
#include "core/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static const char *g_stage = "dflash";
static enum log_level g_level = LOG_INFO;
static int g_fd = -1;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

void log_init(const char *stage) {
    g_stage = stage;
    const char *lv = getenv("DFLASH_LOG");
    if (lv) {
        if (!strcmp(lv, "debug")) g_level = LOG_DEBUG;
        else if (!strcmp(lv, "info")) g_level = LOG_INFO;
        else if (!strcmp(lv, "warn")) g_level = LOG_WARN;
        else if (!strcmp(lv, "error")) g_level = LOG_ERROR;
    }
}

const char *log_stage(void) { return g_stage; }
void log_set_level(enum log_level level) { g_level = level; }

int log_open_file(const char *path, char *err, int err_len) {
    /* O_NOFOLLOW: a symlink planted at the log's name is refused, not followed. */
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
    if (fd < 0) {
        snprintf(err, err_len, "open(%s) for the log failed: %s", path, strerror(errno));
        return -1;
    }
    pthread_mutex_lock(&g_mu);
    if (g_fd >= 0) close(g_fd);
    g_fd = fd;
    pthread_mutex_unlock(&g_mu);
    return 0;
}

static void write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR) continue;   /* retry: a signal interrupted the write */
            return;                         /* logging must never kill the stage */
        }
        buf += w;
        n -= (size_t)w;
    }
}

void log_file_only(const char *line) {
    pthread_mutex_lock(&g_mu);
    if (g_fd >= 0) {
        write_all(g_fd, line, strlen(line));
        if (line[0] && line[strlen(line) - 1] != '\n') write_all(g_fd, "\n", 1);
    }
    pthread_mutex_unlock(&g_mu);
}

void log_msg(enum log_level level, const char *fmt, ...) {
    if (level < g_level) return;
    static const char lc[] = "DIWE";
    char buf[4096];
    struct timeval tv;
    gettimeofday(&tv, NULL);
    struct tm tm;
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %c %s[%d] ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(tv.tv_usec / 1000),
                     lc[level], g_stage, (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : ((size_t)m < sizeof buf - (size_t)n - 1 ? (size_t)m : sizeof buf - (size_t)n - 2));
    buf[len++] = '\n';
    pthread_mutex_lock(&g_mu);
    write_all(STDERR_FILENO, buf, len);
    if (g_fd >= 0) write_all(g_fd, buf, len);
    pthread_mutex_unlock(&g_mu);
}
