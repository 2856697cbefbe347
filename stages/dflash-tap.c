/*
 * stages/dflash-tap.c — a stage that sits between two rings (issue 15 item 4): it forwards every
 * item of --in to --out unchanged (descriptor and payload bytes, same seq) and, with --record
 * DIR, also writes each one to disk in the recording format (stages/core/record.h). A transform
 * on the relay loop (stages/core/relay.h): publish downstream, then release upstream, so a
 * SIGKILL and restart loses nothing (a kill between the two repeats one seq, which the
 * downstream seen set drops).
 *
 * Inserting a tap into a running pipeline P -> [A] -> C (README "Recordings"): the spare ring A2
 * exists from the start (dflash-shm --ring A:...,A2:... of the same sizes); start
 * `dflash-tap --in A --out A2`, then stop C with SIGTERM (its held items go back READY into A,
 * where the tap takes them) and start it again reading A2. Removing it: SIGTERM the tap (its held
 * items go back READY into A), wait until A2 is empty (dflash-shm --status), SIGTERM C and start
 * it again on A. Nothing is lost or repeated either way; a tap can also carry an experimental
 * stage's output (same formats) without touching the others.
 *
 * Payload copies: host -> host memcpy; a device on either side cudaMemcpyAsync, across GPUs
 * cudaMemcpyPeerAsync (relay_slot_put). --record copies GPU payloads to pinned host memory first.
 * Exit 0 at end of stream (out marked drained; --record index written), 3 when stopped by a
 * signal, 1 on an item that does not fit --out or, with --record, does not decode.
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

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif

struct opts {
    struct stage_common common;
    const char *in_ring, *out_ring, *record;
    int wait_ms;
    double heartbeat_s;
};

struct tap {
    const struct opts *o;
    uint8_t *host;            /* --record: host copy of a GPU payload (pinned) */
    void *stream;
    uint64_t bytes, recorded;
    double copy_s, record_s;
};

static int tap_compute(void *ctx, struct relay_item *it, char *err, int err_len) {
    struct tap *t = ctx;
    const struct ring_slot *is = it->in;
    struct ring_slot *os = it->out;
    if (is->desc_len > os->desc_cap)
        return err_fail(err, err_len, "seq %llu: descriptor of %u bytes, ring '%s' slots hold %u", (unsigned long long)is->seq,
                        is->desc_len, t->o->out_ring, os->desc_cap);
    double t0 = time_mono_s();
    memcpy(os->desc, is->desc, is->desc_len);
    if (relay_slot_put(os, 0, is->payload, is->on_device ? is->device : -1, is->payload_len, t->stream, err, err_len))
        return -1;
    const void *host = is->on_device ? NULL : is->payload;
    if (t->o->record && is->on_device) {
        if (relay_slot_get(t->host, -1, is, 0, is->payload_len, t->stream, err, err_len)) return -1;
        host = t->host;
    }
#ifdef DFLASH_CUDA
    if (is->on_device || os->on_device) {
        cudaError_t ce = cudaStreamSynchronize((cudaStream_t)t->stream);
        if (ce != cudaSuccess) return err_fail(err, err_len, "cudaStreamSynchronize: %s", cudaGetErrorString(ce));
    }
#endif
    t->copy_s += time_mono_s() - t0;
    if (t->o->record) {
        double r0 = time_mono_s();
        enum desc_kind kind;
        char why[1024];
        if (desc_peek_kind(is->desc, is->desc_len, &kind, why, sizeof why))
            return err_fail(err, err_len, "seq %llu: --record needs a descriptor: %s", (unsigned long long)is->seq, why);
        if (record_write_file(t->o->record, is->seq, kind, is->desc, is->desc_len, host, is->payload_len, 1, err, err_len))
            return -1;
        t->recorded++;
        t->record_s += time_mono_s() - r0;
    }
    it->desc_len = is->desc_len;
    it->payload_len = is->payload_len;
    t->bytes += is->payload_len;
    return RELAY_DONE;
}

static int tap_kv(void *ctx, struct bus_kv *kv, int max) {
    struct tap *t = ctx;
    if (max < 4) return 0;
    kv[0] = (struct bus_kv){"bytes", (double)t->bytes};
    kv[1] = (struct bus_kv){"copy_s", t->copy_s};
    kv[2] = (struct bus_kv){"recorded", (double)t->recorded};
    kv[3] = (struct bus_kv){"record_s", t->record_s};
    return 4;
}

int main(int argc, char **argv) {
    log_init("dflash-tap");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    o.wait_ms = 60000;
    o.heartbeat_s = 1.0;
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"in", FLAG_STRING, &o.in_ring, "ring to read (required)", 1, 0},
        {"out", FLAG_STRING, &o.out_ring, "ring to forward into, of at least the same slot sizes (required)", 1, 0},
        {"record", FLAG_STRING, &o.record, "also write every item to DIR (recording format; dflash-replay reads it)", 1, 0},
        {"wait-ms", FLAG_INT, &o.wait_ms, "how long to wait for the rings to appear", 0, INT_MAX},
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats (0: 1 s)", 0, 86400},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--run DIR --in RING --out RING [--record DIR]",
                        "A tap between two rings: forwards every item unchanged (same seq, same bytes), optionally "
                        "recording it, and can be inserted into or removed from a running pipeline (README "
                        "\"Recordings\": the exact commands). Exit 0 at end of stream, 3 when stopped by a signal.",
                        NULL, 0);
    if (!o.in_ring || !o.out_ring) { fprintf(stderr, "dflash-tap: --in and --out are required\n"); return 2; }
    if (!strcmp(o.in_ring, o.out_ring)) { fprintf(stderr, "dflash-tap: --in and --out must be different rings\n"); return 2; }
    stage_start(&o.common, 1);
    char err[2048];
    static struct tap t;
    t.o = &o;
    if (o.record) LIB_CHECK(fs_mkdir_p(o.record, err, sizeof err), err);
    struct relay_config rc = {
        .run_dir = o.common.run_dir, .in_ring = o.in_ring, .out_ring = o.out_ring, .cuda_device = o.common.cuda_device,
        .attach_wait_ms = o.wait_ms, .heartbeat_s = o.heartbeat_s, .use_bus = 1, .item_name = "item",
        .ctx = &t, .compute = tap_compute, .heartbeat_kv = tap_kv,
    };
    check_hint("is dflash-shm running for this --run, with the rings named by --in and --out?");
    struct relay *r = relay_open(&rc, err, sizeof err);
    if (!r) DIE("%s", err);
    check_hint(NULL);
    const struct ring_spec *is = ring_get_spec(relay_in(r)), *os = ring_get_spec(relay_out(r));
    if (ring_expect(relay_out(r), is->payload_bytes, is->desc_bytes, -2, err, sizeof err))
        DIE("ring '%s' cannot carry every item of '%s': %s", o.out_ring, o.in_ring, err);
    if ((is->device >= 0 || os->device >= 0) && o.common.cuda_device < 0)
        DIE("ring '%s' or '%s' has GPU payloads but this stage runs with --device cpu", o.in_ring, o.out_ring);
#ifdef DFLASH_CUDA
    if (is->device >= 0 || os->device >= 0) {
        cudaStream_t s;
        CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        t.stream = s;
    }
    if (o.record && is->device >= 0) CUDA_CHECK(cudaMallocHost((void **)&t.host, is->payload_bytes ? is->payload_bytes : 1));
#endif
    log_info("tapping '%s' -> '%s'%s%s", o.in_ring, o.out_ring, o.record ? ", recording to " : "", o.record ? o.record : "");
    int res = relay_run(r, err, sizeof err);
    if (res < 0) log_error("%s", err);
    int code = relay_exit_code(res);
    if (res == RELAY_DONE && o.record) {
        int64_t n = record_index_write(o.record, err, sizeof err);
        if (n < 0) { log_error("--record: %s", err); code = 1; }
        else log_info("--record: %s complete with %lld items", o.record, (long long)n);
    }
    relay_close(r);
#ifdef DFLASH_CUDA
    if (t.host) cudaFreeHost(t.host);
    if (t.stream) cudaStreamDestroy((cudaStream_t)t.stream);
#endif
    return code;
}
