/*
 * shm/ring.c — the shared-memory ring of shm/ring.h (read its DESIGN section first).
 *
 * Segment layout (all offsets fixed at creation and stored in the header):
 *   [struct ring_header, 4096 bytes]
 *   [n_slots x (struct slot_hdr + descriptor area), stride slot_stride (multiple of 64)]
 *   [host rings only: n_slots x payload, stride payload_stride, page aligned]
 *
 * Control words. A slot's 64-bit control word packs its state with its owner's identity, so a
 * claim and its owner are one atomic store and a crash can never leave a claimed slot without a
 * recognisable owner:
 *   bits 62-63 state (FREE/WRITING/READY/READING), 46-61 generation (bumped on every
 *   transition), 22-45 low 24 bits of the owner's start time (clock ticks since boot),
 *   0-21 owner pid (Linux caps pids at 2^22).
 * An owner is dead when kill(pid, 0) says ESRCH, when it is a zombie, or when the process now
 * holding that pid started at another time (pid reuse). The 24-bit start-time check can only
 * be fooled by a reused pid whose start tick collides modulo 2^24 (about one in 16 million).
 * The generation only guards against stale compare-and-swaps: every path re-reads a slot's
 * fields after its CAS succeeded, so a wrapped generation is harmless.
 * Attach-table entries use the same packing, with a 2-bit role in bits 60-61 and a 14-bit
 * generation.
 *
 * Invariants: only the owner of a WRITING/READING slot writes its seq, lengths, descriptor and
 * payload; the header's sizes never change after the magic is stored (release) by the creator;
 * nothing here blocks longer than the caller's timeout.
 */
#include "shm/ring.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- layout */

#define HEADER_BYTES 4096u
#define SLOT_HDR_BYTES 128u
#define IPC_HANDLE_BYTES 64u
#define RECOVER_EVERY_S 0.2     /* recovery period while waiting */
#define WAIT_SLICE_MS 200       /* longest single futex sleep, so recovery runs while waiting */
#define ATTACH_LOG_EVERY_S 3.0

enum { ST_FREE = 0, ST_WRITING = 1, ST_READY = 2, ST_READING = 3 };
enum { AT_EMPTY = 0, AT_ACTIVE = 1, AT_DRAINED = 2 };

struct ring_header {
    uint64_t magic;                 /* RING_MAGIC, stored last (release) by the creator */
    uint32_t version;               /* RING_VERSION */
    uint32_t header_bytes;          /* HEADER_BYTES */
    uint64_t segment_bytes;         /* the whole segment */
    uint64_t slots_offset, slot_stride;
    uint64_t payload_offset, payload_stride;   /* host rings; 0 for GPU rings */
    uint64_t payload_bytes;
    uint32_t n_slots, desc_bytes;
    int32_t device;
    uint32_t n_producers;
    uint32_t slot_hdr_bytes;        /* SLOT_HDR_BYTES */
    uint64_t plan;                  /* the run plan's hash (spec plan=), 0 for none */
    int32_t owner_pid;              /* the creating process (dflash-shm) */
    uint64_t owner_start;           /* its start time, clock ticks since boot */
    char name[RING_NAME_MAX];
    char run_id[64];
    char run_dir[512];
    _Atomic uint32_t closed;
    uint8_t pad0_[64];
    _Alignas(64) _Atomic uint64_t published;
    _Alignas(64) _Atomic uint64_t consumed;
    _Alignas(64) _Atomic uint64_t redelivered;
    _Atomic uint64_t recovered_writes;
    _Alignas(64) _Atomic uint32_t ev_ready;      /* futex: bumped on publish, redelivery, drain, close */
    _Atomic uint32_t waiters_ready;
    _Alignas(64) _Atomic uint32_t ev_free;       /* futex: bumped on release, recovery, close */
    _Atomic uint32_t waiters_free;
    _Alignas(64) _Atomic uint64_t attach[RING_MAX_ATTACH];
};
_Static_assert(sizeof(struct ring_header) <= HEADER_BYTES, "ring header grew past its 4096 bytes");

struct slot_hdr {
    _Atomic uint64_t ctl;           /* see the file comment */
    _Atomic uint64_t seq;           /* written by the owner before publish, read after acquire */
    _Atomic uint64_t payload_len;
    _Atomic uint32_t desc_len;
    _Atomic uint32_t deliveries;
    uint8_t pad_[32];
    uint8_t ipc_handle[IPC_HANDLE_BYTES];   /* cudaIpcMemHandle_t of the slot's GPU buffer */
};
_Static_assert(sizeof(struct slot_hdr) == SLOT_HDR_BYTES, "slot header must stay 128 bytes");

struct layout { uint64_t slots_offset, slot_stride, payload_offset, payload_stride, segment_bytes; };

struct ring {
    int fd;
    uint8_t *base;
    size_t map_bytes;
    struct ring_header *h;
    struct ring_spec spec;          /* n_slots, payload_bytes, desc_bytes: read once, validated */
    struct layout L;                /* offsets and strides: read once at attach, validated */
    char segment[128];
    int role;                       /* RING_PRODUCER, RING_CONSUMER, or 0 for the creator */
    int creator;
    int attach_idx;                 /* -1 if none */
    uint32_t rank, n_ranks;
    uint32_t my_pid, my_startlo;
    void **dev_ptrs;                /* GPU rings: per-slot device pointers */
    int dev_opened;                 /* 1: dev_ptrs come from cudaIpcOpenMemHandle */
    double last_recover_s, last_owner_check_s;
    int owner_gone_logged;
    int left_logged_pid;            /* last producer reported as gone without draining */
    int replaced;                   /* our segment name now points at another segment */
};

/* ---------------------------------------------------------------- small helpers */

static _Thread_local char g_err[512];
const char *ring_error(void) { return g_err; }

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

static void set_err(char *err, int err_len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void set_err(char *err, int err_len, const char *fmt, ...) {
    if (!err || err_len <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, (size_t)err_len, fmt, ap);
    va_end(ap);
}

static void default_log(void *ctx, const char *line) {
    (void)ctx;
    fprintf(stderr, "ring: %s\n", line);
}
static void (*g_log_fn)(void *, const char *) = default_log;
static void *g_log_ctx;

void ring_set_log(void (*fn)(void *ctx, const char *line), void *ctx) {
    g_log_fn = fn ? fn : default_log;
    g_log_ctx = fn ? ctx : NULL;
}

static void rlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void rlog(const char *fmt, ...) {
    char line[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    g_log_fn(g_log_ctx, line);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts) {
    /* Not FUTEX_PRIVATE_FLAG: the word lives in memory shared between processes. */
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

static void wake_all(_Atomic uint32_t *ev, _Atomic uint32_t *waiters) {
    atomic_fetch_add(ev, 1);
    if (atomic_load(waiters) > 0) futex(ev, FUTEX_WAKE, INT_MAX, NULL);
}

/* ---------------------------------------------------------------- processes */

uint64_t ring_pid_start(int pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');   /* comm may contain spaces and parentheses */
    if (!p) return 0;
    p++;
    /* After ')' come fields 3 (state) .. ; starttime is field 22, the 20th token. */
    char *save = NULL, *tok = strtok_r(p, " ", &save);
    for (int field = 3; tok && field < 22; field++) tok = strtok_r(NULL, " ", &save);
    return tok ? strtoull(tok, NULL, 10) : 0;
}

/* 1: pid runs (not a zombie) with start time matching (startlo's low 24 bits, or full value
 * when full != 0). 0 otherwise. */
static int pid_alive_lo(int pid, uint64_t start_full, uint32_t startlo, int check_lo) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? 0 : 1;   /* cannot tell: assume alive, never steal */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 1;
    p++;
    char *save = NULL, *tok = strtok_r(p, " ", &save);
    if (tok && (tok[0] == 'Z' || tok[0] == 'X')) return 0;   /* zombie or dead: gone */
    for (int field = 3; tok && field < 22; field++) tok = strtok_r(NULL, " ", &save);
    if (!tok) return 1;
    uint64_t st = strtoull(tok, NULL, 10);
    if (start_full && st != start_full) return 0;
    if (check_lo && (uint32_t)(st & 0xffffffu) != startlo) return 0;
    return 1;
}

int ring_pid_alive(int pid, uint64_t start_ticks) { return pid_alive_lo(pid, start_ticks, 0, 0); }

/* ---------------------------------------------------------------- control words */

static inline uint32_t ctl_state(uint64_t c) { return (uint32_t)(c >> 62); }
static inline uint32_t ctl_gen(uint64_t c) { return (uint32_t)(c >> 46) & 0xffffu; }
static inline uint32_t ctl_startlo(uint64_t c) { return (uint32_t)(c >> 22) & 0xffffffu; }
static inline int ctl_pid(uint64_t c) { return (int)(c & 0x3fffffu); }
static inline uint64_t ctl_make(uint32_t state, uint32_t gen, uint32_t pid, uint32_t startlo) {
    return ((uint64_t)state << 62) | ((uint64_t)(gen & 0xffffu) << 46) |
           ((uint64_t)(startlo & 0xffffffu) << 22) | (pid & 0x3fffffu);
}
static inline uint64_t ctl_next(uint64_t c, uint32_t state, uint32_t pid, uint32_t startlo) {
    return ctl_make(state, ctl_gen(c) + 1, pid, startlo);
}

static inline uint32_t at_state(uint64_t w) { return (uint32_t)(w >> 62); }
static inline uint32_t at_role(uint64_t w) { return (uint32_t)(w >> 60) & 3u; }
static inline uint64_t at_make(uint32_t state, uint32_t role, uint32_t gen, uint32_t pid, uint32_t startlo) {
    return ((uint64_t)state << 62) | ((uint64_t)(role & 3u) << 60) | ((uint64_t)(gen & 0x3fffu) << 46) |
           ((uint64_t)(startlo & 0xffffffu) << 22) | (pid & 0x3fffffu);
}
static inline uint32_t at_gen(uint64_t w) { return (uint32_t)(w >> 46) & 0x3fffu; }

static inline int owner_alive(uint64_t c) { return pid_alive_lo(ctl_pid(c), 0, ctl_startlo(c), 1); }

static inline struct slot_hdr *slot_at(const struct ring *r, uint32_t i) {
    return (struct slot_hdr *)(r->base + r->L.slots_offset + (uint64_t)i * r->L.slot_stride);
}

/* ---------------------------------------------------------------- names */

int ring_run_id(const char *run_dir, char *out, size_t out_len, char *err, int err_len) {
    char real[PATH_MAX];
    if (!realpath(run_dir, real)) {
        set_err(err, err_len, "realpath(%s) failed: %s", run_dir, strerror(errno));
        return -1;
    }
    uint32_t h = 2166136261u;   /* FNV-1a of the full path (stages/core/fsutil.c run_id() calls this) */
    for (const char *c = real; *c; c++) h = (h ^ (uint8_t)*c) * 16777619u;
    const char *base = strrchr(real, '/');
    base = base && base[1] ? base + 1 : real;
    char clean[64];
    size_t i = 0;
    for (; base[i] && i < 40; i++) {
        char c = base[i];
        clean[i] = ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') ? c : '_';
    }
    clean[i] = 0;
    int n = snprintf(out, out_len, "%s-%08x", clean, h);
    if (n < 0 || (size_t)n >= out_len) { set_err(err, err_len, "run id buffer too small"); return -1; }
    return 0;
}

static int check_name(const char *name, char *err, int err_len) {
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n >= RING_NAME_MAX) {
        set_err(err, err_len, "ring name '%s' must have 1 to %d characters", name ? name : "(null)", RING_NAME_MAX - 1);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)name[i]) || name[i] == '_' || name[i] == '-')) {
            set_err(err, err_len, "ring name '%s' may contain only letters, digits, '_' and '-'", name);
            return -1;
        }
    return 0;
}

int ring_segment_name(const char *run_dir, const char *ring, char *out, size_t out_len, char *err, int err_len) {
    if (check_name(ring, err, err_len) != 0) return -1;
    char id[128];
    if (ring_run_id(run_dir, id, sizeof id, err, err_len) != 0) return -1;
    int n = snprintf(out, out_len, "/dflash.%s.%s", id, ring);
    if (n < 0 || (size_t)n >= out_len) { set_err(err, err_len, "segment name buffer too small"); return -1; }
    return 0;
}

/* ---------------------------------------------------------------- layout computation */

static int compute_layout(uint32_t n_slots, uint64_t payload_bytes, uint32_t desc_bytes, int device,
                          struct layout *L, char *err, int err_len) {
    if (n_slots == 0 || n_slots > (1u << 20)) { set_err(err, err_len, "n_slots must be 1..%u, got %u", 1u << 20, n_slots); return -1; }
    if (desc_bytes == 0 || desc_bytes > (64u << 20)) { set_err(err, err_len, "desc_bytes must be 1..64M, got %u", desc_bytes); return -1; }
    if (payload_bytes > (1ull << 40)) { set_err(err, err_len, "payload_bytes %llu is larger than 1 TiB", (unsigned long long)payload_bytes); return -1; }
    L->slots_offset = HEADER_BYTES;
    L->slot_stride = round_up(SLOT_HDR_BYTES + (uint64_t)desc_bytes, 64);
    uint64_t end = L->slots_offset + L->slot_stride * n_slots;
    if (device < 0 && payload_bytes > 0) {
        L->payload_offset = round_up(end, 4096);
        L->payload_stride = payload_bytes >= 4096 ? round_up(payload_bytes, 4096) : round_up(payload_bytes, 64);
        if (L->payload_stride > (UINT64_MAX - L->payload_offset) / n_slots) { set_err(err, err_len, "ring size overflows"); return -1; }
        end = L->payload_offset + L->payload_stride * n_slots;
    } else {
        L->payload_offset = 0;
        L->payload_stride = 0;
    }
    L->segment_bytes = round_up(end, 4096);
    return 0;
}

/* ---------------------------------------------------------------- GPU buffers */

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
_Static_assert(sizeof(cudaIpcMemHandle_t) == IPC_HANDLE_BYTES, "cudaIpcMemHandle_t size changed");

static int gpu_alloc(struct ring *r, char *err, int err_len) {
    int prev = 0;
    cudaError_t e = cudaGetDevice(&prev);
    if (e != cudaSuccess) { set_err(err, err_len, "cudaGetDevice failed: %s", cudaGetErrorString(e)); return -1; }
    if ((e = cudaSetDevice(r->spec.device)) != cudaSuccess) {
        set_err(err, err_len, "cudaSetDevice(%d) for ring '%s' failed: %s", r->spec.device, r->spec.name, cudaGetErrorString(e));
        return -1;
    }
    r->dev_ptrs = calloc(r->spec.n_slots, sizeof(void *));
    if (!r->dev_ptrs) { set_err(err, err_len, "out of memory"); cudaSetDevice(prev); return -1; }
    uint64_t bytes = r->spec.payload_bytes ? r->spec.payload_bytes : 1;
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        if ((e = cudaMalloc(&r->dev_ptrs[i], bytes)) != cudaSuccess) {
            set_err(err, err_len, "cudaMalloc(%llu bytes) for slot %u of ring '%s' on cuda:%d failed: %s",
                    (unsigned long long)bytes, i, r->spec.name, r->spec.device, cudaGetErrorString(e));
            r->dev_ptrs[i] = NULL;
            cudaSetDevice(prev);
            return -1;
        }
        cudaIpcMemHandle_t hnd;
        if ((e = cudaIpcGetMemHandle(&hnd, r->dev_ptrs[i])) != cudaSuccess) {
            set_err(err, err_len, "cudaIpcGetMemHandle for slot %u of ring '%s' failed: %s", i, r->spec.name, cudaGetErrorString(e));
            cudaSetDevice(prev);
            return -1;
        }
        memcpy(slot_at(r, i)->ipc_handle, &hnd, sizeof hnd);
    }
    cudaDeviceSynchronize();
    cudaSetDevice(prev);
    return 0;
}

static int gpu_open(struct ring *r, char *err, int err_len) {
    r->dev_ptrs = calloc(r->spec.n_slots, sizeof(void *));
    if (!r->dev_ptrs) { set_err(err, err_len, "out of memory"); return -1; }
    r->dev_opened = 1;
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        cudaIpcMemHandle_t hnd;
        memcpy(&hnd, slot_at(r, i)->ipc_handle, sizeof hnd);
        cudaError_t e = cudaIpcOpenMemHandle(&r->dev_ptrs[i], hnd, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
            set_err(err, err_len, "cudaIpcOpenMemHandle for slot %u of ring '%s' (cuda:%d) failed: %s "
                    "(hint: is dflash-shm, which owns the buffers, still running? the creating process cannot open its own handles)",
                    i, r->spec.name, r->spec.device, cudaGetErrorString(e));
            r->dev_ptrs[i] = NULL;
            return -1;
        }
    }
    return 0;
}

static void gpu_free(struct ring *r) {
    if (!r->dev_ptrs) return;
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        if (!r->dev_ptrs[i]) continue;
        if (r->dev_opened) cudaIpcCloseMemHandle(r->dev_ptrs[i]);
        else cudaFree(r->dev_ptrs[i]);
    }
    free(r->dev_ptrs);
    r->dev_ptrs = NULL;
}

int ring_publish_stream(struct ring *r, struct ring_slot *slot, uint64_t seq, uint32_t desc_len,
                        uint64_t payload_len, cudaStream_t stream) {
    cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
        fail("cudaStreamSynchronize before publishing seq %llu on ring '%s' failed: %s",
             (unsigned long long)seq, r->spec.name, cudaGetErrorString(e));
        rlog("%s", g_err);
        return -1;
    }
    return ring_publish(r, slot, seq, desc_len, payload_len);
}
#else
static int gpu_alloc(struct ring *r, char *err, int err_len) {
    set_err(err, err_len, "ring '%s' asks for payloads on cuda:%d but this build has no CUDA (build with CUDA=1, or create the ring with dev=host)",
            r->spec.name, r->spec.device);
    return -1;
}
static int gpu_open(struct ring *r, char *err, int err_len) {
    set_err(err, err_len, "ring '%s' keeps its payloads on cuda:%d but this build has no CUDA (run dflash-shm with dev=host for --device cpu runs)",
            r->spec.name, r->spec.device);
    return -1;
}
static void gpu_free(struct ring *r) { free(r->dev_ptrs); r->dev_ptrs = NULL; }
#endif

/* ---------------------------------------------------------------- create / attach / close */

static struct ring *ring_new(void) {
    struct ring *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->fd = -1;
    r->attach_idx = -1;
    r->n_ranks = 1;
    r->my_pid = (uint32_t)getpid();
    r->my_startlo = (uint32_t)(ring_pid_start((int)r->my_pid) & 0xffffffu);
    return r;
}

static void ring_free_handle(struct ring *r) {
    if (!r) return;
    gpu_free(r);
    if (r->base && r->base != MAP_FAILED) munmap(r->base, r->map_bytes);
    if (r->fd >= 0) close(r->fd);
    free(r);
}

/* A segment is ours only if this user owns it with mode 0600: /dev/shm is world-writable and
 * segment names are predictable, so anything else may have been planted by another user (who
 * could then truncate it under us, or rewrite its header at will). Returns 0, or -1 with a
 * sentence saying why it was refused. */
static int check_ours(int fd, const char *segment, char *err, int err_len) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) { set_err(err, err_len, "fstat(%s) failed: %s", segment, strerror(errno)); return -1; }
    if (sb.st_uid != geteuid() || (sb.st_mode & 07777) != 0600) {
        set_err(err, err_len, "refusing segment %s: it is owned by uid %u with mode %04o, expected uid %u (this user) and mode 0600 "
                "(another user may have planted it; that user or root must remove /dev/shm%s)",
                segment, (unsigned)sb.st_uid, (unsigned)(sb.st_mode & 07777), (unsigned)geteuid(), segment);
        return -1;
    }
    return 0;
}

/* Read the creator pid/start of an existing segment without validating more. */
static int peek_owner(int fd, int *pid, uint64_t *start) {
    struct stat sb;
    *pid = 0;
    *start = 0;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < HEADER_BYTES) return -1;
    struct ring_header *h = mmap(NULL, HEADER_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) return -1;
    int ok = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == RING_MAGIC;
    if (ok) { *pid = h->owner_pid; *start = h->owner_start; }
    munmap(h, HEADER_BYTES);
    return ok ? 0 : -1;
}

static int try_adopt(struct ring *r, const char *run_dir);

struct ring *ring_create(const char *run_dir, const struct ring_spec *spec, char *err, int err_len) {
    struct layout L;
    if (!spec || check_name(spec->name, err, err_len) != 0) return NULL;
    if (compute_layout(spec->n_slots, spec->payload_bytes, spec->desc_bytes, spec->device, &L, err, err_len) != 0) return NULL;
    struct ring *r = ring_new();
    if (!r) { set_err(err, err_len, "out of memory"); return NULL; }
    r->spec = *spec;
    r->spec.name[RING_NAME_MAX - 1] = 0;
    r->creator = 1;
    if (ring_segment_name(run_dir, spec->name, r->segment, sizeof r->segment, err, err_len) != 0) goto bad;

    for (int attempt = 0; attempt < 2; attempt++) {
        r->fd = shm_open(r->segment, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (r->fd >= 0) break;
        if (errno != EEXIST) { set_err(err, err_len, "shm_open(%s) failed: %s", r->segment, strerror(errno)); goto bad; }
        int fd = shm_open(r->segment, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
        int pid = 0;
        uint64_t start = 0;
        if (fd >= 0 && check_ours(fd, r->segment, err, err_len) != 0) { close(fd); goto bad; }
        if (fd >= 0) { peek_owner(fd, &pid, &start); close(fd); }
        if (pid > 0 && ring_pid_alive(pid, start)) {
            set_err(err, err_len, "ring segment %s already exists and its creator pid %d is alive "
                    "(another dflash-shm for this run?)", r->segment, pid);
            goto bad;
        }
        if (try_adopt(r, run_dir)) return r;
        rlog("replacing stale segment %s (creator pid %d is gone)", r->segment, pid);
        if (shm_unlink(r->segment) != 0 && errno != ENOENT) {
            set_err(err, err_len, "shm_unlink(%s) of a stale segment failed: %s", r->segment, strerror(errno));
            goto bad;
        }
    }
    if (r->fd < 0) { set_err(err, err_len, "shm_open(%s) kept failing with EEXIST", r->segment); goto bad; }
    /* Mode 0600 whatever the umask (check_ours insists on it when the segment is adopted). */
    if (fchmod(r->fd, 0600) != 0) {
        set_err(err, err_len, "fchmod(%s, 0600) failed: %s", r->segment, strerror(errno));
        shm_unlink(r->segment);
        goto bad;
    }
    /* posix_fallocate reserves tmpfs pages now, so a full /dev/shm fails here with a sentence
     * instead of SIGBUS on first touch in some stage later. */
    int fe = posix_fallocate(r->fd, 0, (off_t)L.segment_bytes);
    if (fe != 0) {
        set_err(err, err_len, "posix_fallocate(%s, %llu bytes) failed: %s (hint: is /dev/shm large enough?)",
                r->segment, (unsigned long long)L.segment_bytes, strerror(fe));
        shm_unlink(r->segment);
        goto bad;
    }
    r->map_bytes = L.segment_bytes;
    r->base = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
    if (r->base == MAP_FAILED) {
        r->base = NULL;
        set_err(err, err_len, "mmap(%s, %llu bytes) failed: %s", r->segment, (unsigned long long)r->map_bytes, strerror(errno));
        shm_unlink(r->segment);
        goto bad;
    }
    struct ring_header *h = r->h = (struct ring_header *)r->base;
    r->L = L;
    h->version = RING_VERSION;
    h->header_bytes = HEADER_BYTES;
    h->segment_bytes = L.segment_bytes;
    h->slots_offset = L.slots_offset;
    h->slot_stride = L.slot_stride;
    h->payload_offset = L.payload_offset;
    h->payload_stride = L.payload_stride;
    h->payload_bytes = spec->payload_bytes;
    h->n_slots = spec->n_slots;
    h->desc_bytes = spec->desc_bytes;
    h->device = spec->device < 0 ? -1 : spec->device;
    h->n_producers = spec->n_producers;
    h->plan = spec->plan;
    h->slot_hdr_bytes = SLOT_HDR_BYTES;
    h->owner_pid = (int32_t)getpid();
    h->owner_start = ring_pid_start(h->owner_pid);
    memcpy(h->name, r->spec.name, RING_NAME_MAX);
    ring_run_id(run_dir, h->run_id, sizeof h->run_id, NULL, 0);
    if (!realpath(run_dir, h->run_dir)) snprintf(h->run_dir, sizeof h->run_dir, "%s", run_dir);
    r->spec.device = h->device;
    if (h->device >= 0 && gpu_alloc(r, err, err_len) != 0) { shm_unlink(r->segment); goto bad; }
    __atomic_store_n(&h->magic, RING_MAGIC, __ATOMIC_RELEASE);
    return r;
bad:
    ring_free_handle(r);
    return NULL;
}

/* Validate a mapped header. Returns 0, 1 (not initialised yet: wait), or -1 with a sentence. */
static int validate_header(const char *segment, const struct ring_header *h, uint64_t file_bytes, char *err, int err_len) {
    uint64_t magic = __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE);
    if (magic == 0) return 1;
    if (magic != RING_MAGIC) {
        set_err(err, err_len, "segment %s is not a dflash ring: magic is 0x%016llx, expected 0x%016llx",
                segment, (unsigned long long)magic, (unsigned long long)RING_MAGIC);
        return -1;
    }
    if (h->version != RING_VERSION) {
        set_err(err, err_len, "ring %s has layout version %u, this binary expects version %u (rebuild the stages and dflash-shm from one tree)",
                segment, h->version, RING_VERSION);
        return -1;
    }
    if (h->header_bytes != HEADER_BYTES || h->slot_hdr_bytes != SLOT_HDR_BYTES) {
        set_err(err, err_len, "ring %s has a %u-byte header and %u-byte slot headers, expected %u and %u",
                segment, h->header_bytes, h->slot_hdr_bytes, HEADER_BYTES, SLOT_HDR_BYTES);
        return -1;
    }
    struct layout L;
    char why[256];
    if (compute_layout(h->n_slots, h->payload_bytes, h->desc_bytes, h->device, &L, why, sizeof why) != 0) {
        set_err(err, err_len, "ring %s has an invalid header: %s", segment, why);
        return -1;
    }
    if (L.slots_offset != h->slots_offset || L.slot_stride != h->slot_stride || L.payload_offset != h->payload_offset ||
        L.payload_stride != h->payload_stride || L.segment_bytes != h->segment_bytes) {
        set_err(err, err_len, "ring %s: header says %u slots, %llu payload bytes, %u descriptor bytes, which need a %llu-byte "
                "segment, but the header records %llu bytes", segment, h->n_slots, (unsigned long long)h->payload_bytes,
                h->desc_bytes, (unsigned long long)L.segment_bytes, (unsigned long long)h->segment_bytes);
        return -1;
    }
    if (file_bytes != h->segment_bytes) {
        set_err(err, err_len, "ring %s: the header's %u slots x %llu payload bytes need a %llu-byte segment, found %llu bytes",
                segment, h->n_slots, (unsigned long long)h->payload_bytes, (unsigned long long)h->segment_bytes,
                (unsigned long long)file_bytes);
        return -1;
    }
    return 0;
}

/* A host ring left by a dead creator with exactly this spec is adopted, not replaced: its items
 * and the stages attached to it carry on under the new dflash-shm. Returns 1 if adopted (r is
 * then fully set up), 0 to replace it. GPU rings are always replaced: their buffers died with
 * the process that allocated them. */
static int try_adopt(struct ring *r, const char *run_dir) {
    (void)run_dir;
    if (r->spec.device >= 0) return 0;
    int fd = shm_open(r->segment, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    char why[512];
    if (check_ours(fd, r->segment, why, sizeof why) != 0) { rlog("%s", why); close(fd); return 0; }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_size < HEADER_BYTES) { close(fd); return 0; }
    uint8_t *base = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) { close(fd); return 0; }
    struct ring_header *h = (struct ring_header *)base;
    struct ring_header hc;   /* one snapshot: what is validated is what is used */
    memcpy(&hc, h, sizeof hc);
    int old_pid = hc.owner_pid;
    if (validate_header(r->segment, &hc, (uint64_t)sb.st_size, why, sizeof why) != 0 || hc.device >= 0 ||
        hc.n_slots != r->spec.n_slots || hc.payload_bytes != r->spec.payload_bytes ||
        hc.desc_bytes != r->spec.desc_bytes || hc.n_producers != r->spec.n_producers || hc.plan != r->spec.plan ||
        strncmp(hc.name, r->spec.name, RING_NAME_MAX) != 0 ||
        !__atomic_compare_exchange_n(&h->owner_pid, &old_pid, (int32_t)getpid(), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        munmap(base, (size_t)sb.st_size);
        close(fd);
        return 0;
    }
    h->owner_start = ring_pid_start((int)getpid());
    atomic_store(&h->closed, 0);
    r->fd = fd;
    r->base = base;
    r->map_bytes = (size_t)sb.st_size;
    r->h = h;
    r->L = (struct layout){hc.slots_offset, hc.slot_stride, hc.payload_offset, hc.payload_stride, hc.segment_bytes};
    rlog("adopted ring '%s' (segment %s) left by dead pid %d: %llu published, %llu consumed so far",
         r->spec.name, r->segment, old_pid, (unsigned long long)atomic_load(&h->published),
         (unsigned long long)atomic_load(&h->consumed));
    ring_recover(r);
    return 1;
}

static int attach_register(struct ring *r, char *err, int err_len) {
    struct ring_header *h = r->h;
    /* A producer first takes over the entry of a dead producer that never drained, so its
     * restart stands in for it and the end of stream still waits for it. */
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < RING_MAX_ATTACH; i++) {
            uint64_t w = atomic_load(&h->attach[i]);
            uint32_t st = at_state(w), role = at_role(w);
            int take = 0;
            if (pass == 0) take = r->role == RING_PRODUCER && st == AT_ACTIVE && role == RING_PRODUCER && !owner_alive(w);
            else if (pass == 1) take = st == AT_EMPTY;
            else take = st == AT_ACTIVE && role == RING_CONSUMER && !owner_alive(w);   /* recycle dead consumers */
            if (!take) continue;
            uint64_t nw = at_make(AT_ACTIVE, (uint32_t)r->role, at_gen(w) + 1, r->my_pid, r->my_startlo);
            if (atomic_compare_exchange_strong(&h->attach[i], &w, nw)) {
                if (pass == 0) rlog("ring '%s': producer pid %u takes over the entry of dead producer pid %d",
                                    r->spec.name, r->my_pid, ctl_pid(w));
                r->attach_idx = i;
                return 0;
            }
            i--;   /* lost a race on this entry: look at it again */
        }
    }
    set_err(err, err_len, "ring %s: all %d attach-table entries are held by live processes or drained producers",
            r->segment, RING_MAX_ATTACH);
    return -1;
}

struct ring *ring_attach(const char *run_dir, const char *name, int role, int wait_ms, char *err, int err_len) {
    if (role != RING_PRODUCER && role != RING_CONSUMER && role != RING_OBSERVER) {
        set_err(err, err_len, "ring_attach: role must be RING_PRODUCER, RING_CONSUMER or RING_OBSERVER, got %d", role);
        return NULL;
    }
    struct ring *r = ring_new();
    if (!r) { set_err(err, err_len, "out of memory"); return NULL; }
    r->role = role;
    if (ring_segment_name(run_dir, name, r->segment, sizeof r->segment, err, err_len) != 0) goto bad;
    double t0 = now_s(), next_log = t0 + ATTACH_LOG_EVERY_S;
    const char *what = "does not exist";
    struct ring_header hc;
    for (;;) {
        r->fd = shm_open(r->segment, O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
        if (r->fd < 0 && errno != ENOENT) { set_err(err, err_len, "shm_open(%s) failed: %s", r->segment, strerror(errno)); goto bad; }
        if (r->fd >= 0 && check_ours(r->fd, r->segment, err, err_len) != 0) goto bad;
        if (r->fd >= 0) {
            struct stat sb;
            if (fstat(r->fd, &sb) != 0) { set_err(err, err_len, "fstat(%s) failed: %s", r->segment, strerror(errno)); goto bad; }
            if ((uint64_t)sb.st_size >= HEADER_BYTES) {
                r->map_bytes = (size_t)sb.st_size;
                r->base = mmap(NULL, r->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
                if (r->base == MAP_FAILED) {
                    r->base = NULL;
                    set_err(err, err_len, "mmap(%s, %zu bytes) failed: %s", r->segment, r->map_bytes, strerror(errno));
                    goto bad;
                }
                r->h = (struct ring_header *)r->base;
                memcpy(&hc, r->h, sizeof hc);   /* one snapshot: validated once, then used */
                int v = validate_header(r->segment, &hc, (uint64_t)sb.st_size, err, err_len);
                if (v < 0) goto bad;
                if (v == 0) break;
                what = "is being initialised";
                munmap(r->base, r->map_bytes);
                r->base = NULL;
                r->h = NULL;
            } else {
                what = sb.st_size == 0 ? "is being created" : "is smaller than a ring header";
            }
            close(r->fd);
            r->fd = -1;
        }
        double t = now_s();
        if ((t - t0) * 1000.0 >= wait_ms) {
            set_err(err, err_len, "ring '%s' (segment %s) %s after waiting %.1f s (hint: is dflash-shm running for run %s with this ring?)",
                    name, r->segment, what, t - t0, run_dir);
            goto bad;
        }
        if (t >= next_log) {
            rlog("waiting for ring '%s' (segment %s, which %s) for %.0f s of %.0f s", name, r->segment, what, t - t0, wait_ms / 1000.0);
            next_log = t + ATTACH_LOG_EVERY_S;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    struct ring_header *h = &hc;
    memcpy(r->spec.name, h->name, RING_NAME_MAX);
    r->spec.name[RING_NAME_MAX - 1] = 0;
    r->spec.n_slots = h->n_slots;
    r->spec.payload_bytes = h->payload_bytes;
    r->spec.desc_bytes = h->desc_bytes;
    r->spec.device = h->device;
    r->spec.n_producers = h->n_producers;
    r->spec.plan = h->plan;
    r->L = (struct layout){h->slots_offset, h->slot_stride, h->payload_offset, h->payload_stride, h->segment_bytes};
    if (strcmp(r->spec.name, name) != 0) {
        set_err(err, err_len, "segment %s names ring '%s', expected '%s'", r->segment, r->spec.name, name);
        goto bad;
    }
    if (role == RING_OBSERVER) return r;   /* status only: no handles, no recovery, no entry */
    if (h->device >= 0 && gpu_open(r, err, err_len) != 0) goto bad;
    ring_recover(r);
    if (attach_register(r, err, err_len) != 0) goto bad;
    r->last_recover_s = now_s();
    return r;
bad:
    ring_free_handle(r);
    return NULL;
}

int ring_expect(const struct ring *r, uint64_t min_payload_bytes, uint32_t min_desc_bytes, int device, char *err, int err_len) {
    if (r->spec.payload_bytes < min_payload_bytes) {
        set_err(err, err_len, "ring '%s' has %llu payload bytes per slot, expected at least %llu (start dflash-shm with bytes=%llu or more)",
                r->spec.name, (unsigned long long)r->spec.payload_bytes, (unsigned long long)min_payload_bytes,
                (unsigned long long)min_payload_bytes);
        return -1;
    }
    if (r->spec.desc_bytes < min_desc_bytes) {
        set_err(err, err_len, "ring '%s' has %u descriptor bytes per slot, expected at least %u",
                r->spec.name, r->spec.desc_bytes, min_desc_bytes);
        return -1;
    }
    if (device != -2 && r->spec.device != device) {
        set_err(err, err_len, "ring '%s' keeps its payloads on %s%d, expected %s%d", r->spec.name,
                r->spec.device < 0 ? "host " : "cuda:", r->spec.device, device < 0 ? "host " : "cuda:", device);
        return -1;
    }
    return 0;
}

const struct ring_spec *ring_get_spec(const struct ring *r) { return &r->spec; }

int ring_set_rank(struct ring *r, uint32_t rank, uint32_t n_ranks) {
    if (n_ranks == 0 || rank >= n_ranks) return fail("ring_set_rank: rank %u must be below n_ranks %u (>= 1)", rank, n_ranks);
    r->rank = rank;
    r->n_ranks = n_ranks;
    return 0;
}

void ring_close(struct ring *r) {
    if (!r) return;
    if (r->h && (r->role == RING_PRODUCER || r->role == RING_CONSUMER)) {
        /* Give back what this process still holds in this role, so a process that detaches and
         * lives on does not pin slots (a dead one is recovered by the others anyway). */
        uint32_t held = r->role == RING_PRODUCER ? ST_WRITING : ST_READING;
        for (uint32_t i = 0; i < r->spec.n_slots; i++) {
            struct slot_hdr *s = slot_at(r, i);
            uint64_t c = atomic_load(&s->ctl);
            if (ctl_state(c) != held || ctl_pid(c) != (int)r->my_pid || ctl_startlo(c) != r->my_startlo) continue;
            uint32_t to = held == ST_WRITING ? ST_FREE : ST_READY;
            if (atomic_compare_exchange_strong(&s->ctl, &c, ctl_next(c, to, 0, 0))) {
                if (to == ST_FREE) wake_all(&r->h->ev_free, &r->h->waiters_free);
                else wake_all(&r->h->ev_ready, &r->h->waiters_ready);
            }
        }
    }
    if (r->h) {
        if (r->creator) {
            ring_set_closed(r);
            shm_unlink(r->segment);
        } else if (r->attach_idx >= 0 && r->role == RING_CONSUMER) {
            /* A consumer's entry goes; a producer's stays (drain accounting across restarts). */
            _Atomic uint64_t *e = &r->h->attach[r->attach_idx];
            uint64_t w = atomic_load(e);
            if (ctl_pid(w) == (int)r->my_pid && at_state(w) == AT_ACTIVE)
                atomic_compare_exchange_strong(e, &w, at_make(AT_EMPTY, 0, at_gen(w) + 1, 0, 0));
        }
    }
    ring_free_handle(r);
}

void ring_disown(struct ring *r) {
    if (r && r->creator) r->creator = 0;
}

int ring_unlink(const char *run_dir, const char *name, char *err, int err_len) {
    char seg[128];
    if (ring_segment_name(run_dir, name, seg, sizeof seg, err, err_len) != 0) return -1;
    if (shm_unlink(seg) != 0) { set_err(err, err_len, "shm_unlink(%s) failed: %s", seg, strerror(errno)); return -1; }
    return 0;
}

/* ---------------------------------------------------------------- recovery and state */

int ring_recover(struct ring *r) {
    struct ring_header *h = r->h;
    int n = 0;
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        struct slot_hdr *s = slot_at(r, i);
        uint64_t c = atomic_load(&s->ctl);
        uint32_t st = ctl_state(c);
        if (st != ST_WRITING && st != ST_READING) continue;
        if (owner_alive(c)) continue;
        uint32_t to = st == ST_WRITING ? ST_FREE : ST_READY;
        if (!atomic_compare_exchange_strong(&s->ctl, &c, ctl_next(c, to, 0, 0))) continue;
        n++;
        if (st == ST_WRITING) {
            atomic_fetch_add(&h->recovered_writes, 1);
            rlog("ring '%s': slot %u was being written by dead pid %d; freed (nothing of it is visible)",
                 r->spec.name, i, ctl_pid(c));
            wake_all(&h->ev_free, &h->waiters_free);
        } else {
            atomic_fetch_add(&h->redelivered, 1);
            rlog("ring '%s': seq %llu (slot %u) was being read by dead pid %d; it will be delivered again",
                 r->spec.name, (unsigned long long)atomic_load(&s->seq), i, ctl_pid(c));
            wake_all(&h->ev_ready, &h->waiters_ready);
        }
    }
    return n;
}

void ring_set_closed(struct ring *r) {
    atomic_store(&r->h->closed, 1);
    wake_all(&r->h->ev_ready, &r->h->waiters_ready);
    wake_all(&r->h->ev_free, &r->h->waiters_free);
}

static int drained_now(const struct ring_header *h) {
    uint32_t drained = 0;
    for (int i = 0; i < RING_MAX_ATTACH; i++) {
        uint64_t w = atomic_load(&((struct ring_header *)h)->attach[i]);
        if (at_role(w) != RING_PRODUCER) continue;
        if (at_state(w) == AT_ACTIVE) return 0;
        if (at_state(w) == AT_DRAINED) drained++;
    }
    uint32_t need = h->n_producers ? h->n_producers : 1;
    return drained >= need;
}

int ring_is_drained(const struct ring *r) { return drained_now(r->h); }

int ring_mark_drained(struct ring *r) {
    if (r->role != RING_PRODUCER || r->attach_idx < 0) return fail("ring_mark_drained on ring '%s': not attached as a producer", r->spec.name);
    _Atomic uint64_t *e = &r->h->attach[r->attach_idx];
    for (;;) {
        uint64_t w = atomic_load(e);
        if (ctl_pid(w) != (int)r->my_pid)
            return fail("ring '%s': this producer's attach entry was taken over (pid %d holds it)", r->spec.name, ctl_pid(w));
        if (at_state(w) == AT_DRAINED) break;
        uint64_t nw = at_make(AT_DRAINED, RING_PRODUCER, at_gen(w) + 1, r->my_pid, r->my_startlo);
        if (atomic_compare_exchange_strong(e, &w, nw)) break;
    }
    wake_all(&r->h->ev_ready, &r->h->waiters_ready);
    return 0;
}

/* ---------------------------------------------------------------- waiting */

/* Periodic work while a call waits: recovery, and one log line if the creator is gone. */
static void wait_housekeeping(struct ring *r) {
    double t = now_s();
    if (t - r->last_recover_s >= RECOVER_EVERY_S) {
        r->last_recover_s = t;
        ring_recover(r);
    }
    if (t - r->last_owner_check_s >= ATTACH_LOG_EVERY_S) {
        r->last_owner_check_s = t;
        struct stat mine, now;
        char path[160];
        snprintf(path, sizeof path, "/dev/shm%s", r->segment);
        if (!r->creator && fstat(r->fd, &mine) == 0 && stat(path, &now) == 0 && now.st_ino != mine.st_ino) r->replaced = 1;
        /* A producer that exited without draining (killed, or stopped before the end of its
         * stream) keeps the end of stream waiting for its restart: say so once per pid. */
        for (int i = 0; r->role == RING_CONSUMER && i < RING_MAX_ATTACH; i++) {
            uint64_t w = atomic_load(&r->h->attach[i]);
            if (at_state(w) != AT_ACTIVE || at_role(w) != RING_PRODUCER || ctl_pid(w) == r->left_logged_pid || owner_alive(w)) continue;
            r->left_logged_pid = ctl_pid(w);
            rlog("ring '%s': producer pid %d exited before the end of its stream (not drained); waiting for its restart",
                 r->spec.name, ctl_pid(w));
        }
        if (!r->owner_gone_logged && !ring_pid_alive(r->h->owner_pid, r->h->owner_start)) {
            r->owner_gone_logged = 1;
            rlog("ring '%s': its creator dflash-shm (pid %d) is gone; %s", r->spec.name, r->h->owner_pid,
                 r->spec.device >= 0 ? "GPU payloads may be lost; restart the run" : "host payloads stay usable");
        }
    }
}

static int fail_replaced(const struct ring *r) {
    return fail("ring '%s': segment %s was re-created by a new dflash-shm after its creator died; "
                "this process still sees the old one and must restart to attach to the new one",
                r->spec.name, r->segment);
}

/* Sleep on ev until it changes from `seen` or up to min(remaining, WAIT_SLICE_MS). */
static void wait_on(_Atomic uint32_t *ev, _Atomic uint32_t *waiters, uint32_t seen, double remaining_s) {
    double slice = remaining_s < WAIT_SLICE_MS / 1000.0 ? remaining_s : WAIT_SLICE_MS / 1000.0;
    if (slice <= 0) return;
    struct timespec ts = {(time_t)slice, (long)((slice - (double)(time_t)slice) * 1e9)};
    atomic_fetch_add(waiters, 1);
    if (atomic_load(ev) == seen) futex(ev, FUTEX_WAIT, seen, &ts);   /* EINTR/EAGAIN/ETIMEDOUT: caller re-checks */
    atomic_fetch_sub(waiters, 1);
}

static void fill_slot(const struct ring *r, uint32_t i, uint64_t ctl, struct ring_slot *out) {
    struct slot_hdr *s = slot_at(r, i);
    memset(out, 0, sizeof *out);
    out->index = i;
    out->ctl_ = ctl;
    out->desc = (uint8_t *)s + SLOT_HDR_BYTES;
    out->desc_cap = r->spec.desc_bytes;
    out->payload_cap = r->spec.payload_bytes;
    out->device = r->spec.device;
    if (r->spec.device >= 0) {
        out->on_device = 1;
        out->payload = r->dev_ptrs ? r->dev_ptrs[i] : NULL;
    } else {
        out->payload = r->L.payload_stride ? r->base + r->L.payload_offset + (uint64_t)i * r->L.payload_stride : NULL;
    }
}

/* ---------------------------------------------------------------- producer */

static int try_write(struct ring *r, struct ring_slot *slot) {
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        struct slot_hdr *s = slot_at(r, i);
        uint64_t c = atomic_load_explicit(&s->ctl, memory_order_relaxed);
        if (ctl_state(c) != ST_FREE) continue;
        uint64_t nc = ctl_next(c, ST_WRITING, r->my_pid, r->my_startlo);
        if (atomic_compare_exchange_strong_explicit(&s->ctl, &c, nc, memory_order_acq_rel, memory_order_relaxed)) {
            fill_slot(r, i, nc, slot);
            return 1;
        }
    }
    return 0;
}

int ring_acquire_write(struct ring *r, int timeout_ms, struct ring_slot *slot) {
    struct ring_header *h = r->h;
    if (r->role != RING_PRODUCER) return fail("ring_acquire_write on ring '%s': not attached as a producer", r->spec.name);
    double deadline = now_s() + (timeout_ms > 0 ? timeout_ms / 1000.0 : 0);
    for (;;) {
        uint32_t seen = atomic_load(&h->ev_free);
        if (atomic_load(&h->closed)) return RING_END;
        if (try_write(r, slot)) return 0;
        double left = deadline - now_s();
        if (left <= 0) return RING_TIMEOUT;
        wait_housekeeping(r);
        if (r->replaced) return fail_replaced(r);
        wait_on(&h->ev_free, &h->waiters_free, seen, left);
    }
}

/* Move our own slot from `from` to `to` (owner cleared). */
static int own_transition(struct ring *r, struct ring_slot *slot, uint32_t from, uint32_t to, const char *what) {
    struct slot_hdr *s = slot_at(r, slot->index);
    uint64_t c = slot->ctl_;
    if (slot->index >= r->spec.n_slots || ctl_state(c) != from)
        return fail("%s on ring '%s': slot %u is not held by this process in the right state", what, r->spec.name, slot->index);
    if (!atomic_compare_exchange_strong_explicit(&s->ctl, &c, ctl_next(c, to, 0, 0), memory_order_acq_rel, memory_order_relaxed))
        return fail("%s on ring '%s': slot %u is no longer ours (it was recovered as if this process were dead; "
                    "its control word is now 0x%016llx)", what, r->spec.name, slot->index, (unsigned long long)c);
    slot->ctl_ = 0;
    return 0;
}

int ring_publish(struct ring *r, struct ring_slot *slot, uint64_t seq, uint32_t desc_len, uint64_t payload_len) {
    if (desc_len > r->spec.desc_bytes || payload_len > r->spec.payload_bytes)
        return fail("ring_publish on ring '%s': desc_len %u / payload_len %llu exceed the capacities %u / %llu",
                    r->spec.name, desc_len, (unsigned long long)payload_len, r->spec.desc_bytes,
                    (unsigned long long)r->spec.payload_bytes);
    struct slot_hdr *s = slot_at(r, slot->index);
    if (slot->index < r->spec.n_slots) {
        atomic_store_explicit(&s->seq, seq, memory_order_relaxed);
        atomic_store_explicit(&s->desc_len, desc_len, memory_order_relaxed);
        atomic_store_explicit(&s->payload_len, payload_len, memory_order_relaxed);
        atomic_store_explicit(&s->deliveries, 0, memory_order_relaxed);
    }
    /* The release half of own_transition's CAS orders the descriptor, payload and fields above
     * before READY becomes visible. */
    if (own_transition(r, slot, ST_WRITING, ST_READY, "ring_publish") != 0) return -1;
    atomic_fetch_add_explicit(&r->h->published, 1, memory_order_relaxed);
    wake_all(&r->h->ev_ready, &r->h->waiters_ready);
    return 0;
}

int ring_abandon(struct ring *r, struct ring_slot *slot) {
    if (own_transition(r, slot, ST_WRITING, ST_FREE, "ring_abandon") != 0) return -1;
    wake_all(&r->h->ev_free, &r->h->waiters_free);
    return 0;
}

/* ---------------------------------------------------------------- consumer */

/* The lowest READY seq this consumer may take: returns its slot index (UINT32_MAX if none)
 * with *seq_out and *ctl_out; *pending says whether some slot is WRITING. */
static uint32_t scan_lowest(const struct ring *r, int strict, uint64_t want, uint64_t *seq_out, uint64_t *ctl_out, int *pending) {
    uint32_t best = UINT32_MAX;   /* found <=> best != UINT32_MAX: every seq value is valid, UINT64_MAX too */
    uint64_t best_seq = UINT64_MAX, best_c = 0;
    *pending = 0;
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        struct slot_hdr *s = slot_at(r, i);
        uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
        uint32_t st = ctl_state(c);
        if (st == ST_WRITING) { *pending = 1; continue; }
        if (st != ST_READY) continue;
        uint64_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
        if (strict ? q != want : (r->n_ranks > 1 && q % r->n_ranks != r->rank)) continue;
        if (best == UINT32_MAX || q < best_seq) { best_seq = q; best = i; best_c = c; }
        if (strict) break;
    }
    *seq_out = best_seq;
    *ctl_out = best_c;
    return best;
}

/* 1 if a slot holding a seq below `seq` (of this consumer's rank) is READING under a dead owner. Several consumers
 * of one ring (target replicas) must not run past such an item before recovery gives it back: the producers
 * downstream keep slots only for what live consumers hold, so seqs taken past a dead consumer's item fill the next
 * ring while the item waits (a 200 ms recovery period is long enough to fill any ring). Checked at every claim;
 * the owner test (a /proc read) runs only for READING slots of lower seq. */
static int lower_held_by_dead(const struct ring *r, uint64_t seq) {
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        struct slot_hdr *s = slot_at(r, i);
        uint64_t c = atomic_load_explicit(&s->ctl, memory_order_acquire);
        if (ctl_state(c) != ST_READING || (uint32_t)ctl_pid(c) == r->my_pid) continue;
        uint64_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
        if (q >= seq || (r->n_ranks > 1 && q % r->n_ranks != r->rank)) continue;
        if (!owner_alive(c)) return 1;
    }
    return 0;
}

/* Claim one item. Returns 1 with *slot claimed; else 0 and *pending = whether some slot is
 * WRITING (something may still become ours); -1 with a sentence if the claimed slot's lengths
 * exceed the capacities read at attach (a corrupt segment: the slot is put back READY). */
static int try_read(struct ring *r, int strict, uint64_t want, struct ring_slot *slot, int *pending) {
    struct ring_header *h = r->h;
    for (;;) {
        uint64_t seq1, c1;
        uint32_t best = scan_lowest(r, strict, want, &seq1, &c1, pending);
        if (best == UINT32_MAX) return 0;
        if (!strict && lower_held_by_dead(r, seq1)) {
            ring_recover(r);   /* the dead consumer's lower seq is READY again: the next scan delivers it */
            continue;
        }
        if (!strict) {
            /* One scan is not a snapshot: it may have passed slot A before seq k was published
             * there and then seen seq k+1 READY in slot B. Everything published before B is
             * visible after our acquire load of B, so a second scan that finds the same lowest
             * item proves no earlier-published lower seq was missed. */
            uint64_t seq2, c2;
            uint32_t again = scan_lowest(r, strict, want, &seq2, &c2, pending);
            if (again != best || c2 != c1) continue;
        }
        struct slot_hdr *s = slot_at(r, best);
        uint64_t nc = ctl_next(c1, ST_READING, r->my_pid, r->my_startlo);
        if (!atomic_compare_exchange_strong_explicit(&s->ctl, &c1, nc, memory_order_acq_rel, memory_order_relaxed))
            continue;   /* another consumer took it, or it changed: scan again */
        fill_slot(r, best, nc, slot);
        slot->seq = atomic_load_explicit(&s->seq, memory_order_relaxed);
        if (strict && slot->seq != want) {   /* recycled between our load and CAS: put it back */
            atomic_store_explicit(&s->ctl, ctl_next(nc, ST_READY, 0, 0), memory_order_release);
            wake_all(&h->ev_ready, &h->waiters_ready);
            continue;
        }
        slot->desc_len = atomic_load_explicit(&s->desc_len, memory_order_relaxed);
        slot->payload_len = atomic_load_explicit(&s->payload_len, memory_order_relaxed);
        if (slot->desc_len > r->spec.desc_bytes || slot->payload_len > r->spec.payload_bytes) {
            uint32_t dl = slot->desc_len;
            uint64_t pl = slot->payload_len;
            atomic_store_explicit(&s->ctl, ctl_next(nc, ST_READY, 0, 0), memory_order_release);
            wake_all(&h->ev_ready, &h->waiters_ready);
            memset(slot, 0, sizeof *slot);
            return fail("ring '%s' (segment %s): slot %u seq %llu has desc_len %u and payload_len %llu, but the capacities are "
                        "%u and %llu bytes: the segment is corrupt (restart the run)", r->spec.name, r->segment, best,
                        (unsigned long long)seq1, dl, (unsigned long long)pl, r->spec.desc_bytes,
                        (unsigned long long)r->spec.payload_bytes);
        }
        slot->deliveries = atomic_fetch_add_explicit(&s->deliveries, 1, memory_order_relaxed) + 1;
        return 1;
    }
}

static int acquire_read(struct ring *r, int strict, uint64_t want, int timeout_ms, struct ring_slot *slot) {
    struct ring_header *h = r->h;
    if (r->role != RING_CONSUMER) return fail("reading ring '%s': not attached as a consumer", r->spec.name);
    double deadline = now_s() + (timeout_ms > 0 ? timeout_ms / 1000.0 : 0);
    for (;;) {
        uint32_t seen = atomic_load(&h->ev_ready);
        if (atomic_load(&h->closed)) return RING_END;
        /* Drained is read before the scan: an item published before the producer drained is
         * then seen by the scan, so RING_END never skips one. */
        int drained = drained_now(h);
        int pending = 0;
        int got = try_read(r, strict, want, slot, &pending);
        if (got < 0) return -1;
        if (got) return 0;
        /* Before ending, give back items a dead consumer still held: they are ours to finish. */
        if (drained && !pending && ring_recover(r) == 0) return RING_END;
        if (drained && !pending) continue;
        double left = deadline - now_s();
        if (left <= 0) return RING_TIMEOUT;
        wait_housekeeping(r);
        if (r->replaced) return fail_replaced(r);
        wait_on(&h->ev_ready, &h->waiters_ready, seen, left);
    }
}

int ring_acquire_read(struct ring *r, int timeout_ms, struct ring_slot *slot) {
    return acquire_read(r, 0, 0, timeout_ms, slot);
}

int ring_acquire_read_seq(struct ring *r, uint64_t seq, int timeout_ms, struct ring_slot *slot) {
    return acquire_read(r, 1, seq, timeout_ms, slot);
}

int ring_release(struct ring *r, struct ring_slot *slot) {
    if (own_transition(r, slot, ST_READING, ST_FREE, "ring_release") != 0) return -1;
    atomic_fetch_add_explicit(&r->h->consumed, 1, memory_order_relaxed);
    wake_all(&r->h->ev_free, &r->h->waiters_free);
    return 0;
}

int ring_unread(struct ring *r, struct ring_slot *slot) {
    if (own_transition(r, slot, ST_READING, ST_READY, "ring_unread") != 0) return -1;
    wake_all(&r->h->ev_ready, &r->h->waiters_ready);
    return 0;
}

/* ---------------------------------------------------------------- status */

void ring_get_status(const struct ring *r, struct ring_status *st) {
    struct ring_header *h = r->h;
    memset(st, 0, sizeof *st);
    memcpy(st->name, r->spec.name, RING_NAME_MAX);
    snprintf(st->segment, sizeof st->segment, "%s", r->segment);
    st->n_slots = r->spec.n_slots;
    st->desc_bytes = r->spec.desc_bytes;
    st->n_producers = r->spec.n_producers;
    st->payload_bytes = r->spec.payload_bytes;
    st->device = r->spec.device;
    st->closed = (int)atomic_load(&h->closed);
    st->drained = drained_now(h);
    st->owner_pid = h->owner_pid;
    st->owner_alive = ring_pid_alive(h->owner_pid, h->owner_start);
    st->lowest_ready_seq = UINT64_MAX;
    for (uint32_t i = 0; i < r->spec.n_slots; i++) {
        struct slot_hdr *s = slot_at(r, i);
        uint64_t c = atomic_load(&s->ctl);
        switch (ctl_state(c)) {
        case ST_FREE: st->n_free++; break;
        case ST_WRITING: st->n_writing++; break;
        case ST_READING: st->n_reading++; break;
        default: {
            st->n_ready++;
            uint64_t q = atomic_load(&s->seq);
            if (q < st->lowest_ready_seq) st->lowest_ready_seq = q;
        }
        }
    }
    st->published = atomic_load(&h->published);
    st->consumed = atomic_load(&h->consumed);
    st->redelivered = atomic_load(&h->redelivered);
    st->recovered_writes = atomic_load(&h->recovered_writes);
    for (int i = 0; i < RING_MAX_ATTACH; i++) {
        uint64_t w = atomic_load(&h->attach[i]);
        if (at_state(w) == AT_EMPTY) continue;
        struct ring_attached *a = &st->attached[st->n_attached++];
        a->pid = ctl_pid(w);
        a->role = (int)at_role(w);
        a->drained = at_state(w) == AT_DRAINED;
        a->alive = owner_alive(w);
    }
}

/* ---------------------------------------------------------------- stale segments */

/* Fill *info from an open segment: owner uid/mode, creator, live attached stages. */
static void peek_segment(int fd, struct ring_segment_info *info) {
    struct stat sb;
    if (fstat(fd, &sb) != 0) return;
    info->uid = (unsigned)sb.st_uid;
    info->mode = (unsigned)(sb.st_mode & 07777);
    info->ours = sb.st_uid == geteuid() && info->mode == 0600;
    info->bytes = (uint64_t)sb.st_size;
    if ((uint64_t)sb.st_size < HEADER_BYTES) return;
    struct ring_header *h = mmap(NULL, HEADER_BYTES, PROT_READ, MAP_SHARED, fd, 0);
    if (h == MAP_FAILED) return;
    if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == RING_MAGIC) {
        info->has_header = 1;
        info->owner_pid = h->owner_pid;
        info->owner_alive = info->owner_pid > 0 && ring_pid_alive(info->owner_pid, h->owner_start);
        for (int i = 0; i < RING_MAX_ATTACH; i++) {
            uint64_t w = atomic_load(&h->attach[i]);
            if (at_state(w) == AT_ACTIVE && owner_alive(w)) info->n_live_attached++;
        }
    }
    munmap(h, HEADER_BYTES);
}

int ring_scan_segments(const char *prefix, void (*fn)(void *ctx, const struct ring_segment_info *info), void *ctx,
                       char *err, int err_len) {
    DIR *d = opendir("/dev/shm");
    if (!d) { set_err(err, err_len, "opendir(/dev/shm) failed: %s", strerror(errno)); return -1; }
    const char *want = prefix ? prefix : "dflash.";
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "dflash.", 7) != 0 || strncmp(e->d_name, want, strlen(want)) != 0) continue;
        struct ring_segment_info info;
        memset(&info, 0, sizeof info);
        snprintf(info.segment, sizeof info.segment, "%s", e->d_name);
        char seg[300];
        snprintf(seg, sizeof seg, "/%s", e->d_name);
        int fd = shm_open(seg, O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
        if (fd >= 0) { peek_segment(fd, &info); close(fd); }
        else {   /* another user's 0600 segment cannot be opened: its owner and mode from the directory entry */
            char path[300];
            struct stat sb;
            snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
            if (lstat(path, &sb) == 0) {
                info.uid = (unsigned)sb.st_uid;
                info.mode = (unsigned)(sb.st_mode & 07777);
                info.bytes = (uint64_t)sb.st_size;
            }
        }
        fn(ctx, &info);
        n++;
    }
    closedir(d);
    return n;
}

/* ---------------------------------------------------------------- spec text */

static int parse_size(const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno || end == v || v[0] == '-') return -1;
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ull << 30, end++;
    if (*end == 'B' || *end == 'b') end++;
    if (*end) return -1;
    if (x > UINT64_MAX / mul) return -1;
    *out = x * mul;
    return 0;
}

int ring_parse_specs(const char *text, struct ring_spec *specs, int max_specs, int *n_specs, char *err, int err_len) {
    char buf[1024];
    if (!text || strlen(text) >= sizeof buf) { set_err(err, err_len, "ring spec is empty or longer than %zu characters", sizeof buf - 1); return -1; }
    snprintf(buf, sizeof buf, "%s", text);
    struct ring_spec *cur = NULL;
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':'), *eq = strchr(item, '=');
        if (colon && (!eq || colon < eq)) {   /* NAME:... starts a ring */
            if (*n_specs >= max_specs) { set_err(err, err_len, "too many rings (at most %d)", max_specs); return -1; }
            *colon = 0;
            if (check_name(item, err, err_len) != 0) return -1;
            for (int i = 0; i < *n_specs; i++)
                if (!strcmp(specs[i].name, item)) { set_err(err, err_len, "ring '%s' is given twice", item); return -1; }
            cur = &specs[(*n_specs)++];
            memset(cur, 0, sizeof *cur);
            snprintf(cur->name, sizeof cur->name, "%s", item);
            cur->n_slots = 8;
            cur->payload_bytes = 1u << 20;
            cur->desc_bytes = 4096;
            cur->device = -1;
            item = colon + 1;
            eq = strchr(item, '=');
            if (!*item) continue;   /* "name:" alone takes the defaults */
        }
        if (!cur) { set_err(err, err_len, "ring spec '%s' must start with NAME: (e.g. batches:slots=8,bytes=1M)", item); return -1; }
        if (!eq) { set_err(err, err_len, "ring '%s': expected key=value, got '%s'", cur->name, item); return -1; }
        *eq = 0;
        const char *k = item, *v = eq + 1;
        uint64_t x;
        if (!strcmp(k, "slots") || !strcmp(k, "producers")) {
            if (parse_size(v, &x) != 0 || x > (1u << 20) || (!strcmp(k, "slots") && x == 0)) {
                set_err(err, err_len, "ring '%s': %s=%s is not a count in 1..%u", cur->name, k, v, 1u << 20);
                return -1;
            }
            if (!strcmp(k, "slots")) cur->n_slots = (uint32_t)x; else cur->n_producers = (uint32_t)x;
        } else if (!strcmp(k, "bytes")) {
            if (parse_size(v, &x) != 0) { set_err(err, err_len, "ring '%s': bytes=%s is not a size (e.g. 64M)", cur->name, v); return -1; }
            cur->payload_bytes = x;
        } else if (!strcmp(k, "desc")) {
            if (parse_size(v, &x) != 0 || x == 0 || x > (64u << 20)) { set_err(err, err_len, "ring '%s': desc=%s is not a size in 1..64M", cur->name, v); return -1; }
            cur->desc_bytes = (uint32_t)x;
        } else if (!strcmp(k, "dev")) {
            if (!strcmp(v, "host") || !strcmp(v, "cpu")) cur->device = -1;
            else {
                const char *num = !strncmp(v, "cuda:", 5) ? v + 5 : v;
                if (parse_size(num, &x) != 0 || x > 1024 || !isdigit((unsigned char)num[strlen(num) - 1])) {
                    set_err(err, err_len, "ring '%s': dev=%s, expected host, cpu or cuda:N", cur->name, v);
                    return -1;
                }
                cur->device = (int)x;
            }
        } else if (!strcmp(k, "plan")) {
            char *end;
            errno = 0;
            unsigned long long h = strtoull(v, &end, 16);
            if (errno || end == v || *end || v[0] == '-' || strlen(v) > 16) {
                set_err(err, err_len, "ring '%s': plan=%s is not a plan hash (up to 16 hex digits)", cur->name, v);
                return -1;
            }
            cur->plan = (uint64_t)h;
        } else {
            set_err(err, err_len, "ring '%s': unknown key '%s' (known: slots, bytes, desc, dev, producers, plan)", cur->name, k);
            return -1;
        }
    }
    if (!cur) { set_err(err, err_len, "ring spec '%s' names no ring", text); return -1; }
    return 0;
}

const char *ring_format_bytes(uint64_t bytes, char *out, size_t out_len) {
    const char *u[] = {"", "k", "M", "G", "T"};
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    if (i == 0) snprintf(out, out_len, "%llu", (unsigned long long)bytes);
    else if (v == (double)(uint64_t)v) snprintf(out, out_len, "%llu%s", (unsigned long long)v, u[i]);
    else snprintf(out, out_len, "%.1f%s", v, u[i]);
    return out;
}
