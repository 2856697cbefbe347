/*
 * stages/model/hfconfig.h — a Hugging Face config.json for the target model, as a plain struct.
 *
 * Supported: Qwen3ForCausalLM (q_norm/k_norm per head), LlamaForCausalLM (optionally with
 * Llama-3 rope scaling) and the Qwen3.5 / Qwen3.6 hybrid in its transformers-5 layouts:
 * Qwen3_5ForCausalLM (model_type qwen3_5_text, flat) and Qwen3_5ForConditionalGeneration
 * (model_type qwen3_5, the text model in "text_config", weights under model.language_model.; the
 * vision tower is ignored: the target takes text tokens only, and target_check_batch refuses the
 * image_token_id / video_token_id placeholders). Qwen3.5 reads layer_types
 * (linear_attention | full_attention; absent: full_attention_interval, default 4), head_dim
 * (default 256), rope_parameters with partial_rotary_factor (default 0.25) and mrope_section (must
 * sum to rotary_dim/2), and the linear_* Gated DeltaNet sizes (defaults as Qwen3_5TextConfig).
 * Rejected with the key named: the MoE variants (qwen3_5_moe, num_experts), a rope type other than
 * default, attention_bias, hidden_act other than silu, an unknown layer type, layer_types of the
 * wrong length. Both transformers 4 spellings (rope_theta + rope_scaling, torch_dtype) and
 * transformers 5 spellings (rope_parameters, dtype) are read. Anything the forward would compute
 * differently from transformers is rejected with one sentence naming the file and field:
 * another architecture, attention_bias or mlp_bias true, hidden_act other than silu, Qwen3
 * use_sliding_window true, a rope type other than default/linear/llama3, inconsistent sizes
 * (hidden or heads not positive, kv heads not dividing heads).
 *
 * Defaults for absent fields follow transformers: num_key_value_heads = num_attention_heads;
 * head_dim = hidden_size / num_attention_heads for Llama and 128 for Qwen3 (Qwen3Config's own
 * default; every published Qwen3 config writes it explicitly); rms_norm_eps 1e-6; rope_theta 1e4;
 * tie_word_embeddings false; max_position_embeddings 32768 (Qwen3) / 2048 (Llama); dtype bf16.
 * vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads are required.
 *
 * Nothing here exits; functions return 0/-1 with a sentence in err. Pure functions, thread-safe.
 */
#ifndef STAGES_MODEL_HFCONFIG_H
#define STAGES_MODEL_HFCONFIG_H

#include "core/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

enum hf_arch { HF_ARCH_QWEN3 = 1, HF_ARCH_LLAMA = 2, HF_ARCH_QWEN3_5 = 3 };

#define HF_MAX_LAYERS 1024   /* layer_types entries at most (Qwen3.5) */
enum hf_rope_type { HF_ROPE_DEFAULT = 0, HF_ROPE_LINEAR = 1, HF_ROPE_LLAMA3 = 2 };

struct model_config {
    enum hf_arch arch;
    char architecture[64];           /* "Qwen3ForCausalLM" | "LlamaForCausalLM" */
    char model_type[32];             /* "qwen3" | "llama" */
    int vocab_size;                  /* V */
    int hidden_size;                 /* C */
    int intermediate_size;           /* I (MLP width) */
    int num_hidden_layers;           /* n */
    int num_attention_heads;         /* n_h */
    int num_key_value_heads;         /* n_kv (divides n_h) */
    int head_dim;                    /* d_h (q/k/v width per head; need not equal C / n_h) */
    int qk_norm;                     /* 1 for Qwen3: RMSNorm over each head's q and k (weight [d_h]) */
    double rms_norm_eps;
    double rope_theta;
    enum hf_rope_type rope_type;
    double rope_factor;              /* linear, llama3 */
    double rope_low_freq_factor;     /* llama3 */
    double rope_high_freq_factor;    /* llama3 */
    int rope_original_max_position_embeddings;  /* llama3 */
    int tie_word_embeddings;         /* 1: no lm_head.weight, the LM head is model.embed_tokens.weight */
    int max_position_embeddings;
    enum st_dtype dtype;             /* torch_dtype / dtype: ST_BF16, ST_F16 or ST_F32 */

    /* ---- Qwen3.5 / Qwen3.6 hybrid (arch HF_ARCH_QWEN3_5); zero for Qwen3 and Llama ---- */
    int rotary_dim;                  /* dims rotated per head: int(head_dim · partial_rotary_factor);
                                      * = head_dim for Qwen3 / Llama (hf_config_rotary_dim) */
    int mrope_section[3];            /* M-RoPE split of rotary_dim/2 (t, h, w); text positions only:
                                      * all three components equal, so it does not change the angle */
    int nested;                      /* 1: a multimodal checkpoint (Qwen3_5ForConditionalGeneration,
                                      * text_config); weights under "model.language_model." */
    int linear_conv_kernel_dim;      /* K of the causal depthwise conv1d */
    int linear_key_head_dim;         /* d_k of the Gated DeltaNet */
    int linear_value_head_dim;       /* d_v */
    int linear_num_key_heads;        /* n_k (divides n_v) */
    int linear_num_value_heads;      /* n_v */
    unsigned char layer_linear[HF_MAX_LAYERS];   /* 1: linear_attention (Gated DeltaNet), 0: gated full attention */
    int image_token_id;              /* multimodal configs: the image / video placeholder tokens, whose */
    int video_token_id;              /* embeddings transformers replaces by vision features (0: none) */
};

/* Read and validate `path` (a config.json file, or a directory holding one). 0/-1. */
int hf_config_load(struct model_config *c, const char *path, char *err, int err_len);
/* Parse config text; `what` names the source in messages (usually the path). 0/-1. */
int hf_config_parse(struct model_config *c, const char *json_text, const char *what,
                    char *err, int err_len);
/* Write c as a transformers-4 style config.json (the layout published checkpoints use, read by
 * transformers 4 and 5 alike), atomically. 0/-1. */
int hf_config_write(const struct model_config *c, const char *path, char *err, int err_len);

/* Dimensions of each head that RoPE rotates: head_dim, or Qwen3.5's partial rotary_dim. */
int hf_config_rotary_dim(const struct model_config *c);

/* RoPE inverse frequencies inv_freq[i], i < R/2 with R = hf_config_rotary_dim(c) (= head_dim for
 * Qwen3 / Llama), as transformers computes them in fp32 for the config's rope type: every value
 * is an fp32 number (stored in a double so existing callers keep their buffers; rounding it to
 * float is exact). The sequence is torch's: e = float(2i) / float(R) in fp32; p = theta^e rounded
 * to fp32; f = 1 / p in fp32; linear: f / factor; llama3: _compute_llama3_parameters' fp32
 * wavelength / smoothing arithmetic, step by step (scalar / tensor as reciprocal() * scalar, as
 * torch evaluates it). theta^e is the correctly rounded fp32 power. Measured against torch 2.15 /
 * transformers 5.24 over 7 thetas x 8 dims x 3 rope types (7560 values): bit-identical to torch's
 * scalar CPU kernels (ATEN_CPU_CAPABILITY=default: 0 differences); torch's SIMD kernels use
 * SLEEF's powf_u10 on whole vectors (the tail goes through std::pow), which is 1 ulp off in a few
 * entries, so torch itself differs by CPU: 12 of 2520 per rope type on AVX-512, 14 on AVX2, each
 * 1 ulp (the former double-precision formula differed in 1072 of 2520, up to 6 ulp). The rotation is the
 * half-split (rotate_half) form over the first R dims: pairs (x[i], x[i + R/2]). */
void hf_rope_inv_freq(const struct model_config *c, double *inv_freq /* (R/2) */);
/* The config.json "rope_scaling" value of c as transformers writes it: a new JSON object for linear and llama3
 * scaling, JSON null for none (the caller owns the reference; jansson's json_t). */
struct json_t *hf_rope_scaling_json(const struct model_config *c);

/* The z-lab default target layer ids (dflash-reference.md §3.1, build_target_layer_ids): for one
 * draft layer [n/2] ([n-2] when n/2 is the last layer, n = 2); else round-half-even(1 + i*(n-4)/(L_d-1)),
 * i < L_d. Never the target's last layer (issue 26: SGLang cannot capture it and z-lab reads it after the
 * final norm). Writes n_draft_layers ids; returns 0, or -1 if n_target_layers < 1 or n_draft_layers < 1 or
 * an id falls outside [0, n_target_layers - 1) (tiny targets). Qwen3-8B (36, 5) gives [1, 9, 17, 25, 33]. */
int hf_zlab_layer_ids(int n_target_layers, int n_draft_layers, int *ids);

/* Qwen3.5 derived sizes: the Gated DeltaNet conv channels 2·n_k·d_k + n_v·d_v and the fused input
 * projection rows [qkv; z; b; a] = conv channels + n_v·d_v + 2·n_v. */
int hf_config_linear_conv_dim(const struct model_config *c);
int hf_config_linear_in_dim(const struct model_config *c);

/* Total parameter count of the model the config describes (embedding, layers, norm, lm_head
 * unless tied). */
int64_t hf_config_n_params(const struct model_config *c);

#ifdef __cplusplus
}
#endif

#endif /* STAGES_MODEL_HFCONFIG_H */
