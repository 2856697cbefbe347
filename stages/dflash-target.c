/*
 * stages/dflash-target.c — the frozen target stage: reads packed batches from the `batches` ring,
 * runs the target forward (stages/model/target.h) and writes the captured hidden states to the
 * `hidden` ring (design.md §2, §4, §6).
 *
 * Per item: claim a READY batch, check it (one-line error naming the batch seq and position on
 * a bad token id), claim a FREE hidden slot, copy the batch arrays and write the states straight
 * into the slot's payload (a GPU IPC buffer on a GPU ring, host memory with --device cpu),
 * publish the hidden item (the forward has synchronised its stream), and only THEN release the
 * batch slot. So a SIGKILL at any point leaves the batch either READY upstream (redelivered to
 * whoever comes next) or its hidden item READY downstream: nothing is lost. (A kill in the few
 * instructions between the publish and the release delivers the batch once more; the hidden
 * item then appears twice with the same seq, and dflash-hspack, which restores sequence order,
 * drops the second copy.) Several replicas may attach to the same rings.
 *
 * --docs FILE --dump OUT is a mode without rings for cross-checks (scripts/compare_hf.py): the
 * documents of FILE (JSON: {"docs": [[ids...], ...]} or [[ids...], ...]) are packed into one
 * batch, positions reset per document, and the states are written as fp32 safetensors.
 */
#include "core/bus.h"
#include "core/check.h"
#include "core/desc.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/stage.h"
#include "model/safetensors.h"
#include "model/target.h"
#include "shm/ring.h"

#include <jansson.h>
#include <errno.h>
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
    const char *model;
    const char *layers;
    int draft_layers;
    int tokens;
    const char *in_ring, *out_ring;
    int wait_ms;
    double heartbeat_s;
    const char *docs, *dump;
    int ring_bytes;
};

/* "1,9,17" -> ids. */
static void parse_layers(const char *s, struct target_options *o) {
    o->n_capture = 0;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT_MAX)
            DIE("--layers: expected comma-separated layer ids (z-lab: output of decoder layer i), got '%s'", s);
        if (o->n_capture == TARGET_MAX_CAPTURE) DIE("--layers: at most %d ids", TARGET_MAX_CAPTURE);
        o->capture[o->n_capture++] = (int)v;
        p = end;
        if (*p == ',') p++;
        else if (*p) DIE("--layers: unexpected '%c' in '%s'", *p, s);
    }
    if (o->n_capture == 0) DIE("--layers: no ids in '%s'", s);
}

static void ring_log(void *ctx, const char *line) { (void)ctx; log_info("%s", line); }

/* ---------------------------------------------------------------- --dump mode */

static void dump_mode(const struct opts *o, struct target *t) {
    char err[1024];
    char *text;
    size_t len;
    LIB_CHECK(fs_read_file(o->docs, &text, &len, err, sizeof err), err);
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!root) DIE("%s:%d:%d: %s", o->docs, je.line, je.column, je.text);
    json_t *docs = json_is_object(root) ? json_object_get(root, "docs") : root;
    if (!json_is_array(docs) || json_array_size(docs) == 0)
        DIE("%s: expected {\"docs\": [[ids...], ...]} or [[ids...], ...] with at least one document", o->docs);
    int nd = (int)json_array_size(docs), T = 0;
    for (int d = 0; d < nd; d++) {
        json_t *doc = json_array_get(docs, (size_t)d);
        if (!json_is_array(doc) || json_array_size(doc) == 0)
            DIE("%s: document %d is not a non-empty array of token ids", o->docs, d);
        T += (int)json_array_size(doc);
    }
    int32_t *ids = malloc((size_t)T * 4), *pos = malloc((size_t)T * 4), *cu = malloc((size_t)(nd + 1) * 4);
    ALLOC_CHECK(ids); ALLOC_CHECK(pos); ALLOC_CHECK(cu);
    int n = 0;
    cu[0] = 0;
    for (int d = 0; d < nd; d++) {
        json_t *doc = json_array_get(docs, (size_t)d);
        for (size_t i = 0; i < json_array_size(doc); i++) {
            json_t *v = json_array_get(doc, i);
            if (!json_is_integer(v)) DIE("%s: document %d token %zu is not an integer", o->docs, d, i);
            ids[n] = (int32_t)json_integer_value(v);
            pos[n++] = (int32_t)i;
        }
        cu[d + 1] = n;
    }
    json_decref(root);

    int k = target_n_capture(t), C = target_config(t)->hidden_size;
    size_t plane = (size_t)T * C;
    float *states = malloc((size_t)k * plane * 4), *last = malloc(plane * 4);
    ALLOC_CHECK(states); ALLOC_CHECK(last);
    struct target_batch b = {0, T, nd, ids, pos, cu};
    if (target_device(t) < 0) {
        LIB_CHECK(target_forward(t, &b, states, last, err, sizeof err), err);
    } else {
#ifdef DFLASH_CUDA
        bf16 *d_states, *d_last, *h = malloc(((size_t)k + 1) * plane * 2);
        ALLOC_CHECK(h);
        CUDA_CHECK(cudaMalloc((void **)&d_states, (size_t)k * plane * 2));
        CUDA_CHECK(cudaMalloc((void **)&d_last, plane * 2));
        LIB_CHECK(target_forward(t, &b, d_states, d_last, err, sizeof err), err);
        CUDA_CHECK(cudaMemcpy(h, d_states, (size_t)k * plane * 2, cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(h + (size_t)k * plane, d_last, plane * 2, cudaMemcpyDeviceToHost));
        floats_from_bf16(states, h, (size_t)k * plane);
        floats_from_bf16(last, h + (size_t)k * plane, plane);
        cudaFree(d_states); cudaFree(d_last); free(h);
#endif
    }
    int32_t layers[TARGET_MAX_CAPTURE];
    for (int j = 0; j < k; j++) layers[j] = target_capture(t)[j];
    struct st_write_tensor w[6] = {
        {"states", ST_F32, 3, {k, T, C}, states},
        {"last", ST_F32, 2, {T, C}, last},
        {"input_ids", ST_I32, 1, {T}, ids},
        {"position_ids", ST_I32, 1, {T}, pos},
        {"cu_seqlens", ST_I32, 1, {nd + 1}, cu},
        {"layers", ST_I32, 1, {k}, layers},
    };
    LIB_CHECK(st_write_file(o->dump, 6, w, err, sizeof err), err);
    log_info("dumped %d captured layers + last of %d tokens in %d documents to %s (%s)", k, T, nd, o->dump,
             target_device(t) < 0 ? "fp32 CPU path" : "bf16 GPU path, widened to fp32");
    free(states); free(last); free(ids); free(pos); free(cu);
}

/* ---------------------------------------------------------------- ring mode */

/* Copy n bytes to a slot payload (host or device). */
static void put(const struct ring_slot *s, struct target *t, uint64_t off, const void *src, size_t n) {
    if (!n) return;
    if (!s->on_device) { memcpy((char *)s->payload + off, src, n); return; }
#ifdef DFLASH_CUDA
    /* Ordered before the forward on the model's stream; the forward synchronises at its end.
     * The source (the batches ring's host payload) stays valid: that slot is ours until release. */
    CUDA_CHECK(cudaMemcpyAsync((char *)s->payload + off, src, n, cudaMemcpyHostToDevice, target_stream(t)));
#else
    (void)t;
    DIE("GPU ring payload in a build without CUDA");
#endif
}

struct counters {
    uint64_t items_in, items_out, tokens;
    double busy_s, wait_s, t0, last_hb, hb_tokens, hb_t, tok_rate, flops, flop_rate;
};

static void heartbeat(struct bus *bus, struct counters *c, struct ring *in, struct ring *out, struct target *t,
                      int summary) {
    double now = time_mono_s();
    if (now - c->hb_t > 0) {
        c->tok_rate = (c->tokens - c->hb_tokens) / (now - c->hb_t);
        c->flop_rate = c->busy_s > 0 ? c->flops / c->busy_s : 0;   /* achieved while computing */
    }
    c->hb_tokens = (double)c->tokens;
    c->hb_t = now;
    struct ring_status st_in, st_out;
    ring_get_status(in, &st_in);
    ring_get_status(out, &st_out);
    struct bus_kv kv[] = {
        {BUS_K_ITEMS_IN, (double)c->items_in},
        {BUS_K_ITEMS_OUT, (double)c->items_out},
        {BUS_K_BUSY_S, c->busy_s},
        {BUS_K_WAIT_S, c->wait_s},
        {BUS_K_TOKENS_PER_S, c->tok_rate},
        {"tokens", (double)c->tokens},
        {"tflops_per_s_busy", c->flop_rate / 1e12},
        {"occ_batches", (double)st_in.n_ready},
        {"occ_hidden", (double)st_out.n_ready},
        {BUS_K_GPU_MEM, target_device(t) >= 0 ? (double)(target_weight_bytes(t) + target_work_bytes(t)) : 0},
        {"host_mem_bytes", target_device(t) < 0 ? (double)(target_weight_bytes(t) + target_work_bytes(t)) : 0},
    };
    int n = (int)(sizeof kv / sizeof kv[0]);
    if (summary) bus_summary(bus, kv, n);
    else bus_heartbeat(bus, kv, n);
}

static void ring_mode(const struct opts *o, struct target *t) {
    char err[1024];
    const struct model_config *cfg = target_config(t);
    int k = target_n_capture(t), H = cfg->hidden_size, dev = target_device(t);
    enum desc_dtype dtype = dev >= 0 ? DESC_DTYPE_BF16 : DESC_DTYPE_F32;

    ring_set_log(ring_log, NULL);
    check_hint("is dflash-shm running for this --run, with the rings named by --in/--out?");
    struct ring *in = ring_attach(o->common.run_dir, o->in_ring, RING_CONSUMER, o->wait_ms, err, sizeof err);
    if (!in) DIE("%s", err);
    struct ring *out = ring_attach(o->common.run_dir, o->out_ring, RING_PRODUCER, o->wait_ms, err, sizeof err);
    if (!out) DIE("%s", err);
    check_hint(NULL);
    uint64_t need = desc_hidden_max_payload_bytes((uint32_t)o->tokens, (uint32_t)k, (uint32_t)H, dtype);
    if (ring_expect(out, need, DESC_MAX_BYTES, -2, err, sizeof err))
        DIE("ring '%s' is too small for --tokens %d, %d layers of hidden size %d in %s: %s", o->out_ring, o->tokens,
            k, H, desc_dtype_name(dtype), err);
    const struct ring_spec *os = ring_get_spec(out);
    if (os->device >= 0 && dev < 0)
        DIE("ring '%s' has GPU payloads (cuda:%d) but this stage runs with --device cpu; create it with dev=host",
            o->out_ring, os->device);

    struct bus *bus = bus_open(o->common.run_dir, log_stage(), err, sizeof err);
    if (!bus) log_warn("metrics bus unavailable: %s (continuing without metrics)", err);
    struct counters c;
    memset(&c, 0, sizeof c);
    c.t0 = c.hb_t = time_mono_s();
    c.last_hb = c.t0 - o->heartbeat_s;   /* first heartbeat at once: the sink sees the stage start */
    char ids[512] = "";
    for (int j = 0, n = 0; j < k && n < (int)sizeof ids - 8; j++)
        n += snprintf(ids + n, sizeof ids - (size_t)n, "%s%d", j ? "," : "", target_capture(t)[j]);
    log_info("serving %s -> %s: layers [%s] + last, hidden %d, %s, up to %d tokens per batch", o->in_ring,
             o->out_ring, ids, H, desc_dtype_name(dtype), o->tokens);

    while (!stage_stopping()) {
        if (bus && time_mono_s() - c.last_hb >= o->heartbeat_s) {
            heartbeat(bus, &c, in, out, t, 0);
            c.last_hb = time_mono_s();
        }
        struct ring_slot is;
        double w0 = time_mono_s();
        if (bus) bus_set_waiting(bus, "ring batches: empty");
        int rc = ring_acquire_read(in, 500, &is);
        c.wait_s += time_mono_s() - w0;
        if (rc == RING_TIMEOUT) continue;
        if (rc == RING_END) break;
        if (rc < 0) DIE("ring '%s': %s", o->in_ring, ring_error());
        if (is.deliveries > 1) log_warn("batch seq %llu delivered again (a previous consumer died holding it)",
                                        (unsigned long long)is.seq);

        struct desc_batch bd;
        if (desc_batch_decode(is.desc, is.desc_len, is.payload_cap, &bd, err, sizeof err))
            DIE("ring '%s' slot %u (seq %llu): %s", o->in_ring, is.index, (unsigned long long)is.seq, err);
        if (desc_batch_check_payload(&bd, is.payload, cfg->vocab_size, err, sizeof err)) DIE("%s", err);
        if ((int)bd.n_tokens > o->tokens)
            DIE("batch seq %llu has %u tokens, more than --tokens %d this stage planned its memory for",
                (unsigned long long)bd.seq, bd.n_tokens, o->tokens);
        struct desc_batch_arrays ba;
        desc_batch_arrays(&bd, is.payload, &ba);

        struct ring_slot os_;
        w0 = time_mono_s();
        if (bus) bus_set_waiting(bus, "ring hidden: full");
        for (;;) {
            rc = ring_acquire_write(out, 500, &os_);
            if (rc != RING_TIMEOUT || stage_stopping()) break;
        }
        c.wait_s += time_mono_s() - w0;
        if (bus) bus_set_waiting(bus, NULL);
        if (rc != 0) {
            if (ring_unread(in, &is)) log_warn("ring '%s': %s", o->in_ring, ring_error());
            if (rc == RING_END) { log_info("ring '%s' closed; stopping", o->out_ring); break; }
            if (rc == RING_TIMEOUT) break;   /* stopping */
            DIE("ring '%s': %s", o->out_ring, ring_error());
        }

        double b0 = time_mono_s();
        struct desc_hidden hd;
        memset(&hd, 0, sizeof hd);
        hd.batch = bd;
        hd.n_layers = (uint32_t)k;
        for (int j = 0; j < k; j++) hd.layers[j] = target_capture(t)[j];
        hd.dtype = dtype;
        hd.hidden_size = (uint32_t)H;
        desc_hidden_layout(&hd);
        if (hd.batch.payload_bytes > os_.payload_cap)
            DIE("hidden item of batch seq %llu needs %llu payload bytes, ring '%s' slots hold %llu",
                (unsigned long long)bd.seq, (unsigned long long)hd.batch.payload_bytes, o->out_ring,
                (unsigned long long)os_.payload_cap);
        size_t T = bd.n_tokens, D = bd.n_docs;
        put(&os_, t, hd.batch.off_row_ids, ba.row_ids, D * 8);
        put(&os_, t, hd.batch.off_input_ids, ba.input_ids, T * 4);
        put(&os_, t, hd.batch.off_loss_mask, ba.loss_mask, T);
        put(&os_, t, hd.batch.off_position_ids, ba.position_ids, T * 4);
        put(&os_, t, hd.batch.off_doc_ids, ba.doc_ids, T * 4);
        put(&os_, t, hd.batch.off_cu_seqlens, ba.cu_seqlens, (D + 1) * 4);
        struct target_batch tb = {bd.seq, (int)T, (int)D, ba.input_ids, ba.position_ids, ba.cu_seqlens};
        if (target_forward(t, &tb, (char *)os_.payload + hd.off_states, (char *)os_.payload + hd.off_last, err,
                           sizeof err))
            DIE("%s", err);
        size_t dlen;
        if (desc_hidden_encode(&hd, os_.desc, os_.desc_cap, &dlen, err, sizeof err)) DIE("hidden descriptor: %s", err);
        /* Publish downstream first, release upstream second (design.md §4). */
        if (ring_publish(out, &os_, bd.seq, (uint32_t)dlen, hd.batch.payload_bytes))
            DIE("ring '%s': %s", o->out_ring, ring_error());
        if (ring_release(in, &is)) DIE("ring '%s': %s", o->in_ring, ring_error());
        double dt = time_mono_s() - b0, flops = target_flops(t, ba.cu_seqlens, (int)D);
        c.busy_s += dt;
        c.items_in++;
        c.items_out++;
        c.tokens += T;
        c.flops += flops;
        if (bus) {   /* one record per batch (step = its seq): metrics.csv and the plots */
            struct bus_kv kv[] = {
                {"tokens", (double)T},
                {BUS_K_TOKENS_PER_S, dt > 0 ? (double)T / dt : 0},
                {"batch_s", dt},
                {"tflops_per_s", dt > 0 ? flops / dt / 1e12 : 0},
            };
            bus_metric(bus, (int64_t)bd.seq, kv, (int)(sizeof kv / sizeof kv[0]));
        }
        log_debug("batch seq %llu: %zu tokens, %zu docs", (unsigned long long)bd.seq, T, D);
    }
    if (!stage_stopping() && ring_is_drained(in)) {
        if (ring_mark_drained(out)) log_warn("ring '%s': %s", o->out_ring, ring_error());
        log_info("end of stream: %llu batches, %llu tokens, busy %.1f s, waiting %.1f s",
                 (unsigned long long)c.items_out, (unsigned long long)c.tokens, c.busy_s, c.wait_s);
    } else if (stage_stopping()) {
        log_info("stopping on signal %d after %llu batches", stage_stop_signal(), (unsigned long long)c.items_out);
    }
    if (bus) { heartbeat(bus, &c, in, out, t, 1); bus_close(bus); }
    ring_close(in);
    ring_close(out);
}

int main(int argc, char **argv) {
    log_init("dflash-target");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    o.draft_layers = TARGET_DEFAULT_DRAFT_LAYERS;
    o.tokens = 8192;
    o.in_ring = "batches";
    o.out_ring = "hidden";
    o.wait_ms = 60000;
    o.heartbeat_s = 1.0;
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"model", FLAG_STRING, &o.model, "Hugging Face checkpoint directory (config.json + safetensors)", 1, 0},
        {"layers", FLAG_STRING, &o.layers, "captured layer ids, z-lab convention (output of decoder layer i), "
                                           "e.g. 1,9,17,25,33; default: the z-lab formula for --draft-layers", 1, 0},
        {"draft-layers", FLAG_INT, &o.draft_layers, "draft layers the default --layers formula is for", 1, 64},
        {"tokens", FLAG_INT, &o.tokens, "largest batch (tokens) to expect: sizes the working memory once", 1, 1 << 24},
        {"in", FLAG_STRING, &o.in_ring, "input ring (batch descriptors, host payload)", 1, 0},
        {"out", FLAG_STRING, &o.out_ring, "output ring (hidden descriptors; GPU payload, host with --device cpu)", 1, 0},
        {"wait-ms", FLAG_INT, &o.wait_ms, "how long to wait for the rings to appear", 0, INT_MAX},
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats", 1, 0},
        {"docs", FLAG_STRING, &o.docs, "dump mode: JSON documents {\"docs\": [[ids...], ...]} packed into one batch", 1, 0},
        {"dump", FLAG_STRING, &o.dump, "dump mode: write captured states (fp32 safetensors: states [k,T,H], last, "
                                       "input_ids, position_ids, cu_seqlens, layers) here; no rings", 1, 0},
        {"ring-bytes", FLAG_BOOL, &o.ring_bytes, "print the payload bytes a `hidden` ring slot needs for this model, "
                                                  "--tokens, --layers and --device, then exit (for dflash-shm --ring)", 1, 0},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--model DIR [--run DIR] [--device cpu|cuda:N] [--layers IDS] [--tokens N]",
                        "The frozen target stage: reads packed batches from the `batches` ring, runs the target model "
                        "and writes the captured hidden states (z-lab layer ids plus the last decoder layer before the "
                        "final norm) to the `hidden` ring. Releases each batch only after its hidden item is "
                        "published, so a SIGKILL and restart loses nothing; several replicas may share the rings.",
                        NULL, 0);
    if (!o.model) { fprintf(stderr, "dflash-target: --model DIR is required (see --help)\n"); return 2; }
    if (o.ring_bytes) {
        /* Sizing for pipeline scripts: needs only config.json, no weights and no run directory. */
        struct model_config cfg;
        char err[1024];
        int dev = -1;
        if (stage_parse_device(o.common.device, &dev, err, sizeof err)) { fprintf(stderr, "dflash-target: %s\n", err); return 2; }
        LIB_CHECK(hf_config_load(&cfg, o.model, err, sizeof err), err);
        struct target_options t2;
        target_options_defaults(&t2);
        if (o.layers) parse_layers(o.layers, &t2);
        else t2.n_capture = o.draft_layers;
        printf("%llu\n", (unsigned long long)desc_hidden_max_payload_bytes((uint32_t)o.tokens, (uint32_t)t2.n_capture,
                                                                         (uint32_t)cfg.hidden_size,
                                                                         dev >= 0 ? DESC_DTYPE_BF16 : DESC_DTYPE_F32));
        return 0;
    }
    int dump = o.docs || o.dump;
    if (dump && !(o.docs && o.dump)) { fprintf(stderr, "dflash-target: --docs and --dump go together\n"); return 2; }
    stage_start(&o.common, !dump);

    struct target_options topt;
    target_options_defaults(&topt);
    topt.cuda_device = o.common.cuda_device;
    topt.max_tokens = o.tokens;
    if (o.layers) parse_layers(o.layers, &topt);
    else {
        const char *e = NULL;
        struct model_config cfg;
        char err[1024];
        LIB_CHECK(hf_config_load(&cfg, o.model, err, sizeof err), err);
        topt.n_capture = o.draft_layers;
        if (hf_zlab_layer_ids(cfg.num_hidden_layers, o.draft_layers, topt.capture)) e = "does not fit";
        if (e) DIE("the z-lab default layer ids for %d draft layers do not fit a %d-layer target; pass --layers",
                   o.draft_layers, cfg.num_hidden_layers);
    }
    char err[1024];
    double t0 = time_mono_s();
    struct target *t = target_load(o.model, &topt, err, sizeof err);
    if (!t) DIE("%s", err);
    char ids[512] = "";
    for (int j = 0, n = 0; j < target_n_capture(t) && n < (int)sizeof ids - 8; j++)
        n += snprintf(ids + n, sizeof ids - (size_t)n, "%s%d", j ? "," : "", target_capture(t)[j]);
    log_info("loaded %s (%s, %d layers, hidden %d) on %s in %.1f s: weights %.2f GB, working memory %.2f GB for %d "
             "tokens; capturing layers [%s] + last", o.model, target_config(t)->architecture,
             target_config(t)->num_hidden_layers, target_config(t)->hidden_size,
             target_device(t) < 0 ? "cpu (fp32)" : "cuda (bf16)", time_mono_s() - t0,
             (double)target_weight_bytes(t) / 1e9, (double)target_work_bytes(t) / 1e9, o.tokens, ids);
    if (dump) dump_mode(&o, t);
    else ring_mode(&o, t);
    target_free(t);
    return 0;
}
