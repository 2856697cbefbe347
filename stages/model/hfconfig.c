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

/* ---------------------------------------------------------------- Qwen3.5 / 3.6 */

/* The dtype field of o ("dtype", else "torch_dtype"); absent: *found = 0. */
static int get_dtype(json_t *o, enum st_dtype *dt, int *found, const char *what, char *err, int err_len) {
    json_t *jd = json_object_get(o, "dtype");
    const char *dfield = "dtype";
    if (!jd || json_is_null(jd)) { jd = json_object_get(o, "torch_dtype"); dfield = "torch_dtype"; }
    *found = 0;
    if (!jd || json_is_null(jd)) return 0;
    const char *d = json_is_string(jd) ? json_string_value(jd) : "";
    if (strcmp(d, "bfloat16") == 0) *dt = ST_BF16;
    else if (strcmp(d, "float16") == 0) *dt = ST_F16;
    else if (strcmp(d, "float32") == 0) *dt = ST_F32;
    else return err_fail(err, err_len, "%s: \"%s\" is '%s'; supported are bfloat16, float16 and float32", what, dfield, d);
    *found = 1;
    return 0;
}

/* A number in (0, 1]. */
static int get_fraction(json_t *o, const char *key, double def, double *out, const char *what, const char *field,
                        char *err, int err_len) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_number(v) || !(json_number_value(v) > 0 && json_number_value(v) <= 1))
        return err_fail(err, err_len, "%s: \"%s%s\" must be a number in (0, 1]", what, field, key);
    *out = json_number_value(v);
    return 0;
}

/* Qwen3.5: flat (Qwen3_5ForCausalLM, model_type qwen3_5_text) or nested in a multimodal config
 * (Qwen3_5ForConditionalGeneration, model_type qwen3_5, the text model in "text_config"). */
static int parse_qwen35(struct model_config *c, json_t *top, const char *arch, const char *mt, const char *what,
                        char *err, int err_len) {
    int nested = strcmp(arch, "Qwen3_5ForConditionalGeneration") == 0;
    if (mt && strcmp(mt, nested ? "qwen3_5" : "qwen3_5_text") != 0)
        return err_fail(err, err_len, "%s: \"model_type\" is '%s' but the architecture %s needs '%s'", what, mt, arch,
                        nested ? "qwen3_5" : "qwen3_5_text");
    json_t *o = top;
    const char *pre = "";   /* key prefix in messages */
    if (nested) {
        o = json_object_get(top, "text_config");
        if (!json_is_object(o))
            return err_fail(err, err_len, "%s: \"text_config\" is missing or not an object (%s keeps the text model "
                            "there)", what, arch);
        json_t *tm = json_object_get(o, "model_type");
        if (tm && !(json_is_string(tm) && strcmp(json_string_value(tm), "qwen3_5_text") == 0))
            return err_fail(err, err_len, "%s: \"text_config.model_type\" is %s%s%s; expected 'qwen3_5_text'%s", what,
                            json_is_string(tm) ? "'" : "", json_is_string(tm) ? json_string_value(tm) : "not a string",
                            json_is_string(tm) ? "'" : "",
                            json_is_string(tm) && strstr(json_string_value(tm), "moe") ? " (MoE variants are not supported)" : "");
        pre = "text_config.";
        /* the vision placeholders (Qwen3_5Config defaults), so a batch holding one is refused */
        if (get_int(top, "image_token_id", 248056, &c->image_token_id, what, err, err_len) ||
            get_int(top, "video_token_id", 248057, &c->video_token_id, what, err, err_len))
            return -1;
    }
    char wbuf[600];   /* "file (text_config)" so field errors name where the key lives */
    snprintf(wbuf, sizeof wbuf, nested ? "%s (in text_config)" : "%s", what);
    const char *w = wbuf;
    c->arch = HF_ARCH_QWEN3_5;
    c->qk_norm = 1;
    c->nested = nested;
    snprintf(c->architecture, sizeof c->architecture, "%s", arch);
    snprintf(c->model_type, sizeof c->model_type, "%s", nested ? "qwen3_5" : "qwen3_5_text");

    json_t *ne = json_object_get(o, "num_experts");
    if (ne && !json_is_null(ne) && !(json_is_integer(ne) && json_integer_value(ne) == 0))
        return err_fail(err, err_len, "%s: \"%snum_experts\" is set: MoE variants are not supported", what, pre);
    if (get_int(o, "vocab_size", -1, &c->vocab_size, w, err, err_len) ||
        get_int(o, "hidden_size", -1, &c->hidden_size, w, err, err_len) ||
        get_int(o, "intermediate_size", -1, &c->intermediate_size, w, err, err_len) ||
        get_int(o, "num_hidden_layers", -1, &c->num_hidden_layers, w, err, err_len) ||
        get_int(o, "num_attention_heads", -1, &c->num_attention_heads, w, err, err_len) ||
        get_int(o, "num_key_value_heads", 4, &c->num_key_value_heads, w, err, err_len) ||
        get_int(o, "head_dim", 256, &c->head_dim, w, err, err_len) ||
        get_int(o, "max_position_embeddings", 32768, &c->max_position_embeddings, w, err, err_len) ||
        get_num(o, "rms_norm_eps", 1e-6, &c->rms_norm_eps, w, err, err_len) ||
        get_int(o, "linear_conv_kernel_dim", 4, &c->linear_conv_kernel_dim, w, err, err_len) ||
        get_int(o, "linear_key_head_dim", 128, &c->linear_key_head_dim, w, err, err_len) ||
        get_int(o, "linear_value_head_dim", 128, &c->linear_value_head_dim, w, err, err_len) ||
        get_int(o, "linear_num_key_heads", 16, &c->linear_num_key_heads, w, err, err_len) ||
        get_int(o, "linear_num_value_heads", 32, &c->linear_num_value_heads, w, err, err_len))
        return -1;
    /* tie_word_embeddings: the multimodal config's own key governs the LM head; else the text one. */
    json_t *tw = nested ? json_object_get(top, "tie_word_embeddings") : NULL;
    if (get_bool(tw && !json_is_null(tw) ? top : o, "tie_word_embeddings", 0, &c->tie_word_embeddings, what, err, err_len))
        return -1;
    if (c->num_hidden_layers > HF_MAX_LAYERS)
        return err_fail(err, err_len, "%s: \"%snum_hidden_layers\" %d exceeds the supported %d", what, pre,
                        c->num_hidden_layers, HF_MAX_LAYERS);
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return err_fail(err, err_len, "%s: \"%snum_key_value_heads\" %d does not divide \"num_attention_heads\" %d",
                        what, pre, c->num_key_value_heads, c->num_attention_heads);
    if (c->linear_num_value_heads % c->linear_num_key_heads != 0)
        return err_fail(err, err_len, "%s: \"%slinear_num_key_heads\" %d does not divide \"linear_num_value_heads\" %d",
                        what, pre, c->linear_num_key_heads, c->linear_num_value_heads);
    int flag = 0;
    if (get_bool(o, "attention_bias", 0, &flag, w, err, err_len)) return -1;
    if (flag) return err_fail(err, err_len, "%s: \"%sattention_bias\" is true; q/k/v/o biases are not supported", what, pre);
    json_t *act = json_object_get(o, "hidden_act");
    if (act && !json_is_null(act) && !(json_is_string(act) && strcmp(json_string_value(act), "silu") == 0))
        return err_fail(err, err_len, "%s: \"%shidden_act\" is not 'silu'; only silu is supported", what, pre);

    /* layer_types, else full_attention_interval (transformers: full every 4th layer) */
    json_t *lt = json_object_get(o, "layer_types");
    if (lt && !json_is_null(lt)) {
        if (!json_is_array(lt) || (int)json_array_size(lt) != c->num_hidden_layers)
            return err_fail(err, err_len, "%s: \"%slayer_types\" must be a list of num_hidden_layers = %d strings", what,
                            pre, c->num_hidden_layers);
        for (int i = 0; i < c->num_hidden_layers; i++) {
            json_t *e = json_array_get(lt, (size_t)i);
            const char *s = json_is_string(e) ? json_string_value(e) : "";
            if (strcmp(s, "linear_attention") == 0) c->layer_linear[i] = 1;
            else if (strcmp(s, "full_attention") == 0) c->layer_linear[i] = 0;
            else
                return err_fail(err, err_len, "%s: \"%slayer_types[%d]\" is '%s'; supported are linear_attention and "
                                "full_attention", what, pre, i, s);
        }
    } else {
        int every = 4;
        if (get_int(o, "full_attention_interval", 4, &every, w, err, err_len)) return -1;
        for (int i = 0; i < c->num_hidden_layers; i++) c->layer_linear[i] = (i + 1) % every != 0;
    }

    int found = 0;
    c->dtype = ST_BF16;
    if (get_dtype(o, &c->dtype, &found, w, err, err_len)) return -1;
    if (!found && nested && get_dtype(top, &c->dtype, &found, what, err, err_len)) return -1;

    /* RoPE: rope_parameters (transformers 5), else the older rope_theta / rope_scaling. Only the
     * default rope type; partial rotary; M-RoPE sections are checked, text positions make them moot. */
    json_t *rp = json_object_get(o, "rope_parameters");
    char field[64];
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return err_fail(err, err_len, "%s: \"%srope_parameters\" is not an object", what, pre);
        snprintf(field, sizeof field, "%srope_parameters.", pre);
    } else {
        rp = json_object_get(o, "rope_scaling");
        if (rp && !json_is_null(rp) && !json_is_object(rp))
            return err_fail(err, err_len, "%s: \"%srope_scaling\" is not an object or null", what, pre);
        if (!rp || json_is_null(rp)) rp = o;
        snprintf(field, sizeof field, "%s%s", pre, rp == o ? "" : "rope_scaling.");
    }
    json_t *th = json_object_get(rp, "rope_theta");
    if (get_num(th ? rp : o, "rope_theta", 10000.0, &c->rope_theta, w, err, err_len)) return -1;
    json_t *jt = json_object_get(rp, "rope_type");
    if (!jt) jt = json_object_get(rp, "type");
    if (jt && !(json_is_string(jt) && strcmp(json_string_value(jt), "default") == 0))
        return err_fail(err, err_len, "%s: \"%srope_type\" is %s%s%s; Qwen3.5 targets support the default rope type "
                        "only", what, field, json_is_string(jt) ? "'" : "",
                        json_is_string(jt) ? json_string_value(jt) : "not a string", json_is_string(jt) ? "'" : "");
    c->rope_type = HF_ROPE_DEFAULT;
    double prf = 0.25;
    json_t *pj = json_object_get(rp, "partial_rotary_factor");
    if (get_fraction(pj ? rp : o, "partial_rotary_factor", 0.25, &prf, what, pj ? field : pre, err, err_len)) return -1;
    c->rotary_dim = (int)(c->head_dim * prf);   /* Python int(): truncation */
    if (c->rotary_dim < 2 || c->rotary_dim % 2 || c->head_dim % 2)
        return err_fail(err, err_len, "%s: head_dim %d x \"%spartial_rotary_factor\" %g gives %d rotary dims; they "
                        "must be a positive even number", what, c->head_dim, pj ? field : pre, prf, c->rotary_dim);
    json_t *ms = json_object_get(rp, "mrope_section");
    if (ms && !json_is_null(ms)) {
        if (!json_is_array(ms) || json_array_size(ms) != 3)
            return err_fail(err, err_len, "%s: \"%smrope_section\" must be a list of 3 integers", what, field);
        int sum = 0;
        for (int i = 0; i < 3; i++) {
            json_t *e = json_array_get(ms, (size_t)i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > 65536)
                return err_fail(err, err_len, "%s: \"%smrope_section[%d]\" must be a non-negative integer", what, field, i);
            c->mrope_section[i] = (int)json_integer_value(e);
            sum += c->mrope_section[i];
        }
        if (sum != c->rotary_dim / 2)
            return err_fail(err, err_len, "%s: \"%smrope_section\" [%d, %d, %d] sums to %d, but the rotary dims give %d "
                            "frequencies (head_dim %d x partial_rotary_factor %g / 2)", what, field, c->mrope_section[0],
                            c->mrope_section[1], c->mrope_section[2], sum, c->rotary_dim / 2, c->head_dim, prf);
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
        arch = strcmp(mt, "qwen3") == 0 ? "Qwen3ForCausalLM" : strcmp(mt, "llama") == 0 ? "LlamaForCausalLM"
             : strcmp(mt, "qwen3_5") == 0 ? "Qwen3_5ForConditionalGeneration"
             : strcmp(mt, "qwen3_5_text") == 0 ? "Qwen3_5ForCausalLM" : mt;
    } else {
        return err_fail(err, err_len, "%s: neither \"architectures\" nor \"model_type\" is given", what);
    }
    if (strstr(arch, "Qwen3_5Moe") == arch || (mt && strncmp(mt, "qwen3_5_moe", 11) == 0))
        return err_fail(err, err_len, "%s: \"%s\" is '%s': the Qwen3.5 MoE variants are not supported (dense "
                        "Qwen3_5ForCausalLM / Qwen3_5ForConditionalGeneration only)", what,
                        strstr(arch, "Qwen3_5Moe") == arch ? "architectures" : "model_type",
                        strstr(arch, "Qwen3_5Moe") == arch ? arch : mt);
    if (strcmp(arch, "Qwen3_5ForConditionalGeneration") == 0 || strcmp(arch, "Qwen3_5ForCausalLM") == 0 ||
        (!json_is_array(ja) && mt && (strcmp(mt, "qwen3_5") == 0 || strcmp(mt, "qwen3_5_text") == 0)))
        return parse_qwen35(c, o, arch, mt, what, err, err_len);
    if (strcmp(arch, "Qwen3ForCausalLM") == 0) { c->arch = HF_ARCH_QWEN3; c->qk_norm = 1; }
    else if (strcmp(arch, "LlamaForCausalLM") == 0) c->arch = HF_ARCH_LLAMA;
    else
        return err_fail(err, err_len, "%s: architecture '%s' is not supported; supported are Qwen3ForCausalLM, "
                    "LlamaForCausalLM, Qwen3_5ForCausalLM and Qwen3_5ForConditionalGeneration", what, arch);
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
    c->rotary_dim = c->head_dim;
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

/* Qwen3.5, flat transformers-5 layout (Qwen3_5ForCausalLM, model_type qwen3_5_text). */
static json_t *qwen35_json(const struct model_config *c) {
    json_t *o = json_object(), *arch = json_array(), *lt = json_array(), *rp = json_object(), *ms = json_array();
    if (!o || !arch || !lt || !rp || !ms) { json_decref(o); json_decref(arch); json_decref(lt); json_decref(rp); json_decref(ms); return NULL; }
    int bad = 0;
#define SET(k, v) bad |= json_object_set_new(o, (k), (v)) != 0
    bad |= json_array_append_new(arch, json_string("Qwen3_5ForCausalLM"));
    SET("architectures", arch);
    SET("attention_bias", json_false());
    SET("attention_dropout", json_real(0.0));
    SET("dtype", json_string(c->dtype == ST_F32 ? "float32" : c->dtype == ST_F16 ? "float16" : "bfloat16"));
    SET("head_dim", json_integer(c->head_dim));
    SET("hidden_act", json_string("silu"));
    SET("hidden_size", json_integer(c->hidden_size));
    SET("initializer_range", json_real(0.02));
    SET("intermediate_size", json_integer(c->intermediate_size));
    for (int i = 0; i < c->num_hidden_layers; i++)
        bad |= json_array_append_new(lt, json_string(c->layer_linear[i] ? "linear_attention" : "full_attention"));
    SET("layer_types", lt);
    SET("linear_conv_kernel_dim", json_integer(c->linear_conv_kernel_dim));
    SET("linear_key_head_dim", json_integer(c->linear_key_head_dim));
    SET("linear_num_key_heads", json_integer(c->linear_num_key_heads));
    SET("linear_num_value_heads", json_integer(c->linear_num_value_heads));
    SET("linear_value_head_dim", json_integer(c->linear_value_head_dim));
    SET("max_position_embeddings", json_integer(c->max_position_embeddings));
    SET("model_type", json_string("qwen3_5_text"));
    SET("num_attention_heads", json_integer(c->num_attention_heads));
    SET("num_hidden_layers", json_integer(c->num_hidden_layers));
    SET("num_key_value_heads", json_integer(c->num_key_value_heads));
    SET("rms_norm_eps", json_real(c->rms_norm_eps));
    int half = c->rotary_dim / 2;
    int sec[3] = {c->mrope_section[0], c->mrope_section[1], c->mrope_section[2]};
    if (sec[0] + sec[1] + sec[2] != half) { sec[1] = half / 3; sec[2] = half / 3; sec[0] = half - 2 * (half / 3); }
    for (int i = 0; i < 3; i++) bad |= json_array_append_new(ms, json_integer(sec[i]));
    bad |= json_object_set_new(rp, "mrope_interleaved", json_true()) != 0;
    bad |= json_object_set_new(rp, "mrope_section", ms) != 0;
    bad |= json_object_set_new(rp, "partial_rotary_factor", json_real((double)c->rotary_dim / c->head_dim)) != 0;
    bad |= json_object_set_new(rp, "rope_theta", json_real(c->rope_theta)) != 0;
    bad |= json_object_set_new(rp, "rope_type", json_string("default")) != 0;
    SET("rope_parameters", rp);
    SET("tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    SET("transformers_version", json_string("5.0.0"));
    SET("use_cache", json_true());
    SET("vocab_size", json_integer(c->vocab_size));
#undef SET
    if (bad) { json_decref(o); return NULL; }
    return o;
}

int hf_config_write(const struct model_config *c, const char *path, char *err, int err_len) {
    if (c->arch == HF_ARCH_QWEN3_5) {
        if (c->nested)
            return err_fail(err, err_len, "%s: writing the multimodal Qwen3_5ForConditionalGeneration layout is not "
                            "supported; write the text model (Qwen3_5ForCausalLM)", path);
        json_t *o = qwen35_json(c);
        if (!o) return err_fail(err, err_len, "%s: could not build the config (out of memory?)", path);
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
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

int hf_config_rotary_dim(const struct model_config *c) {
    return c->rotary_dim > 0 ? c->rotary_dim : c->head_dim;
}

/* fp32 helpers: one rounding per torch op. The volatile stores keep each operation rounded to
 * fp32 on its own (no contraction or wider evaluation), as torch's elementwise kernels do. */
static float f32_div(float a, float b) { volatile float r = a / b; return r; }
static float f32_mul(float a, float b) { volatile float r = a * b; return r; }
static float f32_add(float a, float b) { volatile float r = a + b; return r; }
static float f32_sub(float a, float b) { volatile float r = a - b; return r; }
/* theta^e correctly rounded to fp32 (the double power has ~0.5 ulp of double error, far inside the
 * fp32 rounding interval except in ties that no (theta, e) of a config produces in practice). */
static float f32_pow(float base, float e) { volatile float r = (float)pow((double)base, (double)e); return r; }

void hf_rope_inv_freq(const struct model_config *c, double *inv_freq) {
    int R = hf_config_rotary_dim(c), half = R / 2;
    /* transformers: base ** (arange(0, R, 2, int64).float() / R); 1.0 / that. Python scalars enter
     * torch's fp32 ops rounded to fp32. */
    float base = (float)c->rope_theta;
    for (int i = 0; i < half; i++) {
        float e = f32_div((float)(2 * i), (float)R);
        float f = f32_div(1.0f, f32_pow(base, e));
        if (c->rope_type == HF_ROPE_LINEAR) {
            f = f32_div(f, (float)c->rope_factor);                   /* inv_freq /= factor */
        } else if (c->rope_type == HF_ROPE_LLAMA3) {
            /* _compute_llama3_parameters, op by op in fp32 */
            double old_ctx = (double)c->rope_original_max_position_embeddings;
            float low_wl = (float)(old_ctx / c->rope_low_freq_factor);     /* Python floats, then fp32 */
            float high_wl = (float)(old_ctx / c->rope_high_freq_factor);
            float factor = (float)c->rope_factor;
            /* torch evaluates scalar / tensor as tensor.reciprocal() * scalar */
            float wl = f32_mul(f32_div(1.0f, f), (float)(2.0 * M_PI));          /* 2 * math.pi / inv_freq */
            float fl = wl > low_wl ? f32_div(f, factor) : f;                  /* where(wl > low, f / factor, f) */
            float smooth = f32_div(f32_sub(f32_mul(f32_div(1.0f, wl), (float)old_ctx), (float)c->rope_low_freq_factor),
                                   (float)(c->rope_high_freq_factor - c->rope_low_freq_factor));
            float smoothed = f32_add(f32_div(f32_mul(f32_sub(1.0f, smooth), fl), factor), f32_mul(smooth, fl));
            int medium = !(wl < high_wl) && !(wl > low_wl);
            f = medium ? smoothed : fl;
        }
        inv_freq[i] = f;
    }
}

int hf_zlab_layer_ids(int n_target_layers, int n_draft_layers, int *ids) {
    if (n_target_layers < 1 || n_draft_layers < 1) return -1;
    if (n_draft_layers == 1) {
        /* issue 26: never the last layer (SGLang cannot capture it, z-lab reads it after the final norm):
         * n / 2 is the last layer only for n <= 2 */
        ids[0] = n_target_layers / 2 < n_target_layers - 1 ? n_target_layers / 2 : n_target_layers - 2;
        return ids[0] < 0 ? -1 : 0;
    }
    int start = 1, end = n_target_layers - 3, span = end - start;
    for (int i = 0; i < n_draft_layers; i++) {
        /* Python: int(round(start + (i * span) / (L_d - 1))); round() is half-to-even, as rint()
         * is in the default rounding mode. */
        double x = (double)start + (double)(i * span) / (double)(n_draft_layers - 1);
        ids[i] = (int)rint(x);
        if (ids[i] < 0 || ids[i] >= n_target_layers - 1) return -1;   /* the last layer: see above */
    }
    return 0;
}

int hf_config_linear_conv_dim(const struct model_config *c) {
    return 2 * c->linear_num_key_heads * c->linear_key_head_dim + c->linear_num_value_heads * c->linear_value_head_dim;
}

int hf_config_linear_in_dim(const struct model_config *c) {
    return hf_config_linear_conv_dim(c) + c->linear_num_value_heads * c->linear_value_head_dim +
           2 * c->linear_num_value_heads;
}

int64_t hf_config_n_params(const struct model_config *c) {
    int64_t C = c->hidden_size, V = c->vocab_size, I = c->intermediate_size, d = c->head_dim;
    if (c->arch == HF_ARCH_QWEN3_5) {
        int64_t q = (int64_t)c->num_attention_heads * d, kv = (int64_t)c->num_key_value_heads * d;
        int64_t vd = (int64_t)c->linear_num_value_heads * c->linear_value_head_dim, nv = c->linear_num_value_heads;
        int64_t full = C * 2 * q + 2 * C * kv + q * C + 2 * d;
        int64_t lin = C * hf_config_linear_in_dim(c) + (int64_t)hf_config_linear_conv_dim(c) * c->linear_conv_kernel_dim +
                      2 * nv + c->linear_value_head_dim + vd * C;
        int64_t total = V * C + C + (c->tie_word_embeddings ? 0 : V * C);
        for (int l = 0; l < c->num_hidden_layers; l++) total += (c->layer_linear[l] ? lin : full) + 3 * C * I + 2 * C;
        return total;
    }
    int64_t q = (int64_t)c->num_attention_heads * d, kv = (int64_t)c->num_key_value_heads * d;
    int64_t layer = C * q + 2 * C * kv + q * C + 3 * C * I + 2 * C + (c->qk_norm ? 2 * d : 0);
    return V * C + (int64_t)c->num_hidden_layers * layer + C + (c->tie_word_embeddings ? 0 : V * C);
}

json_t *hf_rope_scaling_json(const struct model_config *t) {
    if (t->rope_type == HF_ROPE_LINEAR) return json_pack("{s:s, s:f}", "rope_type", "linear", "factor", t->rope_factor);
    if (t->rope_type == HF_ROPE_LLAMA3)
        return json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", t->rope_factor,
                         "low_freq_factor", t->rope_low_freq_factor, "high_freq_factor", t->rope_high_freq_factor,
                         "original_max_position_embeddings", t->rope_original_max_position_embeddings);
    return json_null();
}
