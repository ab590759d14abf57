/* main.c — `kvtier` command-line entry: dispatches to a subcommand (cmds.h). */
#include <stdio.h>
#include <string.h>

#include "cmds.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} k_cmds[] = {
    {"serve", cmd_serve, "OpenAI-compatible HTTP server with RAM and SSD KV tiers"},
    {"run", cmd_run, "generate from a prompt (text or token ids) and print timings"},
    {"chat", cmd_chat, "interactive multi-turn chat in the terminal"},
    {"perplexity", cmd_perplexity, "perplexity over a text file (llama-perplexity's method)"},
    {"bench", cmd_bench, "prefill/decode throughput (llama-bench style)"},
    {"inspect", cmd_inspect, "show a GGUF model's architecture, tensors and KV bytes per token"},
    {"tokenize", cmd_tokenize, "tokenize text with a model's tokenizer"},
    {"quantize", cmd_quantize, "rewrite a GGUF model's weights in another type (llama-quantize)"},
    {"gen-model", cmd_gen_model, "write a deterministic random-weight GGUF model"},
    {"template", cmd_template, "render a chat template over JSON messages (debug templates)"},
    {"cache", cmd_cache, "list, inspect, verify or prune an SSD cache directory"},
    {"demo", cmd_demo, "the `make run` main job: serve the demo model with RAM+SSD tiers"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: kvtier <command> [options]   (kvtier <command> --help for details)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        fprintf(f, "  %-10s %s\n", k_cmds[i].name, k_cmds[i].help);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvtier: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
