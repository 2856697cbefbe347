/*
 * stages/dflash-memplan.c — print the device-memory plan of the whole training job on one GPU
 * (model/jobplan.h: target, trainer, rings, reserve; per stage and in total) and refuse, with one
 * line naming the shortfall and the flags to change, a job that cannot fit. pipelines/train.sh
 * runs it before any stage starts when the device is a GPU (issue 27 item 3), so an over-large
 * configuration stops at start-up, never as an OOM mid-run.
 *
 *   dflash-memplan --model DIR [--tokens 8192] [--layers 5] [--draft-layers 5] [--max-anchors 512]
 *                  [--block-size 16] [--draft-vocab-size 0] [--slots 4] [--device cuda:0 | --gpu-gb 141]
 * Exit 0 when the plan fits, 1 (and the one line on stderr) when it does not.
 */
#include "core/check.h"
#include "core/flags.h"
#include "core/log.h"
#include "model/hfconfig.h"
#include "model/jobplan.h"

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    log_init("dflash-memplan");
    const char *model = NULL, *device = "cuda:0";
    int tokens = 8192, layers = 5, draft_layers = 5, anchors = 512, block = 16, vd = 0, slots = 4, accum = 1;
    double gpu_gb = 0;
    struct flag table[] = {
        {"model", FLAG_STRING, &model, "target checkpoint directory (its config.json)", 1, 0},
        {"tokens", FLAG_INT, &tokens, "token budget of a batch (--tokens of every stage)", 1, 1 << 24},
        {"layers", FLAG_INT, &layers, "captured target layers k", 1, 64},
        {"draft-layers", FLAG_INT, &draft_layers, "drafter layers", 1, 64},
        {"max-anchors", FLAG_INT, &anchors, "dflash-train --max-anchors", 1, 1 << 20},
        {"block-size", FLAG_INT, &block, "dflash-train --block-size", 1, 1024},
        {"draft-vocab-size", FLAG_INT, &vd, "draft vocabulary size (0: the target's)", 0, 1 << 30},
        {"grad-accum", FLAG_INT, &accum, "dflash-train --grad-accum (reuses the gradient buffers)", 1, 1 << 20},
        {"slots", FLAG_INT, &slots, "slots of the hidden and features rings", 1, 1024},
        {"device", FLAG_STRING, &device, "the GPU whose total memory is the capacity (cuda:N)", 1, 0},
        {"gpu-gb", FLAG_DOUBLE, &gpu_gb, "capacity in GB instead of asking the device (0: ask)", 0, 100000},
        FLAGS_END,
    };
    flags_parse_or_exit(table, argc, argv, "--model DIR [flags]",
                        "Print the one-GPU memory plan of the training job and refuse one that cannot fit.", NULL, 0);
    if (!model) DIE("--model is required");
    char err[1024];
    struct model_config c;
    LIB_CHECK(hf_config_load(&c, model, err, sizeof err), err);
    size_t cap = (size_t)(gpu_gb * 1e9);
    if (cap == 0) {
#ifdef DFLASH_CUDA
        int dev = 0;
        if (sscanf(device, "cuda:%d", &dev) != 1) DIE("--device '%s' is not cuda:N (or give --gpu-gb)", device);
        size_t fr = 0, tot = 0;
        CUDA_CHECK(cudaSetDevice(dev));
        CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
        cap = tot;
#else
        DIE("this build has no CUDA: give --gpu-gb");
#endif
    }
    struct jobplan_inputs in = {&c, tokens, layers, draft_layers, 0, 0, 0, 0, anchors, block, vd, accum, slots, cap};
    struct jobplan p;
    LIB_CHECK(jobplan_compute(&in, &p, err, sizeof err), err);
    jobplan_print(&p, stdout);
    fflush(stdout);
    if (jobplan_check(&p, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}
