/* cmd_gen_model.c — `kvtier gen-model`: write a deterministic random-weight GGUF (model/gen_model.h). */
#include <stdio.h>
#include <string.h>

#include "../model/gen_model.h"
#include "args.h"
#include "cmds.h"

static void usage(void) {
    printf("usage: kvtier gen-model [--arch ARCH] [--shape SHAPE] [--type TYPE] [--layers N] [--vocab FILE.gguf | --byte-vocab] [--seed N] [--peaked] [--k-outliers F] [--f16-full] -o OUT.gguf\n"
           "\n"
           "Writes a GGUF model with deterministic random weights (same arguments give the same bytes).\n"
           "  --arch   llama | qwen2 | qwen3 | gemma3 | qwen35 | qwen3moe | deepseek2\n"
           "           (default: the shape's own arch; llama for tiny)\n"
           "  --shape  tiny | smol-135m | qwen3-0.6b | llama-1b | gemma3-1b | qwen35-0.8b | qwen35-2b |\n"
           "           qwen3moe-30b-a3b | deepseek2-lite   (default tiny; the qwen35 shapes are Qwen3.5-like\n"
           "           hybrid layer shapes; qwen3moe-30b-a3b has Qwen3-30B-A3B's layer shapes (128 experts,\n"
           "           8 used) and deepseek2-lite DeepSeek-V2-Lite's (MLA 512+64, 64 experts, 6 used, 2 shared,\n"
           "           1 leading dense layer), each with 4 layers unless --layers says otherwise)\n"
           "  --type   f16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k | q5_k | q6_k | f32 | bf16   (default f16;\n"
           "           1-D tensors and MoE routers stay f32; k-quant rows not a multiple of 256 fall back\n"
           "           to q5_0/q5_1/q8_0, like llama-quantize)\n"
           "  --layers N  this many layers instead of the shape's own count (1..512)\n"
           "  --vocab  vocabulary GGUF whose tokenizer.* keys are copied (default: ggml-vocab-gpt-2.gguf\n"
           "           in $KVT_VOCAB_DIR if set, else in the repository's data/vocab/ found from the\n"
           "           executable's location; an error if it is missing)\n"
           "  --byte-vocab  a 256-token byte vocabulary instead (BOS = EOS = token 0; for tests)\n"
           "  --seed   PRNG seed (default 0)\n"
           "  --peaked logits and attention as peaked as a trained model's (final norm x8, Q/K x2; MLA q, k_pe,\n"
           "           k_nope/v x2): makes KV-codec quality figures (kvtier bench --kv-quality) meaningful\n"
           "  --k-outliers F  key outlier channels, as trained models have: the K projection rows of each KV\n"
           "           head's lowest-frequency RoPE pair x F (2..64); values unchanged. For KV-codec quality\n"
           "           figures on outlier-heavy keys (the case rotation-based codecs such as turbo are for)\n"
           "  --f16-full  F16 tensors at full f16 precision. Default: the values of a bf16 checkpoint (each\n"
           "           exactly a bf16), as an F16 file converted from a bf16 Hugging Face model holds; the\n"
           "           bf16 kernel (AVX-512 BF16) takes only such matrices, others keep the f32 path\n"
           "  -o, --output  output path (written atomically)\n");
}

static bool in_list(const char *const *list, const char *s) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

int cmd_gen_model(int argc, char **argv) {
    kvt_gen_model_opts o = {0};
    const char *out = NULL;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "gen-model", usage);
    while (kvt_args_next(&a)) {
        if (kvt_args_is(&a, NULL, "--arch")) o.arch = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--shape")) o.shape = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--type")) o.type = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--vocab")) o.vocab_path = kvt_args_str(&a);
        else if (kvt_args_flag(&a, NULL, "--byte-vocab")) o.byte_vocab = true;
        else if (kvt_args_is(&a, NULL, "--layers")) o.n_layers = (uint32_t)kvt_args_i64(&a, 1, 512);
        else if (kvt_args_is(&a, NULL, "--seed")) o.seed = (uint64_t)kvt_args_i64(&a, 0, INT64_MAX);
        else if (kvt_args_flag(&a, NULL, "--peaked")) o.peaked = true;
        else if (kvt_args_is(&a, NULL, "--k-outliers")) o.k_outliers = (uint32_t)kvt_args_i64(&a, 2, 64);
        else if (kvt_args_flag(&a, NULL, "--f16-full")) o.f16_full = true;
        else if (kvt_args_is(&a, "-o", "--output")) out = kvt_args_str(&a);
        else kvt_args_unknown(&a);
    }
    if (a.failed) return 2;
    if (a.help) return 0;
    const char *bad = NULL, *what = NULL;
    if (o.arch && !in_list(kvt_gen_model_archs, o.arch)) bad = o.arch, what = "arch";
    else if (o.shape && !in_list(kvt_gen_model_shapes, o.shape)) bad = o.shape, what = "shape";
    else if (o.type && !in_list(kvt_gen_model_types, o.type)) bad = o.type, what = "type";
    if (bad) {
        fprintf(stderr, "kvtier gen-model: unknown %s '%s' (see kvtier gen-model --help)\n", what, bad);
        return 2;
    }
    if (o.byte_vocab && o.vocab_path) {
        fprintf(stderr, "kvtier gen-model: --vocab and --byte-vocab exclude each other\n");
        return 2;
    }
    if (a.n_positional > 0) {
        fprintf(stderr, "kvtier gen-model: unexpected argument '%s' (see kvtier gen-model --help)\n", a.positional[0]);
        return 2;
    }
    if (!out) {
        fprintf(stderr, "kvtier gen-model: -o OUT.gguf is required (see kvtier gen-model --help)\n");
        return 2;
    }
    char err[512];
    kvt_status st = kvt_gen_model(&o, out, err, sizeof err);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier gen-model: %s\n", err);
        return 1;
    }
    return 0;
}
