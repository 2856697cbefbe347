/*
 * stages/core/bus.h — the metrics bus (design.md §5): every stage pushes small msgpack maps to
 * dflash-metrics over nanomsg, and never waits for it.
 *
 * Transport: one NN_PUSH socket per struct bus, connected to ipc://<abs run dir>/bus/metrics.sock.
 * The connect is lazy (nanomsg reconnects every 100 ms in the background), so a bus opens and
 * sends fine while no sink is bound. Every send is NN_DONTWAIT: when the sink is down or its
 * queue is full the record is dropped and counted, never reported as an error, and the running
 * drop count travels in the field `dropped` of every later record so the sink can report what it
 * missed. Records accepted by nn_send while a sink is bound reach it, with two exceptions that
 * no sender can see (PUSH has no acknowledgement): records accepted in the few milliseconds
 * before nanomsg notices a dead sink (the bytes went into a closed socket), and the last records
 * of a sender that dies or closes before the sink has taken them (nanomsg drops a connection's
 * undelivered bytes when the peer hangs up; bus_close therefore lingers briefly, and
 * dflash-metrics receives on a dedicated thread so that window stays small).
 *
 * Wire format (schema version BUS_VERSION = 1): one flat msgpack map per record
 *   v       uint     schema version (1)
 *   kind    str      "metric" | "event" | "heartbeat" | "summary"
 *   stage   str      the sender's stage name (1..BUS_NAME_MAX-1 bytes)
 *   pid     uint     the sender's pid
 *   t       float64  wall-clock unix seconds when the record was built
 *   seq     uint     per-bus record counter, 0,1,2,... counting dropped records too (required for
 *                    every kind but metric; the bus always sends it, so gaps show losses)
 *   step    uint     training step (required for kind=metric, optional elsewhere)
 *   dropped uint     records this bus dropped before this one (optional, default 0)
 *   name    str      event name (required for kind=event, nowhere else)
 *   text    str      event text (required for kind=event, nowhere else)
 *   wait_on str      heartbeat only, optional: what the stage is waiting on ("" = not waiting)
 *   <other> number   named numbers (int or float), at most BUS_MAX_KV, names 1..BUS_NAME_MAX-1
 * Reserved keys above may not be used as metric names; keys are unique.
 *
 * Conventional names (so stages and the sink agree) are the BUS_K_* macros below. Counters in
 * heartbeats and summaries are cumulative since the stage started (so a lost heartbeat loses
 * nothing): items_in, items_out, busy_s, wait_s. Ring occupancy goes in "occ_<ring>" (slots ready),
 * GPU memory in gpu_mem_bytes.
 *
 * Thread safety: a struct bus has its own mutex; several threads of one process may share one.
 * Open a bus after fork(), in the process that uses it: nanomsg's global state does not survive
 * fork, and the child of a process that already used nanomsg hangs in nn_socket (seen with
 * nanomsg 1.1.5). Tests that fork senders must not touch nanomsg in the parent first.
 */
#ifndef STAGES_CORE_BUS_H
#define STAGES_CORE_BUS_H

#include <stddef.h>
#include <stdint.h>

#define BUS_VERSION     1
#define BUS_MAX_KV      64      /* named numbers per record */
#define BUS_NAME_MAX    64      /* stage, event and metric names, incl. the NUL */
#define BUS_TEXT_MAX    1024    /* event text and wait_on, incl. the NUL */
#define BUS_MSG_MAX     16384   /* the decoder rejects larger records */

/* The socket file inside the run directory. */
#define BUS_METRICS_SOCK "bus/metrics.sock"

/* Conventional names of heartbeat/summary and trainer numbers. */
#define BUS_K_ITEMS_IN     "items_in"      /* cumulative items consumed */
#define BUS_K_ITEMS_OUT    "items_out"     /* cumulative items produced */
#define BUS_K_BUSY_S       "busy_s"        /* cumulative seconds doing work */
#define BUS_K_WAIT_S       "wait_s"        /* cumulative seconds waiting on a ring/peer */
#define BUS_K_GPU_MEM      "gpu_mem_bytes"
#define BUS_K_LOSS         "loss"
#define BUS_K_EAL          "eal"
#define BUS_K_TOKENS_PER_S "tokens_per_s"
#define BUS_K_TOTAL_STEPS  "total_steps"   /* lets dflash-metrics show an ETA */
#define BUS_K_LR           "lr"
#define BUS_K_GRAD_NORM    "grad_norm"

enum bus_kind { BUS_KIND_METRIC = 0, BUS_KIND_EVENT = 1, BUS_KIND_HEARTBEAT = 2, BUS_KIND_SUMMARY = 3 };

/* bus_decode's error classes (negative returns), so a sink can log each class once. */
enum bus_decode_error {
    BUS_EMALFORMED = -1,   /* not msgpack, truncated, trailing bytes, wrong types, missing fields */
    BUS_EKIND = -2,        /* well-formed but `kind` is not one we know */
    BUS_EVERSION = -3,     /* well-formed but `v` is not BUS_VERSION */
};

struct bus_kv {
    const char *name;
    double value;
};

/* A decoded record. Strings are copied in (NUL-terminated); absent optional fields are 0/"". */
struct bus_record {
    int version;
    enum bus_kind kind;
    char stage[BUS_NAME_MAX];
    int64_t pid;
    double t;
    int has_step, has_seq;
    uint64_t step, seq;
    uint64_t dropped;
    char name[BUS_NAME_MAX];      /* event */
    char text[BUS_TEXT_MAX];      /* event */
    int has_wait_on;
    char wait_on[BUS_TEXT_MAX];   /* heartbeat */
    int n_kv;
    struct { char name[BUS_NAME_MAX]; double value; } kv[BUS_MAX_KV];
};

struct bus;

/* Write "ipc://<absolute run_dir>/bus/metrics.sock" into out (the address both ends use; the
 * socket file is out + 6). Returns 0, or -1 with a sentence when it does not fit out or the
 * 107-byte AF_UNIX path limit, or getcwd fails. */
int bus_address(const char *run_dir, char *out, size_t out_len, char *err, int err_len);

/* Open a bus for `stage` (copied) towards ipc://<run_dir>/bus/metrics.sock, run_dir made absolute
 * against the current directory. Never blocks and needs no sink. Returns NULL with a sentence in
 * err on failure (nn_socket/nn_connect error, socket path longer than the 107 bytes AF_UNIX
 * allows, stage name empty or too long). The caller owns the result; free with bus_close. */
struct bus *bus_open(const char *run_dir, const char *stage, char *err, int err_len);

/* Send one kind=metric record for training step `step` with n named numbers. Non-blocking:
 * returns 1 when nn_send accepted it, 0 when it was dropped (sink down or queue full; counted in
 * bus_dropped), -1 with a sentence in err (the caller's buffer, err.h; may be NULL/0) only for a
 * caller error (NULL bus, step < 0, n < 0 or > BUS_MAX_KV, a name that is empty, too long,
 * reserved or repeated). */
int bus_metric(struct bus *b, int64_t step, const struct bus_kv *kv, int n, char *err, int err_len);

/* Send one kind=event record (name and text, both required; text is cut at BUS_TEXT_MAX-1 bytes).
 * Same returns as bus_metric. */
int bus_event(struct bus *b, const char *name, const char *text, char *err, int err_len);

/* Send one kind=heartbeat record (stages call it about every second with the BUS_K_* counters and
 * ring occupancy); it also carries the current bus_set_waiting() text as wait_on. Same returns. */
int bus_heartbeat(struct bus *b, const struct bus_kv *kv, int n, char *err, int err_len);

/* Send one kind=summary record (the cumulative totals, at orderly exit). dflash-metrics treats a
 * summary as "this stage instance has ended". Same returns. */
int bus_summary(struct bus *b, const struct bus_kv *kv, int n, char *err, int err_len);

/* Set what the stage is waiting on ("ring batches empty", NULL or "" when working); copied and
 * carried as wait_on by later heartbeats, so the sink can name it in a stall warning. */
void bus_set_waiting(struct bus *b, const char *what);

/* Records dropped so far by this bus (EAGAIN and other send failures). Thread-safe. */
uint64_t bus_dropped(const struct bus *b);
/* Records attempted so far (the next seq). */
uint64_t bus_sent(const struct bus *b);

/* Close the socket and free the bus (NULL is fine). Blocks at most 50 ms: when the last record
 * was accepted less than 50 ms ago it waits out the rest, so the sink can take it before the
 * connection closes (nanomsg has no linger; see bus.c). No delivery guarantee beyond that. */
void bus_close(struct bus *b);

/* Build the msgpack bytes of a record into a malloc'd buffer (*out, caller frees; *len its size).
 * This is what bus_* send; exposed for tests and for tools that write records elsewhere.
 * Returns 0, or -1 with a sentence in err (bad names/counts as for bus_metric). rec->n_kv and
 * rec->kv are used as the named numbers; has_step/has_seq/has_wait_on select optional fields. */
int bus_encode(const struct bus_record *rec, void **out, size_t *len, char *err, int err_len);

/* Decode and validate one record: exactly one msgpack map of len bytes, version, kind, every
 * field's type, required fields per kind, unique keys, counts and lengths. Returns 0, or a
 * negative enum bus_decode_error with a sentence in err. Never crashes on any input (garbage,
 * truncated, hostile sizes): container sizes are checked against len before msgpack-c
 * allocates, so memory stays O(len). Thread-safe. */
int bus_decode(const void *buf, size_t len, struct bus_record *out, char *err, int err_len);

/* "metric", "event", "heartbeat", "summary" (or "?" for anything else). */
const char *bus_kind_name(enum bus_kind kind);
/* The value of named number `name` in rec, or `dflt` when absent. */
double bus_record_get(const struct bus_record *rec, const char *name, double dflt);

#endif /* STAGES_CORE_BUS_H */
