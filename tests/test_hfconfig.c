/*
 * tests/test_hfconfig.c — stages/model/hfconfig: config.json of published Qwen3 and Llama models
 * (transformers 4 and 5 spellings), rejections with a sentence naming the field, the writer round
 * trip, RoPE frequencies (fp32 bit patterns printed by torch 2.15 running transformers 5.24's own
 * rope init code: default, linear, llama3, partial rotary), the Qwen3.5 / Qwen3.6 hybrid configs
 * (flat and nested in a multimodal config) and the z-lab layer-id formula.
 */
#include "model/hfconfig.h"
#include "testutil.h"

static char err[1024];

/* fp32 bit pattern of a value hf_rope_inv_freq returned (it must be an fp32 number). */
static uint32_t f32_bits(double v) {
    float f = (float)v;
    ck_assert_msg((double)f == v, "%.17g is not an fp32 value", v);
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Qwen/Qwen3.6-27B's config.json shape (Qwen3_5ForConditionalGeneration, the text model nested in
 * text_config; vision_config abridged; sizes from the published model card: hidden 5120, 64 layers
 * as 16 x (3 linear + 1 full), 24 q / 4 kv heads of 256, rotary 64, DeltaNet 16 qk / 48 v heads of
 * 128, FFN 17408, vocab 248320, theta 1e7). layer_types is left to full_attention_interval here. */
static const char *QWEN36_27B =
    "{\"architectures\": [\"Qwen3_5ForConditionalGeneration\"], \"image_token_id\": 248056,"
    " \"model_type\": \"qwen3_5\", \"text_config\": {\"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"attn_output_gate\": true, \"dtype\": \"bfloat16\", \"eos_token_id\": 248044, \"full_attention_interval\": 4,"
    " \"head_dim\": 256, \"hidden_act\": \"silu\", \"hidden_size\": 5120, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 17408, \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 128,"
    " \"linear_num_key_heads\": 16, \"linear_num_value_heads\": 48, \"linear_value_head_dim\": 128,"
    " \"max_position_embeddings\": 262144, \"model_type\": \"qwen3_5_text\", \"mtp_num_hidden_layers\": 1,"
    " \"num_attention_heads\": 24, \"num_hidden_layers\": 64, \"num_key_value_heads\": 4,"
    " \"rms_norm_eps\": 1e-06, \"use_cache\": true, \"vocab_size\": 248320,"
    " \"rope_parameters\": {\"mrope_interleaved\": true, \"mrope_section\": [11, 11, 10],"
    " \"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.25}},"
    " \"tie_word_embeddings\": false, \"transformers_version\": \"4.57.0.dev0\", \"video_token_id\": 248057,"
    " \"vision_config\": {\"depth\": 27, \"hidden_size\": 1152, \"model_type\": \"qwen3_5\"},"
    " \"vision_end_token_id\": 248054, \"vision_start_token_id\": 248053}";

/* A tiny flat Qwen3_5ForCausalLM (what dflash-mkmodel --preset qwen3.5-tiny writes): explicit
 * layer_types, GQA in both mixers. */
static const char *QWEN35_TINY =
    "{\"architectures\": [\"Qwen3_5ForCausalLM\"], \"model_type\": \"qwen3_5_text\", \"dtype\": \"float32\","
    " \"head_dim\": 16, \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 4,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 512,"
    " \"layer_types\": [\"linear_attention\", \"full_attention\", \"linear_attention\", \"full_attention\"],"
    " \"linear_conv_kernel_dim\": 4, \"linear_key_head_dim\": 8, \"linear_value_head_dim\": 12,"
    " \"linear_num_key_heads\": 2, \"linear_num_value_heads\": 4, \"tie_word_embeddings\": true,"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000000, \"partial_rotary_factor\": 0.5,"
    " \"mrope_section\": [2, 1, 1], \"mrope_interleaved\": true}}";

/* Qwen/Qwen3-8B config.json as published. */
static const char *QWEN3_8B =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\","
    " \"hidden_size\": 4096, \"initializer_range\": 0.02, \"intermediate_size\": 12288,"
    " \"max_position_embeddings\": 40960, \"max_window_layers\": 36, \"model_type\": \"qwen3\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 36, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-06, \"rope_scaling\": null, \"rope_theta\": 1000000, \"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.51.0\","
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

/* meta-llama/Llama-3.1-8B config.json as published. */
static const char *LLAMA31_8B =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 14336, \"max_position_embeddings\": 131072,"
    " \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
    " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.0.dev0\","
    " \"use_cache\": true, \"vocab_size\": 128256}";

/* meta-llama/Llama-3.2-1B: tied embeddings, explicit head_dim. */
static const char *LLAMA32_1B =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"hidden_act\": \"silu\","
    " \"head_dim\": 64, \"hidden_size\": 2048, \"intermediate_size\": 8192, \"max_position_embeddings\": 131072,"
    " \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 16,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0,"
    " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"bfloat16\", \"vocab_size\": 128256}";

/* Qwen3-0.6B as transformers 5 saves it: rope_parameters and dtype. */
static const char *QWEN3_06B_T5 =
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"attention_bias\": false, \"dtype\": \"float32\","
    " \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 1024, \"intermediate_size\": 3072,"
    " \"layer_types\": [\"full_attention\", \"full_attention\"], \"max_position_embeddings\": 40960,"
    " \"model_type\": \"qwen3\", \"num_attention_heads\": 16, \"num_hidden_layers\": 28,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-06,"
    " \"rope_parameters\": {\"rope_theta\": 1000000, \"rope_type\": \"default\"},"
    " \"tie_word_embeddings\": true, \"transformers_version\": \"5.0.0\", \"use_sliding_window\": false,"
    " \"vocab_size\": 151936}";

START_TEST(qwen3_8b) {
    struct model_config c;
    ck_assert_msg(hf_config_parse(&c, QWEN3_8B, "q.json", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.arch, HF_ARCH_QWEN3);
    ck_assert_str_eq(c.architecture, "Qwen3ForCausalLM");
    ck_assert_str_eq(c.model_type, "qwen3");
    ck_assert_int_eq(c.vocab_size, 151936);
    ck_assert_int_eq(c.hidden_size, 4096);
    ck_assert_int_eq(c.intermediate_size, 12288);
    ck_assert_int_eq(c.num_hidden_layers, 36);
    ck_assert_int_eq(c.num_attention_heads, 32);
    ck_assert_int_eq(c.num_key_value_heads, 8);
    ck_assert_int_eq(c.head_dim, 128);
    ck_assert_int_eq(c.qk_norm, 1);
    ck_assert_double_eq(c.rms_norm_eps, 1e-6);
    ck_assert_double_eq(c.rope_theta, 1e6);
    ck_assert_int_eq(c.rope_type, HF_ROPE_DEFAULT);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.max_position_embeddings, 40960);
    ck_assert_int_eq(c.dtype, ST_BF16);
    ck_assert_int_eq(hf_config_n_params(&c), 8190735360LL);   /* Qwen3-8B's published 8.19B */
    ck_assert_int_eq(hf_config_rotary_dim(&c), 128);
    double f[64];
    hf_rope_inv_freq(&c, f);
    /* torch: 1.0 / (1e6 ** (arange(0, 128, 2).float() / 128)), fp32 bits */
    ck_assert_uint_eq(f32_bits(f[0]), 0x3f800000u);
    ck_assert_uint_eq(f32_bits(f[32]), 0x3a83126fu);
    ck_assert_uint_eq(f32_bits(f[63]), 0x35a68e4cu);
}
END_TEST

START_TEST(llama31_8b_rope_scaling) {
    struct model_config c;
    ck_assert_msg(hf_config_parse(&c, LLAMA31_8B, "l.json", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.arch, HF_ARCH_LLAMA);
    ck_assert_int_eq(c.qk_norm, 0);
    ck_assert_int_eq(c.head_dim, 128);   /* absent: hidden / heads */
    ck_assert_int_eq(c.num_key_value_heads, 8);
    ck_assert_int_eq(c.intermediate_size, 14336);
    ck_assert_int_eq(c.vocab_size, 128256);
    ck_assert_double_eq(c.rms_norm_eps, 1e-5);
    ck_assert_double_eq(c.rope_theta, 500000.0);
    ck_assert_int_eq(c.rope_type, HF_ROPE_LLAMA3);
    ck_assert_double_eq(c.rope_factor, 8.0);
    ck_assert_double_eq(c.rope_low_freq_factor, 1.0);
    ck_assert_double_eq(c.rope_high_freq_factor, 4.0);
    ck_assert_int_eq(c.rope_original_max_position_embeddings, 8192);
    ck_assert_int_eq(c.max_position_embeddings, 131072);
    ck_assert_int_eq(hf_config_n_params(&c), 8030261248LL);   /* Llama-3.1-8B */
    /* high-frequency (kept), medium (smoothed) and low-frequency (divided by 8) bands */
    /* fp32 bits of transformers' _compute_llama3_parameters run by torch */
    static const struct { int i; uint32_t bits; } want[] = {
        {0, 0x3f800000u}, {20, 0x3c87a9c3u}, {28, 0x3b527720u}, {29, 0x3b0dfd06u}, {30, 0x3ab3d11du},
        {33, 0x39a3f108u}, {35, 0x38c86886u}, {36, 0x38a3418du}, {48, 0x36df10c4u}, {63, 0x34a4c2ffu},
    };
    double f[64];
    hf_rope_inv_freq(&c, f);
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++)
        ck_assert_msg(f32_bits(f[want[k].i]) == want[k].bits, "inv_freq[%d] = %.9g (0x%08x), torch 0x%08x",
                      want[k].i, f[want[k].i], f32_bits(f[want[k].i]), want[k].bits);
}
END_TEST

START_TEST(llama32_tied) {
    struct model_config c;
    ck_assert_msg(hf_config_parse(&c, LLAMA32_1B, "l1.json", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_double_eq(c.rope_factor, 32.0);
    ck_assert_int_eq(hf_config_n_params(&c), 1235814400LL);   /* Llama-3.2-1B */
}
END_TEST

START_TEST(transformers5_spelling) {
    struct model_config c;
    ck_assert_msg(hf_config_parse(&c, QWEN3_06B_T5, "t5.json", err, sizeof err) == 0, "%s", err);
    ck_assert_double_eq(c.rope_theta, 1e6);
    ck_assert_int_eq(c.rope_type, HF_ROPE_DEFAULT);
    ck_assert_int_eq(c.dtype, ST_F32);
    ck_assert_int_eq(c.tie_word_embeddings, 1);
    ck_assert_int_eq(hf_config_n_params(&c), 596049920LL);   /* Qwen3-0.6B */
    /* llama3 parameters inside rope_parameters; old rope_theta ignored when rope_parameters has one */
    const char *l5 =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 256, \"intermediate_size\": 512,"
        " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 1000, \"rope_theta\": 1.0,"
        " \"dtype\": \"float16\", \"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 500000.0,"
        " \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
        " \"original_max_position_embeddings\": 8192}}";
    ck_assert_msg(hf_config_parse(&c, l5, "l5.json", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.rope_type, HF_ROPE_LLAMA3);
    ck_assert_double_eq(c.rope_theta, 500000.0);
    ck_assert_int_eq(c.rope_original_max_position_embeddings, 8192);
    ck_assert_int_eq(c.dtype, ST_F16);
    ck_assert_int_eq(c.num_key_value_heads, 4);   /* absent: = heads */
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_int_eq(c.max_position_embeddings, 2048);
    /* linear scaling through the older "type" key */
    const char *lin =
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 1,"
        " \"num_attention_heads\": 4, \"vocab_size\": 10, \"rope_theta\": 10000,"
        " \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}}";
    ck_assert_msg(hf_config_parse(&c, lin, "lin.json", err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(c.architecture, "LlamaForCausalLM");
    ck_assert_int_eq(c.rope_type, HF_ROPE_LINEAR);
    double f[8];
    hf_rope_inv_freq(&c, f);
    ck_assert_uint_eq(f32_bits(f[0]), 0x3e800000u);   /* torch: inv_freq /= 4.0 */
    ck_assert_uint_eq(f32_bits(f[4]), 0x3b23d70au);
}
END_TEST

/* Every value of tests/data/rope_inv_freq_torch.txt (scripts/rope_ref_torch.py: transformers'
 * default / linear / llama3 rope init evaluated by torch's scalar fp32 kernels, 6 thetas x 8 dims)
 * is reproduced bit for bit. */
START_TEST(rope_torch_table) {
    const char *rel = "tests/data/rope_inv_freq_torch.txt";
    char path[1024];
    const char *bin = getenv("DFLASH_BIN");
    if (access(rel, R_OK) == 0) snprintf(path, sizeof path, "%s", rel);
    else snprintf(path, sizeof path, "%s/../../%s", bin && *bin ? bin : "build/bin", rel);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "cannot open %s", path);
    char line[256], type[32];
    double theta;
    int dim, i, n = 0, bad = 0;
    unsigned want;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        ck_assert_int_eq(sscanf(line, "%31s %lf %d %d %x", type, &theta, &dim, &i, &want), 5);
        struct model_config c;
        memset(&c, 0, sizeof c);
        c.head_dim = dim;
        c.rope_theta = theta;
        if (strcmp(type, "linear") == 0) { c.rope_type = HF_ROPE_LINEAR; c.rope_factor = 4.0; }
        else if (strcmp(type, "llama3") == 0) {
            c.rope_type = HF_ROPE_LLAMA3; c.rope_factor = 8.0; c.rope_low_freq_factor = 1.0;
            c.rope_high_freq_factor = 4.0; c.rope_original_max_position_embeddings = 8192;
        }
        double v[128];
        hf_rope_inv_freq(&c, v);
        if (f32_bits(v[i]) != want) {
            if (bad++ < 5) fprintf(stderr, "%s theta %g dim %d i %d: 0x%08x, torch 0x%08x\n", type, theta, dim, i,
                                   f32_bits(v[i]), want);
        }
        n++;
    }
    fclose(f);
    ck_assert_int_eq(n, 6480);
    ck_assert_msg(bad == 0, "%d of %d inverse frequencies differ from torch", bad, n);
}
END_TEST

START_TEST(qwen36_27b_nested) {
    struct model_config c;
    ck_assert_msg(hf_config_parse(&c, QWEN36_27B, "q36.json", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(c.arch, HF_ARCH_QWEN3_5);
    ck_assert_str_eq(c.architecture, "Qwen3_5ForConditionalGeneration");
    ck_assert_int_eq(c.nested, 1);
    ck_assert_int_eq(c.qk_norm, 1);
    ck_assert_int_eq(c.hidden_size, 5120);
    ck_assert_int_eq(c.num_hidden_layers, 64);
    ck_assert_int_eq(c.num_attention_heads, 24);
    ck_assert_int_eq(c.num_key_value_heads, 4);
    ck_assert_int_eq(c.head_dim, 256);
    ck_assert_int_eq(c.rotary_dim, 64);
    ck_assert_int_eq(hf_config_rotary_dim(&c), 64);
    ck_assert_int_eq(c.mrope_section[0], 11);
    ck_assert_int_eq(c.linear_num_key_heads, 16);
    ck_assert_int_eq(c.linear_num_value_heads, 48);
    ck_assert_int_eq(c.linear_key_head_dim, 128);
    ck_assert_int_eq(c.linear_value_head_dim, 128);
    ck_assert_int_eq(c.linear_conv_kernel_dim, 4);
    ck_assert_int_eq(c.max_position_embeddings, 262144);
    ck_assert_int_eq(c.tie_word_embeddings, 0);
    ck_assert_int_eq(c.dtype, ST_BF16);
    ck_assert_double_eq(c.rope_theta, 1e7);
    int n_full = 0;
    for (int l = 0; l < 64; l++) {
        ck_assert_int_eq(c.layer_linear[l], (l + 1) % 4 != 0);   /* 3 linear, then 1 full */
        n_full += !c.layer_linear[l];
    }
    ck_assert_int_eq(n_full, 16);
    ck_assert_int_eq(hf_config_linear_conv_dim(&c), 2 * 16 * 128 + 48 * 128);
    ck_assert_int_eq(hf_config_linear_in_dim(&c), 2 * 16 * 128 + 2 * 48 * 128 + 2 * 48);
    /* the text model: 26.90 B (the published 27.78 B adds the vision tower and the MTP layer) */
    ck_assert_int_eq(hf_config_n_params(&c), 26895998464LL);
    double f[128];
    hf_rope_inv_freq(&c, f);   /* torch: 1e7 ** (arange(0, 64, 2) / 64) */
    ck_assert_uint_eq(f32_bits(f[0]), 0x3f800000u);
    ck_assert_uint_eq(f32_bits(f[1]), 0x3f1ab32bu);
    ck_assert_uint_eq(f32_bits(f[16]), 0x39a5cb60u);
    ck_assert_uint_eq(f32_bits(f[31]), 0x3431af44u);
}
END_TEST

START_TEST(qwen35_flat_roundtrip) {
    struct model_config a, b;
    ck_assert_msg(hf_config_parse(&a, QWEN35_TINY, "t.json", err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(a.arch, HF_ARCH_QWEN3_5);
    ck_assert_int_eq(a.nested, 0);
    ck_assert_int_eq(a.rotary_dim, 8);
    ck_assert_int_eq(a.tie_word_embeddings, 1);
    ck_assert_int_eq(a.dtype, ST_F32);
    ck_assert_int_eq(a.layer_linear[0], 1);
    ck_assert_int_eq(a.layer_linear[1], 0);
    double f[4];
    hf_rope_inv_freq(&a, f);   /* torch: 1e7 ** (arange(0, 8, 2) / 8) */
    static const uint32_t want[4] = {0x3f800000u, 0x3c91ad39u, 0x39a5cb60u, 0x36bcb0c1u};
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(f32_bits(f[i]), want[i]);
    const char *dir = test_tmpdir("hfcfg35");
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ck_assert_msg(hf_config_write(&a, path, err, sizeof err) == 0, "%s", err);
    ck_assert_msg(hf_config_load(&b, dir, err, sizeof err) == 0, "%s", err);
    ck_assert_int_eq(memcmp(&a, &b, sizeof a), 0);
    /* the nested layout is read, not written */
    ck_assert_int_eq(hf_config_parse(&a, QWEN36_27B, "q36.json", err, sizeof err), 0);
    ck_assert_int_eq(hf_config_write(&a, path, err, sizeof err), -1);
    ck_assert_msg(strstr(err, "Qwen3_5ForConditionalGeneration"), "%s", err);
}
END_TEST

/* Replace the first occurrence of `from` in base by `to` and expect a rejection mentioning frag. */
static void expect_reject_edit(const char *base, const char *from, const char *to, const char *frag) {
    char buf[4096];
    const char *p = strstr(base, from);
    ck_assert_msg(p != NULL, "test bug: '%s' not in base", from);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p - base), base, to, p + strlen(from));
    struct model_config c;
    err[0] = '\0';
    ck_assert_msg(hf_config_parse(&c, buf, "cfg/config.json", err, sizeof err) == -1, "accepted: %s", buf);
    ck_assert_msg(strstr(err, "cfg/config.json") != NULL, "no file in: %s", err);
    ck_assert_msg(strstr(err, frag) != NULL, "'%s' not in: %s", frag, err);
}

START_TEST(rejections) {
    expect_reject_edit(QWEN3_8B, "Qwen3ForCausalLM", "MistralForCausalLM", "'MistralForCausalLM' is not supported");
    expect_reject_edit(QWEN3_8B, "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen3MoeForCausalLM");
    expect_reject_edit(QWEN3_8B, "\"attention_bias\": false", "\"attention_bias\": true", "attention_bias");
    expect_reject_edit(LLAMA31_8B, "\"mlp_bias\": false", "\"mlp_bias\": true", "mlp_bias");
    expect_reject_edit(QWEN3_8B, "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act");
    expect_reject_edit(QWEN3_8B, "\"use_sliding_window\": false", "\"use_sliding_window\": true", "use_sliding_window");
    expect_reject_edit(QWEN3_8B, "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}",
                       "'yarn'");
    expect_reject_edit(LLAMA31_8B, "\"low_freq_factor\": 1.0, ", "", "low_freq_factor");
    expect_reject_edit(LLAMA31_8B, "\"high_freq_factor\": 4.0", "\"high_freq_factor\": 0.5", "high_freq_factor");
    expect_reject_edit(QWEN3_8B, "\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5", "num_key_value_heads");
    expect_reject_edit(QWEN3_8B, "\"vocab_size\": 151936", "\"vocab_sz\": 151936", "\"vocab_size\" is missing");
    expect_reject_edit(QWEN3_8B, "\"hidden_size\": 4096", "\"hidden_size\": -4096", "hidden_size");
    expect_reject_edit(QWEN3_8B, "\"hidden_size\": 4096", "\"hidden_size\": \"4096\"", "hidden_size");
    expect_reject_edit(QWEN3_8B, "\"head_dim\": 128", "\"head_dim\": 127", "head_dim");
    expect_reject_edit(QWEN3_8B, "\"rms_norm_eps\": 1e-06", "\"rms_norm_eps\": 0", "rms_norm_eps");
    expect_reject_edit(QWEN3_8B, "\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"float8_e4m3fn\"", "torch_dtype");
    expect_reject_edit(QWEN3_8B, "\"model_type\": \"qwen3\"", "\"model_type\": \"llama\"", "model_type");
    expect_reject_edit(QWEN3_8B, "\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0", "tie_word_embeddings");
    expect_reject_edit(QWEN3_8B, "[\"Qwen3ForCausalLM\"]", "[]", "architectures");
    expect_reject_edit(QWEN3_8B, "\"vocab_size\": 151936}", "\"vocab_size\": 151936", "not valid JSON");
    /* Qwen3.5: one sentence naming the key */
    expect_reject_edit(QWEN36_27B, "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "MoE");
    expect_reject_edit(QWEN35_TINY, "\"model_type\": \"qwen3_5_text\", ", "\"model_type\": \"qwen3_5_moe_text\", ", "MoE");
    expect_reject_edit(QWEN36_27B, "\"model_type\": \"qwen3_5_text\"", "\"model_type\": \"qwen3_5_moe_text\"",
                       "text_config.model_type");
    expect_reject_edit(QWEN35_TINY, "\"vocab_size\": 512,", "\"vocab_size\": 512, \"num_experts\": 64,", "num_experts");
    expect_reject_edit(QWEN36_27B, "\"text_config\"", "\"txt_config\"", "text_config");
    expect_reject_edit(QWEN35_TINY, "[\"linear_attention\", \"full_attention\", \"linear_attention\", \"full_attention\"]",
                       "[\"linear_attention\", \"full_attention\", \"sliding_attention\", \"full_attention\"]",
                       "layer_types[2]");
    expect_reject_edit(QWEN35_TINY, "[\"linear_attention\", \"full_attention\", \"linear_attention\", \"full_attention\"]",
                       "[\"linear_attention\", \"full_attention\"]", "layer_types");
    expect_reject_edit(QWEN35_TINY, "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", "rope_parameters.rope_type");
    expect_reject_edit(QWEN35_TINY, "\"mrope_section\": [2, 1, 1]", "\"mrope_section\": [11, 11, 10]", "mrope_section");
    expect_reject_edit(QWEN35_TINY, "\"partial_rotary_factor\": 0.5", "\"partial_rotary_factor\": 1.5", "partial_rotary_factor");
    expect_reject_edit(QWEN35_TINY, "\"linear_num_key_heads\": 2", "\"linear_num_key_heads\": 3", "linear_num_key_heads");
    expect_reject_edit(QWEN35_TINY, "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "num_key_value_heads");
    expect_reject_edit(QWEN35_TINY, "\"dtype\": \"float32\"", "\"dtype\": \"float32\", \"attention_bias\": true", "attention_bias");
    expect_reject_edit(QWEN36_27B, "\"hidden_size\": 5120", "\"hidden_size\": 0", "hidden_size");
    struct model_config c;
    ck_assert_int_eq(hf_config_parse(&c, "{\"hidden_size\": 8}", "x.json", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "architectures"), "%s", err);
    ck_assert_int_eq(hf_config_load(&c, "/nonexistent/dir/config.json", err, sizeof err), -1);
    ck_assert_msg(strstr(err, "/nonexistent/dir/config.json"), "%s", err);
}
END_TEST

START_TEST(write_load_roundtrip) {
    const char *dir = test_tmpdir("hfcfg");
    const char *srcs[] = {QWEN3_8B, LLAMA31_8B, LLAMA32_1B, QWEN3_06B_T5};
    for (int k = 0; k < 4; k++) {
        struct model_config a, b;
        ck_assert_int_eq(hf_config_parse(&a, srcs[k], "src", err, sizeof err), 0);
        char path[1024];
        snprintf(path, sizeof path, "%s/config.json", dir);
        ck_assert_msg(hf_config_write(&a, path, err, sizeof err) == 0, "%s", err);
        ck_assert_msg(hf_config_load(&b, dir, err, sizeof err) == 0, "%s", err);   /* directory form */
        ck_assert_int_eq(memcmp(&a, &b, sizeof a), 0);
    }
}
END_TEST

START_TEST(zlab_layer_ids) {
    int ids[8];
    ck_assert_int_eq(hf_zlab_layer_ids(36, 5, ids), 0);
    int q8[] = {1, 9, 17, 25, 33};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids[i], q8[i]);
    ck_assert_int_eq(hf_zlab_layer_ids(36, 1, ids), 0);
    ck_assert_int_eq(ids[0], 18);
    ck_assert_int_eq(hf_zlab_layer_ids(28, 5, ids), 0);
    int q06[] = {1, 7, 13, 19, 25};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids[i], q06[i]);
    /* half-way cases round to even like Python's round(): 2.5 -> 2, 3.5 -> 4 */
    ck_assert_int_eq(hf_zlab_layer_ids(7, 3, ids), 0);
    ck_assert_int_eq(ids[0], 1); ck_assert_int_eq(ids[1], 2); ck_assert_int_eq(ids[2], 4);
    ck_assert_int_eq(hf_zlab_layer_ids(9, 5, ids), 0);
    int h9[] = {1, 2, 4, 5, 6};
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids[i], h9[i]);
    /* the tiny test model: 4 layers -> end = 1, every id 1 */
    ck_assert_int_eq(hf_zlab_layer_ids(4, 5, ids), 0);
    for (int i = 0; i < 5; i++) ck_assert_int_eq(ids[i], 1);
    ck_assert_int_eq(hf_zlab_layer_ids(2, 3, ids), -1);   /* ids below 0 */
    ck_assert_int_eq(hf_zlab_layer_ids(0, 3, ids), -1);
    ck_assert_int_eq(hf_zlab_layer_ids(36, 0, ids), -1);
    /* issue 26: never the target's last layer, for every layer count (n = 2, one draft layer: [0]; n = 1: none) */
    ck_assert_int_eq(hf_zlab_layer_ids(2, 1, ids), 0);
    ck_assert_int_eq(ids[0], 0);
    ck_assert_int_eq(hf_zlab_layer_ids(1, 1, ids), -1);
    for (int n = 1; n <= 128; n++)
        for (int L = 1; L <= 8; L++)
            if (hf_zlab_layer_ids(n, L, ids) == 0)
                for (int i = 0; i < L; i++)
                    ck_assert_msg(ids[i] >= 0 && ids[i] < n - 1, "n=%d L=%d: id %d", n, L, ids[i]);
}
END_TEST

int main(void) {
    Suite *s = suite_create("hfconfig");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, qwen3_8b);
    tcase_add_test(tc, llama31_8b_rope_scaling);
    tcase_add_test(tc, llama32_tied);
    tcase_add_test(tc, transformers5_spelling);
    tcase_add_test(tc, rope_torch_table);
    tcase_add_test(tc, qwen36_27b_nested);
    tcase_add_test(tc, qwen35_flat_roundtrip);
    tcase_add_test(tc, rejections);
    tcase_add_test(tc, write_load_roundtrip);
    tcase_add_test(tc, zlab_layer_ids);
    suite_add_tcase(s, tc);
    return test_run_suite(s);
}
