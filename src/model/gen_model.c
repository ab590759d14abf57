/*
 * gen_model.c — see gen_model.h. Shapes, per-arch tensor sets and metadata keys follow
 * engine-facts §1.3–1.5; llama3 rope_freqs per §2.3; K-quant fallback per §2.2.
 */
#include "gen_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../gguf/gguf.h"
#include "../kernels/quant.h"

const char *const kvt_gen_model_shapes[] = {"tiny", "smol-135m", "qwen3-0.6b", "llama-1b", "gemma3-1b",
                                            "qwen35-0.8b", "qwen35-2b", "qwen3moe-30b-a3b", "deepseek2-lite", NULL};
const char *const kvt_gen_model_types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0",
                                           "q5_1", "q4_k", "q5_k", "q6_k", NULL};
const char *const kvt_gen_model_archs[] = {"llama", "qwen2", "qwen3", "gemma3", "qwen35", "qwen3moe", "deepseek2", NULL};

enum { A_LLAMA, A_QWEN2, A_QWEN3, A_GEMMA3, A_QWEN35, A_QWEN3MOE, A_DEEPSEEK2, A_COUNT };
static const char *const k_arch_names[A_COUNT] = {"llama", "qwen2", "qwen3", "gemma3", "qwen35", "qwen3moe", "deepseek2"};

typedef struct shape {
    uint32_t n_embd, n_layer, n_head, n_kv, head_dim, n_ff, n_ctx, n_swa;
    float rope_base, eps;
    bool tied, llama3_rope;
} shape;

/* qwen35 extras: DeltaNet heads/dim/conv taps, attention every `interval` layers, rope dims. The
 * tiny test shape has small DeltaNet heads; every other shape gets Qwen3.5 small-model dims and
 * rope on a quarter of the head. */
typedef struct ssm_shape {
    uint32_t hk, hv, d, conv, interval, n_rot;
} ssm_shape;

/* Mixture-of-experts (qwen3moe, deepseek2) and latent attention (deepseek2) extras. Metadata keys
 * are written the way llama.cpp's converter writes them for real checkpoints (docs/models.md lists
 * each family's key set): qwen3moe writes no gating/normalization keys (the loader's defaults,
 * softmax + renormalized top-k, are the family's); deepseek2 writes the gating function, the
 * normalization flag and the scale. */
typedef struct moe_shape {
    uint32_t n_expert, n_used, n_ff_exp, n_shared, n_dense_lead, gating; /* gating: 1 softmax, 2 sigmoid */
    bool norm, bias;    /* expert_weights_norm; an exp_probs_b selection bias (DeepSeek-V3 style) */
    float scale;        /* expert_weights_scale */
    /* deepseek2 MLA: q_lora 0 = plain attn_q (V2-Lite) */
    uint32_t q_lora, kv_lora, d_nope, d_rope, d_v;
    float yarn_factor, yarn_log_mul;
    uint32_t yarn_orig;
} moe_shape;

static moe_shape moe_extras(int arch, const char *shape_name) {
    const bool tiny = !strcmp(shape_name, "tiny");
    if (arch == A_QWEN3MOE) {
        if (tiny) return (moe_shape){8, 2, 256, 0, 0, 1, true, false, 1.0f, 0, 0, 0, 0, 0, 0, 0, 0};
        return (moe_shape){128, 8, 768, 0, 0, 1, true, false, 1.0f, 0, 0, 0, 0, 0, 0, 0, 0}; /* Qwen3-30B-A3B */
    }
    if (arch == A_DEEPSEEK2) {
        /* tiny: V3-style routing (sigmoid, selection bias, normalized, scaled) and a low-rank q */
        if (tiny) return (moe_shape){8, 2, 32, 1, 1, 2, true, true, 2.5f, 48, 32, 32, 16, 32, 40.0f, 0.1f, 4096};
        /* DeepSeek-V2-Lite: softmax, no normalization, scale 1, plain q, latent 512 + rope 64 */
        return (moe_shape){64, 6, 1408, 2, 1, 1, false, false, 1.0f, 0, 512, 128, 64, 128, 40.0f, 0.0707f, 4096};
    }
    return (moe_shape){0};
}

static ssm_shape qwen35_extras(const char *shape_name, const shape *s) {
    if (!strcmp(shape_name, "tiny")) return (ssm_shape){2, 4, 16, 4, 4, 8};
    return (ssm_shape){16, 16, 128, 4, 4, s->head_dim >= 8 ? s->head_dim / 4 / 2 * 2 : s->head_dim};
}

/* tiny: small enough for unit tests, but exercising each arch's special paths: qwen3/gemma3 use
 * head_dim 32 so that n_head*head_dim != n_embd, gemma3 has 6 layers so layer 5 is global,
 * llama writes an untied output.weight. */
static shape tiny_shape(int arch) {
    shape s = {64, 2, 4, 2, 16, 128, 2048, 0, 10000.0f, 1e-5f, true, false};
    switch (arch) {
    case A_LLAMA: s.tied = false; break;
    case A_QWEN2: s.rope_base = 1e6f; s.eps = 1e-6f; break;
    case A_QWEN3: s.head_dim = 32; s.rope_base = 1e6f; s.eps = 1e-6f; break;
    case A_GEMMA3: s.n_layer = 6; s.head_dim = 32; s.n_swa = 32; s.rope_base = 1e6f; s.eps = 1e-6f; break;
    case A_QWEN35: s.n_layer = 4; s.head_dim = 32; s.rope_base = 1e7f; s.eps = 1e-6f; break; /* DeltaNet 0-2, attn 3 */
    case A_QWEN3MOE: /* rows of 256 (embedding, experts, attention output) so the k-quants apply as such */
        s.n_embd = 256; s.n_layer = 3; s.head_dim = 64; s.n_ff = 512; s.rope_base = 1e6f; s.eps = 1e-6f; s.n_ctx = 40960;
        break;
    case A_DEEPSEEK2: /* key_length = d_nope + d_rope = 48 (moe_extras); 1 dense + 2 MoE layers */
        s.n_layer = 3; s.n_kv = 4; s.head_dim = 48; s.rope_base = 10000.0f; s.eps = 1e-6f; s.n_ctx = 163840;
        s.tied = false;
        break;
    }
    return s;
}

static bool named_shape(const char *name, int *arch, shape *s) {
    if (!strcmp(name, "smol-135m")) {
        *arch = A_LLAMA;
        *s = (shape){576, 30, 9, 3, 64, 1536, 8192, 0, 100000.0f, 1e-5f, true, false};
    } else if (!strcmp(name, "qwen3-0.6b")) {
        *arch = A_QWEN3;
        *s = (shape){1024, 28, 16, 8, 128, 3072, 40960, 0, 1e6f, 1e-6f, true, false};
    } else if (!strcmp(name, "llama-1b")) {
        *arch = A_LLAMA;
        *s = (shape){2048, 16, 32, 8, 64, 8192, 131072, 0, 500000.0f, 1e-5f, true, true};
    } else if (!strcmp(name, "qwen35-0.8b")) { /* Qwen3.5-0.8B-like layer shapes */
        *arch = A_QWEN35;
        *s = (shape){1024, 24, 8, 2, 256, 3584, 262144, 0, 1e7f, 1e-6f, true, false};
    } else if (!strcmp(name, "qwen35-2b")) { /* Qwen3.5-2B-like layer shapes */
        *arch = A_QWEN35;
        *s = (shape){2048, 24, 8, 2, 256, 6144, 262144, 0, 1e7f, 1e-6f, true, false};
    } else if (!strcmp(name, "qwen3moe-30b-a3b")) { /* Qwen3-30B-A3B's layer shapes; 4 of its 48 layers */
        *arch = A_QWEN3MOE;
        *s = (shape){2048, 4, 32, 4, 128, 6144, 40960, 0, 1e6f, 1e-6f, false, false};
    } else if (!strcmp(name, "deepseek2-lite")) { /* DeepSeek-V2-Lite's layer shapes; 4 of its 27 layers */
        *arch = A_DEEPSEEK2;
        *s = (shape){2048, 4, 16, 16, 192, 10944, 163840, 0, 10000.0f, 1e-6f, false, false};
    } else if (!strcmp(name, "gemma3-1b")) {
        *arch = A_GEMMA3;
        *s = (shape){1152, 26, 4, 1, 256, 6912, 32768, 512, 1e6f, 1e-6f, true, false};
    } else {
        return false;
    }
    return true;
}

/* ------------------------------------------------------------------ chat templates (data) */

static const char k_tmpl_smol[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
static const char k_tmpl_chatml[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
/* Qwen3 / Qwen3.5 style: ChatML whose earlier assistant turns drop their <think> block. */
static const char k_tmpl_qwen35[] =
    "{%- for message in messages %}{%- if message.role == 'assistant' %}{%- set content = "
    "message.content.split('</think>')[-1].lstrip('\n') %}{%- else %}{%- set content = message.content %}"
    "{%- endif %}{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}";
static const char k_tmpl_llama3[] =
    "{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}";
static const char k_tmpl_gemma[] =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + "
    "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{'<start_of_turn>model\n'}}{% endif %}";

/* ------------------------------------------------------------------ weights */

typedef struct gen_ctx {
    uint64_t seed;
    float rope_base;
    uint32_t n_rot;
    bool peaked;
    float k_out;       /* --k-outliers factor (1 = off) */
    uint32_t head_dim; /* of the K heads (rows of attn_k.weight are [kv_head][head_dim]) */
    bool neox;         /* RoPE pairs (i, i + n_rot/2) instead of (2i, 2i + 1) */
    bool f16_full;     /* --f16-full: F16 values not first rounded to bf16 */
} gen_ctx;

/* --k-outliers: trained models' keys carry a few channels of much larger magnitude than the rest,
 * concentrated in the low-frequency RoPE dimensions (KIVI, KVQuant); random weights give Gaussian
 * keys without them, the best case for per-group affine codecs and the one TurboQuant's rotation
 * is not needed for. The rows of attn_k.weight that produce the lowest-frequency rotary pair of
 * every KV head (dims n_rot/2 - 1 and n_rot - 1 with NeoX pairs, n_rot - 2 and n_rot - 1 with
 * interleaved ones) are multiplied by the factor. Values keep no outliers (as in trained models). */
static bool k_outlier_row(const gen_ctx *c, const char *name, int64_t r);

/* --peaked: scale factors that make a random model's distributions look trained. Logits: the final
 * norm weight ×8 (logit std ≈ 0.5 → ≈ 4 over the vocabulary, so top-1 carries real mass). Attention:
 * Q and K projections ×2 each, and the Q/K norm weights ×2 for archs that renormalise Q/K (qwen3,
 * gemma3), so scores grow ≈4× (std ≈ 0.2 → ≈ 0.9) instead of averaging V almost uniformly. (×4
 * each made the 30-layer random smol-135m chaotic: even kv8 KV flipped most top-1 tokens.) */
static bool ends_with(const char *s, const char *suf);
static float peak_factor(const char *name) {
    if (!strcmp(name, "output_norm.weight")) return 8.0f;
    if (ends_with(name, "attn_q.weight") || ends_with(name, "attn_k.weight")) return 2.0f;
    if (ends_with(name, "attn_q_norm.weight") || ends_with(name, "attn_k_norm.weight")) return 2.0f;
    /* MLA: q (plain or up-projected) x2, and the keys' two parts x2: the shared k_pe (kv_a_mqa; its
     * latent part is RMS-normed afterwards, so unaffected) and k_nope (kv_b, which scales v too) */
    if (ends_with(name, "attn_q_b.weight") || ends_with(name, "attn_kv_a_mqa.weight") ||
        ends_with(name, "attn_kv_b.weight"))
        return 2.0f;
    /* routers stay as drawn: std 0.02 weights over a normed input already give router logits of std
     * ≈ 0.02·√n_embd (0.9 at 2048); x8 made routing so sharp that any KV error flipped experts */
    return 1.0f;
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float unif(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(splitmix(s) >> 40) * (1.0 / 8388608.0) - 1.0);
}

static bool ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* llama3 rope scaling factors (engine-facts §2.3), Llama 3.2: factor 32, low 1, high 4, orig 8192 */
float kvt_gen_model_llama3_factor(float base, uint32_t n_rot, uint32_t i) {
    const double factor = 32.0, low = 1.0, high = 4.0, orig = 8192.0;
    double freq = pow((double)base, -2.0 * i / n_rot);
    double wavelen = 2.0 * M_PI / freq;
    if (wavelen < orig / high) return 1.0f;
    if (wavelen > orig / low) return (float)factor;
    double smooth = (orig / wavelen - low) / (high - low);
    return (float)(1.0 / ((1.0 - smooth) / factor + smooth));
}

static kvt_status fill_tensor(void *vctx, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne,
                              void *dst, uint64_t nbytes) {
    const gen_ctx *c = vctx;
    int64_t n0 = ne[0], rows = 1;
    for (uint32_t d = 1; d < n_dims; d++) rows *= ne[d];
    uint64_t rb = kvt_type_row_bytes(type, (uint64_t)n0);
    if (rb == 0 || rb * (uint64_t)rows != nbytes) return KVT_ERR_INVALID_ARG;
    float *row = malloc((size_t)n0 * sizeof(float));
    if (!row) return KVT_ERR_NOMEM;
    /* the stream depends only on (seed, name) */
    uint64_t s = c->seed ^ 0x6b767469657221ull;
    for (const char *p = name; *p; p++) s = (s ^ (uint8_t)*p) * 1099511628211ull;
    int kind = ends_with(name, "norm.weight") ? 1 : ends_with(name, ".bias") ? 2
             : !strcmp(name, "rope_freqs.weight") ? 3 : ends_with(name, ".ssm_a") ? 4
             : ends_with(name, "ssm_conv1d.weight") ? 5 : 0;
    const float a = 0.02f * 1.7320508f; /* uniform with std 0.02 */
    const float pk = c->peaked ? peak_factor(name) : 1.0f;
    for (int64_t r = 0; r < rows; r++) {
        const float ko = k_outlier_row(c, name, r) ? c->k_out : 1.0f;
        for (int64_t i = 0; i < n0; i++) {
            switch (kind) {
            case 1: row[i] = 1.0f + 0.05f * unif(&s); break;
            case 2: row[i] = 0.02f * unif(&s); break;
            case 3: row[i] = kvt_gen_model_llama3_factor(c->rope_base, c->n_rot, (uint32_t)i); break;
            case 4: row[i] = -expf(0.5f * unif(&s)); break; /* qwen35 A, stored negated: -exp(A_log) */
            case 5: row[i] = 0.5f * unif(&s); break;         /* qwen35 conv taps */
            default: row[i] = a * unif(&s); break;
            }
            row[i] *= pk * ko;
        }
        uint8_t *out = (uint8_t *)dst + (uint64_t)r * rb;
        if (type == KVT_TYPE_F32) {
            memcpy(out, row, (size_t)n0 * 4);
        } else if (type == KVT_TYPE_F16) {
            /* by default the bf16 checkpoint's values: real F16 files are mostly converted from bf16
             * models, and every such value is exactly a bf16 (the bf16 kernel packs those losslessly) */
            for (int64_t i = 0; i < n0; i++) {
                uint16_t h = kvt_f32_to_f16(c->f16_full ? row[i] : kvt_bf16_to_f32(kvt_f32_to_bf16(row[i])));
                memcpy(out + 2 * i, &h, 2);
            }
        } else if (type == KVT_TYPE_BF16) {
            for (int64_t i = 0; i < n0; i++) {
                uint16_t h = kvt_f32_to_bf16(row[i]);
                memcpy(out + 2 * i, &h, 2);
            }
        } else {
            kvt_quantize_ref(type, row, out, n0);
        }
    }
    free(row);
    return KVT_OK;
}

static bool k_outlier_row(const gen_ctx *c, const char *name, int64_t r) {
    if (c->k_out <= 1.0f || c->head_dim == 0 || c->n_rot < 2 || !ends_with(name, "attn_k.weight")) return false;
    const uint32_t d = (uint32_t)(r % c->head_dim), nr = c->n_rot;
    return c->neox ? (d == nr / 2 - 1 || d == nr - 1) : (d == nr - 2 || d == nr - 1);
}

/* Weight type for a 2-D tensor with rows of n0 elements: the requested type, or llama-quantize's
 * fallback when the row is not a multiple of the block (Q4_K→Q5_0, then F16). */
uint32_t kvt_gen_model_pick_type(uint32_t want, int64_t n0) {
    uint32_t be = kvt_type_block_elems(want);
    if (be && n0 % be == 0) return want;
    if (want == KVT_TYPE_Q4_K && n0 % 32 == 0) return KVT_TYPE_Q5_0;
    if (want == KVT_TYPE_Q5_K && n0 % 32 == 0) return KVT_TYPE_Q5_1;
    if (want == KVT_TYPE_Q6_K && n0 % 32 == 0) return KVT_TYPE_Q8_0;
    return KVT_TYPE_F16;
}

/* ------------------------------------------------------------------ vocabulary */

/* The repository keeps its vocabularies in data/vocab; the binaries live in build/ (kvtier) and
 * build/tests/ (test suites), so the folder is found by walking up from the executable's own
 * directory — never from the working directory, so `kvtier` works wherever it is started. */
bool kvt_vocab_dir(char *buf, size_t buflen) {
    const char *env = getenv("KVT_VOCAB_DIR");
    if (env && *env) { /* explicit: used as given, no fallback behind the user's back */
        snprintf(buf, buflen, "%s", env);
        return access(buf, R_OK | X_OK) == 0;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        buf[0] = 0;
        return false;
    }
    exe[n] = 0;
    for (int up = 0; up < 3; up++) { /* <exe dir>/.., ../.., ../../.. */
        char *slash = strrchr(exe, '/');
        if (!slash) break;
        *slash = 0;
        int w = snprintf(buf, buflen, "%s/../data/vocab", exe);
        if (w > 0 && (size_t)w < buflen && access(buf, R_OK | X_OK) == 0) return true;
    }
    buf[0] = 0;
    return false;
}

/* Default vocabulary: ggml-vocab-gpt-2.gguf in kvt_vocab_dir(). Writes the path into buf and returns
 * true if it exists. */
static bool default_vocab(char *buf, size_t buflen) {
    char dir[4096];
    if (!kvt_vocab_dir(dir, sizeof dir)) {
        buf[0] = 0;
        return false;
    }
    int w = snprintf(buf, buflen, "%s/ggml-vocab-gpt-2.gguf", dir);
    if (w > 0 && (size_t)w < buflen && access(buf, R_OK) == 0) return true;
    buf[0] = 0;
    return false;
}

/* 256 byte tokens in GPT-2's byte-to-unicode alphabet, no merges. Returns n_vocab. */
static uint32_t write_byte_vocab(kvt_gguf_writer *w) {
    char tok[256][4];
    const char *ptrs[256];
    uint64_t lens[256];
    int32_t types[256];
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        uint32_t cp = direct ? (uint32_t)b : next++;
        if (cp < 0x80) {
            tok[b][0] = (char)cp;
            lens[b] = 1;
        } else { /* < 0x800: two UTF-8 bytes */
            tok[b][0] = (char)(0xc0 | (cp >> 6));
            tok[b][1] = (char)(0x80 | (cp & 0x3f));
            lens[b] = 2;
        }
        ptrs[b] = tok[b];
        types[b] = 1;
    }
    kvt_gguf_w_str(w, "tokenizer.ggml.model", "gpt2", 4);
    kvt_gguf_w_str(w, "tokenizer.ggml.pre", "default", 7);
    kvt_gguf_w_arr_str(w, "tokenizer.ggml.tokens", ptrs, lens, 256);
    kvt_gguf_w_arr(w, "tokenizer.ggml.token_type", KVT_GGUF_I32, types, 256);
    kvt_gguf_w_arr_str(w, "tokenizer.ggml.merges", NULL, NULL, 0);
    kvt_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 0);
    kvt_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 0);
    kvt_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
    return 256;
}

/* ------------------------------------------------------------------ model */

static int find_name(const char *const *list, const char *s) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return i;
    return -1;
}

kvt_status kvt_gen_model(const kvt_gen_model_opts *o, const char *out_path, char *err, size_t errlen) {
    const char *shape_name = o->shape ? o->shape : "tiny";
    const char *type_name = o->type ? o->type : "f16";
    int arch = -1;
    shape s;
    if (o->k_outliers == 1 || o->k_outliers > 64)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--k-outliers %u: the factor must be 2..64", o->k_outliers);
    if (o->arch) {
        for (int i = 0; i < A_COUNT; i++)
            if (!strcmp(o->arch, k_arch_names[i])) arch = i;
        if (arch < 0)
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                            "unknown arch '%s' (llama, qwen2, qwen3, gemma3, qwen35, qwen3moe, deepseek2)", o->arch);
    }
    if (!strcmp(shape_name, "tiny")) {
        if (arch < 0) arch = A_LLAMA;
        s = tiny_shape(arch);
    } else {
        int native;
        if (!named_shape(shape_name, &native, &s))
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                            "unknown shape '%s' (tiny, smol-135m, qwen3-0.6b, llama-1b, gemma3-1b, qwen35-0.8b, qwen35-2b, "
                            "qwen3moe-30b-a3b, deepseek2-lite)",
                            shape_name);
        if (arch < 0) arch = native;
        /* the MoE/MLA shapes carry their architecture's own tensors: no cross-arch mixing */
        const bool moe_shape_ = native == A_QWEN3MOE || native == A_DEEPSEEK2;
        if (moe_shape_ != (arch == A_QWEN3MOE || arch == A_DEEPSEEK2) || (moe_shape_ && arch != native))
            return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "shape '%s' is not available for arch '%s'", shape_name,
                            k_arch_names[arch]);
        /* another arch on a real shape: keep the dims, take the arch's own features */
        if (arch == A_GEMMA3 && !s.n_swa) s.n_swa = 512;
        if (arch != A_LLAMA) s.llama3_rope = false;
    }
    if (o->n_layers) {
        if (o->n_layers > 512) return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--layers %u out of range (1..512)", o->n_layers);
        s.n_layer = o->n_layers;
    }
    if (o->k_outliers && arch == A_DEEPSEEK2)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "--k-outliers needs separate K projections (attn_k); deepseek2 has latent attention");
    const moe_shape mo = moe_extras(arch, shape_name);
    if (mo.n_dense_lead >= s.n_layer && mo.n_expert)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "%s needs more than %u layers (its leading dense layers)",
                        k_arch_names[arch], mo.n_dense_lead);
    ssm_shape q35 = arch == A_QWEN35 ? qwen35_extras(shape_name, &s) : (ssm_shape){0, 0, 0, 0, 0, s.head_dim};
    if (arch == A_DEEPSEEK2) q35.n_rot = mo.d_rope;
    uint32_t wtype, ftype;
    /* same order as kvt_gen_model_types; ftype = llama.cpp's general.file_type (the _S/_M variant
     * mostly of that type: Q4_K_S, Q5_K_S) */
    static const struct { uint32_t type, ftype; } types[] = {
        {KVT_TYPE_F32, 0},  {KVT_TYPE_F16, 1},  {KVT_TYPE_BF16, 32}, {KVT_TYPE_Q8_0, 7},
        {KVT_TYPE_Q4_0, 2}, {KVT_TYPE_Q4_1, 3}, {KVT_TYPE_Q5_0, 8},  {KVT_TYPE_Q5_1, 9},
        {KVT_TYPE_Q4_K, 14}, {KVT_TYPE_Q5_K, 16}, {KVT_TYPE_Q6_K, 18},
    };
    int ti = find_name(kvt_gen_model_types, type_name);
    if (ti < 0)
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG,
                        "unknown type '%s' (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k)", type_name);
    wtype = types[ti].type;
    ftype = types[ti].ftype;
    const char *an = k_arch_names[arch];

    /* vocabulary first: n_vocab shapes the embedding */
    char vpath[4096];
    kvt_gguf *vocab = NULL;
    if (o->byte_vocab) {
        vpath[0] = 0;
    } else if (o->vocab_path) {
        snprintf(vpath, sizeof vpath, "%s", o->vocab_path);
    } else if (!default_vocab(vpath, sizeof vpath)) {
        const char *env = getenv("KVT_VOCAB_DIR");
        if (env && *env)
            return kvt_errf(err, errlen, KVT_ERR_NOT_FOUND, "no ggml-vocab-gpt-2.gguf in $KVT_VOCAB_DIR (%s)", env);
        return kvt_errf(err, errlen, KVT_ERR_NOT_FOUND,
                        "no vocabulary found (data/vocab/ggml-vocab-gpt-2.gguf beside the executable's folder); "
                        "pass --vocab FILE.gguf, set KVT_VOCAB_DIR, or --byte-vocab for a 256-token byte vocabulary");
    }
    if (vpath[0]) {
        kvt_status st = kvt_gguf_open(vpath, &vocab, err, errlen);
        if (st != KVT_OK) return st;
        kvt_gguf_vtype et;
        uint64_t n;
        if (!kvt_gguf_get_arr(vocab, "tokenizer.ggml.tokens", &et, &n, NULL) || et != KVT_GGUF_STRING || n == 0 ||
            n > (1u << 24)) {
            kvt_gguf_free(vocab);
            return kvt_errf(err, errlen, KVT_ERR_FORMAT, "%s: no usable tokenizer.ggml.tokens array", vpath);
        }
    }

    kvt_gguf_writer *w = kvt_gguf_writer_create();
    if (!w) {
        kvt_gguf_free(vocab);
        return kvt_errf(err, errlen, KVT_ERR_NOMEM, "out of memory");
    }
    char key[160], name[128];
#define K(suffix) (snprintf(key, sizeof key, "%s.%s", an, suffix), key)
    kvt_gguf_w_str(w, "general.architecture", an, strlen(an));
    char kout[32] = "";
    if (o->k_outliers > 1) snprintf(kout, sizeof kout, " k-outliers %u", o->k_outliers);
    snprintf(name, sizeof name, "kvtier random %s %s %s seed %llu%s%s%s", an, shape_name, type_name,
             (unsigned long long)o->seed, o->peaked ? " peaked" : "", kout, o->f16_full ? " f16-full" : "");
    kvt_gguf_w_str(w, "general.name", name, strlen(name));
    kvt_gguf_w_u32(w, "general.alignment", 32);
    kvt_gguf_w_u32(w, "general.file_type", ftype);
    kvt_gguf_w_u32(w, "general.quantization_version", 2);
    kvt_gguf_w_u32(w, K("context_length"), s.n_ctx);
    kvt_gguf_w_u32(w, K("embedding_length"), s.n_embd);
    kvt_gguf_w_u32(w, K("block_count"), s.n_layer);
    kvt_gguf_w_u32(w, K("feed_forward_length"), s.n_ff);
    kvt_gguf_w_u32(w, K("attention.head_count"), s.n_head);
    kvt_gguf_w_u32(w, K("attention.head_count_kv"), s.n_kv);
    kvt_gguf_w_u32(w, K("attention.key_length"), s.head_dim);
    kvt_gguf_w_u32(w, K("attention.value_length"), arch == A_DEEPSEEK2 ? mo.d_v : s.head_dim);
    if (arch != A_QWEN3MOE) /* real qwen3moe files have none: n_rot = key_length */
        kvt_gguf_w_u32(w, K("rope.dimension_count"), q35.n_rot);
    kvt_gguf_w_f32(w, K("rope.freq_base"), s.rope_base);
    kvt_gguf_w_f32(w, K("attention.layer_norm_rms_epsilon"), s.eps);
    if (mo.n_expert) { /* the key set of llama.cpp's converter (docs/models.md) */
        kvt_gguf_w_u32(w, K("expert_count"), mo.n_expert);
        kvt_gguf_w_u32(w, K("expert_used_count"), mo.n_used);
        kvt_gguf_w_u32(w, K("expert_feed_forward_length"), mo.n_ff_exp);
    }
    if (arch == A_DEEPSEEK2) {
        kvt_gguf_w_u32(w, K("leading_dense_block_count"), mo.n_dense_lead);
        kvt_gguf_w_u32(w, K("expert_shared_count"), mo.n_shared);
        kvt_gguf_w_f32(w, K("expert_weights_scale"), mo.scale);
        kvt_gguf_w_bool(w, K("expert_weights_norm"), mo.norm);
        kvt_gguf_w_u32(w, K("expert_gating_func"), mo.gating);
        if (mo.q_lora) kvt_gguf_w_u32(w, K("attention.q_lora_rank"), mo.q_lora);
        kvt_gguf_w_u32(w, K("attention.kv_lora_rank"), mo.kv_lora);
        kvt_gguf_w_str(w, K("rope.scaling.type"), "yarn", 4);
        kvt_gguf_w_f32(w, K("rope.scaling.factor"), mo.yarn_factor);
        kvt_gguf_w_u32(w, K("rope.scaling.original_context_length"), mo.yarn_orig);
        kvt_gguf_w_f32(w, K("rope.scaling.yarn_log_multiplier"), mo.yarn_log_mul);
    }
    if (arch == A_GEMMA3) kvt_gguf_w_u32(w, K("attention.sliding_window"), s.n_swa);
    if (arch == A_QWEN35) {
        const int32_t sect[4] = {11, 11, 10, 0};
        kvt_gguf_w_arr(w, K("rope.dimension_sections"), KVT_GGUF_I32, sect, 4);
        kvt_gguf_w_u32(w, K("full_attention_interval"), q35.interval);
        kvt_gguf_w_u32(w, K("ssm.conv_kernel"), q35.conv);
        kvt_gguf_w_u32(w, K("ssm.state_size"), q35.d);
        kvt_gguf_w_u32(w, K("ssm.group_count"), q35.hk);
        kvt_gguf_w_u32(w, K("ssm.time_step_rank"), q35.hv);
        kvt_gguf_w_u32(w, K("ssm.inner_size"), q35.hv * q35.d);
    }
    /* llama3 scaling lives in rope_freqs.weight only: a rope.scaling.factor key would tell readers
     * to apply linear scaling on top of it (that is what llama.cpp's converter does too) */

    uint32_t n_vocab;
    if (vocab) {
        for (int64_t i = 0; i < kvt_gguf_n_kv(vocab); i++) {
            const char *k = kvt_gguf_key_name(vocab, i);
            if (strncmp(k, "tokenizer.", 10) || !strncmp(k, "tokenizer.chat_template", 23)) continue;
            kvt_gguf_w_copy_kv(w, vocab, k);
        }
        uint64_t n;
        kvt_gguf_get_arr(vocab, "tokenizer.ggml.tokens", NULL, &n, NULL);
        n_vocab = (uint32_t)n;
    } else {
        n_vocab = write_byte_vocab(w);
    }
    const char *tmpl = arch == A_GEMMA3 ? k_tmpl_gemma
                     : arch == A_QWEN35 ? k_tmpl_qwen35
                     : arch == A_QWEN2 || arch == A_QWEN3 || arch == A_QWEN3MOE || arch == A_DEEPSEEK2 ? k_tmpl_chatml
                     : s.llama3_rope ? k_tmpl_llama3 : k_tmpl_smol;
    kvt_gguf_w_str(w, "tokenizer.chat_template", tmpl, strlen(tmpl));

    gen_ctx gc = {o->seed, s.rope_base, q35.n_rot, o->peaked, o->k_outliers > 1 ? (float)o->k_outliers : 1.0f,
                  s.head_dim, arch != A_LLAMA, o->f16_full};
    kvt_status st = KVT_OK;
    const uint32_t qd = s.n_head * s.head_dim, kvd = s.n_kv * s.head_dim;
#define T1(nm, n0) do { int64_t ne_[1] = {(n0)}; \
        if (st == KVT_OK) st = kvt_gguf_w_tensor_fill(w, nm, KVT_TYPE_F32, 1, ne_, fill_tensor, &gc); } while (0)
#define T2(nm, n0, n1) do { int64_t ne_[2] = {(n0), (n1)}; \
        if (st == KVT_OK) st = kvt_gguf_w_tensor_fill(w, nm, kvt_gen_model_pick_type(wtype, ne_[0]), 2, ne_, fill_tensor, &gc); } while (0)
#define T3(nm, n0, n1, n2) do { int64_t ne_[3] = {(n0), (n1), (n2)}; \
        if (st == KVT_OK) st = kvt_gguf_w_tensor_fill(w, nm, kvt_gen_model_pick_type(wtype, ne_[0]), 3, ne_, fill_tensor, &gc); } while (0)
    T2("token_embd.weight", s.n_embd, n_vocab);
    if (s.llama3_rope) T1("rope_freqs.weight", s.head_dim / 2);
    for (uint32_t il = 0; il < s.n_layer; il++) {
        char tn[96];
#define BLK(x) (snprintf(tn, sizeof tn, "blk.%u." x, il), tn)
        if (arch == A_QWEN35) { /* README "qwen35": gated attention every interval-th layer, else DeltaNet */
            const uint32_t kd = q35.hk * q35.d, vd = q35.hv * q35.d;
            T1(BLK("attn_norm.weight"), s.n_embd);
            T1(BLK("post_attention_norm.weight"), s.n_embd);
            if ((il + 1) % q35.interval == 0) {
                T2(BLK("attn_q.weight"), s.n_embd, 2 * qd);
                T2(BLK("attn_k.weight"), s.n_embd, kvd);
                T2(BLK("attn_v.weight"), s.n_embd, kvd);
                T1(BLK("attn_q_norm.weight"), s.head_dim);
                T1(BLK("attn_k_norm.weight"), s.head_dim);
                T2(BLK("attn_output.weight"), qd, s.n_embd);
            } else {
                int64_t ne_c[2] = {q35.conv, 2 * kd + vd};
                T2(BLK("attn_qkv.weight"), s.n_embd, 2 * kd + vd);
                T2(BLK("attn_gate.weight"), s.n_embd, vd);
                if (st == KVT_OK) st = kvt_gguf_w_tensor_fill(w, BLK("ssm_conv1d.weight"), KVT_TYPE_F32, 2, ne_c, fill_tensor, &gc);
                T2(BLK("ssm_beta.weight"), s.n_embd, q35.hv);
                T2(BLK("ssm_alpha.weight"), s.n_embd, q35.hv);
                T1(BLK("ssm_dt.bias"), q35.hv);
                T1(BLK("ssm_a"), q35.hv);
                T1(BLK("ssm_norm.weight"), q35.d);
                T2(BLK("ssm_out.weight"), vd, s.n_embd);
            }
            T2(BLK("ffn_gate.weight"), s.n_embd, s.n_ff);
            T2(BLK("ffn_up.weight"), s.n_embd, s.n_ff);
            T2(BLK("ffn_down.weight"), s.n_ff, s.n_embd);
            continue;
        }
        if (mo.n_expert) { /* qwen3moe / deepseek2 (docs/models.md lists the tensors) */
            T1(BLK("attn_norm.weight"), s.n_embd);
            if (arch == A_DEEPSEEK2) {
                const uint32_t dq = mo.d_nope + mo.d_rope;
                if (mo.q_lora) {
                    T2(BLK("attn_q_a.weight"), s.n_embd, mo.q_lora);
                    T1(BLK("attn_q_a_norm.weight"), mo.q_lora);
                    T2(BLK("attn_q_b.weight"), mo.q_lora, s.n_head * dq);
                } else {
                    T2(BLK("attn_q.weight"), s.n_embd, s.n_head * dq);
                }
                T2(BLK("attn_kv_a_mqa.weight"), s.n_embd, mo.kv_lora + mo.d_rope);
                T1(BLK("attn_kv_a_norm.weight"), mo.kv_lora);
                T2(BLK("attn_kv_b.weight"), mo.kv_lora, s.n_head * (mo.d_nope + mo.d_v));
                T2(BLK("attn_output.weight"), s.n_head * mo.d_v, s.n_embd);
            } else {
                T2(BLK("attn_q.weight"), s.n_embd, qd);
                T2(BLK("attn_k.weight"), s.n_embd, kvd);
                T2(BLK("attn_v.weight"), s.n_embd, kvd);
                T1(BLK("attn_q_norm.weight"), s.head_dim);
                T1(BLK("attn_k_norm.weight"), s.head_dim);
                T2(BLK("attn_output.weight"), qd, s.n_embd);
            }
            T1(BLK("ffn_norm.weight"), s.n_embd);
            if (il < mo.n_dense_lead) {
                T2(BLK("ffn_gate.weight"), s.n_embd, s.n_ff);
                T2(BLK("ffn_up.weight"), s.n_embd, s.n_ff);
                T2(BLK("ffn_down.weight"), s.n_ff, s.n_embd);
                continue;
            }
            /* the router stays f32 (llama-quantize never quantizes ffn_gate_inp) */
            int64_t ne_r[2] = {s.n_embd, mo.n_expert};
            if (st == KVT_OK) st = kvt_gguf_w_tensor_fill(w, BLK("ffn_gate_inp.weight"), KVT_TYPE_F32, 2, ne_r, fill_tensor, &gc);
            if (mo.bias) T1(BLK("exp_probs_b.bias"), mo.n_expert);
            T3(BLK("ffn_gate_exps.weight"), s.n_embd, mo.n_ff_exp, mo.n_expert);
            T3(BLK("ffn_up_exps.weight"), s.n_embd, mo.n_ff_exp, mo.n_expert);
            T3(BLK("ffn_down_exps.weight"), mo.n_ff_exp, s.n_embd, mo.n_expert);
            if (mo.n_shared) {
                T2(BLK("ffn_gate_shexp.weight"), s.n_embd, mo.n_ff_exp * mo.n_shared);
                T2(BLK("ffn_up_shexp.weight"), s.n_embd, mo.n_ff_exp * mo.n_shared);
                T2(BLK("ffn_down_shexp.weight"), mo.n_ff_exp * mo.n_shared, s.n_embd);
            }
            continue;
        }
        T1(BLK("attn_norm.weight"), s.n_embd);
        T2(BLK("attn_q.weight"), s.n_embd, qd);
        T2(BLK("attn_k.weight"), s.n_embd, kvd);
        T2(BLK("attn_v.weight"), s.n_embd, kvd);
        if (arch == A_QWEN2) {
            T1(BLK("attn_q.bias"), qd);
            T1(BLK("attn_k.bias"), kvd);
            T1(BLK("attn_v.bias"), kvd);
        }
        if (arch == A_QWEN3 || arch == A_GEMMA3) {
            T1(BLK("attn_q_norm.weight"), s.head_dim);
            T1(BLK("attn_k_norm.weight"), s.head_dim);
        }
        T2(BLK("attn_output.weight"), qd, s.n_embd);
        if (arch == A_GEMMA3) T1(BLK("post_attention_norm.weight"), s.n_embd);
        T1(BLK("ffn_norm.weight"), s.n_embd);
        T2(BLK("ffn_gate.weight"), s.n_embd, s.n_ff);
        T2(BLK("ffn_up.weight"), s.n_embd, s.n_ff);
        T2(BLK("ffn_down.weight"), s.n_ff, s.n_embd);
        if (arch == A_GEMMA3) T1(BLK("post_ffw_norm.weight"), s.n_embd);
#undef BLK
    }
    T1("output_norm.weight", s.n_embd);
    if (!s.tied) T2("output.weight", s.n_embd, n_vocab);
#undef T1
#undef T2
#undef T3
#undef K
    if (st != KVT_OK) {
        kvt_errf(err, errlen, st, "gen-model: cannot add tensors (%s)", kvt_status_str(st));
    } else {
        st = kvt_gguf_writer_finish(w, out_path, err, errlen);
    }
    kvt_gguf_writer_free(w);
    kvt_gguf_free(vocab);
    return st;
}
