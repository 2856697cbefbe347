/*
 * bench/decode_bench.c — tokens/s of KV-cached batched greedy decoding on the GPU (stages/model/decode.h), the
 * loop dflash-sample --device cuda:N runs (issue 30 item 2), on a Qwen3-8B-shaped model (hidden 4096, 36 layers,
 * 32 / 8 heads of 128, MLP 12288, vocab 151936) with random bf16 weights made on the GPU (no 16 GB file).
 *
 *   build: make build/bench/decode_bench      run: build/bench/decode_bench [--batch 16] [--prompt 512]
 *          [--gen 256] [--layers 36]
 *
 * What is timed: the prefill of --batch prompts of --prompt random tokens (one decode_extend per prompt, as
 * eval_generate does), then --gen steps of one token per sequence: decode_extend over --batch rows, decode_logits
 * of those rows (final norm + LM head on the device, (batch, V) fp32 to the host) and the host argmax, on odd steps;
 * decode_argmax (the pick on the device, only the ids to the host) on even steps. Printed:
 * prefill tokens/s, decode tokens/s (batch / median step), and the median split of a step into forward, logits and
 * argmax. Napkin math: a decode step reads every weight once (16.4 GB bf16 incl. the LM head; ~3.4 ms at the
 * H200's 4.8 TB/s) plus the KV cache (batch · len · 36 · 2 · 8 · 128 · 2 B = 2.4 GB at batch 16, len 1024), so
 * ~4 ms per step is the memory floor: ~4000 tokens/s at batch 16. Compare with a serving engine on the same
 * shape (e.g. vLLM, Qwen3-8B bf16, --max-num-seqs 16, random 512-token prompts, 256 output tokens: its output
 * throughput).
 */
#include "core/fsutil.h"
#include "export/eval.h"
#include "kernels/common.h"
#include "model/decode.h"
#include "model/target.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DFLASH_CUDA
#include <cuda_runtime_api.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int batch = 16, prompt = 512, gen = 256, layers = 36;
    for (int i = 1; i < argc; i++) {
        int *dst = !strcmp(argv[i], "--batch") ? &batch : !strcmp(argv[i], "--prompt") ? &prompt
                 : !strcmp(argv[i], "--gen") ? &gen : !strcmp(argv[i], "--layers") ? &layers : NULL;
        if (!dst || i + 1 >= argc || (*dst = atoi(argv[++i])) < 1) {
            fprintf(stderr, "usage: %s [--batch 16] [--prompt 512] [--gen 256] [--layers 36]\n", argv[0]);
            return 2;
        }
    }
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) { printf("decode_bench: no CUDA device, skipped\n"); return 0; }
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.arch = HF_ARCH_QWEN3;
    snprintf(c.architecture, sizeof c.architecture, "Qwen3ForCausalLM");
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    c.vocab_size = 151936; c.hidden_size = 4096; c.intermediate_size = 12288; c.num_hidden_layers = layers;
    c.num_attention_heads = 32; c.num_key_value_heads = 8; c.head_dim = 128; c.qk_norm = 1;
    c.rms_norm_eps = 1e-6; c.rope_theta = 1e6; c.rope_type = HF_ROPE_DEFAULT; c.max_position_embeddings = 40960;
    c.dtype = ST_BF16;
    struct target_options opt;
    target_options_defaults(&opt);
    opt.cuda_device = 0;
    opt.max_tokens = 16;   /* the full forward is not used here */
    opt.n_capture = 1;
    opt.capture[0] = 1;
    char err[1024];
    double t0 = time_mono_s();
    struct target *t = target_init_random(&c, &opt, 1234, 0.02f, err, sizeof err);
    if (!t) { fprintf(stderr, "decode_bench: %s\n", err); return 1; }
    int C = c.hidden_size, V = c.vocab_size, max_len = prompt + gen + 1;
    int step_rows = batch > prompt ? batch : prompt;
    struct decode *d = decode_init(t, batch, max_len, step_rows, err, sizeof err);
    if (!d) { fprintf(stderr, "decode_bench: %s\n", err); return 1; }
    float *norm = malloc(sizeof(float) * (size_t)C), *head = malloc(sizeof(float) * (size_t)V * C);
    float *logits = NULL;   /* pinned, as eval_target_enable_cache plans it on a GPU */
    if (cudaMallocHost((void **)&logits, sizeof(float) * (size_t)batch * V) != cudaSuccess) logits = NULL;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)step_rows), *rows = malloc(sizeof(int32_t) * (size_t)batch);
    int *slots = malloc(sizeof(int) * (size_t)batch);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    double *st = malloc(sizeof(double) * (size_t)gen * 3), *sorted = malloc(sizeof(double) * (size_t)gen);
    if (!norm || !head || !logits || !ids || !rows || !slots || !cu || !st || !sorted) { fprintf(stderr, "decode_bench: out of memory\n"); return 1; }
    uint64_t rng = 99;
    for (int i = 0; i < C; i++) norm[i] = 1.0f;
    for (size_t i = 0; i < (size_t)V * C; i++)
        head[i] = 0.02f * (float)((double)(kernels_rng_next(&rng) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    if (decode_set_head(d, norm, head, batch, err, sizeof err)) { fprintf(stderr, "decode_bench: %s\n", err); return 1; }
    printf("model: Qwen3-8B shape, %d layers, random bf16 weights %.2f GB; decode plan: %d slots x %d tokens, "
           "%.2f GB on the device (KV cache %.2f GB); init %.1f s\n", layers, target_weight_bytes(t) / 1e9, batch,
           max_len, decode_device_bytes(d) / 1e9, decode_cache_bytes(d) / 1e9, time_mono_s() - t0);
    /* prefill */
    double p0 = time_mono_s();
    for (int s = 0; s < batch; s++) {
        for (int i = 0; i < prompt; i++) ids[i] = (int32_t)(kernels_rng_next(&rng) % (uint64_t)V);
        int32_t c2[2] = {0, prompt}, last = prompt - 1;
        if (decode_extend(d, 1, &s, ids, c2, NULL, NULL, err, sizeof err) ||
            decode_logits(d, 1, &last, logits + (size_t)s * V, err, sizeof err)) {
            fprintf(stderr, "decode_bench: prefill: %s\n", err);
            return 1;
        }
    }
    double prefill_s = time_mono_s() - p0;
    for (int s = 0; s < batch; s++) {
        slots[s] = s;
        rows[s] = s;
        cu[s] = s;
    }
    cu[batch] = batch;
    for (int s = 0; s < batch; s++) {   /* the first token of each sequence from its prefill's logits */
        const float *lg = logits + (size_t)s * V;
        ids[s] = eval_argmax(lg, V);
    }
    /* even steps: the pick on the device (decode_argmax, what eval_generate's greedy steps call); odd steps: the
     * logits to the host and eval_argmax there (the sampled path's transfer); both pick the same ids */
    int32_t *dev_ids = malloc(sizeof(int32_t) * (size_t)batch);
    if (!dev_ids) { fprintf(stderr, "decode_bench: out of memory\n"); return 1; }
    for (int g = 0; g < gen; g++) {
        double a = time_mono_s();
        if (decode_extend(d, batch, slots, ids, cu, NULL, NULL, err, sizeof err)) { fprintf(stderr, "decode_bench: %s\n", err); return 1; }
        double b = time_mono_s(), e, f;
        if (g % 2 == 0) {
            if (decode_argmax(d, batch, rows, ids, err, sizeof err)) { fprintf(stderr, "decode_bench: %s\n", err); return 1; }
            e = f = time_mono_s();
        } else {
            if (decode_logits(d, batch, rows, logits, err, sizeof err)) { fprintf(stderr, "decode_bench: %s\n", err); return 1; }
            e = time_mono_s();
            for (int s = 0; s < batch; s++) ids[s] = eval_argmax(logits + (size_t)s * V, V);
            f = time_mono_s();
            /* the device's pick of the same rows, untimed: it must be the host's */
            if (decode_argmax(d, batch, rows, dev_ids, err, sizeof err)) { fprintf(stderr, "decode_bench: %s\n", err); return 1; }
            for (int s = 0; s < batch; s++)
                if (ids[s] != dev_ids[s]) {
                    fprintf(stderr, "decode_bench: step %d row %d: device pick %d, host pick %d\n", g, s, dev_ids[s], ids[s]);
                    return 1;
                }
        }
        st[3 * g] = b - a;
        st[3 * g + 1] = e - b;
        st[3 * g + 2] = f - e;
    }
    double med[4];   /* forward (all steps), head + device pick (even), logits to the host (odd), host argmax (odd) */
    int cnt[4] = {gen, (gen + 1) / 2, gen / 2, gen / 2};
    for (int k = 0; k < 4; k++) {
        int m = 0;
        for (int g = 0; g < gen; g++) {
            if ((k == 1 && g % 2) || (k >= 2 && g % 2 == 0)) continue;
            sorted[m++] = st[3 * g + (k == 0 ? 0 : k == 3 ? 2 : 1)];
        }
        qsort(sorted, (size_t)m, sizeof *sorted, cmp_double);
        med[k] = m ? sorted[m / 2] : 0;
    }
    double step = med[0] + med[1];
    printf("prefill: %d x %d tokens in %.2f s = %.0f tokens/s\n", batch, prompt, prefill_s, batch * prompt / prefill_s);
    printf("decode step (medians over %d / %d / %d steps, context %d..%d): forward %.2f ms; head + argmax on the device "
           "%.2f ms; for comparison, logits to the host %.2f ms + host argmax %.2f ms (same picks, checked)\n", cnt[0],
           cnt[1], cnt[2], prompt, prompt + gen, 1e3 * med[0], 1e3 * med[1], 1e3 * med[2], 1e3 * med[3]);
    printf("RESULT decode_bench batch %d: %.0f generated tokens/s (%.2f ms per step: forward + device pick)\n", batch,
           batch / step, 1e3 * step);
    free(dev_ids);
    free(norm); free(head); cudaFreeHost(logits); free(ids); free(rows); free(slots); free(cu); free(st); free(sorted);
    decode_free(d);
    target_free(t);
    return 0;
}
#else
int main(void) {
    printf("decode_bench: built without CUDA, skipped\n");
    return 0;
}
#endif
