/*
 * stages/dflash-plan.c — writes a run's plan, RUN/plan.json (stages/plan/plan.h; issue 25).
 *
 *   dflash-plan MODEL DATA --run RUN [--device D] [--tokens N] [--layers IDS] [--steps N] [--epochs N]
 *               [--grad-accum A] [--layer-types T] [--block-size B] [--seed S] [--window W] [-- TRAIN FLAGS]
 *   dflash-plan --run RUN --rehash        accept a hand edit (recompute the hash)
 *   dflash-plan --run RUN --get KEY       print one value (for scripts)
 *   dflash-plan --run RUN/hosts/H --from RUN --host H   host H's plan of a several-host run (issue 29)
 *
 * Flags after `--` are dflash-train's; the geometry among them (--layer-types, --block-size,
 * --grad-accum, --target-layer-ids in the z-lab convention, --max-steps, --tokens) is taken into
 * the plan as if given before `--`, the rest is ignored here (the trainer reads it). Exit 0, 1 on
 * a bad input (one line naming it), 2 on a bad command line.
 *
 * When the target or the trainer runs on a GPU, the job's device-memory plan (stages/model/jobplan.h: target,
 * trainer, rings, a reserve per process; the trainer's --max-anchors and --draft-vocab read from the flags after
 * `--`) is printed and checked before the plan is written: a job that cannot fit is refused here, before any stage
 * starts, with one line naming the shortfall and the flags that shrink it (issue 27). The capacity is --gpu-gb, or
 * the device's total memory (cudaMemGetInfo) in a CUDA build on a machine with that GPU; otherwise the plan is
 * printed and a line says it was not checked.
 */
#include "core/flags.h"
#include "core/fsutil.h"
#include "core/log.h"
#include "core/stage.h"
#include "model/hfconfig.h"
#include "model/jobplan.h"
#include "plan/plan.h"
#include "train/vocab.h"

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const DESCRIPTION =
    "Writes RUN/plan.json, the run's geometry that every stage started with --run RUN reads (a flag given to a stage "
    "may repeat a plan value, never contradict it; a run without plan.json runs on flags alone). Keys: "
    "kind (\"dflash-plan\"), version (1), hash (FNV-1a 64 of the rest, 16 hex digits; goes into every ring header, "
    "so a stage that read another plan is refused), model (absolute target dir; dflash-target --model, dflash-train "
    "--target-model), data (absolute dataset path; dflash-pack --data), device (cpu | cuda:N; --device of target and "
    "hspack, and the GPU rings' device), train_device (dflash-train --device; default: device), tokens (packed batch budget; --tokens of pack, target, hspack, train), target.layers and "
    "target.hidden_size (from config.json; hspack --hidden-size), capture.convention (zlab: output of decoder layer "
    "i) and capture.layer_ids (dflash-target --layers, dflash-train --target-layer-ids, hspack --n-layers = their "
    "count; default: the z-lab formula for the drafter's layer count, plan_default_layer_ids in "
    "stages/plan/plan.c), dtype (bf16 on a GPU, f32 on the CPU path; hspack --dtype), drafter.layer_types and "
    "drafter.block_size (dflash-train --layer-types, --block-size), seed and window (dflash-pack --seed, --window), "
    "epochs (the passes the steps were counted from), steps (dflash-train --max-steps; default: the packed batches "
    "of --epochs epochs / --grad-accum, rounded up), grad_accum (dflash-train --grad-accum: the step's total over all trainer ranks), batches (steps x "
    "grad_accum; dflash-pack --max-batches), target_replicas (only when > 1: dflash-target processes sharing the "
    "rings; pipelines/train.sh starts that many; the hidden ring gets producers=R and R-1 more slots), rings (the dflash-shm --ring specs; dflash-shm --run RUN with no --ring "
    "creates them), ranks (only when > 1: dflash-train ranks; their world must equal it; grad_accum must divide by "
    "it), hosts (only when > 1: a several-host run, topology (c); ranks must divide by it; rank r lives on host "
    "r / (ranks / hosts)), host (only in host H's plan RUN/hosts/H/plan.json, written by --from RUN --host H: the "
    "packer there publishes only the seqs s with s % ranks in [H·L, (H+1)·L), L = ranks / hosts, and hspack expects "
    "exactly those; not in the hash). After editing the file by hand run dflash-plan --run RUN --rehash.";

/* The value of --NAME in args[0..n) (`--NAME v` or `--NAME=v`), or NULL. */
static const char *scan(char **args, int n, const char *name) {
    size_t len = strlen(name);
    const char *v = NULL;
    for (int i = 0; i < n; i++) {
        const char *a = args[i];
        if (strncmp(a, "--", 2) || strncmp(a + 2, name, len)) continue;
        if (a[2 + len] == '=') v = a + 3 + len;
        else if (!a[2 + len] && i + 1 < n) v = args[i + 1];
    }
    return v;
}

static int parse_ids(const char *s, int *ids, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > 4096 || *n >= DESC_MAX_LAYERS) return -1;
        ids[(*n)++] = (int)x;
        s = end;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return *n ? 0 : -1;
}

static int print_key(const struct plan *p, const char *key) {
    char buf[1024];
    if (!strcmp(key, "tokens")) printf("%u\n", p->tokens);
    else if (!strcmp(key, "steps")) printf("%lld\n", (long long)p->steps);
    else if (!strcmp(key, "batches")) printf("%lld\n", (long long)p->batches);
    else if (!strcmp(key, "grad_accum")) printf("%d\n", p->grad_accum);
    else if (!strcmp(key, "target_replicas")) printf("%d\n", p->target_replicas);
    else if (!strcmp(key, "ranks")) printf("%d\n", p->ranks);
    else if (!strcmp(key, "hosts")) printf("%d\n", p->hosts);
    else if (!strcmp(key, "host")) printf("%d\n", p->host);
    else if (!strcmp(key, "device")) printf("%s\n", p->device);
    else if (!strcmp(key, "train_device")) printf("%s\n", p->train_device);
    else if (!strcmp(key, "model")) printf("%s\n", p->model);
    else if (!strcmp(key, "data")) printf("%s\n", p->data);
    else if (!strcmp(key, "hash")) printf("%016llx\n", (unsigned long long)p->hash);
    else if (!strcmp(key, "layer_ids")) printf("%s\n", plan_format_ids(p->ids, p->n_ids, buf, sizeof buf));
    else if (!strcmp(key, "hidden_size")) printf("%d\n", p->hidden_size);
    else if (!strcmp(key, "dtype")) printf("%s\n", desc_dtype_name(p->dtype));
    else {
        fprintf(stderr, "dflash-plan: --get %s: unknown key (tokens, steps, batches, grad_accum, target_replicas, ranks, hosts, host, device, train_device, model, data, "
                "hash, layer_ids, hidden_size, dtype)\n", key);
        return 2;
    }
    return 0;
}

/* --device / --train-device: as every stage parses them, except that with --gpu-gb a cuda:N this machine does not
 * have is planned for (a login node planning for the GPU machine). */
static int parse_device(const char *s, double gpu_gb, int *dev, char *err, int err_len) {
    int n, len = 0;
    if (gpu_gb > 0 && s && sscanf(s, "cuda:%d%n", &n, &len) == 1 && !s[len] && n >= 0) {
        *dev = n;
        return 0;
    }
    return stage_parse_device(s, dev, err, err_len);
}

/* The total memory of CUDA device dev in bytes, or 0 when this build or machine cannot tell. */
static size_t gpu_capacity(int dev) {
#ifdef DFLASH_CUDA
    size_t fr = 0, tot = 0;
    if (cudaSetDevice(dev) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
    return tot;
#else
    (void)dev;
    return 0;
#endif
}

/* The job's device-memory plan when a stage runs on a GPU (see the top). 0: fits, or nothing to check;
 * 1: refused (one line on stderr). */
static int check_memory(const struct plan *p, char **train, int n_train, double gpu_gb) {
    int dev = -1, tdev = -1;
    char err[1024];
    if (sscanf(p->device, "cuda:%d", &dev) != 1) dev = -1;   /* the plan's devices are "cpu" or "cuda:N" */
    if (sscanf(p->train_device, "cuda:%d", &tdev) != 1) tdev = -1;
    if (dev < 0 && tdev < 0) return 0;
    struct model_config c;
    if (hf_config_load(&c, p->model, err, sizeof err)) { fprintf(stderr, "dflash-plan: %s\n", err); return 1; }
    int anchors = 512, vd = 0;
    const char *a = scan(train, n_train, "max-anchors"), *v = scan(train, n_train, "draft-vocab");
    if (a) {
        char *end;
        long x = strtol(a, &end, 10);
        if (end == a || *end || x < 1) { fprintf(stderr, "dflash-plan: -- --max-anchors %s: expected a positive integer\n", a); return 1; }
        anchors = (int)x;
    }
    if (v) {
        char path[PATH_MAX + 16];
        int64_t *d2t = NULL, n = 0;
        snprintf(path, sizeof path, "%s/d2t.npy", v);
        if (vocab_npy_read_i64(path, &d2t, &n, err, sizeof err)) { fprintf(stderr, "dflash-plan: -- --draft-vocab: %s\n", err); return 1; }
        free(d2t);
        vd = (int)n;
    }
    size_t cap = gpu_gb > 0 ? (size_t)(gpu_gb * 1e9) : gpu_capacity(dev >= 0 ? dev : tdev);
    struct jobplan_inputs in = {&c, (int)p->tokens, p->n_ids, p->draft_layers, 0, 0, 0, 0, anchors, p->block_size, vd,
                                p->grad_accum, 4, cap ? cap : (size_t)1 << 62};
    for (int r = 0; r < p->n_rings; r++) {   /* the hidden and features rings' slots, from the plan's specs */
        const char *sl = strstr(p->rings[r], "slots=");
        if (sl && (!strncmp(p->rings[r], "hidden:", 7) || !strncmp(p->rings[r], "features:", 9))) in.ring_slots = atoi(sl + 6);
    }
    struct jobplan jp;
    if (jobplan_compute(&in, &jp, err, sizeof err)) { fprintf(stderr, "dflash-plan: memory plan: %s\n", err); return 1; }
    if (dev >= 0 && tdev >= 0 && dev != tdev) {
        /* target and trainer on two GPUs: each side's share, the rings and a reserve counted on both */
        size_t a_bytes = jp.target_bytes + jp.ring_bytes + 2 * JOBPLAN_RESERVE_BYTES,
               b_bytes = jp.trainer_bytes + jp.ring_bytes + JOBPLAN_RESERVE_BYTES;
        printf("memory plan: target cuda:%d %.1f GB, trainer cuda:%d %.1f GB (rings and a reserve counted on both)\n",
               dev, a_bytes / 1e9, tdev, b_bytes / 1e9);
        size_t cap_b = gpu_gb > 0 ? cap : gpu_capacity(tdev);
        if (!cap || !cap_b) { printf("memory plan: not checked (no capacity: this machine cannot tell; pass --gpu-gb)\n"); return 0; }
        if (a_bytes > cap || b_bytes > cap_b) {
            fflush(stdout);
            fprintf(stderr, "dflash-plan: memory plan: the %s needs %.1f GB on a GPU of %.1f GB; lower --tokens, "
                    "-- --max-anchors, or use -- --draft-vocab\n", a_bytes > cap ? "target" : "trainer",
                    (a_bytes > cap ? a_bytes : b_bytes) / 1e9, (a_bytes > cap ? cap : cap_b) / 1e9);
            return 1;
        }
        return 0;
    }
    if (dev < 0 || tdev < 0) {   /* one GPU stage: only its share is on the GPU */
        size_t need = (dev >= 0 ? jp.target_bytes + jp.ring_bytes : jp.trainer_bytes) + 2 * JOBPLAN_RESERVE_BYTES;
        printf("memory plan: the %s on cuda:%d needs %.1f GB\n", dev >= 0 ? "target" : "trainer", dev >= 0 ? dev : tdev,
               need / 1e9);
        if (!cap) { printf("memory plan: not checked (no capacity: this machine cannot tell; pass --gpu-gb)\n"); return 0; }
        if (need > cap) {
            fflush(stdout);
            fprintf(stderr, "dflash-plan: memory plan: the %s needs %.1f GB on a GPU of %.1f GB; lower --tokens%s\n",
                    dev >= 0 ? "target" : "trainer", need / 1e9, cap / 1e9,
                    dev >= 0 ? "" : ", -- --max-anchors, or use -- --draft-vocab");
            return 1;
        }
        return 0;
    }
    jobplan_print(&jp, stdout);
    if (!cap) { printf("memory plan: not checked (no capacity: this machine cannot tell; pass --gpu-gb)\n"); return 0; }
    fflush(stdout);   /* the plan, then the refusal as the last line */
    if (jobplan_check(&jp, err, sizeof err)) { fprintf(stderr, "dflash-plan: %s\n", err); return 1; }
    return 0;
}

int main(int argc, char **argv) {
    log_init("dflash-plan");
    /* split at "--": ours before, dflash-train's after */
    int own = argc;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--")) { own = i; break; }
    char **train = argv + (own < argc ? own + 1 : argc);
    int n_train = own < argc ? argc - own - 1 : 0;

    const char *run = NULL, *device = "auto", *train_device = NULL, *layer_types = NULL, *get = NULL, *from = NULL;
    int tokens = 0, epochs = 0, grad_accum = 0, block_size = 0, window = 0, slots = 0, rehash = 0, replicas = 0;
    int ranks = 0, hosts = 0, host = -1;
    int64_t steps = 0, seed = -1;
    double gpu_gb = 0;
    int ids[DESC_MAX_LAYERS], n_ids = 0;
    struct flag_list ids_list = {ids, &n_ids, DESC_MAX_LAYERS, NULL};
    struct flag table[] = {
        {"run", FLAG_STRING, &run, "run directory: the plan is written to RUN/plan.json", 1, 0},
        {"device", FLAG_STRING, &device, "cpu, cuda:N, or auto (cuda:0 when a GPU is present): the target's, "
         "hspack's and the GPU rings' device", 1, 0},
        {"train-device", FLAG_STRING, &train_device, "the trainer's device (default: --device; a GPU trainer with "
         "--device cpu reads the CPU target's fp32 features from host rings)", 1, 0},
        {"tokens", FLAG_INT, &tokens, "packed batch budget (0: 8192)", 0, 1 << 24},
        {"layers", FLAG_LIST, &ids_list, "captured target layer ids, z-lab convention (default: the z-lab formula for "
         "the drafter's layer count)", 0, 4096},
        {"layer-types", FLAG_STRING, &layer_types, "the drafter's layer types, e.g. sliding,full (the count is the "
         "layer count; default: dflash-train's)", 1, 0},
        {"block-size", FLAG_INT, &block_size, "the drafter's block size (0: dflash-train's default)", 0, 4096},
        {"steps", FLAG_INT64, &steps, "optimizer steps (0: the packed batches of --epochs epochs / --grad-accum)", 0,
         INT64_MAX},
        {"epochs", FLAG_INT, &epochs, "dataset passes --steps is counted from (0: 1)", 0, INT32_MAX},
        {"grad-accum", FLAG_INT, &grad_accum, "packed batches per optimizer step (0: 1)", 0, 1 << 20},
        {"target-replicas", FLAG_INT, &replicas, "dflash-target processes sharing the batches and hidden rings "
                                                 "(plan key target_replicas; 0: 1)", 0, PLAN_MAX_TARGET_REPLICAS},
        {"ranks", FLAG_INT, &ranks, "dflash-train ranks (plan key ranks; 0: 1); --grad-accum must divide by it", 0,
         1 << 20},
        {"hosts", FLAG_INT, &hosts, "hosts of a several-host run (plan key hosts; 0: 1); --ranks must divide by it; "
         "each host runs its chain from its host plan (--from --host)", 0, PLAN_MAX_HOSTS},
        {"from", FLAG_STRING, &from, "with --host H: write host H's plan into --run from the plan of the run FROM "
         "(RUN/hosts/H is host H's run directory, pipelines/slurm-train.sh)", 1, 0},
        {"host", FLAG_INT, &host, "with --from: the host index (0..hosts-1)", -1, PLAN_MAX_HOSTS - 1},
        {"seed", FLAG_INT64, &seed, "the packer's shuffle seed (-1: 1)", -1, INT64_MAX},
        {"window", FLAG_INT, &window, "the packer's window (0: 4096)", 0, 1 << 24},
        {"ring-slots", FLAG_INT, &slots, "slots per ring (0: 4)", 0, 1 << 16},
        {"gpu-gb", FLAG_DOUBLE, &gpu_gb, "GPU memory in GB the job's memory plan is checked against (0: the device's "
         "own); with it, a --device cuda:N this machine lacks is planned for", 0, 100000},
        {"rehash", FLAG_BOOL, &rehash, "read RUN/plan.json as edited, check it and write it back with its new hash", 1, 0},
        {"get", FLAG_STRING, &get, "print one value of RUN/plan.json and exit", 1, 0},
        FLAGS_END,
    };
    char *pos[2];
    int np = flags_parse_or_exit(table, own, argv, "MODEL DATA --run RUN [flags] [-- dflash-train flags]", DESCRIPTION,
                                 pos, 2);
    if (!run) { fprintf(stderr, "dflash-plan: --run RUN is required (see --help)\n"); return 2; }
    char path[PATH_MAX], err[2048];
    if (snprintf(path, sizeof path, "%s/%s", run, PLAN_FILE) >= (int)sizeof path) { fprintf(stderr, "dflash-plan: --run path too long\n"); return 2; }
    struct plan p;
    if ((from != NULL) != (host >= 0)) { fprintf(stderr, "dflash-plan: --from RUN and --host H go together\n"); return 2; }
    if (from) {   /* host H's plan: the run's plan (same hash) with host = H */
        char fpath[PATH_MAX];
        struct plan shared;
        if (snprintf(fpath, sizeof fpath, "%s/%s", from, PLAN_FILE) >= (int)sizeof fpath) { fprintf(stderr, "dflash-plan: --from path too long\n"); return 2; }
        if (plan_read(fpath, 1, &shared, err, sizeof err) || plan_for_host(&shared, host, &p, err, sizeof err) ||
            fs_mkdir_p(run, err, sizeof err) || plan_write(&p, path, err, sizeof err)) {
            fprintf(stderr, "dflash-plan: %s\n", err);
            return 1;
        }
        printf("%s: host %d of %d (ranks %d..%d of %d), hash %016llx\n", path, host, p.hosts, host * (p.ranks / p.hosts),
               (host + 1) * (p.ranks / p.hosts) - 1, p.ranks, (unsigned long long)p.hash);
        return 0;
    }
    if (get || rehash) {
        if (plan_read(path, !rehash, &p, err, sizeof err)) { fprintf(stderr, "dflash-plan: %s\n", err); return 1; }
        if (get) return print_key(&p, get);
        if (plan_write(&p, path, err, sizeof err)) { fprintf(stderr, "dflash-plan: %s\n", err); return 1; }
        printf("%s: hash %016llx\n", path, (unsigned long long)p.hash);
        return 0;
    }
    if (np != 2) { fprintf(stderr, "dflash-plan: give MODEL and DATA (see --help)\n"); return 2; }

    /* the geometry among dflash-train's flags: the same value may be given both ways, never two values */
    struct { const char *name; int *i; int64_t *l; const char **s; } geo[] = {
        {"layer-types", NULL, NULL, &layer_types}, {"block-size", &block_size, NULL, NULL},
        {"grad-accum", &grad_accum, NULL, NULL},   {"max-steps", NULL, &steps, NULL},
        {"tokens", &tokens, NULL, NULL},           {"target-layer-ids", NULL, NULL, NULL},
    };
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
        const char *v = scan(train, n_train, geo[g].name);
        if (!v) continue;
        if (!strcmp(geo[g].name, "target-layer-ids")) {
            const char *conv = scan(train, n_train, "layer-ids-convention");
            int t[DESC_MAX_LAYERS], nt;
            if (parse_ids(v, t, &nt)) { fprintf(stderr, "dflash-plan: -- --target-layer-ids %s: expected ids like 1,9,17\n", v); return 2; }
            if (conv && strcmp(conv, "zlab")) for (int i = 0; i < nt; i++) t[i] -= 1;   /* speculators = zlab + 1 */
            if (n_ids && (n_ids != nt || memcmp(ids, t, (size_t)nt * sizeof *t))) {
                fprintf(stderr, "dflash-plan: --layers and the trainer's --target-layer-ids %s disagree\n", v);
                return 2;
            }
            memcpy(ids, t, (size_t)nt * sizeof *t);
            n_ids = nt;
            continue;
        }
        if (geo[g].s) {
            if (*geo[g].s && strcmp(*geo[g].s, v)) { fprintf(stderr, "dflash-plan: --%s %s and the trainer's --%s %s disagree\n", geo[g].name, *geo[g].s, geo[g].name, v); return 2; }
            *geo[g].s = v;
            continue;
        }
        char *end;
        long long x = strtoll(v, &end, 10);
        if (end == v || *end || x < 1) { fprintf(stderr, "dflash-plan: -- --%s %s: expected a positive integer\n", geo[g].name, v); return 2; }
        long long have = geo[g].i ? *geo[g].i : *geo[g].l;
        if (have && have != x) { fprintf(stderr, "dflash-plan: --%s %lld and the trainer's --%s %lld disagree\n", geo[g].name, have, geo[g].name, x); return 2; }
        if (geo[g].i) *geo[g].i = (int)x; else *geo[g].l = x;
    }

    int cuda = -1;
    if (parse_device(device, gpu_gb, &cuda, err, sizeof err)) { fprintf(stderr, "dflash-plan: --device: %s\n", err); return 2; }
    char dev[32], tdev[32];
    if (cuda < 0) snprintf(dev, sizeof dev, "cpu");
    else snprintf(dev, sizeof dev, "cuda:%d", cuda);
    snprintf(tdev, sizeof tdev, "%s", dev);
    if (train_device) {
        int tc = -1;
        if (parse_device(train_device, gpu_gb, &tc, err, sizeof err)) { fprintf(stderr, "dflash-plan: --train-device: %s\n", err); return 2; }
        if (tc < 0) snprintf(tdev, sizeof tdev, "cpu");
        else snprintf(tdev, sizeof tdev, "cuda:%d", tc);
    }
    struct plan_inputs in = {.model = pos[0], .data = pos[1], .device = dev, .train_device = tdev, .tokens = tokens, .n_ids = n_ids,
                             .layer_types = layer_types, .block_size = block_size, .steps = steps, .epochs = epochs,
                             .grad_accum = grad_accum, .seed = seed, .window = window, .ring_slots = slots,
                             .target_replicas = replicas, .ranks = ranks, .hosts = hosts};
    memcpy(in.ids, ids, sizeof ids);
    if (plan_make(&in, &p, err, sizeof err)) { fprintf(stderr, "dflash-plan: %s\n", err); return 1; }
    if (check_memory(&p, train, n_train, gpu_gb)) return 1;
    if (fs_mkdir_p(run, err, sizeof err)) { fprintf(stderr, "dflash-plan: %s\n", err); return 1; }
    struct plan old;
    int had = plan_read(path, 1, &old, err, sizeof err) == 0;
    if (had && old.hash == p.hash && old.host == p.host) {
        printf("%s: unchanged (hash %016llx): %lld steps x %d = %lld batches of %u tokens\n", path,
               (unsigned long long)p.hash, (long long)p.steps, p.grad_accum, (long long)p.batches, p.tokens);
        return 0;
    }
    if (plan_write(&p, path, err, sizeof err)) { fprintf(stderr, "dflash-plan: %s\n", err); return 1; }
    char idl[512];
    printf("%s: hash %016llx%s: %s, %lld steps x %d = %lld batches of %u tokens, layers [%s] of %d, H %d, %s, "
           "%d-layer drafter\n", path, (unsigned long long)p.hash, had ? " (replaces an older plan)" : "", p.device,
           (long long)p.steps, p.grad_accum, (long long)p.batches, p.tokens, plan_format_ids(p.ids, p.n_ids, idl, sizeof idl),
           p.target_layers, p.hidden_size, desc_dtype_name(p.dtype), p.draft_layers);
    return 0;
}
