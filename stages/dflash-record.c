/*
 * stages/dflash-record.c — the recorder: a stand-in consumer for any ring (design.md §8
 * "Replace"). It validates every item (descriptor kind, version, offsets, seq; batch arrays;
 * finite hidden states), drops duplicate sequence numbers (counted, as the trainer will do), and
 * either discards each item or writes it to --out DIR as one safetensors shard per seq in the
 * recording format of stages/core/record.h (shared with dflash-hspack --record, dflash-tap and
 * dflash-replay), written atomically, plus index.txt once the recording is complete.
 *
 * The item loop is the shared relay (stages/core/relay.h) as a sink: dedup (its seen set drops
 * redelivered seqs), in order for --strict (relay_set_next_seq for --start-seq), RELAY_DROP for
 * --on-bad skip, RELAY_FINISH once --expect N distinct seqs are in; this file is the wiring and
 * the per-item callback (check, copy a GPU payload, write the shard) plus the end-of-run verdict.
 *
 * Order of effects per item: check, write the file (renamed into place), then release the slot.
 * So a SIGKILL leaves every item either READY upstream (redelivered to the restart) or on disk;
 * the restart scans --out, validates every shard (a truncated or corrupt one is renamed *.bad and
 * recorded again), treats the good seqs as seen and drops their redelivered copies. A stream
 * with gaps is never marked complete (no index.txt, no DONE, exit 1). --strict
 * takes items in exact seq order (the relay's in-order mode), starting at the lowest seq not yet
 * on disk; a seq that never arrives before the end of the stream is a gap and makes the exit code
 * 1. A stop by SIGINT/SIGTERM before the stream is complete exits 3 (STAGE_EXIT_STOPPED) and
 * writes neither DONE nor index.txt.
 *
 * GPU rings: payloads are device pointers; with --verify all or --out they are copied to one
 * pinned host buffer (sized to the ring's slot) on the --device GPU before the check. Ends with
 * exit 0 at the end of the stream (ring drained and empty) or once --expect N distinct seqs are
 * in; exit 1 with a one-line reason on a rejected item (--on-bad fail), a gap in --strict mode,
 * fewer than --expect items, or a ring closed before the end of the stream. At exit it logs and
 * sends a summary (items, bytes, first/last seq, gaps, duplicates) and, with --out, writes
 * DIR/DONE (that summary as JSON) after every item file is on disk; --summary FILE writes it there
 * too. The summary's tokens/s counts from the first to the last recorded item (start-up excluded):
 * the whole-pipeline rate scripts/bench.sh reports.
 */
#include "core/check.h"
#include "core/desc.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/record.h"
#include "core/relay.h"
#include "core/stage.h"
#include "shm/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif

/* Seqs the seen set holds ahead of the lowest missing one (8 MiB of bitmap): a stream may start
 * anywhere below 2^26 and run that far ahead of a gap. */
#define RECORD_SEEN_WINDOW (1u << 26)

struct opts {
    struct stage_common common;
    const char *ring, *kind, *out, *verify, *on_bad, *summary;
    int strict, durable, wait_ms;
    int64_t start_seq, expect, vocab_size;
    double heartbeat_s;
};

/* The recorder's state, the relay's ctx. The seen set (distinct, duplicates, order, max) is the
 * relay's; what the recording needs beyond it is counted here. */
struct recorder {
    const struct opts *o;
    struct relay *relay;
    enum desc_kind want;
    int verify_host, verify_gpu, skip_bad, copy_gpu;
    void *staging;               /* pinned host copy of GPU payloads, one slot's size (CUDA builds) */
    uint64_t recorded, bytes, tokens, rejected, on_disk, first_tokens;
    uint64_t min;                /* lowest seq on disk or recorded (valid when seen->n_distinct > 0) */
    uint64_t first, last;        /* first and last seq this instance recorded (valid when recorded > 0) */
    double t_first, t_last;      /* monotonic time of the first and last recorded item of this instance */
};

static const struct relay_seen *seen_of(const struct recorder *rc) { return relay_seen_set(rc->relay); }

static uint64_t gaps_of(const struct recorder *rc) {
    const struct relay_seen *s = seen_of(rc);
    return s->n_distinct ? s->max - rc->min + 1 - s->n_distinct : 0;
}

/* Lowest seq >= from not seen (the end-of-run messages; O(seqs) once). */
static uint64_t next_missing(const struct relay_seen *s, uint64_t from) {
    uint64_t q = from;
    while (relay_seen_has(s, q)) q++;
    return q;
}

static void note_seq(struct recorder *rc, uint64_t seq) {
    if (!seen_of(rc)->n_distinct || seq < rc->min) rc->min = seq;
}

/* One item (relay_compute_fn): check it, copy a GPU payload when it must be read, write its
 * shard. The relay releases the slot only after this returns RELAY_DONE: the item is on disk (or
 * deliberately discarded). */
static int compute_record(void *ctx, struct relay_item *it, char *err, int err_len) {
    struct recorder *rc = ctx;
    const struct opts *o = rc->o;
    const struct ring_slot *s = it->in;
    /* host: the bytes to write; check_ptr: the bytes to check (NULL: descriptor only). */
    const void *host = NULL, *check_ptr = NULL;
    if (!s->on_device) {
        host = s->payload;
        check_ptr = rc->verify_host ? host : NULL;
    } else if (rc->copy_gpu) {
        uint64_t n = s->payload_len < s->payload_cap ? s->payload_len : s->payload_cap;
        if (relay_slot_get(rc->staging, -1, s, 0, n, NULL, err, err_len)) return -1;
#ifdef DFLASH_CUDA
        cudaError_t e = cudaStreamSynchronize(NULL);
        if (e != cudaSuccess) return err_fail(err, err_len, "seq %llu: copy to the host: %s", (unsigned long long)s->seq,
                                              cudaGetErrorString(e));
#endif
        host = rc->staging;
        check_ptr = rc->verify_gpu ? host : NULL;
    }
    struct record_info info;
    char why[1024];
    if (record_check(s->desc, s->desc_len, s->seq, check_ptr, s->payload_len, s->payload_cap, rc->want, o->vocab_size,
                     &info, why, sizeof why)) {
        rc->rejected++;
        struct bus *bus = relay_bus(rc->relay);
        char berr[256];
        if (bus && bus_event(bus, "rejected", why, berr, sizeof berr) < 0) log_warn("event record refused: %s", berr);
        if (!rc->skip_bad)   /* the relay leaves the item READY for inspection (dflash-shm --status) */
            return err_fail(err, err_len, "ring '%s': item rejected: %s", o->ring, why);
        log_warn("ring '%s': item rejected and skipped: %s", o->ring, why);
        return RELAY_DROP;
    }
    if (o->out) {
        if (!host) return err_fail(err, err_len, "internal: no host copy of seq %llu to write", (unsigned long long)s->seq);
        if (record_write_file(o->out, s->seq, info.kind, s->desc, s->desc_len, host, info.payload_bytes, o->durable, err,
                              err_len))
            return -1;
    }
    note_seq(rc, s->seq);
    rc->t_last = time_mono_s();
    if (!rc->recorded) { rc->t_first = rc->t_last; rc->first_tokens = info.n_tokens; rc->first = s->seq; }
    rc->last = s->seq;
    rc->recorded++;
    rc->bytes += info.payload_bytes;
    rc->tokens += info.n_tokens;
    it->n_tokens = info.n_tokens;
    log_debug("seq %llu: %s, %u tokens, %llu bytes", (unsigned long long)s->seq, desc_kind_name(info.kind),
              info.n_tokens, (unsigned long long)info.payload_bytes);
    /* The relay adds the seq to its seen set after this returns: this item is the Nth distinct. */
    if (o->expect && seen_of(rc)->n_distinct + 1 >= (uint64_t)o->expect) return RELAY_FINISH;
    return RELAY_DONE;
}

/* The recorder's numbers in every heartbeat and the summary (relay_kv_fn). */
static int record_kv(void *ctx, struct bus_kv *kv, int max) {
    const struct recorder *rc = ctx;
    const struct relay_seen *s = seen_of(rc);
    struct bus_kv mine[] = {
        {"recorded", (double)rc->recorded},
        {"bytes", (double)rc->bytes},
        {"duplicates", (double)s->n_dups},
        {"gaps", (double)gaps_of(rc)},
        {"out_of_order", (double)s->n_out_of_order},
        {"rejected", (double)rc->rejected},
        {"distinct_seqs", (double)s->n_distinct},
    };
    int n = (int)(sizeof mine / sizeof mine[0]);
    if (n > max) n = max;
    memcpy(kv, mine, (size_t)n * sizeof *kv);
    return n;
}

/* The summary sentence (log) and JSON (DONE file). */
static void summary_text(const struct recorder *c, char *line, size_t line_len, char *json, size_t json_len, int ok) {
    const struct relay_seen *s = seen_of(c);
    const struct relay_stats *st = relay_stats(c->relay);
    /* Steady rate: tokens after the first item over the time from the first to the last item, so
     * the pipeline's start-up (model loading) does not count. */
    double span = c->t_last - c->t_first;
    double rate = c->recorded > 1 && span > 0 ? (double)(c->tokens - c->first_tokens) / span : 0;
    unsigned long long min = s->n_distinct ? c->min : 0, max = s->n_distinct ? s->max : 0;
    snprintf(line, line_len,
             "summary: %llu items recorded (%llu bytes, %llu tokens), %llu distinct seqs%s%llu..%llu, first new %llu, "
             "last new %llu, %llu gaps, %llu duplicates dropped, %llu out of order, %llu rejected, %llu redelivered, "
             "%llu already on disk; %.0f tokens/s over %.2f s",
             (unsigned long long)c->recorded, (unsigned long long)c->bytes, (unsigned long long)c->tokens,
             (unsigned long long)s->n_distinct, s->n_distinct ? " in " : " ", min, max, (unsigned long long)c->first,
             (unsigned long long)c->last, (unsigned long long)gaps_of(c), (unsigned long long)s->n_dups,
             (unsigned long long)s->n_out_of_order, (unsigned long long)c->rejected,
             (unsigned long long)st->redelivered, (unsigned long long)c->on_disk, rate, span);
    snprintf(json, json_len,
             "{\"kind\": \"record-summary\", \"version\": 1, \"complete\": %s, \"recorded\": %llu, \"bytes\": %llu, "
             "\"tokens\": %llu, \"distinct\": %llu, \"min_seq\": %llu, \"max_seq\": %llu, \"first_seq\": %llu, "
             "\"last_seq\": %llu, \"gaps\": %llu, \"duplicates\": %llu, \"out_of_order\": %llu, \"rejected\": %llu, "
             "\"redelivered\": %llu, \"on_disk_at_start\": %llu, \"span_s\": %.6f, \"tokens_per_s\": %.1f}\n",
             ok ? "true" : "false", (unsigned long long)c->recorded, (unsigned long long)c->bytes,
             (unsigned long long)c->tokens, (unsigned long long)s->n_distinct, min, max, (unsigned long long)c->first,
             (unsigned long long)c->last, (unsigned long long)gaps_of(c), (unsigned long long)s->n_dups,
             (unsigned long long)s->n_out_of_order, (unsigned long long)c->rejected,
             (unsigned long long)st->redelivered, (unsigned long long)c->on_disk, span, rate);
}

/* Why a run that reached the end of its stream (or --expect) is not a complete recording, into
 * buf; NULL when it is complete. */
static const char *incomplete_why(const struct recorder *rc, int reached, char *buf, size_t len) {
    const struct opts *o = rc->o;
    const struct relay_seen *s = seen_of(rc);
    uint64_t start = o->start_seq >= 0 ? (uint64_t)o->start_seq : 0;
    if (!reached && o->expect && s->n_distinct < (uint64_t)o->expect) {
        snprintf(buf, len, "--expect %lld: the stream ended after %llu distinct seqs", (long long)o->expect,
                 (unsigned long long)s->n_distinct);
        return buf;
    }
    if (o->strict && (gaps_of(rc) || s->n_out_of_order || (s->n_distinct && rc->min != start))) {
        snprintf(buf, len, "--strict: seq %llu never arrived in order (%llu gaps, %llu out of order)",
                 (unsigned long long)next_missing(s, start), (unsigned long long)gaps_of(rc),
                 (unsigned long long)s->n_out_of_order);
        return buf;
    }
    if (gaps_of(rc)) {   /* issue 14 item 3: a stream with gaps is never complete, in any order mode */
        snprintf(buf, len, "seq %llu never arrived (%llu gaps between seqs %llu and %llu)",
                 (unsigned long long)next_missing(s, rc->min), (unsigned long long)gaps_of(rc),
                 (unsigned long long)rc->min, (unsigned long long)s->max);
        return buf;
    }
    return NULL;
}

/* Every item file on disk, then the index, then DONE (the directory is complete). */
static void write_done(const char *out, const char *json) {
    char err[1024], path[PATH_MAX];
    int dfd = open(out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    SYS_CHECK(dfd);
    SYS_CHECK(syncfs(dfd));
    close(dfd);
    if (record_index_write(out, err, sizeof err) < 0) DIE("%s", err);   /* the recording's index (record.h) */
    if (snprintf(path, sizeof path, "%s/DONE", out) >= (int)sizeof path) DIE("--out path too long");
    LIB_CHECK(fs_write_atomic(path, json, strlen(json), err, sizeof err), err);
}

int main(int argc, char **argv) {
    log_init("dflash-record");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    o.ring = "hidden";
    o.kind = "any";
    o.verify = "host";
    o.on_bad = "fail";
    o.wait_ms = 60000;
    o.start_seq = -1;
    o.heartbeat_s = 1.0;
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"ring", FLAG_STRING, &o.ring, "ring to consume (batches, hidden, features, ...)", 1, 0},
        {"kind", FLAG_STRING, &o.kind, "descriptor kind every item must have: any | batch | hidden | features", 1, 0},
        {"out", FLAG_STRING, &o.out, "write each item to DIR/item-<seq>.safetensors + DIR/index.txt (default: check and discard)", 1, 0},
        {"strict", FLAG_BOOL, &o.strict, "take items in exact seq order; a missing seq at the end of the stream is an error", 1, 0},
        {"start-seq", FLAG_INT64, &o.start_seq, "--strict: first seq to expect (-1: the lowest seq not yet in --out, else 0)", -1, INT64_MAX},
        {"expect", FLAG_INT64, &o.expect, "stop after N distinct seqs (also counting those already in --out); "
                                         "fewer at the end of the stream is an error (0: no count)", 0, INT64_MAX},
        {"verify", FLAG_STRING, &o.verify, "payload checks: host (host payloads only) | all (copy GPU payloads to the host "
                                           "to check them) | none (descriptors only)", 1, 0},
        {"on-bad", FLAG_STRING, &o.on_bad, "fail | skip: what an item that fails a check does (skip: release, count, go on)", 1, 0},
        {"vocab-size", FLAG_INT64, &o.vocab_size, "reject input ids >= this (0: no check)", 0, INT32_MAX},
        {"summary", FLAG_STRING, &o.summary, "also write the end-of-run summary (JSON) to FILE, atomically", 1, 0},
        {"durable", FLAG_BOOL, &o.durable, "kept for old scripts: every item file is fsync'ed before its rename anyway (record.h)", 1, 0},
        {"wait-ms", FLAG_INT, &o.wait_ms, "how long to wait for the ring to appear", 0, INT_MAX},
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats", 0, 86400},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--run DIR [--ring NAME] [--out DIR] [--strict] [--expect N] [flags]",
                        "The recorder: consumes any ring, validates each item's descriptor and payload, drops "
                        "duplicate seqs, and discards the items or writes them to --out as one file per seq (for a "
                        "replayer). Exits 0 at the end of the stream with a summary.", NULL, 0);
    enum desc_kind want = 0;
    if (!strcmp(o.kind, "batch")) want = DESC_KIND_BATCH;
    else if (!strcmp(o.kind, "hidden")) want = DESC_KIND_HIDDEN;
    else if (!strcmp(o.kind, "features")) want = DESC_KIND_FEATURES;
    else if (strcmp(o.kind, "any")) { fprintf(stderr, "dflash-record: --kind: expected any, batch, hidden or features, got '%s'\n", o.kind); return 2; }
    int verify_gpu = 0, verify_host = 1;
    if (!strcmp(o.verify, "all")) verify_gpu = 1;
    else if (!strcmp(o.verify, "none")) verify_host = 0;
    else if (strcmp(o.verify, "host")) { fprintf(stderr, "dflash-record: --verify: expected host, all or none, got '%s'\n", o.verify); return 2; }
    int skip_bad;
    if (!strcmp(o.on_bad, "skip")) skip_bad = 1;
    else if (!strcmp(o.on_bad, "fail")) skip_bad = 0;
    else { fprintf(stderr, "dflash-record: --on-bad: expected fail or skip, got '%s'\n", o.on_bad); return 2; }
    if (o.start_seq >= 0 && !o.strict) { fprintf(stderr, "dflash-record: --start-seq needs --strict\n"); return 2; }
    stage_start(&o.common, 1);

    char err[2048];
    struct recorder rc;
    memset(&rc, 0, sizeof rc);
    rc.o = &o;
    rc.want = want;
    rc.verify_gpu = verify_gpu;
    rc.verify_host = verify_host;
    rc.skip_bad = skip_bad;
    if (o.out) {
        LIB_CHECK(fs_mkdir_p(o.out, err, sizeof err), err);
        char done[PATH_MAX];
        if (snprintf(done, sizeof done, "%s/DONE", o.out) >= (int)sizeof done) DIE("--out path too long");
        if (fs_exists(done) && unlink(done) != 0) DIE("unlink(%s): %s", done, strerror(errno));   /* no longer complete */
    }

    /* ------------------------------------------------------------ ring */
#ifdef DFLASH_CUDA
    if (o.common.cuda_device >= 0) CUDA_CHECK(cudaSetDevice(o.common.cuda_device));   /* IPC handles open here */
#endif
    struct relay_config cfg = {
        .run_dir = o.common.run_dir,
        .in_ring = o.ring,
        .attach_wait_ms = o.wait_ms,
        .heartbeat_s = o.heartbeat_s,
        .use_bus = 1,
        .dedup = 1,
        .in_order = o.strict,
        .seen_window = RECORD_SEEN_WINDOW,
        .item_name = "item",
        .ctx = &rc,
        .compute = compute_record,
        .heartbeat_kv = record_kv,
    };
    check_hint("is dflash-shm running for this --run, with the ring named by --ring?");
    rc.relay = relay_open(&cfg, err, sizeof err);
    if (!rc.relay) DIE("%s", err);
    check_hint(NULL);
    const struct ring_spec *spec = ring_get_spec(relay_in(rc.relay));
    if (spec->device >= 0 && o.common.cuda_device < 0)
        DIE("ring '%s' has GPU payloads (cuda:%d) but this stage runs with --device cpu; use --device cuda:N", o.ring,
            spec->device);
    rc.copy_gpu = spec->device >= 0 && (verify_gpu || o.out);
#ifdef DFLASH_CUDA
    if (rc.copy_gpu) CUDA_CHECK(cudaMallocHost(&rc.staging, spec->payload_bytes ? spec->payload_bytes : 1));
#endif
    struct relay_seen *seen = relay_seen_set(rc.relay);
    if (o.out) {   /* a restart: the seqs already on disk count as seen, their redelivered copies are dropped */
        uint64_t n_bad = 0;
        int64_t n = record_scan_dir(o.out, seen, &rc.min, &n_bad, err, sizeof err);
        if (n < 0) DIE("%s", err);
        rc.on_disk = (uint64_t)n;
        if (n_bad) log_warn("%s: %llu damaged item files (truncated or failing their checksum) renamed to *.bad; "
                            "they are recorded again from the ring", o.out, (unsigned long long)n_bad);
        if (n) log_info("%s already holds %lld items (seqs %llu..%llu); their redelivered copies will be dropped", o.out,
                        (long long)n, (unsigned long long)rc.min, (unsigned long long)seen->max);
    }
    if (o.start_seq >= 0) relay_set_next_seq(rc.relay, (uint64_t)o.start_seq);
    log_info("consuming ring '%s' (%s payloads, kind %s, verify %s)%s%s%s, %s order", o.ring,
             spec->device >= 0 ? "GPU" : "host", o.kind, o.verify, o.out ? ", writing items to " : ", discarding items",
             o.out ? o.out : "", o.durable ? " (durable)" : "", o.strict ? "strict" : "arrival");
    if (o.strict) log_info("strict order from seq %llu", (unsigned long long)seen->next);

    /* ------------------------------------------------------------ loop */
    int reached = o.expect && seen->n_distinct >= (uint64_t)o.expect;   /* already on disk */
    int res = reached ? RELAY_DONE : relay_run(rc.relay, err, sizeof err);
    if (!reached && res == RELAY_DONE && o.expect) reached = seen->n_distinct >= (uint64_t)o.expect;

    /* ------------------------------------------------------------ end */
    char whybuf[512];
    const char *why = res < 0 ? err : res == RELAY_DONE ? incomplete_why(&rc, reached, whybuf, sizeof whybuf) : NULL;
    int complete = res == RELAY_DONE && !why;
    char line[1024], json[1024];
    summary_text(&rc, line, sizeof line, json, sizeof json, complete);
    log_info("%s", line);
    if (complete && o.out) write_done(o.out, json);
    char e2[1024];
    if (o.summary && fs_write_atomic(o.summary, json, strlen(json), e2, sizeof e2)) log_error("--summary: %s", e2);
    if (complete) log_info("%s: %llu distinct seqs", reached ? "--expect reached" : "end of stream",
                           (unsigned long long)seen->n_distinct);
    if (res == RELAY_STOPPED) log_info("stopped by signal %d before the end of the stream (the recording is not complete)",
                                       stage_stop_signal());
    if (why) log_error("%s", why);
    relay_close(rc.relay);   /* sends the summary record */
#ifdef DFLASH_CUDA
    if (rc.staging) cudaFreeHost(rc.staging);
#endif
    return why ? 1 : relay_exit_code(res);
}
