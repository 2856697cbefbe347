/*
 * stages/core/desc.h — the msgpack descriptors that travel in ring slots (design.md §6): `batch`
 * (dflash-pack -> dflash-target, host payload), `hidden` (dflash-target -> dflash-hspack, GPU
 * payload) and `features` (dflash-hspack -> dflash-train, GPU payload on the drafter's device).
 *
 * A descriptor is one msgpack map. It always carries `kind` (string) and `version` (uint), then a
 * fixed set of fields per kind; the decoder checks the kind, the version, the exact field count,
 * every field's type, that no field is missing or repeated, value ranges, and that every array
 * lies inside the payload (aligned, non-overlapping, inside payload_bytes and inside the slot's
 * payload capacity). Encoding writes into a caller buffer (the slot's descriptor area); nothing
 * here allocates on the hot path except msgpack's decode zone.
 *
 * PACKING CONVENTION (read this before writing a consumer):
 *   - A batch stores NO padding. n_tokens T is exactly the documents' total, T <= budget (the
 *     --tokens flag), cu_seqlens[0] = 0 and cu_seqlens[n_docs] = T. The padding of a batch is
 *     budget - n_tokens; it exists only as a number (for the padding metric), never as rows, so no
 *     stage computes or stores padding rows. doc_ids is therefore never -1 in batches made by
 *     dflash-pack; -1 stays reserved for padding should a producer ever pad (consumers must treat
 *     -1 rows as padding: no loss, no attention).
 *   - Documents lie back to back: document d covers [cu_seqlens[d], cu_seqlens[d+1]), its
 *     position_ids run 0..len-1, its doc_ids are d (0-based within the batch), and its dataset row
 *     id is row_ids[d]. Every document has at least one token and at least one loss_mask = 1 token.
 *   - Offsets are bytes from the start of THE PAYLOAD OF THE SLOT THE DESCRIPTOR TRAVELS IN.
 *     A stage that forwards a batch (target -> hidden, hspack -> features) copies the batch arrays
 *     into its own output payload and writes its own offsets (desc_*_layout does it for you).
 *     Every array starts at a multiple of DESC_ALIGN bytes.
 *
 * Shapes (kernels/shapes.md letters where they exist): T tokens of the batch, k captured layers,
 * H target hidden size (C in shapes.md).
 *   batch:    row_ids int64[n_docs], input_ids int32[T], loss_mask uint8[T] (0/1),
 *             position_ids int32[T], doc_ids int32[T], cu_seqlens int32[n_docs+1]
 *   hidden:   the batch arrays + states [k][T, H] (layers in `layers` order, z-lab ids: output of
 *             decoder layer i) + last [T, H] (the last decoder layer's output BEFORE the final norm),
 *             dtype bf16 or f32.
 *   features: the batch arrays + states laid out as `concat` [T, k*H] (row t = [layer a_1 | a_2 |
 *             ...]) or `split` k x [T, H] (identical to hidden's [k][T, H]) + last [T, H].
 *   hidden and features also carry `target` (uint64): desc_target_id of the target model that computed the
 *   states, so a trainer refuses features of another target with the same shape (issue 24).
 *   Every kind carries `plan` (uint64, in the batch part): the hash of the run plan the packer ran under
 *   (stages/plan/plan.h; 0 = a stage run on flags alone). dflash-target and dflash-hspack forward it; a stage
 *   that read a plan refuses an item of another plan with desc_check_plan (one line naming both hashes).
 *
 * Versions. Each kind has its own format version (DESC_BATCH_VERSION, ...; desc_version), bumped when that
 * kind's fields change; a decoder accepts exactly its kind's version and says which it expected and found.
 *
 * Slot sizing: desc_*_max_payload_bytes(budget, ...) is the payload capacity a ring slot needs for
 * any batch of at most `budget` tokens (it assumes the worst case n_docs = budget);
 * DESC_MAX_BYTES bounds every encoded descriptor (use it as the ring's desc_bytes).
 *
 * All functions are pure, thread-safe and never exit; failures return -1 with one sentence in err.
 */
#ifndef STAGES_CORE_DESC_H
#define STAGES_CORE_DESC_H

#include <stddef.h>
#include <stdint.h>

/* Format versions, one per kind. History (the same for all three until 4): 2: the batch part carries `split`
 * (train|val); 3: hidden and features carry `target` (desc_target_id); 4: every kind carries `plan` (the run
 * plan's hash). */
#define DESC_BATCH_VERSION 4u
#define DESC_HIDDEN_VERSION 4u
#define DESC_FEATURES_VERSION 4u
#define DESC_ALIGN 256u          /* every array offset is a multiple of this (cudaMalloc alignment) */
#define DESC_MAX_LAYERS 64       /* captured layers k at most */
#define DESC_MAX_BYTES 2048u     /* an encoded descriptor of any kind never exceeds this */

enum desc_kind { DESC_KIND_BATCH = 1, DESC_KIND_HIDDEN = 2, DESC_KIND_FEATURES = 3 };
enum desc_dtype { DESC_DTYPE_BF16 = 1, DESC_DTYPE_F32 = 2 };            /* msgpack: "bf16" | "f32" */
enum desc_layout { DESC_LAYOUT_CONCAT = 1, DESC_LAYOUT_SPLIT = 2 };     /* msgpack: "concat" | "split" */
/* Which part of the dataset a batch comes from (dflash-pack --val-frac, stages/pack/packer.h): a train batch
 * is trained on, a val batch is evaluated forward only (no noise, no backward) and never counts as a
 * micro-batch of an optimizer step. 0 = train, so a zero-initialised descriptor is a train batch. */
enum desc_split { DESC_SPLIT_TRAIN = 0, DESC_SPLIT_VAL = 1 };            /* msgpack: "train" | "val" */

/* The `batch` descriptor. Also the first part of `hidden` and `features`. */
struct desc_batch {
    uint64_t seq;              /* global batch number of this stream (0, 1, 2, ...) */
    uint32_t epoch;            /* dataset epoch the batch belongs to (0-based) */
    uint32_t n_tokens;         /* T, 1 <= T <= budget */
    uint32_t budget;           /* the packer's token budget (max T); padding = budget - T */
    uint32_t n_docs;           /* 1 <= n_docs <= T */
    uint32_t n_loss;           /* number of loss_mask = 1 tokens, 1 <= n_loss <= T */
    uint64_t payload_bytes;    /* bytes of the payload this descriptor describes (end of the last array) */
    uint64_t off_row_ids;      /* int64[n_docs]     dataset row id of each document */
    uint64_t off_input_ids;    /* int32[T] */
    uint64_t off_loss_mask;    /* uint8[T]          0/1 */
    uint64_t off_position_ids; /* int32[T]          reset to 0 at each document start */
    uint64_t off_doc_ids;      /* int32[T]          0..n_docs-1 (-1: padding, see above) */
    uint64_t off_cu_seqlens;   /* int32[n_docs+1]   0 = cu[0] < cu[1] < ... < cu[n_docs] = T */
    enum desc_split split;     /* train | val; forwarded with the batch part by dflash-target and dflash-hspack */
    uint64_t plan;             /* hash of the run plan the item was made under (0: none); forwarded like split */
};

/* The `hidden` descriptor: captured target states of one batch. */
struct desc_hidden {
    struct desc_batch batch;   /* offsets point into the hidden slot's payload */
    uint32_t n_layers;         /* k, 1..DESC_MAX_LAYERS */
    int32_t layers[DESC_MAX_LAYERS]; /* captured layer ids (z-lab convention), list order = storage order */
    enum desc_dtype dtype;
    uint32_t hidden_size;      /* H */
    uint64_t off_states;       /* [k][T, H] of dtype */
    uint64_t off_last;         /* [T, H] of dtype, last decoder layer output before the final norm */
    uint64_t target_id;        /* desc_target_id of the target that computed the states */
};

/* The `features` descriptor: drafter-ready layout of one batch. */
struct desc_features {
    struct desc_batch batch;   /* offsets point into the features slot's payload */
    enum desc_layout layout;
    uint32_t n_layers;         /* k */
    int32_t layers[DESC_MAX_LAYERS];
    enum desc_dtype dtype;
    uint32_t hidden_size;      /* H */
    uint64_t off_states;       /* concat: [T, k*H]; split: k x [T, H] back to back; of dtype */
    uint64_t off_last;         /* [T, H] of dtype */
    uint64_t target_id;        /* copied from the hidden item: desc_target_id of the target */
};

/* Typed views of a batch's arrays inside a payload (host or device pointers alike: only pointer
 * arithmetic is done). */
struct desc_batch_arrays {
    int64_t *row_ids;          /* [n_docs] */
    int32_t *input_ids;        /* [T] */
    uint8_t *loss_mask;        /* [T] */
    int32_t *position_ids;     /* [T] */
    int32_t *doc_ids;          /* [T] */
    int32_t *cu_seqlens;       /* [n_docs+1] */
};

/* ---------------------------------------------------------------- sizes and layouts */

/* Bytes of one element of dtype (2 or 4; 0 for an unknown value). */
size_t desc_dtype_bytes(enum desc_dtype dtype);
/* "bf16" / "f32" / "concat" / "split" / "batch" / "hidden" / "features"; "?" for unknown values. */
const char *desc_dtype_name(enum desc_dtype dtype);
const char *desc_layout_name(enum desc_layout layout);
const char *desc_kind_name(enum desc_kind kind);
const char *desc_split_name(enum desc_split split);   /* "train" / "val" / "?" */
/* The format version of a kind (DESC_*_VERSION); 0 for an unknown kind. */
uint32_t desc_version(enum desc_kind kind);

/* Fill the offsets and payload_bytes of d for the standard layout (arrays in the order of the
 * struct, each DESC_ALIGN-aligned, starting at offset 0), from d->n_tokens and d->n_docs, which the
 * caller sets first. Returns the payload bytes (= d->payload_bytes). */
uint64_t desc_batch_layout(struct desc_batch *d);
/* Same for hidden / features: batch arrays first, then states, then last. The caller sets
 * batch.n_tokens, batch.n_docs, n_layers, dtype, hidden_size (and layout) first. */
uint64_t desc_hidden_layout(struct desc_hidden *d);
uint64_t desc_features_layout(struct desc_features *d);

/* Payload bytes a slot needs for any batch of at most `budget` tokens (worst case n_docs = budget).
 * For ring sizing in dflash-shm and the stages. */
uint64_t desc_batch_max_payload_bytes(uint32_t budget);
uint64_t desc_hidden_max_payload_bytes(uint32_t budget, uint32_t n_layers, uint32_t hidden_size,
                                       enum desc_dtype dtype);
uint64_t desc_features_max_payload_bytes(uint32_t budget, uint32_t n_layers, uint32_t hidden_size,
                                         enum desc_dtype dtype);

/* Typed pointers to the batch arrays of d inside `payload` (host or device base pointer). */
void desc_batch_arrays(const struct desc_batch *d, void *payload, struct desc_batch_arrays *a);

/* ---------------------------------------------------------------- the target's identity */

/* The identity of a target model: 64-bit FNV-1a of its config.json bytes (architecture, sizes, vocabulary, rope,
 * ...). Two targets of the same shape but another config (another model, revision or family) differ; the captured
 * layers travel in the descriptor's `layers` and are checked on their own. Never 0 (0 is mapped to 1). */
uint64_t desc_target_id(const void *config_json, size_t len);
/* desc_target_id of MODEL_DIR/config.json. 0, or -1 with a sentence naming the file. */
int desc_target_id_of_model(const char *model_dir, uint64_t *id, char *err, int err_len);

/* ---------------------------------------------------------------- the run plan */

/* A stage that read a run plan (hash stage_plan) checks each item it takes: an item made under another plan
 * (b->plan != 0 and != stage_plan) is refused with one sentence naming the ring (NULL: not named), the seq and
 * both hashes. stage_plan 0 (the stage runs on flags alone) or an item without a plan (0) passes. Pure. */
int desc_check_plan(const struct desc_batch *b, uint64_t stage_plan, const char *ring, char *err, int err_len);

/* ---------------------------------------------------------------- encode / decode */

/* Encode d as a msgpack map into buf (capacity cap, e.g. the slot's descriptor area); *len gets
 * the encoded size. Validates d first (same checks as the decoder, payload_cap = 0). Returns 0, or
 * -1 with a reason (invalid field, or "descriptor needs N bytes, buffer has M"). */
int desc_batch_encode(const struct desc_batch *d, void *buf, size_t cap, size_t *len, char *err, int err_len);
int desc_hidden_encode(const struct desc_hidden *d, void *buf, size_t cap, size_t *len, char *err, int err_len);
int desc_features_encode(const struct desc_features *d, void *buf, size_t cap, size_t *len, char *err, int err_len);

/* Decode and validate a descriptor of the given kind from buf[0..len). payload_cap is the payload
 * capacity of the slot it came from (0: skip that check); every array must lie inside both
 * payload_bytes and payload_cap. Trailing bytes after the map are an error. Returns 0, or -1 with
 * a sentence naming what was expected and what was found ("descriptor kind: expected 'batch',
 * found 'hidden'", "field 'n_tokens': expected an unsigned integer, found a string"). */
int desc_batch_decode(const void *buf, size_t len, uint64_t payload_cap, struct desc_batch *d, char *err, int err_len);
int desc_hidden_decode(const void *buf, size_t len, uint64_t payload_cap, struct desc_hidden *d, char *err, int err_len);
int desc_features_decode(const void *buf, size_t len, uint64_t payload_cap, struct desc_features *d, char *err, int err_len);

/* Read only the kind of an encoded descriptor (for consumers of mixed streams and for tools).
 * Returns 0 with *kind set, or -1 when buf is not a descriptor map with a known kind. */
int desc_peek_kind(const void *buf, size_t len, enum desc_kind *kind, char *err, int err_len);

/* Check the header fields of d alone (ranges, alignment, arrays inside payload_bytes and
 * payload_cap when non-zero, no overlap). What encode and decode call; exposed for tests. */
int desc_batch_validate(const struct desc_batch *d, uint64_t payload_cap, char *err, int err_len);
int desc_hidden_validate(const struct desc_hidden *d, uint64_t payload_cap, char *err, int err_len);
int desc_features_validate(const struct desc_features *d, uint64_t payload_cap, char *err, int err_len);

/* Check a batch's CONTENT in a host payload against the packing convention above: cu_seqlens
 * strictly increasing from 0 to T, position_ids reset per document, doc_ids, loss_mask 0/1 with
 * at least one 1 per document, n_loss, input ids in [0, vocab_size) when vocab_size > 0. O(T).
 * For tests and for consumers that want to fail loudly on a bad batch ("batch seq 12: input_ids[77]
 * = 152000 >= vocab size 151936"). */
int desc_batch_check_payload(const struct desc_batch *d, const void *payload, int64_t vocab_size,
                             char *err, int err_len);

#endif /* STAGES_CORE_DESC_H */
