/* cmd_demo.c — `kvtier demo`, the `make run` main job: serves a model (default: the trained demo
 * model in data/models/, docs/models.md) with the RAM tier and an SSD tier in ./kvtier-cache, after printing how to talk to it. Any
 * extra flags are passed to `kvtier serve`. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmds.h"

int cmd_demo(int argc, char **argv) {
    const char *model = "data/models/kjv-target-q8_0.gguf";
    const char *port = "8080";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvtier demo [-m MODEL] [serve flags]\n\n"
                   "Starts `kvtier serve` on MODEL (default data/models/kjv-target-q8_0.gguf, the 15.7M-parameter\n"
                   "llama trained on the King James Bible by scripts/train-models) with\n"
                   "--prompt-cache 2 --ssd-cache ./kvtier-cache on 127.0.0.1:8080 (override with --port).\n");
            return 0;
        }
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) model = argv[i + 1];
        if (!strcmp(argv[i], "--port") && i + 1 < argc) port = argv[i + 1];
    }
    const char *fixed[] = {"serve", "--prompt-cache", "2", "--ssd-cache", "kvtier-cache"};
    size_t nf = sizeof fixed / sizeof fixed[0];
    bool has_model = false, has_port = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) has_model = true;
        if (!strcmp(argv[i], "--port")) has_port = true;
    }
    char **av = calloc(nf + (size_t)argc + 8, sizeof *av);
    if (!av) return 1;
    int n = 0;
    for (size_t i = 0; i < nf; i++) av[n++] = (char *)fixed[i];
    if (!has_model) {
        av[n++] = "-m";
        av[n++] = (char *)model;
    }
    if (!has_port) {
        av[n++] = "--port";
        av[n++] = (char *)port;
    }
    for (int i = 1; i < argc; i++) av[n++] = argv[i];
    printf("kvtier demo: serving %s on http://127.0.0.1:%s (RAM tier 2 GB, SSD tier ./kvtier-cache)\n"
           "  open http://127.0.0.1:%s/ in a browser to chat (what the cache reused is shown under each reply),\n"
           "       http://127.0.0.1:%s/dashboard to watch the tiers\n"
           "  or:   curl -s http://127.0.0.1:%s/v1/chat/completions -H 'Content-Type: application/json' \\\n"
           "          -d '{\"messages\":[{\"role\":\"user\",\"content\":\"And God said, Let there be light.\"}],\"max_tokens\":48}'\n"
           "        curl -s http://127.0.0.1:%s/stats\n"
           "  (the default model is a 15.7M-parameter llama trained here on the King James Bible for an hour\n"
           "   of CPU: it answers in KJV-like verse, a small model's sense; data/models/README.md says how it was made)\n"
           "  Ctrl-C flushes the SSD tier and exits; the next start reuses what was flushed.\n",
           model, port, port, port, port, port);
    fflush(stdout);
    int rc = cmd_serve(n, av);
    free(av);
    return rc;
}
