/*
 * stages/train/mask_token.h — the DFlash mask token id from a target directory (dflash-reference.md §4.3).
 *
 * Resolution order (issue 16; never silently pad or EOS): an explicit id from the caller, else the tokenizer's
 * mask token (tokenizer_config.json "mask_token", looked up in its added_tokens_decoder, or in tokenizer.json's
 * added_tokens / model.vocab), else the first unused embedding row: len(tokenizer) when it is < vocab_size
 * (len = 1 + the largest id of tokenizer.json's model.vocab and added_tokens; Qwen3: 151669). Anything else is
 * an error with one sentence. Pure, thread-safe, never exits.
 */
#ifndef STAGES_TRAIN_MASK_TOKEN_H
#define STAGES_TRAIN_MASK_TOKEN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum mask_token_source { MASK_TOKEN_EXPLICIT = 1, MASK_TOKEN_TOKENIZER = 2, MASK_TOKEN_UNUSED_ROW = 3 };

/* Resolve the mask token for the target in dir with vocab_size embedding rows. explicit_id >= 0 is taken as is
 * (checked to be < vocab_size); < 0 means "resolve". Writes *id and *source. 0, or -1 with a sentence naming the
 * file and field. Reads at most tokenizer_config.json and tokenizer.json (a few MB). */
int mask_token_resolve(const char *dir, int64_t vocab_size, int64_t explicit_id, int64_t *id,
                       enum mask_token_source *source, char *err, int err_len);
/* "explicit" | "tokenizer" | "unused-row" | "?". */
const char *mask_token_source_name(enum mask_token_source s);

#ifdef __cplusplus
}
#endif
#endif /* STAGES_TRAIN_MASK_TOKEN_H */
