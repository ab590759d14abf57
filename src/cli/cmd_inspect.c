/* cmd_inspect.c — `kvtier inspect MODEL`: architecture, hyperparameters, tensor types and sizes,
 * tokenizer, chat template family and f16 KV bytes per token, straight from the GGUF metadata (it
 * does not need the model loader, so it also describes files the engine would reject). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../gguf/gguf.h"
#include "../kernels/quant.h"
#include "args.h"
#include "cmds.h"

static void usage(void) {
    printf("usage: kvtier inspect [--json] MODEL.gguf\n"
           "\n"
           "Prints the architecture, hyperparameters, tensor count with per-type counts and bytes, the\n"
           "tokenizer, the chat template family and the KV cache bytes per token at f16.\n"
           "  --json   machine-readable output\n");
}

static const char *human(uint64_t b, char *buf, size_t n) {
    if (b >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", (double)b / (1ull << 30));
    else if (b >= (1ull << 20)) snprintf(buf, n, "%.2f MiB", (double)b / (1ull << 20));
    else if (b >= 1024) snprintf(buf, n, "%.1f KiB", (double)b / 1024);
    else snprintf(buf, n, "%llu B", (unsigned long long)b);
    return buf;
}

/* Copies a metadata string into buf (NUL-terminated, truncated), or "" if absent. */
static const char *str_key(const kvt_gguf *g, const char *key, char *buf, size_t n) {
    const char *s;
    uint64_t len;
    buf[0] = 0;
    if (kvt_gguf_get_str(g, key, &s, &len)) {
        size_t k = len < n - 1 ? (size_t)len : n - 1;
        memcpy(buf, s, k);
        buf[k] = 0;
        for (size_t i = 0; i < k; i++)
            if ((unsigned char)buf[i] < 0x20) buf[i] = ' ';
    }
    return buf;
}

/* u32 hparam, accepting a per-layer array (first element reported). */
static bool hp_u32(const kvt_gguf *g, const char *arch, const char *suffix, uint32_t *out) {
    char key[192];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (kvt_gguf_get_u32(g, key, out)) return true;
    int64_t v;
    if (kvt_gguf_get_arr_i64(g, key, 0, &v) && v >= 0 && v <= UINT32_MAX) {
        *out = (uint32_t)v;
        return true;
    }
    return false;
}

static const char *template_family(const kvt_gguf *g) {
    const char *s;
    uint64_t len;
    if (!kvt_gguf_get_str(g, "tokenizer.chat_template", &s, &len)) return "none";
    char *t = strndup(s, (size_t)len);
    if (!t) return "unknown";
    const char *fam = "unknown";
    if (!strcmp(t, "chatml") || !strcmp(t, "llama3") || !strcmp(t, "gemma")) fam = !strcmp(t, "chatml") ? "chatml" : !strcmp(t, "llama3") ? "llama3" : "gemma";
    else if (strstr(t, "<|im_start|>")) fam = "chatml";
    else if (strstr(t, "[INST]")) fam = "llama2/mistral";
    else if (strstr(t, "<start_of_turn>")) fam = "gemma";
    else if (strstr(t, "<|start_header_id|>") && strstr(t, "<|end_header_id|>")) fam = "llama3";
    free(t);
    return fam;
}

int cmd_inspect(int argc, char **argv) {
    bool json = false;
    const char *path = NULL;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "inspect", usage);
    while (kvt_args_next(&a)) {
        if (kvt_args_flag(&a, NULL, "--json")) json = true;
        else if (kvt_args_is(&a, "-m", "--model")) path = kvt_args_str(&a);
        else kvt_args_unknown(&a);
    }
    if (a.failed) return 2;
    if (a.help) return 0;
    if (!path && a.n_positional == 1) path = a.positional[0];
    if (!path || a.n_positional > 1) {
        fprintf(stderr, "kvtier inspect: expected one MODEL.gguf argument (see kvtier inspect --help)\n");
        return 2;
    }
    kvt_gguf *g;
    char err[512];
    if (kvt_gguf_open(path, &g, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier inspect: %s\n", err);
        return 1;
    }

    char arch[64], name[128], tok_model[64], tok_pre[64], hb[32], hb2[32];
    str_key(g, "general.architecture", arch, sizeof arch);
    str_key(g, "general.name", name, sizeof name);
    str_key(g, "tokenizer.ggml.model", tok_model, sizeof tok_model);
    str_key(g, "tokenizer.ggml.pre", tok_pre, sizeof tok_pre);
    uint64_t n_vocab = 0;
    kvt_gguf_get_arr(g, "tokenizer.ggml.tokens", NULL, &n_vocab, NULL);
    uint32_t n_ctx = 0, n_embd = 0, n_layer = 0, n_ff = 0, n_head = 0, n_kv = 0, k_len = 0, v_len = 0, n_rot = 0,
             n_swa = 0;
    float rope_base = 10000.0f, eps = 0.0f;
    if (arch[0]) {
        char key[160];
        hp_u32(g, arch, "context_length", &n_ctx);
        hp_u32(g, arch, "embedding_length", &n_embd);
        hp_u32(g, arch, "block_count", &n_layer);
        hp_u32(g, arch, "feed_forward_length", &n_ff);
        hp_u32(g, arch, "attention.head_count", &n_head);
        if (!hp_u32(g, arch, "attention.head_count_kv", &n_kv)) n_kv = n_head;
        if (!hp_u32(g, arch, "attention.key_length", &k_len)) k_len = n_head ? n_embd / n_head : 0;
        if (!hp_u32(g, arch, "attention.value_length", &v_len)) v_len = k_len;
        if (!hp_u32(g, arch, "rope.dimension_count", &n_rot)) n_rot = k_len;
        hp_u32(g, arch, "attention.sliding_window", &n_swa);
        snprintf(key, sizeof key, "%s.rope.freq_base", arch);
        kvt_gguf_get_f32(g, key, &rope_base);
        snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
        kvt_gguf_get_f32(g, key, &eps);
        uint32_t vs;
        if (!n_vocab && hp_u32(g, arch, "vocab_size", &vs)) n_vocab = vs;
    }
    int32_t bos = -1, eos = -1;
    uint32_t u;
    if (kvt_gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &u)) bos = (int32_t)u;
    if (kvt_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u)) eos = (int32_t)u;

    /* tensors by type */
    uint64_t cnt[KVT_TYPE_COUNT] = {0}, bytes[KVT_TYPE_COUNT] = {0}, total = 0, params = 0;
    int64_t nt = kvt_gguf_n_tensors(g);
    for (int64_t i = 0; i < nt; i++) {
        const kvt_gguf_tensor *t = kvt_gguf_tensor_at(g, i);
        if (t->type < KVT_TYPE_COUNT) {
            cnt[t->type]++;
            bytes[t->type] += t->nbytes;
        }
        total += t->nbytes;
        params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
    }
    /* KV bytes per token at f16: K and V per layer */
    /* the values are untrusted: saturate instead of wrapping */
    uint64_t per_layer = 0, kv_tok = 0, kv_tok_global = 0;
    if (!kvt_mul_ok((uint64_t)n_kv, (uint64_t)k_len + v_len, &per_layer) || !kvt_mul_ok(per_layer, 2, &per_layer))
        per_layer = UINT64_MAX;
    /* deepseek2 caches the MLA latent: kv_lora_rank + the decoupled RoPE key, one row per layer */
    uint32_t kv_lora = 0;
    const bool mla = !strcmp(arch, "deepseek2") && hp_u32(g, arch, "attention.kv_lora_rank", &kv_lora);
    if (mla) per_layer = ((uint64_t)kv_lora + n_rot) * 2;
    uint32_t n_windowed = 0;
    if (!strcmp(arch, "gemma3") && n_swa) /* layer il is windowed iff il % 6 < 5 */
        n_windowed = n_layer / 6 * 5 + KVT_MIN(n_layer % 6, 5u);
    uint32_t n_kv_layers = n_layer; /* qwen35: only every full_attention_interval-th layer has KV */
    if (!strcmp(arch, "qwen35")) {
        uint32_t iv = 4;
        if (!kvt_gguf_get_u32(g, "qwen35.full_attention_interval", &iv) || iv == 0) iv = 4;
        n_kv_layers = n_layer / iv;
    }
    if (!kvt_mul_ok(per_layer, n_kv_layers, &kv_tok)) kv_tok = UINT64_MAX;
    if (!kvt_mul_ok(per_layer, n_layer - n_windowed, &kv_tok_global)) kv_tok_global = UINT64_MAX;
    const char *fam = template_family(g);

    if (json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "file", path);
        cJSON_AddNumberToObject(j, "file_bytes", (double)kvt_gguf_file_size(g));
        cJSON_AddNumberToObject(j, "gguf_version", kvt_gguf_version(g));
        cJSON_AddStringToObject(j, "architecture", arch);
        cJSON_AddStringToObject(j, "name", name);
        cJSON *h = cJSON_AddObjectToObject(j, "hparams");
        cJSON_AddNumberToObject(h, "n_vocab", (double)n_vocab);
        cJSON_AddNumberToObject(h, "n_ctx_train", n_ctx);
        cJSON_AddNumberToObject(h, "n_embd", n_embd);
        cJSON_AddNumberToObject(h, "n_layer", n_layer);
        cJSON_AddNumberToObject(h, "n_head", n_head);
        cJSON_AddNumberToObject(h, "n_head_kv", n_kv);
        cJSON_AddNumberToObject(h, "head_dim", k_len);
        cJSON_AddNumberToObject(h, "n_ff", n_ff);
        cJSON_AddNumberToObject(h, "n_rot", n_rot);
        cJSON_AddNumberToObject(h, "rope_base", rope_base);
        cJSON_AddNumberToObject(h, "norm_eps", eps);
        cJSON_AddNumberToObject(h, "n_swa", n_swa);
        cJSON *tj = cJSON_AddObjectToObject(j, "tensors");
        cJSON_AddNumberToObject(tj, "count", (double)nt);
        cJSON_AddNumberToObject(tj, "bytes", (double)total);
        cJSON_AddNumberToObject(tj, "params", (double)params);
        cJSON *bt = cJSON_AddObjectToObject(tj, "by_type");
        for (uint32_t t = 0; t < KVT_TYPE_COUNT; t++) {
            if (!cnt[t]) continue;
            cJSON *e = cJSON_AddObjectToObject(bt, kvt_type_name(t));
            cJSON_AddNumberToObject(e, "count", (double)cnt[t]);
            cJSON_AddNumberToObject(e, "bytes", (double)bytes[t]);
        }
        cJSON *tk = cJSON_AddObjectToObject(j, "tokenizer");
        cJSON_AddStringToObject(tk, "model", tok_model);
        cJSON_AddStringToObject(tk, "pre", tok_pre);
        cJSON_AddNumberToObject(tk, "n_vocab", (double)n_vocab);
        cJSON_AddNumberToObject(tk, "bos", bos);
        cJSON_AddNumberToObject(tk, "eos", eos);
        cJSON_AddStringToObject(j, "chat_template", fam);
        cJSON_AddNumberToObject(j, "kv_bytes_per_token_f16", (double)kv_tok);
        if (n_windowed) {
            cJSON_AddNumberToObject(j, "windowed_layers", n_windowed);
            cJSON_AddNumberToObject(j, "kv_bytes_per_token_f16_global_layers", (double)kv_tok_global);
        }
        char *s = cJSON_Print(j);
        if (s) puts(s);
        free(s);
        cJSON_Delete(j);
    } else {
        printf("file:          %s (%s, GGUF v%u, alignment %u)\n", path, human(kvt_gguf_file_size(g), hb, sizeof hb),
               kvt_gguf_version(g), kvt_gguf_alignment(g));
        printf("architecture:  %s\n", arch[0] ? arch : "(none)");
        printf("name:          %s\n", name[0] ? name : "(none)");
        if (arch[0]) {
            printf("hparams:       n_vocab %llu  n_ctx_train %u  n_embd %u  n_layer %u  n_head %u  n_head_kv %u\n",
                   (unsigned long long)n_vocab, n_ctx, n_embd, n_layer, n_head, n_kv);
            printf("               head_dim %u  n_ff %u  n_rot %u  rope_base %g  norm_eps %g", k_len, n_ff, n_rot,
                   rope_base, eps);
            if (n_swa) printf("  n_swa %u", n_swa);
            if (kvt_gguf_find_tensor(g, "rope_freqs.weight")) printf("  rope_freqs");
            printf("  output %s\n", kvt_gguf_find_tensor(g, "output.weight") ? "untied" : "tied");
        }
        printf("tensors:       %lld (%s, %.1f M params)\n", (long long)nt, human(total, hb, sizeof hb),
               (double)params / 1e6);
        for (uint32_t t = 0; t < KVT_TYPE_COUNT; t++)
            if (cnt[t])
                printf("  %-8s     %5llu tensors  %s\n", kvt_type_name(t), (unsigned long long)cnt[t],
                       human(bytes[t], hb2, sizeof hb2));
        printf("tokenizer:     %s (pre %s), vocab %llu, bos %d, eos %d\n", tok_model[0] ? tok_model : "(none)",
               tok_pre[0] ? tok_pre : "(none)", (unsigned long long)n_vocab, bos, eos);
        printf("chat template: %s\n", fam);
        if (arch[0]) {
            printf("kv per token:  %llu bytes at f16 (%s; %s)\n", (unsigned long long)kv_tok, human(kv_tok, hb, sizeof hb),
                   mla ? "MLA latent: n_layer x (kv_lora_rank + rope dims) x 2 bytes"
                       : "n_layer x n_head_kv x (k+v head_dim) x 2 bytes");
            if (n_windowed)
                printf("               %u of %u layers are windowed (n_swa %u): past %u tokens they stop growing;"
                       " the %u global layers take %llu bytes per token\n",
                       n_windowed, n_layer, n_swa, n_swa, n_layer - n_windowed, (unsigned long long)kv_tok_global);
        }
    }
    kvt_gguf_free(g);
    return 0;
}
