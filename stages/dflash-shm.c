/*
 * stages/dflash-shm.c — the owner process of a run's rings (design.md §2, §4).
 *
 * Creates every ring given by --ring (host segments; GPU payload buffers through cudaMalloc with
 * their CUDA IPC handles in the segment), writes shm.json, recovers slots of dead stages every
 * second, and answers requests on NN_REP ipc://<run>/bus/control.sock until SIGINT/SIGTERM or a
 * `shutdown` request; then it marks every ring closed, unlinks every segment it created and
 * exits 0. It owns the GPU memory so that no compute stage owns memory another stage reads.
 *
 * Control protocol (text on NN_REQ/NN_REP): the request is a JSON object {"kind": "status" |
 * "shutdown", "version": 1} or just the bare word; the reply is a JSON object with "kind" (the
 * request's kind, or "error"), "version": 1 and, for status, "rings" (see status_json).
 *
 * Client modes of the same binary: --status (table, or --json), --shutdown, --list-stale,
 * --remove-stale (leftover /dev/shm/dflash.* segments whose creator is dead).
 */
#include "core/check.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/stage.h"
#include "shm/ring.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <nanomsg/nn.h>
#include <nanomsg/reqrep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_RINGS 32
#define CONTROL_VERSION 1

static void ring_log_to_stage(void *ctx, const char *line) {
    (void)ctx;
    log_info("%s", line);
}

/* ---------------------------------------------------------------- status JSON */

static const char *role_name(int role) { return role == RING_PRODUCER ? "producer" : role == RING_CONSUMER ? "consumer" : "?"; }

static json_t *ring_json(const struct ring_status *st) {
    json_t *att = json_array();
    for (int i = 0; i < st->n_attached; i++) {
        const struct ring_attached *a = &st->attached[i];
        json_array_append_new(att, json_pack("{s:i, s:s, s:b, s:b}", "pid", a->pid, "role", role_name(a->role),
                                             "alive", a->alive, "drained", a->drained));
    }
    json_t *o = json_pack("{s:s, s:s, s:i, s:I, s:I, s:I, s:I, s:b, s:b, s:i, s:b}",
                          "name", st->name, "segment", st->segment, "device", st->device,
                          "slots", (json_int_t)st->n_slots, "payload_bytes", (json_int_t)st->payload_bytes,
                          "desc_bytes", (json_int_t)st->desc_bytes, "producers", (json_int_t)st->n_producers,
                          "closed", st->closed, "drained", st->drained, "owner_pid", st->owner_pid,
                          "owner_alive", st->owner_alive);
    json_object_set_new(o, "free", json_integer(st->n_free));
    json_object_set_new(o, "writing", json_integer(st->n_writing));
    json_object_set_new(o, "ready", json_integer(st->n_ready));
    json_object_set_new(o, "reading", json_integer(st->n_reading));
    json_object_set_new(o, "published", json_integer((json_int_t)st->published));
    json_object_set_new(o, "consumed", json_integer((json_int_t)st->consumed));
    json_object_set_new(o, "redelivered", json_integer((json_int_t)st->redelivered));
    json_object_set_new(o, "recovered_writes", json_integer((json_int_t)st->recovered_writes));
    json_object_set_new(o, "lowest_ready_seq", st->lowest_ready_seq == UINT64_MAX ? json_null()
                                                : json_integer((json_int_t)st->lowest_ready_seq));
    json_object_set_new(o, "attached", att);
    return o;
}

static json_t *status_json(struct ring **rings, int n, int pid, const char *source) {
    json_t *arr = json_array();
    struct ring_status *st = malloc(sizeof *st);
    ALLOC_CHECK(st);
    for (int i = 0; i < n; i++) {
        if (!rings[i]) continue;
        ring_get_status(rings[i], st);
        json_array_append_new(arr, ring_json(st));
    }
    free(st);
    return json_pack("{s:s, s:i, s:i, s:s, s:o}", "kind", "status", "version", CONTROL_VERSION, "pid", pid,
                     "source", source, "rings", arr);
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
    json_t *o = json_pack("{s:s, s:i, s:i, s:s, s:f, s:o}", "kind", "shm", "version", CONTROL_VERSION, "pid", (int)getpid(),
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

/* Send one request; returns the parsed reply or NULL (dflash-shm not answering). */
static json_t *control_request(const char *run_dir, const char *kind, int timeout_ms) {
    char url[PATH_MAX + 16];
    if (control_url(run_dir, url, sizeof url)) return NULL;
    int s = nn_socket(AF_SP, NN_REQ);
    NN_CHECK(s);
    NN_CHECK(nn_setsockopt(s, NN_SOL_SOCKET, NN_RCVTIMEO, &timeout_ms, sizeof timeout_ms));
    NN_CHECK(nn_setsockopt(s, NN_SOL_SOCKET, NN_SNDTIMEO, &timeout_ms, sizeof timeout_ms));
    json_t *reply = NULL;
    if (nn_connect(s, url) >= 0) {
        char req[128];
        snprintf(req, sizeof req, "{\"kind\": \"%s\", \"version\": %d}", kind, CONTROL_VERSION);
        if (nn_send(s, req, strlen(req), 0) >= 0) {
            char *buf = NULL;
            int n = nn_recv(s, &buf, NN_MSG, 0);
            if (n >= 0) {
                json_error_t je;
                reply = json_loadb(buf, (size_t)n, 0, &je);
                nn_freemsg(buf);
            }
        }
    }
    nn_close(s);
    return reply;
}

/* Status without dflash-shm: attach to the segments named in shm.json as an observer. */
static json_t *status_from_segments(const char *run_dir) {
    char path[PATH_MAX], err[512];
    if (run_path(path, sizeof path, run_dir, "shm.json")) return NULL;
    json_error_t je;
    json_t *shm = json_load_file(path, 0, &je);
    if (!shm) { log_error("no answer on the control socket and no readable %s: %s", path, je.text); return NULL; }
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
    json_t *out = status_json(rings, n, (int)json_integer_value(json_object_get(shm, "pid")), "segments");
    for (int k = 0; k < n; k++) ring_close(rings[k]);
    json_decref(shm);
    return out;
}

static void print_table(json_t *st) {
    printf("dflash-shm pid %d (status from %s)\n", (int)json_integer_value(json_object_get(st, "pid")),
           json_string_value(json_object_get(st, "source")));
    printf("%-12s %-7s %5s %8s %6s %5s %5s %5s %5s %10s %10s %7s %-7s %-6s\n", "ring", "dev", "slots", "payload", "desc",
           "free", "write", "ready", "read", "published", "consumed", "redeliv", "drained", "closed");
    size_t i, j;
    json_t *r, *a;
    json_array_foreach(json_object_get(st, "rings"), i, r) {
        char dev[16], pb[32], db[32];
        int d = (int)json_integer_value(json_object_get(r, "device"));
        if (d < 0) snprintf(dev, sizeof dev, "host"); else snprintf(dev, sizeof dev, "cuda:%d", d);
        printf("%-12s %-7s %5lld %8s %6s %5lld %5lld %5lld %5lld %10lld %10lld %7lld %-7s %-6s\n",
               json_string_value(json_object_get(r, "name")), dev,
               (long long)json_integer_value(json_object_get(r, "slots")),
               ring_format_bytes((uint64_t)json_integer_value(json_object_get(r, "payload_bytes")), pb, sizeof pb),
               ring_format_bytes((uint64_t)json_integer_value(json_object_get(r, "desc_bytes")), db, sizeof db),
               (long long)json_integer_value(json_object_get(r, "free")),
               (long long)json_integer_value(json_object_get(r, "writing")),
               (long long)json_integer_value(json_object_get(r, "ready")),
               (long long)json_integer_value(json_object_get(r, "reading")),
               (long long)json_integer_value(json_object_get(r, "published")),
               (long long)json_integer_value(json_object_get(r, "consumed")),
               (long long)json_integer_value(json_object_get(r, "redelivered")),
               json_is_true(json_object_get(r, "drained")) ? "yes" : "no",
               json_is_true(json_object_get(r, "closed")) ? "yes" : "no");
        json_array_foreach(json_object_get(r, "attached"), j, a) {
            printf("    pid %-8lld %-8s %-5s%s\n", (long long)json_integer_value(json_object_get(a, "pid")),
                   json_string_value(json_object_get(a, "role")),
                   json_is_true(json_object_get(a, "alive")) ? "alive" : "dead",
                   json_is_true(json_object_get(a, "drained")) ? " drained" : "");
        }
    }
}

struct stale_ctx { int remove, n_stale, n_live, failed; };

static void on_segment(void *ctx, const char *segment, int owner_pid, int owner_alive) {
    struct stale_ctx *c = ctx;
    if (owner_alive) { c->n_live++; return; }
    char name[300], path[300];
    snprintf(name, sizeof name, "/%s", segment);
    snprintf(path, sizeof path, "/dev/shm/%s", segment);
    struct stat sb;
    /* No readable header: maybe a dflash-shm is creating it right now; leave young ones alone. */
    if (owner_pid == 0 && stat(path, &sb) == 0 && time(NULL) - sb.st_mtime < 60) {
        printf("young    /dev/shm/%s (no header yet; left alone)\n", segment);
        c->n_live++;
        return;
    }
    c->n_stale++;
    if (c->remove) {
        if (shm_unlink(name) == 0) printf("removed  /dev/shm/%s (creator pid %d is gone)\n", segment, owner_pid);
        else { printf("FAILED   /dev/shm/%s: shm_unlink: %s\n", segment, strerror(errno)); c->failed++; }
    } else {
        printf("stale    /dev/shm/%s (creator pid %d is gone)\n", segment, owner_pid);
    }
}

/* ---------------------------------------------------------------- server */

static int handle_request(const char *req, int len, struct ring **rings, int n, char **reply) {
    char kind[32] = "";
    json_error_t je;
    json_t *j = json_loadb(req, (size_t)len, 0, &je);
    if (j && json_is_object(j)) {
        const char *k = json_string_value(json_object_get(j, "kind"));
        json_t *v = json_object_get(j, "version");
        if (k && json_is_integer(v) && json_integer_value(v) == CONTROL_VERSION) snprintf(kind, sizeof kind, "%s", k);
    } else if (len > 0 && len < (int)sizeof kind) {
        memcpy(kind, req, (size_t)len);
        kind[len] = 0;
        while (len > 0 && (kind[len - 1] == '\n' || kind[len - 1] == ' ')) kind[--len] = 0;
    }
    json_decref(j);
    json_t *out;
    int shutdown = 0;
    if (!strcmp(kind, "status")) out = status_json(rings, n, (int)getpid(), "dflash-shm");
    else if (!strcmp(kind, "shutdown")) {
        out = json_pack("{s:s, s:i}", "kind", "shutdown", "version", CONTROL_VERSION);
        shutdown = 1;
    } else {
        out = json_pack("{s:s, s:i, s:s}", "kind", "error", "version", CONTROL_VERSION, "error",
                        "expected {\"kind\": \"status\"|\"shutdown\", \"version\": 1} or a bare word status|shutdown");
    }
    *reply = json_dumps(out, JSON_COMPACT);
    ALLOC_CHECK(*reply);
    json_decref(out);
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
    const char *ring_help = NULL;
    struct flag table[] = {
        {"run", FLAG_STRING, &common.run_dir, "run directory (created if missing)", 1, 0},
        {"ring", FLAG_STRING, &ring_help, "NAME:slots=N,bytes=SIZE,desc=SIZE,dev=host|cuda:N,producers=N (repeatable, or comma-separated)", 1, 0},
        {"host-only", FLAG_BOOL, &host_only, "create every ring with host payloads (for --device cpu runs)", 1, 0},
        {"status", FLAG_BOOL, &status, "print the run's rings, occupancy and attached stages, then exit", 1, 0},
        {"json", FLAG_BOOL, &as_json, "with --status: print the JSON reply instead of a table", 1, 0},
        {"shutdown", FLAG_BOOL, &shutdown_req, "ask the run's dflash-shm to close and unlink its rings, then exit", 1, 0},
        {"list-stale", FLAG_BOOL, &list_stale, "list /dev/shm/dflash.* segments whose creator is dead, then exit", 1, 0},
        {"remove-stale", FLAG_BOOL, &remove_stale, "remove those segments, then exit", 1, 0},
        {"timeout-ms", FLAG_INT, &timeout_ms, "control-socket timeout for --status/--shutdown", 1, 600000},
        FLAGS_END,
    };
    flags_parse_or_exit(table, n_rest, rest, "--run DIR --ring SPEC [--ring SPEC ...] | --status | --list-stale | --remove-stale",
                        "Owns the shared-memory rings of a run: creates them, serves status, unlinks them on exit.", NULL, 0);

    if (list_stale || remove_stale) {
        struct stale_ctx c = {remove_stale, 0, 0, 0};
        int n = ring_scan_segments(on_segment, &c, err, sizeof err);
        if (n < 0) DIE("%s", err);
        printf("%d dflash segment(s): %d with a live creator, %d stale%s\n", n, c.n_live, c.n_stale,
               remove_stale ? " (removed)" : (c.n_stale ? "; --remove-stale removes them" : ""));
        return c.failed ? 1 : 0;
    }
    if (!common.run_dir) { fprintf(stderr, "dflash-shm: --run DIR is required (see --help)\n"); return 2; }

    if (status || shutdown_req) {
        ring_set_log(ring_log_to_stage, NULL);
        json_t *reply = control_request(common.run_dir, status ? "status" : "shutdown", timeout_ms);
        if (shutdown_req) {
            if (!reply) { fprintf(stderr, "dflash-shm: no answer on the control socket of %s within %d ms\n", common.run_dir, timeout_ms); return 1; }
            printf("dflash-shm of %s is shutting down\n", common.run_dir);
            json_decref(reply);
            return 0;
        }
        if (!reply) {
            fprintf(stderr, "dflash-shm: no answer on the control socket of %s within %d ms; reading the segments directly\n",
                    common.run_dir, timeout_ms);
            reply = status_from_segments(common.run_dir);
            if (!reply) return 1;
        }
        if (as_json) {
            char *t = json_dumps(reply, JSON_INDENT(2));
            printf("%s\n", t);
            free(t);
        } else {
            print_table(reply);
        }
        json_decref(reply);
        return 0;
    }

    if (n_specs == 0) { fprintf(stderr, "dflash-shm: give at least one --ring (see --help)\n"); return 2; }
    stage_start(&common, 1);
    ring_set_log(ring_log_to_stage, NULL);

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

    char url[PATH_MAX + 16];
    if (control_url(common.run_dir, url, sizeof url)) DIE("run directory path too long for the control socket: %s", common.run_dir);
    int sock = nn_socket(AF_SP, NN_REP);
    NN_CHECK(sock);
    int rcv_ms = 250;
    NN_CHECK(nn_setsockopt(sock, NN_SOL_SOCKET, NN_RCVTIMEO, &rcv_ms, sizeof rcv_ms));
    NN_CHECK(nn_setsockopt(sock, NN_SOL_SOCKET, NN_SNDTIMEO, &rcv_ms, sizeof rcv_ms));
    if (nn_bind(sock, url) < 0) {
        int e = nn_errno();
        for (int k = 0; k < n_specs; k++) ring_close(rings[k]);
        DIE("nn_bind(%s) failed: %s (hint: is another dflash-shm serving this run?)", url, nn_strerror(e));
    }
    write_shm_json(common.run_dir, specs, n_specs, "running");
    log_info("serving %d ring(s) on %s", n_specs, url);

    double last_recover = time_mono_s();
    int stop = 0;
    while (!stop && !stage_stopping()) {
        char *buf = NULL;
        int n = nn_recv(sock, &buf, NN_MSG, 0);
        if (n >= 0) {
            char *reply = NULL;
            stop = handle_request(buf, n, rings, n_specs, &reply);
            nn_freemsg(buf);
            if (nn_send(sock, reply, strlen(reply), 0) < 0) log_warn("control reply not sent: %s", nn_strerror(nn_errno()));
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
    if (stage_stopping()) log_info("signal %d: closing rings", stage_stop_signal());
    for (int k = 0; k < n_specs; k++) ring_set_closed(rings[k]);
    for (int k = 0; k < n_specs; k++) ring_close(rings[k]);   /* unlinks the segment, frees GPU buffers */
    write_shm_json(common.run_dir, specs, n_specs, "stopped");
    nn_close(sock);
    log_info("all rings closed and unlinked");
    return 0;
}
