/*
 * stages/dflash-metrics.c — the metrics sink (design.md §5): binds NN_PULL at
 * <run>/bus/metrics.sock and hands every message to stages/metrics/metrics_sink (metrics.jsonl,
 * metrics.csv, progress, stalls, plots, summary).
 *
 * Restartable: killed with SIGKILL and started again with the same command, it removes the stale
 * socket file (after checking that no live sink answers on it), binds again and keeps appending
 * to the same files; senders reconnect on their own. It ends on SIGINT/SIGTERM, with
 * --exit-when-done once every stage that sent a heartbeat has sent its summary or is gone, or
 * after --idle-exit-s without a message; in every case it drains what is queued, draws the final
 * plots and logs the summary table. Exit status: 3 (STAGE_EXIT_STOPPED) after SIGINT/SIGTERM, as any
 * stage stopped by a signal (a supervisor starts it again), 0 after --exit-when-done or --idle-exit-s.
 *
 * Why a receive thread: nanomsg tears a connection down as soon as the peer hangs up, and a
 * message it has read but we have not yet nn_recv'd goes with it. A sender's last records before
 * it exits (or is killed) are only safe once we have taken them, so one thread does nothing but
 * nn_recv into a bounded in-memory queue while the main thread writes files, draws plots and
 * prints; when the queue is full the thread stops taking, nanomsg pushes back and the senders
 * count drops, so memory stays bounded.
 */
#include "core/bus.h"
#include "core/check.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "metrics/metrics_sink.h"
#include "core/stage.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <time.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define RECV_TIMEOUT_MS 100     /* receive thread: how often it looks at the stop flag */
#define TICK_MS 100             /* main loop period when idle: ticks (progress, stalls, plots) */
#define QUEUE_CAP 65536         /* messages held between the receive thread and the main loop */
#define FINAL_QUIET_S 0.2       /* at exit, drain until the socket has been quiet this long... */
#define FINAL_MAX_S 2.0         /* ...but not longer than this */

/* 1 when a live process accepts connections on the socket file (another sink is running). */
static int socket_in_use(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_un un;
    memset(&un, 0, sizeof un);
    un.sun_family = AF_UNIX;
    size_t l = strlen(path);
    if (l >= sizeof un.sun_path) { close(fd); return 0; }   /* bus_address already refused such paths */
    memcpy(un.sun_path, path, l + 1);
    int rc = connect(fd, (struct sockaddr *)&un, sizeof un);
    close(fd);
    return rc == 0;
}

/* ---------------------------------------------------------------- receive thread */

struct rxq {
    pthread_mutex_t mu;
    pthread_cond_t ready, space;
    struct { void *msg; int len; } item[QUEUE_CAP];
    size_t head, n;
    int sock, stop, failed_errno;
};

static void *rx_main(void *arg) {
    struct rxq *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->mu);
        int stop = q->stop;
        pthread_mutex_unlock(&q->mu);
        if (stop) break;
        void *msg = NULL;
        int n = nn_recv(q->sock, &msg, NN_MSG, 0);   /* waits at most RECV_TIMEOUT_MS */
        if (n < 0) {
            int e = nn_errno();
            if (e == ETIMEDOUT || e == EAGAIN || e == EINTR) continue;   /* EINTR: a signal; the flag is checked by main */
            pthread_mutex_lock(&q->mu);
            q->failed_errno = e;
            pthread_cond_signal(&q->ready);
            pthread_mutex_unlock(&q->mu);
            break;
        }
        pthread_mutex_lock(&q->mu);
        while (q->n == QUEUE_CAP && !q->stop) pthread_cond_wait(&q->space, &q->mu);
        if (q->n == QUEUE_CAP) {   /* stopping with a full queue: this one cannot be kept */
            pthread_mutex_unlock(&q->mu);
            nn_freemsg(msg);
            break;
        }
        size_t tail = (q->head + q->n) % QUEUE_CAP;
        q->item[tail].msg = msg;
        q->item[tail].len = n;
        q->n++;
        pthread_cond_signal(&q->ready);
        pthread_mutex_unlock(&q->mu);
    }
    return NULL;
}

static int g_write_failed;

/* Take everything queued (waiting up to wait_ms for the first message), handle it, flush. Returns
 * how many messages were handled. */
static int consume(struct rxq *q, struct msink *s, int wait_ms, const char *addr) {
    pthread_mutex_lock(&q->mu);
    if (q->n == 0 && wait_ms > 0 && !q->failed_errno) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)wait_ms * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&q->ready, &q->mu, &ts);
    }
    if (q->failed_errno) DIE("nn_recv(%s) failed: %s", addr, nn_strerror(q->failed_errno));
    int got = 0;
    char err[512];
    while (q->n > 0) {
        void *msg = q->item[q->head].msg;
        int len = q->item[q->head].len;
        q->head = (q->head + 1) % QUEUE_CAP;
        q->n--;
        pthread_cond_signal(&q->space);
        /* handle outside the lock so the receive thread keeps taking messages meanwhile */
        pthread_mutex_unlock(&q->mu);
        if (msink_handle(s, msg, (size_t)len, time_mono_s(), err, sizeof err) == -100 && !g_write_failed) {
            g_write_failed = 1;   /* e.g. disk full: keep receiving (jsonl may still work), say it once */
            log_error("writing metrics.csv failed (further failures are not logged): %s", err);
        }
        nn_freemsg(msg);
        got++;
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    if (got && msink_flush(s, err, sizeof err)) log_error("%s", err);
    return got;
}

int main(int argc, char **argv) {
    log_init("dflash-metrics");
    struct stage_common common;
    stage_common_defaults(&common);
    common.device = "cpu";   /* the sink never computes: do not touch CUDA */
    double stall_s = 60, plot_every_s = 30, progress_s = 2, idle_exit_s = 0, plot_timeout_s = 20;
    int exit_when_done = 0;
    const char *csv_stage = "dflash-train", *gnuplot = "gnuplot";
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&common),
        {"stall-s", FLAG_DOUBLE, &stall_s, "warn when no stage moved an item for this many seconds (0: off)", 0, 31536000},
        {"plot-every-s", FLAG_DOUBLE, &plot_every_s, "redraw plots/*.png this often (0: only at the end)", 0, 31536000},
        {"progress-s", FLAG_DOUBLE, &progress_s, "progress line period in seconds (0: off)", 0, 31536000},
        {"exit-when-done", FLAG_BOOL, &exit_when_done, "exit once every stage that sent a heartbeat has ended or is gone", 1, 0},
        {"idle-exit-s", FLAG_DOUBLE, &idle_exit_s, "exit after this many seconds without a message (0: never)", 0, 31536000},
        {"csv-stage", FLAG_STRING, &csv_stage, "stage whose metric records fill metrics.csv and the plots", 1, 0},
        {"gnuplot", FLAG_STRING, &gnuplot, "gnuplot program used for plots", 1, 0},
        {"plot-timeout-s", FLAG_DOUBLE, &plot_timeout_s, "kill a gnuplot run after this many seconds", 0, 86400},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--run DIR [options]",
                        "Collects the metrics bus of a run: progress line, metrics.jsonl, metrics.csv, plots,\n"
                        "stall warnings and an end-of-run summary table.",
                        NULL, 0);
    if (plot_timeout_s <= 0) {   /* the table's bounds are inclusive: 0 is refused here */
        fprintf(stderr, "dflash-metrics: --plot-timeout-s must be > 0\n");
        return 2;
    }
    stage_start(&common, 1);

    char addr[PATH_MAX + 64], err[512];
    LIB_CHECK(bus_address(common.run_dir, addr, sizeof addr, err, sizeof err), err);
    const char *path = addr + strlen("ipc://");
    if (socket_in_use(path)) DIE("another dflash-metrics is already bound to %s; stop it first", path);
    /* A socket file left by a killed sink makes bind fail with EADDRINUSE: remove it. */
    if (unlink(path) != 0 && errno != ENOENT) DIE("unlink(%s) (a stale socket) failed: %s", path, strerror(errno));

    int sock = nn_socket(AF_SP, NN_PULL);
    NN_CHECK(sock);
    int to = RECV_TIMEOUT_MS;   /* lets the receive thread see the stop flag */
    NN_CHECK(nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVTIMEO, &to, sizeof to));
    check_hint("is the run directory writable, and its path short enough for AF_UNIX?");
    NN_CHECK(nn_bind(sock, addr));
    check_hint(NULL);
    /* The socket file's permissions are set explicitly, not left to the umask: only the owner (and
     * with --share-group its group) may send metrics into this run. */
    SYS_CHECK(chmod(path, common.share_group ? 0660 : 0600));

    struct msink_opts o = {
        .run_dir = common.run_dir, .csv_stage = csv_stage, .stall_s = stall_s, .progress_s = progress_s,
        .plot_every_s = plot_every_s, .plot_timeout_s = plot_timeout_s, .gnuplot = gnuplot, .tty = isatty(2),
    };
    struct msink *s = msink_open(&o, err, sizeof err);
    if (!s) DIE("%s", err);
    log_info("listening on %s (pid %d)", addr, (int)getpid());

    static struct rxq q;   /* 1 MiB of queue: static, not on the stack */
    q.sock = sock;
    pthread_mutex_init(&q.mu, NULL);
    pthread_cond_init(&q.ready, NULL);
    pthread_cond_init(&q.space, NULL);
    pthread_t rx;
    if (pthread_create(&rx, NULL, rx_main, &q) != 0) DIE("pthread_create for the receive thread failed");

    const char *why = NULL;
    double last_msg = time_mono_s();
    while (!why) {
        int got = consume(&q, s, TICK_MS, addr);
        double now = time_mono_s();
        if (got) last_msg = now;
        msink_tick(s, now);
        if (stage_stopping()) why = stage_stop_signal() == SIGINT ? "SIGINT" : "SIGTERM";
        else if (exit_when_done && msink_done(s)) why = "every stage has ended";
        else if (idle_exit_s > 0 && now - last_msg >= idle_exit_s) why = "idle";
    }

    /* Whatever is still arriving was sent while we were up: take it before leaving. */
    double t0 = time_mono_s(), quiet = t0;
    while (time_mono_s() - quiet < FINAL_QUIET_S && time_mono_s() - t0 < FINAL_MAX_S)
        if (consume(&q, s, 20, addr) > 0) quiet = time_mono_s();
    pthread_mutex_lock(&q.mu);
    q.stop = 1;
    pthread_cond_signal(&q.space);
    pthread_mutex_unlock(&q.mu);
    pthread_join(rx, NULL);
    consume(&q, s, 0, addr);
    msink_finish(s, time_mono_s(), why);
    msink_close(s);
    nn_close(sock);
    unlink(path);
    /* Stopped by a signal: 3 (STAGE_EXIT_STOPPED) like every stage, so a supervisor restarts a sink that was
     * stopped while the run goes on (issue 24: exit 0 here read as "the service left" and failed the run). */
    return stage_stopping() ? STAGE_EXIT_STOPPED : 0;
}
