/*
 * stats_table.h — the engine's counters, one X-macro table per subsystem. Each row names a field
 * once; the same row generates the field of kvt_engine_stats (engine.h), its key in GET /stats and
 * its sample in GET /metrics (server/api.c walks the tables). Adding a counter is one row here plus
 * the line that fills it in kvt_engine_stats_get.
 *
 * Row: X(field, ctype, section, key, metric, kind, help)
 *   field    the kvt_engine_stats member
 *   ctype    uint64_t or double
 *   section  the /stats object the key sits in ("prompt_cache", "ssd_cache", ...); a section whose
 *            subsystem is off is JSON null and its keys are left out
 *   key      the key inside the section; "a.b" puts b inside the object a (one level); "" = not in /stats
 *   metric   the /metrics name after "kvtier_"; "" = not in /metrics. Metrics are emitted whether
 *            or not the subsystem is on (0 when off), so a dashboard's series never disappear.
 *   kind     counter or gauge
 *   help     the # HELP text
 *
 * Names are an interface (dashboards, tests/e2e): tests/test_server.c compares both outputs with
 * the golden files in tests/fixtures/stats/, which the code before these tables wrote.
 * Not in the tables (they are not numbers): the model file's path and state, the SSD directory,
 * the scheme, the shared tier's breaker states and last error, and the "enabled" flags.
 */
#ifndef KVT_STATS_TABLE_H
#define KVT_STATS_TABLE_H

/* RAM tier (cache/prompt_cache.h) */
#define KVT_STATS_PROMPT_CACHE(X)                                                                                       \
    X(pc_entries, uint64_t, "prompt_cache", "entries", "prompt_cache_entries", gauge, "Entries in the RAM prompt cache") \
    X(pc_blocks, uint64_t, "prompt_cache", "blocks", "prompt_cache_blocks", gauge, "KV blocks held by the RAM prompt cache") \
    X(pc_bytes, uint64_t, "prompt_cache", "bytes", "prompt_cache_bytes", gauge, "Bytes held by the RAM prompt cache")   \
    X(pc_max_bytes, uint64_t, "prompt_cache", "max_bytes", "prompt_cache_max_bytes", gauge, "RAM prompt cache cap in bytes") \
    X(pc_hits, uint64_t, "prompt_cache", "hits", "prompt_cache_hits_total", counter,                                    \
      "RAM prompt cache lookups that reused tokens")                                                                   \
    X(pc_misses, uint64_t, "prompt_cache", "misses", "prompt_cache_misses_total", counter,                              \
      "RAM prompt cache lookups without reuse")                                                                        \
    X(pc_reused_tokens, uint64_t, "prompt_cache", "reused_tokens", "prompt_cache_reused_tokens_total", counter,         \
      "Prompt tokens reused from the RAM tier")                                                                        \
    X(pc_evictions, uint64_t, "prompt_cache", "evictions", "prompt_cache_evictions_total", counter,                     \
      "RAM prompt cache evictions")                                                                                    \
    X(pc_reuse_impossible_untrimmable, uint64_t, "prompt_cache", "reuse_impossible.untrimmable",                       \
      "prompt_cache_reuse_impossible_untrimmable_total", counter,                                                      \
      "Lookups that could not reuse an entry because it cannot be trimmed")                                           \
    X(pc_reuse_impossible_namespace, uint64_t, "prompt_cache", "reuse_impossible.namespace",                           \
      "prompt_cache_reuse_impossible_namespace_total", counter,                                                        \
      "Lookups that could not reuse an entry from another namespace")                                                  \
    X(pc_reuse_impossible_budget, uint64_t, "prompt_cache", "reuse_impossible.budget",                                 \
      "prompt_cache_reuse_impossible_budget_total", counter, "Lookups that could not reuse an entry for lack of pool budget")

/* SSD tier (cache/ssd_cache.h) */
#define KVT_STATS_SSD(X)                                                                                                \
    X(ssd_entries, uint64_t, "ssd_cache", "entries", "ssd_cache_entries", gauge, "Entries on the SSD tier")            \
    X(ssd_bytes, uint64_t, "ssd_cache", "bytes", "ssd_cache_bytes", gauge, "Bytes on the SSD tier")                    \
    X(ssd_max_bytes, uint64_t, "ssd_cache", "max_bytes", "ssd_cache_max_bytes", gauge,                                 \
      "SSD tier cap in bytes (0 = unlimited)")                                                                         \
    X(ssd_restores, uint64_t, "ssd_cache", "restores", "ssd_cache_restores_total", counter, "Restores from the SSD tier") \
    X(ssd_spills, uint64_t, "ssd_cache", "spills", "ssd_cache_spills_total", counter, "Entries written to the SSD tier") \
    X(ssd_restore_ms_last, double, "ssd_cache", "restore_ms_last", "ssd_cache_restore_ms_last", gauge,                 \
      "Duration of the last SSD restore in ms")                                                                        \
    X(ssd_demotions, uint64_t, "ssd_cache", "demotions", "ssd_cache_demotions_total", counter,                         \
      "Idle demotions to the SSD tier")                                                                                \
    X(ssd_pending_blocks, uint64_t, "ssd_cache", "pending_blocks", "ssd_cache_pending_blocks", gauge,                  \
      "Blocks queued for the SSD writer")                                                                              \
    X(ssd_pending_bytes, uint64_t, "ssd_cache", "pending_bytes", "ssd_cache_pending_bytes", gauge,                     \
      "Bytes queued for the SSD writer")                                                                               \
    X(ssd_dropped, uint64_t, "ssd_cache", "dropped", "ssd_cache_dropped_total", counter, "SSD writes dropped (queue budget)") \
    X(ssd_failed, uint64_t, "ssd_cache", "failed", "ssd_cache_failed_total", counter, "SSD writes that failed")         \
    X(ssd_longest_durable_prefix_tokens, uint64_t, "ssd_cache", "longest_durable_prefix_tokens",                       \
      "ssd_cache_longest_durable_prefix_tokens", gauge, "Longest prefix known durable on SSD")                         \
    X(ssd_dirty_records, uint64_t, "ssd_cache", "dirty_records", "ssd_cache_dirty_records", gauge,                     \
      "Records dropped or failed, awaiting a retry")                                                                   \
    X(ssd_shed, uint64_t, "ssd_cache", "shed", "ssd_cache_shed_total", counter,                                       \
      "Records dropped unwritten under memory pressure (failing disk or no memory)")                                  \
    X(ssd_staged, uint64_t, "ssd_cache", "staged", "ssd_cache_staged_total", counter,                                  \
      "Records staged to the heap under memory pressure (written later)")                                             \
    X(ssd_skipped_nonregular, uint64_t, "ssd_cache", "skipped_nonregular", "ssd_cache_skipped_nonregular_total",       \
      counter, "Cache-file names that were not regular files")                                                         \
    X(ssd_lost_entries, uint64_t, "ssd_cache", "lost_entries", "ssd_cache_lost_entries_total", counter,                \
      "Entries lost because the cache directory was deleted")                                                          \
    X(ssd_dir_recreated, uint64_t, "ssd_cache", "dir_recreated", "", counter,                                          \
      "Times the cache directory was made again after it was deleted")

/* generation checkpoints (engine/checkpoint.h, --generation-checkpoint) */
#define KVT_STATS_CKPT(X)                                                                                               \
    X(ckpt_written, uint64_t, "generation_checkpoints", "written", "generation_checkpoints_written_total", counter,    \
      "Generation checkpoint records published")                                                                       \
    X(ckpt_resumed, uint64_t, "generation_checkpoints", "resumed", "generation_checkpoints_resumed_total", counter,    \
      "Requests resumed from a generation checkpoint")                                                                 \
    X(ckpt_invalidated, uint64_t, "generation_checkpoints", "invalidated", "generation_checkpoints_invalidated_total",  \
      counter, "Checkpoints removed at normal completion")                                                             \
    X(ckpt_failed, uint64_t, "generation_checkpoints", "failed", "generation_checkpoints_failed_total", counter,       \
      "Checkpoint writes or removals that failed")                                                                     \
    X(ckpt_dropped, uint64_t, "generation_checkpoints", "dropped", "", counter, "Checkpoint saves dropped (queue bound)") \
    X(ckpt_corrupt, uint64_t, "generation_checkpoints", "corrupt_removed", "", counter,                                \
      "Checkpoint records removed because they failed verification")                                                   \
    X(ckpt_pending, uint64_t, "generation_checkpoints", "pending", "", gauge, "Checkpoint saves waiting for the writer") \
    X(ckpt_retried, uint64_t, "generation_checkpoints", "retried", "generation_checkpoints_retried_total", counter,    \
      "Checkpoints saved early to replace a failed or dropped record")                                                 \
    X(ckpt_resume_reused_tokens, uint64_t, "generation_checkpoints", "resume_reused_tokens",                           \
      "generation_checkpoints_resume_reused_tokens_total", counter,                                                    \
      "Prompt and emitted tokens restored from the tiers (not recomputed) when resuming")

/* shared tier (cache/shared_tier.h, Redis) */
#define KVT_STATS_SHARED(X)                                                                                             \
    X(shared_lookups, uint64_t, "shared_cache", "lookups", "", counter, "Lookups that asked the shared tier")          \
    X(shared_hits, uint64_t, "shared_cache", "hits", "shared_cache_hits_total", counter,                               \
      "Requests that reused blocks from the shared tier")                                                              \
    X(shared_fetched_blocks, uint64_t, "shared_cache", "fetched_blocks", "shared_cache_fetched_blocks_total", counter, \
      "Blocks fetched from the shared tier")                                                                           \
    X(shared_fetched_bytes, uint64_t, "shared_cache", "fetched_bytes", "shared_cache_fetched_bytes_total", counter,    \
      "Bytes fetched from the shared tier")                                                                            \
    X(shared_fetched_tokens, uint64_t, "shared_cache", "fetched_tokens", "", counter, "Tokens fetched from the shared tier") \
    X(shared_published_blocks, uint64_t, "shared_cache", "published_blocks", "shared_cache_published_blocks_total",    \
      counter, "Blocks published to the shared tier")                                                                  \
    X(shared_published_bytes, uint64_t, "shared_cache", "published_bytes", "shared_cache_published_bytes_total",       \
      counter, "Bytes published to the shared tier")                                                                   \
    X(shared_publish_existing, uint64_t, "shared_cache", "publish_existing", "", counter,                              \
      "Publishes skipped because the key was already there")                                                           \
    X(shared_dropped, uint64_t, "shared_cache", "dropped", "shared_cache_dropped_total", counter,                      \
      "Blocks not published (queue bound, breaker open, failure)")                                                     \
    X(shared_errors, uint64_t, "shared_cache", "errors", "shared_cache_errors_total", counter,                         \
      "Shared tier connection, timeout and protocol errors")                                                           \
    X(shared_oom_errors, uint64_t, "shared_cache", "oom_errors", "shared_cache_oom_errors_total", counter,             \
      "Shared tier writes refused for maxmemory (OOM)")                                                                \
    X(shared_corrupt, uint64_t, "shared_cache", "corrupt", "shared_cache_corrupt_total", counter,                      \
      "Shared tier values that failed verification")                                                                   \
    X(shared_skipped, uint64_t, "shared_cache", "skipped", "", counter, "Lookups the shared tier did not serve")        \
    X(shared_queue_blocks, uint64_t, "shared_cache", "queue_blocks", "", gauge, "Blocks waiting to be published")      \
    X(shared_breaker_opens, uint64_t, "shared_cache", "breaker_opens", "", counter, "Times a circuit breaker opened")   \
    X(shared_fetched_snapshots, uint64_t, "shared_cache", "fetched_snapshots", "shared_cache_fetched_snapshots_total", \
      counter, "Recurrent-state snapshots fetched from the shared tier")                                               \
    X(shared_published_snapshots, uint64_t, "shared_cache", "published_snapshots",                                     \
      "shared_cache_published_snapshots_total", counter, "Recurrent-state snapshots published to the shared tier")

/* the model file (model/file_watch.h), the KV pool, requests, continuous batching (engine/sched.h) */
#define KVT_STATS_ENGINE(X)                                                                                             \
    X(model_stale_dropped, uint64_t, "model_file", "dropped_puts", "", counter,                                        \
      "Tier hand-offs refused after the model file changed")                                                           \
    X(pool_used_bytes, uint64_t, "kv", "pool_used_bytes", "kv_pool_used_bytes", gauge, "KV block pool bytes in use")   \
    X(pool_peak_bytes, uint64_t, "kv", "pool_peak_bytes", "kv_pool_peak_bytes", gauge, "KV block pool peak bytes")     \
    X(pool_budget_bytes, uint64_t, "kv", "pool_budget_bytes", "kv_pool_budget_bytes", gauge, "KV block pool byte budget") \
    X(requests, uint64_t, "requests", "generations", "generations_total", counter, "Engine generations")              \
    X(prompt_tokens, uint64_t, "requests", "prompt_tokens", "prompt_tokens_total", counter, "Prompt tokens processed") \
    X(generated_tokens, uint64_t, "requests", "generated_tokens", "generated_tokens_total", counter, "Tokens generated") \
    X(cached_tokens, uint64_t, "requests", "cached_tokens", "cached_tokens_total", counter,                            \
      "Prompt tokens served from a cache tier")                                                                        \
    X(parallel, uint64_t, "batching", "parallel", "batch_parallel", gauge, "Rows batched per forward step (--parallel)") \
    X(rows_active, uint64_t, "batching", "rows_active", "batch_rows_active", gauge, "Generations holding a row")       \
    X(rows_queued, uint64_t, "batching", "rows_queued", "batch_rows_queued", gauge,                                    \
      "Generations waiting for a row or KV memory")                                                                    \
    X(batch_queue_max, uint64_t, "batching", "queue_max", "", gauge, "Most generations the wait queue holds")          \
    X(batch_steps, uint64_t, "batching", "steps", "batch_steps_total", counter, "Batched forward steps")               \
    X(batch_tokens_per_step_last, double, "batching", "tokens_per_step_last", "batch_tokens_per_step", gauge,          \
      "Tokens forwarded in the last step")                                                                             \
    X(batch_tokens_per_step_avg, double, "batching", "tokens_per_step_avg", "batch_tokens_per_step_avg", gauge,        \
      "Tokens forwarded per step since start")                                                                         \
    X(batch_prefill_tps_1m, double, "batching", "prefill_tokens_per_s_1m", "batch_prefill_tokens_per_second", gauge,  \
      "Prompt tokens forwarded per second over the last minute")                                                       \
    X(batch_decode_tps_1m, double, "batching", "decode_tokens_per_s_1m", "batch_decode_tokens_per_second", gauge,     \
      "Generated tokens forwarded per second over the last minute")                                                    \
    X(queue_wait_ms_last, double, "batching", "queue_wait_ms_last", "batch_queue_wait_ms_last", gauge,                 \
      "Queue wait of the last admitted generation (ms)")                                                               \
    X(queue_wait_ms_avg, double, "batching", "queue_wait_ms_avg", "batch_queue_wait_ms_avg", gauge,                    \
      "Mean queue wait of admitted generations (ms)")                                                                  \
    X(queue_wait_ms_max, double, "batching", "queue_wait_ms_max", "batch_queue_wait_ms_max", gauge, "Longest queue wait (ms)") \
    X(max_decode_stall_ms, double, "batching", "max_decode_stall_ms", "batch_max_decode_stall_ms", gauge,              \
      "Longest step carrying prefill tokens while rows decoded (ms)")                                                  \
    X(max_decode_step_ms, double, "batching", "max_decode_step_ms", "", gauge,                                         \
      "Longest step of decode rows only (the stall's baseline, ms)")                                                   \
    X(batch_memory_waits, uint64_t, "batching", "memory_waits", "batch_memory_waits_total", counter,                   \
      "Generations that waited for KV memory")                                                                         \
    X(batch_queue_full, uint64_t, "batching", "queue_full", "batch_queue_full_total", counter,                         \
      "Generations refused because the wait queue was full")

/* the memory budget (engine/budget.h, --memory-budget; docs/tiers.md "Memory budget"): its parts, their
 * use, the process's resident memory and the pool's pressure events. Parts are 0 without a budget. */
#define KVT_STATS_MEMORY(X)                                                                                             \
    X(mem_budget_bytes, uint64_t, "memory", "budget_bytes", "memory_budget_bytes", gauge,                              \
      "Memory budget in bytes (0 = none)")                                                                             \
    X(mem_weights_bytes, uint64_t, "memory", "weights_bytes", "memory_weights_bytes", gauge,                           \
      "Budget part: the model file mapping")                                                                           \
    X(mem_weight_copies_bytes, uint64_t, "memory", "weight_copies_bytes", "memory_weight_copies_bytes", gauge,        \
      "Budget part: packed weight copies and f32 vectors")                                                             \
    X(mem_compute_bytes, uint64_t, "memory", "compute_bytes", "memory_compute_bytes", gauge,                           \
      "Budget part: compute context buffers")                                                                          \
    X(mem_spill_queue_bytes, uint64_t, "memory", "spill_queue_bytes", "memory_spill_queue_bytes", gauge,               \
      "Budget part: the SSD spill queue cap")                                                                          \
    X(mem_spill_queue_used_bytes, uint64_t, "memory", "spill_queue_used_bytes", "memory_spill_queue_used_bytes",       \
      gauge, "Bytes queued for the SSD writer")                                                                        \
    X(mem_text_bytes, uint64_t, "memory", "text_buffers_bytes", "memory_text_buffers_bytes", gauge,                    \
      "Budget part: tokenizer and parse buffers")                                                                      \
    X(mem_kv_pool_bytes, uint64_t, "memory", "kv_pool_bytes", "memory_kv_pool_bytes", gauge,                           \
      "Budget part: the KV block pool (live rows and the RAM tier)")                                                   \
    X(mem_kv_pool_used_bytes, uint64_t, "memory", "kv_pool_used_bytes", "", gauge, "KV block pool bytes in use")       \
    X(mem_live_rows_bytes, uint64_t, "memory", "live_rows_bytes", "memory_live_rows_bytes", gauge,                     \
      "KV the pool keeps for --parallel full-context rows")                                                            \
    X(mem_rows_reserved_bytes, uint64_t, "memory", "rows_reserved_bytes", "memory_rows_reserved_bytes", gauge,         \
      "KV reserved by the admitted rows")                                                                              \
    X(mem_ram_tier_bytes, uint64_t, "memory", "ram_tier_bytes", "memory_ram_tier_bytes", gauge,                        \
      "RAM tier cap inside the KV pool")                                                                               \
    X(mem_ram_tier_used_bytes, uint64_t, "memory", "ram_tier_used_bytes", "", gauge, "Bytes the RAM tier holds")      \
    X(mem_rss_bytes, uint64_t, "memory", "rss_bytes", "memory_rss_bytes", gauge, "Resident set size (VmRSS)")          \
    X(mem_rss_peak_bytes, uint64_t, "memory", "rss_peak_bytes", "memory_rss_peak_bytes", gauge,                        \
      "Peak resident set size (VmHWM)")                                                                                \
    X(mem_pressure_events, uint64_t, "memory", "pressure.events", "memory_pressure_events_total", counter,             \
      "KV pool allocations that found the pool full and asked the tiers to free memory")                              \
    X(mem_pressure_freed_bytes, uint64_t, "memory", "pressure.freed_bytes", "memory_pressure_freed_bytes_total",       \
      counter, "Bytes the tiers freed under pool pressure")                                                            \
    X(mem_pressure_failed, uint64_t, "memory", "pressure.failed", "memory_pressure_failed_total", counter,             \
      "Pool pressure events where no tier had anything to free")

/* speculative decoding (engine/spec.h, --draft-model; docs/speculative.md) */
#define KVT_STATS_SPEC(X)                                                                                               \
    X(spec_rounds, uint64_t, "speculative", "rounds", "spec_rounds_total", counter,                                    \
      "Speculative verify passes of the target")                                                                       \
    X(spec_proposed, uint64_t, "speculative", "proposed_tokens", "spec_proposed_tokens_total", counter,               \
      "Draft tokens proposed and checked by the target")                                                               \
    X(spec_accepted, uint64_t, "speculative", "accepted_tokens", "spec_accepted_tokens_total", counter,               \
      "Draft tokens the target accepted")                                                                              \
    X(spec_acceptance_rate, double, "speculative", "acceptance_rate", "spec_acceptance_rate", gauge,                   \
      "Accepted over proposed draft tokens since start")                                                               \
    X(spec_draft_ms, double, "speculative", "draft_ms", "spec_draft_ms_total", counter,                                \
      "Time in the draft model's forward passes and draws (ms)")                                                       \
    X(spec_draft_time_share, double, "speculative", "draft_time_share", "spec_draft_time_share", gauge,                \
      "Share of the speculating rows' decode time spent in the draft")                                                 \
    X(spec_off_rows, uint64_t, "speculative", "rows_off", "spec_rows_off_total", counter,                              \
      "Rows that stopped speculating (draft out of KV memory)")                                                        \
    X(spec_reused_ram, uint64_t, "speculative", "draft_state.reused_ram_tokens", "spec_draft_reused_ram_tokens_total", \
      counter, "Prompt tokens of draft state reused from the draft's RAM tier")                                       \
    X(spec_reused_ssd, uint64_t, "speculative", "draft_state.reused_ssd_tokens", "spec_draft_reused_ssd_tokens_total", \
      counter, "Prompt tokens of draft state restored from the draft's SSD tier")                                     \
    X(spec_reused_shared, uint64_t, "speculative", "draft_state.reused_shared_tokens",                               \
      "spec_draft_reused_shared_tokens_total", counter, "Prompt tokens of draft state fetched from the shared tier")  \
    X(spec_recomputed, uint64_t, "speculative", "draft_state.recomputed_tokens", "spec_draft_recomputed_tokens_total", \
      counter, "Prompt tokens the draft recomputed although the target's tiers supplied them")                        \
    X(spec_recompute_rows, uint64_t, "speculative", "draft_state.recompute_rows", "spec_draft_recompute_rows_total",   \
      counter, "Requests whose draft recomputed tokens the target reused")                                            \
    X(spec_state_ram_bytes, uint64_t, "speculative", "draft_state.ram_bytes", "spec_draft_ram_bytes", gauge,          \
      "Bytes of draft state in the draft's RAM tier")                                                                  \
    X(spec_state_ssd_entries, uint64_t, "speculative", "draft_state.ssd_entries", "spec_draft_ssd_entries", gauge,    \
      "Files of draft state in the draft's SSD compat directory")                                                      \
    X(spec_state_ssd_bytes, uint64_t, "speculative", "draft_state.ssd_bytes", "spec_draft_ssd_bytes", gauge,          \
      "Bytes of draft state in the draft's SSD compat directory")

/* every table of the engine, in /stats and /metrics order */
#define KVT_STATS_ALL(X)                                                                                                \
    KVT_STATS_PROMPT_CACHE(X) KVT_STATS_SSD(X) KVT_STATS_CKPT(X) KVT_STATS_SHARED(X) KVT_STATS_ENGINE(X) KVT_STATS_MEMORY(X) \
    KVT_STATS_SPEC(X)

#define KVT_STATS_FIELD_(field, ctype, section, key, metric, kind, help) ctype field;

#endif
