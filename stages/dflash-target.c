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
 * drops the second copy.) Several replicas may attach to the same rings (issue 29): each batch is
 * claimed by exactly one (the ring's CAS), and when the plan says target_replicas > 1 each replica
 * claims its hidden slot BEFORE the batch (relay out_first), so the replica computing the seq dflash-hspack waits for always has a slot to
 * publish it in, however far its peers ran ahead.
 *
 * --docs FILE --dump OUT is a mode without rings for cross-checks (scripts/compare_hf.py): the
 * documents of FILE (JSON: {"docs": [[ids...], ...]} or [[ids...], ...]) are packed into one
 * batch, positions reset per document, and the states are written as fp32 safetensors.
 */
#include "core/bus.h"
#include "core/check.h"
#include "core/desc.h"
#include "core/err.h"
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/relay.h"
#include "core/rings.h"
#include "core/stage.h"
#include "plan/plan.h"
#include "core/safetensors.h"
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
    int layers[TARGET_MAX_CAPTURE], n_layers;   /* --layers; n_layers 0: the z-lab default */
    int draft_layers;
    int tokens;
    const char *in_ring, *out_ring;
    int wait_ms;
    double heartbeat_s;
    const char *docs, *dump;
    int print_spec, spec_slots;
    uint64_t plan;                              /* the run plan's hash (0: no plan.json in --run) */
    int replicas;                               /* the plan's target_replicas (1 without a plan) */
};

/* "1,9,17" of the target's captured layer ids into buf. */
static const char *layer_list(const struct target *t, char *buf, size_t len) {
    buf[0] = 0;
    for (int j = 0, n = 0; j < target_n_capture(t) && n < (int)len - 12; j++)
        n += snprintf(buf + n, len - (size_t)n, "%s%d", j ? "," : "", target_capture(t)[j]);
    return buf;
}

/* The capture list: --layers, else the z-lab formula for --draft-layers on this target. */
static void capture_layers(const struct opts *o, const struct model_config *cfg, struct target_options *t) {
    if (o->n_layers) {
        t->n_capture = o->n_layers;
        memcpy(t->capture, o->layers, (size_t)o->n_layers * sizeof o->layers[0]);
        return;
    }
    t->n_capture = o->draft_layers;
    if (hf_zlab_layer_ids(cfg->num_hidden_layers, o->draft_layers, t->capture))
        DIE("the z-lab default layer ids for %d draft layers do not fit a %d-layer target; pass --layers",
            o->draft_layers, cfg->num_hidden_layers);
}

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

/* The transform's state for the relay callbacks. */
struct tstage {
    const struct opts *o;
    struct target *t;
    int k, H;
    enum desc_dtype dtype;
    uint64_t target_id;    /* desc_target_id of --model: every hidden item names its target */
    double flops;          /* cumulative, for tflops_per_s_busy */
    double item_flops;     /* of the last item, for its metric record */
    struct relay *relay_;  /* for busy_s in heartbeats */
};

/* One batch -> one hidden item: check the batch (token ids, budget), copy its arrays into the
 * hidden slot, run the forward straight into the slot's payload (the forward synchronises its
 * stream, so the device writes are complete when this returns, as ring_publish needs). */
static int compute_hidden(void *ctx, struct relay_item *it, char *err, int err_len) {
    struct tstage *ts = ctx;
    const struct ring_slot *is = it->in;
    struct ring_slot *os = it->out;
    const struct model_config *cfg = target_config(ts->t);
    struct desc_batch bd;
    char e2[768];
    if (desc_batch_decode(is->desc, is->desc_len, is->payload_cap, &bd, e2, sizeof e2))
        return err_fail(err, err_len, "ring '%s' slot %u (seq %llu): %s", ts->o->in_ring, is->index,
                        (unsigned long long)is->seq, e2);
    if (desc_check_plan(&bd, ts->o->plan, ts->o->in_ring, err, err_len)) return -1;
    if (desc_batch_check_payload(&bd, is->payload, cfg->vocab_size, err, err_len)) return -1;
    if (rings_check_budget(bd.seq, bd.n_tokens, bd.budget, (uint32_t)ts->o->tokens, err, err_len)) return -1;
    struct desc_batch_arrays ba;
    desc_batch_arrays(&bd, is->payload, &ba);

    struct desc_hidden hd;
    memset(&hd, 0, sizeof hd);
    hd.batch = bd;
    hd.n_layers = (uint32_t)ts->k;
    for (int j = 0; j < ts->k; j++) hd.layers[j] = target_capture(ts->t)[j];
    hd.dtype = ts->dtype;
    hd.hidden_size = (uint32_t)ts->H;
    hd.target_id = ts->target_id;
    desc_hidden_layout(&hd);
    if (hd.batch.payload_bytes > os->payload_cap)
        return err_fail(err, err_len, "hidden item of batch seq %llu needs %llu payload bytes, ring '%s' slots hold %llu",
                        (unsigned long long)bd.seq, (unsigned long long)hd.batch.payload_bytes, ts->o->out_ring,
                        (unsigned long long)os->payload_cap);
    size_t T = bd.n_tokens, D = bd.n_docs;
    /* Ordered before the forward on the model's stream; the source (the batch slot's host
     * payload) stays ours until the relay releases it after the publish. */
    void *stream = NULL;
#ifdef DFLASH_CUDA
    stream = target_stream(ts->t);
#endif
    struct { uint64_t off; const void *src; size_t n; } parts[] = {
        {hd.batch.off_row_ids, ba.row_ids, D * 8},
        {hd.batch.off_input_ids, ba.input_ids, T * 4},
        {hd.batch.off_loss_mask, ba.loss_mask, T},
        {hd.batch.off_position_ids, ba.position_ids, T * 4},
        {hd.batch.off_doc_ids, ba.doc_ids, T * 4},
        {hd.batch.off_cu_seqlens, ba.cu_seqlens, (D + 1) * 4},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
        if (relay_slot_put(os, parts[i].off, parts[i].src, -1, parts[i].n, stream, err, err_len)) return -1;
    struct target_batch tb = {bd.seq, (int)T, (int)D, ba.input_ids, ba.position_ids, ba.cu_seqlens};
    if (target_forward(ts->t, &tb, (char *)os->payload + hd.off_states, (char *)os->payload + hd.off_last, err, err_len))
        return -1;
    size_t dlen;
    if (desc_hidden_encode(&hd, os->desc, os->desc_cap, &dlen, e2, sizeof e2))
        return err_fail(err, err_len, "hidden descriptor: %s", e2);
    it->seq = bd.seq;
    it->desc_len = (uint32_t)dlen;
    it->payload_len = hd.batch.payload_bytes;
    it->n_tokens = T;
    ts->item_flops = target_flops(ts->t, ba.cu_seqlens, (int)D);
    ts->flops += ts->item_flops;
    return RELAY_DONE;
}

static int target_heartbeat_kv(void *ctx, struct bus_kv *kv, int max) {
    struct tstage *ts = ctx;
    if (max < 3) return 0;
    double busy = relay_stats(ts->relay_)->busy_s;
    double mem = (double)(target_weight_bytes(ts->t) + target_work_bytes(ts->t));
    int gpu = target_device(ts->t) >= 0;
    kv[0] = (struct bus_kv){"tflops_per_s_busy", busy > 0 ? ts->flops / busy / 1e12 : 0};   /* achieved while computing */
    kv[1] = (struct bus_kv){BUS_K_GPU_MEM, gpu ? mem : 0};
    kv[2] = (struct bus_kv){"host_mem_bytes", gpu ? 0 : mem};
    return 3;
}

/* One record per batch (step = its seq): metrics.csv and the plots. */
static int target_metric(void *ctx, const struct relay_item *it, struct bus_kv *kv, int max) {
    struct tstage *ts = ctx;
    if (max < 4) return 0;
    double dt = it->busy_s, T = (double)it->n_tokens;
    kv[0] = (struct bus_kv){"tokens", T};
    kv[1] = (struct bus_kv){BUS_K_TOKENS_PER_S, dt > 0 ? T / dt : 0};
    kv[2] = (struct bus_kv){"batch_s", dt};
    kv[3] = (struct bus_kv){"tflops_per_s", dt > 0 ? ts->item_flops / dt / 1e12 : 0};
    return 4;
}

static int ring_mode(const struct opts *o, struct target *t) {
    char err[1024];
    struct tstage ts = {.o = o, .t = t, .k = target_n_capture(t), .H = target_config(t)->hidden_size};
    int dev = target_device(t);
    ts.dtype = dev >= 0 ? DESC_DTYPE_BF16 : DESC_DTYPE_F32;
    LIB_CHECK(desc_target_id_of_model(o->model, &ts.target_id, err, sizeof err), err);
    struct relay_config rc = {
        .run_dir = o->common.run_dir, .in_ring = o->in_ring, .out_ring = o->out_ring,
        .attach_wait_ms = o->wait_ms, .heartbeat_s = o->heartbeat_s, .use_bus = 1, .item_name = "batch",
        .ctx = &ts, .compute = compute_hidden, .heartbeat_kv = target_heartbeat_kv, .metric = target_metric,
        .plan = o->plan, .out_first = o->replicas > 1,   /* replicas: the holder of any seq can always publish it */
    };
    check_hint("is dflash-shm running for this --run, with the rings named by --in/--out?");
    struct relay *r = relay_open(&rc, err, sizeof err);
    if (!r) DIE("%s", err);
    check_hint(NULL);
    ts.relay_ = r;
    struct rings_geometry g = {(uint32_t)o->tokens, (uint32_t)ts.k, (uint32_t)ts.H, ts.dtype};
    uint64_t need = rings_payload_bytes(DESC_KIND_HIDDEN, &g);
    if (ring_expect(relay_out(r), need, DESC_MAX_BYTES, -2, err, sizeof err))
        DIE("ring '%s' is too small for --tokens %d, %d layers of hidden size %d in %s: %s", o->out_ring, o->tokens,
            ts.k, ts.H, desc_dtype_name(ts.dtype), err);
    const struct ring_spec *os = ring_get_spec(relay_out(r));
    if (os->device >= 0 && dev < 0)
        DIE("ring '%s' has GPU payloads (cuda:%d) but this stage runs with --device cpu; create it with dev=host",
            o->out_ring, os->device);
    char ids[512];
    log_info("serving %s -> %s: layers [%s] + last, hidden %d, %s, up to %d tokens per batch", o->in_ring,
             o->out_ring, layer_list(t, ids, sizeof ids), ts.H, desc_dtype_name(ts.dtype), o->tokens);
    int res = relay_run(r, err, sizeof err);
    if (res < 0) log_error("%s", err);
    relay_close(r);
    return relay_exit_code(res);
}

int main(int argc, char **argv) {
    log_init("dflash-target");
    struct opts o;
    memset(&o, 0, sizeof o);
    stage_common_defaults(&o.common);
    o.draft_layers = TARGET_DEFAULT_DRAFT_LAYERS;
    o.tokens = 8192;
    o.in_ring = RING_NAME_BATCHES;
    o.out_ring = RING_NAME_HIDDEN;
    o.wait_ms = 60000;
    o.heartbeat_s = 1.0;
    o.spec_slots = RINGS_DEFAULT_SLOTS;
    struct flag_list layers = {o.layers, &o.n_layers, TARGET_MAX_CAPTURE, NULL};
    struct flag table[] = {
        STAGE_COMMON_FLAGS(&o.common),
        {"model", FLAG_STRING, &o.model, "Hugging Face checkpoint directory (config.json + safetensors)", 1, 0},
        {"layers", FLAG_LIST, &layers, "captured layer ids, z-lab convention (output of decoder layer i), "
                                       "e.g. 1,9,17,25,33; default: the z-lab formula for --draft-layers", 0, INT_MAX},
        {"draft-layers", FLAG_INT, &o.draft_layers, "draft layers the default --layers formula is for", 1, 64},
        {"tokens", FLAG_INT, &o.tokens, "largest batch (tokens) to expect: sizes the working memory once", 1, 1 << 24},
        {"in", FLAG_STRING, &o.in_ring, "input ring (batch descriptors, host payload)", 1, 0},
        {"out", FLAG_STRING, &o.out_ring, "output ring (hidden descriptors; GPU payload, host with --device cpu)", 1, 0},
        {"wait-ms", FLAG_INT, &o.wait_ms, "how long to wait for the rings to appear", 0, INT_MAX},
        {"heartbeat-s", FLAG_DOUBLE, &o.heartbeat_s, "seconds between metrics heartbeats (0: 1 s)", 0, 86400},
        {"docs", FLAG_STRING, &o.docs, "dump mode: JSON documents {\"docs\": [[ids...], ...]} packed into one batch", 1, 0},
        {"dump", FLAG_STRING, &o.dump, "dump mode: write captured states (fp32 safetensors: states [k,T,H], last, "
                                       "input_ids, position_ids, cu_seqlens, layers) here; no rings", 1, 0},
        RINGS_SPEC_FLAGS(&o.print_spec, &o.spec_slots),
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--model DIR [--run DIR] [--device cpu|cuda:N] [--layers IDS] [--tokens N]",
                        "The frozen target stage: reads packed batches from the `batches` ring, runs the target model "
                        "and writes the captured hidden states (z-lab layer ids plus the last decoder layer before the "
                        "final norm) to the `hidden` ring. Releases each batch only after its hidden item is "
                        "published, so a SIGKILL and restart loses nothing; several replicas may share the rings. "
                        "Exit 0 at end of stream, 3 when stopped by a signal before it.",
                        NULL, 0);
    char err[1024];
    /* The run plan (RUN/plan.json, stages/plan/plan.h) owns the model, budget, captured ids and device. */
    struct plan plan;
    int have_plan = o.docs ? 0 : plan_open_run(o.common.run_dir, &plan, err, sizeof err);
    if (have_plan < 0) { fprintf(stderr, "dflash-target: %s\n", err); return 2; }
    if (have_plan) {
        if (plan_bind_str(&plan, "model", flags_given(argc, argv, "model"), &o.model, plan.model, "model", err,
                          sizeof err) ||
            plan_bind_int(&plan, "tokens", flags_given(argc, argv, "tokens"), &o.tokens, plan.tokens, "tokens", err,
                          sizeof err) ||
            plan_bind_list(&plan, "layers", flags_given(argc, argv, "layers"), o.layers, &o.n_layers, plan.ids,
                           plan.n_ids, "capture.layer_ids", err, sizeof err) ||
            plan_bind_device(&plan, flags_given(argc, argv, "device"), &o.common.device, plan.device, err, sizeof err)) {
            fprintf(stderr, "dflash-target: %s\n", err);
            return 2;
        }
        o.plan = plan.hash;
        o.replicas = plan.target_replicas;
    }
    if (!o.model) { fprintf(stderr, "dflash-target: --model DIR is required (see --help)\n"); return 2; }
    if (o.print_spec) {
        /* Sizing for pipeline scripts: needs only config.json, no weights and no run directory. */
        struct model_config cfg;
        int dev = -1;
        if (stage_parse_device(o.common.device, &dev, err, sizeof err)) { fprintf(stderr, "dflash-target: %s\n", err); return 2; }
        LIB_CHECK(hf_config_load(&cfg, o.model, err, sizeof err), err);
        struct target_options t2;
        target_options_defaults(&t2);
        capture_layers(&o, &cfg, &t2);
        struct rings_geometry g = {(uint32_t)o.tokens, (uint32_t)t2.n_capture, (uint32_t)cfg.hidden_size,
                                   dev >= 0 ? DESC_DTYPE_BF16 : DESC_DTYPE_F32};
        char spec[256];
        LIB_CHECK(rings_format_spec(spec, sizeof spec, o.out_ring, (uint32_t)o.spec_slots, DESC_KIND_HIDDEN, &g, dev, err,
                                    sizeof err), err);
        printf("%s\n", spec);
        return 0;
    }
    int dump = o.docs || o.dump;
    if (dump && !(o.docs && o.dump)) { fprintf(stderr, "dflash-target: --docs and --dump go together\n"); return 2; }
    stage_start(&o.common, !dump);

    struct target_options topt;
    target_options_defaults(&topt);
    topt.cuda_device = o.common.cuda_device;
    topt.max_tokens = o.tokens;
    struct model_config cfg;
    LIB_CHECK(hf_config_load(&cfg, o.model, err, sizeof err), err);
    capture_layers(&o, &cfg, &topt);
    double t0 = time_mono_s();
    struct target *t = target_load(o.model, &topt, err, sizeof err);
    if (!t) DIE("%s", err);
    char ids[512];
    log_info("loaded %s (%s, %d layers, hidden %d) on %s in %.1f s: weights %.2f GB, working memory %.2f GB for %d "
             "tokens; capturing layers [%s] + last", o.model, target_config(t)->architecture,
             target_config(t)->num_hidden_layers, target_config(t)->hidden_size,
             target_device(t) < 0 ? "cpu (fp32)" : "cuda (bf16)", time_mono_s() - t0,
             (double)target_weight_bytes(t) / 1e9, (double)target_work_bytes(t) / 1e9, o.tokens,
             layer_list(t, ids, sizeof ids));
    int rc = 0;
    if (dump) dump_mode(&o, t);
    else rc = ring_mode(&o, t);
    target_free(t);
    return rc;
}
