/*
 * stages/dflash-hspack.c — hidden -> features (design.md §6, issue 15): reads `hidden` items
 * ([k][T, H] per batch, from one or several target replicas), writes `features` in the layout the
 * trainer asks for (--layout concat [T, k·H] | split k × [T, H]) on the features ring's device,
 * in sequence order; optionally records every features item to disk (--record DIR, the format of
 * stages/core/record.h) for dflash-replay.
 *
 * Why not relay_run: relay (stages/core/relay.h) is one claim -> one publish. hspack must hold
 * several claimed items at once (the reorder window) and may move an item out of its input slot
 * before it can publish it (the spill pool), so it runs its own loop on the same ring calls and
 * the same bus records; everything that needs no ring is in stages/hspack/hspack.h and tested
 * there.
 *
 * Per item, in this order: claim (any order, up to --window held), convert into a claimed
 * features slot when the item is `next`, record it (--record), publish, advance the state file,
 * release the hidden slot. So with --spill 0 a SIGKILL loses nothing: an item is READY upstream
 * until its features item is published, and the restart (state file <run>/state/hspack.<out>.next
 * says where to resume; this file is its only writer, --set-next SEQ the pipelines' rewind) drops
 * redelivered seqs below it; a kill between publish and the state write can make one seq appear
 * twice downstream, which every consumer's seen set drops.
 * --spill N: when features is full (or the window is full with next missing and hidden has no
 * free slot, which would otherwise stall the replica computing next), up to N converted items
 * move to pinned host memory and their hidden slots are released at once: the target keeps
 * running through a burst. A spilled item exists only in this process: a SIGKILL loses up to N
 * items (SIGTERM first flushes what it can). With --spill 0 back-pressure reaches the target.
 *
 * Exit 0 at end of stream (features marked drained, --record index written), 3 when stopped by a
 * signal before it, 1 with a one-line reason (bad descriptor: the item stays READY for
 * inspection; a seq that never arrived by the end of the stream; ring errors).
 */
#include "core/bus.h"
#include "core/check.h"
#include "core/desc.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/record.h"
#include "core/rings.h"
#include "core/stage.h"
#include "plan/plan.h"
#include "hspack/hspack.h"
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

#define MAX_SELECT DESC_MAX_LAYERS

struct opts {
    struct stage_common common;
    const char *in_ring, *out_ring, *record;
    int layout, record_dtype, dtype;
    int window, spill, wait_ms, tokens, hidden_size, n_layers, print_spec, spec_slots;
    int select[MAX_SELECT], n_select;
    int64_t start_seq, set_next;
    double heartbeat_s, stall_log_s;
};

static const char *const layout_names[] = {"concat", "split", NULL};
static const char *const rdtype_names[] = {"same", "bf16", "f32", NULL};
static const char *const dtype_names[] = {"bf16", "f32", NULL};

struct counters {
    uint64_t items_in, items_out, bytes_out, tokens, dups, redelivered, recorded;
    double busy_s, wait_s, copy_s, record_s, hb_t, hb_items, hb_bytes, hb_tokens;
    double rate_items, rate_bytes, rate_tokens;
};

struct hs {
    const struct opts *o;
    struct ring *in, *out;
    const struct ring_spec *is, *os;
    struct bus *bus;
    struct hspack_window w;
    struct hspack_spill *sp;
    struct hspack_plan *plans;       /* [window]: plan of each held slot */
    struct hspack_plan *splans;      /* [spill]: plan of each spill buffer */
    struct ring_slot *held;          /* [window] */
    uint8_t *held_used;
    struct hspack_want want, rwant;
    int state_fd;
    uint64_t plan;                   /* the run plan's hash (0: none): items of another plan are refused */
    uint8_t *rec_buf, *stage_buf;    /* --record: host copy of a features payload, and its recorded form */
    struct counters c;
#ifdef DFLASH_CUDA
    cudaStream_t stream;
#endif
};

static void ring_log(void *ctx, const char *line) { (void)ctx; log_info("%s", line); }

/* ---------------------------------------------------------------- metrics */

static void send_stats(struct hs *h, int summary) {
    if (!h->bus) return;
    struct counters *c = &h->c;
    double now = time_mono_s(), dt = now - c->hb_t;
    if (dt > 0) {
        c->rate_items = ((double)c->items_out - c->hb_items) / dt;
        c->rate_bytes = ((double)c->bytes_out - c->hb_bytes) / dt;
        c->rate_tokens = ((double)c->tokens - c->hb_tokens) / dt;
    }
    c->hb_t = now;
    c->hb_items = (double)c->items_out;
    c->hb_bytes = (double)c->bytes_out;
    c->hb_tokens = (double)c->tokens;
    struct ring_status si, so;
    ring_get_status(h->in, &si);
    ring_get_status(h->out, &so);
    char occ_in[BUS_NAME_MAX], occ_out[BUS_NAME_MAX];
    snprintf(occ_in, sizeof occ_in, "occ_%s", h->o->in_ring);
    snprintf(occ_out, sizeof occ_out, "occ_%s", h->o->out_ring);
    struct bus_kv kv[] = {
        {BUS_K_ITEMS_IN, (double)c->items_in},          {BUS_K_ITEMS_OUT, (double)c->items_out},
        {BUS_K_BUSY_S, c->busy_s},                      {BUS_K_WAIT_S, c->wait_s},
        {BUS_K_TOKENS_PER_S, c->rate_tokens},           {"items_per_s", c->rate_items},
        {"bytes_per_s", c->rate_bytes},                 {"bytes", (double)c->bytes_out},
        {"copy_s", c->copy_s},                          {"record_s", c->record_s},
        {"reorder_depth", (double)hspack_window_depth(&h->w)}, {"reorder_max_depth", (double)h->w.max_depth},
        {"spill_depth", (double)h->w.n_spilled},        {"spilled", (double)h->w.n_spills},
        {"duplicates", (double)c->dups},                {"recorded", (double)c->recorded},
        {"next_seq", (double)h->w.next},                {occ_in, (double)si.n_ready},
        {occ_out, (double)so.n_ready},
    };
    int n = (int)(sizeof kv / sizeof kv[0]);
    char berr[256];
    int rc = summary ? bus_summary(h->bus, kv, n, berr, sizeof berr) : bus_heartbeat(h->bus, kv, n, berr, sizeof berr);
    if (rc < 0) log_warn("metrics record refused: %s", berr);
}

/* ---------------------------------------------------------------- state */

/* THE format of <run>/state/hspack.<out>.next, its one writer and reader (pipelines rewind it with --set-next):
 * the next seq to emit, 20 decimal digits and a newline. */
static int state_format(char *line, size_t cap, uint64_t next) {
    return snprintf(line, cap, "%020llu\n", (unsigned long long)next);
}

/* The seq of a state file's text; -1 with a sentence naming the file when it is not one. */
static int state_parse(const char *path, const char *text, uint64_t *next, char *err, int err_len) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || *end != '\n' || end[1] || errno || text[0] == '-')
        return err_fail(err, err_len, "%s: expected a seq number and a newline, found '%.30s'", path, text);
    *next = v;
    return 0;
}

static int state_path(char *out, size_t cap, const char *run_dir, const char *out_ring) {
    char sdir[PATH_MAX];
    if (run_path(sdir, sizeof sdir, run_dir, "state")) return -1;
    return snprintf(out, cap, "%s/hspack.%s.next", sdir, out_ring) >= (int)cap ? -1 : 0;
}

static void state_write(struct hs *h) {
    char line[32];
    int n = state_format(line, sizeof line, h->w.next);
    /* pwrite, no fsync: the file only has to survive the process (SIGKILL), not the machine */
    if (pwrite(h->state_fd, line, (size_t)n, 0) != n) DIE("pwrite(state file): %s", strerror(errno));
}

/* ---------------------------------------------------------------- copies */

/* Convert held input slot s (plan p) into dst (host or device memory of dst_dev). */
static void convert(struct hs *h, const struct hspack_plan *p, const struct ring_slot *s, void *dst, int dst_dev) {
    char err[1024];
    double t0 = time_mono_s();
    if (!s->on_device && dst_dev < 0) {
        LIB_CHECK(hspack_convert_host(p, s->payload, dst, err, sizeof err), err);
    } else {
#ifdef DFLASH_CUDA
        LIB_CHECK(hspack_convert_device(p, s->payload, s->on_device ? s->device : -1, dst, dst_dev, h->stream, err,
                                        sizeof err), err);
        CUDA_CHECK(cudaStreamSynchronize(h->stream));
#else
        DIE("internal: a device payload in a build without CUDA");
#endif
    }
    h->c.copy_s += time_mono_s() - t0;
}

/* Plain copy of n bytes from host src into the features slot. */
static void put_bytes(struct hs *h, struct ring_slot *os, const void *src, uint64_t n) {
    double t0 = time_mono_s();
    if (!os->on_device) {
        memcpy(os->payload, src, n);
    } else {
#ifdef DFLASH_CUDA
        CUDA_CHECK(cudaMemcpyAsync(os->payload, src, n, cudaMemcpyHostToDevice, h->stream));
        CUDA_CHECK(cudaStreamSynchronize(h->stream));
#endif
    }
    h->c.copy_s += time_mono_s() - t0;
}

/* --record: write the features item (payload in host memory) in the recorded form. */
static void record_item(struct hs *h, const struct hspack_plan *p, const void *host_payload) {
    if (!h->o->record) return;
    char err[1024];
    double t0 = time_mono_s();
    const void *desc = p->out_desc, *pay = host_payload;
    uint32_t dlen = p->out_desc_len;
    uint64_t plen = p->out.batch.payload_bytes;
    struct hspack_plan rp;
    if (h->rwant.n_select || h->rwant.dtype) {
        LIB_CHECK(hspack_plan(p->out_desc, p->out_desc_len, 0, &h->rwant, 0, &rp, err, sizeof err), err);
        LIB_CHECK(hspack_convert_host(&rp, host_payload, h->rec_buf, err, sizeof err), err);
        desc = rp.out_desc;
        dlen = rp.out_desc_len;
        pay = h->rec_buf;
        plen = rp.out.batch.payload_bytes;
    }
    LIB_CHECK(record_write_file(h->o->record, p->out.batch.seq, DESC_KIND_FEATURES, desc, dlen, pay, plen, 1, err, sizeof err),
              err);
    h->c.recorded++;
    h->c.record_s += time_mono_s() - t0;
}

/* Emit the window's next entry into the claimed features slot os: convert (or copy the spilled
 * bytes), record, publish, advance the state, release the hidden slot. */
static void emit(struct hs *h, struct ring_slot *os) {
    const struct hspack_entry *e = hspack_window_peek(&h->w);
    int ref = e->ref;
    enum hspack_where where = e->where;
    const struct hspack_plan *p = where == HSPACK_HELD ? &h->plans[ref] : &h->splans[ref];
    uint64_t seq = p->out.batch.seq, pb = p->out.batch.payload_bytes;
    if (pb > os->payload_cap)
        DIE("batch seq %llu: the features item needs %llu payload bytes, ring '%s' slots hold %llu",
            (unsigned long long)seq, (unsigned long long)pb, h->o->out_ring, (unsigned long long)os->payload_cap);
    const void *host_copy = NULL;
    if (where == HSPACK_HELD) {
        convert(h, p, &h->held[ref], os->payload, os->on_device ? os->device : -1);
        if (h->o->record) {
            if (!os->on_device) host_copy = os->payload;
            else {
#ifdef DFLASH_CUDA
                CUDA_CHECK(cudaMemcpy(h->stage_buf, os->payload, pb, cudaMemcpyDeviceToHost));
                host_copy = h->stage_buf;
#endif
            }
        }
    } else {
        put_bytes(h, os, hspack_spill_ptr(h->sp, ref), pb);
        host_copy = hspack_spill_ptr(h->sp, ref);
    }
    memcpy(os->desc, p->out_desc, p->out_desc_len);
    if (host_copy) record_item(h, p, host_copy);   /* on disk before it is published (a restart rewrites it identically) */
    if (ring_publish(h->out, os, seq, p->out_desc_len, pb)) DIE("ring '%s': %s", h->o->out_ring, ring_error());
    struct hspack_entry taken;
    if (hspack_window_take(&h->w, &taken)) DIE("internal: seq %llu left the window", (unsigned long long)seq);
    state_write(h);
    if (where == HSPACK_HELD) {
        if (ring_release(h->in, &h->held[ref])) DIE("ring '%s': %s", h->o->in_ring, ring_error());
        h->held_used[ref] = 0;
    } else {
        hspack_spill_put(h->sp, ref);
    }
    h->c.items_out++;
    h->c.bytes_out += pb;
    h->c.tokens += p->out.batch.n_tokens;
    log_debug("seq %llu -> %s (%s, %llu bytes%s)", (unsigned long long)seq, h->o->out_ring,
              desc_layout_name(p->out.layout), (unsigned long long)pb, where == HSPACK_SPILLED ? ", from the spill pool" : "");
}

/* Move a held entry (the highest seq other than next, else next itself) to the spill pool and
 * release its hidden slot. Returns 1 when one moved, 0 when nothing could. */
static int spill_one(struct hs *h) {
    if (!hspack_window_has_room(&h->w, HSPACK_SPILLED, 0)) return 0;
    const struct hspack_entry *v = hspack_window_spill_victim(&h->w);
    if (!v) {
        v = hspack_window_peek(&h->w);
        if (!v || v->where != HSPACK_HELD) return 0;
    }
    uint64_t seq = v->seq;
    int ref = v->ref, si = hspack_spill_get(h->sp);
    if (si < 0) return 0;
    char err[512];
    h->splans[si] = h->plans[ref];
    convert(h, &h->plans[ref], &h->held[ref], hspack_spill_ptr(h->sp, si), -1);
    if (ring_release(h->in, &h->held[ref])) DIE("ring '%s': %s", h->o->in_ring, ring_error());
    h->held_used[ref] = 0;
    LIB_CHECK(hspack_window_mark_spilled(&h->w, seq, si, err, sizeof err), err);
    log_debug("seq %llu spilled to host memory (%u of %u spill buffers in use)", (unsigned long long)seq, h->w.n_spilled,
              h->w.spill_max);
    return 1;
}

/* Take input item s into the window (or drop it as a duplicate). Returns 0, or 1 when the item
 * is bad (it is put back READY and the stage must stop). */
static int take(struct hs *h, struct ring_slot *s, char *why, int why_len) {
    h->c.items_in++;
    if (s->deliveries > 1) {
        h->c.redelivered++;
        log_warn("seq %llu delivered again (a previous consumer died holding it)", (unsigned long long)s->seq);
    }
    if (hspack_window_is_dup(&h->w, s->seq)) {
        hspack_window_count_dup(&h->w);
        h->c.dups++;
        log_info("seq %llu: duplicate dropped (next is %llu)", (unsigned long long)s->seq, (unsigned long long)h->w.next);
        if (ring_release(h->in, s)) DIE("ring '%s': %s", h->o->in_ring, ring_error());
        return 0;
    }
    if (!seq_shard_owns(&h->w.shard, s->seq)) {   /* a several-host run: another host's seq reached this chain */
        snprintf(why, (size_t)why_len, "ring '%s' batch seq %llu is not this host's: the plan's host takes the seqs s "
                 "with %llu <= s %% %llu < %llu (is this chain's packer reading another plan?)", h->o->in_ring,
                 (unsigned long long)s->seq, (unsigned long long)h->w.shard.lo, (unsigned long long)h->w.shard.period,
                 (unsigned long long)h->w.shard.hi);
        if (ring_unread(h->in, s)) log_warn("ring '%s': %s", h->o->in_ring, ring_error());
        return 1;
    }
    int ref = 0;
    while (h->held_used[ref]) ref++;   /* the window guarantees a free one */
    struct hspack_plan *p = &h->plans[ref];
    char err[1024];
    int bad = hspack_plan(s->desc, s->desc_len, s->payload_cap, &h->want, h->os->payload_bytes, p, err, sizeof err);
    if (!bad && p->in_batch.seq != s->seq)
        bad = err_fail(err, sizeof err, "the slot carries seq %llu but its descriptor says seq %llu",
                       (unsigned long long)s->seq, (unsigned long long)p->in_batch.seq);
    if (!bad && desc_check_plan(&p->in_batch, h->plan, NULL, err, sizeof err)) bad = -1;
    if (!bad && s->payload_len < p->in_batch.payload_bytes)
        bad = err_fail(err, sizeof err, "the producer published %llu payload bytes, the descriptor describes %llu",
                       (unsigned long long)s->payload_len, (unsigned long long)p->in_batch.payload_bytes);
    if (!bad && h->o->tokens && rings_check_budget(s->seq, p->in_batch.n_tokens, p->in_batch.budget,
                                                   (uint32_t)h->o->tokens, err, sizeof err))
        bad = -1;
    if (bad) {
        snprintf(why, (size_t)why_len, "ring '%s' batch seq %llu rejected: %s", h->o->in_ring, (unsigned long long)s->seq, err);
        if (ring_unread(h->in, s)) log_warn("ring '%s': %s", h->o->in_ring, ring_error());
        return 1;
    }
    h->held[ref] = *s;
    h->held_used[ref] = 1;
    LIB_CHECK(hspack_window_put(&h->w, s->seq, HSPACK_HELD, ref, err, sizeof err), err);
    return 0;
}

/* Give back what is held at a stop: held slots READY again; spilled items are flushed into
 * features while it has room (5 s at most), the rest is lost and said so. */
static void give_back(struct hs *h) {
    double t0 = time_mono_s();
    while (hspack_window_peek(&h->w) && h->w.n_spilled && time_mono_s() - t0 < 5) {
        struct ring_slot os;
        int rc = ring_acquire_write(h->out, 200, &os);
        if (rc == 0) emit(h, &os);
        else if (rc != RING_TIMEOUT) break;
    }
    uint32_t n = 0;
    for (int i = 0; i < h->o->window; i++)
        if (h->held_used[i]) {
            if (ring_unread(h->in, &h->held[i])) log_warn("ring '%s': %s", h->o->in_ring, ring_error());
            h->held_used[i] = 0;
            n++;
        }
    if (n) log_info("%u held items put back READY in '%s'", n, h->o->in_ring);
    if (h->w.n_spilled)
        log_warn("%u spilled items are lost (released upstream, not yet in '%s'): the trainer will miss them",
                 h->w.n_spilled, h->o->out_ring);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    log_init("dflash-hspack");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    o.in_ring = RING_NAME_HIDDEN;
    o.out_ring = RING_NAME_FEATURES;
    o.layout = 0;
    o.record_dtype = 0;
    o.dtype = 0;
    o.window = 4;
    o.wait_ms = 60000;
    o.start_seq = -1;
    o.set_next = -1;
    o.heartbeat_s = 1.0;
    o.stall_log_s = 10.0;
    o.tokens = 0;
    o.spec_slots = RINGS_DEFAULT_SLOTS;
    struct flag_choice layout = {&o.layout, layout_names}, rdt = {&o.record_dtype, rdtype_names},
                       dt = {&o.dtype, dtype_names};
    struct flag_list sel = {o.select, &o.n_select, MAX_SELECT, NULL};
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"in", FLAG_STRING, &o.in_ring, "input ring (hidden descriptors)", 1, 0},
        {"out", FLAG_STRING, &o.out_ring, "output ring (features descriptors)", 1, 0},
        {"layout", FLAG_CHOICE, &layout, "features layout: concat [T, k*H] or split k x [T, H]", 1, 0},
        {"window", FLAG_INT, &o.window, "reorder window: hidden items held at once (one place is kept for the next seq; "
                                        "1: wait for each seq in turn); at most the hidden ring's slots", 1, 128},
        {"spill", FLAG_INT, &o.spill, "pinned host buffers (one features item each) that absorb bursts when features is "
                                      "full; 0: back-pressure reaches the target. Spilled items are lost on SIGKILL", 0, 128},
        {"start-seq", FLAG_INT64, &o.start_seq, "first seq to emit (-1: from the state file of a previous run, else 0)", -1,
         INT64_MAX},
        {"set-next", FLAG_INT64, &o.set_next, "write SEQ as the next seq to emit into RUN/state/hspack.<--out>.next "
         "(atomically; where a restarted chain rewinds hspack: pipelines/lib.sh) and exit, without rings", -1, INT64_MAX},
        {"record", FLAG_STRING, &o.record, "also write every features item to DIR (recording format, README "
                                           "\"Recordings\"); disk per token = 13 B + (k_rec + 1) * H * bytes(dtype): "
                                           "k=5, H=4096, bf16 -> 49 KB/token, 49 GB per million tokens", 1, 0},
        {"record-layers", FLAG_LIST, &sel, "record only these captured layer ids (e.g. 1,17,33), to save disk", 0,
         INT_MAX},
        {"record-dtype", FLAG_CHOICE, &rdt, "dtype on disk: same (as the ring) | bf16 (halves an f32 recording) | f32", 1, 0},
        {"tokens", FLAG_INT, &o.tokens, "token budget: reject items above it (0: no check); sizes --print-ring-spec", 0, 1 << 24},
        {"n-layers", FLAG_INT, &o.n_layers, "--print-ring-spec: captured layers k", 0, DESC_MAX_LAYERS},
        {"hidden-size", FLAG_INT, &o.hidden_size, "--print-ring-spec: target hidden size H", 0, 1 << 20},
        {"dtype", FLAG_CHOICE, &dt, "--print-ring-spec: state dtype (bf16 on GPU rings, f32 on the CPU path)", 1, 0},
        {"wait-ms", FLAG_INT, &o.wait_ms, "how long to wait for the rings to appear", 0, INT_MAX},
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats", 0, 86400},
        {"stall-log-s", FLAG_DOUBLE, &o.stall_log_s, "log a line this often while waiting for a missing seq", 1, 86400},
        RINGS_SPEC_FLAGS(&o.print_spec, &o.spec_slots),
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--run DIR [--layout concat|split] [--window W] [--spill N] [--record DIR]",
                        "hidden -> features: converts each hidden item to the trainer's layout on the features "
                        "ring's device and publishes them in seq order (several target replicas may finish out of "
                        "order). Releases each hidden slot once its features item is published, so a SIGKILL and "
                        "restart loses nothing (with --spill 0). --record DIR also writes every item to disk for "
                        "dflash-replay. Exit 0 at end of stream, 3 when stopped by a signal, 1 on bad input.",
                        NULL, 0);
    char err[2048];
    if (o.set_next >= 0) {   /* the state file's one writer outside a running hspack */
        char path[PATH_MAX + 64], line[32];
        if (!o.common.run_dir) { fprintf(stderr, "dflash-hspack: --set-next needs --run DIR\n"); return 2; }
        char sdir[PATH_MAX];
        if (run_path(sdir, sizeof sdir, o.common.run_dir, "state") || state_path(path, sizeof path, o.common.run_dir, o.out_ring)) {
            fprintf(stderr, "dflash-hspack: --run path too long\n");
            return 2;
        }
        int n = state_format(line, sizeof line, (uint64_t)o.set_next);
        if (fs_mkdir_p(sdir, err, sizeof err) || fs_write_atomic(path, line, (size_t)n, err, sizeof err)) {
            fprintf(stderr, "dflash-hspack: --set-next: %s\n", err);
            return 1;
        }
        return 0;
    }
    /* The run plan (RUN/plan.json, stages/plan/plan.h) owns the budget, k, H, dtype and device. */
    struct plan plan;
    int have_plan = plan_open_run(o.common.run_dir, &plan, err, sizeof err);
    if (have_plan < 0) { fprintf(stderr, "dflash-hspack: %s\n", err); return 2; }
    if (have_plan &&
        (plan_bind_int(&plan, "tokens", flags_given(argc, argv, "tokens"), &o.tokens, plan.tokens, "tokens", err,
                       sizeof err) ||
         plan_bind_int(&plan, "n-layers", flags_given(argc, argv, "n-layers"), &o.n_layers, plan.n_ids,
                       "capture.layer_ids count", err, sizeof err) ||
         plan_bind_int(&plan, "hidden-size", flags_given(argc, argv, "hidden-size"), &o.hidden_size, plan.hidden_size,
                       "target.hidden_size", err, sizeof err) ||
         plan_bind_int(&plan, "dtype", flags_given(argc, argv, "dtype"), &o.dtype, plan.dtype == DESC_DTYPE_F32 ? 1 : 0,
                       "dtype (0 bf16, 1 f32)", err, sizeof err) ||
         plan_bind_device(&plan, flags_given(argc, argv, "device"), &o.common.device, plan.device, err, sizeof err))) {
        fprintf(stderr, "dflash-hspack: %s\n", err);
        return 2;
    }
    if (o.print_spec) {
        if (!o.tokens || !o.n_layers || !o.hidden_size) {
            fprintf(stderr, "dflash-hspack: --print-ring-spec needs --tokens, --n-layers and --hidden-size\n");
            return 2;
        }
        int dev = -1;
        if (stage_parse_device(o.common.device, &dev, err, sizeof err)) { fprintf(stderr, "dflash-hspack: %s\n", err); return 2; }
        struct rings_geometry g = {(uint32_t)o.tokens, (uint32_t)o.n_layers, (uint32_t)o.hidden_size,
                                   o.dtype == 1 ? DESC_DTYPE_F32 : DESC_DTYPE_BF16};
        char spec[256];
        LIB_CHECK(rings_format_spec(spec, sizeof spec, o.out_ring, (uint32_t)o.spec_slots, DESC_KIND_FEATURES, &g, dev, err,
                                    sizeof err), err);
        printf("%s\n", spec);
        return 0;
    }
    if ((o.n_select || o.record_dtype) && !o.record) {
        fprintf(stderr, "dflash-hspack: --record-layers and --record-dtype need --record DIR\n");
        return 2;
    }
    stage_start(&o.common, 1);

    static struct hs h;
    h.o = &o;
    h.plan = have_plan ? plan.hash : 0;
    h.want.layout = o.layout == 1 ? DESC_LAYOUT_SPLIT : DESC_LAYOUT_CONCAT;
    h.rwant.layout = h.want.layout;
    h.rwant.dtype = o.record_dtype == 1 ? DESC_DTYPE_BF16 : o.record_dtype == 2 ? DESC_DTYPE_F32 : 0;
    h.rwant.n_select = (uint32_t)o.n_select;
    for (int i = 0; i < o.n_select; i++) h.rwant.select[i] = o.select[i];

    /* ------------------------------------------------------------ rings */
#ifdef DFLASH_CUDA
    if (o.common.cuda_device >= 0) {
        CUDA_CHECK(cudaSetDevice(o.common.cuda_device));   /* IPC handles open here */
        CUDA_CHECK(cudaStreamCreateWithFlags(&h.stream, cudaStreamNonBlocking));
    }
#endif
    ring_set_log(ring_log, NULL);
    check_hint("is dflash-shm running for this --run, with the rings named by --in/--out?");
    h.in = ring_attach(o.common.run_dir, o.in_ring, RING_CONSUMER, o.wait_ms, err, sizeof err);
    if (!h.in) DIE("%s", err);
    h.out = ring_attach(o.common.run_dir, o.out_ring, RING_PRODUCER, o.wait_ms, err, sizeof err);
    if (!h.out) DIE("%s", err);
    if (have_plan && (rings_check_plan(h.in, plan.hash, err, sizeof err) || rings_check_plan(h.out, plan.hash, err, sizeof err)))
        DIE("%s", err);
    check_hint(NULL);
    h.is = ring_get_spec(h.in);
    h.os = ring_get_spec(h.out);
    if ((h.is->device >= 0 || h.os->device >= 0) && o.common.cuda_device < 0)
        DIE("ring '%s' or '%s' has GPU payloads but this stage runs with --device cpu; use --device cuda:N", o.in_ring,
            o.out_ring);
    if ((uint32_t)o.window > h.is->n_slots)
        log_warn("--window %d > the %u slots of '%s': the window can never fill (it holds at most --window - 1 items "
                 "beyond the next seq, each in a slot of '%s')", o.window, h.is->n_slots, o.in_ring, o.in_ring);
    if (h.is->device >= 0 && h.os->device >= 0 && h.is->device != h.os->device)
        log_info("'%s' on cuda:%d, '%s' on cuda:%d: layout copies go across GPUs (peer access when the GPUs allow it)",
                 o.in_ring, h.is->device, o.out_ring, h.os->device);
    h.bus = bus_open(o.common.run_dir, log_stage(), err, sizeof err);
    if (!h.bus) log_warn("metrics bus unavailable: %s (continuing without metrics)", err);

    /* ------------------------------------------------------------ memory, planned once */
    h.plans = calloc((size_t)o.window, sizeof *h.plans);
    h.held = calloc((size_t)o.window, sizeof *h.held);
    h.held_used = calloc((size_t)o.window, 1);
    h.splans = calloc((size_t)(o.spill ? o.spill : 1), sizeof *h.splans);
    h.sp = calloc(1, sizeof *h.sp);
    ALLOC_CHECK(h.plans);
    ALLOC_CHECK(h.held);
    ALLOC_CHECK(h.held_used);
    ALLOC_CHECK(h.splans);
    ALLOC_CHECK(h.sp);
    LIB_CHECK(hspack_spill_init(h.sp, (uint32_t)o.spill, h.os->payload_bytes, o.common.cuda_device >= 0, err, sizeof err), err);
    if (o.record) {
        LIB_CHECK(fs_mkdir_p(o.record, err, sizeof err), err);
        h.rec_buf = aligned_alloc(DESC_ALIGN, (h.os->payload_bytes + DESC_ALIGN) / DESC_ALIGN * DESC_ALIGN);
        ALLOC_CHECK(h.rec_buf);
        if (h.os->device >= 0) {
#ifdef DFLASH_CUDA
            CUDA_CHECK(cudaMallocHost((void **)&h.stage_buf, h.os->payload_bytes ? h.os->payload_bytes : 1));
#endif
        }
    }

    /* ------------------------------------------------------------ where to start */
    char sdir[PATH_MAX], spath[PATH_MAX + 64];
    if (run_path(sdir, sizeof sdir, o.common.run_dir, "state") || state_path(spath, sizeof spath, o.common.run_dir, o.out_ring))
        DIE("--run path too long");
    LIB_CHECK(fs_mkdir_p(sdir, err, sizeof err), err);
    uint64_t next = 0;
    h.state_fd = fs_open_state(spath);   /* private, O_NOFOLLOW */
    SYS_CHECK(h.state_fd);
    char sbuf[64] = {0};
    ssize_t sn = pread(h.state_fd, sbuf, sizeof sbuf - 1, 0);
    SYS_CHECK(sn);
    if (o.start_seq >= 0) next = (uint64_t)o.start_seq;
    else if (sn > 0) {
        LIB_CHECK(state_parse(spath, sbuf, &next, err, sizeof err), err);
        log_info("resuming at seq %llu (state file %s); redelivered seqs below it are dropped", (unsigned long long)next,
                 spath);
    }
    LIB_CHECK(hspack_window_init(&h.w, (uint32_t)o.window, (uint32_t)o.spill, next, err, sizeof err), err);
    if (have_plan) {   /* a host of a several-host run: only its shard's seqs come (plan.h) */
        struct seq_shard sh;
        plan_shard(&plan, &sh);
        if (plan.hosts > 1 && plan.host < 0)
            DIE("%s/plan.json is a %d-host run's plan: each host's hspack runs in its host directory "
                "(RUN/hosts/H, dflash-plan --from RUN --host H)", o.common.run_dir, plan.hosts);
        if (!seq_shard_is_all(&sh)) {
            LIB_CHECK(hspack_window_set_shard(&h.w, &sh, err, sizeof err), err);
            log_info("host %d of %d: expects the seqs s with %llu <= s %% %llu < %llu (its trainer ranks'), from seq %llu",
                     plan.host, plan.hosts, (unsigned long long)sh.lo, (unsigned long long)sh.period,
                     (unsigned long long)sh.hi, (unsigned long long)h.w.next);
        }
    }
    state_write(&h);
    log_info("%s -> %s: %s layout, window %d, spill %d (%s), from seq %llu%s%s", o.in_ring, o.out_ring,
             desc_layout_name(h.want.layout), o.window, o.spill, !o.spill ? "off" : o.common.cuda_device >= 0 ? "pinned host" : "host",
             (unsigned long long)next, o.record ? ", recording to " : "", o.record ? o.record : "");

    /* ------------------------------------------------------------ loop */
    char why[2048] = "", waiting_out[96], waiting_in[96], waiting_seq[96];
    snprintf(waiting_out, sizeof waiting_out, "ring %s: full", o.out_ring);
    snprintf(waiting_in, sizeof waiting_in, "ring %s: empty", o.in_ring);
    int ended = 0, failed = 0, in_ended = 0, poll_ms = 200;
    double last_hb = time_mono_s() - o.heartbeat_s, last_stall = time_mono_s(), last_deadlock = 0;
    h.c.hb_t = time_mono_s();
    while (!stage_stopping()) {
        if (time_mono_s() - last_hb >= o.heartbeat_s) { send_stats(&h, 0); last_hb = time_mono_s(); }
        const struct hspack_entry *e = hspack_window_peek(&h.w);
        int can_absorb = !in_ended && o.spill && hspack_window_has_room(&h.w, HSPACK_SPILLED, 0);
        int can_spill = can_absorb && h.w.n_held > 0;
        if (e) {
            struct ring_slot os;
            double t0 = time_mono_s();
            if (h.bus) bus_set_waiting(h.bus, waiting_out);
            int rc = ring_acquire_write(h.out, can_absorb ? 0 : poll_ms, &os);
            h.c.wait_s += time_mono_s() - t0;
            if (h.bus) bus_set_waiting(h.bus, NULL);
            if (rc == 0) {
                double b0 = time_mono_s();
                emit(&h, &os);
                h.c.busy_s += time_mono_s() - b0;
                continue;
            }
            if (rc != RING_TIMEOUT) { snprintf(why, sizeof why, "ring '%s': %s", o.out_ring, rc < 0 ? ring_error() : "closed"); failed = 1; break; }
            if (!can_absorb) continue;   /* back-pressure: hold what we have until features has room */
            if (can_spill) {
                double b0 = time_mono_s();
                spill_one(&h);   /* features full: absorb the burst in host memory */
                h.c.busy_s += time_mono_s() - b0;
            }
        }
        if (in_ended) {   /* nothing more will come: emit what the window holds, in order */
            if (hspack_window_depth(&h.w) == 0) { ended = 1; break; }
            if (!e) {
                uint64_t lo, hi;
                hspack_window_range(&h.w, &lo, &hi);
                snprintf(why, sizeof why, "end of stream on '%s' but seq %llu never arrived (window holds seqs %llu..%llu)",
                         o.in_ring, (unsigned long long)h.w.next, (unsigned long long)lo, (unsigned long long)hi);
                failed = 1;
                break;
            }
            continue;
        }
        /* take input */
        struct ring_slot s;
        int room = hspack_window_has_room(&h.w, HSPACK_HELD, UINT64_MAX);
        if (!room && e) continue;   /* next is here, waiting for room in features */
        double t0 = time_mono_s();
        if (h.bus) bus_set_waiting(h.bus, room ? waiting_in : waiting_seq);
        int rc;
        if (room) rc = ring_acquire_read(h.in, e ? 20 : poll_ms, &s);   /* e: features full, absorbing a burst */
        else {
            snprintf(waiting_seq, sizeof waiting_seq, "ring %s: seq %llu", o.in_ring, (unsigned long long)h.w.next);
            rc = ring_acquire_read_seq(h.in, h.w.next, poll_ms, &s);
        }
        h.c.wait_s += time_mono_s() - t0;
        if (h.bus) bus_set_waiting(h.bus, NULL);
        if (rc == 0) {
            double b0 = time_mono_s();
            if (take(&h, &s, why, sizeof why)) { failed = 1; break; }
            h.c.busy_s += time_mono_s() - b0;
            last_stall = time_mono_s();
            continue;
        }
        if (rc == RING_TIMEOUT) {
            if (!room && time_mono_s() - last_stall >= o.stall_log_s) {
                uint64_t lo, hi;
                hspack_window_range(&h.w, &lo, &hi);
                log_info("reorder window full (%u held, seqs %llu..%llu), waiting for seq %llu", hspack_window_depth(&h.w),
                         (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)h.w.next);
                last_stall = time_mono_s();
            }
            if (!room && !e) {
                /* the window holds seqs above next; if hidden has no free slot the replica that
                 * computes next cannot publish it: spill one to free a slot, or say why we stall */
                struct ring_status st;
                ring_get_status(h.in, &st);
                if (st.n_free == 0 && can_spill) spill_one(&h);
                else if (st.n_free == 0 && time_mono_s() - last_deadlock >= o.stall_log_s) {
                    log_warn("ring '%s' has no free slot and seq %llu is missing: the replica computing it cannot "
                             "publish it; give '%s' more slots than the replicas run ahead of each other, or run with "
                             "--spill N", o.in_ring, (unsigned long long)h.w.next, o.in_ring);
                    last_deadlock = time_mono_s();
                }
            }
            continue;
        }
        if (rc == RING_END) {
            if (!ring_is_drained(h.in)) { snprintf(why, sizeof why, "ring '%s' was closed before the end of the stream", o.in_ring); failed = 1; break; }
            in_ended = 1;   /* emit what the window still holds (the branch above) */
            continue;
        }
        snprintf(why, sizeof why, "ring '%s': %s", o.in_ring, ring_error());
        failed = 1;
        break;
    }

    /* ------------------------------------------------------------ end */
    int code = 0;
    if (ended) {
        if (ring_mark_drained(h.out)) DIE("ring '%s': %s", o.out_ring, ring_error());
        if (o.record) {
            int64_t n = record_index_write(o.record, err, sizeof err);
            if (n < 0) { log_error("--record: %s", err); code = 1; }
            else log_info("--record: %s complete with %lld items", o.record, (long long)n);
        }
        log_info("end of stream: %llu items out (%llu duplicates dropped, max reorder depth %u, %llu spilled), copies %.3f s",
                 (unsigned long long)h.c.items_out, (unsigned long long)h.c.dups, h.w.max_depth,
                 (unsigned long long)h.w.n_spills, h.c.copy_s);
    } else {
        give_back(&h);
        if (failed) { log_error("%s", why); code = 1; }
        else { log_info("stopped by signal %d before end of stream at seq %llu", stage_stop_signal(), (unsigned long long)h.w.next); code = STAGE_EXIT_STOPPED; }
    }
    send_stats(&h, 1);
    if (h.bus) bus_close(h.bus);
    ring_close(h.in);
    ring_close(h.out);
    close(h.state_fd);
    hspack_spill_free(h.sp);
#ifdef DFLASH_CUDA
    if (h.stage_buf) cudaFreeHost(h.stage_buf);
    if (h.stream) cudaStreamDestroy(h.stream);
#endif
    free(h.rec_buf);
    free(h.plans);
    free(h.held);
    free(h.held_used);
    free(h.splans);
    free(h.sp);
    return code;
}
