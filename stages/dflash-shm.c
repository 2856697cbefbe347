/*
 * stages/dflash-shm.c — the owner process of a run's rings (design.md §2, §4).
 *
 * Creates every ring given by --ring (host segments; GPU payload buffers through cudaMalloc with
 * their CUDA IPC handles in the segment), writes shm.json, recovers slots of dead stages every
 * second, and answers requests on NN_REP ipc://<run>/bus/control.sock until SIGINT/SIGTERM or a
 * `shutdown` request; then it marks every ring closed, unlinks every segment it created and
 * exits 0. It owns the GPU memory so that no compute stage owns memory another stage reads.
 *
 * Control protocol: msgpack over NN_REQ/NN_REP, encoded and decoded by stages/shmctl/control.h
 * (kind + version, exact field counts). The socket is created with mode 0600 (umask 0177 around
 * nn_bind, then chmod and a check) and clients talk to it only when it is a socket owned by their
 * own uid with no group/other bits. Why not SO_PEERCRED: nanomsg hides the accepted connection's
 * fd, so the server cannot ask the kernel who the peer is; with the socket file owner-only, the
 * kernel refuses connect(2) to every other non-root user, which is the same guarantee.
 *
 * Client modes of the same binary: --status (table, --json, or one value with --field RING.KEY),
 * --shutdown, --list-stale, --remove-stale (segments that are ours, whose creator is dead and to
 * which no live process is attached; with --run, only that run's).
 */
#include "core/check.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/stage.h"
#include "plan/plan.h"
#include "shmctl/control.h"
#include "shm/ring.h"

#include <errno.h>
#include <stdarg.h>
#include <jansson.h>
#include <limits.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_RINGS 32

static void ring_log_to_stage(void *ctx, const char *line) {
    (void)ctx;
    log_info("%s", line);
}

/* ---------------------------------------------------------------- status */

static void status_fill(struct ring **rings, int n, int pid, const char *source, struct shm_ctl_status *st) {
    memset(st, 0, sizeof *st);
    st->pid = pid;
    snprintf(st->source, sizeof st->source, "%s", source);
    for (int i = 0; i < n && st->n_rings < SHM_CTL_MAX_RINGS; i++)
        if (rings[i]) ring_get_status(rings[i], &st->rings[st->n_rings++]);
}

/* ---------------------------------------------------------------- shm.json */

static void write_shm_json(const char *run_dir, const struct ring_spec *specs, int n, const char *state) {
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        char seg[160], err[256];
        LIB_CHECK(ring_segment_name(run_dir, specs[i].name, seg, sizeof seg, err, sizeof err), err);
        json_array_append_new(arr, json_pack("{s:s, s:s, s:I, s:I, s:I, s:i, s:I}", "name", specs[i].name, "segment", seg,
                                             "slots", (json_int_t)specs[i].n_slots,
                                             "payload_bytes", (json_int_t)specs[i].payload_bytes,
                                             "desc_bytes", (json_int_t)specs[i].desc_bytes, "device", specs[i].device,
                                             "producers", (json_int_t)specs[i].n_producers));
    }
    json_t *o = json_pack("{s:s, s:i, s:i, s:s, s:f, s:o}", "kind", "shm", "version", (int)SHM_CTL_VERSION, "pid", (int)getpid(),
                          "state", state, "t", time_wall_s(), "rings", arr);
    char *text = json_dumps(o, JSON_INDENT(2));
    ALLOC_CHECK(text);
    char path[PATH_MAX], err[512];
    if (run_path(path, sizeof path, run_dir, "shm.json")) DIE("run directory path too long: %s", run_dir);
    size_t len = strlen(text);
    text[len] = '\n';   /* json_dumps leaves room for the NUL; replace it and write len+1 bytes */
    LIB_CHECK(fs_write_atomic(path, text, len + 1, err, sizeof err), err);
    free(text);
    json_decref(o);
}

/* ---------------------------------------------------------------- client modes */

/* ipc://<run>/bus/control.sock with the run's real path, so clients in another working
 * directory find it; the path as given when the real one is too long for a unix socket. */
static int control_url(const char *run_dir, char *url, size_t len) {
    char real[PATH_MAX], path[PATH_MAX];
    const char *dir = realpath(run_dir, real) ? real : run_dir;
    if (run_path(path, sizeof path, dir, "bus/control.sock")) return -1;
    if (strlen(path) > 100 && run_path(path, sizeof path, run_dir, "bus/control.sock")) return -1;
    int n = snprintf(url, len, "ipc://%s", path);
    return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* vsnprintf into a caller buffer (a sentence may be cut at len; that is fine for messages). */
static void say(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *out, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, len, fmt, ap);
    va_end(ap);
}

/* The socket must be ours (owner uid, a socket, not group/other accessible) before we talk to it:
 * a reply from a socket another user planted would be trusted by scripts. 0, or -1 with a
 * sentence (ENOENT: "not there"). */
static int socket_is_ours(const char *url, char *why, size_t why_len) {
    const char *path = url + strlen("ipc://");
    struct stat sb;
    if (lstat(path, &sb) != 0) { say(why, why_len, "%s: %s", path, strerror(errno)); return -1; }
    if (!S_ISSOCK(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
        say(why, why_len, "refusing control socket %s: %s owned by uid %u with mode %04o, expected a socket of uid %u "
                 "with mode 0600", path, S_ISSOCK(sb.st_mode) ? "a socket" : "not a socket", (unsigned)sb.st_uid,
                 (unsigned)(sb.st_mode & 07777), (unsigned)geteuid());
        return -1;
    }
    return 0;
}

/* Send one request; fills *reply and returns 0, or -1 with a sentence in why (not answering,
 * not ours, or an undecodable reply). */
static int control_request(const char *run_dir, enum shm_ctl_kind kind, int timeout_ms, struct shm_ctl_reply *reply,
                           char *why, size_t why_len) {
    char url[PATH_MAX + 16], err[512];
    if (control_url(run_dir, url, sizeof url)) { say(why, why_len, "run directory path too long: %s", run_dir); return -1; }
    if (socket_is_ours(url, why, why_len) != 0) return -1;
    char req[SHM_CTL_REQUEST_MAX];
    size_t req_len;
    LIB_CHECK(shm_ctl_encode_request(kind, req, sizeof req, &req_len, err, sizeof err), err);
    int s = nn_socket(AF_SP, NN_REQ);
    NN_CHECK(s);
    NN_CHECK(nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms));
    NN_CHECK(nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms));
    int rc = -1;
    say(why, why_len, "no answer on %s within %d ms", url, timeout_ms);
    if (nn_connect(s, url) >= 0 && nn_send(s, req, req_len, 0) >= 0) {
        char *buf = NULL;
        int n = nn_recv(s, &buf, NN_MSG, 0);
        if (n >= 0) {
            if (shm_ctl_decode_reply(buf, (size_t)n, reply, err, sizeof err) == 0) rc = 0;
            else say(why, why_len, "%s", err);
            nn_freemsg(buf);
        }
    }
    nn_close(s);
    return rc;
}

/* Status without dflash-shm: attach to the segments named in shm.json as an observer. */
static int status_from_segments(const char *run_dir, struct shm_ctl_status *st) {
    char path[PATH_MAX], err[512];
    if (run_path(path, sizeof path, run_dir, "shm.json")) return -1;
    json_error_t je;
    json_t *shm = json_load_file(path, 0, &je);
    if (!shm) { log_error("no answer on the control socket and no readable %s: %s", path, je.text); return -1; }
    json_t *rings_j = json_object_get(shm, "rings");
    struct ring *rings[MAX_RINGS] = {0};
    int n = 0;
    size_t i;
    json_t *it;
    json_array_foreach(rings_j, i, it) {
        const char *name = json_string_value(json_object_get(it, "name"));
        if (!name || n >= MAX_RINGS) continue;
        rings[n] = ring_attach(run_dir, name, RING_OBSERVER, 0, err, sizeof err);
        if (!rings[n]) log_warn("ring '%s': %s", name, err);
        else n++;
    }
    status_fill(rings, n, (int)json_integer_value(json_object_get(shm, "pid")), "segments", st);
    for (int k = 0; k < n; k++) ring_close(rings[k]);
    json_decref(shm);
    return 0;
}

static const char *role_name(int role) { return role == RING_PRODUCER ? "producer" : role == RING_CONSUMER ? "consumer" : "?"; }

static void print_table(const struct shm_ctl_status *st) {
    printf("dflash-shm pid %d (status from %s)\n", st->pid, st->source);
    printf("%-12s %-7s %5s %8s %6s %5s %5s %5s %5s %10s %10s %7s %-7s %-6s\n", "ring", "dev", "slots", "payload", "desc",
           "free", "write", "ready", "read", "published", "consumed", "redeliv", "drained", "closed");
    for (int i = 0; i < st->n_rings; i++) {
        const struct ring_status *r = &st->rings[i];
        char dev[16], pb[32], db[32];
        if (r->device < 0) snprintf(dev, sizeof dev, "host"); else snprintf(dev, sizeof dev, "cuda:%d", r->device);
        printf("%-12s %-7s %5u %8s %6s %5u %5u %5u %5u %10llu %10llu %7llu %-7s %-6s\n", r->name, dev, r->n_slots,
               ring_format_bytes(r->payload_bytes, pb, sizeof pb), ring_format_bytes(r->desc_bytes, db, sizeof db), r->n_free,
               r->n_writing, r->n_ready, r->n_reading, (unsigned long long)r->published, (unsigned long long)r->consumed,
               (unsigned long long)r->redelivered, r->drained ? "yes" : "no", r->closed ? "yes" : "no");
        for (int j = 0; j < r->n_attached; j++)
            printf("    pid %-8d %-8s %-5s%s\n", r->attached[j].pid, role_name(r->attached[j].role),
                   r->attached[j].alive ? "alive" : "dead", r->attached[j].drained ? " drained" : "");
    }
}

struct stale_ctx { int remove, n_stale, n_live, n_foreign, failed; };

/* Stale means: ours, creator dead, and no live process attached (ring_segment_is_stale). A
 * segment some live stage still uses is never removed, even when its dflash-shm is gone. */
static void on_segment(void *ctx, const struct ring_segment_info *in) {
    struct stale_ctx *c = ctx;
    if (!in->ours) {
        printf("foreign  /dev/shm/%s (uid %u, mode %04o: not this user's, or not mode 0600; left alone)\n", in->segment, in->uid,
               in->mode);
        c->n_foreign++;
        return;
    }
    if (in->owner_alive) { c->n_live++; return; }
    if (in->n_live_attached > 0) {
        printf("in use   /dev/shm/%s (creator pid %d is gone, but %d live stage(s) are attached; left alone)\n", in->segment,
               in->owner_pid, in->n_live_attached);
        c->n_live++;
        return;
    }
    char name[300], path[300];
    snprintf(name, sizeof name, "/%s", in->segment);
    snprintf(path, sizeof path, "/dev/shm/%s", in->segment);
    struct stat sb;
    /* No readable header: maybe a dflash-shm is creating it right now; leave young ones alone. */
    if (!in->has_header && stat(path, &sb) == 0 && time(NULL) - sb.st_mtime < 60) {
        printf("young    /dev/shm/%s (no header yet; left alone)\n", in->segment);
        c->n_live++;
        return;
    }
    c->n_stale++;
    if (c->remove) {
        if (shm_unlink(name) == 0) printf("removed  /dev/shm/%s (creator pid %d is gone, nothing attached)\n", in->segment, in->owner_pid);
        else { printf("FAILED   /dev/shm/%s: shm_unlink: %s\n", in->segment, strerror(errno)); c->failed++; }
    } else {
        printf("stale    /dev/shm/%s (creator pid %d is gone, nothing attached)\n", in->segment, in->owner_pid);
    }
}

/* ---------------------------------------------------------------- server */

/* Answer one request into a malloc'ed reply; returns 1 if it asked for shutdown. */
static int handle_request(const char *req, int len, struct ring **rings, int n, struct shm_ctl_reply *rep, char **out,
                          size_t *out_len) {
    char err[512];
    enum shm_ctl_kind kind;
    int shutdown = 0;
    memset(rep, 0, sizeof *rep);
    if (shm_ctl_decode_request(req, (size_t)len, &kind, err, sizeof err) != 0) {
        log_warn("bad control request: %s", err);
        rep->kind = SHM_CTL_ERROR;
        say(rep->error, sizeof rep->error, "%s", err);
    } else if (kind == SHM_CTL_STATUS) {
        rep->kind = SHM_CTL_STATUS;
        status_fill(rings, n, (int)getpid(), "dflash-shm", &rep->status);
    } else {
        rep->kind = SHM_CTL_SHUTDOWN;
        shutdown = 1;
    }
    LIB_CHECK(shm_ctl_encode_reply(rep, out, out_len, err, sizeof err), err);
    return shutdown;
}

int main(int argc, char **argv) {
    log_init("dflash-shm");
    struct ring_spec specs[MAX_RINGS];
    int n_specs = 0;
    char err[1024];

    /* --ring may repeat; the common parser keeps one value per flag, so take them out first. */
    static char **rest;   /* lives until exit (static, so leak checkers see it reachable) */
    rest = calloc((size_t)argc + 1, sizeof *rest);
    ALLOC_CHECK(rest);
    int n_rest = 0;
    for (int i = 0; i < argc; i++) {
        const char *v = NULL;
        if (i > 0 && !strcmp(argv[i], "--ring")) {
            if (i + 1 >= argc) { fprintf(stderr, "dflash-shm: --ring: missing value\n"); return 2; }
            v = argv[++i];
        } else if (i > 0 && !strncmp(argv[i], "--ring=", 7)) {
            v = argv[i] + 7;
        }
        if (!v) { rest[n_rest++] = argv[i]; continue; }
        if (ring_parse_specs(v, specs, MAX_RINGS, &n_specs, err, sizeof err) != 0) {
            fprintf(stderr, "dflash-shm: --ring %s: %s\n", v, err);
            return 2;
        }
    }

    struct stage_common common;
    stage_common_defaults(&common);
    common.device = "cpu";   /* dflash-shm computes nothing; rings name their own devices */
    int status = 0, shutdown_req = 0, list_stale = 0, remove_stale = 0, host_only = 0, as_json = 0;
    int timeout_ms = 2000;
    const char *ring_help = NULL, *field = NULL;
    struct flag table[] = {
        {"run", FLAG_STRING, &common.run_dir, "run directory (created if missing)", 1, 0},
        {"ring", FLAG_STRING, &ring_help, "NAME:slots=N,bytes=SIZE,desc=SIZE,dev=host|cuda:N,producers=N (repeatable, or comma-separated)", 1, 0},
        {"host-only", FLAG_BOOL, &host_only, "create every ring with host payloads (for --device cpu runs)", 1, 0},
        {"status", FLAG_BOOL, &status, "print the run's rings, occupancy and attached stages, then exit", 1, 0},
        {"json", FLAG_BOOL, &as_json, "with --status: print the JSON reply instead of a table", 1, 0},
        {"field", FLAG_STRING, &field, "with --status: print values of one snapshot: pid, source, rings or RING.KEY, comma-separated (e.g. hidden.ready,hidden.drained)", 1, 0},
        {"shutdown", FLAG_BOOL, &shutdown_req, "ask the run's dflash-shm to close and unlink its rings, then exit", 1, 0},
        {"list-stale", FLAG_BOOL, &list_stale, "list /dev/shm/dflash.* segments whose creator is dead, then exit", 1, 0},
        {"remove-stale", FLAG_BOOL, &remove_stale, "remove those segments (ours, creator dead, nothing attached), then exit; with --run only that run's", 1, 0},
        {"timeout-ms", FLAG_INT, &timeout_ms, "control-socket timeout for --status/--shutdown", 1, 600000},
        FLAGS_END,
    };
    flags_parse_or_exit(table, n_rest, rest, "--run DIR --ring SPEC [--ring SPEC ...] | --status | --list-stale | --remove-stale",
                        "Owns the shared-memory rings of a run: creates them, serves status, unlinks them on exit.", NULL, 0);

    if (list_stale || remove_stale) {
        struct stale_ctx c = {remove_stale, 0, 0, 0, 0};
        char prefix[200] = "dflash.";
        if (common.run_dir) {   /* one run only (the pipeline's cleanup) */
            char id[128];
            if (ring_run_id(common.run_dir, id, sizeof id, err, sizeof err) != 0) DIE("%s", err);
            snprintf(prefix, sizeof prefix, "dflash.%s.", id);
        }
        int n = ring_scan_segments(prefix, on_segment, &c, err, sizeof err);
        if (n < 0) DIE("%s", err);
        printf("%d dflash segment(s): %d in use, %d stale%s, %d foreign\n", n, c.n_live, c.n_stale,
               remove_stale ? " (removed)" : (c.n_stale ? "; --remove-stale removes them" : ""), c.n_foreign);
        return c.failed ? 1 : 0;
    }
    if (!common.run_dir) { fprintf(stderr, "dflash-shm: --run DIR is required (see --help)\n"); return 2; }
    if ((as_json || field) && !status) { fprintf(stderr, "dflash-shm: --json and --field go with --status\n"); return 2; }

    if (status || shutdown_req) {
        ring_set_log(ring_log_to_stage, NULL);
        static struct shm_ctl_reply reply;   /* ~45 KB */
        char why[600];
        int got = control_request(common.run_dir, status ? SHM_CTL_STATUS : SHM_CTL_SHUTDOWN, timeout_ms, &reply, why, sizeof why);
        if (got == 0 && reply.kind == SHM_CTL_ERROR) {
            fprintf(stderr, "dflash-shm: the run's dflash-shm refused the request: %s\n", reply.error);
            return 1;
        }
        if (shutdown_req) {
            if (got != 0) { fprintf(stderr, "dflash-shm: %s\n", why); return 1; }
            printf("dflash-shm of %s is shutting down\n", common.run_dir);
            return 0;
        }
        if (got != 0) {
            fprintf(stderr, "dflash-shm: %s; reading the segments directly\n", why);
            if (status_from_segments(common.run_dir, &reply.status) != 0) return 1;
        }
        if (field) {   /* comma-separated paths: the values of one snapshot, space-separated */
            char list[512], line[4096] = "", val[256];
            snprintf(list, sizeof list, "%s", field);
            char *save = NULL;
            for (char *f = strtok_r(list, ",", &save); f; f = strtok_r(NULL, ",", &save)) {
                if (shm_ctl_field(&reply.status, f, val, sizeof val, err, sizeof err) != 0) {
                    fprintf(stderr, "dflash-shm: %s\n", err);
                    return 2;
                }
                size_t at = strlen(line);
                snprintf(line + at, sizeof line - at, "%s%s", at ? " " : "", val);
            }
            printf("%s\n", line);
        } else if (as_json) {
            char *t = shm_ctl_status_json(&reply.status, 2);
            ALLOC_CHECK(t);
            printf("%s\n", t);
            free(t);
        } else {
            print_table(&reply.status);
        }
        return 0;
    }

    /* The run plan (RUN/plan.json, stages/plan/plan.h) names the rings when no --ring is given; every ring
     * carries the plan's hash in its header, so a stage that read another plan is refused at attach. */
    struct plan plan;
    int have_plan = plan_open_run(common.run_dir, &plan, err, sizeof err);
    if (have_plan < 0) { fprintf(stderr, "dflash-shm: %s\n", err); return 2; }
    if (have_plan && n_specs == 0)
        for (int i = 0; i < plan.n_rings; i++)
            if (ring_parse_specs(plan.rings[i], specs, MAX_RINGS, &n_specs, err, sizeof err) != 0) {
                fprintf(stderr, "dflash-shm: %s: rings[%d]: %s\n", plan.path, i, err);
                return 2;
            }
    if (have_plan)
        for (int i = 0; i < n_specs; i++)
            if (!specs[i].plan) specs[i].plan = plan.hash;
    if (n_specs == 0) { fprintf(stderr, "dflash-shm: give at least one --ring, or a run with a plan.json (see --help)\n"); return 2; }
    stage_start(&common, 1);
    ring_set_log(ring_log_to_stage, NULL);

    char url[PATH_MAX + 16];
    if (control_url(common.run_dir, url, sizeof url)) DIE("run directory path too long for the control socket: %s", common.run_dir);
    {   /* said before any ring is created or the socket bound (issue 24: nanomsg's "Invalid argument" came with a hint about another dflash-shm) */
        struct sockaddr_un un;
        size_t path_len = strlen(url) - strlen("ipc://");
        if (path_len >= sizeof un.sun_path)
            DIE("control socket path is %zu bytes, a Unix socket allows %zu: %s (hint: use a shorter --run path)",
                path_len, sizeof un.sun_path - 1, url + strlen("ipc://"));
    }

    struct ring *rings[MAX_RINGS] = {0};
    for (int i = 0; i < n_specs; i++) {
        if (host_only) specs[i].device = -1;
        rings[i] = ring_create(common.run_dir, &specs[i], err, sizeof err);
        if (!rings[i]) {
            for (int k = 0; k < i; k++) ring_close(rings[k]);
            DIE("creating ring '%s': %s", specs[i].name, err);
        }
        char pb[32], db[32];
        log_info("ring '%s': %u slots x %s payload (%s), %s descriptor, producers=%u", specs[i].name, specs[i].n_slots,
                 ring_format_bytes(specs[i].payload_bytes, pb, sizeof pb), specs[i].device < 0 ? "host" : "GPU",
                 ring_format_bytes(specs[i].desc_bytes, db, sizeof db), specs[i].n_producers);
    }

    int sock = nn_socket(AF_SP, NN_REP);
    NN_CHECK(sock);
    int rcv_ms = 250;
    NN_CHECK(nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVTIMEO, &rcv_ms, sizeof rcv_ms));
    NN_CHECK(nn_setsockopt(sock, NN_SOL_SOCKET, NN_SNDTIMEO, &rcv_ms, sizeof rcv_ms));
    /* Owner-only socket whatever the caller's umask: umask 0177 while nanomsg creates it (no
     * window in which another user can connect), then an explicit chmod 0600 and a check. */
    mode_t old_mask = umask(0177);
    int bound = nn_bind(sock, url);
    int bind_errno = nn_errno();
    umask(old_mask);
    if (bound < 0) {
        for (int k = 0; k < n_specs; k++) ring_close(rings[k]);
        DIE("nn_bind(%s) failed: %s (hint: is another dflash-shm serving this run?)", url, nn_strerror(bind_errno));
    }
    {
        const char *sock_path = url + strlen("ipc://");
        struct stat sb;
        for (int i = 0; i < 100 && lstat(sock_path, &sb) != 0; i++) usleep(10000);   /* nanomsg binds from its worker */
        SYS_CHECK(chmod(sock_path, 0600));
        SYS_CHECK(lstat(sock_path, &sb));
        if (sb.st_uid != geteuid() || (sb.st_mode & 077)) {
            for (int k = 0; k < n_specs; k++) ring_close(rings[k]);
            DIE("control socket %s is owned by uid %u with mode %04o after chmod 0600", sock_path, (unsigned)sb.st_uid,
                (unsigned)(sb.st_mode & 07777));
        }
    }
    write_shm_json(common.run_dir, specs, n_specs, "running");
    log_info("serving %d ring(s) on %s", n_specs, url);

    double last_recover = time_mono_s();
    int stop = 0;
    static struct shm_ctl_reply rep;   /* ~45 KB, reused for every reply */
    while (!stop && !stage_stopping()) {
        char *buf = NULL;
        int n = nn_recv(sock, &buf, NN_MSG, 0);
        if (n >= 0) {
            char *reply = NULL;
            size_t reply_len = 0;
            stop = handle_request(buf, n, rings, n_specs, &rep, &reply, &reply_len);
            nn_freemsg(buf);
            if (nn_send(sock, reply, reply_len, 0) < 0) log_warn("control reply not sent: %s", nn_strerror(nn_errno()));
            free(reply);
            if (stop) log_info("shutdown requested on the control socket");
        } else if (nn_errno() != ETIMEDOUT && nn_errno() != EINTR && nn_errno() != EAGAIN) {
            log_error("nn_recv on %s failed: %s", url, nn_strerror(nn_errno()));
        }
        /* Recover slots of dead stages even when nobody waits on a ring (e.g. every consumer
         * died), so status shows the truth and the items are READY for the restart. */
        if (time_mono_s() - last_recover >= 1.0) {
            last_recover = time_mono_s();
            for (int k = 0; k < n_specs; k++) ring_recover(rings[k]);
        }
    }
    /* A signal before the end of the stream (some ring not drained, or items still in a slot) must
     * not close the rings: the stages would take "closed" for the end of their stream. A ring is
     * in use while an item is in a slot, a producer has not drained (alive, or dead and awaiting
     * its restart) or a live consumer is attached. Leave the
     * segments in place for a restart with the same command to adopt, and exit 3
     * (STAGE_EXIT_STOPPED of stages/core/stage.h) so the supervisor restarts us. A shutdown
     * request, or a signal once every ring is drained and empty, closes and unlinks as before. */
    int busy = 0;
    if (!stop) {
        struct ring_status *st = malloc(sizeof *st);
        ALLOC_CHECK(st);
        for (int k = 0; k < n_specs; k++) {
            ring_get_status(rings[k], st);
            int in_use = st->n_ready || st->n_writing || st->n_reading;
            for (int j = 0; j < st->n_attached; j++) {
                const struct ring_attached *e = &st->attached[j];
                if ((e->role == RING_PRODUCER && !e->drained) || (e->role == RING_CONSUMER && e->alive)) in_use = 1;
            }
            busy += in_use;
        }
        free(st);
    }
    if (busy) {
        log_warn("signal %d before the end of the stream (%d ring(s) still in use): leaving the segments for a restart "
                 "to adopt; exiting with status 3", stage_stop_signal(), busy);
        for (int k = 0; k < n_specs; k++) ring_disown(rings[k]);
        for (int k = 0; k < n_specs; k++) ring_close(rings[k]);   /* unmaps only */
        write_shm_json(common.run_dir, specs, n_specs, "stopped");
        nn_close(sock);
        return 3;   /* STAGE_EXIT_STOPPED (stages/core/stage.h, added by the stage-loop work; literal until then) */
    }
    if (stage_stopping()) log_info("signal %d: closing rings", stage_stop_signal());
    for (int k = 0; k < n_specs; k++) ring_set_closed(rings[k]);
    for (int k = 0; k < n_specs; k++) ring_close(rings[k]);   /* unlinks the segment, frees GPU buffers */
    write_shm_json(common.run_dir, specs, n_specs, "stopped");
    nn_close(sock);
    log_info("all rings closed and unlinked");
    return 0;
}
