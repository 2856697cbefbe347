/*
 * stages/dflash-pack.c — the dataset packing stage (design.md §2, §6, §8; issue 4).
 *
 * Reads a dataset (JSONL or the indexed format, stages/core/dataset.h), packs it with the policy
 * of stages/pack/packer.h, and publishes one `batch` descriptor + host payload per sequence
 * number to the `batches` ring (shm/ring.h), or with --out-dir writes each batch as a file. The
 * stream is a pure function of (dataset, --tokens, --window, --seed, --shard); --epochs and
 * --max-batches only say where it ends.
 *
 * Resume: after each published batch the cursor (epoch, position, next seq, fingerprint) is
 * written atomically to <run>/state/pack.cursor (fsync'ed at most once a second, see save_cursor). Started again with the same command, the stage
 * continues with the next batch; --resume-from-seq S starts at batch S instead (the trainer's
 * resume). A SIGKILL between ring_publish and the cursor write makes the restart publish that
 * batch again with the same seq and identical bytes (at-least-once); consumers drop sequence
 * numbers they already have (dflash-hspack reorders by seq, the trainer skips applied seqs).
 * Publishing first is deliberate: writing the cursor first could lose a batch instead.
 *
 * --out-dir DIR file format (one file per batch, DIR/batch-<seq, 12 digits>.bin, written
 * atomically by rename without fsync; DIR/DONE, holding the batch count, is written after a syncfs
 * at the end of the stream), little-endian:
 *   char magic[8] = "DFBATCH\n"; uint32 version = 1; uint32 desc_len; uint64 payload_len;
 *   uint64 payload_off (= 2304, a multiple of DESC_ALIGN); the msgpack batch descriptor at byte 32;
 *   zeros up to payload_off; payload_len payload bytes at payload_off (the file ends there).
 *
 * Validation (--val-frac F --val-every N, stages/pack/packer.h): the last round(F x rows) rows are held
 * out and packed into val batches (descriptor split = val); after every N-th train batch comes one
 * full pass over them, in the one seq stream, so seeking and the trainer's resume stay arithmetic.
 *
 * Several hosts (issue 29, topology (c)): in host H's run directory (its plan has `host`, stages/plan/plan.h) the
 * packer packs every batch of the run's one stream, as one host would, and publishes only the seqs of its host's
 * trainer ranks (the plan's seq shard); the others are packed and dropped, so the seqs, the batches and the cursor
 * arithmetic are the one-host run's.
 *
 * --index OUT converts --data (JSONL) to the indexed format once and exits.
 */
#include "core/bus.h"
#include "core/check.h"
#include "core/dataset.h"
#include "core/desc.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "pack/packer.h"
#include "core/relay.h"
#include "core/shard.h"
#include "core/rings.h"
#include "core/stage.h"
#include "plan/plan.h"
#include "shm/ring.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PACK_FILE_MAGIC "DFBATCH\n"
#define PACK_FILE_VERSION 1u

struct pack_file_header {
    char magic[8];
    uint32_t version;
    uint32_t desc_len;
    uint64_t payload_len;
    uint64_t payload_off;      /* PACK_FILE_PAYLOAD_OFF: DESC_ALIGN-aligned, so a reader can mmap the file */
};
/* header, descriptor room, zero padding; then the payload */
#define PACK_FILE_PAYLOAD_OFF ((sizeof(struct pack_file_header) + DESC_MAX_BYTES + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN)

/* A bad-input error: one line naming the file and line, then exit 1. */
static void die_input(const char *what) __attribute__((noreturn));
static void die_input(const char *what) {
    log_error("%s", what);
    exit(1);
}

static void on_bad_sample(void *ctx, const char *msg) {
    (void)ctx;
    log_warn("skipped bad sample: %s", msg);
}

static int parse_shard(const char *s, uint32_t *i, uint32_t *n) {
    unsigned a, b;
    char tail;
    if (sscanf(s, "%u/%u%c", &a, &b, &tail) != 2 || b < 1 || a >= b) return -1;
    *i = a;
    *n = b;
    return 0;
}

/* Replace path with data atomically for readers and safe against SIGKILL (temporary name, then
 * rename: the page cache outlives the process), without fsync. */
static void write_fast(const char *path, const void *data, size_t len) {
    char tmp[PATH_MAX + 32];
    if (snprintf(tmp, sizeof tmp, "%s.fast.%d", path, (int)getpid()) >= (int)sizeof tmp) DIE("path too long: %s", path);
    int fd = fs_create_tmp(tmp);   /* private, O_EXCL | O_NOFOLLOW */
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (!f) DIE("cannot create %s: %s", tmp, strerror(errno));
    if (fwrite(data, 1, len, f) != len) DIE("write(%s): %s", tmp, strerror(errno));
    if (fclose(f)) DIE("close(%s): %s", tmp, strerror(errno));
    SYS_CHECK(rename(tmp, path));
}

/* Save the cursor after a published batch: atomic and SIGKILL-safe every time (write_fast), made
 * durable against power loss (fs_write_atomic: fsync of file and directory) at most once a second
 * and at exit, so two fsyncs per batch never cap the packing rate. A cursor older by up to a
 * second after a machine crash only re-publishes batches, which consumers drop by seq. */
static int64_t g_origin = -1;   /* the --resume-from-seq this stream started from (-1: none) */

static void save_cursor(const char *path, const struct packer *p, int durable) {
    static double last_durable;
    struct packer_cursor c;
    char text[256], err[512];
    packer_get_cursor(p, &c);
    c.origin = g_origin;
    int n = packer_cursor_format(&c, text, sizeof text);
    if (n < 0) DIE("cursor text does not fit %zu bytes", sizeof text);
    double now = time_mono_s();
    if (durable || now - last_durable >= 1.0) {
        LIB_CHECK(fs_write_atomic(path, text, (size_t)n, err, sizeof err), err);
        last_durable = now;
    } else {
        write_fast(path, text, (size_t)n);
    }
}

/* The source's state for the relay callbacks (and the --out-dir loop). */
struct pstage {
    struct packer *p;
    const char *cursor_path;
    uint64_t skipped_bad;
    double t_last;               /* heartbeat rate window */
    uint64_t last_batches;
    struct seq_shard shard;      /* the seqs published (a host of a several-host run: its shard; else every seq) */
    uint64_t foreign;            /* batches packed and not published (other hosts' seqs) */
    uint64_t plan;               /* the run plan's hash, stamped into every batch (0: no plan) */
};

static int pack_at_end(void *ctx, char *err, int err_len) { return packer_at_end(((struct pstage *)ctx)->p, err, err_len); }

/* Pack the next batch into a slot (a ring slot, or the --out-dir file buffer posing as one). */
static int pack_compute(void *ctx, struct relay_item *it, char *err, int err_len) {
    struct pstage *ps = ctx;
    struct desc_batch d;
    int got;
    for (;;) {   /* another host's seq is packed (the stream stays the one-host stream) and not published */
        got = packer_next(ps->p, it->out->payload, it->out->payload_cap, &d, err, err_len);
        if (got <= 0 || seq_shard_owns(&ps->shard, d.seq)) break;
        ps->foreign++;
    }
    if (got < 0) return -1;
    if (!got) return RELAY_END;
    d.plan = ps->plan;
    size_t dlen;
    if (desc_batch_encode(&d, it->out->desc, it->out->desc_cap, &dlen, err, err_len)) return -1;
    it->seq = d.seq;
    it->desc_len = (uint32_t)dlen;
    it->payload_len = d.payload_bytes;
    it->n_tokens = d.n_tokens;
    return RELAY_DONE;
}

static int pack_published(void *ctx, const struct relay_item *it, char *err, int err_len) {
    (void)it; (void)err; (void)err_len;
    struct pstage *ps = ctx;
    save_cursor(ps->cursor_path, ps->p, 0);
    return 0;
}

static int pack_kv(void *ctx, struct bus_kv *kv, int max) {
    struct pstage *ps = ctx;
    const struct packer_stats *s = &ps->p->stats;
    if (max < 7) return 0;
    double now = time_mono_s(), dt = now - ps->t_last;
    int k = 0;
    kv[k++] = (struct bus_kv){"batches_per_s", dt > 0 ? (double)(s->batches - ps->last_batches) / dt : 0};
    kv[k++] = (struct bus_kv){"padding_frac", s->tokens ? (double)s->padding / (double)(s->tokens + s->padding) : 0};
    kv[k++] = (struct bus_kv){"dropped_samples", (double)s->dropped};
    kv[k++] = (struct bus_kv){"truncated_samples", (double)s->truncated};
    kv[k++] = (struct bus_kv){"skipped_bad", (double)ps->skipped_bad};
    kv[k++] = (struct bus_kv){"epoch", (double)ps->p->cur.epoch};
    kv[k++] = (struct bus_kv){"next_seq", (double)ps->p->cur.next_seq};
    ps->t_last = now;
    ps->last_batches = s->batches;
    return k;
}

/* --out-dir: the same cycle with a file for a slot. Returns RELAY_DONE, RELAY_STOPPED or -1. */
static int write_files(struct pstage *ps, const char *out_dir, void *file_buf, uint64_t payload_cap, char *err,
                       int err_len) {
    struct pack_file_header *h = file_buf;
    /* the payload starts DESC_ALIGN-aligned inside the buffer, behind header + descriptor room */
    struct ring_slot slot = {.desc = (char *)file_buf + sizeof *h, .desc_cap = DESC_MAX_BYTES,
                             .payload = (char *)file_buf + PACK_FILE_PAYLOAD_OFF, .payload_cap = payload_cap, .device = -1};
    for (;;) {
        if (stage_stopping()) return RELAY_STOPPED;
        struct relay_item it = {.out = &slot};
        int rc = pack_compute(ps, &it, err, err_len);
        if (rc < 0) return -1;
        if (rc == RELAY_END) return RELAY_DONE;
        memcpy(h->magic, PACK_FILE_MAGIC, 8);
        h->version = PACK_FILE_VERSION;
        h->desc_len = it.desc_len;
        h->payload_len = it.payload_len;
        h->payload_off = PACK_FILE_PAYLOAD_OFF;
        memset((char *)slot.desc + it.desc_len, 0, PACK_FILE_PAYLOAD_OFF - sizeof *h - it.desc_len);
        char path[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/batch-%012llu.bin", out_dir, (unsigned long long)it.seq) >= (int)sizeof path)
            return err_fail(err, err_len, "--out-dir path too long");
        write_fast(path, file_buf, PACK_FILE_PAYLOAD_OFF + it.payload_len);   /* made durable by syncfs before DONE */
        save_cursor(ps->cursor_path, ps->p, 0);
    }
}

int main(int argc, char **argv) {
    log_init("dflash-pack");
    struct stage_common common;
    stage_common_defaults(&common);
    common.device = "cpu";
    const char *data = NULL, *index_out = NULL, *shard = "0/1", *ring_name = RING_NAME_BATCHES, *out_dir = NULL;
    int tokens = 8192, window = 4096, epochs = 1, verify = 1, ring_wait_ms = 60000, print_spec = 0;
    int spec_slots = RINGS_DEFAULT_SLOTS, skip_bad = 0;
    static const char *const on_bad_names[] = {"fail", "skip", NULL};
    struct flag_choice on_bad = {&skip_bad, on_bad_names};
    int64_t seed = 0, max_batches = 0, vocab_size = 0, resume_from_seq = -1, val_every = 0;
    double val_frac = 0;
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&common),
        {"data", FLAG_STRING, &data, "dataset: JSONL ({\"input_ids\": [...], \"loss_mask\": [...]} per line) or an index", 1, 0},
        {"index", FLAG_STRING, &index_out, "write --data (JSONL) as an index file here and exit", 1, 0},
        {"tokens", FLAG_INT, &tokens, "token budget T per batch; longer samples are truncated to T", 1, INT32_MAX},
        {"window", FLAG_INT, &window, "samples per packing window (larger: less padding, less mixing)", 1, 1 << 24},
        {"seed", FLAG_INT64, &seed, "shuffle seed (epoch e uses (seed, e))", 0, INT64_MAX},
        {"epochs", FLAG_INT, &epochs, "epochs to emit (0: unlimited)", 0, INT32_MAX},
        {"max-batches", FLAG_INT64, &max_batches, "stop after this many batches in total (0: no limit)", 0, INT64_MAX},
        {"val-frac", FLAG_DOUBLE, &val_frac, "hold out the last round(F x rows) rows (by row id) as a validation split, "
         "packed into val batches (split = val in the descriptor) that the trainer evaluates forward only (< 1)", 0, 1},
        {"val-every", FLAG_INT64, &val_every, "with --val-frac: after every N-th train batch (the last one included), one "
         "full pass over this shard's val batches, in a fixed order; seqs count train and val batches alike", 0,
         INT64_MAX},
        {"shard", FLAG_STRING, &shard, "i/n: emit shard i of n (several nodes; each gets every n-th batch)", 1, 0},
        {"vocab-size", FLAG_INT64, &vocab_size, "reject token ids >= this (0: no check)", 0, INT32_MAX},
        {"on-bad-sample", FLAG_CHOICE, &on_bad, "what a bad JSONL sample does", 1, 0},
        {"resume-from-seq", FLAG_INT64, &resume_from_seq, "start at batch S, ignoring the saved cursor (-1: continue from the cursor)", -1, INT64_MAX},
        {"ring", FLAG_STRING, &ring_name, "output ring name", 1, 0},
        {"out-dir", FLAG_STRING, &out_dir, "write batches as files into DIR instead of the ring", 1, 0},
        {"ring-wait-ms", FLAG_INT, &ring_wait_ms, "how long to wait for the ring to appear", 0, INT32_MAX},
        RINGS_SPEC_FLAGS(&print_spec, &spec_slots),
        {"verify-index", FLAG_BOOL, &verify, "fully check an index file's content on open (hash, token and mask values)", 1, 0},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--data FILE (--run DIR [--out-dir DIR] | --index OUT) [flags]",
                        "Packs a tokenized dataset into batches of at most --tokens tokens for the `batches` ring.", NULL, 0);
    char err[2048];
    /* The run plan (RUN/plan.json, stages/plan/plan.h) owns the dataset, budget, seed, window and the
     * batches the steps need; a flag may repeat the plan's value, never contradict it. */
    struct plan plan;
    int have_plan = index_out ? 0 : plan_open_run(common.run_dir, &plan, err, sizeof err);
    if (have_plan < 0) { fprintf(stderr, "dflash-pack: %s\n", err); return 2; }
    if (have_plan) {
        if (!flags_given(argc, argv, "epochs")) epochs = 0;   /* --max-batches (the plan's batches) ends the stream */
        if (plan_bind_str(&plan, "data", flags_given(argc, argv, "data"), &data, plan.data, "data", err, sizeof err) ||
            plan_bind_int(&plan, "tokens", flags_given(argc, argv, "tokens"), &tokens, plan.tokens, "tokens", err,
                          sizeof err) ||
            plan_bind_int64(&plan, "seed", flags_given(argc, argv, "seed"), &seed, plan.seed, "seed", err, sizeof err) ||
            plan_bind_int(&plan, "window", flags_given(argc, argv, "window"), &window, plan.window, "window", err,
                          sizeof err) ||
            plan_bind_int64(&plan, "max-batches", flags_given(argc, argv, "max-batches"), &max_batches, plan.batches,
                            "batches (steps x grad_accum)", err, sizeof err)) {
            fprintf(stderr, "dflash-pack: %s\n", err);
            return 2;
        }
    }
    struct rings_geometry geo = {.budget = (uint32_t)tokens};
    if (print_spec) {
        char spec[256];
        LIB_CHECK(rings_format_spec(spec, sizeof spec, ring_name, (uint32_t)spec_slots, DESC_KIND_BATCH, &geo, -1, err,
                                    sizeof err), err);
        printf("%s\n", spec);
        return 0;
    }
    if (!data) { fprintf(stderr, "dflash-pack: --data FILE is required (see --help)\n"); return 2; }
    struct packer_config cfg = {.budget = (uint32_t)tokens, .window = (uint32_t)window, .seed = (uint64_t)seed,
                                .epochs = (uint32_t)epochs, .max_batches = (uint64_t)max_batches,
                                .val_frac = val_frac, .val_every = (uint64_t)val_every};
    if (parse_shard(shard, &cfg.shard, &cfg.n_shards)) {
        fprintf(stderr, "dflash-pack: --shard: expected i/n with 0 <= i < n, got '%s'\n", shard);
        return 2;
    }
    struct dataset_load_opts lo = {.vocab_size = vocab_size, .skip_bad = skip_bad, .on_bad = on_bad_sample};
    struct dataset_load_stats ls;
    struct dataset ds;

    /* ------------------------------------------------------------ --index: convert and exit */
    if (index_out) {
        stage_start(&common, 0);
        double t0 = time_mono_s();
        if (dataset_load_jsonl(&ds, data, &lo, &ls, err, sizeof err)) die_input(err);
        if (dataset_write_index(&ds, index_out, err, sizeof err)) die_input(err);
        log_info("indexed %s -> %s: %llu samples, %llu tokens, %llu bad samples skipped, %.2f s", data, index_out,
                 (unsigned long long)ds.n_rows, (unsigned long long)ds.n_tokens, (unsigned long long)ls.skipped_bad,
                 time_mono_s() - t0);
        dataset_free(&ds);
        return 0;
    }

    /* ------------------------------------------------------------ dataset and packer */
    stage_start(&common, 1);
    double t0 = time_mono_s();
    if (dataset_open(&ds, data, &lo, &ls, verify, err, sizeof err)) die_input(err);
    log_info("dataset %s (%s): %llu samples, %llu tokens%s, loaded in %.2f s", data, ds.is_index ? "index" : "JSONL",
             (unsigned long long)ds.n_rows, (unsigned long long)ds.n_tokens,
             ls.skipped_bad ? ", some bad samples skipped (listed above)" : "", time_mono_s() - t0);
    struct packer p;
    if (packer_init(&p, &ds, &cfg, err, sizeof err)) die_input(err);
    int64_t e0 = packer_epoch_batches(&p, 0, err, sizeof err);
    log_info("packing: budget %u tokens, window %u, seed %llu, shard %u/%u: %llu eligible samples, %llu dropped (no "
             "supervised token within the budget), %llu truncated to %u tokens; epoch 0 gives %lld batches",
             cfg.budget, cfg.window, (unsigned long long)cfg.seed, cfg.shard, cfg.n_shards,
             (unsigned long long)p.stats.eligible, (unsigned long long)p.stats.dropped,
             (unsigned long long)p.stats.truncated, cfg.budget, (long long)e0);
    if (p.val_count)
        log_info("validation: the last %llu rows held out (%llu packed), %llu val batches per pass for this shard, one pass "
                 "after every %llu train batches", (unsigned long long)p.stats.val_rows,
                 (unsigned long long)p.stats.val_eligible, (unsigned long long)p.val_count, (unsigned long long)val_every);

    char cursor_path[PATH_MAX];
    if (run_path(cursor_path, sizeof cursor_path, common.run_dir, "state/pack.cursor")) DIE("run directory path too long");
    /* Where to start: --resume-from-seq S rewinds to S, except when the saved cursor says this
     * stream was already rewound to that same S (a restart of the same command), which continues. */
    struct packer_cursor c;
    int have_cursor = 0;
    if (fs_exists(cursor_path)) {
        char *text;
        size_t len;
        LIB_CHECK(fs_read_file(cursor_path, &text, &len, err, sizeof err), err);
        have_cursor = packer_cursor_parse(text, len, &c, err, sizeof err) == 0;
        free(text);
        if (!have_cursor && resume_from_seq < 0) {
            log_error("%s: %s", cursor_path, err);
            log_error("hint: pass --resume-from-seq S, or delete the cursor to start over");
            exit(1);
        }
    }
    if (resume_from_seq >= 0 && !(have_cursor && c.origin == resume_from_seq && c.fingerprint == p.fingerprint)) {
        LIB_CHECK(packer_seek(&p, (uint64_t)resume_from_seq, err, sizeof err), err);
        g_origin = resume_from_seq;
        log_info("--resume-from-seq %lld: starting at epoch %u position %llu", (long long)resume_from_seq, p.cur.epoch,
                 (unsigned long long)p.cur.position);
    } else if (have_cursor) {
        if (packer_resume(&p, &c, err, sizeof err)) {
            log_error("%s: %s", cursor_path, err);
            log_error("hint: the dataset or packing flags changed since that cursor was written; restore them, pass "
                      "--resume-from-seq S, or delete the cursor to start over");
            exit(1);
        }
        g_origin = c.origin;
        log_info("resuming from %s: next seq %llu (epoch %u position %llu)%s", cursor_path, (unsigned long long)c.next_seq,
                 c.epoch, (unsigned long long)c.position,
                 resume_from_seq >= 0 ? "; the stream was already rewound to --resume-from-seq by an earlier start" : "");
    }

    /* ------------------------------------------------------------ output */
    struct pstage ps = {.p = &p, .cursor_path = cursor_path, .skipped_bad = ls.skipped_bad, .t_last = time_mono_s(),
                         .plan = have_plan ? plan.hash : 0};
    seq_shard_all(&ps.shard);
    if (have_plan) {
        if (plan.hosts > 1 && plan.host < 0) {
            log_error("%s/plan.json is a %d-host run's plan: each host's packer runs in its host directory (RUN/hosts/H, "
                      "dflash-plan --from RUN --host H)", common.run_dir, plan.hosts);
            exit(2);
        }
        plan_shard(&plan, &ps.shard);
        if (!seq_shard_is_all(&ps.shard))
            log_info("host %d of %d: packs every batch, publishes the seqs s with %llu <= s %% %llu < %llu (its trainer "
                     "ranks')", plan.host, plan.hosts, (unsigned long long)ps.shard.lo,
                     (unsigned long long)ps.shard.period, (unsigned long long)ps.shard.hi);
    }
    uint64_t payload_cap = rings_payload_bytes(DESC_KIND_BATCH, &geo);
    uint32_t desc_need = rings_desc_bytes(DESC_KIND_BATCH, &geo);
    double t_start = time_mono_s();
    int res;
    void *file_buf = NULL;
    struct relay *relay = NULL;
    if (out_dir) {
        LIB_CHECK(fs_mkdir_p(out_dir, err, sizeof err), err);
        file_buf = aligned_alloc(DESC_ALIGN, PACK_FILE_PAYLOAD_OFF + (payload_cap + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
        ALLOC_CHECK(file_buf);
        log_info("writing batches as files into %s", out_dir);
        res = write_files(&ps, out_dir, file_buf, payload_cap, err, sizeof err);
    } else {
        struct relay_config rc = {
            .run_dir = common.run_dir, .out_ring = ring_name, .attach_wait_ms = ring_wait_ms,
            .wait_ms = 1000, .heartbeat_s = 1.0, .use_bus = 1, .item_name = "batch", .ctx = &ps,
            .compute = pack_compute, .at_end = pack_at_end, .heartbeat_kv = pack_kv, .published = pack_published,
            .plan = have_plan ? plan.hash : 0,
        };
        check_hint("is dflash-shm running for this run with the ring (dflash-shm --run DIR --ring batches:...)?");
        relay = relay_open(&rc, err, sizeof err);
        if (!relay) DIE("%s", err);
        check_hint(NULL);
        if (ring_expect(relay_out(relay), payload_cap, desc_need, -1, err, sizeof err)) {
            char spec[256], e2[256];
            log_error("ring '%s' is too small for --tokens %u: %s", ring_name, cfg.budget, err);
            if (rings_format_spec(spec, sizeof spec, ring_name, (uint32_t)spec_slots, DESC_KIND_BATCH, &geo, -1, e2,
                                  sizeof e2) == 0)
                log_error("hint: create it with dflash-shm --ring %s (dflash-pack --tokens %u --print-ring-spec)", spec,
                          cfg.budget);
            exit(1);
        }
        log_info("producing to ring '%s'", ring_name);
        res = relay_run(relay, err, sizeof err);
    }

    /* ------------------------------------------------------------ end */
    const struct packer_stats *s = &p.stats;
    double el = time_mono_s() - t_start;
    save_cursor(cursor_path, &p, 1);
    if (res == RELAY_DONE) {
        if (out_dir) {
            char path[PATH_MAX], text[128];
            int dfd = open(out_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            SYS_CHECK(dfd);
            SYS_CHECK(syncfs(dfd));   /* every batch file on disk before DONE says so */
            close(dfd);
            snprintf(path, sizeof path, "%s/DONE", out_dir);
            int n = snprintf(text, sizeof text, "%llu\n", (unsigned long long)p.cur.next_seq);
            LIB_CHECK(fs_write_atomic(path, text, (size_t)n, err, sizeof err), err);
        }
        log_info("end of stream at seq %llu: %llu batches (%llu of them val; %llu of other hosts not published), %llu "
                 "tokens (%.0f tokens/s), padding %.2f%%, %llu dropped, %llu truncated, %llu bad samples skipped",
                 (unsigned long long)p.cur.next_seq, (unsigned long long)s->batches, (unsigned long long)s->val_batches,
                 (unsigned long long)ps.foreign, (unsigned long long)s->tokens,
                 el > 0 ? (double)s->tokens / el : 0,
                 s->tokens ? 100.0 * (double)s->padding / (double)(s->tokens + s->padding) : 0.0,
                 (unsigned long long)s->dropped, (unsigned long long)s->truncated, (unsigned long long)ls.skipped_bad);
    } else if (res == RELAY_STOPPED) {
        log_info("stopped by signal %d before seq %llu (the cursor is saved; the same command continues)",
                 stage_stop_signal(), (unsigned long long)p.cur.next_seq);
    } else {
        log_error("%s (next seq %llu)", err, (unsigned long long)p.cur.next_seq);
    }
    if (relay) {
        struct bus *bus = relay_bus(relay);
        if (bus) log_info("metrics: %llu records sent before the summary, %llu dropped (no sink or sink busy)",
                          (unsigned long long)bus_sent(bus), (unsigned long long)bus_dropped(bus));
        relay_close(relay);
    }
    free(file_buf);
    packer_free(&p);
    dataset_free(&ds);
    return relay_exit_code(res);
}
