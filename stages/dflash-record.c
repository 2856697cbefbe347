/*
 * stages/dflash-record.c — the recorder: a stand-in consumer for any ring (design.md §8
 * "Replace"). It validates every item (descriptor kind, version, offsets, seq; batch arrays;
 * finite hidden states), drops duplicate sequence numbers (counted, as the trainer will do), and
 * either discards each item or writes it to --out DIR as one safetensors shard per seq in the
 * recording format of stages/core/record.h (shared with dflash-hspack --record, dflash-tap and
 * dflash-replay), written atomically, plus index.txt once the recording is complete.
 *
 * Order of effects per item: check, write the file (renamed into place), then release the slot.
 * So a SIGKILL leaves every item either READY upstream (redelivered to the restart) or on disk;
 * the restart scans --out, validates every shard (a truncated or corrupt one is renamed *.bad and
 * recorded again), treats the good seqs as seen and drops their redelivered copies. A stream
 * with gaps is never marked complete (no index.txt, no DONE, exit 1). --strict
 * takes items in exact seq order (ring_acquire_read_seq), starting at the lowest seq not yet on
 * disk; a seq that never arrives before the end of the stream is a gap and makes the exit code 1.
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
#include "core/bus.h"
#include "core/check.h"
#include "core/desc.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/record.h"
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

struct opts {
    struct stage_common common;
    const char *ring, *kind, *out, *verify, *on_bad, *summary;
    int strict, durable, wait_ms;
    int64_t start_seq, expect, vocab_size;
    double heartbeat_s;
};

struct counters {
    uint64_t items_in, recorded, bytes, tokens, rejected, redelivered, on_disk, first_tokens;
    double busy_s, wait_s, hb_t, hb_tokens, tok_rate;
    double t_first, t_last;    /* monotonic time of the first and last recorded item of this instance */
};

static void ring_log(void *ctx, const char *line) { (void)ctx; log_info("%s", line); }

static void send_stats(struct bus *bus, const struct opts *o, struct counters *c, const struct record_seqs *s,
                       struct ring *in, int summary) {
    double now = time_mono_s();
    if (now - c->hb_t > 0) c->tok_rate = ((double)c->tokens - c->hb_tokens) / (now - c->hb_t);
    c->hb_tokens = (double)c->tokens;
    c->hb_t = now;
    struct ring_status st;
    ring_get_status(in, &st);
    char occ[BUS_NAME_MAX];
    snprintf(occ, sizeof occ, "occ_%s", o->ring);
    struct bus_kv kv[] = {
        {BUS_K_ITEMS_IN, (double)c->items_in},
        {BUS_K_ITEMS_OUT, (double)c->recorded},
        {BUS_K_BUSY_S, c->busy_s},
        {BUS_K_WAIT_S, c->wait_s},
        {BUS_K_TOKENS_PER_S, c->tok_rate},
        {"tokens", (double)c->tokens},
        {"bytes", (double)c->bytes},
        {"duplicates", (double)s->n_dups},
        {"gaps", (double)record_seqs_gaps(s)},
        {"out_of_order", (double)s->n_out_of_order},
        {"rejected", (double)c->rejected},
        {"distinct_seqs", (double)s->n_distinct},
        {occ, (double)st.n_ready},
    };
    int n = (int)(sizeof kv / sizeof kv[0]);
    int rc = summary ? bus_summary(bus, kv, n) : bus_heartbeat(bus, kv, n);
    if (rc < 0) log_warn("metrics record refused: %s", bus_error(bus));
}

/* The summary sentence (log) and JSON (DONE file). */
static void summary_text(const struct counters *c, const struct record_seqs *s, char *line, size_t line_len,
                         char *json, size_t json_len, int ok) {
    /* Steady rate: tokens after the first item over the time from the first to the last item, so
     * the pipeline's start-up (model loading) does not count. */
    double span = c->t_last - c->t_first;
    double rate = c->recorded > 1 && span > 0 ? (double)(c->tokens - c->first_tokens) / span : 0;
    snprintf(line, line_len,
             "summary: %llu items recorded (%llu bytes, %llu tokens), %llu distinct seqs%s%llu..%llu, first new %llu, "
             "last new %llu, %llu gaps, %llu duplicates dropped, %llu out of order, %llu rejected, %llu redelivered, "
             "%llu already on disk; %.0f tokens/s over %.2f s",
             (unsigned long long)c->recorded, (unsigned long long)c->bytes, (unsigned long long)c->tokens,
             (unsigned long long)s->n_distinct, s->n_distinct ? " in " : " ", (unsigned long long)s->min,
             (unsigned long long)s->max, (unsigned long long)s->first, (unsigned long long)s->last,
             (unsigned long long)record_seqs_gaps(s), (unsigned long long)s->n_dups,
             (unsigned long long)s->n_out_of_order, (unsigned long long)c->rejected,
             (unsigned long long)c->redelivered, (unsigned long long)c->on_disk, rate, span);
    snprintf(json, json_len,
             "{\"kind\": \"record-summary\", \"version\": 1, \"complete\": %s, \"recorded\": %llu, \"bytes\": %llu, "
             "\"tokens\": %llu, \"distinct\": %llu, \"min_seq\": %llu, \"max_seq\": %llu, \"first_seq\": %llu, "
             "\"last_seq\": %llu, \"gaps\": %llu, \"duplicates\": %llu, \"out_of_order\": %llu, \"rejected\": %llu, "
             "\"redelivered\": %llu, \"on_disk_at_start\": %llu, \"span_s\": %.6f, \"tokens_per_s\": %.1f}\n",
             ok ? "true" : "false", (unsigned long long)c->recorded, (unsigned long long)c->bytes,
             (unsigned long long)c->tokens, (unsigned long long)s->n_distinct, (unsigned long long)s->min,
             (unsigned long long)s->max, (unsigned long long)s->first, (unsigned long long)s->last,
             (unsigned long long)record_seqs_gaps(s), (unsigned long long)s->n_dups,
             (unsigned long long)s->n_out_of_order, (unsigned long long)c->rejected,
             (unsigned long long)c->redelivered, (unsigned long long)c->on_disk, span, rate);
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
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats", 1, 0},
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
    struct record_seqs seqs;
    record_seqs_init(&seqs);
    struct counters c;
    memset(&c, 0, sizeof c);
    if (o.out) {
        LIB_CHECK(fs_mkdir_p(o.out, err, sizeof err), err);
        char done[PATH_MAX];
        if (snprintf(done, sizeof done, "%s/DONE", o.out) >= (int)sizeof done) DIE("--out path too long");
        if (fs_exists(done) && unlink(done) != 0) DIE("unlink(%s): %s", done, strerror(errno));   /* no longer complete */
        uint64_t n_bad = 0;
        int64_t n = record_scan_dir(o.out, &seqs, &n_bad, err, sizeof err);
        if (n < 0) DIE("%s", err);
        c.on_disk = (uint64_t)n;
        if (n_bad) log_warn("%s: %llu damaged item files (truncated or failing their checksum) renamed to *.bad; "
                            "they are recorded again from the ring", o.out, (unsigned long long)n_bad);
        if (n) log_info("%s already holds %lld items (seqs %llu..%llu); their redelivered copies will be dropped", o.out,
                        (long long)n, (unsigned long long)seqs.min, (unsigned long long)seqs.max);
    }

    /* ------------------------------------------------------------ ring */
#ifdef DFLASH_CUDA
    if (o.common.cuda_device >= 0) CUDA_CHECK(cudaSetDevice(o.common.cuda_device));   /* IPC handles open here */
#endif
    ring_set_log(ring_log, NULL);
    check_hint("is dflash-shm running for this --run, with the ring named by --ring?");
    struct ring *in = ring_attach(o.common.run_dir, o.ring, RING_CONSUMER, o.wait_ms, err, sizeof err);
    if (!in) DIE("%s", err);
    check_hint(NULL);
    const struct ring_spec *spec = ring_get_spec(in);
    if (spec->device >= 0 && o.common.cuda_device < 0)
        DIE("ring '%s' has GPU payloads (cuda:%d) but this stage runs with --device cpu; use --device cuda:N", o.ring,
            spec->device);
    int copy_gpu = spec->device >= 0 && (verify_gpu || o.out);
#ifdef DFLASH_CUDA
    void *staging = NULL;   /* pinned host copy of GPU payloads, one slot's size */
    if (copy_gpu) CUDA_CHECK(cudaMallocHost(&staging, spec->payload_bytes ? spec->payload_bytes : 1));
#endif
    struct bus *bus = bus_open(o.common.run_dir, log_stage(), err, sizeof err);
    if (!bus) log_warn("metrics bus unavailable: %s (continuing without metrics)", err);
    char waiting[96];
    snprintf(waiting, sizeof waiting, "ring %s: empty", o.ring);
    uint64_t next = 0;
    if (o.strict) next = o.start_seq >= 0 ? (uint64_t)o.start_seq : record_seqs_next_missing(&seqs, 0);
    log_info("consuming ring '%s' (%s payloads, kind %s, verify %s)%s%s%s, %s order", o.ring,
             spec->device >= 0 ? "GPU" : "host", o.kind, o.verify, o.out ? ", writing items to " : ", discarding items",
             o.out ? o.out : "", o.durable ? " (durable)" : "", o.strict ? "strict" : "arrival");
    if (o.strict) log_info("strict order from seq %llu", (unsigned long long)next);

    /* ------------------------------------------------------------ loop */
    int strict_phase = o.strict, failed = 0, ended = 0, reached = 0;
    double last_hb = time_mono_s() - o.heartbeat_s;   /* first heartbeat at once: the sink sees us start */
    c.hb_t = time_mono_s();
    while (!stage_stopping()) {
        if (bus && time_mono_s() - last_hb >= o.heartbeat_s) {
            send_stats(bus, &o, &c, &seqs, in, 0);
            last_hb = time_mono_s();
        }
        if (o.expect && seqs.n_distinct >= (uint64_t)o.expect) { reached = 1; break; }
        struct ring_slot s;
        double w0 = time_mono_s();
        if (bus) bus_set_waiting(bus, waiting);
        int rc;
        if (strict_phase) {
            rc = ring_acquire_read_seq(in, next, 250, &s);
            if (rc == RING_TIMEOUT) {
                /* A duplicate of a seq we already have (a producer killed between publish and
                 * release) would sit in a slot forever in strict mode: drop it. */
                if (ring_acquire_read(in, 0, &s) == 0) {
                    if (record_seqs_has(&seqs, s.seq)) {
                        record_seqs_add(&seqs, s.seq, err, sizeof err);
                        c.items_in++;
                        log_info("seq %llu: duplicate dropped", (unsigned long long)s.seq);
                        if (ring_release(in, &s)) DIE("ring '%s': %s", o.ring, ring_error());
                    } else if (ring_unread(in, &s)) {
                        DIE("ring '%s': %s", o.ring, ring_error());
                    }
                }
                c.wait_s += time_mono_s() - w0;
                continue;
            }
            if (rc == RING_END) {   /* take whatever is left in arrival order; gaps are reported at the end */
                strict_phase = 0;
                c.wait_s += time_mono_s() - w0;
                continue;
            }
        } else {
            rc = ring_acquire_read(in, 500, &s);
        }
        c.wait_s += time_mono_s() - w0;
        if (rc == RING_TIMEOUT) continue;
        if (rc == RING_END) { ended = 1; break; }
        if (rc < 0) DIE("ring '%s': %s", o.ring, ring_error());
        if (bus) bus_set_waiting(bus, NULL);

        double b0 = time_mono_s();
        c.items_in++;
        if (s.deliveries > 1) {
            c.redelivered++;
            log_warn("seq %llu delivered again (a previous consumer died holding it)", (unsigned long long)s.seq);
        }
        if (record_seqs_has(&seqs, s.seq)) {
            record_seqs_add(&seqs, s.seq, err, sizeof err);   /* counts the duplicate */
            log_info("seq %llu: duplicate dropped (%llu so far)", (unsigned long long)s.seq, (unsigned long long)seqs.n_dups);
            if (ring_release(in, &s)) DIE("ring '%s': %s", o.ring, ring_error());
            c.busy_s += time_mono_s() - b0;
            continue;
        }
        /* host: the bytes to write; check_ptr: the bytes to check (NULL: descriptor only). */
        const void *host = NULL, *check_ptr = NULL;
        if (!s.on_device) {
            host = s.payload;
            check_ptr = verify_host ? host : NULL;
        } else if (copy_gpu) {
#ifdef DFLASH_CUDA
            uint64_t n = s.payload_len < s.payload_cap ? s.payload_len : s.payload_cap;
            CUDA_CHECK(cudaMemcpy(staging, s.payload, n, cudaMemcpyDeviceToHost));
            host = staging;
            check_ptr = verify_gpu ? host : NULL;
#endif
        }
        struct record_info info;
        if (record_check(s.desc, s.desc_len, s.seq, check_ptr, s.payload_len, s.payload_cap, want, o.vocab_size, &info,
                         err, sizeof err)) {
            c.rejected++;
            if (bus) bus_event(bus, "rejected", err);
            if (!skip_bad) {
                /* Leave the item READY for inspection (dflash-shm --status), and stop loudly. */
                if (ring_unread(in, &s)) log_warn("ring '%s': %s", o.ring, ring_error());
                log_error("ring '%s': item rejected: %s", o.ring, err);
                failed = 1;
                break;
            }
            log_warn("ring '%s': item rejected and skipped: %s", o.ring, err);
            if (ring_release(in, &s)) DIE("ring '%s': %s", o.ring, ring_error());
            continue;
        }
        if (o.out) {
            if (!host) DIE("internal: no host copy of seq %llu to write", (unsigned long long)s.seq);
            LIB_CHECK(record_write_file(o.out, s.seq, info.kind, s.desc, s.desc_len, host, info.payload_bytes, o.durable,
                                        err, sizeof err), err);
        }
        if (record_seqs_add(&seqs, s.seq, err, sizeof err) < 0) DIE("%s", err);
        /* Released only now: the item is on disk (or deliberately discarded). */
        if (ring_release(in, &s)) DIE("ring '%s': %s", o.ring, ring_error());
        c.t_last = time_mono_s();
        if (!c.recorded) { c.t_first = c.t_last; c.first_tokens = info.n_tokens; }
        c.recorded++;
        c.bytes += info.payload_bytes;
        c.tokens += info.n_tokens;
        if (strict_phase) next = record_seqs_next_missing(&seqs, s.seq + 1);
        c.busy_s += time_mono_s() - b0;
        log_debug("seq %llu: %s, %u tokens, %llu bytes", (unsigned long long)s.seq, desc_kind_name(info.kind),
                  info.n_tokens, (unsigned long long)info.payload_bytes);
    }

    /* ------------------------------------------------------------ end */
    const char *why = NULL;
    char whybuf[512];
    if (failed) why = "an item was rejected (see above)";
    else if (stage_stopping()) log_info("stopping on signal %d", stage_stop_signal());
    else if (ended && !ring_is_drained(in)) why = "the ring was closed (dflash-shm shut down?) before the end of the stream";
    if (!why && !stage_stopping() && ended && o.expect && seqs.n_distinct < (uint64_t)o.expect) {
        snprintf(whybuf, sizeof whybuf, "--expect %lld: the stream ended after %llu distinct seqs", (long long)o.expect,
                 (unsigned long long)seqs.n_distinct);
        why = whybuf;
    }
    if (!why && !stage_stopping() && o.strict && (record_seqs_gaps(&seqs) || seqs.n_out_of_order ||
                                                  (seqs.n_distinct && seqs.min != (o.start_seq >= 0 ? (uint64_t)o.start_seq : 0)))) {
        snprintf(whybuf, sizeof whybuf, "--strict: seq %llu never arrived in order (%llu gaps, %llu out of order)",
                 (unsigned long long)record_seqs_next_missing(&seqs, o.start_seq >= 0 ? (uint64_t)o.start_seq : 0),
                 (unsigned long long)record_seqs_gaps(&seqs), (unsigned long long)seqs.n_out_of_order);
        why = whybuf;
    }
    if (!why && !stage_stopping() && record_seqs_gaps(&seqs)) {
        /* issue 14 item 3: a stream with gaps is never complete, in any order mode */
        snprintf(whybuf, sizeof whybuf, "seq %llu never arrived (%llu gaps between seqs %llu and %llu)",
                 (unsigned long long)record_seqs_next_missing(&seqs, seqs.min), (unsigned long long)record_seqs_gaps(&seqs),
                 (unsigned long long)seqs.min, (unsigned long long)seqs.max);
        why = whybuf;
    }
    int complete = !why && !stage_stopping() && (ended || reached);
    char line[1024], json[1024];
    summary_text(&c, &seqs, line, sizeof line, json, sizeof json, complete);
    log_info("%s", line);
    if (complete && o.out) {
        /* Every item file on disk before DONE says the directory is complete. */
        int dfd = open(o.out, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        SYS_CHECK(dfd);
        SYS_CHECK(syncfs(dfd));
        close(dfd);
        if (record_index_write(o.out, err, sizeof err) < 0) DIE("%s", err);   /* the recording's index (record.h) */
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/DONE", o.out);
        LIB_CHECK(fs_write_atomic(path, json, strlen(json), err, sizeof err), err);
    }
    if (o.summary) {
        if (fs_write_atomic(o.summary, json, strlen(json), err, sizeof err)) log_error("--summary: %s", err);
    }
    if (complete) log_info("%s: %llu distinct seqs", reached ? "--expect reached" : "end of stream",
                           (unsigned long long)seqs.n_distinct);
    if (bus) {
        send_stats(bus, &o, &c, &seqs, in, 1);
        bus_close(bus);
    }
    ring_close(in);
#ifdef DFLASH_CUDA
    if (staging) cudaFreeHost(staging);
#endif
    record_seqs_free(&seqs);
    if (why) {
        log_error("%s", why);
        return 1;
    }
    if (!complete && stage_stopping()) {
        log_info("stopped by signal %d before the end of the stream (the recording is not complete)", stage_stop_signal());
        return STAGE_EXIT_STOPPED;
    }
    return 0;
}
