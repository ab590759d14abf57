/* test_qwen3moe.c — qwen3moe (qwen3 attention + routed experts) on gen-model files:
 *   - the metadata keys a real Qwen3-30B-A3B GGUF carries (and only those) load with the family's
 *     defaults (softmax gating, renormalized top-k, n_rot = key_length);
 *   - kvtier's forward against an independent naive forward written here from docs/models.md in
 *     double precision (expanded per-head GQA attention, every expert computed and masked), for
 *     every weight type gen-model writes, on the tiny shape (3 layers, n_embd 256, 8 experts of 256): logits of every prompt position and of
 *     a greedy continuation, and the greedy tokens themselves;
 *   - grouped-by-expert prefill == per-token decode, bit for bit;
 *   - engine: cache hit / extension / edit == cold, and an SSD restart restores the blocks and
 *     gives the cold tokens. */
#include "testutil.h"

#include <math.h>

#include "engine/engine.h"
#include "gguf/gguf.h"
#include "kernels/quant.h"
#include "kv/kv.h"
#include "model/gen_model.h"
#include "model/model.h"
#include "fixture_model.h"

static char *g_dir;

static char *make_model(const char *type, uint64_t seed) {
    char *path = malloc(strlen(g_dir) + 64);
    sprintf(path, "%s/qwen3moe-%s-%llu.gguf", g_dir, type, (unsigned long long)seed);
    if (access(path, R_OK) == 0) return path;
    kvt_gen_model_opts o = {.arch = "qwen3moe", .shape = "tiny", .type = type, .seed = seed, .byte_vocab = true};
    char err[256] = "";
    kvt_status st = kvt_gen_model(&o, path, err, sizeof err);
    if (st != KVT_OK) fail_msg("gen_model %s: %s", type, err);
    return path;
}

static uint32_t argmax_f(const float *x, uint32_t n) {
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* ---- metadata: exactly the qwen3moe.* keys llama.cpp's converter writes for Qwen3-30B-A3B ---- */
static const char *const k_real_keys[] = {
    "qwen3moe.context_length", "qwen3moe.embedding_length", "qwen3moe.block_count",
    "qwen3moe.feed_forward_length", "qwen3moe.attention.head_count", "qwen3moe.attention.head_count_kv",
    "qwen3moe.attention.key_length", "qwen3moe.attention.value_length", "qwen3moe.rope.freq_base",
    "qwen3moe.attention.layer_norm_rms_epsilon", "qwen3moe.expert_count", "qwen3moe.expert_used_count",
    "qwen3moe.expert_feed_forward_length", NULL};

static void test_hparams_real_keys(void **st) {
    (void)st;
    char *path = make_model("f16", 1);
    tu_fx f;
    tu_fx_open(&f, path, 16);
    int n_arch = 0;
    for (int64_t i = 0; i < kvt_gguf_n_kv(f.g); i++) {
        const char *k = kvt_gguf_key_name(f.g, i);
        if (strncmp(k, "qwen3moe.", 9)) continue;
        bool known = false;
        for (int j = 0; k_real_keys[j]; j++) known |= !strcmp(k, k_real_keys[j]);
        if (!known) fail_msg("gen-model wrote %s, which real qwen3moe files do not carry", k);
        n_arch++;
    }
    assert_int_equal(n_arch, 13); /* every real key, each once */
    const kvt_hparams *hp = kvt_model_hparams(f.m);
    assert_int_equal(hp->arch, KVT_ARCH_QWEN3MOE);
    assert_int_equal(hp->moe.n_expert, 8);
    assert_int_equal(hp->moe.n_expert_used, 2);
    assert_int_equal(hp->moe.n_ff_exp, 256);
    assert_int_equal(hp->moe.n_expert_shared, 0);
    assert_int_equal(hp->moe.n_dense_lead, 0);
    assert_int_equal(hp->moe.gating, 1); /* softmax */
    assert_true(hp->moe.norm_topk);      /* Qwen3-MoE renormalizes its top-k (norm_topk_prob) */
    assert_true(hp->moe.weights_scale == 1.0f);
    assert_int_equal(hp->n_rot, hp->head_dim); /* no rope.dimension_count key */
    assert_true(hp->rope_neox);
    assert_int_equal(hp->mla.kv_lora_rank, 0);
    assert_int_equal(kvt_kv_layout_layer(f.layout, 0)->kind, KVT_KIND_FULL);
    tu_fx_close(&f);
    free(path);
}

/* ---- independent naive forward (double) ---- */
typedef struct nw { double *d; int64_t n; uint32_t type; } nw;
static nw nget(const kvt_gguf *g, const char *fmt, uint32_t il) {
    char nm[96];
    snprintf(nm, sizeof nm, fmt, il);
    const kvt_gguf_tensor *t = kvt_gguf_find_tensor(g, nm);
    if (!t) fail_msg("naive: no tensor %s", nm);
    nw r = {0};
    r.n = t->ne[0] * t->ne[1] * t->ne[2];
    r.type = t->type;
    float *f = malloc((size_t)r.n * sizeof(float));
    kvt_dequant_ref(t->type, t->data, f, r.n);
    r.d = malloc((size_t)r.n * sizeof(double));
    for (int64_t i = 0; i < r.n; i++) r.d[i] = f[i];
    free(f);
    return r;
}
/* y = W x for a weight of GGUF type wtype. The documented matmul contract (kernels/quant.h):
 * quantized weights multiply the input converted to their activation type (Q8_0 / Q8_1 / Q8_K,
 * one row of n_in), float weights the f32 input; so the naive forward rounds x the same way and
 * then accumulates exactly in double. */
static void mv(const double *w, uint32_t wtype, int64_t n_in, int64_t n_out, const double *x, double *y) {
    const uint32_t vt = kvt_vec_dot_type(wtype);
    double *xr = malloc((size_t)n_in * sizeof(double));
    float *xf = malloc((size_t)n_in * sizeof(float));
    for (int64_t i = 0; i < n_in; i++) xf[i] = (float)x[i];
    if (vt != KVT_TYPE_F32) {
        void *q = malloc(kvt_type_row_bytes(vt, (uint64_t)n_in));
        kvt_act_quantize_ref(vt, xf, q, n_in);
        kvt_dequant_ref(vt, q, xf, n_in);
        free(q);
    }
    for (int64_t i = 0; i < n_in; i++) xr[i] = xf[i];
    for (int64_t o = 0; o < n_out; o++) {
        double a = 0;
        for (int64_t i = 0; i < n_in; i++) a += w[o * n_in + i] * xr[i];
        y[o] = a;
    }
    free(xr);
    free(xf);
}
static void nnorm(double *y, const double *x, const double *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double sc = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * sc * w[i];
}
static double f16r(double v) { return kvt_f16_to_f32(kvt_f32_to_f16((float)v)); }

/* Smallest routing margin at each position over the layers (set by naive_forward): the gap between
 * the k-th chosen expert's probability and the best unchosen one. */
static double g_gap[64];

/* Logits [n][V] of every position of tok[0..n). K and V are rounded to f16 like kvtier's cache. */
static double *naive_forward(const kvt_gguf *g, const kvt_hparams *hp, const int32_t *tok, uint32_t n) {
    const int64_t E = hp->n_embd, H = hp->n_head, KV = hp->n_head_kv, HD = hp->head_dim, L = hp->n_layer;
    const int64_t V = hp->n_vocab, NE = hp->moe.n_expert, K = hp->moe.n_expert_used, F = hp->moe.n_ff_exp;
    const double eps = hp->norm_eps;
    nw emb = nget(g, "token_embd.weight", 0), on = nget(g, "output_norm.weight", 0);
    nw out = kvt_gguf_find_tensor(g, "output.weight") ? nget(g, "output.weight", 0) : emb;
    nw an[64], qw[64], kw[64], vw[64], qn[64], kn[64], ow[64], fn[64], gi[64], ge[64], ue[64], de[64];
    assert_true(L <= 64);
    for (uint32_t l = 0; l < L; l++) {
        an[l] = nget(g, "blk.%u.attn_norm.weight", l), qw[l] = nget(g, "blk.%u.attn_q.weight", l);
        kw[l] = nget(g, "blk.%u.attn_k.weight", l), vw[l] = nget(g, "blk.%u.attn_v.weight", l);
        qn[l] = nget(g, "blk.%u.attn_q_norm.weight", l), kn[l] = nget(g, "blk.%u.attn_k_norm.weight", l);
        ow[l] = nget(g, "blk.%u.attn_output.weight", l), fn[l] = nget(g, "blk.%u.ffn_norm.weight", l);
        gi[l] = nget(g, "blk.%u.ffn_gate_inp.weight", l), ge[l] = nget(g, "blk.%u.ffn_gate_exps.weight", l);
        ue[l] = nget(g, "blk.%u.ffn_up_exps.weight", l), de[l] = nget(g, "blk.%u.ffn_down_exps.weight", l);
    }
    double *Kc = malloc((size_t)L * n * KV * HD * 8), *Vc = malloc((size_t)L * n * KV * HD * 8);
    double *x = malloc(E * 8), *xn = malloc(E * 8), *t = malloc(E * 8), *y = malloc(E * 8), *ye = malloc(E * 8);
    double *q = malloc(H * HD * 8), *k = malloc(KV * HD * 8), *v = malloc(KV * HD * 8), *o = malloc(H * HD * 8);
    double *hg = malloc(F * 8), *hu = malloc(F * 8), *sc = malloc((size_t)n * 8), *lg = malloc(NE * 8), *pi = malloc(NE * 8);
    double *mask = malloc(NE * 8), *logits = malloc((size_t)n * V * 8);
    assert_true(n <= 64);
    for (uint32_t p = 0; p < n; p++) {
        g_gap[p] = 1e300;
        for (int64_t i = 0; i < E; i++) x[i] = emb.d[(int64_t)tok[p] * E + i];
        for (uint32_t l = 0; l < L; l++) {
            nnorm(xn, x, an[l].d, E, eps);
            mv(qw[l].d, qw[l].type, E, H * HD, xn, q);
            mv(kw[l].d, kw[l].type, E, KV * HD, xn, k);
            mv(vw[l].d, vw[l].type, E, KV * HD, xn, v);
            for (int64_t h = 0; h < H; h++) nnorm(q + h * HD, q + h * HD, qn[l].d, HD, eps);
            for (int64_t h = 0; h < KV; h++) nnorm(k + h * HD, k + h * HD, kn[l].d, HD, eps);
            for (int64_t i = 0; i < HD / 2; i++) { /* NEOX: pairs (i, i + HD/2) over the whole head */
                const double th = (double)p * pow(hp->rope_base, -2.0 * (double)i / (double)HD);
                const double c = cos(th), s = sin(th);
                for (int64_t h = 0; h < H + KV; h++) {
                    double *r = h < H ? q + h * HD : k + (h - H) * HD;
                    const double a = r[i], b = r[i + HD / 2];
                    r[i] = a * c - b * s, r[i + HD / 2] = a * s + b * c;
                }
            }
            for (int64_t i = 0; i < KV * HD; i++) {
                Kc[((size_t)l * n + p) * KV * HD + i] = f16r(k[i]);
                Vc[((size_t)l * n + p) * KV * HD + i] = f16r(v[i]);
            }
            for (int64_t h = 0; h < H; h++) { /* query head h reads kv head h / (H/KV) */
                const int64_t kh = h / (H / KV);
                double mx = -1e300, z = 0;
                for (uint32_t j = 0; j <= p; j++) {
                    const double *kr = Kc + ((size_t)l * n + j) * KV * HD + kh * HD;
                    double d = 0;
                    for (int64_t i = 0; i < HD; i++) d += f16r(q[h * HD + i]) * kr[i]; /* K·Q takes Q in f16 */
                    sc[j] = d / sqrt((double)HD);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                for (uint32_t j = 0; j <= p; j++) z += sc[j] = exp(sc[j] - mx);
                for (uint32_t j = 0; j <= p; j++) sc[j] = f16r(sc[j] / z) * z; /* the V product takes f16 weights */
                for (int64_t i = 0; i < HD; i++) {
                    double a = 0;
                    for (uint32_t j = 0; j <= p; j++) a += sc[j] / z * Vc[((size_t)l * n + j) * KV * HD + kh * HD + i];
                    o[h * HD + i] = a;
                }
            }
            mv(ow[l].d, ow[l].type, H * HD, E, o, t);
            for (int64_t i = 0; i < E; i++) x[i] += t[i];
            nnorm(xn, x, fn[l].d, E, eps);
            /* router: softmax over all experts, top-k mask, renormalized weights */
            mv(gi[l].d, gi[l].type, E, NE, xn, lg);
            double mx = lg[0], z = 0, ws = 0;
            for (int64_t e = 1; e < NE; e++) mx = lg[e] > mx ? lg[e] : mx;
            for (int64_t e = 0; e < NE; e++) z += pi[e] = exp(lg[e] - mx);
            for (int64_t e = 0; e < NE; e++) pi[e] /= z, mask[e] = 0;
            for (int64_t kk = 0; kk < K; kk++) {
                int64_t best = -1;
                for (int64_t e = 0; e < NE; e++)
                    if (!mask[e] && (best < 0 || pi[e] > pi[best])) best = e;
                mask[best] = 1, ws += pi[best];
            }
            double kth = 1e300, next = -1e300;
            for (int64_t e = 0; e < NE; e++) {
                if (mask[e]) kth = fmin(kth, pi[e]);
                else next = fmax(next, pi[e]);
            }
            g_gap[p] = fmin(g_gap[p], kth - next);
            for (int64_t i = 0; i < E; i++) y[i] = 0;
            for (int64_t e = 0; e < NE; e++) { /* every expert computed, then masked */
                mv(ge[l].d + e * E * F, ge[l].type, E, F, xn, hg);
                mv(ue[l].d + e * E * F, ue[l].type, E, F, xn, hu);
                for (int64_t i = 0; i < F; i++) hg[i] = hg[i] / (1.0 + exp(-hg[i])) * hu[i];
                mv(de[l].d + e * F * E, de[l].type, F, E, hg, ye);
                const double w = mask[e] * pi[e] / ws;
                for (int64_t i = 0; i < E; i++) y[i] += w * ye[i];
            }
            for (int64_t i = 0; i < E; i++) x[i] += y[i];
        }
        nnorm(xn, x, on.d, E, eps);
        mv(out.d, out.type, E, V, xn, logits + (size_t)p * V);
    }
    for (uint32_t l = 0; l < L; l++) {
        nw *all[12] = {&an[l], &qw[l], &kw[l], &vw[l], &qn[l], &kn[l], &ow[l], &fn[l], &gi[l], &ge[l], &ue[l], &de[l]};
        for (int i = 0; i < 12; i++) free(all[i]->d);
    }
    if (out.d != emb.d) free(out.d);
    free(emb.d), free(on.d), free(Kc), free(Vc), free(x), free(xn), free(t), free(y), free(ye), free(q), free(k);
    free(v), free(o), free(hg), free(hu), free(sc), free(lg), free(pi), free(mask);
    return logits;
}

/* kvtier (prefill in chunks with every row's logits, then greedy decode) against the naive forward
 * over prompt + kvtier's greedy tokens.
 * Routing is discontinuous: where the k-th chosen expert's probability is within tie_eps of the
 * best unchosen one, the arithmetic of a weight type (bf16 rounding, quantized activations) may
 * pick the other expert, and that row (and, through attention, every later one) legitimately moves
 * by ~0.1. So rows before the first such near-tie must match within tol (argmax included where
 * the naive top-2 margin exceeds 2 tol); later rows within 0.25 (argmax where the margin exceeds
 * 0.5). The test requires min_tight tight rows and 10 argmax checks. Returns the measured tight-row maximum. */
static double check_vs_naive(const char *type, double tol, double tie_eps, uint32_t min_tight, uint64_t seed) {
    char *path = make_model(type, 3);
    tu_fx f;
    tu_fx_open(&f, path, 16);
    const kvt_hparams *hp = kvt_model_hparams(f.m);
    const uint32_t V = hp->n_vocab, N = 40, G = 10, U = 16;
    int32_t tok[50];
    for (uint32_t i = 0; i < N; i++) tok[i] = (int32_t)(tu_rand(&seed) % V);
    float *kl = malloc((size_t)(N + G) * V * sizeof(float));
    kvt_ctx *c = NULL;
    kvt_seq *s = NULL;
    assert_int_equal(kvt_ctx_create(f.m, 2, U, &c), KVT_OK);
    assert_int_equal(kvt_seq_create(f.pool, 1, &s), KVT_OK);
    float *lg;
    for (uint32_t off = 0; off < N; off += U) { /* chunks of 16, 16, 8: every row's logits */
        const uint32_t nc = N - off < U ? N - off : U;
        assert_int_equal(kvt_model_forward(c, s, tok + off, nc, true, NULL, &lg), KVT_OK);
        memcpy(kl + (size_t)off * V, lg, (size_t)nc * V * sizeof(float));
    }
    for (uint32_t i = 0; i < G; i++) { /* greedy: token N+i from row N+i-1 */
        tok[N + i] = (int32_t)argmax_f(kl + (size_t)(N + i - 1) * V, V);
        assert_int_equal(kvt_model_forward(c, s, tok + N + i, 1, false, NULL, &lg), KVT_OK);
        memcpy(kl + (size_t)(N + i) * V, lg, (size_t)V * sizeof(float));
    }
    double *ref = naive_forward(f.g, hp, tok, N + G);
    uint32_t first_tie = N + G;
    for (uint32_t r = 0; r < N + G && first_tie == N + G; r++)
        if (g_gap[r] < tie_eps) first_tie = r;
    double md = 0, md_late = 0, range = 0;
    uint32_t checked = 0;
    for (uint32_t r = 0; r < N + G; r++) {
        const double *rr = ref + (size_t)r * V;
        const bool tight = r < first_tie;
        uint32_t a = 0, b = 1;
        double rmd = 0;
        for (uint32_t v = 0; v < V; v++) {
            rmd = fmax(rmd, fabs(rr[v] - kl[(size_t)r * V + v]));
            range = fmax(range, fabs(rr[v]));
        }
        if (tight) md = fmax(md, rmd);
        else md_late = fmax(md_late, rmd);
        for (uint32_t v = 1; v < V; v++) {
            if (rr[v] > rr[a]) b = a, a = v;
            else if (v != a && (b == a || rr[v] > rr[b])) b = v;
        }
        if (rr[a] - rr[b] > (tight ? 2 * tol : 0.5)) {
            checked++;
            if (argmax_f(kl + (size_t)r * V, V) != a) fail_msg("%s: row %u argmax differs from the naive forward", type, r);
        }
    }
    fprintf(stderr,
            "qwen3moe %s vs naive: max |dlogit| %.2e on %u rows before the first routing near-tie (|logit| up to "
            "%.2f), %.2e after; argmax checked on %u/%u rows\n",
            type, md, first_tie, range, md_late, checked, N + G);
    if (md > tol) fail_msg("%s: max |dlogit| %.3e > %.1e", type, md, tol);
    if (md_late > 0.25) fail_msg("%s: after a near-tie max |dlogit| %.3e > 0.25", type, md_late);
    assert_true(first_tie >= min_tight); /* enough rows under the tight bound */
    assert_true(checked >= 10);          /* the margin filters must not hollow the greedy check */
    assert_true(range > 0.1);            /* the logits are not degenerate */
    free(ref);
    free(kl);
    kvt_seq_free(s);
    kvt_ctx_free(c);
    tu_fx_close(&f);
    free(path);
    return md;
}

/* The naive forward models kvtier's documented arithmetic (activation conversion per weight type,
 * the two f16 roundings of attention, f16 K/V) and accumulates in double. What remains is f32
 * accumulation and the rare value that lands on the other side of an f16 rounding boundary. With
 * float weights that stays below 5e-4: all 50 rows must match within 2e-2. The f32 sums' order
 * differs between ISAs (AVX2, AVX-512, scalar) by ~1e-5 in the router's probabilities, so a margin
 * of a few 1e-6 flips on one machine and not another (the prompt of seed 123 has one of 3.7e-6 at
 * row 6, which AVX2 machines flipped): the float types use the prompt of seed 10, whose smallest
 * margin is 7e-4 for every float type, margins below 1e-4 count as ties and none may occur. With quantized weights such an event moves later rows by ~1e-2. That
 * can flip an expert whose routing margin is below ~1e-3 (q6_k: row 18 moves by 1.3e-2, then row
 * 23 flips at a margin of 3.7e-4). Q8_1 activations (q4_1, q5_1) also keep their block sum in f16,
 * which a dequantized activation cannot reproduce. So for those types margins below 1e-3 are ties:
 * the rows before the first tie must match within 2e-2, and later rows within 0.25 with argmax
 * where the margin exceeds 0.5. Gross errors (a wrong kernel, dequantization or formula) exceed
 * both bounds. The tiny shape's rows are 256 wide, so the k-quant files hold k-quant experts
 * (3-D tensors) and attention. */
static void test_vs_naive_float(void **st) {
    (void)st;
    const char *types[] = {"f32", "f16", "bf16"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) check_vs_naive(types[i], 2e-2, 1e-4, 50, 10);
}
static void test_vs_naive_quant(void **st) {
    (void)st;
    const char *types[] = {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k"};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) check_vs_naive(types[i], 2e-2, 1e-3, 0, 123);
}

/* Grouped-by-expert prefill == per-token decode, bit for bit (1 and 2 threads, odd ubatch). */
static void test_grouped_eq_per_token(void **st) {
    (void)st;
    char *path = make_model("q8_0", 4);
    tu_fx f;
    tu_fx_open(&f, path, 16);
    const uint32_t V = kvt_model_hparams(f.m)->n_vocab, N = 40;
    int32_t tok[40];
    uint64_t seed = 5;
    for (uint32_t i = 0; i < N; i++) tok[i] = (int32_t)(tu_rand(&seed) % V);
    float *full = malloc((size_t)N * V * sizeof(float));
    kvt_ctx *c = NULL;
    kvt_seq *s = NULL;
    float *lg;
    assert_int_equal(kvt_ctx_create(f.m, 2, 64, &c), KVT_OK);
    assert_int_equal(kvt_seq_create(f.pool, 1, &s), KVT_OK);
    assert_int_equal(kvt_model_forward(c, s, tok, N, true, NULL, &lg), KVT_OK);
    memcpy(full, lg, (size_t)N * V * sizeof(float));
    kvt_seq_free(s);
    kvt_ctx_free(c);
    for (int nth = 1; nth <= 2; nth++) {
        assert_int_equal(kvt_ctx_create(f.m, nth, 13, &c), KVT_OK);
        assert_int_equal(kvt_seq_create(f.pool, 1, &s), KVT_OK);
        for (uint32_t i = 0; i < N; i++) {
            assert_int_equal(kvt_model_forward(c, s, tok + i, 1, false, NULL, &lg), KVT_OK);
            assert_memory_equal(lg, full + (size_t)i * V, (size_t)V * sizeof(float));
        }
        kvt_seq_free(s);
        kvt_ctx_free(c);
    }
    free(full);
    tu_fx_close(&f);
    free(path);
}

/* ---- engine: cache hit / SSD restore == cold ---- */
static kvt_engine *open_engine(const char *model, const char *ssd) {
    kvt_engine_opts o;
    kvt_engine_opts_default(&o);
    o.model_path = model;
    o.n_threads = 2;
    o.n_ctx = 512;
    o.ubatch = 32;
    o.block_tokens = 16;
    o.kv_quant = "off";
    o.prompt_cache_gb = 1.0;
    o.ssd_dir = ssd;
    kvt_engine *e = NULL;
    char err[512] = "";
    kvt_status st = kvt_engine_create(&o, &e, err, sizeof err);
    if (st) fail_msg("engine: %s", err);
    return e;
}

typedef struct run_out { int32_t tok[16]; uint32_t n, reused; kvt_tier tier; } run_out;

static void gen(kvt_engine *e, const int32_t *ids, uint32_t n, uint32_t max, bool no_cache, run_out *out) {
    kvt_gen_request r = {.prompt = ids, .n_prompt = n, .max_tokens = max, .ignore_eog = true, .no_cache = no_cache};
    kvt_sampling_default(&r.sampling);
    kvt_gen_result res;
    char err[256] = "";
    kvt_status st = kvt_engine_generate(e, &r, &res, err, sizeof err);
    if (st) fail_msg("generate: %s", err);
    assert_int_equal(res.n_gen, max);
    memcpy(out->tok, res.tokens, sizeof(int32_t) * res.n_gen);
    out->n = res.n_gen, out->reused = res.n_reused, out->tier = res.reused_from;
    free(res.tokens);
}

static void fill(int32_t *ids, uint32_t n, uint32_t nv, uint64_t seed) {
    for (uint32_t i = 0; i < n; i++) ids[i] = (int32_t)(1 + tu_rand(&seed) % (nv - 2));
}

static void test_engine_hit_eq_cold(void **st) {
    (void)st;
    char *path = make_model("q8_0", 6);
    kvt_engine *e = open_engine(path, NULL);
    const uint32_t nv = kvt_engine_n_vocab(e);
    enum { N = 150, G = 12 };
    int32_t ids[N + G + 40];
    fill(ids, N, nv, 11);
    run_out cold, first, rep, t2c, t2;
    gen(e, ids, N, G, true, &cold);
    gen(e, ids, N, G, false, &first);
    assert_int_equal(first.reused, 0);
    assert_memory_equal(cold.tok, first.tok, sizeof(int32_t) * G);
    gen(e, ids, N, G, false, &rep);
    assert_int_equal(rep.reused, N - 1);
    assert_int_equal(rep.tier, KVT_TIER_RAM);
    assert_memory_equal(cold.tok, rep.tok, sizeof(int32_t) * G);
    memcpy(ids + N, first.tok, sizeof(int32_t) * (G - 1)); /* next turn: prompt + reply + new text */
    fill(ids + N + G - 1, 30, nv, 99);
    gen(e, ids, N + G - 1 + 30, G, true, &t2c);
    gen(e, ids, N + G - 1 + 30, G, false, &t2);
    assert_true(t2.reused >= N + G - 2);
    assert_memory_equal(t2c.tok, t2.tok, sizeof(int32_t) * G);
    ids[70] += 1; /* an edit in the middle (ids stay below nv - 1 + 1) */
    gen(e, ids, N, G, true, &cold);
    gen(e, ids, N, G, false, &rep);
    assert_int_equal(rep.reused, 70);
    assert_memory_equal(cold.tok, rep.tok, sizeof(int32_t) * G);
    kvt_engine_free(e);
    free(path);
}

static void test_engine_ssd_restart(void **st) {
    (void)st;
    char *path = make_model("q8_0", 6);
    char *dir = tu_tmpdir("q3moe-ssd");
    int32_t ids[200];
    run_out cold, a, b;
    {
        kvt_engine *e = open_engine(path, dir);
        fill(ids, 200, kvt_engine_n_vocab(e), 21);
        gen(e, ids, 200, 8, true, &cold);
        gen(e, ids, 200, 8, false, &a);
        assert_memory_equal(cold.tok, a.tok, sizeof(int32_t) * 8);
        kvt_flush_result fr;
        kvt_engine_flush(e, 10000, &fr);
        assert_true(fr.durable);
        assert_true(fr.entries > 0);
        kvt_engine_free(e);
    }
    {
        kvt_engine *e = open_engine(path, dir);
        gen(e, ids, 200, 8, false, &b);
        assert_int_equal(b.tier, KVT_TIER_SSD);
        assert_true(b.reused >= 192);
        assert_memory_equal(cold.tok, b.tok, sizeof(int32_t) * 8);
        kvt_engine_stats es;
        kvt_engine_stats_get(e, &es);
        assert_true(es.ssd_restores >= 1);
        kvt_engine_free(e);
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
    free(path);
}

static int setup(void **st) {
    (void)st;
    g_dir = tu_tmpdir("q3moe");
    return g_dir ? 0 : -1;
}
static int teardown(void **st) {
    (void)st;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) return -1;
    free(g_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hparams_real_keys),    cmocka_unit_test(test_vs_naive_float),
        cmocka_unit_test(test_vs_naive_quant),       cmocka_unit_test(test_grouped_eq_per_token),
        cmocka_unit_test(test_engine_hit_eq_cold),   cmocka_unit_test(test_engine_ssd_restart),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
