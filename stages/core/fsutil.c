/*
 * stages/core/fsutil.c — atomic small-file writes, mkdir -p, whole-file reads, the run
 * directory and its id (fsutil.h).
 */
#include "core/fsutil.h"
#include "core/err.h"
#include "shm/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int g_share_group;

void fs_set_share_group(int on) { g_share_group = on != 0; }
unsigned fs_dir_mode(void) { return g_share_group ? 0750u : 0700u; }
unsigned fs_file_mode(void) { return g_share_group ? 0640u : 0600u; }

int fs_create_tmp(const char *tmp) {
    if (unlink(tmp) != 0 && errno != ENOENT) return -1;
    return open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
}

int fs_open_state(const char *path) {
    return open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
}

int fs_write_atomic(const char *path, const void *data, size_t len, char *err, int err_len) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp) {
        snprintf(err, err_len, "path too long: %s", path);
        return -1;
    }
    int fd = fs_create_tmp(tmp);
    if (fd < 0) { snprintf(err, err_len, "open(%s) failed: %s", tmp, strerror(errno)); return -1; }
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;   /* retry: interrupted by a signal */
            snprintf(err, err_len, "write(%s) failed: %s", tmp, strerror(errno));
            close(fd); unlink(tmp);
            return -1;
        }
        p += w; left -= (size_t)w;
    }
    if (fsync(fd) != 0) { snprintf(err, err_len, "fsync(%s) failed: %s", tmp, strerror(errno)); close(fd); unlink(tmp); return -1; }
    if (close(fd) != 0) { snprintf(err, err_len, "close(%s) failed: %s", tmp, strerror(errno)); unlink(tmp); return -1; }
    if (rename(tmp, path) != 0) { snprintf(err, err_len, "rename(%s, %s) failed: %s", tmp, path, strerror(errno)); unlink(tmp); return -1; }
    /* fsync the directory so the rename itself survives a crash */
    return fs_fsync_parent(path, err, err_len);
}

int fs_fsync_dir(const char *dir, char *err, int err_len) {
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) { snprintf(err, err_len, "open(%s) for fsync failed: %s", dir, strerror(errno)); return -1; }
    int rc = fsync(dfd), e = errno;
    close(dfd);
    if (rc != 0) { snprintf(err, err_len, "fsync(%s) failed: %s", dir, strerror(e)); return -1; }
    return 0;
}

int fs_fsync_parent(const char *path, char *err, int err_len) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash == dir) slash[1] = 0;
    else if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    return fs_fsync_dir(dir, err, err_len);
}

int fs_read_file(const char *path, char **out, size_t *len, char *err, int err_len) {
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(err, err_len, "open(%s) failed: %s", path, strerror(errno)); return -1; }
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    if (!buf) { fclose(f); snprintf(err, err_len, "out of memory reading %s", path); return -1; }
    for (;;) {
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); fclose(f); snprintf(err, err_len, "out of memory reading %s", path); return -1; }
            buf = nb; cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); snprintf(err, err_len, "read(%s) failed", path); return -1; }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int fs_mkdir_p(const char *path, char *err, int err_len) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) { snprintf(err, err_len, "path too long: %s", path); return -1; }
    for (char *p = tmp + 1; ; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST) {
                snprintf(err, err_len, "mkdir(%s) failed: %s", tmp, strerror(errno));
                return -1;
            }
            *p = c;
            if (c == 0) break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) { snprintf(err, err_len, "%s exists and is not a directory", path); return -1; }
    return 0;
}

int fs_exists(const char *path) { return access(path, F_OK) == 0; }

int run_path(char *out, size_t out_len, const char *run_dir, const char *rel) {
    int n = snprintf(out, out_len, "%s/%s", run_dir, rel);
    return n < 0 || (size_t)n >= out_len ? -1 : 0;
}

/* mkdir with exactly fs_dir_mode() when this call creates it (chmod: the umask may have cleared
 * bits); an existing directory is fine. */
static int mkdir_private(const char *path, char *err, int err_len) {
    mode_t mode = (mode_t)fs_dir_mode();
    if (mkdir(path, mode) == 0) {
        if (chmod(path, mode) != 0) return err_fail(err, err_len, "chmod(%s, %o) failed: %s", path, mode, strerror(errno));
        return 0;
    }
    if (errno != EEXIST) return err_fail(err, err_len, "mkdir(%s) failed: %s", path, strerror(errno));
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return err_fail(err, err_len, "%s exists and is not a directory", path);
    return 0;
}

int run_dir_init(const char *run_dir, char *err, int err_len) {
    static const char *subdirs[] = {"bus", "logs", "state", "checkpoints", "export", "plots"};
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", run_dir) >= (int)sizeof p) return err_fail(err, err_len, "run directory path too long: %s", run_dir);
    char *slash = strrchr(p, '/');
    if (slash && slash != p) {   /* the parents: an ordinary mkdir -p */
        *slash = 0;
        if (fs_mkdir_p(p, err, err_len)) return -1;
    }
    if (mkdir_private(run_dir, err, err_len)) return -1;
    struct stat st;
    if (stat(run_dir, &st) != 0) return err_fail(err, err_len, "stat(%s) failed: %s", run_dir, strerror(errno));
    if (st.st_uid != geteuid())
        return err_fail(err, err_len, "run directory %s is owned by uid %u, not by this user (uid %u); refusing to write "
                        "into it", run_dir, (unsigned)st.st_uid, (unsigned)geteuid());
    for (size_t i = 0; i < sizeof subdirs / sizeof *subdirs; i++) {
        if (run_path(p, sizeof p, run_dir, subdirs[i])) return err_fail(err, err_len, "run directory path too long: %s", run_dir);
        if (mkdir_private(p, err, err_len)) return -1;
    }
    return 0;
}

int run_id(const char *run_dir, char *out, size_t out_len, char *err, int err_len) {
    /* One definition of the id for stages and rings: the ring segment names depend on it. */
    return ring_run_id(run_dir, out, out_len, err, err_len);
}

double time_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

double time_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
