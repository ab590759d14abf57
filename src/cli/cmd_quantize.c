/* cmd_quantize.c — `kvtier quantize`: rewrite a GGUF model's weights in another type (model/quantize.h). */
#include <stdio.h>
#include <string.h>

#include "../model/quantize.h"
#include "args.h"
#include "cmds.h"

static void usage(void) {
    printf("usage: kvtier quantize IN.gguf OUT.gguf --type TYPE [--allow-requantize] [--quiet]\n"
           "\n"
           "Rewrites a model's weight matrices in another type, as llama.cpp's llama-quantize does, so a\n"
           "trained F16/BF16/F32 file can be served smaller. Norms, biases, MoE routers, recurrent-layer\n"
           "parameters and RoPE tables stay as they are; every metadata key is kept (general.file_type is\n"
           "set to the result's id).\n"
           "  --type  f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k | q5_k | q6_k |\n"
           "          q4_k_m | q5_k_m\n"
           "          k-quant rows not a multiple of 256 fall back to q5_0/q5_1/q8_0 (llama-quantize's rule).\n"
           "          The _m mixes follow llama-quantize: output.weight in q6_k, and attn_v / ffn_down in q6_k\n"
           "          on the first and last eighth of the layers and every third layer between.\n"
           "          Values are quantized with plain per-block min/max (absmax) scales, not\n"
           "          llama-quantize's error-weighted search: at 4 bits perplexity can be a little higher.\n"
           "  --allow-requantize  accept already quantized input tensors (dequantized, then quantized\n"
           "          again: the errors add up); without it such an input is refused\n"
           "  --quiet  no line per tensor (the summary line is still printed)\n"
           "OUT.gguf is written atomically: nothing is left behind if anything fails.\n");
}

int cmd_quantize(int argc, char **argv) {
    kvt_quantize_opts o = {.progress = stderr};
    kvt_args a;
    kvt_args_init(&a, argc, argv, "quantize", usage);
    while (kvt_args_next(&a)) {
        if (kvt_args_is(&a, "-t", "--type")) o.type = kvt_args_str(&a);
        else if (kvt_args_flag(&a, NULL, "--allow-requantize")) o.allow_requantize = true;
        else if (kvt_args_flag(&a, "-q", "--quiet")) o.progress = NULL;
        else kvt_args_unknown(&a);
    }
    if (a.failed) return 2;
    if (a.help) return 0;
    if (a.n_positional != 2) {
        fprintf(stderr, "kvtier quantize: expected IN.gguf OUT.gguf (see kvtier quantize --help)\n");
        return 2;
    }
    if (!o.type) {
        fprintf(stderr, "kvtier quantize: --type is required (see kvtier quantize --help)\n");
        return 2;
    }
    bool known = false;
    for (int i = 0; kvt_quantize_types[i]; i++) known |= !strcmp(kvt_quantize_types[i], o.type);
    if (!known) {
        fprintf(stderr, "kvtier quantize: unknown type '%s' (see kvtier quantize --help)\n", o.type);
        return 2;
    }
    const char *in = a.positional[0], *out = a.positional[1];
    char err[512];
    kvt_quantize_result r;
    kvt_status st = kvt_quantize_model(&o, in, out, &r, err, sizeof err);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier quantize: %s\n", err);
        return 1;
    }
    char bi[32], bo[32];
    kvt_fmt_bytes((double)r.bytes_in, bi, sizeof bi);
    kvt_fmt_bytes((double)r.bytes_out, bo, sizeof bo);
    fprintf(stderr, "kvtier quantize: %s -> %s (%s): %llu tensors, %llu converted (%llu by the row-length fallback), %s -> %s\n",
            in, out, o.type, (unsigned long long)r.n_tensors, (unsigned long long)r.n_converted,
            (unsigned long long)r.n_fallback, bi, bo);
    return 0;
}
