/*
 * stages/dflash-pack.c — the dataset packing stage (design.md §2, §6, §8; issue 4).
 *
 * Reads a dataset (JSONL or the indexed format, stages/core/dataset.h), packs it with the policy
 * of stages/core/packer.h, and publishes one `batch` descriptor + host payload per sequence
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
 * --index OUT converts --data (JSONL) to the indexed format once and exits.
 */
#include "core/bus.h"
#include "core/check.h"
#include "core/dataset.h"
#include "core/desc.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/packer.h"
#include "core/stage.h"
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

static void ring_log(void *ctx, const char *line) {
    (void)ctx;
    log_info("%s", line);
}

static int parse_shard(const char *s, uint32_t *i, uint32_t *n) {
    unsigned a, b;
    char tail;
    if (sscanf(s, "%u/%u%c", &a, &b, &tail) != 2 || b < 1 || a >= b) return -1;
    *i = a;
    *n = b;
    return 0;
}

/* Largest encoded batch descriptor for this budget (every field at its maximum). */
static size_t max_desc_len(uint32_t budget) {
    struct desc_batch d = {.seq = UINT64_MAX, .epoch = UINT32_MAX, .n_tokens = budget, .budget = budget,
                           .n_docs = budget, .n_loss = budget};
    desc_batch_layout(&d);
    char buf[DESC_MAX_BYTES], err[256];
    size_t len = DESC_MAX_BYTES;
    if (desc_batch_encode(&d, buf, sizeof buf, &len, err, sizeof err)) return DESC_MAX_BYTES;
    return len;
}

/* Save the cursor after a published batch. Every save is atomic for readers and survives a
 * SIGKILL (write to a temporary name, then rename: the page cache outlives the process); it is
 * made durable against power loss (fs_write_atomic: fsync of file and directory) at most once a
 * second and at exit, so two fsyncs per batch never cap the packing rate. A cursor older by up
 * to a second after a machine crash only re-publishes batches, which consumers drop by seq. */
/* Replace path with data atomically for readers and safe against SIGKILL (temporary name, then
 * rename: the page cache outlives the process), without fsync. */
static void write_fast(const char *path, const void *data, size_t len) {
    char tmp[PATH_MAX + 32];
    if (snprintf(tmp, sizeof tmp, "%s.fast.%d", path, (int)getpid()) >= (int)sizeof tmp) DIE("path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) DIE("fopen(%s): %s", tmp, strerror(errno));
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

struct meter {
    struct bus *bus;
    const struct packer *p;
    struct ring *ring;
    double t0, last_t, busy_s, wait_s;
    uint64_t last_batches, last_tokens, skipped_bad;
    char ring_name[64];
};

static void meter_kv(struct meter *m, struct bus_kv *kv, int *n, double dt, uint64_t db, uint64_t dtok) {
    const struct packer_stats *s = &m->p->stats;
    int k = 0;
    kv[k++] = (struct bus_kv){BUS_K_ITEMS_OUT, (double)s->batches};
    kv[k++] = (struct bus_kv){BUS_K_BUSY_S, m->busy_s};
    kv[k++] = (struct bus_kv){BUS_K_WAIT_S, m->wait_s};
    kv[k++] = (struct bus_kv){"batches_per_s", dt > 0 ? (double)db / dt : 0};
    kv[k++] = (struct bus_kv){BUS_K_TOKENS_PER_S, dt > 0 ? (double)dtok / dt : 0};
    kv[k++] = (struct bus_kv){"tokens", (double)s->tokens};
    kv[k++] = (struct bus_kv){"padding_frac", s->tokens ? (double)s->padding / (double)(s->tokens + s->padding) : 0};
    kv[k++] = (struct bus_kv){"dropped_samples", (double)s->dropped};
    kv[k++] = (struct bus_kv){"truncated_samples", (double)s->truncated};
    kv[k++] = (struct bus_kv){"skipped_bad", (double)m->skipped_bad};
    kv[k++] = (struct bus_kv){"epoch", (double)m->p->cur.epoch};
    kv[k++] = (struct bus_kv){"next_seq", (double)m->p->cur.next_seq};
    if (m->ring) {
        struct ring_status st;
        ring_get_status(m->ring, &st);
        kv[k++] = (struct bus_kv){m->ring_name, (double)st.n_ready};
    }
    *n = k;
}

static void meter_tick(struct meter *m, int force) {
    double now = time_mono_s();
    if (!force && now - m->last_t < 1.0) return;
    if (m->bus) {
        struct bus_kv kv[16];
        int n;
        meter_kv(m, kv, &n, now - m->last_t, m->p->stats.batches - m->last_batches, m->p->stats.tokens - m->last_tokens);
        if (bus_heartbeat(m->bus, kv, n) < 0) {   /* a caller error (a bad metric name): say it once */
            log_warn("metrics heartbeat refused: %s", bus_error(m->bus));
            bus_close(m->bus);
            m->bus = NULL;
        }
    }
    m->last_t = now;
    m->last_batches = m->p->stats.batches;
    m->last_tokens = m->p->stats.tokens;
}

int main(int argc, char **argv) {
    log_init("dflash-pack");
    struct stage_common common;
    stage_common_defaults(&common);
    common.device = "cpu";
    const char *data = NULL, *index_out = NULL, *shard = "0/1", *on_bad = "fail", *ring_name = "batches", *out_dir = NULL;
    int tokens = 8192, window = 4096, epochs = 1, verify = 1, ring_wait_ms = 60000, print_spec = 0;
    int64_t seed = 0, max_batches = 0, vocab_size = 0, resume_from_seq = -1;
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&common),
        {"data", FLAG_STRING, &data, "dataset: JSONL ({\"input_ids\": [...], \"loss_mask\": [...]} per line) or an index", 1, 0},
        {"index", FLAG_STRING, &index_out, "write --data (JSONL) as an index file here and exit", 1, 0},
        {"tokens", FLAG_INT, &tokens, "token budget T per batch; longer samples are truncated to T", 1, INT32_MAX},
        {"window", FLAG_INT, &window, "samples per packing window (larger: less padding, less mixing)", 1, 1 << 24},
        {"seed", FLAG_INT64, &seed, "shuffle seed (epoch e uses (seed, e))", 0, INT64_MAX},
        {"epochs", FLAG_INT, &epochs, "epochs to emit (0: unlimited)", 0, INT32_MAX},
        {"max-batches", FLAG_INT64, &max_batches, "stop after this many batches in total (0: no limit)", 0, INT64_MAX},
        {"shard", FLAG_STRING, &shard, "i/n: emit shard i of n (several nodes; each gets every n-th batch)", 1, 0},
        {"vocab-size", FLAG_INT64, &vocab_size, "reject token ids >= this (0: no check)", 0, INT32_MAX},
        {"on-bad-sample", FLAG_STRING, &on_bad, "skip|fail: what a bad JSONL sample does", 1, 0},
        {"resume-from-seq", FLAG_INT64, &resume_from_seq, "start at batch S, ignoring the saved cursor (-1: continue from the cursor)", -1, INT64_MAX},
        {"ring", FLAG_STRING, &ring_name, "output ring name", 1, 0},
        {"out-dir", FLAG_STRING, &out_dir, "write batches as files into DIR instead of the ring", 1, 0},
        {"ring-wait-ms", FLAG_INT, &ring_wait_ms, "how long to wait for the ring to appear", 0, INT32_MAX},
        {"print-ring-spec", FLAG_BOOL, &print_spec, "print the dflash-shm --ring spec this --tokens needs (4 slots) and exit", 1, 0},
        {"verify-index", FLAG_BOOL, &verify, "fully check an index file's content on open (hash, token and mask values)", 1, 0},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--data FILE (--run DIR [--out-dir DIR] | --index OUT) [flags]",
                        "Packs a tokenized dataset into batches of at most --tokens tokens for the `batches` ring.", NULL, 0);
    if (print_spec) {
        printf("%s:slots=4,bytes=%llu,desc=%zu,dev=host\n", ring_name,
               (unsigned long long)desc_batch_max_payload_bytes((uint32_t)tokens), max_desc_len((uint32_t)tokens));
        return 0;
    }
    if (!data) { fprintf(stderr, "dflash-pack: --data FILE is required (see --help)\n"); return 2; }
    int skip_bad;
    if (!strcmp(on_bad, "skip")) skip_bad = 1;
    else if (!strcmp(on_bad, "fail")) skip_bad = 0;
    else { fprintf(stderr, "dflash-pack: --on-bad-sample: expected skip or fail, got '%s'\n", on_bad); return 2; }
    struct packer_config cfg = {.budget = (uint32_t)tokens, .window = (uint32_t)window, .seed = (uint64_t)seed,
                                .epochs = (uint32_t)epochs, .max_batches = (uint64_t)max_batches};
    if (parse_shard(shard, &cfg.shard, &cfg.n_shards)) {
        fprintf(stderr, "dflash-pack: --shard: expected i/n with 0 <= i < n, got '%s'\n", shard);
        return 2;
    }
    char err[2048];
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
    struct ring *ring = NULL;
    void *file_buf = NULL;
    uint64_t payload_cap = desc_batch_max_payload_bytes(cfg.budget);
    size_t desc_need = max_desc_len(cfg.budget);
    if (out_dir) {
        LIB_CHECK(fs_mkdir_p(out_dir, err, sizeof err), err);
        file_buf = aligned_alloc(DESC_ALIGN, PACK_FILE_PAYLOAD_OFF + (payload_cap + DESC_ALIGN - 1) / DESC_ALIGN * DESC_ALIGN);
        ALLOC_CHECK(file_buf);
        log_info("writing batches as files into %s", out_dir);
    } else {
        ring_set_log(ring_log, NULL);
        check_hint("is dflash-shm running for this run with the ring (dflash-shm --run DIR --ring batches:...)?");
        ring = ring_attach(common.run_dir, ring_name, RING_PRODUCER, ring_wait_ms, err, sizeof err);
        if (!ring) DIE("ring_attach(%s): %s", ring_name, err);
        check_hint(NULL);
        if (ring_expect(ring, payload_cap, (uint32_t)desc_need, -1, err, sizeof err)) {
            log_error("ring '%s' is too small for --tokens %u: %s", ring_name, cfg.budget, err);
            log_error("hint: create it with dflash-shm --ring %s:bytes=%llu,desc=%zu,dev=host (or larger)", ring_name,
                      (unsigned long long)payload_cap, desc_need);
            exit(1);
        }
        log_info("producing to ring '%s'", ring_name);
    }

    struct meter m = {0};
    m.p = &p;
    m.ring = ring;
    m.skipped_bad = ls.skipped_bad;
    m.t0 = m.last_t = time_mono_s();
    snprintf(m.ring_name, sizeof m.ring_name, "occ_%s", ring_name);
    if (common.run_dir) {
        m.bus = bus_open(common.run_dir, "dflash-pack", err, sizeof err);
        if (!m.bus) log_warn("metrics disabled: %s", err);
    }

    /* ------------------------------------------------------------ the loop */
    struct desc_batch d;
    int ended = 0;
    double t_wait_log = 0;
    while (!stage_stopping()) {
        meter_tick(&m, 0);
        int at_end = packer_at_end(&p, err, sizeof err);
        if (at_end < 0) DIE("%s", err);
        if (at_end) { ended = 1; break; }
        if (ring) {
            struct ring_slot slot;
            double tw = time_mono_s();
            int rc = ring_acquire_write(ring, 1000, &slot);
            m.wait_s += time_mono_s() - tw;
            if (rc == RING_TIMEOUT) {
                if (m.bus) bus_set_waiting(m.bus, "ring full");
                if (time_mono_s() - t_wait_log > 30) {
                    log_info("waiting for a free slot in ring '%s' (next seq %llu)", ring_name, (unsigned long long)p.cur.next_seq);
                    t_wait_log = time_mono_s();
                }
                continue;
            }
            if (rc == RING_END) {
                log_error("ring '%s' was closed (dflash-shm shut down?) before the end of the stream; next seq %llu",
                          ring_name, (unsigned long long)p.cur.next_seq);
                exit(1);
            }
            if (rc < 0) DIE("ring_acquire_write(%s): %s", ring_name, ring_error());
            if (m.bus) bus_set_waiting(m.bus, NULL);
            double tb = time_mono_s();
            int got = packer_next(&p, slot.payload, slot.payload_cap, &d, err, sizeof err);
            if (got <= 0) {
                if (ring_abandon(ring, &slot)) DIE("ring_abandon(%s): %s", ring_name, ring_error());
                if (got < 0) DIE("%s", err);
                ended = 1;
                break;
            }
            size_t dlen;
            LIB_CHECK(desc_batch_encode(&d, slot.desc, slot.desc_cap, &dlen, err, sizeof err), err);
            if (ring_publish(ring, &slot, d.seq, (uint32_t)dlen, d.payload_bytes))
                DIE("ring_publish(%s, seq %llu): %s", ring_name, (unsigned long long)d.seq, ring_error());
            save_cursor(cursor_path, &p, 0);
            m.busy_s += time_mono_s() - tb;
        } else {
            double tb = time_mono_s();
            struct pack_file_header *h = file_buf;
            char *desc = (char *)file_buf + sizeof *h;
            /* the payload starts DESC_ALIGN-aligned inside the buffer, behind header + descriptor room */
            char *payload = (char *)file_buf + PACK_FILE_PAYLOAD_OFF;
            int got = packer_next(&p, payload, payload_cap, &d, err, sizeof err);
            if (got < 0) DIE("%s", err);
            if (!got) { ended = 1; break; }
            size_t dlen;
            LIB_CHECK(desc_batch_encode(&d, desc, DESC_MAX_BYTES, &dlen, err, sizeof err), err);
            memcpy(h->magic, PACK_FILE_MAGIC, 8);
            h->version = PACK_FILE_VERSION;
            h->desc_len = (uint32_t)dlen;
            h->payload_len = d.payload_bytes;
            h->payload_off = PACK_FILE_PAYLOAD_OFF;
            memset(desc + dlen, 0, PACK_FILE_PAYLOAD_OFF - sizeof *h - dlen);
            char path[PATH_MAX];
            if (snprintf(path, sizeof path, "%s/batch-%012llu.bin", out_dir, (unsigned long long)d.seq) >= (int)sizeof path)
                DIE("--out-dir path too long");
            write_fast(path, file_buf, PACK_FILE_PAYLOAD_OFF + d.payload_bytes);   /* made durable by syncfs before DONE */
            save_cursor(cursor_path, &p, 0);
            m.busy_s += time_mono_s() - tb;
        }
    }

    /* ------------------------------------------------------------ end */
    const struct packer_stats *s = &p.stats;
    double el = time_mono_s() - m.t0;
    save_cursor(cursor_path, &p, 1);
    if (ended) {
        if (ring && ring_mark_drained(ring)) DIE("ring_mark_drained(%s): %s", ring_name, ring_error());
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
        log_info("end of stream at seq %llu: %llu batches, %llu tokens (%.0f tokens/s), padding %.2f%%, %llu dropped, "
                 "%llu truncated, %llu bad samples skipped", (unsigned long long)p.cur.next_seq,
                 (unsigned long long)s->batches, (unsigned long long)s->tokens, el > 0 ? (double)s->tokens / el : 0,
                 s->tokens ? 100.0 * (double)s->padding / (double)(s->tokens + s->padding) : 0.0,
                 (unsigned long long)s->dropped, (unsigned long long)s->truncated, (unsigned long long)ls.skipped_bad);
    } else {
        log_info("stopped by signal %d before seq %llu (the cursor is saved; the same command continues)",
                 stage_stop_signal(), (unsigned long long)p.cur.next_seq);
    }
    if (m.bus) {
        struct bus_kv kv[16];
        int n;
        meter_kv(&m, kv, &n, el, s->batches, s->tokens);
        bus_summary(m.bus, kv, n);
        log_info("metrics: %llu records sent, %llu dropped (no sink or sink busy)", (unsigned long long)bus_sent(m.bus),
                 (unsigned long long)bus_dropped(m.bus));
        bus_close(m.bus);
    }
    ring_close(ring);
    free(file_buf);
    packer_free(&p);
    dataset_free(&ds);
    return 0;
}
