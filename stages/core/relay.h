/*
 * stages/core/relay.h — the one item loop every ring stage runs (design.md §4, issue 13 item 1).
 *
 * A stage used to write the same cycle by hand: wait for an input item with a timeout, claim it,
 * compute, claim an output slot, publish, release the input, count busy and wait seconds, send
 * heartbeats with ring occupancy, say what it is waiting for, handle end of stream and signals.
 * struct relay owns that cycle; the stage supplies callbacks and stays wiring (flags, model load).
 *
 * DESIGN
 * - Shapes. A relay has an input ring, an output ring, or both:
 *     source     out only   (dflash-pack: items come from the `next` callback's own state)
 *     transform  in and out (dflash-target, dflash-tap)
 *   dflash-hspack is not a relay: it holds several input items at once (its reorder window) and
 *   publishes them in seq order, which the one-item cycle below cannot express; it runs its own
 *   loop on the same ring calls and bus records, and drops duplicates with its own window
 *   (hspack_window, stages/hspack/hspack.h), not with struct relay_seen.
 *     sink       in only    (dflash-record, dflash-train)
 * - One cycle (relay_run): [sink/transform] claim an input item (ring_acquire_read, or
 *   ring_acquire_read_seq in order mode), waiting at most wait_ms at a time and polling the stop
 *   flag between waits; drop it at once when the seen set already holds its seq (dedup mode);
 *   [source] ask `at_end` whether anything is left; [source/transform] claim a FREE output slot
 *   the same way; call `compute` with both slots; then PUBLISH the output first and RELEASE the
 *   input second, so a SIGKILL anywhere leaves the item READY upstream or READY downstream
 *   (never lost; a kill between the two delivers the input once more and the output appears
 *   twice with one seq, which the downstream seen set drops).
 * - Nothing waits forever: every ring wait has wait_ms; a stage waiting on a full/empty ring says
 *   so through bus_set_waiting ("ring hidden: full") and in the log every 30 s.
 * - End of stream (exit 0): the input ring returned RING_END and ring_is_drained(in) holds, or
 *   at_end said so, or a source's compute returned RELAY_END. Then the output ring (if any) is
 *   marked drained.
 * - Stopped (exit STAGE_EXIT_STOPPED, stages/core/stage.h): SIGINT/SIGTERM arrived before end of
 *   stream. Held slots are given back (input: ring_unread -> READY again; output: ring_abandon),
 *   the output ring is NOT marked drained (the run is not finished), and relay_run logs
 *   "stopped by SIGTERM before end of stream".
 * - Error (-1 with a sentence): a ring error, a ring closed before the end of the stream (no
 *   drain: dflash-shm shut down), a seq outside the seen window, or compute returning -1. Held
 *   slots are given back the same way (a rejected input stays READY for inspection).
 * - Seen set and order. struct relay_seen is a bounded set of seqs: every seq below `next` counts
 *   as seen, plus a bitmap of `window` seqs from next on. A sink (dedup=1) drops redelivered
 *   copies; in_order=1 also takes items in exact seq order from next (ring_acquire_read_seq),
 *   dropping duplicates that would otherwise sit in the ring, and once the input is drained takes
 *   what is left in arrival order. relay_set_next_seq(min) makes a resumed consumer drop every seq
 *   below the one it needs. dflash-record also fills one from a recording's files (record_scan_dir).
 * - Metrics. The relay opens the bus (stages/core/bus.h) when run_dir is set and sends: every
 *   heartbeat_s a heartbeat with items_in, items_out, busy_s, wait_s, tokens, tokens_per_s,
 *   occ_<in ring>, occ_<out ring>, plus the stage's `heartbeat_kv`; one kind=metric record per
 *   item when `metric` is set (step = the item's seq); a summary at relay_close. busy_s counts
 *   compute time (and ring publish/release); wait_s counts ring waits.
 *
 * Threads: one relay per thread; the callbacks run on the caller's thread inside relay_run.
 * Library code: nothing here exits; errors are sentences in the caller's buffer (err.h).
 */
#ifndef STAGES_CORE_RELAY_H
#define STAGES_CORE_RELAY_H

#include "core/bus.h"
#include "shm/ring.h"

#include <stddef.h>
#include <stdint.h>

/* relay_run results, and compute/next results. */
#define RELAY_DONE    0   /* relay_run: end of stream reached; compute: publish the output, release the input */
#define RELAY_STOPPED 1   /* relay_run: SIGINT/SIGTERM before end of stream */
#define RELAY_DROP    2   /* compute: skip this item (input released, output slot abandoned, nothing published) */
#define RELAY_END     3   /* compute/at_end of a source: no more items (output slot abandoned, stream ends) */
#define RELAY_FINISH  4   /* compute of a sink: this item is consumed (released) and the stage is done before the
                           * end of the stream (a trainer that reached --max-steps); relay_run returns RELAY_DONE */

#define RELAY_DEFAULT_WAIT_MS     500
#define RELAY_DEFAULT_SEEN_WINDOW (1u << 20)   /* seqs ahead of next a seen set can hold (128 KiB) */
#define RELAY_MAX_KV              32           /* extra heartbeat / per-item numbers */

/* ---------------------------------------------------------------- seen set */

struct relay_seen {
    uint64_t next;            /* lowest seq not seen: every seq < next counts as seen */
    uint64_t *bits;           /* [window/64]: bit (seq % window) for next <= seq < next + window */
    uint32_t window;          /* a multiple of 64 */
    uint64_t n_distinct;      /* new seqs added (relay_seen_add returned 1) */
    uint64_t n_dups;          /* adds of a seq already seen */
    uint64_t n_out_of_order;  /* new seqs lower than the highest seen before them */
    uint64_t max;             /* highest seq added (valid when n_distinct > 0) */
    uint32_t rank, n_ranks;   /* n_ranks > 1: only seqs with seq % n_ranks == rank are this consumer's; the
                               * others count as seen (relay_set_rank; data-parallel trainer ranks) */
};

/* Allocate an empty set with next = 0 and a window of at least `window` seqs (rounded up to 64;
 * 0 -> RELAY_DEFAULT_SEEN_WINDOW). Returns 0, or -1 with a sentence (out of memory). */
int relay_seen_init(struct relay_seen *s, uint32_t window, char *err, int err_len);
/* Free the bitmap (safe on a zeroed or freed set). */
void relay_seen_free(struct relay_seen *s);
/* 1 if seq was seen (seq < next or its bit is set), else 0. Pure. */
int relay_seen_has(const struct relay_seen *s, uint64_t seq);
/* Add seq: 1 when new (next advances over every contiguous seen seq), 0 when already seen
 * (counted in n_dups), -1 with a sentence when seq >= next + window (the set is bounded: "seq S
 * is W or more ahead of the next expected seq N"). O(1) amortised. */
int relay_seen_add(struct relay_seen *s, uint64_t seq, char *err, int err_len);
/* Count every seq below min as seen (resume: a trainer needing seq min drops all older ones).
 * Never lowers next. Bits of seqs already added above min are kept. */
void relay_seen_set_next(struct relay_seen *s, uint64_t min);

/* ---------------------------------------------------------------- slot copies */

/* Copy n bytes from src into slot s's payload at byte off. src_device: -1 when src is host
 * memory, else the CUDA device src lives on. Host slot and host src: memcpy. A device on either
 * side: cudaMemcpyAsync on `stream` (a cudaStream_t; NULL = the legacy default stream), and
 * cudaMemcpyPeerAsync when src and the slot are on different devices. Asynchronous for device
 * copies: synchronise `stream` before ring_publish (design.md §4) and keep src valid until then.
 * Returns 0, or -1 with a sentence when off + n exceeds the slot's payload_cap, or a CUDA call
 * fails, or a device is involved in a build without CUDA. */
int relay_slot_put(const struct ring_slot *s, uint64_t off, const void *src, int src_device, size_t n,
                   void *stream, char *err, int err_len);
/* Copy n bytes from slot s's payload at byte off into dst (dst_device as src_device above).
 * Bounds: off + n <= payload_len of a read slot (payload_cap when payload_len is 0). Same
 * returns and asynchrony as relay_slot_put. */
int relay_slot_get(void *dst, int dst_device, const struct ring_slot *s, uint64_t off, size_t n, void *stream,
                   char *err, int err_len);

/* ---------------------------------------------------------------- the loop */

/* What compute sees and fills for one item. */
struct relay_item {
    const struct ring_slot *in;   /* the claimed input item (READING), NULL for a source */
    struct ring_slot *out;        /* the claimed output slot (WRITING), NULL for a sink */
    uint64_t seq;                 /* seq to publish: preset to in->seq (0 for a source; the source sets it) */
    uint32_t desc_len;            /* compute sets: descriptor bytes written to out->desc */
    uint64_t payload_len;         /* compute sets: payload bytes written to out->payload */
    uint64_t n_tokens;            /* compute sets (optional): tokens in the item, for tokens/s */
    double busy_s;                /* metric callback: seconds compute took */
};

/* Compute one item. Device writes into out->payload must be complete when it returns (sync the
 * stream). Returns RELAY_DONE (publish out with it->seq/desc_len/payload_len, then release in),
 * RELAY_DROP, RELAY_END (sources only), or -1 with a sentence in err (relay_run gives the slots
 * back and returns -1). */
typedef int (*relay_compute_fn)(void *ctx, struct relay_item *it, char *err, int err_len);
/* Optional, any shape: checked before each cycle claims anything. 1: the stream ends here (a
 * source has no item left, so it never waits for room it will not use; a sink wants no more, e.g.
 * dflash-record --expect N reached), which counts as end of stream (RELAY_DONE, output marked
 * drained); 0: go on; -1 with a sentence. */
typedef int (*relay_at_end_fn)(void *ctx, char *err, int err_len);
/* Optional: append up to max named numbers to kv (heartbeats and the summary; names must not
 * clash with the relay's own); returns how many. Names must outlive the call (literals). */
typedef int (*relay_kv_fn)(void *ctx, struct bus_kv *kv, int max);
/* Optional: the numbers of one kind=metric record for a published (or, for a sink, consumed)
 * item; returns how many (0: no record). */
typedef int (*relay_metric_fn)(void *ctx, const struct relay_item *it, struct bus_kv *kv, int max);
/* Optional: called after an item's output was published and its input released (a source saves
 * its resume cursor here, never before the publish). Returns 0, or -1 with a sentence (relay_run
 * then returns -1; the item is already downstream). */
typedef int (*relay_published_fn)(void *ctx, const struct relay_item *it, char *err, int err_len);

struct relay_config {
    const char *run_dir;          /* required: the run whose rings and bus to use */
    const char *ring_dir;         /* the run directory of the rings when it is not run_dir's (a trainer rank of a
                                   * several-host run reads its host's rings, RUN/hosts/H, and sends on RUN's bus);
                                   * NULL: run_dir */
    const char *in_ring;          /* input ring name (consumer), NULL for a source */
    const char *out_ring;         /* output ring name (producer), NULL for a sink */
    int attach_wait_ms;           /* how long ring_attach waits for the segments (0: once) */
    uint64_t plan;                /* the run plan's hash (stages/plan/plan.h; 0: none): a ring made for
                                   * another plan is refused at open (rings_check_plan) */
    int wait_ms;                  /* one ring wait, 0 -> RELAY_DEFAULT_WAIT_MS; the stop flag is polled between */
    double heartbeat_s;           /* seconds between heartbeats, 0 -> 1 */
    int use_bus;                  /* 1: open the metrics bus (a failure is a warning, not an error) */
    int dedup;                    /* 1: drop input seqs the seen set already holds (sinks, reorder) */
    int in_order;                 /* 1: take input in exact seq order from relay_seen.next (implies dedup) */
    int out_first;                /* 1: claim the output slot BEFORE the input item (replicas sharing rings,
                                   * issue 29): a replica that holds seq s always holds a slot to publish s
                                   * in, so a reorder stage waiting for s downstream never deadlocks on an
                                   * output ring its faster peers filled with later seqs */
    uint32_t seen_window;         /* seen set window (0: RELAY_DEFAULT_SEEN_WINDOW) */
    const char *item_name;        /* "batch", "item" ...: used in log lines (NULL: "item") */
    void *ctx;                    /* passed to every callback */
    relay_compute_fn compute;     /* required */
    relay_at_end_fn at_end;       /* optional */
    relay_kv_fn heartbeat_kv;     /* optional */
    relay_metric_fn metric;       /* optional */
    relay_published_fn published; /* optional */
};

/* Counters, readable at any time through relay_stats (cumulative since relay_open). */
struct relay_stats {
    uint64_t items_in, items_out, dropped, redelivered, tokens;
    double busy_s, wait_s, t0;
};

struct relay;

/* Attach the rings (in as RING_CONSUMER, out as RING_PRODUCER, each waiting up to
 * attach_wait_ms; GPU rings open their IPC handles on the calling thread's current CUDA device,
 * so a GPU stage calls cudaSetDevice first), route ring log lines to the stage log, set up the seen set, and open the bus
 * when use_bus. Blocks only in ring_attach. Returns the relay (caller owns; relay_close), or NULL
 * with a sentence (a missing ring names the segment; bad config says which field). */
struct relay *relay_open(const struct relay_config *cfg, char *err, int err_len);

/* The attached rings (for ring_expect and spec checks before relay_run), NULL when absent. */
struct ring *relay_in(struct relay *r);
struct ring *relay_out(struct relay *r);
/* The bus (NULL when none), e.g. for bus_event. */
struct bus *relay_bus(struct relay *r);
/* The seen set (dedup mode; else unused but valid), e.g. to add seqs found on disk at restart. */
struct relay_seen *relay_seen_set(struct relay *r);
/* Resume: drop every input seq below min, and in order mode start waiting at min. */
void relay_set_next_seq(struct relay *r, uint64_t min);
/* Data-parallel ranks (issue 29): take only the input seqs with seq % n_ranks == rank (ring_set_rank on the
 * input ring; the seen set counts the other ranks' seqs as seen). 0, or -1 with a sentence. */
int relay_set_rank(struct relay *r, uint32_t rank, uint32_t n_ranks, char *err, int err_len);
const struct relay_stats *relay_stats(const struct relay *r);

/* Run cycles until end of stream, a stop signal, or an error (see DESIGN). Blocks; never longer
 * than wait_ms without polling the stop flag. Returns RELAY_DONE (end of stream; output marked
 * drained), RELAY_STOPPED (slots given back, output not drained, logged), or -1 with a sentence
 * (slots given back). Call once. */
int relay_run(struct relay *r, char *err, int err_len);

/* The process exit status for a relay_run result: 0, STAGE_EXIT_STOPPED, or 1. */
int relay_exit_code(int run_result);

/* Send the summary record, close the bus and detach the rings (slots still held are given back
 * by ring_close). Safe with NULL. */
void relay_close(struct relay *r);

#endif /* STAGES_CORE_RELAY_H */
