/* engine_flags.c — see engine_flags.h. */
#include "engine_flags.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/budget.h"
#include "../model/model.h"

/* which SSD sub-flags were given (to warn when --ssd-cache is absent) */
static int g_ssd_subflags;
/* --memory-budget was given (else kvt_engine_flags_check makes it auto) */
static bool g_memory_budget_given;
/* a --draft-* tuning flag was given (an error without --draft-model) */
static bool g_draft_subflags;

const char kvt_engine_flags_help[] =
    "model and cache options:\n"
    "  -m, --model FILE          GGUF model (required)\n"
    "  -t, --threads N           compute threads (default: number of cores)\n"
    "  -c, --ctx N               context length in tokens (default: min(model, 8192))\n"
    "      --ubatch N            prefill chunk size (default 512); also the tokens of one batched step\n"
    "      --parallel N          rows batched into one forward pass per step (continuous batching;\n"
    "                            default 4 for serve, 1 otherwise; 1 = one request at a time)\n"
    "      --batch-queue N       requests waiting for a row or KV memory before a 503 (default 64)\n"
    "      --block-tokens N      KV block size in tokens (default 256)\n"
    "      --kv-quant MODE       off | 8 | 4 | turbo[:k<b>v<b>] | config (config reads kv_config.json\n"
    "                            beside the model); turbo = TurboQuant k8v3, keys 2,4,5,8 / values 2,3,4,5,8 bits\n"
    "      --kv-quant-group N    affine group size along head_dim: 32, 64, 128 (default: largest dividing head_dim)\n"
    "      --kv-quant-start N    tokens kept in f16 before quantized blocks start (default 0)\n"
    "      --kv-bf16             store unquantized KV as bf16 instead of f16\n"
    "      --mla-prefill MODE    deepseek2 prefill attention: absorbed (default; a cache hit equals a cold\n"
    "                            run bit for bit) | expanded (expand the latents to per-head K/V per chunk)\n"
    "                            | auto (the cheaper per chunk); expanded/auto are equal to cold only\n"
    "                            within tolerance and use their own cache key (docs/models.md)\n"
    "      --memory-budget SIZE|auto|off  memory the process may use: model weights, weight copies, compute\n"
    "                            buffers, the SSD spill queue, text buffers and the KV pool (live rows + RAM\n"
    "                            tier) are split from it and startup logs the split (default auto:\n"
    "                            MemAvailable and the cgroup limit, less max(10%, 256 MiB)); SIZE: 8G, 512M,\n"
    "                            1.5GiB or bytes; off: no budget (pool = one context per row + --prompt-cache)\n"
    "      --kv-pool-gb GB       KV block pool budget (default: one context per row + the prompt cache,\n"
    "                            within the memory budget; a value that does not fit it is an error)\n"
    "      --prompt-cache GB     RAM tier byte cap (default 8, or what the memory budget leaves; 0 disables)\n"
    "      --pin-budget-mb MB    RAM the pinned prefixes may hold together (POST /v1/cache/pin; default\n"
    "                            1024, at most half the RAM tier); a pin over it is refused (409)\n"
    "      --snapshot-min-tokens N  register the prompt-only prefix for cold prefills of at least N tokens (default 1024)\n"
    "      --recurrent-snapshot-every N  hybrid models: state snapshot every N prompt tokens, whole blocks (default 1024, 0 = off)\n"
    "      --ssd-cache DIR       SSD tier directory (off unless set; needs the RAM tier)\n"
    "      --ssd-cache-max GB    SSD tier byte cap (default 0 = unlimited)\n"
    "      --ssd-demote-idle SEC move RAM entries idle this long to SSD (default 300; 0 off)\n"
    "      --ssd-writeback on|off persist blocks shortly after they fill (default on)\n"
    "      --ssd-cache-verify    re-verify every payload checksum at startup (restore always checks)\n"
    "      --ssd-spill-queue-mb MB  bytes queued for the SSD writer at most (default 256); when full, a block\n"
    "                            stays dirty in RAM and is written later (counted as dropped)\n"
    "      --generation-checkpoint N  every N emitted tokens, checkpoint the generation on the SSD tier so an\n"
    "                            identical request after a crash resumes it byte-identically (needs --ssd-cache;\n"
    "                            default 0 = off)\n"
    "      --shared-cache URL    shared block tier across servers: redis[s]://[[user]:password@]host[:port][/db]\n"
    "      --shared-cache-timeout-ms MS  longest a request waits for the shared tier (default 1000)\n"
    "      --shared-cache-tls-ca FILE    rediss://: CA bundle (PEM) the Redis certificate must chain to (default: system store)\n"
    "      --shared-cache-tls-cert FILE  rediss://: client certificate (PEM) for mutual TLS\n"
    "      --shared-cache-tls-key FILE   rediss://: its private key (default: inside the certificate file)\n"
    "      --shared-cache-tls-insecure   rediss:// WITHOUT certificate or host name verification (testing only)\n"
    "      --chat-template NAME  a built-in renderer instead of the GGUF's Jinja template:\n"
    "                            chatml | qwen35 | llama3 | gemma | mistral | llama2 | phi3\n"
    "      --chat-template-file F  render prompts with the Jinja template in F (default: the GGUF's)\n"
    "      --draft-model FILE    speculative decoding: a small GGUF with the target's vocabulary proposes\n"
    "                            tokens the target checks in one pass; output unchanged (greedy: the same\n"
    "                            tokens; sampling: the same distribution) (docs/speculative.md)\n"
    "      --draft-max N         tokens the draft proposes per round at most (1..64, default 16; needs\n"
    "                            --ubatch >= 2N+2)\n"
    "      --draft-min N         use a proposal only when it has at least N tokens (default 0)\n"
    "      --draft-p-min P       the draft stops proposing where its top probability is below P (0..1,\n"
    "                            default 0.75)\n"
    "      --draft-threads N     the draft's compute threads (default 1)\n";

const char kvt_sampling_flags_help[] =
    "sampling options:\n"
    "      --temp X              temperature (0 = greedy)\n"
    "      --top-k N             keep the N most likely tokens (0 = off)\n"
    "      --top-p X             nucleus sampling (1 = off)\n"
    "      --min-p X             drop tokens below X * p(best) (0 = off)\n"
    "      --repeat-penalty X    (1 = off)\n"
    "      --presence-penalty X  (0 = off)\n"
    "      --frequency-penalty X (0 = off)\n"
    "      --penalty-last-n N    window for penalties (default 64)\n"
    "      --seed N              RNG seed (default 0)\n";

bool kvt_parse_engine_flag(kvt_args *a, kvt_engine_opts *o) {
    if (kvt_args_is(a, "-m", "--model")) o->model_path = kvt_args_str(a);
    else if (kvt_args_is(a, "-t", "--threads")) o->n_threads = (int)kvt_args_u32(a, 1, 512);
    else if (kvt_args_is(a, "-c", "--ctx")) o->n_ctx = kvt_args_u32(a, 8, 1u << 20);
    else if (kvt_args_is(a, NULL, "--ubatch")) o->ubatch = kvt_args_u32(a, 1, 8192);
    else if (kvt_args_is(a, NULL, "--parallel")) o->parallel = kvt_args_u32(a, 1, 256);
    else if (kvt_args_is(a, NULL, "--batch-queue")) o->queue_max = kvt_args_u32(a, 1, 1u << 20);
    else if (kvt_args_is(a, NULL, "--block-tokens")) o->block_tokens = kvt_args_u32(a, 16, 4096);
    else if (kvt_args_is(a, NULL, "--kv-quant")) {
        const char *v = kvt_args_str(a);
        kvt_codec tc;
        char terr[200];
        if (v && !strncmp(v, "turbo", 5)) {
            if (kvt_turbo_parse(v, &tc, terr, sizeof terr) != KVT_OK) {
                fprintf(stderr, "kvtier %s: --kv-quant: %s\n", a->cmd, terr);
                a->failed = true;
            }
        } else if (v && strcmp(v, "off") && strcmp(v, "8") && strcmp(v, "4") && strcmp(v, "config")) {
            fprintf(stderr, "kvtier %s: --kv-quant must be off, 8, 4, turbo[:k<b>v<b>] or config (got '%s')\n", a->cmd, v);
            a->failed = true;
        }
        o->kv_quant = v;
    } else if (kvt_args_is(a, NULL, "--kv-quant-group")) {
        o->kv_quant_group = kvt_args_u32(a, 32, 128);
        if (!a->failed && o->kv_quant_group != 32 && o->kv_quant_group != 64 && o->kv_quant_group != 128) {
            fprintf(stderr, "kvtier %s: --kv-quant-group must be 32, 64 or 128\n", a->cmd);
            a->failed = true;
        }
    } else if (kvt_args_is(a, NULL, "--kv-quant-start")) o->kv_quant_start = kvt_args_u32(a, 0, 1u << 30);
    else if (kvt_args_flag(a, NULL, "--kv-bf16")) o->kv_bf16 = true;
    else if (kvt_args_is(a, NULL, "--mla-prefill")) {
        const char *v = kvt_args_str(a);
        const int mode = kvt_mla_prefill_parse(v);
        if (v && mode < 0) {
            fprintf(stderr, "kvtier %s: --mla-prefill must be absorbed, expanded or auto (got '%s')\n", a->cmd, v);
            a->failed = true;
        }
        o->mla_prefill = mode < 0 ? 0 : mode;
    }
    else if (kvt_args_is(a, NULL, "--kv-pool-gb")) o->kv_pool_gb = kvt_args_f64(a, 0, 1e6);
    else if (kvt_args_is(a, NULL, "--prompt-cache")) {
        o->prompt_cache_gb = kvt_args_f64(a, 0, 1e6);
        o->prompt_cache_set = true;
    } else if (kvt_args_is(a, NULL, "--memory-budget")) {
        const char *v = kvt_args_str(a);
        char berr[200];
        g_memory_budget_given = true;
        o->memory_budget = 0;
        o->memory_budget_auto = false;
        if (!v) return true; /* kvt_args_str reported the missing value */
        if (!strcmp(v, "auto")) o->memory_budget_auto = true;
        else if (strcmp(v, "off") && kvt_size_parse(v, &o->memory_budget, berr, sizeof berr) != KVT_OK) {
            fprintf(stderr, "kvtier %s: --memory-budget: %s (or auto, off)\n", a->cmd, berr);
            a->failed = true;
        }
    } else if (kvt_args_is(a, NULL, "--pin-budget-mb")) o->pin_budget_mb = kvt_args_f64(a, 0, 1e9);
    else if (kvt_args_is(a, NULL, "--snapshot-min-tokens")) o->snapshot_min_tokens = kvt_args_u32(a, 1, 1u << 30);
    else if (kvt_args_is(a, NULL, "--recurrent-snapshot-every")) o->recurrent_snapshot_every = kvt_args_u32(a, 0, 1u << 30);
    else if (kvt_args_is(a, NULL, "--ssd-cache")) o->ssd_dir = kvt_args_str(a);
    else if (kvt_args_flag(a, NULL, "--ssd-cache-verify")) {
        o->ssd_verify = true;
        g_ssd_subflags |= 8;
    }
    else if (kvt_args_is(a, NULL, "--ssd-spill-queue-mb")) {
        o->ssd_spill_queue_mb = kvt_args_u32(a, 1, 1u << 20);
        g_ssd_subflags |= 16;
    }
    else if (kvt_args_is(a, NULL, "--generation-checkpoint")) o->generation_checkpoint = kvt_args_u32(a, 0, 1u << 24);
    else if (kvt_args_is(a, NULL, "--ssd-cache-max")) {
        o->ssd_max_gb = kvt_args_f64(a, 0, 1e9);
        g_ssd_subflags |= 1;
    } else if (kvt_args_is(a, NULL, "--ssd-demote-idle")) {
        o->ssd_demote_idle_s = kvt_args_f64(a, -1, 1e9);
        g_ssd_subflags |= 2;
    } else if (kvt_args_is(a, NULL, "--ssd-writeback")) {
        const char *v = kvt_args_str(a);
        if (v && !strcmp(v, "on")) o->ssd_writeback = true;
        else if (v && !strcmp(v, "off")) o->ssd_writeback = false;
        else if (v) {
            fprintf(stderr, "kvtier %s: --ssd-writeback must be on or off\n", a->cmd);
            a->failed = true;
        }
        g_ssd_subflags |= 4;
    } else if (kvt_args_is(a, NULL, "--shared-cache")) o->shared_url = kvt_args_str(a);
    else if (kvt_args_is(a, NULL, "--shared-cache-timeout-ms")) o->shared_timeout_ms = kvt_args_u32(a, 1, 60000);
    else if (kvt_args_is(a, NULL, "--shared-cache-tls-ca")) o->shared_tls_ca = kvt_args_str(a);
    else if (kvt_args_is(a, NULL, "--shared-cache-tls-cert")) o->shared_tls_cert = kvt_args_str(a);
    else if (kvt_args_is(a, NULL, "--shared-cache-tls-key")) o->shared_tls_key = kvt_args_str(a);
    else if (kvt_args_flag(a, NULL, "--shared-cache-tls-insecure")) o->shared_tls_insecure = true;
    else if (kvt_args_is(a, NULL, "--chat-template")) o->chat_template = kvt_args_str(a);
    else if (kvt_args_is(a, NULL, "--chat-template-file")) o->chat_template_file = kvt_args_str(a);
    else if (kvt_args_is(a, NULL, "--draft-model")) o->draft_model = kvt_args_str(a);
    else if (kvt_args_is(a, NULL, "--draft-max")) {
        o->draft_max = kvt_args_u32(a, 1, KVT_SPEC_MAX_DRAFT);
        g_draft_subflags = true;
    } else if (kvt_args_is(a, NULL, "--draft-min")) {
        o->draft_min = kvt_args_u32(a, 0, KVT_SPEC_MAX_DRAFT);
        g_draft_subflags = true;
    } else if (kvt_args_is(a, NULL, "--draft-p-min")) {
        o->draft_p_min = (float)kvt_args_f64(a, 0, 1);
        g_draft_subflags = true;
    } else if (kvt_args_is(a, NULL, "--draft-threads")) {
        o->draft_threads = (int)kvt_args_u32(a, 1, 512);
        g_draft_subflags = true;
    } else return false;
    return true;
}

bool kvt_parse_sampling_flag(kvt_args *a, kvt_sampling *s) {
    if (kvt_args_is(a, NULL, "--temp") || kvt_args_is(a, NULL, "--temperature")) s->temperature = (float)kvt_args_f64(a, 0, 100);
    else if (kvt_args_is(a, NULL, "--top-k")) s->top_k = (int32_t)kvt_args_u32(a, 0, 1u << 24);
    else if (kvt_args_is(a, NULL, "--top-p")) s->top_p = (float)kvt_args_f64(a, 0, 1);
    else if (kvt_args_is(a, NULL, "--min-p")) s->min_p = (float)kvt_args_f64(a, 0, 1);
    else if (kvt_args_is(a, NULL, "--repeat-penalty")) s->repeat_penalty = (float)kvt_args_f64(a, 0.01, 100);
    else if (kvt_args_is(a, NULL, "--presence-penalty")) s->presence_penalty = (float)kvt_args_f64(a, -2, 2);
    else if (kvt_args_is(a, NULL, "--frequency-penalty")) s->frequency_penalty = (float)kvt_args_f64(a, -2, 2);
    else if (kvt_args_is(a, NULL, "--penalty-last-n")) s->penalty_last_n = (int32_t)kvt_args_u32(a, 0, 4096);
    else if (kvt_args_is(a, NULL, "--seed")) s->seed = (uint64_t)kvt_args_i64(a, 0, INT64_MAX);
    else return false;
    return true;
}

bool kvt_engine_flags_check(const char *cmd, kvt_engine_opts *o) {
    if (!g_memory_budget_given) o->memory_budget_auto = true; /* the CLI default: --memory-budget auto */
    if (!o->model_path) {
        fprintf(stderr, "kvtier %s: no model given (-m MODEL.gguf; see kvtier %s --help)\n", cmd, cmd);
        return false;
    }
    if (o->ssd_dir && o->prompt_cache_gb <= 0) {
        fprintf(stderr, "kvtier %s: --ssd-cache needs the RAM tier; it cannot be combined with --prompt-cache 0\n", cmd);
        return false;
    }
    if (o->generation_checkpoint && !o->ssd_dir) {
        fprintf(stderr, "kvtier %s: --generation-checkpoint needs the SSD tier (--ssd-cache DIR)\n", cmd);
        return false;
    }
    if (!o->draft_model && g_draft_subflags) {
        fprintf(stderr, "kvtier %s: --draft-max, --draft-min, --draft-p-min and --draft-threads need --draft-model FILE\n",
                cmd);
        return false;
    }
    if (o->draft_model && o->draft_min > o->draft_max) {
        fprintf(stderr, "kvtier %s: --draft-min %u is more than --draft-max %u\n", cmd, o->draft_min, o->draft_max);
        return false;
    }
    if (!o->ssd_dir && g_ssd_subflags) {
        fprintf(stderr, "kvtier %s: warning: --ssd-cache-max/--ssd-demote-idle/--ssd-writeback/--ssd-cache-verify/--ssd-spill-queue-mb are ignored without --ssd-cache\n", cmd);
    }
    return true;
}
