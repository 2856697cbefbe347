/*
 * stages/dflash-replay.c — a recording back into a ring (issue 15 item 3): reads a directory
 * written by dflash-hspack --record, dflash-record --out or dflash-tap --record (the format of
 * stages/core/record.h) and publishes its items into --out (features by default), in order or
 * shuffled by batch with a seed, for --epochs epochs, so a drafter trains many epochs without the
 * target. A source on the relay loop (stages/core/relay.h).
 *
 * Every item is fully validated before it is published (stages/core/record.h record_read_into:
 * truncation, checksum, the recording's model, tensor shapes, batch arrays; and the index's
 * checksum and size); a damaged or foreign item stops the replay with a one-line error naming
 * the batch and the file, or with --on-bad skip is skipped and counted (never silently). Output
 * seqs are contiguous over published items (stages/record/replay.h), so a skipped item leaves no
 * gap downstream.
 *
 * Restart: the position (next position, next output seq) is in <run>/state/replay.<out>.pos,
 * written right after each publish (relay's `published` callback); a SIGKILL and the same
 * command again continue at that position (a kill between a publish and the state write repeats
 * one seq, which the downstream seen set drops). --start-pos 0 starts afresh.
 */
#include "core/check.h"
#include "core/desc.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/record.h"
#include "core/relay.h"
#include "core/rings.h"
#include "core/stage.h"
#include "hspack/hspack.h"
#include "plan/plan.h"
#include "record/replay.h"
#include "shm/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif

static const char *const layout_names[] = {"as-recorded", "concat", "split", NULL};
static const char *const onbad_names[] = {"fail", "skip", NULL};

struct opts {
    struct stage_common common;
    const char *dir, *out_ring;
    int epochs, shuffle, layout, on_bad, wait_ms, print_spec, spec_slots, hidden_size;
    int layers[DESC_MAX_LAYERS], n_layers;
    int64_t seed, start_pos;
    double heartbeat_s;
};

struct rp {
    const struct opts *o;
    struct record_index ix;
    uint64_t n, total, pos, next_seq, *perm;
    int64_t perm_epoch;
    uint64_t skipped, bytes;
    int state_fd;
    uint8_t *stage, *stage2;   /* host staging (pinned on GPU rings), and the converted form */
    uint64_t stage_cap;
    struct hspack_want want;
    int convert;
    void *stream;
    uint64_t plan;             /* the run plan's hash (RUN/plan.json; 0: none), stamped into every item */
};

static void state_write(struct rp *r) {
    char line[64];
    int n = snprintf(line, sizeof line, "%020llu %020llu\n", (unsigned long long)r->pos, (unsigned long long)r->next_seq);
    if (pwrite(r->state_fd, line, (size_t)n, 0) != n) DIE("pwrite(state file): %s", strerror(errno));
}

/* Before each cycle: anything left? */
static int rp_at_end(void *ctx, char *err, int err_len) {
    (void)err; (void)err_len;
    struct rp *r = ctx;
    return r->pos >= r->total;
}

/* After an item is published: the resume cursor moves past it (never before the publish). */
static int rp_published(void *ctx, const struct relay_item *it, char *err, int err_len) {
    (void)it; (void)err; (void)err_len;
    state_write(ctx);
    return 0;
}

static int rp_compute(void *ctx, struct relay_item *it, char *err, int err_len) {
    struct rp *r = ctx;
    struct ring_slot *os = it->out;
    uint32_t epoch = (uint32_t)(r->pos / r->n);
    if ((int64_t)epoch != r->perm_epoch) {
        replay_permutation(r->n, (uint64_t)r->o->seed, epoch, r->o->shuffle, r->perm);
        r->perm_epoch = epoch;
    }
    const struct record_index_entry *e = &r->ix.items[r->perm[r->pos % r->n]];
    char path[PATH_MAX], why[PATH_MAX + 1536];
    if (record_path(path, sizeof path, r->o->dir, e->seq)) return err_fail(err, err_len, "--dir path too long");
    /* Host ring and no conversion: straight into the slot (abandoned unpublished if bad). */
    int direct = !os->on_device && !r->convert;
    uint8_t desc[DESC_MAX_BYTES];
    void *dst = direct ? os->payload : r->stage;
    uint64_t cap = direct ? os->payload_cap : r->stage_cap;
    struct record_header h;
    int bad = record_read_into(path, desc, sizeof desc, dst, cap, r->ix.model, &h, why, sizeof why);
    if (!bad && (h.data_fnv != e->data_fnv || h.payload_len != e->payload_bytes || h.seq != e->seq)) {
        snprintf(why, sizeof why, "%s (batch seq %llu): disagrees with index.txt (checksum %016llx vs %016llx, %llu vs %llu "
                 "bytes): the file was replaced after the recording finished", path, (unsigned long long)e->seq,
                 (unsigned long long)h.data_fnv, (unsigned long long)e->data_fnv, (unsigned long long)h.payload_len,
                 (unsigned long long)e->payload_bytes);
        bad = -1;
    }
    if (bad) {
        if (r->o->on_bad == 0)
            return err_fail(err, err_len, "damaged recording, batch seq %llu: %s", (unsigned long long)e->seq, why);
        r->skipped++;
        log_warn("damaged item skipped (%llu so far), batch seq %llu: %s", (unsigned long long)r->skipped,
                 (unsigned long long)e->seq, why);
        r->pos++;
        state_write(r);   /* nothing is published for it: the cursor moves on now */
        return RELAY_DROP;
    }
    size_t dlen = h.desc_len;
    const void *src = dst;
    uint64_t plen = h.payload_len;
    if (r->convert) {
        struct hspack_plan p;
        if (hspack_plan(desc, dlen, 0, &r->want, r->stage_cap, &p, why, sizeof why) ||
            hspack_convert_host(&p, r->stage, r->stage2, why, sizeof why))
            return err_fail(err, err_len, "%s: %s", path, why);
        memcpy(desc, p.out_desc, p.out_desc_len);
        dlen = p.out_desc_len;
        src = r->stage2;
        plen = p.out.batch.payload_bytes;
    }
    if (replay_reseq(desc, &dlen, sizeof desc, r->next_seq, epoch, r->plan, why, sizeof why))
        return err_fail(err, err_len, "%s: %s", path, why);
    if (dlen > os->desc_cap)
        return err_fail(err, err_len, "%s: descriptor of %zu bytes, ring '%s' slots hold %u", path, dlen, r->o->out_ring,
                        os->desc_cap);
    if (plen > os->payload_cap)
        return err_fail(err, err_len, "%s (batch seq %llu): %llu payload bytes, ring '%s' slots hold %llu", path,
                        (unsigned long long)e->seq, (unsigned long long)plen, r->o->out_ring,
                        (unsigned long long)os->payload_cap);
    memcpy(os->desc, desc, dlen);
    if (!direct) {
        if (relay_slot_put(os, 0, src, -1, plen, r->stream, err, err_len)) return -1;
#ifdef DFLASH_CUDA
        if (os->on_device) {
            cudaError_t ce = cudaStreamSynchronize((cudaStream_t)r->stream);
            if (ce != cudaSuccess) return err_fail(err, err_len, "cudaStreamSynchronize: %s", cudaGetErrorString(ce));
        }
#endif
    }
    it->seq = r->next_seq;
    it->desc_len = (uint32_t)dlen;
    it->payload_len = plen;
    it->n_tokens = h.n_tokens;
    r->bytes += plen;
    r->pos++;
    r->next_seq++;
    return RELAY_DONE;
}

static int rp_kv(void *ctx, struct bus_kv *kv, int max) {
    struct rp *r = ctx;
    if (max < 4) return 0;
    kv[0] = (struct bus_kv){"bytes", (double)r->bytes};
    kv[1] = (struct bus_kv){"skipped", (double)r->skipped};
    kv[2] = (struct bus_kv){"position", (double)r->pos};
    kv[3] = (struct bus_kv){"epoch", r->n ? (double)(r->pos / r->n) : 0};
    return 4;
}

/* k, H and layers of a model string ("... k=5 H=4096 ... layers=1,9"); 0 when absent. */
static void parse_model(const char *m, int *k, int *H, char *layers, size_t layers_len) {
    const char *p;
    *k = *H = 0;
    layers[0] = 0;
    if ((p = strstr(m, " k="))) *k = atoi(p + 3);
    if ((p = strstr(m, " H="))) *H = atoi(p + 3);
    if ((p = strstr(m, " layers="))) snprintf(layers, layers_len, "%.*s", (int)strcspn(p + 8, " "), p + 8);
}

int main(int argc, char **argv) {
    log_init("dflash-replay");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    o.out_ring = RING_NAME_FEATURES;
    o.epochs = 1;
    o.wait_ms = 60000;
    o.heartbeat_s = 1.0;
    o.start_pos = -1;
    o.spec_slots = RINGS_DEFAULT_SLOTS;
    struct flag_choice layout = {&o.layout, layout_names}, onbad = {&o.on_bad, onbad_names};
    struct flag_list layers = {o.layers, &o.n_layers, DESC_MAX_LAYERS, NULL};
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"dir", FLAG_STRING, &o.dir, "the recording (a directory with index.txt)", 1, 0},
        {"out", FLAG_STRING, &o.out_ring, "ring to publish into", 1, 0},
        {"epochs", FLAG_INT, &o.epochs, "passes over the recording", 1, 1 << 20},
        {"shuffle", FLAG_BOOL, &o.shuffle, "shuffle the batches of each epoch (seeded by --seed and the epoch)", 1, 0},
        {"seed", FLAG_INT64, &o.seed, "shuffle seed", 0, INT64_MAX},
        {"layout", FLAG_CHOICE, &layout, "features layout to publish (converting on the host if it differs)", 1, 0},
        {"on-bad", FLAG_CHOICE, &onbad, "a damaged item: fail (stop, exit 1) | skip (count it, publish the next)", 1, 0},
        {"layers", FLAG_LIST, &layers, "the captured layer ids the trainer expects (refuse another recording)", 0, INT_MAX},
        {"hidden-size", FLAG_INT, &o.hidden_size, "the hidden size the trainer expects (0: any)", 0, 1 << 20},
        {"start-pos", FLAG_INT64, &o.start_pos, "position to start at (-1: from the state file of a previous run, else 0)",
         -1, INT64_MAX},
        {"wait-ms", FLAG_INT, &o.wait_ms, "how long to wait for the ring to appear", 0, INT_MAX},
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats (0: 1 s)", 0, 86400},
        RINGS_SPEC_FLAGS(&o.print_spec, &o.spec_slots),
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--run DIR --dir RECORDING [--epochs N] [--shuffle --seed S]",
                        "Replays a recording (dflash-hspack --record, dflash-record --out, dflash-tap --record) into "
                        "a ring, in order or shuffled by batch, for many epochs: offline drafter training without "
                        "the target. Every item is validated before it is published. Disk a recording takes: "
                        "about 13 B + (k + 1) * H * bytes(dtype) per token, e.g. k=5 layers of H=4096 in bf16: 49 KB "
                        "per token, 49 GB per million tokens; record bf16 and a subset of layers to cut it. "
                        "Exit 0 when every epoch is out, 3 when stopped by a signal, 1 on a damaged item.",
                        NULL, 0);
    if (!o.dir) { fprintf(stderr, "dflash-replay: --dir RECORDING is required\n"); return 2; }
    char err[2048];
    static struct rp r;
    r.o = &o;
    r.perm_epoch = -1;
    if (record_index_read(o.dir, &r.ix, err, sizeof err)) { fprintf(stderr, "dflash-replay: %s\n", err); return 1; }
    if (!r.ix.n_items) { fprintf(stderr, "dflash-replay: %s: the recording holds no items\n", o.dir); return 1; }
    int k, H;
    char rlayers[512];
    parse_model(r.ix.model, &k, &H, rlayers, sizeof rlayers);
    char want_layers[512] = "";
    for (int i = 0, n = 0; i < o.n_layers && n < (int)sizeof want_layers; i++)
        n += snprintf(want_layers + n, sizeof want_layers - (size_t)n, "%s%d", i ? "," : "", o.layers[i]);
    if ((o.n_layers && strcmp(want_layers, rlayers)) || (o.hidden_size && o.hidden_size != H)) {
        fprintf(stderr, "dflash-replay: %s belongs to another model: expected layers=%s H=%d, the recording has '%s'\n", o.dir,
                o.n_layers ? want_layers : "(any)", o.hidden_size, r.ix.model);
        return 1;
    }
    if (o.print_spec) {
        int dev = -1;
        if (stage_parse_device(o.common.device, &dev, err, sizeof err)) { fprintf(stderr, "dflash-replay: %s\n", err); return 2; }
        char devs[32];
        if (dev >= 0) snprintf(devs, sizeof devs, "cuda:%d", dev);
        else snprintf(devs, sizeof devs, "host");
        printf("%s:slots=%d,bytes=%" PRIu64 ",desc=%u,dev=%s\n", o.out_ring, o.spec_slots, r.ix.max_payload_bytes,
               DESC_MAX_BYTES, devs);
        return 0;
    }
    /* Replayed items belong to this run: they carry its plan's hash (when it has one), not the recording run's. */
    struct plan plan;
    int have_plan = plan_open_run(o.common.run_dir, &plan, err, sizeof err);
    if (have_plan < 0) { fprintf(stderr, "dflash-replay: %s\n", err); return 2; }
    r.plan = have_plan ? plan.hash : 0;
    stage_start(&o.common, 1);
    r.n = r.ix.n_items;
    r.total = r.n * (uint64_t)o.epochs;
    r.perm = malloc(r.n * sizeof *r.perm);
    ALLOC_CHECK(r.perm);
    if (o.layout) {
        if (strncmp(r.ix.model, "kind=hidden", 11) && strncmp(r.ix.model, "kind=features", 13))
            DIE("--layout %s: %s holds '%s' items, not hidden or features", layout_names[o.layout], o.dir, r.ix.model);
        r.want.layout = o.layout == 1 ? DESC_LAYOUT_CONCAT : DESC_LAYOUT_SPLIT;
        r.convert = 1;
    }

    /* ------------------------------------------------------------ where to start */
    char sdir[PATH_MAX], spath[PATH_MAX + 64];
    if (run_path(sdir, sizeof sdir, o.common.run_dir, "state")) DIE("--run path too long");
    LIB_CHECK(fs_mkdir_p(sdir, err, sizeof err), err);
    snprintf(spath, sizeof spath, "%s/replay.%s.pos", sdir, o.out_ring);
    r.state_fd = fs_open_state(spath);   /* private, O_NOFOLLOW */
    SYS_CHECK(r.state_fd);
    char sbuf[128] = {0};
    ssize_t sn = pread(r.state_fd, sbuf, sizeof sbuf - 1, 0);
    SYS_CHECK(sn);
    r.next_seq = r.ix.items[0].seq;
    if (o.start_pos >= 0) {
        r.pos = (uint64_t)o.start_pos;
        r.next_seq += r.pos;
    } else if (sn > 0) {
        unsigned long long p, q;
        int used = 0;
        if (sscanf(sbuf, "%llu %llu\n%n", &p, &q, &used) != 2 || used != (int)sn)
            DIE("%s: expected '<position> <next seq>', found '%.40s'", spath, sbuf);
        r.pos = p;
        r.next_seq = q;
        log_info("resuming at position %llu (epoch %llu), next seq %llu (state file %s)", p, p / r.n, q, spath);
    }

    /* ------------------------------------------------------------ relay */
    struct relay_config rc = {
        .run_dir = o.common.run_dir, .out_ring = o.out_ring,
        .attach_wait_ms = o.wait_ms, .heartbeat_s = o.heartbeat_s, .use_bus = 1, .item_name = "batch",
        .ctx = &r, .compute = rp_compute, .at_end = rp_at_end, .heartbeat_kv = rp_kv, .published = rp_published,
        .plan = r.plan,
    };
#ifdef DFLASH_CUDA
    if (o.common.cuda_device >= 0) CUDA_CHECK(cudaSetDevice(o.common.cuda_device));   /* IPC handles open here */
#endif
    check_hint("is dflash-shm running for this --run, with the ring named by --out?");
    struct relay *rl = relay_open(&rc, err, sizeof err);
    if (!rl) DIE("%s", err);
    check_hint(NULL);
    if (ring_expect(relay_out(rl), r.ix.max_payload_bytes, DESC_MAX_BYTES, -2, err, sizeof err))
        DIE("ring '%s' is too small for the items of %s: %s", o.out_ring, o.dir, err);
    const struct ring_spec *os = ring_get_spec(relay_out(rl));
    if (os->device >= 0 && o.common.cuda_device < 0)
        DIE("ring '%s' has GPU payloads (cuda:%d) but this stage runs with --device cpu", o.out_ring, os->device);
    r.stage_cap = r.ix.max_payload_bytes + 16 * DESC_ALIGN;
    if (os->device >= 0 || r.convert) {
#ifdef DFLASH_CUDA
        if (os->device >= 0) {
            CUDA_CHECK(cudaMallocHost((void **)&r.stage, r.stage_cap));
            CUDA_CHECK(cudaMallocHost((void **)&r.stage2, r.stage_cap));
            cudaStream_t s;
            CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            r.stream = s;
        }
#endif
        if (!r.stage) {
            r.stage = aligned_alloc(DESC_ALIGN, (r.stage_cap + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
            r.stage2 = aligned_alloc(DESC_ALIGN, (r.stage_cap + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
            ALLOC_CHECK(r.stage);
            ALLOC_CHECK(r.stage2);
        }
    }
    log_info("replaying %s (%llu items, '%s') into '%s': %d epoch(s), %s%s, from position %llu", o.dir,
             (unsigned long long)r.n, r.ix.model, o.out_ring, o.epochs, o.shuffle ? "shuffled by batch" : "in order",
             o.layout ? " (layout converted)" : "", (unsigned long long)r.pos);
    int res = relay_run(rl, err, sizeof err);
    if (res < 0) log_error("%s", err);
    if (res == RELAY_DONE)
        log_info("replay complete: %llu positions, %llu items skipped as damaged", (unsigned long long)r.pos,
                 (unsigned long long)r.skipped);
    relay_close(rl);
    close(r.state_fd);
#ifdef DFLASH_CUDA
    if (r.stream) {
        cudaFreeHost(r.stage);
        cudaFreeHost(r.stage2);
        cudaStreamDestroy((cudaStream_t)r.stream);
        r.stage = r.stage2 = NULL;
    }
#endif
    free(r.stage);
    free(r.stage2);
    record_index_free(&r.ix);
    free(r.perm);
    return relay_exit_code(res);
}
