/*
 * stages/core/rings.c — ring slot sizing and spec lines (rings.h).
 */
#include "core/rings.h"
#include "core/err.h"

#include <stdio.h>

uint64_t rings_payload_bytes(enum desc_kind kind, const struct rings_geometry *g) {
    switch (kind) {
    case DESC_KIND_BATCH: return desc_batch_max_payload_bytes(g->budget);
    case DESC_KIND_HIDDEN: return desc_hidden_max_payload_bytes(g->budget, g->n_layers, g->hidden_size, g->dtype);
    case DESC_KIND_FEATURES: return desc_features_max_payload_bytes(g->budget, g->n_layers, g->hidden_size, g->dtype);
    }
    return 0;
}

uint32_t rings_desc_bytes(enum desc_kind kind, const struct rings_geometry *g) {
    if (kind != DESC_KIND_BATCH) return DESC_MAX_BYTES;
    uint32_t b = g->budget;
    struct desc_batch d = {.seq = UINT64_MAX, .epoch = UINT32_MAX, .n_tokens = b, .budget = b, .n_docs = b, .n_loss = b,
                         .plan = UINT64_MAX};
    desc_batch_layout(&d);
    char buf[DESC_MAX_BYTES], err[256];
    size_t len = DESC_MAX_BYTES;
    if (desc_batch_encode(&d, buf, sizeof buf, &len, err, sizeof err)) return DESC_MAX_BYTES;
    return (uint32_t)len;
}

int rings_format_spec(char *out, size_t out_len, const char *name, uint32_t n_slots, enum desc_kind kind,
                      const struct rings_geometry *g, int device, char *err, int err_len) {
    uint64_t bytes = rings_payload_bytes(kind, g);
    if (!bytes) return err_fail(err, err_len, "ring '%s': unknown descriptor kind %d", name, (int)kind);
    if (!n_slots) return err_fail(err, err_len, "ring '%s': slots must be at least 1", name);
    char dev[32];
    if (device < 0) snprintf(dev, sizeof dev, "host");
    else snprintf(dev, sizeof dev, "cuda:%d", device);
    int n = snprintf(out, out_len, "%s:slots=%u,bytes=%llu,desc=%u,dev=%s", name, n_slots, (unsigned long long)bytes,
                     rings_desc_bytes(kind, g), dev);
    if (n < 0 || (size_t)n >= out_len) return err_fail(err, err_len, "ring '%s': spec line does not fit %zu bytes", name, out_len);
    return 0;
}

int rings_check_budget(uint64_t seq, uint32_t n_tokens, uint32_t budget, uint32_t planned, char *err, int err_len) {
    uint32_t worst = n_tokens > budget ? n_tokens : budget;
    if (worst <= planned) return 0;
    return err_fail(err, err_len, "batch seq %llu: %u tokens, this stage planned memory for --tokens %u",
                    (unsigned long long)seq, worst, planned);
}

int rings_check_plan(const struct ring *r, uint64_t plan, char *err, int err_len) {
    const struct ring_spec *s = ring_get_spec(r);
    if (!plan || !s->plan || s->plan == plan) return 0;
    return err_fail(err, err_len, "ring '%s' was made for run plan %016llx, this stage read plan %016llx from its run's "
                    "plan.json: the plan changed after dflash-shm started (restart dflash-shm with the new plan, or start "
                    "the stage with the plan the rings were made for)", s->name, (unsigned long long)s->plan,
                    (unsigned long long)plan);
}
