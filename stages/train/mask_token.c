/*
 * stages/train/mask_token.c — mask token resolution (stages/train/mask_token.h).
 */
#include "train/mask_token.h"

#include "core/err.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *mask_token_source_name(enum mask_token_source s) {
    switch (s) {
    case MASK_TOKEN_EXPLICIT: return "explicit";
    case MASK_TOKEN_TOKENIZER: return "tokenizer";
    case MASK_TOKEN_UNUSED_ROW: return "unused-row";
    }
    return "?";
}

/* json of dir/name, NULL when the file does not exist (*bad = 0) or is not valid JSON (*bad = 1, err set). */
static json_t *load_json(const char *dir, const char *name, char *path, size_t path_len, int *bad, char *err,
                         int err_len) {
    struct stat st;
    *bad = 0;
    snprintf(path, path_len, "%s/%s", dir, name);
    if (stat(path, &st) != 0) {
        if (errno == ENOENT) return NULL;
        *bad = 1;
        err_fail(err, err_len, "%s: stat failed: %s", path, strerror(errno));
        return NULL;
    }
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) {
        *bad = 1;
        err_fail(err, err_len, "%s:%d: not valid JSON: %s", path, je.line, je.text);
    }
    return j;
}

/* The id of token text in tokenizer.json (added_tokens first, then model.vocab), or -1. */
static int64_t lookup_token(json_t *tok, const char *text) {
    json_t *added = json_object_get(tok, "added_tokens");
    size_t i;
    json_t *e;
    json_array_foreach(added, i, e) {
        json_t *c = json_object_get(e, "content"), *id = json_object_get(e, "id");
        if (json_is_string(c) && json_is_integer(id) && strcmp(json_string_value(c), text) == 0)
            return json_integer_value(id);
    }
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    json_t *id = json_is_object(vocab) ? json_object_get(vocab, text) : NULL;
    return json_is_integer(id) ? json_integer_value(id) : -1;
}

/* 1 + the largest id of tokenizer.json (model.vocab values and added_tokens ids). */
static int64_t tokenizer_len(json_t *tok) {
    int64_t n = 0;
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, e) {
        json_t *id = json_object_get(e, "id");
        if (json_is_integer(id) && json_integer_value(id) + 1 > n) n = json_integer_value(id) + 1;
    }
    json_t *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    const char *k;
    json_t *v;
    if (json_is_object(vocab))
        json_object_foreach(vocab, k, v) if (json_is_integer(v) && json_integer_value(v) + 1 > n) n = json_integer_value(v) + 1;
    return n;
}

int mask_token_resolve(const char *dir, int64_t vocab_size, int64_t explicit_id, int64_t *id,
                       enum mask_token_source *source, char *err, int err_len) {
    if (explicit_id >= 0) {
        if (explicit_id >= vocab_size)
            return err_fail(err, err_len, "mask token id %lld is outside the embedding [0, %lld) of %s",
                            (long long)explicit_id, (long long)vocab_size, dir);
        *id = explicit_id;
        *source = MASK_TOKEN_EXPLICIT;
        return 0;
    }
    char cpath[4096], tpath[4096];
    int bad;
    json_t *cfg = load_json(dir, "tokenizer_config.json", cpath, sizeof cpath, &bad, err, err_len);
    if (bad) return -1;
    json_t *tok = load_json(dir, "tokenizer.json", tpath, sizeof tpath, &bad, err, err_len);
    if (bad) {
        json_decref(cfg);
        return -1;
    }
    int rc = -1;
    /* the tokenizer's mask token: a string, or {"content": ...} */
    json_t *mt = cfg ? json_object_get(cfg, "mask_token") : NULL;
    if (json_is_object(mt)) mt = json_object_get(mt, "content");
    if (json_is_string(mt)) {
        const char *text = json_string_value(mt);
        int64_t found = -1;
        const char *k;
        json_t *v;
        json_object_foreach(json_object_get(cfg, "added_tokens_decoder"), k, v) {
            json_t *c = json_object_get(v, "content");
            if (json_is_string(c) && strcmp(json_string_value(c), text) == 0) found = strtoll(k, NULL, 10);
        }
        if (found < 0 && tok) found = lookup_token(tok, text);
        if (found < 0) {
            err_fail(err, err_len, "%s: mask_token \"%s\" is not in added_tokens_decoder nor in tokenizer.json", cpath,
                     text);
            goto out;
        }
        if (found >= vocab_size) {
            err_fail(err, err_len, "%s: mask_token \"%s\" has id %lld, outside the embedding [0, %lld)", cpath, text,
                     (long long)found, (long long)vocab_size);
            goto out;
        }
        *id = found;
        *source = MASK_TOKEN_TOKENIZER;
        rc = 0;
        goto out;
    }
    if (!tok) {
        err_fail(err, err_len, "%s: no tokenizer.json and no mask token in tokenizer_config.json: pass the mask token id explicitly", dir);
        goto out;
    }
    int64_t n = tokenizer_len(tok);
    if (n < 1 || n >= vocab_size) {
        err_fail(err, err_len, "%s: the tokenizer has %lld tokens and the embedding %lld rows, so no row is unused and there "
                 "is no mask token: pass the mask token id explicitly", tpath, (long long)n, (long long)vocab_size);
        goto out;
    }
    *id = n;
    *source = MASK_TOKEN_UNUSED_ROW;
    rc = 0;
out:
    json_decref(cfg);
    json_decref(tok);
    return rc;
}
