/*
 * shm/ring.h — the ring buffer that chains the pipeline's processes (design.md §4).
 *
 * A ring is one POSIX shared-memory segment `/dflash.<run-id>.<name>` holding a fixed number of
 * slots. Each slot carries a sequence number, a descriptor (msgpack bytes, at most desc_bytes)
 * and a payload of at most payload_bytes, either in the segment (host rings) or in a cudaMalloc
 * buffer owned by dflash-shm and shared through a CUDA IPC handle (GPU rings). Items survive the
 * death of any producer or consumer: the slot states and owners in the segment are enough to
 * recover.
 *
 * DESIGN
 * - Roles. dflash-shm alone creates (ring_create) and unlinks segments and owns GPU payload
 *   memory. Stages attach (ring_attach) as RING_PRODUCER or RING_CONSUMER; any number of each.
 * - Slot states: FREE -> WRITING (a producer claimed it) -> READY (published, with a seq) ->
 *   READING (a consumer claimed it) -> FREE. Every transition is a compare-and-swap on a 64-bit
 *   control word {state, generation, owner pid, low 24 bits of the owner's start time from
 *   /proc/<pid>/stat field 22}, so a claim and its owner are one atomic store and a reused pid is
 *   not taken for the owner. Publication is a release CAS; a consumer reads after an acquire
 *   load, so descriptor and (host) payload bytes written before ring_publish are visible.
 * - Recovery runs in ring_attach and about every 200 ms inside any waiting call: WRITING under a
 *   dead owner -> FREE (a half-written item is never visible); READING under a dead owner ->
 *   READY (delivered again; `redelivered` counter and the slot's `deliveries` grow). A lowest-first claim
 *   (ring_acquire_read) first checks the owners of READING slots of lower seq and recovers a dead one's at once,
 *   so live consumers never run past a dead consumer's item while it waits for the periodic recovery (several
 *   consumers feeding one strict-order consumer downstream would fill the ring between them with later seqs).
 * - Order. ring_acquire_read delivers the lowest READY seq (among the seqs of this consumer's
 *   rank, see ring_set_rank); with one producer publishing in seq order, one consumer sees every
 *   seq in order (ring.c scans twice so a seq published earlier is never skipped). With several
 *   producers or consumers, use ring_acquire_read_seq, which waits for one exact seq (strict
 *   order). In strict mode a ring must have more slots than items that can be published out of
 *   order, or producers assign seqs only after ring_acquire_write returned a slot (no deadlock).
 * - End of stream. Each producer has an entry in the segment's attach table. ring_mark_drained
 *   marks this producer's entry DRAINED. The ring is drained when at least max(1, n_producers of
 *   the spec) entries are DRAINED and no producer entry is ACTIVE (a dead producer that never
 *   drained keeps its entry ACTIVE, and its restart takes that entry over, so a crash never ends
 *   the stream early). A consumer gets RING_END once the ring is drained and has nothing READY
 *   or WRITING for it. Set n_producers in the spec when several producers attach at different
 *   times, so the first one to finish cannot end the stream alone.
 * - Waiting uses futexes on two shared words (one bumped on publish, one on release), with a
 *   waiter count so an uncontended publish makes no syscall. Every wait has a timeout, wakes on
 *   the `closed` flag, and sleeps at most 200 ms at a time so recovery runs while waiting.
 * - closed: set by dflash-shm on shutdown (or anyone through ring_set_closed); every acquire then
 *   returns RING_END at once. A ring whose owner (dflash-shm) died stays usable for host payloads;
 *   waiting calls log that the owner is gone once. A restarted dflash-shm adopts a host ring of
 *   the same spec in place; a ring it has to re-create (GPU, or another spec) makes the waiting
 *   calls of processes attached to the old segment return -1 (checked every ~3 s).
 * - GPU rings: payloads are device pointers on the ring's device (struct ring_slot.on_device).
 *   A producer must make its device writes complete BEFORE ring_publish (cudaStreamSynchronize
 *   its stream, or use ring_publish_stream which does it). A consumer on another GPU reads
 *   through peer access (handles are opened with cudaIpcMemLazyEnablePeerAccess) or copies with
 *   cudaMemcpyPeerAsync. In a build without CUDA, attaching to a GPU ring fails with a sentence;
 *   dflash-shm can create any ring as host (dev=host) for --device cpu runs.
 *
 * - Trust. /dev/shm is world-writable and segment names are predictable, so a segment is used
 *   only if it is owned by this user with mode 0600 (created O_EXCL + fchmod 0600; adopt, attach
 *   and --remove-stale refuse anything else with a sentence naming owner and mode). The geometry
 *   (n_slots, sizes, offsets, strides) is read once at attach from one snapshot of the header,
 *   validated, and never re-read; a slot's desc_len/payload_len are checked against it on every
 *   delivery (-1 with "corrupt" instead of an out-of-bounds access). Any seq value is valid,
 *   UINT64_MAX included.
 *
 * Thread safety: a struct ring may be used by several threads of one process for acquire,
 * publish and release (the shared state is atomic); ring_close must be the last call. A handle
 * belongs to the process that attached: a forked child attaches on its own. Nothing
 * here exits or prints except through the log hook (ring_set_log).
 */
#ifndef SHM_RING_H
#define SHM_RING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RING_MAGIC   0x31474e4952464c44ull   /* "DLFRING1" little-endian */
#define RING_VERSION 2u                      /* 2: the header carries the run plan's hash (spec key plan=) */
#define RING_NAME_MAX 32                     /* ring names: [A-Za-z0-9_-], at most 31 chars */
#define RING_MAX_ATTACH 64                   /* attach-table entries per ring */

/* Return codes of the acquire calls (besides 0 = ok and -1 = error with a sentence). */
#define RING_TIMEOUT 1   /* nothing within timeout_ms: log what you wait for and call again */
#define RING_END     2   /* drained and empty for this consumer, or the ring was closed */

/* RING_OBSERVER attaches without registering and may only read status (dflash-shm --status). */
enum ring_role { RING_PRODUCER = 1, RING_CONSUMER = 2, RING_OBSERVER = 3 };

struct ring_spec {
    char name[RING_NAME_MAX];  /* ring name, e.g. "batches" */
    uint32_t n_slots;          /* >= 1 */
    uint64_t payload_bytes;    /* capacity of one slot's payload (may be 0) */
    uint32_t desc_bytes;       /* capacity of one slot's descriptor (msgpack), >= 1 */
    int device;                /* -1: host payload in the segment; N: payloads on CUDA device N */
    uint32_t n_producers;      /* producers that must drain before the end of stream; 0 = any (>= 1) */
    uint64_t plan;             /* hash of the run plan the ring was made for (stages/plan/plan.h); 0: none */
};

/* One claimed slot, filled by the acquire calls. The pointers stay valid until the slot is
 * published, abandoned or released. */
struct ring_slot {
    uint32_t index;            /* slot index in the ring */
    uint64_t seq;              /* read: the item's sequence number */
    void *desc;                /* descriptor bytes, capacity desc_cap */
    uint32_t desc_cap;
    uint32_t desc_len;         /* read: bytes the producer published */
    void *payload;             /* host pointer, or device pointer when on_device */
    uint64_t payload_cap;
    uint64_t payload_len;      /* read: bytes the producer published */
    int on_device;             /* 1: payload is a device pointer on device `device` */
    int device;                /* the ring's device (-1 host) */
    uint32_t deliveries;       /* read: 1 on first delivery, more after redeliveries */
    uint64_t ctl_;             /* internal: the control word of the claim */
};

struct ring_attached {         /* one attach-table entry, for status */
    int pid;
    int role;                  /* RING_PRODUCER or RING_CONSUMER */
    int drained;               /* producer has called ring_mark_drained */
    int alive;                 /* the process (pid + start time) still runs */
};

struct ring_status {           /* a snapshot; not atomic across fields */
    char name[RING_NAME_MAX];
    char segment[128];         /* "/dflash.<run-id>.<name>" */
    uint32_t n_slots, desc_bytes, n_producers;
    uint64_t payload_bytes;
    int device;
    int closed, drained;
    int owner_pid, owner_alive; /* dflash-shm that created it */
    uint32_t n_free, n_writing, n_ready, n_reading;
    uint64_t published, consumed, redelivered, recovered_writes;
    uint64_t lowest_ready_seq;  /* UINT64_MAX when nothing is READY */
    int n_attached;
    struct ring_attached attached[RING_MAX_ATTACH];
};

struct ring;

/* Parse ring specs as given to dflash-shm --ring: one or more comma-separated
 *   NAME:key=value[,key=value...]
 * where a new ring starts at each item holding ':' before any '=', and keys are
 *   slots=N (default 8)  bytes=SIZE (payload per slot, default 1M)  desc=SIZE (default 4k)
 *   dev=host|cpu|cuda:N|N (default host)  producers=N (default 0, see DESIGN)
 *   plan=HEX (the run plan's hash, 16 hex digits; default 0: made without a plan)
 * SIZE takes k/M/G suffixes (powers of 1024). Appends to specs[*n_specs..max_specs). Returns 0,
 * or -1 with a sentence naming the offending item. Pure function; thread-safe. */
int ring_parse_specs(const char *text, struct ring_spec *specs, int max_specs, int *n_specs,
                     char *err, int err_len);
/* "1.5M"-style rendering of a byte count into out (returns out). */
const char *ring_format_bytes(uint64_t bytes, char *out, size_t out_len);

/* The sentence of the last -1 returned by a call on an attached ring in this thread (acquire,
 * publish, release, ...), like dlerror(); "" if none. Calls taking err/err_len fill that instead. */
const char *ring_error(void);

/* Log hook for messages from waiting calls (segment not there yet, owner gone, recoveries).
 * Process-wide; default prints "ring: <line>" to stderr. fn NULL restores the default. */
void ring_set_log(void (*fn)(void *ctx, const char *line), void *ctx);

/* The run id used in segment names: same algorithm as stages/core/fsutil.h run_id() (basename of
 * realpath(run_dir) with characters outside [A-Za-z0-9_-] -> '_', at most 40, then "-%08x" of the
 * FNV-1a hash of the full real path). Re-implemented here because shm/ includes no stage header;
 * tests/test_ring.c checks the two agree. Returns 0, or -1 with a sentence. */
int ring_run_id(const char *run_dir, char *out, size_t out_len, char *err, int err_len);
/* Segment name "/dflash.<run-id>.<ring>" for a run directory. Returns 0 or -1 with a sentence. */
int ring_segment_name(const char *run_dir, const char *ring, char *out, size_t out_len,
                      char *err, int err_len);

/* dflash-shm only: create the segment of `spec` for the run (O_EXCL, mode 0600). If a segment of
 * that name exists: fails with a sentence when it is not ours (owner uid, mode 0600, see DESIGN);
 * fails when its creator is alive; when the creator is dead, adopts it if it is a host ring with
 * exactly this spec (items and attached stages carry on), else replaces it (stages still
 * attached to the old one get -1 from their next waiting acquire, saying they must restart).
 * For a GPU ring (spec->device >= 0) cudaMalloc's one buffer per slot on that device and stores
 * the IPC handles in the segment; without CUDA in the build that fails with a sentence.
 * Returns the creator's handle, or NULL with a sentence. Does not block. */
struct ring *ring_create(const char *run_dir, const struct ring_spec *spec, char *err, int err_len);

/* Attach to ring `name` of the run as a producer, consumer or observer. Waits up to wait_ms
 * (0: once) for the segment to appear and be initialised, logging through the hook every ~3 s.
 * Refuses a segment that is not ours (DESIGN, Trust). Validates magic, version, header size and
 * segment size on one snapshot of the header (sentences say expected vs found), keeps that
 * geometry for the life of the handle, runs recovery,
 * registers this process in the attach table (a producer takes over the entry of a dead producer
 * that never drained; an observer is not registered), and for GPU rings opens every slot's IPC
 * handle once on the calling thread's current CUDA device. Returns the handle, or NULL with a
 * sentence (a missing ring after wait_ms says so, with the segment name). */
struct ring *ring_attach(const char *run_dir, const char *name, int role, int wait_ms,
                         char *err, int err_len);

/* Check an attached ring against what the caller needs: payload and descriptor capacity at least
 * the given bytes, and device equal (pass -2 to skip the device check). Returns 0 or -1 with a
 * sentence giving expected and found values. */
int ring_expect(const struct ring *r, uint64_t min_payload_bytes, uint32_t min_desc_bytes,
                int device, char *err, int err_len);

/* The spec the ring was created with (name, sizes, device, n_producers). */
const struct ring_spec *ring_get_spec(const struct ring *r);

/* Consumer: deliver only seqs with seq % n_ranks == rank (data-parallel trainers). n_ranks 1
 * (the default) takes every item. Returns 0, or -1 if rank >= n_ranks or n_ranks == 0. */
int ring_set_rank(struct ring *r, uint32_t rank, uint32_t n_ranks);

/* Producer: claim a FREE slot, waiting up to timeout_ms (0: try once). Returns 0 with *slot
 * filled (WRITING, owned by this process), RING_TIMEOUT, RING_END if the ring is closed, or -1
 * (not a producer handle, or the segment was re-created under us: restart the stage). */
int ring_acquire_write(struct ring *r, int timeout_ms, struct ring_slot *slot);
/* Producer: publish a WRITING slot as READY with sequence number seq, desc_len descriptor bytes
 * and payload_len payload bytes. For GPU rings the device writes must already be complete (see
 * DESIGN). Wakes waiting consumers. Returns 0, or -1 (reason in ring_error()) if the slot is not
 * ours any more (recovered as if this process were dead) or the lengths exceed the capacities. */
int ring_publish(struct ring *r, struct ring_slot *slot, uint64_t seq, uint32_t desc_len,
                 uint64_t payload_len);
/* Producer: give a WRITING slot back unpublished (FREE). Returns 0 or -1 as ring_publish. */
int ring_abandon(struct ring *r, struct ring_slot *slot);
/* Producer: this producer will publish nothing more (see DESIGN, end of stream). Wakes
 * consumers. Returns 0, or -1 if not attached as a producer. */
int ring_mark_drained(struct ring *r);

/* Consumer: claim the lowest READY seq of this consumer's rank, waiting up to timeout_ms.
 * Returns 0 with *slot filled (READING, owned by this process), RING_TIMEOUT, RING_END (drained
 * and nothing READY or WRITING left, or closed), or -1 (also when the claimed slot's lengths
 * exceed the capacities: a corrupt segment; the slot is put back READY). */
int ring_acquire_read(struct ring *r, int timeout_ms, struct ring_slot *slot);
/* Consumer, strict order: claim the item with exactly this seq, waiting up to timeout_ms.
 * Returns as ring_acquire_read (RING_END when drained and the seq is not in the ring). */
int ring_acquire_read_seq(struct ring *r, uint64_t seq, int timeout_ms, struct ring_slot *slot);
/* Consumer: the item is done (whatever was made from it is published downstream): READING ->
 * FREE, wakes waiting producers. Returns 0, or -1 if the slot is not ours any more. */
int ring_release(struct ring *r, struct ring_slot *slot);
/* Consumer: put a READING slot back as READY without counting it consumed (e.g. stopping on
 * SIGTERM mid-item). Returns 0 or -1 as ring_release. */
int ring_unread(struct ring *r, struct ring_slot *slot);

/* Run recovery now (attach and waits do it anyway). Returns the number of slots recovered. */
int ring_recover(struct ring *r);
/* Set the closed flag and wake every waiter. Idempotent. */
void ring_set_closed(struct ring *r);
/* 1 if the ring is drained (DESIGN), else 0. */
int ring_is_drained(const struct ring *r);
/* Fill a status snapshot (occupancy, counters, attach table with liveness). Does not block. */
void ring_get_status(const struct ring *r, struct ring_status *st);

/* Detach: give back the slots this process holds in this handle's role (WRITING -> FREE for a
 * producer, READING -> READY for a consumer), unmap, close GPU handles, drop a consumer's attach
 * entry (a producer's entry stays so draining works across restarts). For the handle of
 * ring_create also: set closed, free the GPU buffers and unlink the segment. Safe with NULL. */
void ring_close(struct ring *r);

/* Creator only: give up ownership without closing or unlinking; ring_close then only unmaps.
 * For a dflash-shm stopped before the end of the stream: the stages carry on and a restarted
 * dflash-shm adopts the segment (host rings). No-op on other handles. */
void ring_disown(struct ring *r);

/* Remove a run's segment by name without attaching (cleanup, tests). 0, or -1 with a sentence
 * (ENOENT included). */
int ring_unlink(const char *run_dir, const char *name, char *err, int err_len);

/* Leftover segments. One /dev/shm/dflash.* segment as seen by ring_scan_segments. */
struct ring_segment_info {
    char segment[256];         /* name without the leading '/' */
    unsigned uid, mode;        /* owner and permission bits of the segment file */
    int ours;                  /* owned by this user with mode 0600 (the only ones ever adopted or removed) */
    uint64_t bytes;
    int has_header;            /* a dflash ring header (magic) could be read */
    int owner_pid, owner_alive;/* creator (dflash-shm) from the header; 0 if none */
    int n_live_attached;       /* attach-table entries of live producers/consumers */
};
/* Call fn for every /dev/shm segment whose name starts with prefix (NULL: "dflash."; pass
 * "dflash.<run-id>." for one run). A segment is stale only when it is ours, its creator is dead
 * and no live process is attached (dflash-shm --remove-stale removes only those). Returns the
 * count visited, or -1 with a sentence. */
int ring_scan_segments(const char *prefix, void (*fn)(void *ctx, const struct ring_segment_info *info), void *ctx,
                       char *err, int err_len);
/* The stale rule above, for one scanned segment. */
static inline int ring_segment_is_stale(const struct ring_segment_info *i) {
    return i->ours && !i->owner_alive && i->n_live_attached == 0;
}

/* Process liveness with pid-reuse protection: 1 if pid runs and (start_ticks == 0 or its start
 * time, /proc/<pid>/stat field 22, equals start_ticks), else 0. Zombies count as dead. */
int ring_pid_alive(int pid, uint64_t start_ticks);
/* Start time of pid in clock ticks since boot (field 22), or 0 if it cannot be read. */
uint64_t ring_pid_start(int pid);

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
/* Producer on a GPU ring: cudaStreamSynchronize(stream), then ring_publish. -1 with the CUDA
 * error text in the log hook if the sync fails (the slot stays WRITING; abandon it). */
int ring_publish_stream(struct ring *r, struct ring_slot *slot, uint64_t seq, uint32_t desc_len,
                        uint64_t payload_len, cudaStream_t stream);
#endif

#ifdef __cplusplus
}
#endif

#endif /* SHM_RING_H */
