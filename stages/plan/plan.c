/*
 * stages/plan/plan.c — the run plan (plan.h): made from dflash-plan's inputs, written and read as
 * RUN/plan.json, and bound to the stages' flags.
 */
#include "plan/plan.h"

#include "core/dataset.h"
#include "core/err.h"
#include "core/fsutil.h"
#include "pack/packer.h"
#include "core/rings.h"
#include "model/hfconfig.h"
#include "train/drafter.h"

#include "kernels/attention.h"
#include "kernels/block_attn.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[] = {"sliding", "full", NULL};   /* DRAFTER_LAYER_* order */

const char *plan_format_ids(const int *ids, int n, char *buf, int len) {
    buf[0] = 0;
    for (int i = 0, o = 0; i < n && o < len - 12; i++) o += snprintf(buf + o, (size_t)(len - o), "%s%d", i ? "," : "", ids[i]);
    return buf;
}

int plan_default_layer_ids(int n_target, int n_draft, int *ids, char *err, int err_len) {
    if (n_draft < 1 || n_draft > DESC_MAX_LAYERS || hf_zlab_layer_ids(n_target, n_draft, ids))
        return err_fail(err, err_len, "the z-lab default layer ids for %d draft layers do not fit a %d-layer target; "
                        "give the captured ids (--layers)", n_draft, n_target);
    return 0;
}

/* ---------------------------------------------------------------- JSON */

static json_t *to_json(const struct plan *p, int with_hash, int with_host) {
    json_t *j = json_object(), *ids = json_array(), *types = json_array(), *rings = json_array();
    for (int i = 0; i < p->n_ids; i++) json_array_append_new(ids, json_integer(p->ids[i]));
    for (int l = 0; l < p->draft_layers; l++) json_array_append_new(types, json_string(type_names[p->layer_types[l]]));
    for (int r = 0; r < p->n_rings; r++) json_array_append_new(rings, json_string(p->rings[r]));
    json_object_set_new(j, "kind", json_string("dflash-plan"));
    json_object_set_new(j, "version", json_integer(PLAN_VERSION));
    if (with_hash) {
        char h[24];
        snprintf(h, sizeof h, "%016llx", (unsigned long long)p->hash);
        json_object_set_new(j, "hash", json_string(h));
    }
    json_object_set_new(j, "model", json_string(p->model));
    json_object_set_new(j, "data", json_string(p->data));
    json_object_set_new(j, "device", json_string(p->device));
    json_object_set_new(j, "train_device", json_string(p->train_device));
    json_object_set_new(j, "tokens", json_integer(p->tokens));
    json_object_set_new(j, "target", json_pack("{s:i, s:i}", "layers", p->target_layers, "hidden_size", p->hidden_size));
    json_object_set_new(j, "capture", json_pack("{s:s, s:o}", "convention", "zlab", "layer_ids", ids));
    json_object_set_new(j, "dtype", json_string(desc_dtype_name(p->dtype)));
    json_object_set_new(j, "drafter", json_pack("{s:o, s:i}", "layer_types", types, "block_size", p->block_size));
    json_object_set_new(j, "seed", json_integer(p->seed));
    json_object_set_new(j, "window", json_integer(p->window));
    json_object_set_new(j, "epochs", json_integer(p->epochs));
    json_object_set_new(j, "steps", json_integer(p->steps));
    json_object_set_new(j, "grad_accum", json_integer(p->grad_accum));
    json_object_set_new(j, "batches", json_integer(p->batches));
    /* written only when > 1, so the plans (and hashes) of one-replica runs stay what they were */
    if (p->target_replicas > 1) json_object_set_new(j, "target_replicas", json_integer(p->target_replicas));
    if (p->ranks > 1) json_object_set_new(j, "ranks", json_integer(p->ranks));
    if (p->hosts > 1) json_object_set_new(j, "hosts", json_integer(p->hosts));
    /* where a copy runs, not what the run computes: outside the hash (every host's rings carry the run's hash) */
    if (with_host && p->hosts > 1 && p->host >= 0) json_object_set_new(j, "host", json_integer(p->host));
    json_object_set_new(j, "rings", rings);
    return j;
}

uint64_t plan_compute_hash(const struct plan *p) {
    json_t *j = to_json(p, 0, 0);
    char *text = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(j);
    uint64_t h = 0xcbf29ce484222325ull;   /* FNV-1a 64 */
    for (const unsigned char *c = (const unsigned char *)(text ? text : ""); *c; c++) h = (h ^ *c) * 0x100000001b3ull;
    free(text);
    return h ? h : 1;   /* 0 means "no plan" in a ring header */
}

static int rings_of(struct plan *p, int slots, char *err, int err_len) {
    int dev = -1;
    if (strcmp(p->device, "cpu") != 0 && sscanf(p->device, "cuda:%d", &dev) != 1)
        return err_fail(err, err_len, "device '%s': expected cpu or cuda:N", p->device);
    struct rings_geometry g = {p->tokens, (uint32_t)p->n_ids, (uint32_t)p->hidden_size, p->dtype};
    p->n_rings = 3;
    /* R target replicas: each holds one hidden slot while it waits for a batch (relay out_first), so hidden gets
     * R - 1 more slots; producers=R so the first replica to see the end cannot end the stream alone */
    int R = p->target_replicas > 1 ? p->target_replicas : 1;
    if (rings_format_spec(p->rings[0], sizeof p->rings[0], RING_NAME_BATCHES, (uint32_t)slots, DESC_KIND_BATCH, &g, -1,
                          err, err_len) ||
        rings_format_spec(p->rings[1], sizeof p->rings[1], RING_NAME_HIDDEN, (uint32_t)(slots + R - 1), DESC_KIND_HIDDEN,
                          &g, dev, err, err_len) ||
        rings_format_spec(p->rings[2], sizeof p->rings[2], RING_NAME_FEATURES, (uint32_t)slots, DESC_KIND_FEATURES, &g,
                          dev, err, err_len))
        return -1;
    if (R > 1) {
        size_t n = strlen(p->rings[1]);
        if (snprintf(p->rings[1] + n, sizeof p->rings[1] - n, ",producers=%d", R) >= (int)(sizeof p->rings[1] - n))
            return err_fail(err, err_len, "ring 'hidden': spec line does not fit %zu bytes", sizeof p->rings[1]);
    }
    return 0;
}

/* The ranks and hosts rules, one sentence each (plan_make and plan_read). */
static int check_ranks(const struct plan *p, const char *where, char *err, int err_len) {
    if (p->hosts < 1 || p->ranks < 1) return err_fail(err, err_len, "%s: ranks and hosts must be >= 1", where);
    if (p->hosts > PLAN_MAX_HOSTS) return err_fail(err, err_len, "%s: hosts %d: at most %d", where, p->hosts, PLAN_MAX_HOSTS);
    if (p->ranks % p->hosts)
        return err_fail(err, err_len, "%s: %d trainer ranks do not divide over %d hosts (every host runs ranks / hosts "
                        "ranks)", where, p->ranks, p->hosts);
    if (p->grad_accum % p->ranks)
        return err_fail(err, err_len, "%s: grad_accum %d (the step's batches over all ranks) does not divide by the %d "
                        "trainer ranks", where, p->grad_accum, p->ranks);
    if (p->host >= 0 && p->hosts <= 1)
        return err_fail(err, err_len, "%s: key 'host' in a plan without hosts (hosts 1)", where);
    if (p->host >= 0 && p->host >= p->hosts)
        return err_fail(err, err_len, "%s: host %d is outside the plan's %d hosts", where, p->host, p->hosts);
    return 0;
}

static int abs_path(const char *in, char *out, size_t cap, const char *what, char *err, int err_len) {
    char tmp[PATH_MAX];
    if (!realpath(in, tmp)) return err_fail(err, err_len, "%s %s does not exist", what, in);
    if (strlen(tmp) >= cap) return err_fail(err, err_len, "%s path %s is too long", what, tmp);
    strcpy(out, tmp);
    return 0;
}

int plan_make(const struct plan_inputs *in, struct plan *p, char *err, int err_len) {
    memset(p, 0, sizeof *p);
    if (!in->model || !in->data) return err_fail(err, err_len, "a plan needs the model directory and the dataset");
    if (abs_path(in->model, p->model, sizeof p->model, "model directory", err, err_len) ||
        abs_path(in->data, p->data, sizeof p->data, "dataset", err, err_len))
        return -1;
    snprintf(p->device, sizeof p->device, "%s", in->device ? in->device : "cpu");
    snprintf(p->train_device, sizeof p->train_device, "%s", in->train_device ? in->train_device : p->device);
    int tdev;
    if (strcmp(p->train_device, "cpu") && sscanf(p->train_device, "cuda:%d", &tdev) != 1)
        return err_fail(err, err_len, "train device '%s': expected cpu or cuda:N", p->train_device);
    p->tokens = in->tokens > 0 ? (uint32_t)in->tokens : PLAN_DEFAULT_TOKENS;
    char cfg_path[PATH_MAX + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", p->model);
    struct model_config mc;
    if (hf_config_load(&mc, cfg_path, err, err_len)) return -1;
    p->target_layers = mc.num_hidden_layers;
    p->hidden_size = mc.hidden_size;
    {   /* a shape the GPU attention kernels do not take is refused here, before any stage starts (issue 27) */
        char aerr[320];
        if (strcmp(p->device, "cpu") &&
            attention_shape_supported(mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, aerr, sizeof aerr))
            return err_fail(err, err_len, "%s: %s", cfg_path, aerr);
        block_attn_config ac = {1, 1, in->block_size > 0 ? in->block_size : 16, mc.num_attention_heads,
                                mc.num_key_value_heads, mc.head_dim, 0, 0, 1.0f};
        if (strcmp(p->train_device, "cpu") && block_attn_shape_supported(&ac, aerr, sizeof aerr))
            return err_fail(err, err_len, "%s: the drafter inherits the target's attention shape: %s", cfg_path, aerr);
    }
    p->dtype = strcmp(p->device, "cpu") ? DESC_DTYPE_BF16 : DESC_DTYPE_F32;

    struct drafter_config dc;
    drafter_config_defaults(&dc);   /* the drafter's defaults are defined once, there */
    if (in->layer_types && drafter_parse_layer_types(&dc, in->layer_types, err, err_len)) return -1;
    p->draft_layers = dc.L;
    memcpy(p->layer_types, dc.layer_type, (size_t)dc.L * sizeof dc.layer_type[0]);
    p->block_size = in->block_size > 0 ? in->block_size : dc.B;
    if (in->n_ids > 0) {
        p->n_ids = in->n_ids;
        memcpy(p->ids, in->ids, (size_t)in->n_ids * sizeof in->ids[0]);
        for (int i = 0; i < p->n_ids; i++)
            if (p->ids[i] < 0 || p->ids[i] >= p->target_layers)
                return err_fail(err, err_len, "captured layer id %d is outside the target's %d layers (0..%d)", p->ids[i],
                                p->target_layers, p->target_layers - 1);
    } else {
        p->n_ids = p->draft_layers;
        if (plan_default_layer_ids(p->target_layers, p->draft_layers, p->ids, err, err_len)) return -1;
    }
    p->seed = in->seed >= 0 ? in->seed : PLAN_DEFAULT_SEED;
    p->window = in->window > 0 ? in->window : PLAN_DEFAULT_WINDOW;
    p->epochs = in->epochs > 0 ? in->epochs : 1;
    p->grad_accum = in->grad_accum > 0 ? in->grad_accum : 1;
    p->target_replicas = in->target_replicas > 0 ? in->target_replicas : 1;
    if (p->target_replicas > PLAN_MAX_TARGET_REPLICAS)
        return err_fail(err, err_len, "target replicas %d: at most %d", p->target_replicas, PLAN_MAX_TARGET_REPLICAS);
    p->ranks = in->ranks > 0 ? in->ranks : 1;
    p->hosts = in->hosts > 0 ? in->hosts : 1;
    p->host = -1;
    if (check_ranks(p, "dflash-plan", err, err_len)) return -1;
    if (in->steps > 0) {
        p->steps = in->steps;
    } else {   /* the packer's own count of the epochs' batches, without writing a batch */
        struct dataset ds;
        struct packer pk;
        if (dataset_open(&ds, p->data, NULL, NULL, 0, err, err_len)) return -1;
        struct packer_config pc = {.budget = p->tokens, .window = (uint32_t)p->window, .seed = (uint64_t)p->seed,
                                   .n_shards = 1, .epochs = (uint32_t)p->epochs};
        if (packer_init(&pk, &ds, &pc, err, err_len)) { dataset_free(&ds); return -1; }
        int64_t total = 0;
        for (int e = 0; e < p->epochs; e++) {
            int64_t n = packer_epoch_batches(&pk, (uint32_t)e, err, err_len);
            if (n < 0) { packer_free(&pk); dataset_free(&ds); return -1; }
            total += n;
        }
        packer_free(&pk);
        dataset_free(&ds);
        if (total <= 0) return err_fail(err, err_len, "%s gives no batch of %u tokens", p->data, p->tokens);
        p->steps = (total + p->grad_accum - 1) / p->grad_accum;
    }
    p->batches = p->steps * p->grad_accum;
    if (rings_of(p, in->ring_slots > 0 ? in->ring_slots : RINGS_DEFAULT_SLOTS, err, err_len)) return -1;
    p->hash = plan_compute_hash(p);
    return 0;
}

int plan_write(struct plan *p, const char *path, char *err, int err_len) {
    p->hash = plan_compute_hash(p);
    json_t *j = to_json(p, 1, 1);
    char *text = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(j);
    if (!text) return err_fail(err, err_len, "%s: out of memory", path);
    size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) { free(text); return err_fail(err, err_len, "%s: out of memory", path); }
    t2[n] = '\n';
    t2[n + 1] = 0;
    int rc = fs_write_atomic(path, t2, n + 1, err, err_len);
    free(t2);
    if (rc == 0) snprintf(p->path, sizeof p->path, "%s", path);
    return rc;
}

/* ---------------------------------------------------------------- reading */

static int get_int(json_t *o, const char *key, const char *path, int64_t lo, int64_t hi, int64_t *out, char *err,
                   int err_len) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return err_fail(err, err_len, "%s: key '%s': expected an integer", path, key);
    int64_t x = json_integer_value(v);
    if (x < lo || x > hi) return err_fail(err, err_len, "%s: key '%s' = %lld is outside [%lld, %lld]", path, key,
                                          (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 0;
}

static int get_str(json_t *o, const char *key, const char *path, char *out, size_t cap, char *err, int err_len) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v) || strlen(json_string_value(v)) >= cap)
        return err_fail(err, err_len, "%s: key '%s': expected a string (shorter than %zu characters)", path, key, cap);
    strcpy(out, json_string_value(v));
    return 0;
}

static const char *const known_keys[] = {"kind", "version", "hash", "model", "data", "device", "train_device", "tokens", "target",
                                         "capture", "dtype", "drafter", "seed", "window", "epochs", "steps",
                                         "grad_accum", "batches", "target_replicas", "ranks", "hosts", "host",
                                         "rings", NULL};

static int parse(json_t *j, const char *path, struct plan *p, char *err, int err_len) {
    char s[64];
    int64_t x;
    const char *key;
    json_t *val;
    json_object_foreach(j, key, val) {
        int ok = 0;
        for (int i = 0; known_keys[i]; i++) ok |= !strcmp(key, known_keys[i]);
        if (!ok) return err_fail(err, err_len, "%s: unknown key '%s' (dflash-plan --help lists the keys)", path, key);
    }
    if (get_str(j, "kind", path, s, sizeof s, err, err_len)) return -1;
    if (strcmp(s, "dflash-plan")) return err_fail(err, err_len, "%s: kind is '%s', expected 'dflash-plan'", path, s);
    if (get_int(j, "version", path, 0, 1000, &x, err, err_len)) return -1;
    if (x != PLAN_VERSION)
        return err_fail(err, err_len, "%s: plan version %lld, this binary reads version %d (write it again with "
                        "dflash-plan)", path, (long long)x, PLAN_VERSION);
    if (get_str(j, "model", path, p->model, sizeof p->model, err, err_len) ||
        get_str(j, "data", path, p->data, sizeof p->data, err, err_len) ||
        get_str(j, "device", path, p->device, sizeof p->device, err, err_len) ||
        get_str(j, "train_device", path, p->train_device, sizeof p->train_device, err, err_len))
        return -1;
    int dev;
    if (strcmp(p->device, "cpu") && sscanf(p->device, "cuda:%d", &dev) != 1)
        return err_fail(err, err_len, "%s: key 'device' = '%s': expected cpu or cuda:N", path, p->device);
    if (strcmp(p->train_device, "cpu") && sscanf(p->train_device, "cuda:%d", &dev) != 1)
        return err_fail(err, err_len, "%s: key 'train_device' = '%s': expected cpu or cuda:N", path, p->train_device);
    if (get_int(j, "tokens", path, 1, 1 << 24, &x, err, err_len)) return -1;
    p->tokens = (uint32_t)x;
    json_t *t = json_object_get(j, "target");
    if (!json_is_object(t)) return err_fail(err, err_len, "%s: key 'target': expected an object", path);
    if (get_int(t, "layers", path, 1, 4096, &x, err, err_len)) return -1;
    p->target_layers = (int)x;
    if (get_int(t, "hidden_size", path, 1, 1 << 20, &x, err, err_len)) return -1;
    p->hidden_size = (int)x;
    json_t *c = json_object_get(j, "capture"), *ids = c ? json_object_get(c, "layer_ids") : NULL;
    if (!json_is_object(c) || !json_is_string(json_object_get(c, "convention")) ||
        strcmp(json_string_value(json_object_get(c, "convention")), "zlab"))
        return err_fail(err, err_len, "%s: key 'capture': expected {\"convention\": \"zlab\", \"layer_ids\": [...]}", path);
    if (!json_is_array(ids) || json_array_size(ids) < 1 || json_array_size(ids) > DESC_MAX_LAYERS)
        return err_fail(err, err_len, "%s: key 'capture.layer_ids': expected 1..%d layer ids", path, DESC_MAX_LAYERS);
    p->n_ids = (int)json_array_size(ids);
    for (int i = 0; i < p->n_ids; i++) {
        json_t *v = json_array_get(ids, (size_t)i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= p->target_layers)
            return err_fail(err, err_len, "%s: capture.layer_ids[%d]: expected an id in 0..%d (the target's layers)", path,
                            i, p->target_layers - 1);
        p->ids[i] = (int)json_integer_value(v);
    }
    if (get_str(j, "dtype", path, s, sizeof s, err, err_len)) return -1;
    if (!strcmp(s, "bf16")) p->dtype = DESC_DTYPE_BF16;
    else if (!strcmp(s, "f32")) p->dtype = DESC_DTYPE_F32;
    else return err_fail(err, err_len, "%s: key 'dtype' = '%s': expected bf16 or f32", path, s);
    json_t *d = json_object_get(j, "drafter"), *types = d ? json_object_get(d, "layer_types") : NULL;
    if (!json_is_object(d) || !json_is_array(types) || json_array_size(types) < 1 ||
        json_array_size(types) > PLAN_MAX_DRAFT_LAYERS)
        return err_fail(err, err_len, "%s: key 'drafter.layer_types': expected 1..%d of sliding|full", path,
                        PLAN_MAX_DRAFT_LAYERS);
    p->draft_layers = (int)json_array_size(types);
    for (int l = 0; l < p->draft_layers; l++) {
        const char *n = json_string_value(json_array_get(types, (size_t)l));
        p->layer_types[l] = -1;
        for (int k = 0; n && type_names[k]; k++)
            if (!strcmp(n, type_names[k])) p->layer_types[l] = k;
        if (p->layer_types[l] < 0) return err_fail(err, err_len, "%s: drafter.layer_types[%d]: expected sliding or full", path, l);
    }
    if (get_int(d, "block_size", path, 2, 4096, &x, err, err_len)) return -1;
    p->block_size = (int)x;
    if (get_int(j, "seed", path, 0, INT64_MAX, &p->seed, err, err_len)) return -1;
    if (get_int(j, "window", path, 1, 1 << 24, &x, err, err_len)) return -1;
    p->window = (int)x;
    if (get_int(j, "epochs", path, 1, INT32_MAX, &x, err, err_len)) return -1;
    p->epochs = (int)x;
    if (get_int(j, "steps", path, 1, INT64_MAX, &p->steps, err, err_len)) return -1;
    if (get_int(j, "grad_accum", path, 1, 1 << 20, &x, err, err_len)) return -1;
    p->grad_accum = (int)x;
    if (get_int(j, "batches", path, 1, INT64_MAX, &p->batches, err, err_len)) return -1;
    if (p->batches != p->steps * p->grad_accum)
        return err_fail(err, err_len, "%s: batches %lld is not steps x grad_accum = %lld x %d", path,
                        (long long)p->batches, (long long)p->steps, p->grad_accum);
    p->target_replicas = 1;
    if (json_object_get(j, "target_replicas")) {
        if (get_int(j, "target_replicas", path, 1, PLAN_MAX_TARGET_REPLICAS, &x, err, err_len)) return -1;
        p->target_replicas = (int)x;
    }
    p->ranks = p->hosts = 1;
    p->host = -1;
    if (json_object_get(j, "ranks")) {
        if (get_int(j, "ranks", path, 1, 1 << 20, &x, err, err_len)) return -1;
        p->ranks = (int)x;
    }
    if (json_object_get(j, "hosts")) {
        if (get_int(j, "hosts", path, 1, PLAN_MAX_HOSTS, &x, err, err_len)) return -1;
        p->hosts = (int)x;
    }
    if (json_object_get(j, "host")) {
        if (get_int(j, "host", path, 0, PLAN_MAX_HOSTS - 1, &x, err, err_len)) return -1;
        p->host = (int)x;
    }
    if (check_ranks(p, path, err, err_len)) return -1;
    json_t *r = json_object_get(j, "rings");
    if (!json_is_array(r) || json_array_size(r) > PLAN_MAX_RINGS)
        return err_fail(err, err_len, "%s: key 'rings': expected at most %d dflash-shm --ring specs", path, PLAN_MAX_RINGS);
    p->n_rings = (int)json_array_size(r);
    for (int i = 0; i < p->n_rings; i++) {
        const char *v = json_string_value(json_array_get(r, (size_t)i));
        if (!v || strlen(v) >= sizeof p->rings[i] || strstr(v, "plan="))
            return err_fail(err, err_len, "%s: rings[%d]: expected a dflash-shm --ring spec without plan= (the hash is "
                            "added by dflash-shm)", path, i);
        strcpy(p->rings[i], v);
    }
    return 0;
}

int plan_read(const char *path, int check_hash, struct plan *p, char *err, int err_len) {
    memset(p, 0, sizeof *p);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return err_fail(err, err_len, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    if (!json_is_object(j)) { json_decref(j); return err_fail(err, err_len, "%s: expected a JSON object", path); }
    int rc = parse(j, path, p, err, err_len);
    char stored[32] = "";
    if (rc == 0 && json_object_get(j, "hash") && get_str(j, "hash", path, stored, sizeof stored, err, err_len)) rc = -1;
    json_decref(j);
    if (rc) return -1;
    snprintf(p->path, sizeof p->path, "%s", path);
    p->hash = plan_compute_hash(p);
    char have[24];
    snprintf(have, sizeof have, "%016llx", (unsigned long long)p->hash);
    if (check_hash && strcmp(stored, have))
        return err_fail(err, err_len, "%s: hash %s does not match its content (%s): the file was edited; run "
                        "`dflash-plan --rehash --run DIR` to accept the edit", path, stored[0] ? stored : "(none)", have);
    return 0;
}

int plan_open_run(const char *run_dir, struct plan *p, char *err, int err_len) {
    if (!run_dir) return 0;
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", run_dir, PLAN_FILE) >= (int)sizeof path)
        return err_fail(err, err_len, "--run path too long");
    if (!fs_exists(path)) return 0;
    return plan_read(path, 1, p, err, err_len) ? -1 : 1;
}

/* ---------------------------------------------------------------- binding */

static int conflict(const struct plan *p, const char *flag, const char *given, const char *key, const char *planned,
                    char *err, int err_len) {
    return err_fail(err, err_len, "--%s %s conflicts with the plan's %s %s (%s): drop the flag, or write another plan "
                    "(dflash-plan)", flag, given, key, planned, p->path);
}

int plan_bind_int64(const struct plan *p, const char *flag, int given, int64_t *value, int64_t plan_value,
                    const char *key, char *err, int err_len) {
    if (!given) { *value = plan_value; return 0; }
    if (*value == plan_value) return 0;
    char a[32], b[32];
    snprintf(a, sizeof a, "%lld", (long long)*value);
    snprintf(b, sizeof b, "%lld", (long long)plan_value);
    return conflict(p, flag, a, key, b, err, err_len);
}

int plan_bind_int(const struct plan *p, const char *flag, int given, int *value, int64_t plan_value, const char *key,
                  char *err, int err_len) {
    int64_t v = *value;
    if (plan_bind_int64(p, flag, given, &v, plan_value, key, err, err_len)) return -1;
    *value = (int)v;
    return 0;
}

int plan_bind_str(const struct plan *p, const char *flag, int given, const char **value, const char *plan_value,
                  const char *key, char *err, int err_len) {
    if (!given || !*value) { *value = plan_value; return 0; }
    if (!strcmp(*value, plan_value)) return 0;
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(*value, a) && realpath(plan_value, b) && !strcmp(a, b)) return 0;
    return conflict(p, flag, *value, key, plan_value, err, err_len);
}

int plan_bind_list(const struct plan *p, const char *flag, int given, int *items, int *count, const int *plan_items,
                   int plan_count, const char *key, char *err, int err_len) {
    if (!given) {
        memcpy(items, plan_items, (size_t)plan_count * sizeof *items);
        *count = plan_count;
        return 0;
    }
    if (*count == plan_count && !memcmp(items, plan_items, (size_t)plan_count * sizeof *items)) return 0;
    char a[512], b[512];
    return conflict(p, flag, plan_format_ids(items, *count, a, sizeof a), key,
                    plan_format_ids(plan_items, plan_count, b, sizeof b), err, err_len);
}

int plan_bind_device(const struct plan *p, int given, const char **device, const char *plan_device, char *err,
                     int err_len) {
    if (!given || !*device) { *device = plan_device; return 0; }
    if (!strcmp(*device, plan_device)) return 0;
    return conflict(p, "device", *device, plan_device == p->train_device ? "train_device" : "device", plan_device, err,
                    err_len);
}

/* ---------------------------------------------------------------- several hosts */

int plan_for_host(const struct plan *shared, int host, struct plan *out, char *err, int err_len) {
    if (shared->hosts <= 1)
        return err_fail(err, err_len, "%s has no hosts (one-host plan): a host plan needs dflash-plan --hosts H",
                        shared->path[0] ? shared->path : "the plan");
    if (shared->host >= 0)
        return err_fail(err, err_len, "%s is host %d's plan; make host plans from the run's plan", shared->path,
                        shared->host);
    if (host < 0 || host >= shared->hosts)
        return err_fail(err, err_len, "host %d is outside the plan's %d hosts (0..%d)", host, shared->hosts,
                        shared->hosts - 1);
    *out = *shared;
    out->host = host;
    out->path[0] = 0;
    return 0;
}

int plan_host_dir(const char *run_dir, int host, char *out, size_t cap) {
    int n = snprintf(out, cap, "%s/hosts/%d", run_dir, host);
    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int plan_rank_host(const struct plan *p, int rank) { return p->hosts > 1 ? rank / (p->ranks / p->hosts) : 0; }

void plan_shard(const struct plan *p, struct seq_shard *s) {
    if (p->hosts <= 1 || p->host < 0 || seq_shard_host(s, p->ranks, p->hosts, p->host)) seq_shard_all(s);
}
