/*
 * stages/shmctl/control.h — dflash-shm's control protocol (design.md §5): msgpack over nanomsg
 * NN_REQ/NN_REP on ipc://<run>/bus/control.sock.
 *
 * Every message is one msgpack map carrying `kind` (string) and `version` (uint,
 * SHM_CTL_VERSION) first, like the ring descriptors (stages/core/desc.h):
 *   request  {kind: "status" | "shutdown", version}                       exactly 2 fields
 *   reply    {kind: "shutdown", version}                                  exactly 2 fields
 *            {kind: "error", version, error: str}                         exactly 3 fields
 *            {kind: "status", version, pid: int, source: str, rings: [ring...]}  exactly 5
 *   ring     {name, segment, device, slots, payload_bytes, desc_bytes, producers, closed,
 *             drained, owner_pid, owner_alive, free, writing, ready, reading, published,
 *             consumed, redelivered, recovered_writes, lowest_ready_seq (uint or nil),
 *             attached: [{pid, role: "producer"|"consumer", alive, drained}...]}  exactly 21
 * Decoders check the type of every field, that each is present once and that the count is
 * exact, and say what was expected and found. The status shape is struct ring_status (shm/ring.h),
 * so the reply of a live dflash-shm and the fallback read from the segments are one type.
 *
 * Scripts read status through `dflash-shm --status --json` (shm_ctl_status_json) or one value
 * with `--status --field RING.KEY` (shm_ctl_field), never through table columns.
 *
 * Pure functions on caller memory; thread-safe; nothing exits.
 */
#ifndef STAGES_SHM_CONTROL_H
#define STAGES_SHM_CONTROL_H

#include "shm/ring.h"

#include <stddef.h>

#define SHM_CTL_VERSION 1u
#define SHM_CTL_MAX_RINGS 32
#define SHM_CTL_REQUEST_MAX 64      /* bytes: a request is a 2-field map */

enum shm_ctl_kind { SHM_CTL_STATUS = 1, SHM_CTL_SHUTDOWN = 2, SHM_CTL_ERROR = 3 };

struct shm_ctl_status {
    int pid;                        /* the dflash-shm that answered, or the creator found in shm.json */
    char source[16];                /* "dflash-shm" (control socket) or "segments" (read directly) */
    int n_rings;
    struct ring_status rings[SHM_CTL_MAX_RINGS];
};

struct shm_ctl_reply {
    enum shm_ctl_kind kind;
    char error[256];                /* kind ERROR */
    struct shm_ctl_status status;   /* kind STATUS */
};

/* "status", "shutdown", "error" (or "?"). */
const char *shm_ctl_kind_name(enum shm_ctl_kind kind);

/* Request: encode into buf (capacity cap, SHM_CTL_REQUEST_MAX is enough); *len gets the size. */
int shm_ctl_encode_request(enum shm_ctl_kind kind, void *buf, size_t cap, size_t *len, char *err, int err_len);
/* Decode a request; kind STATUS or SHUTDOWN. -1 with a sentence for anything else. */
int shm_ctl_decode_request(const void *buf, size_t len, enum shm_ctl_kind *kind, char *err, int err_len);

/* Reply: encode into a malloc'ed buffer (*buf, *len; free() it). */
int shm_ctl_encode_reply(const struct shm_ctl_reply *r, char **buf, size_t *len, char *err, int err_len);
/* Decode a reply into *r (about 45 KB: allocate it rather than put it on a small stack). */
int shm_ctl_decode_reply(const void *buf, size_t len, struct shm_ctl_reply *r, char *err, int err_len);

/* The status as JSON text (malloc'ed; NULL when out of memory), same keys as the msgpack map,
 * plus kind/version/pid/source at the top. indent 0: one line. */
char *shm_ctl_status_json(const struct shm_ctl_status *st, int indent);

/* One value of the status as text into out: "pid", "source", "rings" (count), or "RING.KEY" with
 * KEY one of the ring keys above except attached ("yes"/"no" for booleans, "none" for a nil
 * lowest_ready_seq), or "RING.attached" (live attached count). -1 with a sentence naming the
 * unknown ring or key. */
int shm_ctl_field(const struct shm_ctl_status *st, const char *path, char *out, size_t out_len, char *err, int err_len);

#endif /* STAGES_SHM_CONTROL_H */
