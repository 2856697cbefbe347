/*
 * stages/core/relay.c — the one item loop (relay.h): the seen set, the slot copy helpers, and
 * relay_run's claim / compute / publish-then-release cycle with its accounting.
 */
#include "core/relay.h"
#include "core/rings.h"
#include "core/err.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/stage.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---------------------------------------------------------------- seen set */

int relay_seen_init(struct relay_seen *s, uint32_t window, char *err, int err_len) {
    memset(s, 0, sizeof *s);
    if (!window) window = RELAY_DEFAULT_SEEN_WINDOW;
    if (window > (1u << 31)) return err_fail(err, err_len, "seen window %u is larger than 2^31 seqs", window);
    window = (window + 63) / 64 * 64;
    s->bits = calloc(window / 64, sizeof *s->bits);
    if (!s->bits) return err_fail(err, err_len, "seen set: out of memory for a window of %u seqs", window);
    s->window = window;
    return 0;
}

void relay_seen_free(struct relay_seen *s) {
    free(s->bits);
    s->bits = NULL;
}

static int bit_get(const struct relay_seen *s, uint64_t seq) {
    uint64_t i = seq % s->window;
    return (int)((s->bits[i / 64] >> (i % 64)) & 1);
}
static void bit_set(struct relay_seen *s, uint64_t seq, int on) {
    uint64_t i = seq % s->window, m = 1ull << (i % 64);
    if (on) s->bits[i / 64] |= m;
    else s->bits[i / 64] &= ~m;
}

static int other_rank(const struct relay_seen *s, uint64_t seq) {
    return s->n_ranks > 1 && seq % s->n_ranks != s->rank;
}

int relay_seen_has(const struct relay_seen *s, uint64_t seq) {
    if (seq < s->next || other_rank(s, seq)) return 1;
    if (seq - s->next >= s->window) return 0;
    return bit_get(s, seq);
}

/* Move next over every seen seq, clearing their bits (they are now "below next"). */
static void advance(struct relay_seen *s) {
    while (bit_get(s, s->next) || other_rank(s, s->next)) {
        bit_set(s, s->next, 0);
        s->next++;
    }
}

int relay_seen_add(struct relay_seen *s, uint64_t seq, char *err, int err_len) {
    if (relay_seen_has(s, seq)) { s->n_dups++; return 0; }
    if (seq - s->next >= s->window)
        return err_fail(err, err_len, "seq %llu is %u or more ahead of the next expected seq %llu (the seen set holds "
                        "a window of %u seqs)", (unsigned long long)seq, s->window, (unsigned long long)s->next, s->window);
    if (s->n_distinct && seq < s->max) s->n_out_of_order++;
    if (!s->n_distinct || seq > s->max) s->max = seq;
    s->n_distinct++;
    bit_set(s, seq, 1);
    advance(s);
    return 1;
}

void relay_seen_set_next(struct relay_seen *s, uint64_t min) {
    while (s->next < min) {
        if (min - s->next >= s->window) {   /* nothing in the window survives: clear it at once */
            memset(s->bits, 0, s->window / 8);
            s->next = min;
            break;
        }
        bit_set(s, s->next, 0);
        s->next++;
    }
    advance(s);
}

/* ---------------------------------------------------------------- slot copies */

static int slot_copy(void *dst, int dst_dev, const void *src, int src_dev, size_t n, void *stream, char *err,
                     int err_len) {
    if (dst_dev < 0 && src_dev < 0) {
        memcpy(dst, src, n);
        return 0;
    }
#ifdef DFLASH_CUDA
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e;
    if (dst_dev >= 0 && src_dev >= 0 && dst_dev != src_dev)
        e = cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, st);
    else
        e = cudaMemcpyAsync(dst, src, n, dst_dev < 0 ? cudaMemcpyDeviceToHost
                                         : src_dev < 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice, st);
    if (e != cudaSuccess)
        return err_fail(err, err_len, "copy of %zu bytes (%s -> %s): %s", n, src_dev < 0 ? "host" : "device",
                        dst_dev < 0 ? "host" : "device", cudaGetErrorString(e));
    return 0;
#else
    (void)stream;
    return err_fail(err, err_len, "copy of %zu bytes involves CUDA device %d but this build has no CUDA support", n,
                    dst_dev >= 0 ? dst_dev : src_dev);
#endif
}

int relay_slot_put(const struct ring_slot *s, uint64_t off, const void *src, int src_device, size_t n,
                   void *stream, char *err, int err_len) {
    if (!n) return 0;
    if (off > s->payload_cap || n > s->payload_cap - off)
        return err_fail(err, err_len, "slot %u: writing %zu bytes at offset %llu exceeds its payload capacity %llu",
                        s->index, n, (unsigned long long)off, (unsigned long long)s->payload_cap);
    return slot_copy((char *)s->payload + off, s->on_device ? s->device : -1, src, src_device, n, stream, err, err_len);
}

int relay_slot_get(void *dst, int dst_device, const struct ring_slot *s, uint64_t off, size_t n, void *stream,
                   char *err, int err_len) {
    if (!n) return 0;
    uint64_t have = s->payload_len ? s->payload_len : s->payload_cap;
    if (have > s->payload_cap) have = s->payload_cap;
    if (off > have || n > have - off)
        return err_fail(err, err_len, "slot %u (seq %llu): reading %zu bytes at offset %llu exceeds its %llu payload "
                        "bytes", s->index, (unsigned long long)s->seq, n, (unsigned long long)off,
                        (unsigned long long)have);
    return slot_copy(dst, dst_device, (const char *)s->payload + off, s->on_device ? s->device : -1, n, stream, err,
                     err_len);
}

/* ---------------------------------------------------------------- the loop */

struct relay {
    struct relay_config cfg;
    struct ring *in, *out;
    struct bus *bus;
    struct relay_seen seen;
    struct relay_stats st;
    double last_hb, hb_t, hb_tokens, tok_rate, last_wait_log;
    char occ_in[BUS_NAME_MAX], occ_out[BUS_NAME_MAX];
    char wait_in[96], wait_out[96];
    int summary_sent;
};

static void ring_log_line(void *ctx, const char *line) { (void)ctx; log_info("%s", line); }

struct relay *relay_open(const struct relay_config *cfg, char *err, int err_len) {
    if (!cfg->run_dir) { err_fail(err, err_len, "relay: run_dir is required"); return NULL; }
    if (!cfg->compute) { err_fail(err, err_len, "relay: the compute callback is required"); return NULL; }
    if (!cfg->in_ring && !cfg->out_ring) { err_fail(err, err_len, "relay: neither an input nor an output ring"); return NULL; }
    struct relay *r = calloc(1, sizeof *r);
    if (!r) { err_fail(err, err_len, "relay: out of memory"); return NULL; }
    r->cfg = *cfg;
    if (!r->cfg.wait_ms) r->cfg.wait_ms = RELAY_DEFAULT_WAIT_MS;
    if (r->cfg.heartbeat_s <= 0) r->cfg.heartbeat_s = 1.0;
    if (!r->cfg.item_name) r->cfg.item_name = "item";
    if (r->cfg.in_order) r->cfg.dedup = 1;
    if (relay_seen_init(&r->seen, cfg->seen_window, err, err_len)) { free(r); return NULL; }
    ring_set_log(ring_log_line, NULL);
    char e2[512];
    if (cfg->in_ring) {
        r->in = ring_attach(cfg->ring_dir ? cfg->ring_dir : cfg->run_dir, cfg->in_ring, RING_CONSUMER, cfg->attach_wait_ms, e2, sizeof e2);
        if (!r->in) { err_fail(err, err_len, "input ring '%s': %s", cfg->in_ring, e2); relay_close(r); return NULL; }
        if (rings_check_plan(r->in, cfg->plan, err, err_len)) { relay_close(r); return NULL; }
        snprintf(r->occ_in, sizeof r->occ_in, "occ_%s", cfg->in_ring);
        snprintf(r->wait_in, sizeof r->wait_in, "ring %s: empty", cfg->in_ring);
    }
    if (cfg->out_ring) {
        r->out = ring_attach(cfg->ring_dir ? cfg->ring_dir : cfg->run_dir, cfg->out_ring, RING_PRODUCER, cfg->attach_wait_ms, e2, sizeof e2);
        if (!r->out) { err_fail(err, err_len, "output ring '%s': %s", cfg->out_ring, e2); relay_close(r); return NULL; }
        if (rings_check_plan(r->out, cfg->plan, err, err_len)) { relay_close(r); return NULL; }
        snprintf(r->occ_out, sizeof r->occ_out, "occ_%s", cfg->out_ring);
        snprintf(r->wait_out, sizeof r->wait_out, "ring %s: full", cfg->out_ring);
    }
    if (cfg->use_bus) {
        r->bus = bus_open(cfg->run_dir, log_stage(), e2, sizeof e2);
        if (!r->bus) log_warn("metrics bus unavailable: %s (continuing without metrics)", e2);
    }
    r->st.t0 = r->hb_t = time_mono_s();
    r->last_hb = r->st.t0 - r->cfg.heartbeat_s;   /* first heartbeat at once: the sink sees the stage start */
    r->last_wait_log = r->st.t0;
    return r;
}

struct ring *relay_in(struct relay *r) { return r->in; }
struct ring *relay_out(struct relay *r) { return r->out; }
struct bus *relay_bus(struct relay *r) { return r->bus; }
struct relay_seen *relay_seen_set(struct relay *r) { return &r->seen; }
void relay_set_next_seq(struct relay *r, uint64_t min) { relay_seen_set_next(&r->seen, min); }
int relay_set_rank(struct relay *r, uint32_t rank, uint32_t n_ranks, char *err, int err_len) {
    if (!r->in || ring_set_rank(r->in, rank, n_ranks))
        return err_fail(err, err_len, "ring '%s': %s", r->cfg.in_ring, r->in ? ring_error() : "no input ring");
    r->seen.rank = rank;
    r->seen.n_ranks = n_ranks;
    advance(&r->seen);
    return 0;
}
const struct relay_stats *relay_stats(const struct relay *r) { return &r->st; }

static void send_stats(struct relay *r, int summary) {
    if (!r->bus) return;
    double now = time_mono_s();
    if (now - r->hb_t > 0) r->tok_rate = ((double)r->st.tokens - r->hb_tokens) / (now - r->hb_t);
    r->hb_tokens = (double)r->st.tokens;
    r->hb_t = now;
    struct bus_kv kv[8 + RELAY_MAX_KV];
    int n = 0;
    kv[n++] = (struct bus_kv){BUS_K_ITEMS_IN, (double)r->st.items_in};
    kv[n++] = (struct bus_kv){BUS_K_ITEMS_OUT, (double)r->st.items_out};
    kv[n++] = (struct bus_kv){BUS_K_BUSY_S, r->st.busy_s};
    kv[n++] = (struct bus_kv){BUS_K_WAIT_S, r->st.wait_s};
    kv[n++] = (struct bus_kv){"tokens", (double)r->st.tokens};
    kv[n++] = (struct bus_kv){BUS_K_TOKENS_PER_S, summary ? (now > r->st.t0 ? (double)r->st.tokens / (now - r->st.t0) : 0)
                                                          : r->tok_rate};
    struct ring_status rs;
    if (r->in) { ring_get_status(r->in, &rs); kv[n++] = (struct bus_kv){r->occ_in, (double)rs.n_ready}; }
    if (r->out) { ring_get_status(r->out, &rs); kv[n++] = (struct bus_kv){r->occ_out, (double)rs.n_ready}; }
    if (r->cfg.heartbeat_kv) {
        int k = r->cfg.heartbeat_kv(r->cfg.ctx, kv + n, RELAY_MAX_KV);
        if (k > 0) n += k < RELAY_MAX_KV ? k : RELAY_MAX_KV;
    }
    char berr[256];
    int rc = summary ? bus_summary(r->bus, kv, n, berr, sizeof berr) : bus_heartbeat(r->bus, kv, n, berr, sizeof berr);
    if (rc < 0) {   /* a caller error (a bad or repeated metric name): say it once and stop sending */
        log_warn("metrics record refused: %s; metrics off", berr);
        bus_close(r->bus);
        r->bus = NULL;
    }
}

static void tick(struct relay *r) {
    if (r->bus && time_mono_s() - r->last_hb >= r->cfg.heartbeat_s) {
        send_stats(r, 0);
        r->last_hb = time_mono_s();
    }
}

static void set_waiting(struct relay *r, const char *what) {
    if (r->bus) bus_set_waiting(r->bus, what);
}

/* A wait timed out: say what we wait for in the log every 30 s (the bus says it every heartbeat). */
static void note_wait(struct relay *r, const char *what) {
    double now = time_mono_s();
    if (now - r->last_wait_log < 30) return;
    log_info("waiting: %s (%llu in, %llu out so far)", what, (unsigned long long)r->st.items_in,
             (unsigned long long)r->st.items_out);
    r->last_wait_log = now;
}

static const char *sig_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

/* Claim the next input item. Returns 0 (claimed, not a duplicate), RING_END, RELAY_STOPPED, or -1. */
static int claim_input(struct relay *r, struct ring_slot *s, int *ordered, char *err, int err_len) {
    for (;;) {
        if (stage_stopping()) return RELAY_STOPPED;
        tick(r);
        set_waiting(r, r->wait_in);
        double w0 = time_mono_s();
        int rc;
        if (*ordered) {
            rc = ring_acquire_read_seq(r->in, r->seen.next, r->cfg.wait_ms, s);
            if (rc == RING_TIMEOUT && ring_acquire_read(r->in, 0, s) == 0) {
                /* A copy of a seq we already have (a producer killed between publish and release)
                 * would sit in a slot forever in order mode: drop it; anything else goes back. */
                if (relay_seen_has(&r->seen, s->seq)) rc = 0;
                else if (ring_unread(r->in, s))
                    return err_fail(err, err_len, "ring '%s': %s", r->cfg.in_ring, ring_error());
            }
            if (rc == RING_END) {   /* drained: take what is left in arrival order */
                *ordered = 0;
                r->st.wait_s += time_mono_s() - w0;
                continue;
            }
        } else {
            rc = ring_acquire_read(r->in, r->cfg.wait_ms, s);
        }
        r->st.wait_s += time_mono_s() - w0;
        if (rc == RING_TIMEOUT) { note_wait(r, r->wait_in); continue; }
        if (rc == RING_END) return RING_END;
        if (rc < 0) return err_fail(err, err_len, "ring '%s': %s", r->cfg.in_ring, ring_error());
        set_waiting(r, NULL);
        r->st.items_in++;
        if (s->deliveries > 1) {
            r->st.redelivered++;
            log_warn("%s seq %llu delivered again (a previous consumer died holding it)", r->cfg.item_name,
                     (unsigned long long)s->seq);
        }
        if (r->cfg.dedup && relay_seen_has(&r->seen, s->seq)) {
            r->seen.n_dups++;
            r->st.dropped++;
            log_info("%s seq %llu: duplicate dropped (%llu so far)", r->cfg.item_name, (unsigned long long)s->seq,
                     (unsigned long long)r->seen.n_dups);
            if (ring_release(r->in, s)) return err_fail(err, err_len, "ring '%s': %s", r->cfg.in_ring, ring_error());
            continue;
        }
        if (r->cfg.dedup && s->seq - r->seen.next >= r->seen.window) {   /* refuse before compute, not after */
            err_fail(err, err_len, "ring '%s': seq %llu is %u or more ahead of the next expected seq %llu (the seen set "
                     "holds a window of %u seqs)", r->cfg.in_ring, (unsigned long long)s->seq, r->seen.window,
                     (unsigned long long)r->seen.next, r->seen.window);
            if (ring_unread(r->in, s)) log_warn("ring '%s': %s", r->cfg.in_ring, ring_error());
            return -1;
        }
        return 0;
    }
}

/* Claim a FREE output slot. Returns 0, RELAY_STOPPED, or -1. */
static int claim_output(struct relay *r, struct ring_slot *s, char *err, int err_len) {
    for (;;) {
        if (stage_stopping()) return RELAY_STOPPED;
        tick(r);
        set_waiting(r, r->wait_out);
        double w0 = time_mono_s();
        int rc = ring_acquire_write(r->out, r->cfg.wait_ms, s);
        r->st.wait_s += time_mono_s() - w0;
        if (rc == RING_TIMEOUT) { note_wait(r, r->wait_out); continue; }
        set_waiting(r, NULL);
        if (rc == RING_END)
            return err_fail(err, err_len, "ring '%s' was closed (dflash-shm shut down?) before the end of the stream",
                            r->cfg.out_ring);
        if (rc < 0) return err_fail(err, err_len, "ring '%s': %s", r->cfg.out_ring, ring_error());
        return 0;
    }
}

/* Give held slots back: the input READY again, the output FREE. Failures are logged (we are
 * already on a failure or stop path). */
static void give_back(struct relay *r, struct ring_slot *in, struct ring_slot *out) {
    if (in && ring_unread(r->in, in)) log_warn("ring '%s': %s", r->cfg.in_ring, ring_error());
    if (out && ring_abandon(r->out, out)) log_warn("ring '%s': %s", r->cfg.out_ring, ring_error());
}

static int end_of_stream(struct relay *r, char *err, int err_len) {
    if (r->out && ring_mark_drained(r->out))
        return err_fail(err, err_len, "ring '%s': %s", r->cfg.out_ring, ring_error());
    log_info("end of stream: %llu in, %llu out, %llu dropped, busy %.1f s, waiting %.1f s",
             (unsigned long long)r->st.items_in, (unsigned long long)r->st.items_out,
             (unsigned long long)r->st.dropped, r->st.busy_s, r->st.wait_s);
    return RELAY_DONE;
}

static int stopped(struct relay *r) {
    log_info("stopped by %s before end of stream (%llu in, %llu out; output not marked drained: the run is not "
             "finished)", sig_name(stage_stop_signal()), (unsigned long long)r->st.items_in,
             (unsigned long long)r->st.items_out);
    return RELAY_STOPPED;
}

int relay_run(struct relay *r, char *err, int err_len) {
    int ordered = r->cfg.in_order;
    for (;;) {
        struct ring_slot is, os;
        struct relay_item it;
        memset(&it, 0, sizeof it);
        int rc;
        if (stage_stopping()) return stopped(r);
        if (r->cfg.at_end) {
            rc = r->cfg.at_end(r->cfg.ctx, err, err_len);
            if (rc < 0) return -1;
            if (rc) return end_of_stream(r, err, err_len);
        }
        int early_out = r->cfg.out_first && r->in && r->out;
        if (early_out) {
            rc = claim_output(r, &os, err, err_len);
            if (rc) return rc == RELAY_STOPPED ? stopped(r) : -1;
            it.out = &os;
        }
        if (r->in) {
            rc = claim_input(r, &is, &ordered, err, err_len);
            if (rc && early_out) give_back(r, NULL, &os);   /* the claimed output slot goes back FREE */
            if (rc == RELAY_STOPPED) return stopped(r);
            if (rc == RING_END) {
                if (!ring_is_drained(r->in))
                    return err_fail(err, err_len, "ring '%s' was closed (dflash-shm shut down?) before the end of the "
                                    "stream", r->cfg.in_ring);
                return end_of_stream(r, err, err_len);
            }
            if (rc < 0) return -1;
            it.in = &is;
            it.seq = is.seq;
        } else {
            tick(r);
        }
        if (r->out && !early_out) {
            rc = claim_output(r, &os, err, err_len);
            if (rc) {
                give_back(r, it.in ? &is : NULL, NULL);
                return rc == RELAY_STOPPED ? stopped(r) : -1;
            }
            it.out = &os;
        }
        double b0 = time_mono_s();
        rc = r->cfg.compute(r->cfg.ctx, &it, err, err_len);
        int finish = rc == RELAY_FINISH && r->in && !r->out;
        if (finish) rc = RELAY_DONE;
        if (rc < 0 || (rc == RELAY_END && r->in) || (rc != RELAY_DONE && rc != RELAY_DROP && rc != RELAY_END)) {
            if (rc >= 0) err_fail(err, err_len, "relay: compute returned %d (%s)", rc,
                                  rc == RELAY_END ? "RELAY_END is for sources" :
                                  rc == RELAY_FINISH ? "RELAY_FINISH is for sinks" : "not a RELAY_* result");
            give_back(r, it.in ? &is : NULL, it.out ? &os : NULL);
            return -1;
        }
        if (rc != RELAY_DONE) {   /* DROP or a source's END: nothing published */
            if (it.out && ring_abandon(r->out, &os))
                return err_fail(err, err_len, "ring '%s': %s", r->cfg.out_ring, ring_error());
            if (it.in && ring_release(r->in, &is))
                return err_fail(err, err_len, "ring '%s': %s", r->cfg.in_ring, ring_error());
            r->st.busy_s += time_mono_s() - b0;
            if (rc == RELAY_END) return end_of_stream(r, err, err_len);
            r->st.dropped++;
            continue;
        }
        /* Publish downstream first, release upstream second (design.md §4). */
        if (it.out && ring_publish(r->out, &os, it.seq, it.desc_len, it.payload_len)) {
            err_fail(err, err_len, "ring '%s' (seq %llu): %s", r->cfg.out_ring, (unsigned long long)it.seq, ring_error());
            give_back(r, it.in ? &is : NULL, NULL);
            return -1;
        }
        if (r->cfg.dedup && it.in && relay_seen_add(&r->seen, is.seq, err, err_len) < 0) {
            give_back(r, &is, NULL);
            return -1;
        }
        if (it.in && ring_release(r->in, &is))
            return err_fail(err, err_len, "ring '%s': %s", r->cfg.in_ring, ring_error());
        if (r->cfg.published && r->cfg.published(r->cfg.ctx, &it, err, err_len)) return -1;
        it.busy_s = time_mono_s() - b0;
        r->st.busy_s += it.busy_s;
        if (it.out) r->st.items_out++;
        r->st.tokens += it.n_tokens;
        if (r->bus && r->cfg.metric) {
            struct bus_kv kv[RELAY_MAX_KV];
            int n = r->cfg.metric(r->cfg.ctx, &it, kv, RELAY_MAX_KV);
            char berr[256];
            if (n > 0 && bus_metric(r->bus, (int64_t)it.seq, kv, n < RELAY_MAX_KV ? n : RELAY_MAX_KV, berr, sizeof berr) < 0)
                log_warn("metric record refused: %s", berr);
        }
        log_debug("%s seq %llu: %llu tokens, %.3f s", r->cfg.item_name, (unsigned long long)it.seq,
                  (unsigned long long)it.n_tokens, it.busy_s);
        if (finish) {
            log_info("finished before the end of the stream (the stage's own limit): %llu in, busy %.1f s, waiting %.1f s",
                     (unsigned long long)r->st.items_in, r->st.busy_s, r->st.wait_s);
            return RELAY_DONE;
        }
    }
}

int relay_exit_code(int run_result) {
    return run_result == RELAY_DONE ? 0 : run_result == RELAY_STOPPED ? STAGE_EXIT_STOPPED : 1;
}

void relay_close(struct relay *r) {
    if (!r) return;
    if (r->bus) {
        send_stats(r, 1);
        bus_close(r->bus);
    }
    ring_close(r->in);
    ring_close(r->out);
    relay_seen_free(&r->seen);
    free(r);
}
