/*
 * stages/export/export.h — drafter exports that vLLM and SGLang load, and the checker that reads an export the
 * way each serving loader does (issue 17 items 1-2; dflash-reference.md §3.1, §4.1, §11).
 *
 * DESIGN
 * - Two layouts, both bf16 safetensors + config.json + README.md, written into OUT.tmp.<pid>/ and renamed over
 *   OUT only when every file is durable (an existing export at OUT is swapped out and removed; a directory that
 *   is not an export is refused):
 *   zlab         config.json is a flattened Qwen3Config of the draft + architectures ["DFlashDraftModel"],
 *                auto_map, block_size (top level and in dflash_config), num_target_layers and
 *                dflash_config {target_layer_ids (z-lab ids), mask_token_id, block_size, causal when every layer
 *                has the same causality}; weights are the body only (fc, hidden_norm, norm, layers.*): the
 *                target's embedding and full LM head are used at serving time, so a pruned draft vocabulary is
 *                refused for this layout.
 *   speculators  config.json is drafter_config_json_text (stages/train/drafter_dump.c: the one writer of the
 *                speculators config, shared with the debug dump); weights are the body + embed_tokens.weight +
 *                lm_head.weight (+ t2d BOOL / d2t I64 when the draft vocabulary is pruned).
 *   Both configs also carry "dflash_pipe": what training meant (layer types, window, per-layer causality, ids,
 *   block size, mask token, vocabulary sizes). Loaders ignore unknown keys; the checker compares what each
 *   loader derives from the loader keys against it, so a key a loader reads differently is caught without the
 *   checkpoint.
 * - The checker (export_check) detects the layout, then applies the vLLM rules and the SGLang rules (zlab
 *   layout only: SGLang's dflash loader reads the z-lab form) and refuses with one sentence naming the file, the
 *   loader and the key. The rules are listed beside export_check below. Optionally it compares the weights with
 *   a drafter (a checkpoint loaded with export_load_checkpoint): stored bf16 == bf16(master) for every tensor.
 * - Reading a checkpoint (export_load_checkpoint) rebuilds the drafter config from the checkpoint's config JSON
 *   (stages/dflash-train.c config_to_json) and the target directory, refuses a target that does not fit, and
 *   loads the trainable weights through the same ckpt table the trainer saves (weights + optimizer state).
 *
 * Library code: every function returns 0/-1 with one sentence in err and never exits.
 */
#ifndef STAGES_EXPORT_EXPORT_H
#define STAGES_EXPORT_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "train/drafter.h"

#ifdef __cplusplus
extern "C" {
#endif

enum export_format { EXPORT_ZLAB = 0, EXPORT_SPECULATORS = 1 };
const char *export_format_name(int format);   /* "zlab" | "speculators" */

/* Rebuild the drafter a checkpoint was trained as: the config from the checkpoint's JSON + target_dir (its
 * config.json and tokenizer files; the frozen tensors are read from it too), draft_vocab_dir (t2d.npy, d2t.npy)
 * when the checkpoint's draft_vocab_size < vocab_size (NULL otherwise). The planned sizes are overridden by
 * T_max / N when > 0 (dflash-eval plans for one block). A target whose hidden size, layer count or vocabulary
 * differs from the checkpoint's fails with "CKPT: key K is X, the target DIR has Y". *step gets the checkpoint's
 * step (may be NULL). Returns the drafter or NULL with a sentence. */
struct drafter *export_load_checkpoint(const char *ckpt_path, const char *target_dir, const char *draft_vocab_dir,
                                       int T_max, int N, int64_t *step, char *err, int err_len);

/* The z-lab config.json text of a drafter config (malloc'd; NULL when out of memory). */
char *export_zlab_config_json_text(const struct drafter_config *c);

/* Write the export of d in format into out_dir atomically (see DESIGN). verifier_name (the target's path or hub
 * name) goes into the configs and the README's serve lines. */
int export_write(const struct drafter *d, int format, const char *out_dir, const char *verifier_name, char *err,
                 int err_len);

/* What dflash-train writes at the end of a run: RUN/export/zlab and RUN/export/speculators (the z-lab layout is
 * skipped, with a sentence in skipped, when the drafter has a pruned vocabulary or sample_from_anchor), each
 * checked right after it is written (weights against d; SGLang's rules skipped for a drafter it cannot serve).
 * skipped (may be NULL) gets "" or the reason. 0/-1. */
int export_write_run(const struct drafter *d, const char *run_dir, const char *verifier_name, char *skipped,
                     size_t skipped_len, char *err, int err_len);

/* What the checker derived, as the loaders read it. */
struct export_derived {
    int format;                               /* enum export_format */
    int L, B, k, H, V, V_d, n_target;
    int zlab_ids[DESC_MAX_LAYERS];             /* what is captured, z-lab convention */
    int64_t mask_token_id;
    int sliding[DRAFTER_MAX_LAYERS];           /* per layer */
    int causal[DRAFTER_MAX_LAYERS];            /* per layer, as vLLM derives it */
    int window;                                /* vLLM's window (0: no sliding layer) */
    int mixed;                                 /* sliding and full layers both present */
    int sample_from_anchor;                    /* speculators: slot 0 trained too */
    int sglang_ok;                             /* SGLang's fixed causality (sliding => causal) is training's */
    char verifier[512];
};

struct export_check_opts {
    const char *target_dir;                    /* NULL: no target checks (vocabulary, hidden size, layer count) */
    const struct drafter *d;                   /* NULL: no weight comparison */
    int vllm_only;                             /* skip the SGLang rules (a drafter SGLang cannot serve) */
};

/* Check an export directory (see DESIGN). Rules (each refusal names the file, the loader and the key):
 *   files      config.json (a JSON object) and model.safetensors present; README.md present
 *   vLLM       every tensor name maps after vLLM's renames (a "model." prefix dropped, midlayer. -> layers.0.) to a
 *              parameter of the draft (q/k/v and gate/up fused: their shapes must agree), nothing unknown, every
 *              one present; fc.weight is [H, H * number of target layers];
 *              zlab: dflash_config.target_layer_ids read as z-lab ids (+1 at capture) inside [0, num_target_layers);
 *              causality from is_causal, then dflash_config.causal, else sliding => causal, equal to training's;
 *              window from dflash_config.swa_window_size, else sliding_window, equal to training's; a
 *              target_hidden_size key (vLLM multiplies it) equal to hidden_size; a mixed sliding/full drafter
 *              must say in README.md that it needs vLLM's V2 model runner;
 *              speculators: aux_hidden_state_layer_ids and mask_token_id present, causal = not
 *              sliding_window_non_causal for every layer (vLLM maps it to dflash_config.causal) equal to training's
 *              (so a drafter with causal sliding and bidirectional full layers is refused in this layout), block width = speculative_tokens + 1 = block_size,
 *              use_sliding_window true when a layer slides (else transformers nulls the window);
 *   SGLang     (zlab) layers.*, fc.weight, hidden_norm.weight, norm.weight present (it ignores unknown keys, so a
 *              missing one is an error here), no embed/lm_head needed; hidden_act "silu"; block_size from
 *              dflash_config (default 16) equal to training's; target_layer_ids from dflash_config or the top
 *              level equal to training's; mask_token_id a non-negative integer inside the vocabulary (the
 *              target's when given); layer_types only full_attention / sliding_attention, one per layer;
 *              sliding_window present and >= 2 when a layer slides (SGLang uses window - 1); SGLang runs
 *              sliding layers causal and full layers bidirectional whatever the config says, so that must be
 *              training's causality (a sliding_window_non_causal drafter is vLLM-only: vllm_only);
 *   target     (opts->target_dir) hidden size, layer count and vocabulary equal to the export's;
 *   weights    (opts->d) every exported tensor equal to bf16 of the drafter's fp32 master.
 * Fills *out (may be NULL). 0/-1 with a sentence. */
int export_check(const char *dir, const struct export_check_opts *opts, struct export_derived *out, char *err,
                 int err_len);

/* 1 when vLLM can serve the speculators layout of c: it applies causal = not sliding_window_non_causal to every
 * layer, so the trained causality must be the same in every layer (all sliding causal, or all bidirectional). */
int export_speculators_vllm_servable(const struct drafter_config *c);

/* 1 when SGLang can serve a drafter of config c (its sliding layers are causal in the block, as SGLang runs them). */
int export_sglang_servable(const struct drafter_config *c);

/* A drafter from an export directory (either layout; accepted by export_check, SGLang's rules skipped): the config
 * as the loaders derive it + target_dir, the exported tensors widened from bf16 (the embedding and LM head come
 * from the target for the z-lab layout). T_max / N override the planned sizes when > 0. NULL with a sentence. */
struct drafter *export_load_dir(const char *dir, const char *target_dir, int T_max, int N, char *err, int err_len);

/* The exact serving lines for this export and target into buf (vllm serve + SGLang launch_server unless
 * x->sglang_ok is 0). */
void export_serve_lines(const struct export_derived *x, const char *dir, const char *target, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_EXPORT_EXPORT_H */
