/*
 * stages/model/hfconfig.h — a Hugging Face config.json for the target model, as a plain struct.
 *
 * Supported: Qwen3ForCausalLM (q_norm/k_norm per head) and LlamaForCausalLM (optionally with
 * Llama-3 rope scaling). Both transformers 4 spellings (rope_theta + rope_scaling, torch_dtype) and
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

#include "model/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

enum hf_arch { HF_ARCH_QWEN3 = 1, HF_ARCH_LLAMA = 2 };
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
};

/* Read and validate `path` (a config.json file, or a directory holding one). 0/-1. */
int hf_config_load(struct model_config *c, const char *path, char *err, int err_len);
/* Parse config text; `what` names the source in messages (usually the path). 0/-1. */
int hf_config_parse(struct model_config *c, const char *json_text, const char *what,
                    char *err, int err_len);
/* Write c as a transformers-4 style config.json (the layout published checkpoints use, read by
 * transformers 4 and 5 alike), atomically. 0/-1. */
int hf_config_write(const struct model_config *c, const char *path, char *err, int err_len);

/* RoPE inverse frequencies inv_freq[i], i < head_dim/2, exactly as transformers computes them for
 * the config's rope type (default: theta^(-2i/d_h); linear: divided by factor; llama3: the
 * wavelength-dependent smoothing of _compute_llama3_parameters). Double precision; the caller
 * rounds. The rotation is the half-split (rotate_half) form: pairs (x[i], x[i + d_h/2]). */
void hf_rope_inv_freq(const struct model_config *c, double *inv_freq /* (d_h/2) */);

/* The z-lab default target layer ids (dflash-reference.md §3.1, build_target_layer_ids): for one
 * draft layer [n/2]; else round-half-even(1 + i*(n-4)/(L_d-1)), i < L_d. Writes n_draft_layers
 * ids; returns 0, or -1 if n_target_layers < 1 or n_draft_layers < 1 or an id falls outside
 * [0, n_target_layers) (tiny targets). Qwen3-8B (36, 5) gives [1, 9, 17, 25, 33]. */
int hf_zlab_layer_ids(int n_target_layers, int n_draft_layers, int *ids);

/* Total parameter count of the model the config describes (embedding, layers, norm, lm_head
 * unless tied). */
int64_t hf_config_n_params(const struct model_config *c);

#ifdef __cplusplus
}
#endif

#endif /* STAGES_MODEL_HFCONFIG_H */
