/*
 * stages/export/export.h — drafter exports that vLLM and SGLang load, and the checker that reads an export the
 * way each serving loader does (issue 17 items 1-2; dflash-reference.md §3.1, §4.1, §11).
 *
 * DESIGN
 * - Two layouts, both bf16 safetensors + config.json + README.md, written into OUT.tmp.<pid>/ and renamed over
 *   OUT only when every file is durable (an existing export at OUT is swapped out and removed; a directory that
 *   is not an export is refused):
 *   zlab         config.json is a flattened Qwen3Config of the draft + architectures ["DFlashDraftModel"],
 *                auto_map, block_size (top level and in dflash_config), num_target_layers, draft_vocab_size,
 *                is_causal false when every layer was trained bidirectional while some layer slides (the one case
 *                where the loaders' default, sliding => causal, full => bidirectional, is not training's), and
 *                dflash_config {target_layer_ids (z-lab ids), mask_token_id, block_size, causal when every layer
 *                has the same causality}; weights are the body (fc, hidden_norm, norm, layers.*), plus
 *                lm_head.weight [V_d, H], t2d and d2t when the draft vocabulary is pruned (vLLM maps the draft
 *                ids through d2t when draft_vocab_size differs from the target's); dflash.py, our transformers
 *                modeling file (stages/export/dflash.py), is written beside them for auto_map.
 *   speculators  config.json is drafter_config_json_text (stages/train/drafter_dump.c: the one writer of the
 *                speculators config, shared with the debug dump); weights are the body + embed_tokens.weight +
 *                lm_head.weight (+ t2d BOOL / d2t I64 when the draft vocabulary is pruned).
 *   Both configs also carry "dflash_pipe": what training meant (layer types, window, per-layer causality, ids,
 *   block size, mask token, vocabulary sizes). Loaders ignore unknown keys; the checker compares what each
 *   loader derives from the loader keys against it, so a key a loader reads differently is caught without the
 *   checkpoint.
 * - The rules (export_rules) say, for a drafter configuration and a layout, whether each loader serves it as
 *   trained, or why not. They come from the loaders' own code, at these versions (re-check them on a new release):
 *     vLLM 0.33.0         vllm/model_executor/models/qwen3_dflash.py (_dflash_layer_causal, _resolve_layer_attention,
 *                         load_weights, compute_logits), vllm/transformers_utils/configs/speculators/algos.py
 *                         (update_dflash), vllm/v1/worker/gpu/spec_decode/{eagle/eagle3_utils.py,dflash/speculator.py},
 *                         vllm/model_executor/models/qwen2.py (aux capture after layer idx, pre-norm),
 *                         vllm/model_executor/model_loader/default_loader.py (weight tracking)
 *     SGLang 0.5.23       sglang/srt/models/dflash.py (_get_dflash_attention_type, load_weights),
 *                         sglang/srt/speculative/dflash_utils.py (parse_dflash_draft_config, sliding window),
 *                         sglang/srt/models/qwen3.py (layers_to_capture = id + 1, captured inside the layer loop),
 *                         sglang/srt/speculative/dflash_worker_v2.py (the target's LM head)
 *     speculators 0.9.0   speculators/models/dflash/{core,attention}.py, speculators/convert/dflash/converter.py
 *     z-lab reference     z-lab/dflash dflash/model.py (commit 44947fb): extract_context_feature, is_causal=False
 *   vLLM: causality is_causal, then dflash_config.causal, else sliding => causal (speculators layout: causal = not
 *   sliding_window_non_causal, one value for every layer); mixed sliding/full layers need the V2 model runner;
 *   captures after layer id, before the final norm (the last layer too); a pruned vocabulary through d2t;
 *   sample_from_anchor refused by the V2 runner (V1 treats the anchor as the bonus token); a tensor it does not
 *   know fails the load, a missing one is left uninitialised (DFlash's load_weights returns no loaded set, so the
 *   loader does not track it); names get "model." prepended (a "model." name fails), midlayer. -> layers.0.
 *   SGLang: reads only the z-lab layout; causality is_causal (one value) else sliding => causal, full =>
 *   bidirectional; captures layer id + 1 inside the layer loop, so the target's last layer is never captured;
 *   drafts with the target's full LM head (no d2t); ignores unknown tensors, strips "model.", does not know
 *   midlayer.; leaves a missing tensor uninitialised.
 *   speculators: its layout loads exactly; the z-lab layout goes through its converter, which drops the last
 *   target layer from the ids (fc's shape then fails), takes draft_vocab_size = vocab_size and
 *   sliding_window_non_causal false. speculators and the z-lab reference load through transformers, which does
 *   not rename midlayer.* (layer 0 would stay uninitialised).
 *   z-lab reference: its layout only; every layer bidirectional with no mask (no window with its default
 *   attention), hidden_states[id + 1] (after the final norm for the last layer), the target's full LM head.
 * - The checker (export_check) detects the layout, refuses what no loader reads as trained (a missing or unknown
 *   tensor, a NaN/inf weight, a key that disagrees with training), then derives each loader's verdict from the
 *   files and refuses when a loader that the rules say serves this configuration in this layout would not
 *   (opts->require names more), with one sentence naming the file, the loader and the key. Optionally it
 *   compares the weights with a drafter (a checkpoint loaded with export_load_checkpoint): stored bf16 ==
 *   bf16(master) for every tensor.
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

/* The loaders the rules cover (see DESIGN); the first two are the serving engines. */
enum export_engine { EXPORT_VLLM = 0, EXPORT_SGLANG = 1, EXPORT_SPECLIB = 2, EXPORT_ZLABREF = 3, EXPORT_N_ENGINES = 4 };
#define EXPORT_ENGINE_BIT(e) (1 << (e))
#define EXPORT_WHY_LEN 240
const char *export_engine_name(int engine);   /* "vLLM 0.33.0", "SGLang 0.5.23", "speculators 0.9.0", "z-lab reference" */

/* The rules: why[e] = "" when loader e serves a drafter of config c in layout format as trained, else the reason
 * (one clause, no period). Pure: reads only c (layer types, causality, window, ids vs the target's layer count,
 * V_d vs V_t, sample_from_anchor). A layout export_write refuses (z-lab + sample_from_anchor) has every reason set. */
void export_rules(const struct drafter_config *c, int format, char why[EXPORT_N_ENGINES][EXPORT_WHY_LEN]);

/* 1 when no serving engine (vLLM, SGLang) serves c as trained in either layout, with one line in err naming the
 * engines, the reason and the flag to change (dflash-train refuses it at start-up unless --allow-unservable);
 * 0 otherwise. */
int export_unservable(const struct drafter_config *c, char *err, int err_len);

/* A representative configuration of the rules table: layer types ("sliding,full,..."), sliding layers
 * non-causal, a pruned draft vocabulary, sample_from_anchor, the last target layer captured. */
struct export_rules_row { const char *name, *types; int nc, pruned, sfa, last; };
int export_rules_n_rows(void);
const struct export_rules_row *export_rules_row(int i);   /* NULL outside [0, n) */

/* The rules table (configuration -> layout -> each loader's verdict) for representative configurations, as the
 * README and dflash-export --help print it: Markdown rows, one per configuration and layout. */
void export_rules_table(char *buf, size_t len);

/* Rebuild the drafter a checkpoint was trained as: the config from the checkpoint's JSON + target_dir (its
 * config.json and tokenizer files; the frozen tensors are read from it too), draft_vocab_dir (t2d.npy, d2t.npy)
 * when the checkpoint's draft_vocab_size < vocab_size (NULL otherwise). The planned sizes are overridden by
 * T_max / N when > 0 (dflash-eval plans for one block). A target whose hidden size, layer count or vocabulary
 * differs from the checkpoint's fails with "CKPT: key K is X, the target DIR has Y". *step gets the checkpoint's
 * step (may be NULL). Returns the drafter or NULL with a sentence. */
struct drafter *export_load_checkpoint(const char *ckpt_path, const char *target_dir, const char *draft_vocab_dir,
                                       int T_max, int N, int64_t *step, char *err, int err_len);

/* stages/export/dflash.py (NUL-terminated), written into every z-lab export as dflash.py (stages/export/dflash_py.c). */
extern const char export_dflash_py[];

/* The z-lab config.json text of a drafter config (malloc'd; NULL when out of memory). */
char *export_zlab_config_json_text(const struct drafter_config *c);

/* Write the export of d in format into out_dir atomically (see DESIGN). verifier_name (the target's path or hub
 * name) goes into the configs and the README's serve lines. */
int export_write(const struct drafter *d, int format, const char *out_dir, const char *verifier_name, char *err,
                 int err_len);

/* What dflash-train writes at the end of a run: RUN/export/zlab and RUN/export/speculators (the z-lab layout is
 * skipped, with a sentence in skipped, when the drafter has sample_from_anchor), each checked right after it is
 * written (weights against d). skipped (may be NULL) gets "" or what was skipped and which engines serve which
 * layout. 0/-1. */
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
    int sglang_ok;                             /* why[EXPORT_SGLANG] is "" */
    char why[EXPORT_N_ENGINES][EXPORT_WHY_LEN];   /* each loader's verdict on these files: "" serves as trained */
    int expected;                              /* EXPORT_ENGINE_BIT mask the rules expect to serve (training record) */
    char verifier[512];
};

struct export_check_opts {
    const char *target_dir;                    /* NULL: no target checks (vocabulary, hidden size, layer count) */
    const struct drafter *d;                   /* NULL: no weight comparison */
    int require;                               /* EXPORT_ENGINE_BIT mask that must serve it as trained, besides the
                                                * loaders the rules expect for the training record */
};

/* Check an export directory (see DESIGN). Refusals for every loader (each names the file, the loader and the key):
 *   files      config.json (a JSON object), model.safetensors, README.md present
 *   tensors    every name maps to a parameter of the draft (q/k/v and gate/up fused: their shapes must agree), none
 *              unknown (vLLM fails), none missing (vLLM 0.33 and SGLang 0.5.23 leave it uninitialised), none with a
 *              NaN or inf; fc.weight is [H, H * number of target layers]; lm_head/t2d/d2t only with a pruned
 *              vocabulary
 *   keys       zlab: dflash_config.target_layer_ids inside [0, num_target_layers); mask_token_id inside the
 *              vocabulary; block size (dflash_config.block_size, else the top level, else 16) and window
 *              (dflash_config.swa_window_size, else sliding_window, >= 2) equal to training's; hidden_act silu;
 *              layer_types full_attention / sliding_attention; target_hidden_size, when an integer, = hidden_size;
 *              speculators: aux ids from 1, mask_token_id, speculative_tokens + 1 = block_size,
 *              use_sliding_window true when a layer slides; both: ids equal to training's (dflash_pipe)
 *   loaders    each loader's derived causality and the rules' other reasons (export_rules on the derived config)
 *              give out->why; a loader in out->expected or opts->require that does not serve it is a refusal
 *   target     (opts->target_dir) hidden size, layer count and vocabulary equal to the export's;
 *   weights    (opts->d) every exported tensor equal to bf16 of the drafter's fp32 master.
 * Fills *out (may be NULL). 0/-1 with a sentence. */
int export_check(const char *dir, const struct export_check_opts *opts, struct export_derived *out, char *err,
                 int err_len);

/* 1 when vLLM can serve the speculators layout of c: it applies causal = not sliding_window_non_causal to every
 * layer, so the trained causality must be the same in every layer (all sliding causal, or all bidirectional). */
int export_speculators_vllm_servable(const struct drafter_config *c);

/* 1 when SGLang serves the z-lab layout of c as trained (export_rules' SGLang verdict is ""). */
int export_sglang_servable(const struct drafter_config *c);

/* A drafter from an export directory (either layout; accepted by export_check with no engine required): the config
 * as the loaders derive it + target_dir, the exported tensors widened from bf16 (the z-lab layout takes the
 * embedding, and the LM head unless the vocabulary is pruned, from the target). T_max / N override the planned sizes when > 0. NULL with a sentence. */
struct drafter *export_load_dir(const char *dir, const char *target_dir, int T_max, int N, char *err, int err_len);

/* The exact serving lines for this export and target into buf: a launch line only for the engines whose verdict
 * x->why[] is "" (vLLM's line sets VLLM_USE_V2_MODEL_RUNNER=1 for mixed sliding/full layers), a comment with the
 * reason for the others. */
void export_serve_lines(const struct export_derived *x, const char *dir, const char *target, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_EXPORT_EXPORT_H */
