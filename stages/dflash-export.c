/*
 * stages/dflash-export.c — write a checkpoint's drafter in the layouts vLLM and SGLang load, or check an
 * exported directory the way those loaders read it (issue 17; stages/export/export.h).
 *
 *   dflash-export CKPT --target-model DIR --format zlab|speculators --out DIR [--draft-vocab DIR]
 *   dflash-export --check DIR [--target-model DIR] [--ckpt CKPT [--draft-vocab DIR]]
 *
 * The export is written atomically (OUT.tmp.<pid>, then renamed) and checked right after (rules + the weights
 * against the checkpoint). Both modes print each loader's verdict (vLLM 0.33.0, SGLang 0.5.23, speculators 0.9.0,
 * the z-lab reference: "serves as trained" or why not) and the serving lines for the engines that serve it.
 * Exit codes: 0 the export is complete and every loader the rules expect for its configuration serves it as
 * trained (and --require's); 1 a defect (a missing/unknown/NaN tensor, a key a loader reads differently from
 * training, an expected loader that would not serve it) with one sentence; a layout that some engine cannot
 * serve by design (e.g. vLLM and the speculators layout of a mixed-causality drafter) is not a defect.
 * --help prints the rules table (stages/export/export.h).
 */
#include "core/check.h"
#include "core/flags.h"
#include "core/log.h"
#include "export/export.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const format_names[] = {"zlab", "speculators", NULL};   /* enum export_format */
static const char *const engine_flags[] = {"vllm", "sglang", "speculators", "zlab-ref", NULL};   /* export_engine */

static void print_derived(const struct export_derived *x, const char *dir, const char *target) {
    printf("%s: %s layout, %d layers, block size %d, %d captured target layers (z-lab ids:", dir,
           export_format_name(x->format), x->L, x->B, x->k);
    for (int i = 0; i < x->k; i++) printf(" %d", x->zlab_ids[i]);
    printf("), mask token %lld, vocabulary %d (draft %d)\n", (long long)x->mask_token_id, x->V, x->V_d);
    printf("  per layer as vLLM derives it:");
    for (int l = 0; l < x->L; l++)
        printf(" %s/%s", x->sliding[l] ? "sliding" : "full", x->causal[l] ? "causal" : "bidirectional");
    if (x->window) printf(", window %d", x->window);
    printf("\n");
    for (int e = 0; e < EXPORT_N_ENGINES; e++)
        printf("  %-18s %s\n", export_engine_name(e), x->why[e][0] ? x->why[e] : "serves as trained");
    char lines[4096];
    export_serve_lines(x, dir, target ? target : (x->verifier[0] ? x->verifier : "TARGET"), lines, sizeof lines);
    printf("serve with:\n%s", lines);
}

int main(int argc, char **argv) {
    log_init("dflash-export");
    const char *target = NULL, *out = NULL, *check = NULL, *ckpt_flag = NULL, *vocab = NULL, *name = NULL;
    int format = -1, require = -1;
    struct flag_choice ch_format = {&format, format_names}, ch_require = {&require, engine_flags};
    struct flag table[] = {
        {"target-model", FLAG_STRING, &target, "the target's Hugging Face directory (config.json, tokenizer, embedding, "
         "final norm, LM head)", 1, 0},
        {"format", FLAG_CHOICE, &ch_format, "export layout: zlab (config.json + dflash_config, body weights) or "
         "speculators (vLLM's speculators config, body + embedding + LM head)", 1, 0},
        {"out", FLAG_STRING, &out, "export directory (replaced atomically if it holds an export)", 1, 0},
        {"check", FLAG_STRING, &check, "check an export directory the way each loader (vLLM, SGLang, speculators, "
         "z-lab) reads it", 1, 0},
        {"ckpt", FLAG_STRING, &ckpt_flag, "with --check: compare the weights with this checkpoint", 1, 0},
        {"draft-vocab", FLAG_STRING, &vocab, "directory with t2d.npy / d2t.npy when the checkpoint's draft vocabulary "
         "is pruned", 1, 0},
        {"require", FLAG_CHOICE, &ch_require, "also refuse the export unless this loader serves it as trained (the "
         "loaders the rules expect for its configuration are always required)", 1, 0},
        {"verifier-name", FLAG_STRING, &name, "the target's name in the configs and serve lines (default: "
         "--target-model)", 1, 0},
        FLAGS_END,
    };
    char *pos[2];
    static char about[16384];
    int at = snprintf(about, sizeof about, "Export a dflash-train checkpoint for vLLM / SGLang, or check an export "
                      "the way each loader reads it. The rules (from the loaders' own code; 'serves as trained' or "
                      "why not):\n\n");
    export_rules_table(about + at, sizeof about - (size_t)at);
    int npos = flags_parse_or_exit(table, argc, argv,
                                   "CKPT --target-model DIR --format zlab|speculators --out DIR | --check DIR "
                                   "[--target-model DIR] [--ckpt CKPT] [--require ENGINE]",
                                   about, pos, 1);
    char err[2048];
    if (check) {
        if (npos) DIE("--check DIR takes no positional checkpoint (use --ckpt CKPT)");
        struct drafter *d = NULL;
        if (ckpt_flag) {
            if (!target) DIE("--ckpt needs --target-model DIR (the frozen tensors and config come from it)");
            d = export_load_checkpoint(ckpt_flag, target, vocab, 0, 1, NULL, err, sizeof err);
            if (!d) DIE("%s", err);
        }
        struct export_check_opts o = {target, d, require >= 0 ? EXPORT_ENGINE_BIT(require) : 0};
        struct export_derived x;
        int rc = export_check(check, &o, &x, err, sizeof err);
        drafter_free(d);
        if (rc) {
            fprintf(stderr, "dflash-export: REFUSED: %s\n", err);
            return 1;
        }
        printf("%s: accepted (complete; every loader the rules expect for it serves it as trained)%s\n", check,
               ckpt_flag ? "; weights equal the checkpoint's in bf16" : "");
        print_derived(&x, check, name ? name : target);
        return 0;
    }
    if (npos != 1) DIE("give the checkpoint file to export (or --check DIR)");
    if (!target) DIE("--target-model DIR is required");
    if (format < 0) DIE("--format zlab|speculators is required");
    if (!out) DIE("--out DIR is required");
    int64_t step = 0;
    struct drafter *d = export_load_checkpoint(pos[0], target, vocab, 0, 1, &step, err, sizeof err);
    if (!d) DIE("%s", err);
    LIB_CHECK(export_write(d, format, out, name ? name : target, err, sizeof err), err);
    struct export_check_opts o = {target, d, require >= 0 ? EXPORT_ENGINE_BIT(require) : 0};
    struct export_derived x;
    if (export_check(out, &o, &x, err, sizeof err)) DIE("the export just written is refused: %s", err);
    drafter_free(d);
    printf("wrote %s (%s layout) from %s (step %lld); checked\n", out, format_names[format], pos[0], (long long)step);
    print_derived(&x, out, name ? name : target);
    return 0;
}
