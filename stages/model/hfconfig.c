/*
 * stages/model/hfconfig.c — config.json reader/writer, RoPE frequencies and the z-lab layer-id
 * formula (hfconfig.h).
 *
 * The reader is strict on purpose: a config value the forward would silently compute differently
 * from transformers (a bias, another activation, an unknown rope type) is an error naming the
 * field, never a default. Absent fields get transformers' defaults for that architecture.
 */
#include "model/hfconfig.h"
#include "core/err.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fsutil.h"

/* ---------------------------------------------------------------- field readers */

/* A positive integer field. Absent: *out = def and 0 (or an error when def < 0, i.e. required). */
static int get_int(json_t *o, const char *key, int def, int *out, const char *what, char *err, int err_len) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return err_fail(err, err_len, "%s: required field \"%s\" is missing", what, key);
        *out = def;
        return 0;
    }
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && json_real_value(v) > 0 &&
        json_real_value(v) < 2147483647.0) {
        *out = (int)json_real_value(v);
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) <= 0 || json_integer_value(v) > 2147483647)
        return err_fail(err, err_len, "%s: \"%s\" must be a positive integer", what, key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* A positive finite number field. */
static int get_num(json_t *o, const char *key, double def, double *out, const char *what, char *err, int err_len) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (def < 0) return err_fail(err, err_len, "%s: required field \"%s\" is missing", what, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
        return err_fail(err, err_len, "%s: \"%s\" must be a positive number", what, key);
    *out = json_number_value(v);
    return 0;
}

static int get_bool(json_t *o, const char *key, int def, int *out, const char *what, char *err, int err_len) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_boolean(v)) return err_fail(err, err_len, "%s: \"%s\" must be true or false", what, key);
    *out = json_is_true(v);
    return 0;
}

/* The rope type and its parameters from an object holding "rope_type" (or the older "type"). */
static int parse_rope(struct model_config *c, json_t *r, const char *field, const char *what, char *err, int err_len) {
    json_t *jt = json_object_get(r, "rope_type");
    if (!jt) jt = json_object_get(r, "type");
    const char *type = json_is_string(jt) ? json_string_value(jt) : "default";
    if (jt && !json_is_string(jt)) return err_fail(err, err_len, "%s: \"%s.rope_type\" must be a string", what, field);
    if (strcmp(type, "default") == 0) {
        c->rope_type = HF_ROPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0) {
        c->rope_type = HF_ROPE_LINEAR;
        if (get_num(r, "factor", -1, &c->rope_factor, what, err, err_len) != 0) {
            char inner[512];
            snprintf(inner, sizeof inner, "%s", err);
            return err_fail(err, err_len, "%s (in \"%s\", rope_type linear)", inner, field);
        }
    } else if (strcmp(type, "llama3") == 0) {
        c->rope_type = HF_ROPE_LLAMA3;
        if (get_num(r, "factor", -1, &c->rope_factor, what, err, err_len) != 0 ||
            get_num(r, "low_freq_factor", -1, &c->rope_low_freq_factor, what, err, err_len) != 0 ||
            get_num(r, "high_freq_factor", -1, &c->rope_high_freq_factor, what, err, err_len) != 0 ||
            get_int(r, "original_max_position_embeddings", -1, &c->rope_original_max_position_embeddings, what,
                    err, err_len) != 0) {
            /* name the enclosing field too: "rope_scaling: required field \"factor\"" */
            char inner[512];
            snprintf(inner, sizeof inner, "%s", err);
            return err_fail(err, err_len, "%s (in \"%s\", rope_type llama3)", inner, field);
        }
        if (!(c->rope_high_freq_factor > c->rope_low_freq_factor))
            return err_fail(err, err_len, "%s: \"%s\": high_freq_factor %g must exceed low_freq_factor %g", what, field,
                        c->rope_high_freq_factor, c->rope_low_freq_factor);
    } else {
        return err_fail(err, err_len, "%s: \"%s\" has rope_type '%s'; supported are default, linear and llama3", what,
                    field, type);
    }
    return 0;
}

/* ---------------------------------------------------------------- parse */

static int parse_obj(struct model_config *c, json_t *o, const char *what, char *err, int err_len) {
    memset(c, 0, sizeof *c);
    if (!json_is_object(o)) return err_fail(err, err_len, "%s: not a JSON object", what);

    /* Architecture: architectures[0], else derived from model_type. */
    json_t *ja = json_object_get(o, "architectures"), *jm = json_object_get(o, "model_type");
    const char *arch = NULL, *mt = json_is_string(jm) ? json_string_value(jm) : NULL;
    if (ja && !json_is_null(ja)) {
        if (!json_is_array(ja) || json_array_size(ja) != 1 || !json_is_string(json_array_get(ja, 0)))
            return err_fail(err, err_len, "%s: \"architectures\" must be a list of one string", what);
        arch = json_string_value(json_array_get(ja, 0));
    } else if (mt) {
        arch = strcmp(mt, "qwen3") == 0 ? "Qwen3ForCausalLM" : strcmp(mt, "llama") == 0 ? "LlamaForCausalLM" : mt;
    } else {
        return err_fail(err, err_len, "%s: neither \"architectures\" nor \"model_type\" is given", what);
    }
    if (strcmp(arch, "Qwen3ForCausalLM") == 0) { c->arch = HF_ARCH_QWEN3; c->qk_norm = 1; }
    else if (strcmp(arch, "LlamaForCausalLM") == 0) c->arch = HF_ARCH_LLAMA;
    else
        return err_fail(err, err_len, "%s: architecture '%s' is not supported; supported are Qwen3ForCausalLM and "
                    "LlamaForCausalLM", what, arch);
    const char *want_mt = c->arch == HF_ARCH_QWEN3 ? "qwen3" : "llama";
    if (mt && strcmp(mt, want_mt) != 0)
        return err_fail(err, err_len, "%s: \"model_type\" is '%s' but the architecture %s needs '%s'", what, mt, arch, want_mt);
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    snprintf(c->model_type, sizeof c->model_type, "%s", want_mt);

    int qwen = c->arch == HF_ARCH_QWEN3;
    if (get_int(o, "vocab_size", -1, &c->vocab_size, what, err, err_len) ||
        get_int(o, "hidden_size", -1, &c->hidden_size, what, err, err_len) ||
        get_int(o, "intermediate_size", -1, &c->intermediate_size, what, err, err_len) ||
        get_int(o, "num_hidden_layers", -1, &c->num_hidden_layers, what, err, err_len) ||
        get_int(o, "num_attention_heads", -1, &c->num_attention_heads, what, err, err_len) ||
        get_int(o, "num_key_value_heads", c->num_attention_heads, &c->num_key_value_heads, what, err, err_len) ||
        get_int(o, "head_dim", qwen ? 128 : c->hidden_size / c->num_attention_heads, &c->head_dim, what, err, err_len) ||
        get_int(o, "max_position_embeddings", qwen ? 32768 : 2048, &c->max_position_embeddings, what, err, err_len) ||
        get_num(o, "rms_norm_eps", 1e-6, &c->rms_norm_eps, what, err, err_len) ||
        get_bool(o, "tie_word_embeddings", 0, &c->tie_word_embeddings, what, err, err_len))
        return -1;
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return err_fail(err, err_len, "%s: \"num_key_value_heads\" %d does not divide \"num_attention_heads\" %d", what,
                    c->num_key_value_heads, c->num_attention_heads);
    if (c->head_dim <= 0 || c->head_dim % 2 != 0)
        return err_fail(err, err_len, "%s: \"head_dim\" %d must be a positive even number (rotary halves)", what, c->head_dim);

    int flag = 0;
    if (get_bool(o, "attention_bias", 0, &flag, what, err, err_len)) return -1;
    if (flag) return err_fail(err, err_len, "%s: \"attention_bias\" is true; q/k/v/o biases are not supported", what);
    if (get_bool(o, "mlp_bias", 0, &flag, what, err, err_len)) return -1;
    if (flag) return err_fail(err, err_len, "%s: \"mlp_bias\" is true; MLP biases are not supported", what);
    if (qwen) {
        if (get_bool(o, "use_sliding_window", 0, &flag, what, err, err_len)) return -1;
        if (flag) return err_fail(err, err_len, "%s: \"use_sliding_window\" is true; sliding-window targets are not supported", what);
    }
    json_t *act = json_object_get(o, "hidden_act");
    if (act && !json_is_null(act) && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
        return err_fail(err, err_len, "%s: \"hidden_act\" is %s%s%s; only silu is supported", what,
                    json_is_string(act) ? "'" : "", json_is_string(act) ? json_string_value(act) : "not a string",
                    json_is_string(act) ? "'" : "");

    /* dtype: transformers 5 "dtype", else transformers 4 "torch_dtype"; default bf16. */
    json_t *jd = json_object_get(o, "dtype");
    const char *dfield = "dtype";
    if (!jd || json_is_null(jd)) { jd = json_object_get(o, "torch_dtype"); dfield = "torch_dtype"; }
    c->dtype = ST_BF16;
    if (jd && !json_is_null(jd)) {
        const char *d = json_is_string(jd) ? json_string_value(jd) : "";
        if (strcmp(d, "bfloat16") == 0) c->dtype = ST_BF16;
        else if (strcmp(d, "float16") == 0) c->dtype = ST_F16;
        else if (strcmp(d, "float32") == 0) c->dtype = ST_F32;
        else return err_fail(err, err_len, "%s: \"%s\" is '%s'; supported are bfloat16, float16 and float32", what, dfield, d);
    }

    /* RoPE: transformers 5 rope_parameters wins; else rope_theta + rope_scaling. */
    json_t *rp = json_object_get(o, "rope_parameters");
    c->rope_type = HF_ROPE_DEFAULT;
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return err_fail(err, err_len, "%s: \"rope_parameters\" is not an object", what);
        json_t *th = json_object_get(rp, "rope_theta");
        if (get_num(th ? rp : o, "rope_theta", 10000.0, &c->rope_theta, what, err, err_len)) return -1;
        if (parse_rope(c, rp, "rope_parameters", what, err, err_len)) return -1;
    } else {
        if (get_num(o, "rope_theta", 10000.0, &c->rope_theta, what, err, err_len)) return -1;
        json_t *rs = json_object_get(o, "rope_scaling");
        if (rs && !json_is_null(rs)) {
            if (!json_is_object(rs)) return err_fail(err, err_len, "%s: \"rope_scaling\" is not an object or null", what);
            if (parse_rope(c, rs, "rope_scaling", what, err, err_len)) return -1;
        }
    }
    return 0;
}

int hf_config_parse(struct model_config *c, const char *json_text, const char *what, char *err, int err_len) {
    json_error_t je;
    json_t *o = json_loads(json_text, JSON_REJECT_DUPLICATES, &je);
    if (!o) return err_fail(err, err_len, "%s: not valid JSON: %s (line %d)", what, je.text, je.line);
    int r = parse_obj(c, o, what, err, err_len);
    json_decref(o);
    return r;
}

int hf_config_load(struct model_config *c, const char *path, char *err, int err_len) {
    struct stat sb;
    char file[4096];
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(file, sizeof file, "%s/config.json", path);
    else snprintf(file, sizeof file, "%s", path);
    char *text = NULL;
    size_t len;
    if (fs_read_file(file, &text, &len, err, err_len) != 0) return -1;
    int r = hf_config_parse(c, text, file, err, err_len);
    free(text);
    return r;
}

/* ---------------------------------------------------------------- write */

int hf_config_write(const struct model_config *c, const char *path, char *err, int err_len) {
    int qwen = c->arch == HF_ARCH_QWEN3;
    json_t *o = json_object();
    if (!o) return err_fail(err, err_len, "%s: out of memory", path);
    int bad = 0;
#define SET(k, v) bad |= json_object_set_new(o, (k), (v)) != 0
    json_t *arch = json_array();
    if (arch) json_array_append_new(arch, json_string(qwen ? "Qwen3ForCausalLM" : "LlamaForCausalLM"));
    SET("architectures", arch);
    SET("attention_bias", json_false());
    SET("attention_dropout", json_real(0.0));
    SET("head_dim", json_integer(c->head_dim));
    SET("hidden_act", json_string("silu"));
    SET("hidden_size", json_integer(c->hidden_size));
    SET("initializer_range", json_real(0.02));
    SET("intermediate_size", json_integer(c->intermediate_size));
    SET("max_position_embeddings", json_integer(c->max_position_embeddings));
    SET("model_type", json_string(qwen ? "qwen3" : "llama"));
    SET("num_attention_heads", json_integer(c->num_attention_heads));
    SET("num_hidden_layers", json_integer(c->num_hidden_layers));
    SET("num_key_value_heads", json_integer(c->num_key_value_heads));
    SET("rms_norm_eps", json_real(c->rms_norm_eps));
    SET("rope_theta", json_real(c->rope_theta));
    json_t *rs = json_null();
    if (c->rope_type == HF_ROPE_LINEAR) {
        rs = json_object();
        if (rs) {
            json_object_set_new(rs, "factor", json_real(c->rope_factor));
            json_object_set_new(rs, "rope_type", json_string("linear"));
        }
    } else if (c->rope_type == HF_ROPE_LLAMA3) {
        rs = json_object();
        if (rs) {
            json_object_set_new(rs, "factor", json_real(c->rope_factor));
            json_object_set_new(rs, "high_freq_factor", json_real(c->rope_high_freq_factor));
            json_object_set_new(rs, "low_freq_factor", json_real(c->rope_low_freq_factor));
            json_object_set_new(rs, "original_max_position_embeddings",
                                json_integer(c->rope_original_max_position_embeddings));
            json_object_set_new(rs, "rope_type", json_string("llama3"));
        }
    }
    SET("rope_scaling", rs);
    SET("tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    SET("torch_dtype", json_string(c->dtype == ST_F32 ? "float32" : c->dtype == ST_F16 ? "float16" : "bfloat16"));
    SET("transformers_version", json_string("4.51.0"));
    SET("use_cache", json_true());
    SET("vocab_size", json_integer(c->vocab_size));
    if (qwen) {
        SET("max_window_layers", json_integer(c->num_hidden_layers));
        SET("sliding_window", json_null());
        SET("use_sliding_window", json_false());
    } else {
        SET("mlp_bias", json_false());
        SET("pretraining_tp", json_integer(1));
    }
#undef SET
    /* %.15g keeps 1e-06 and 0.02 readable; every value written here is a short decimal. */
    char *text = bad ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!text) return err_fail(err, err_len, "%s: could not encode config (out of memory?)", path);
    size_t len = strlen(text);
    char *full = realloc(text, len + 2);
    if (!full) { free(text); return err_fail(err, err_len, "%s: out of memory", path); }
    full[len] = '\n';
    full[len + 1] = '\0';
    int r = fs_write_atomic(path, full, len + 1, err, err_len);
    free(full);
    return r;
}

/* ---------------------------------------------------------------- derived values */

void hf_rope_inv_freq(const struct model_config *c, double *inv_freq) {
    int half = c->head_dim / 2;
    for (int i = 0; i < half; i++) {
        double f = 1.0 / pow(c->rope_theta, (double)(2 * i) / (double)c->head_dim);
        if (c->rope_type == HF_ROPE_LINEAR) {
            f /= c->rope_factor;
        } else if (c->rope_type == HF_ROPE_LLAMA3) {
            /* transformers _compute_llama3_parameters */
            double old_ctx = (double)c->rope_original_max_position_embeddings;
            double low_wavelen = old_ctx / c->rope_low_freq_factor;
            double high_wavelen = old_ctx / c->rope_high_freq_factor;
            double wavelen = 2.0 * M_PI / f;
            if (wavelen > low_wavelen) {
                f = f / c->rope_factor;
            } else if (!(wavelen < high_wavelen)) {   /* medium band: interpolate */
                double smooth = (old_ctx / wavelen - c->rope_low_freq_factor) /
                                (c->rope_high_freq_factor - c->rope_low_freq_factor);
                f = (1.0 - smooth) * f / c->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = f;
    }
}

int hf_zlab_layer_ids(int n_target_layers, int n_draft_layers, int *ids) {
    if (n_target_layers < 1 || n_draft_layers < 1) return -1;
    if (n_draft_layers == 1) {
        ids[0] = n_target_layers / 2;
        return 0;
    }
    int start = 1, end = n_target_layers - 3, span = end - start;
    for (int i = 0; i < n_draft_layers; i++) {
        /* Python: int(round(start + (i * span) / (L_d - 1))); round() is half-to-even, as rint()
         * is in the default rounding mode. */
        double x = (double)start + (double)(i * span) / (double)(n_draft_layers - 1);
        ids[i] = (int)rint(x);
        if (ids[i] < 0 || ids[i] >= n_target_layers) return -1;
    }
    return 0;
}

int64_t hf_config_n_params(const struct model_config *c) {
    int64_t C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, d = c->head_dim;
    int64_t q = (int64_t)c->num_attention_heads * d, kv = (int64_t)c->num_key_value_heads * d;
    int64_t layer = C * q + 2 * C * kv + q * C + 3 * C * I + 2 * C + (c->qk_norm ? 2 * d : 0);
    return V * C + (int64_t)c->num_hidden_layers * layer + C + (c->tie_word_embeddings ? 0 : V * C);
}
