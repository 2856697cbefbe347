/*
 * stages/train/train_config.c — the checkpoint's "dflash-train config" (train_config.h): written by dflash-train,
 * read by dflash-export / dflash-eval.
 */
#include "train/train_config.h"

#include "core/err.h"
#include "train/sched.h"

#include <jansson.h>
#include <limits.h>
#include <string.h>

const char *const train_loss_names[] = {"kl", "ce", NULL};
const char *const train_weighting_names[] = {"none", "exp-decay", "dpace", NULL};
const char *const train_optimizer_names[] = {"muon", "adamw", NULL};
const char *const train_schedule_names[] = {"linear", "cosine", "none", NULL};
const char *const train_layer_type_names[] = {"sliding", "full", NULL};
const char *const train_convention_names[] = {"zlab", "speculators", NULL};

char *train_config_json(const struct drafter_config *c, const struct train_hparams *h) {
    json_t *j = json_object(), *types = json_array(), *ids = json_array();
    int zl[DESC_MAX_LAYERS];
    drafter_zlab_ids(c, zl);
    for (int l = 0; l < c->L; l++) json_array_append_new(types, json_string(train_layer_type_names[c->layer_type[l]]));
    for (int i = 0; i < c->k; i++) json_array_append_new(ids, json_integer(zl[i]));
    json_object_set_new(j, "format", json_string("dflash-train config"));
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "target_model_type", json_string(c->target.model_type));
    json_object_set_new(j, "hidden_size", json_integer(c->H));
    json_object_set_new(j, "target_layers", json_integer(c->target.num_hidden_layers));
    json_object_set_new(j, "vocab_size", json_integer(c->V_t));
    json_object_set_new(j, "draft_vocab_size", json_integer(c->V_d));
    json_object_set_new(j, "block_size", json_integer(c->B));
    json_object_set_new(j, "layer_types", types);
    json_object_set_new(j, "sliding_window", json_integer(c->sliding_window));
    json_object_set_new(j, "sliding_window_non_causal", json_boolean(c->sliding_window_non_causal));
    json_object_set_new(j, "max_anchors", json_integer(c->N));
    json_object_set_new(j, "tokens", json_integer(c->T_max));
    json_object_set_new(j, "target_layer_ids_zlab", ids);
    json_object_set_new(j, "sample_from_anchor", json_boolean(c->sample_from_anchor));
    json_object_set_new(j, "mask_token_id", json_integer(c->mask_token_id));
    json_object_set_new(j, "noise", json_real(c->noise));
    json_object_set_new(j, "loss", json_string(train_loss_names[c->loss]));
    json_object_set_new(j, "weighting", json_string(train_weighting_names[c->weighting]));
    json_object_set_new(j, "gamma", json_real(c->gamma));
    json_object_set_new(j, "alpha", json_real(c->alpha));
    json_object_set_new(j, "init_std", json_real(c->init_std));
    json_object_set_new(j, "seed", json_integer(h->seed));
    json_object_set_new(j, "optimizer", json_string(train_optimizer_names[h->optimizer]));
    json_object_set_new(j, "lr", json_real(h->lr));
    json_object_set_new(j, "muon_lr", json_real(h->muon_lr));
    json_object_set_new(j, "weight_decay", json_real(h->weight_decay));
    json_object_set_new(j, "muon_weight_decay", json_real(h->muon_weight_decay));
    json_object_set_new(j, "schedule", json_string(sched_kind_name((enum sched_kind)h->schedule)));
    json_object_set_new(j, "total_steps", json_integer(h->total_steps));
    json_object_set_new(j, "warmup_steps", json_integer(h->warmup_steps));
    json_object_set_new(j, "grad_accum", json_integer(h->grad_accum));
    json_object_set_new(j, "clip", json_real(h->clip));
    char *text = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    return text;
}

/* ---------------------------------------------------------------- parsing */

static int need_int(const json_t *o, const char *key, int64_t *out, const char *what, char *err, int err_len) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return err_fail(err, err_len, "%s: key \"%s\" is missing", what, key);
    if (!json_is_integer(v)) return err_fail(err, err_len, "%s: key \"%s\" must be an integer", what, key);
    *out = json_integer_value(v);
    return 0;
}

static int name_index(const char *s, const char *const *names) {
    for (int i = 0; s && names[i]; i++)
        if (!strcmp(s, names[i])) return i;
    return -1;
}

int train_config_parse(const json_t *j, const char *what, struct drafter_config *c, struct train_hparams *h,
                       struct train_config_target *t, char *err, int err_len) {
    const char *fmt = json_string_value(json_object_get(j, "format"));
    if (!fmt || strcmp(fmt, "dflash-train config"))
        return err_fail(err, err_len, "%s: key \"format\" is not \"dflash-train config\": not a dflash-train "
                        "checkpoint", what);
    int64_t v;
    drafter_config_defaults(c);
    memset(h, 0, sizeof *h);
    if (need_int(j, "block_size", &v, what, err, err_len)) return -1;
    c->B = (int)v;
    if (need_int(j, "sliding_window", &v, what, err, err_len)) return -1;
    c->sliding_window = (int)v;
    if (need_int(j, "max_anchors", &v, what, err, err_len)) return -1;
    c->N = (int)v;
    if (need_int(j, "tokens", &v, what, err, err_len)) return -1;
    c->T_max = (int)v;
    if (need_int(j, "mask_token_id", &c->mask_token_id, what, err, err_len)) return -1;
    if (need_int(j, "seed", &h->seed, what, err, err_len)) return -1;
    if (need_int(j, "hidden_size", &t->hidden_size, what, err, err_len) ||
        need_int(j, "target_layers", &t->target_layers, what, err, err_len) ||
        need_int(j, "vocab_size", &t->vocab_size, what, err, err_len) ||
        need_int(j, "draft_vocab_size", &t->draft_vocab_size, what, err, err_len))
        return -1;
    json_t *types = json_object_get(j, "layer_types");
    if (!json_is_array(types) || json_array_size(types) < 1 || json_array_size(types) > DRAFTER_MAX_LAYERS)
        return err_fail(err, err_len, "%s: key \"layer_types\" must be a list of 1..%d layer types", what,
                        DRAFTER_MAX_LAYERS);
    c->L = (int)json_array_size(types);
    for (int l = 0; l < c->L; l++) {
        int ty = name_index(json_string_value(json_array_get(types, (size_t)l)), train_layer_type_names);
        if (ty < 0) return err_fail(err, err_len, "%s: key \"layer_types\"[%d] must be \"sliding\" or \"full\"", what, l);
        c->layer_type[l] = ty;
    }
    json_t *ids = json_object_get(j, "target_layer_ids_zlab");
    if (!json_is_array(ids))
        return err_fail(err, err_len, "%s: key \"target_layer_ids_zlab\" must be an array of integers", what);
    int n = (int)json_array_size(ids);
    if (n > DESC_MAX_LAYERS)
        return err_fail(err, err_len, "%s: key \"target_layer_ids_zlab\" has %d entries, at most %d", what, n,
                        DESC_MAX_LAYERS);
    for (int i = 0; i < n; i++) {
        json_t *x = json_array_get(ids, (size_t)i);
        if (!json_is_integer(x) || json_integer_value(x) < INT_MIN || json_integer_value(x) > INT_MAX)
            return err_fail(err, err_len, "%s: key \"target_layer_ids_zlab\"[%d] must be an integer", what, i);
        c->layer_ids[i] = (int)json_integer_value(x);
    }
    c->k = n;
    c->ids_convention = DRAFTER_IDS_ZLAB;
    c->sliding_window_non_causal = json_is_true(json_object_get(j, "sliding_window_non_causal"));
    c->sample_from_anchor = json_is_true(json_object_get(j, "sample_from_anchor"));
    c->noise = (float)json_number_value(json_object_get(j, "noise"));
    c->gamma = (float)json_number_value(json_object_get(j, "gamma"));
    c->alpha = (float)json_number_value(json_object_get(j, "alpha"));
    c->init_std = (float)json_number_value(json_object_get(j, "init_std"));
    int li = name_index(json_string_value(json_object_get(j, "loss")), train_loss_names);
    int wi = name_index(json_string_value(json_object_get(j, "weighting")), train_weighting_names);
    int oi = name_index(json_string_value(json_object_get(j, "optimizer")), train_optimizer_names);
    if (li < 0) return err_fail(err, err_len, "%s: key \"loss\" must be kl or ce", what);
    if (wi < 0) return err_fail(err, err_len, "%s: key \"weighting\" must be none, exp-decay or dpace", what);
    if (oi < 0) return err_fail(err, err_len, "%s: key \"optimizer\" must be muon or adamw", what);
    c->loss = li;
    c->weighting = wi;
    h->optimizer = oi;
    /* the rest of the run's hyper-parameters: for reports; a loader does not need them */
    h->lr = json_number_value(json_object_get(j, "lr"));
    h->muon_lr = json_number_value(json_object_get(j, "muon_lr"));
    h->weight_decay = json_number_value(json_object_get(j, "weight_decay"));
    h->muon_weight_decay = json_number_value(json_object_get(j, "muon_weight_decay"));
    int si = name_index(json_string_value(json_object_get(j, "schedule")), train_schedule_names);
    h->schedule = si < 0 ? 0 : si;
    json_t *x;
    if (json_is_integer(x = json_object_get(j, "total_steps"))) h->total_steps = json_integer_value(x);
    if (json_is_integer(x = json_object_get(j, "warmup_steps"))) h->warmup_steps = json_integer_value(x);
    if (json_is_integer(x = json_object_get(j, "grad_accum"))) h->grad_accum = (int)json_integer_value(x);
    h->clip = json_number_value(json_object_get(j, "clip"));
    return 0;
}
