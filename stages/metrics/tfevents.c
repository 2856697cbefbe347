/*
 * stages/metrics/tfevents.c — TensorBoard event files (stages/metrics/tfevents.h): TFRecord framing with masked
 * CRC32C around protobuf-c encoded Event messages.
 */
#include "metrics/tfevents.h"
#include "metrics/tfevents.pb-c.h"

#include "core/err.h"
#include "core/fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct tfevents {
    char path[PATH_MAX];
    int fd;
    uint8_t *buf;             /* queued records */
    size_t len, cap;
    uint64_t records;         /* flushed */
    uint64_t queued;
};

/* ---------------------------------------------------------------- CRC32C */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t tfevents_crc32c(const void *p, size_t n) {
    pthread_once(&crc_once, crc_init);
    const uint8_t *b = p;
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ b[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

uint32_t tfevents_masked_crc32c(const void *p, size_t n) {
    uint32_t c = tfevents_crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---------------------------------------------------------------- writer */

static int queue_event(struct tfevents *w, const Tfevents__Event *ev, char *err, int err_len) {
    size_t n = tfevents__event__get_packed_size(ev);
    size_t need = w->len + 16 + n;
    if (need > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < need) cap *= 2;
        uint8_t *b = realloc(w->buf, cap);
        if (!b) return err_fail(err, err_len, "%s: out of memory queueing an event", w->path);
        w->buf = b;
        w->cap = cap;
    }
    uint8_t *r = w->buf + w->len;
    put_le(r, n, 8);
    put_le(r + 8, tfevents_masked_crc32c(r, 8), 4);
    if (tfevents__event__pack(ev, r + 12) != n)
        return err_fail(err, err_len, "%s: protobuf-c packed a different size than it announced", w->path);
    put_le(r + 12 + n, tfevents_masked_crc32c(r + 12, n), 4);
    w->len = need;
    w->queued++;
    return 0;
}

struct tfevents *tfevents_open(const char *dir, char *err, int err_len) {
    struct tfevents *w = calloc(1, sizeof *w);
    if (!w) {
        err_fail(err, err_len, "out of memory");
        return NULL;
    }
    w->fd = -1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    /* TensorFlow's own name plus a counter: a sink reopened within the same second in the same process (tests)
     * gets a new file, never another writer's. */
    long long now = (long long)time(NULL);
    for (int n = 0; w->fd < 0 && n < 1000; n++) {
        if (snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%lld.%s.%d.%d", dir, now, host, (int)getpid(),
                     n) >= (int)sizeof w->path) {
            err_fail(err, err_len, "%s: directory path too long for an event file", dir);
            free(w);
            return NULL;
        }
        w->fd = open(w->path, O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, (mode_t)fs_file_mode());
        if (w->fd < 0 && errno != EEXIST) break;
    }
    if (w->fd < 0) {
        err_fail(err, err_len, "open(%s) failed: %s", w->path, strerror(errno));
        free(w);
        return NULL;
    }
    Tfevents__Event ev = TFEVENTS__EVENT__INIT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ev.wall_time = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    ev.what_case = TFEVENTS__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    if (queue_event(w, &ev, err, err_len) || tfevents_flush(w, err, err_len)) {
        tfevents_close(w);
        return NULL;
    }
    return w;
}

int tfevents_add(struct tfevents *w, double wall_time, int64_t step, int n, const char *const *tags,
                 const float *values, char *err, int err_len) {
    if (n < 1) return err_fail(err, err_len, "%s: an event without scalars", w->path);
    Tfevents__Summary__Value *v = calloc((size_t)n, sizeof *v);
    Tfevents__Summary__Value **vp = calloc((size_t)n, sizeof *vp);
    if (!v || !vp) {
        free(v);
        free(vp);
        return err_fail(err, err_len, "%s: out of memory", w->path);
    }
    for (int i = 0; i < n; i++) {
        tfevents__summary__value__init(&v[i]);
        v[i].tag = (char *)tags[i];
        v[i].value_case = TFEVENTS__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        v[i].simple_value = values[i];
        vp[i] = &v[i];
    }
    Tfevents__Summary sum = TFEVENTS__SUMMARY__INIT;
    sum.n_value = (size_t)n;
    sum.value = vp;
    Tfevents__Event ev = TFEVENTS__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = TFEVENTS__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = queue_event(w, &ev, err, err_len);
    free(v);
    free(vp);
    return rc;
}

int tfevents_flush(struct tfevents *w, char *err, int err_len) {
    size_t off = 0;
    while (off < w->len) {
        ssize_t r = write(w->fd, w->buf + off, w->len - off);
        if (r < 0 && errno == EINTR) continue;   /* a signal before anything was written */
        if (r <= 0) return err_fail(err, err_len, "write(%s) failed: %s", w->path, r < 0 ? strerror(errno) : "0 bytes");
        off += (size_t)r;
    }
    w->len = 0;
    w->records += w->queued;
    w->queued = 0;
    return 0;
}

const char *tfevents_path(const struct tfevents *w) { return w->path; }
uint64_t tfevents_records(const struct tfevents *w) { return w->records; }

void tfevents_close(struct tfevents *w) {
    if (!w) return;
    char err[256];
    if (w->fd >= 0 && w->len) (void)tfevents_flush(w, err, sizeof err);
    if (w->fd >= 0) close(w->fd);
    free(w->buf);
    free(w);
}

/* ---------------------------------------------------------------- reader */

int tfevents_read_record(const uint8_t *buf, size_t len, size_t *off, const uint8_t **data, size_t *data_len,
                         char *err, int err_len) {
    size_t o = *off;
    if (o == len) return 0;
    if (len - o < 12) return err_fail(err, err_len, "byte %zu: a torn record header (%zu bytes left)", o, len - o);
    uint64_t n = get_le(buf + o, 8);
    if ((uint32_t)get_le(buf + o + 8, 4) != tfevents_masked_crc32c(buf + o, 8))
        return err_fail(err, err_len, "byte %zu: the length's CRC does not match", o);
    if (n > len - o - 12 || len - o - 12 - n < 4)
        return err_fail(err, err_len, "byte %zu: a record of %llu bytes does not fit the %zu bytes left", o,
                        (unsigned long long)n, len - o - 12);
    if ((uint32_t)get_le(buf + o + 12 + n, 4) != tfevents_masked_crc32c(buf + o + 12, (size_t)n))
        return err_fail(err, err_len, "byte %zu: the data's CRC does not match", o);
    *data = buf + o + 12;
    *data_len = (size_t)n;
    *off = o + 16 + (size_t)n;
    return 1;
}
