/*
 * stages/core/bus.c — the metrics bus: msgpack encoding, non-blocking NN_PUSH sends with drop
 * counting, and the validating decoder (bus.h has the wire format).
 *
 * Why a structural pre-scan before msgpack-c: msgpack_unpack_next allocates a container's element
 * array from the count in its header before reading the elements, so five hostile bytes
 * ("dd ff ff ff ff") would ask for 64 GiB. bus_scan walks the bytes first and rejects any count
 * that cannot fit in what is left, any truncation, trailing bytes or nesting deeper than
 * SCAN_DEPTH_MAX; only then does msgpack-c build the object tree, in O(len) memory.
 *
 * Invariant: seq counts every attempted record of a bus (sent or dropped), dropped counts the
 * dropped ones; both only grow, under the bus mutex.
 */
#include "core/mpk.h"
#include "core/bus.h"
#include "core/err.h"
#include "core/fsutil.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <msgpack.h>
#include <nanomsg/nn.h>
#include <nanomsg/pipeline.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#define SCAN_DEPTH_MAX 8
#define MAX_FIELDS (BUS_MAX_KV + 12)

static const char *const reserved_keys[] = {"v", "kind", "stage", "pid", "t", "seq", "step",
                                            "dropped", "name", "text", "wait_on"};
static const char *const kind_names[] = {"metric", "event", "heartbeat", "summary"};

struct bus {
    int sock;
    pthread_mutex_t mu;
    char stage[BUS_NAME_MAX];
    int64_t pid;
    uint64_t seq;       /* atomically readable */
    uint64_t dropped;   /* atomically readable */
    char wait_on[BUS_TEXT_MAX];
    msgpack_sbuffer sb; /* reused for every record */
    double last_accept; /* time_mono_s of the last accepted send, 0 if none */
};

/* How long bus_close waits after the last accepted send before closing the socket. nanomsg
 * keeps no linger: when a sender closes, the sink's side of the connection is torn down as soon
 * as it sees the hang-up, and a record still waiting there to be nn_recv'd is lost with it. */
#define BUS_LINGER_S 0.05

/* How long bus_open waits for the connection to a sink whose socket file exists. */
#define BUS_OPEN_WAIT_MS 100

const char *bus_kind_name(enum bus_kind kind) {
    return (unsigned)kind < 4 ? kind_names[kind] : "?";
}

static int is_reserved(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof reserved_keys / sizeof reserved_keys[0]; i++)
        if (strlen(reserved_keys[i]) == len && !memcmp(reserved_keys[i], name, len)) return 1;
    return 0;
}

/* ---------------------------------------------------------------- encoding */

struct hdr {
    int version;
    enum bus_kind kind;
    const char *stage;
    int64_t pid;
    double t;
    int has_step, has_seq, has_wait_on;
    uint64_t step, seq, dropped;
    const char *name, *text, *wait_on;
};

static int check_names(const struct hdr *h, const struct bus_kv *kv, int n, char *err, int err_len) {
    size_t sl = h->stage ? strlen(h->stage) : 0;
    if (sl == 0 || sl >= BUS_NAME_MAX) return err_fail(err, err_len, "stage name must be 1..%d bytes, got %zu", BUS_NAME_MAX - 1, sl);
    if ((unsigned)h->kind > BUS_KIND_SUMMARY) return err_fail(err, err_len, "unknown record kind %d", (int)h->kind);
    if (n < 0 || n > BUS_MAX_KV) return err_fail(err, err_len, "%d named numbers (must be 0..%d)", n, BUS_MAX_KV);
    if (n > 0 && !kv) return err_fail(err, err_len, "named numbers pointer is NULL with n=%d", n);
    if (h->kind == BUS_KIND_EVENT) {
        size_t nl = h->name ? strlen(h->name) : 0;
        if (nl == 0 || nl >= BUS_NAME_MAX) return err_fail(err, err_len, "event name must be 1..%d bytes, got %zu", BUS_NAME_MAX - 1, nl);
        if (!h->text) return err_fail(err, err_len, "event '%s' has no text", h->name);
    }
    for (int i = 0; i < n; i++) {
        size_t l = kv[i].name ? strlen(kv[i].name) : 0;
        if (l == 0 || l >= BUS_NAME_MAX) return err_fail(err, err_len, "metric name #%d must be 1..%d bytes, got %zu", i, BUS_NAME_MAX - 1, l);
        if (is_reserved(kv[i].name, l)) return err_fail(err, err_len, "metric name '%s' is a reserved record field", kv[i].name);
        for (int j = 0; j < i; j++)
            if (!strcmp(kv[i].name, kv[j].name)) return err_fail(err, err_len, "metric name '%s' appears twice", kv[i].name);
    }
    return 0;
}

static void pack_cstr(msgpack_packer *pk, const char *s, size_t max) {
    size_t l = strnlen(s, max);
    msgpack_pack_str_with_body(pk, s, l);
}

/* Pack one record into sb (cleared first). Names must have passed check_names. msgpack_sbuffer
 * only fails on allocation, which we report. */
static int pack_record(msgpack_sbuffer *sb, const struct hdr *h, const struct bus_kv *kv, int n,
                       char *err, int err_len) {
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    size_t fields = 6 + (size_t)(h->has_step != 0) + (size_t)(h->has_seq != 0) + (size_t)n;
    if (h->kind == BUS_KIND_EVENT) fields += 2;
    if (h->kind == BUS_KIND_HEARTBEAT && h->has_wait_on) fields += 1;
    int rc = 0;
    rc |= msgpack_pack_map(&pk, fields);
    rc |= msgpack_pack_str_with_body(&pk, "v", 1);
    rc |= msgpack_pack_uint64(&pk, (uint64_t)(h->version < 0 ? 0 : h->version));
    rc |= msgpack_pack_str_with_body(&pk, "kind", 4);
    rc |= msgpack_pack_str_with_body(&pk, kind_names[h->kind], strlen(kind_names[h->kind]));
    rc |= msgpack_pack_str_with_body(&pk, "stage", 5);
    pack_cstr(&pk, h->stage, BUS_NAME_MAX - 1);
    rc |= msgpack_pack_str_with_body(&pk, "pid", 3);
    rc |= msgpack_pack_uint64(&pk, (uint64_t)h->pid);
    rc |= msgpack_pack_str_with_body(&pk, "t", 1);
    rc |= msgpack_pack_double(&pk, h->t);
    if (h->has_seq) {
        rc |= msgpack_pack_str_with_body(&pk, "seq", 3);
        rc |= msgpack_pack_uint64(&pk, h->seq);
    }
    if (h->has_step) {
        rc |= msgpack_pack_str_with_body(&pk, "step", 4);
        rc |= msgpack_pack_uint64(&pk, h->step);
    }
    rc |= msgpack_pack_str_with_body(&pk, "dropped", 7);
    rc |= msgpack_pack_uint64(&pk, h->dropped);
    if (h->kind == BUS_KIND_EVENT) {
        rc |= msgpack_pack_str_with_body(&pk, "name", 4);
        pack_cstr(&pk, h->name, BUS_NAME_MAX - 1);
        rc |= msgpack_pack_str_with_body(&pk, "text", 4);
        pack_cstr(&pk, h->text, BUS_TEXT_MAX - 1);
    }
    if (h->kind == BUS_KIND_HEARTBEAT && h->has_wait_on) {
        rc |= msgpack_pack_str_with_body(&pk, "wait_on", 7);
        pack_cstr(&pk, h->wait_on ? h->wait_on : "", BUS_TEXT_MAX - 1);
    }
    for (int i = 0; i < n; i++) {
        rc |= msgpack_pack_str_with_body(&pk, kv[i].name, strlen(kv[i].name));
        rc |= msgpack_pack_double(&pk, kv[i].value);
    }
    if (rc) return err_fail(err, err_len, "msgpack packing failed (out of memory)");
    return 0;
}

int bus_encode(const struct bus_record *rec, void **out, size_t *len, char *err, int err_len) {
    if (!rec || !out || !len) return err_fail(err, err_len, "bus_encode: NULL argument");
    if (rec->n_kv < 0 || rec->n_kv > BUS_MAX_KV) return err_fail(err, err_len, "%d named numbers (must be 0..%d)", rec->n_kv, BUS_MAX_KV);
    struct bus_kv kv[BUS_MAX_KV];
    for (int i = 0; i < rec->n_kv; i++) { kv[i].name = rec->kv[i].name; kv[i].value = rec->kv[i].value; }
    struct hdr h = {
        .version = rec->version, .kind = rec->kind, .stage = rec->stage, .pid = rec->pid, .t = rec->t,
        .has_step = rec->has_step, .has_seq = rec->has_seq, .has_wait_on = rec->has_wait_on,
        .step = rec->step, .seq = rec->seq, .dropped = rec->dropped,
        .name = rec->name, .text = rec->text, .wait_on = rec->wait_on,
    };
    if (check_names(&h, kv, rec->n_kv, err, err_len)) return -1;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    if (pack_record(&sb, &h, kv, rec->n_kv, err, err_len)) { msgpack_sbuffer_destroy(&sb); return -1; }
    *len = sb.size;
    *out = msgpack_sbuffer_release(&sb);
    msgpack_sbuffer_destroy(&sb);
    return 0;
}

/* ---------------------------------------------------------------- the socket */

int bus_address(const char *run_dir, char *out, size_t out_len, char *err, int err_len) {
    if (!run_dir || !*run_dir) return err_fail(err, err_len, "bus: run directory is empty");
    char cwd[PATH_MAX] = "";
    if (run_dir[0] != '/' && !getcwd(cwd, sizeof cwd))
        return err_fail(err, err_len, "bus: getcwd failed: %s", strerror(errno));
    int n = snprintf(out, out_len, "ipc://%s%s%s/%s", cwd, *cwd ? "/" : "", run_dir, BUS_METRICS_SOCK);
    if (n < 0 || (size_t)n >= out_len) return err_fail(err, err_len, "bus: socket address for run dir '%s' is too long", run_dir);
    struct sockaddr_un un;
    size_t path_len = (size_t)n - 6;
    if (path_len >= sizeof un.sun_path)
        return err_fail(err, err_len, "bus: socket path is %zu bytes, AF_UNIX allows %zu (hint: use a shorter run directory path): %s",
                    path_len, sizeof un.sun_path - 1, out + 6);
    return 0;
}

struct bus *bus_open(const char *run_dir, const char *stage, char *err, int err_len) {
    size_t sl = stage ? strlen(stage) : 0;
    if (sl == 0 || sl >= BUS_NAME_MAX) {
        err_fail(err, err_len, "bus_open: stage name must be 1..%d bytes, got %zu", BUS_NAME_MAX - 1, sl);
        return NULL;
    }
    char addr[PATH_MAX + 64];
    if (bus_address(run_dir, addr, sizeof addr, err, err_len)) return NULL;
    struct bus *b = calloc(1, sizeof *b);
    if (!b) { err_fail(err, err_len, "bus_open: out of memory"); return NULL; }
    memcpy(b->stage, stage, sl + 1);
    b->pid = getpid();
    msgpack_sbuffer_init(&b->sb);
    pthread_mutex_init(&b->mu, NULL);
    b->sock = nn_socket(AF_SP, NN_PUSH);
    if (b->sock < 0) {
        err_fail(err, err_len, "bus_open: nn_socket(AF_SP, NN_PUSH) failed: %s", nn_strerror(nn_errno()));
        goto fail;
    }
    /* nn_connect only records the endpoint; the connection is made (and remade every 100 ms
     * after the sink goes away) by nanomsg's worker thread, so this works with no sink. */
    if (nn_connect(b->sock, addr) < 0) {
        err_fail(err, err_len, "bus_open: nn_connect(%s) failed: %s", addr, nn_strerror(nn_errno()));
        nn_close(b->sock);
        goto fail;
    }
    /* When a sink is up, the connection is made within a few ms: wait for it, bounded and at open
     * only, so a stage's first record is not dropped merely because it was sent too early. */
    if (access(addr + strlen("ipc://"), F_OK) == 0) {
        int fd;
        size_t sz = sizeof fd;
        if (nn_getsockopt(b->sock, NN_SOL_SOCKET, NN_SNDFD, &fd, &sz) == 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            (void)poll(&p, 1, BUS_OPEN_WAIT_MS);   /* a timeout only means the first records may drop */
        }
    }
    return b;
fail:
    pthread_mutex_destroy(&b->mu);
    msgpack_sbuffer_destroy(&b->sb);
    free(b);
    return NULL;
}

void bus_close(struct bus *b) {
    if (!b) return;
    if (b->last_accept > 0) {
        double left = BUS_LINGER_S - (time_mono_s() - b->last_accept);
        if (left > 0) usleep((useconds_t)(left * 1e6));
    }
    nn_close(b->sock);
    pthread_mutex_destroy(&b->mu);
    msgpack_sbuffer_destroy(&b->sb);
    free(b);
}

uint64_t bus_dropped(const struct bus *b) { return b ? __atomic_load_n(&b->dropped, __ATOMIC_RELAXED) : 0; }
uint64_t bus_sent(const struct bus *b) { return b ? __atomic_load_n(&b->seq, __ATOMIC_RELAXED) : 0; }

void bus_set_waiting(struct bus *b, const char *what) {
    if (!b) return;
    pthread_mutex_lock(&b->mu);
    snprintf(b->wait_on, sizeof b->wait_on, "%s", what ? what : "");
    pthread_mutex_unlock(&b->mu);
}

static int bus_send(struct bus *b, enum bus_kind kind, int64_t step, const char *name, const char *text,
                    const struct bus_kv *kv, int n, char *err, int err_len) {
    if (!b) return err_fail(err, err_len, "bus_%s: the bus is NULL", bus_kind_name(kind));
    pthread_mutex_lock(&b->mu);
    struct hdr h = {
        .version = BUS_VERSION, .kind = kind, .stage = b->stage, .pid = b->pid, .t = time_wall_s(),
        .has_step = kind == BUS_KIND_METRIC, .step = (uint64_t)(step < 0 ? 0 : step),
        .has_seq = 1, .seq = b->seq, .dropped = b->dropped,
        .name = name, .text = text,
        .has_wait_on = kind == BUS_KIND_HEARTBEAT, .wait_on = b->wait_on,
    };
    int rc = -1;
    if (kind == BUS_KIND_METRIC && step < 0) {
        err_fail(err, err_len, "bus_metric: step %lld is negative", (long long)step);
    } else if (!check_names(&h, kv, n, err, err_len) && !pack_record(&b->sb, &h, kv, n, err, err_len)) {
        /* Never block: EAGAIN (no sink connected, or its queue full) and any other send failure
         * is a drop, counted and carried in later records. */
        int sent = nn_send(b->sock, b->sb.data, b->sb.size, NN_DONTWAIT);
        __atomic_store_n(&b->seq, b->seq + 1, __ATOMIC_RELAXED);
        if (sent < 0) __atomic_store_n(&b->dropped, b->dropped + 1, __ATOMIC_RELAXED);
        else b->last_accept = time_mono_s();
        rc = sent < 0 ? 0 : 1;
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

int bus_metric(struct bus *b, int64_t step, const struct bus_kv *kv, int n, char *err, int err_len) {
    return bus_send(b, BUS_KIND_METRIC, step, NULL, NULL, kv, n, err, err_len);
}
int bus_event(struct bus *b, const char *name, const char *text, char *err, int err_len) {
    return bus_send(b, BUS_KIND_EVENT, 0, name, text, NULL, 0, err, err_len);
}
int bus_heartbeat(struct bus *b, const struct bus_kv *kv, int n, char *err, int err_len) {
    return bus_send(b, BUS_KIND_HEARTBEAT, 0, NULL, NULL, kv, n, err, err_len);
}
int bus_summary(struct bus *b, const struct bus_kv *kv, int n, char *err, int err_len) {
    return bus_send(b, BUS_KIND_SUMMARY, 0, NULL, NULL, kv, n, err, err_len);
}

double bus_record_get(const struct bus_record *rec, const char *name, double dflt) {
    for (int i = 0; i < rec->n_kv; i++)
        if (!strcmp(rec->kv[i].name, name)) return rec->kv[i].value;
    return dflt;
}

/* ---------------------------------------------------------------- decoding */

static uint64_t be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* Walk one msgpack object at p[*off..len). Returns 0 and advances *off, or -1 with a reason. */
static int bus_scan(const uint8_t *p, size_t len, size_t *off, int depth, char *err, int err_len) {
    if (depth > SCAN_DEPTH_MAX) return err_fail(err, err_len, "malformed record: nesting deeper than %d", SCAN_DEPTH_MAX);
    if (*off >= len) return err_fail(err, err_len, "malformed record: truncated at byte %zu of %zu", *off, len);
    uint8_t b = p[(*off)++];
    size_t left = len - *off;
    uint64_t skip = 0, count = 0;   /* raw bytes to skip, or child objects to walk */
    int hdr = 0;                    /* bytes of length field */
#define NEED(nb) do { if (left < (size_t)(nb)) return err_fail(err, err_len, "malformed record: truncated at byte %zu of %zu", *off, len); } while (0)
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return 0;
    if (b >= 0x80 && b <= 0x8f) count = 2ull * (b & 0x0f);
    else if (b >= 0x90 && b <= 0x9f) count = b & 0x0f;
    else if (b >= 0xa0 && b <= 0xbf) skip = b & 0x1f;
    else switch (b) {
        case 0xc1: return err_fail(err, err_len, "malformed record: byte 0xc1 at offset %zu is never used in msgpack", *off - 1);
        case 0xc4: case 0xd9: hdr = 1; break;
        case 0xc5: case 0xda: hdr = 2; break;
        case 0xc6: case 0xdb: hdr = 4; break;
        case 0xc7: NEED(2); skip = 1 + be(p + *off, 1); *off += 1; left -= 1; break;
        case 0xc8: NEED(3); skip = 1 + be(p + *off, 2); *off += 2; left -= 2; break;
        case 0xc9: NEED(5); skip = 1 + be(p + *off, 4); *off += 4; left -= 4; break;
        case 0xca: skip = 4; break;
        case 0xcb: skip = 8; break;
        case 0xcc: case 0xd0: skip = 1; break;
        case 0xcd: case 0xd1: skip = 2; break;
        case 0xce: case 0xd2: skip = 4; break;
        case 0xcf: case 0xd3: skip = 8; break;
        case 0xd4: skip = 2; break;
        case 0xd5: skip = 3; break;
        case 0xd6: skip = 5; break;
        case 0xd7: skip = 9; break;
        case 0xd8: skip = 17; break;
        case 0xdc: NEED(2); count = be(p + *off, 2); *off += 2; left -= 2; break;
        case 0xdd: NEED(4); count = be(p + *off, 4); *off += 4; left -= 4; break;
        case 0xde: NEED(2); count = 2 * be(p + *off, 2); *off += 2; left -= 2; break;
        case 0xdf: NEED(4); count = 2 * be(p + *off, 4); *off += 4; left -= 4; break;
        default: return err_fail(err, err_len, "malformed record: unexpected byte 0x%02x", b);
    }
    if (hdr) { NEED(hdr); skip = be(p + *off, hdr); *off += (size_t)hdr; left -= (size_t)hdr; }
    if (skip) { NEED(skip); *off += skip; return 0; }
    /* Every child object takes at least one byte: a count larger than what is left is a lie. */
    if (count > left) return err_fail(err, err_len, "malformed record: truncated or corrupt: a container claims %llu elements but only %zu bytes remain",
                                  (unsigned long long)count, left);
    for (uint64_t i = 0; i < count; i++)
        if (bus_scan(p, len, off, depth + 1, err, err_len)) return -1;
    return 0;
#undef NEED
}

static int get_uint(const msgpack_object *o, const char *key, uint64_t *out, char *err, int err_len) {
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return err_fail(err, err_len, "field '%s' must be a non-negative integer, found %s", key, mpk_type_name(o->type));
    *out = o->via.u64;
    return 0;
}

static int get_str(const msgpack_object *o, const char *key, char *out, size_t cap, size_t min_len,
                   char *err, int err_len) {
    if (o->type != MSGPACK_OBJECT_STR) return err_fail(err, err_len, "field '%s' must be a string, found %s", key, mpk_type_name(o->type));
    size_t l = o->via.str.size;
    if (l < min_len || l >= cap) return err_fail(err, err_len, "field '%s' must be %zu..%zu bytes, found %zu", key, min_len, cap - 1, l);
    if (memchr(o->via.str.ptr, 0, l)) return err_fail(err, err_len, "field '%s' contains a NUL byte", key);
    memcpy(out, o->via.str.ptr, l);
    out[l] = 0;
    return 0;
}

static int decode_map(const msgpack_object *root, struct bus_record *out, char *err, int err_len) {
    if (root->type != MSGPACK_OBJECT_MAP) return err_fail(err, err_len, "record must be a msgpack map, found %s", mpk_type_name(root->type));
    const msgpack_object_map *m = &root->via.map;
    if (m->size > MAX_FIELDS) return err_fail(err, err_len, "record has %u fields, at most %d allowed", m->size, MAX_FIELDS);

    /* Pass 1: keys are unique non-empty strings; find v and kind first, since a record of another
     * version or kind may legitimately carry fields we would otherwise reject. */
    const msgpack_object *v = NULL, *kind = NULL;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object *k = &m->ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR) return err_fail(err, err_len, "field key #%u must be a string, found %s", i, mpk_type_name(k->type));
        if (k->via.str.size == 0 || k->via.str.size >= BUS_NAME_MAX)
            return err_fail(err, err_len, "field key #%u must be 1..%d bytes, found %u", i, BUS_NAME_MAX - 1, k->via.str.size);
        if (memchr(k->via.str.ptr, 0, k->via.str.size)) return err_fail(err, err_len, "field key #%u contains a NUL byte", i);
        for (uint32_t j = 0; j < i; j++)
            if (m->ptr[j].key.via.str.size == k->via.str.size && !memcmp(m->ptr[j].key.via.str.ptr, k->via.str.ptr, k->via.str.size))
                return err_fail(err, err_len, "field '%.*s' appears twice", (int)k->via.str.size, k->via.str.ptr);
        if (mpk_str_is(&k->via.str, "v")) v = &m->ptr[i].val;
        if (mpk_str_is(&k->via.str, "kind")) kind = &m->ptr[i].val;
    }
    if (!v) return err_fail(err, err_len, "record has no schema version field 'v'");
    uint64_t ver = 0;
    if (get_uint(v, "v", &ver, err, err_len)) return -1;
    if (ver != BUS_VERSION) {
        err_fail(err, err_len, "record schema version %llu is not supported (expected %d)", (unsigned long long)ver, BUS_VERSION);
        return BUS_EVERSION;
    }
    out->version = (int)ver;
    if (!kind) return err_fail(err, err_len, "record has no 'kind' field");
    char kind_s[BUS_NAME_MAX];
    if (get_str(kind, "kind", kind_s, sizeof kind_s, 1, err, err_len)) return -1;
    int k = -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(kind_s, kind_names[i])) k = i;
    if (k < 0) {
        err_fail(err, err_len, "unknown record kind '%s' (expected metric, event, heartbeat or summary)", kind_s);
        return BUS_EKIND;
    }
    out->kind = (enum bus_kind)k;

    /* Pass 2: every other field by name and type. */
    int have_stage = 0, have_pid = 0, have_t = 0, have_name = 0, have_text = 0;
    for (uint32_t i = 0; i < m->size; i++) {
        const msgpack_object_str *key = &m->ptr[i].key.via.str;
        const msgpack_object *val = &m->ptr[i].val;
        char kname[BUS_NAME_MAX];
        memcpy(kname, key->ptr, key->size);
        kname[key->size] = 0;
        uint64_t u = 0;
        if (!strcmp(kname, "v") || !strcmp(kname, "kind")) continue;
        if (!strcmp(kname, "stage")) {
            if (get_str(val, kname, out->stage, sizeof out->stage, 1, err, err_len)) return -1;
            have_stage = 1;
        } else if (!strcmp(kname, "pid")) {
            if (get_uint(val, kname, &u, err, err_len)) return -1;
            if (u == 0 || u > INT32_MAX) return err_fail(err, err_len, "field 'pid' must be 1..%d, found %llu", INT32_MAX, (unsigned long long)u);
            out->pid = (int64_t)u;
            have_pid = 1;
        } else if (!strcmp(kname, "t")) {
            if (val->type != MSGPACK_OBJECT_FLOAT64 && val->type != MSGPACK_OBJECT_FLOAT32)
                return err_fail(err, err_len, "field 't' must be a float (unix seconds), found %s", mpk_type_name(val->type));
            if (!isfinite(val->via.f64)) return err_fail(err, err_len, "field 't' is not finite");
            out->t = val->via.f64;
            have_t = 1;
        } else if (!strcmp(kname, "seq")) {
            if (get_uint(val, kname, &out->seq, err, err_len)) return -1;
            out->has_seq = 1;
        } else if (!strcmp(kname, "step")) {
            if (get_uint(val, kname, &out->step, err, err_len)) return -1;
            out->has_step = 1;
        } else if (!strcmp(kname, "dropped")) {
            if (get_uint(val, kname, &out->dropped, err, err_len)) return -1;
        } else if (!strcmp(kname, "name") || !strcmp(kname, "text")) {
            if (out->kind != BUS_KIND_EVENT) return err_fail(err, err_len, "field '%s' is only allowed in event records, found in a %s record", kname, kind_s);
            if (kname[0] == 'n') {
                if (get_str(val, kname, out->name, sizeof out->name, 1, err, err_len)) return -1;
                have_name = 1;
            } else {
                if (get_str(val, kname, out->text, sizeof out->text, 0, err, err_len)) return -1;
                have_text = 1;
            }
        } else if (!strcmp(kname, "wait_on")) {
            if (out->kind != BUS_KIND_HEARTBEAT) return err_fail(err, err_len, "field 'wait_on' is only allowed in heartbeat records, found in a %s record", kind_s);
            if (get_str(val, kname, out->wait_on, sizeof out->wait_on, 0, err, err_len)) return -1;
            out->has_wait_on = 1;
        } else {
            double d;
            if (val->type == MSGPACK_OBJECT_FLOAT64 || val->type == MSGPACK_OBJECT_FLOAT32) d = val->via.f64;
            else if (val->type == MSGPACK_OBJECT_POSITIVE_INTEGER) d = (double)val->via.u64;
            else if (val->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) d = (double)val->via.i64;
            else return err_fail(err, err_len, "field '%s' must be a number, found %s", kname, mpk_type_name(val->type));
            if (out->n_kv >= BUS_MAX_KV) return err_fail(err, err_len, "record has more than %d named numbers", BUS_MAX_KV);
            memcpy(out->kv[out->n_kv].name, kname, key->size + 1);
            out->kv[out->n_kv].value = d;
            out->n_kv++;
        }
    }
    if (!have_stage) return err_fail(err, err_len, "%s record has no 'stage' field", kind_s);
    if (!have_pid) return err_fail(err, err_len, "%s record has no 'pid' field", kind_s);
    if (!have_t) return err_fail(err, err_len, "%s record has no 't' field", kind_s);
    if (out->kind == BUS_KIND_METRIC && !out->has_step) return err_fail(err, err_len, "metric record has no 'step' field");
    if (out->kind != BUS_KIND_METRIC && !out->has_seq) return err_fail(err, err_len, "%s record has no 'seq' field", kind_s);
    if (out->kind == BUS_KIND_EVENT && (!have_name || !have_text))
        return err_fail(err, err_len, "event record needs both 'name' and 'text'");
    return 0;
}

int bus_decode(const void *buf, size_t len, struct bus_record *out, char *err, int err_len) {
    if (!buf || !out) return err_fail(err, err_len, "bus_decode: NULL argument");
    memset(out, 0, sizeof *out);
    if (len == 0) return err_fail(err, err_len, "malformed record: empty message");
    if (len > BUS_MSG_MAX) return err_fail(err, err_len, "malformed record: %zu bytes, at most %d allowed", len, BUS_MSG_MAX);
    size_t off = 0;
    if (bus_scan(buf, len, &off, 0, err, err_len)) return BUS_EMALFORMED;
    if (off != len) return err_fail(err, err_len, "malformed record: %zu trailing bytes after the map", len - off);

    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t used = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&up, buf, len, &used);
    int rc;
    if (r != MSGPACK_UNPACK_SUCCESS || used != len) rc = err_fail(err, err_len, "malformed record: msgpack-c could not unpack it (code %d)", (int)r);
    else rc = decode_map(&up.data, out, err, err_len);
    msgpack_unpacked_destroy(&up);
    return rc;
}
