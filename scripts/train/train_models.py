"""train_models.py — builds the corpus, trains the tokenizer and the two llama models, exports GGUF
files and the PyTorch reference outputs the tests compare kvtier against. Run it through
scripts/train-models (which installs the training packages and sets the BLAS environment).

Deterministic with --seed on one machine: fixed thread count (2), seeded torch generator, seeded
corpus split and batch order. Every step is in data/models/README.md.

The model is exactly what src/model/model.c runs for general.architecture = llama:
  x = tok_embd[ids]; per layer: h = x + Wo attn(rope(Wq rms(x)), rope(Wk rms(x)), Wv rms(x));
  x = h + Wdown (silu(Wgate rms(h)) * Wup rms(h)); logits = Wout rms(x)
with RMSNorm eps 1e-5 (sum of squares / n, then * weight), RoPE base 10000 on interleaved pairs
(2i, 2i+1) — GGUF's "normal" rope for llama, so Q/K are written unpermuted — GQA with query head h
reading kv head h // (n_head / n_head_kv), softmax scale 1/sqrt(head_dim).
"""
import argparse
import json
import math
import os
import random
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_write as gw  # noqa: E402

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
NORM_EPS = 1e-5
ROPE_BASE = 10000.0

CONFIGS = {
    # name: dims, training schedule. The defaults are the run whose files are committed.
    "target": dict(n_embd=384, n_layer=8, n_head=6, n_head_kv=2, n_ff=1024, seq=512, batch=4, steps=1000,
                   lr=2.5e-3, warmup=10),
    "draft": dict(n_embd=128, n_layer=4, n_head=2, n_head_kv=1, n_ff=384, seq=512, batch=4, steps=1000,
                  lr=4e-3, warmup=20),
}


def log(f, msg):
    line = time.strftime("%H:%M:%S ") + msg
    print(line, flush=True)
    if f:
        f.write(line + "\n")
        f.flush()


# ----------------------------------------------------------------------------------------- corpus
def read_kjv():
    """(book chapter title, [verse text]) for every chapter of the KJV (Debian bible-kjv)."""
    out = subprocess.run(["bible", "-l0", "Gen1:1-Rev22:21"], check=True, capture_output=True, text=True,
                         env=dict(os.environ, COLUMNS="0")).stdout
    chapters = []
    for line in out.split("\n"):
        if not line.strip():
            continue
        if line.startswith("  "):
            num, _, verse = line.strip().partition(" ")
            assert num.isdigit() and chapters, line
            chapters[-1][1].append(verse.strip())
        else:
            chapters.append((line.strip(), []))
    assert len(chapters) == 1189, len(chapters)
    return chapters


def chapter_text(title, verses):
    return title + "\n" + "\n".join(verses) + "\n"


def build_corpus(outdir, seed):
    chapters = read_kjv()
    held = [c for i, c in enumerate(chapters) if i % 20 == 7]  # 5% of the chapters, spread over the books
    train = [c for i, c in enumerate(chapters) if i % 20 != 7]
    with open(os.path.join(outdir, "heldout.txt"), "w") as f:
        f.write("\n".join(chapter_text(t, v) for t, v in held))
    train_txt = os.path.join(outdir, "train.txt")
    with open(train_txt, "w") as f:
        f.write("\n".join(chapter_text(t, v) for t, v in train))
    # chat samples: a verse as the user turn, the next verse as the assistant reply (15% of the pairs)
    rng = random.Random(seed)
    chats = []
    for _, v in train:
        for i in range(len(v) - 1):
            if rng.random() < 0.15:
                chats.append((v[i], v[i + 1]))
    return train, held, chats


# -------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(outdir, vocab, seed):
    import sentencepiece as spm
    lines = os.path.join(outdir, "tok_lines.txt")
    with open(os.path.join(outdir, "train.txt")) as f, open(lines, "w") as g:
        for line in f:
            if line.strip():
                g.write(line)
    prefix = os.path.join(outdir, "tokenizer")
    # relative paths: the model file records its input and prefix, so it stays the same bytes in any --out
    cwd = os.getcwd()
    os.chdir(outdir)
    spm.SentencePieceTrainer.train(
        input="tok_lines.txt", model_prefix="tokenizer", model_type="bpe", vocab_size=vocab, character_coverage=1.0,
        byte_fallback=True, split_digits=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, user_defined_symbols=[IM_START, IM_END],
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        minloglevel=2)
    os.chdir(cwd)
    os.remove(lines)
    return prefix + ".model"


class Tok:
    """kvtier's (= llama.cpp's) SPM tokenization: specials split the text; each raw fragment after the
    start or a special gets the dummy space prefix (sentencepiece's add_dummy_prefix does that per call)."""

    def __init__(self, path):
        import sentencepiece as spm
        self.sp = spm.SentencePieceProcessor(model_file=path)
        self.im_start = self.sp.piece_to_id(IM_START)
        self.im_end = self.sp.piece_to_id(IM_END)
        self.bos, self.eos = self.sp.bos_id(), self.sp.eos_id()

    def encode(self, text, bos=True):
        ids = [self.bos] if bos else []
        i = 0
        while i < len(text):
            a, b = text.find(IM_START, i), text.find(IM_END, i)
            cands = [p for p in (a, b) if p >= 0]
            j = min(cands) if cands else len(text)
            if j > i:
                ids += self.sp.encode(text[i:j])
            if j < len(text):
                sp = IM_START if j == a else IM_END
                ids.append(self.im_start if sp == IM_START else self.im_end)
                j += len(sp)
            i = j
        return ids

    def decode(self, ids):
        return self.sp.decode(ids)


def chat_prompt(user):
    return f"{IM_START}user\n{user}{IM_END}\n{IM_START}assistant\n"


# ------------------------------------------------------------------------------------------ model
def rope_tables(n_pos, hd):
    inv = np.array([ROPE_BASE ** (-2.0 * i / hd) for i in range(hd // 2)], dtype=np.float64)
    th = np.arange(n_pos, dtype=np.float64)[:, None] * inv[None, :]
    return torch.tensor(np.cos(th), dtype=torch.float32), torch.tensor(np.sin(th), dtype=torch.float32)


def rope(x, cos, sin):  # x [B, H, T, hd]; pairs (2i, 2i+1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    return torch.stack((y0, y1), dim=-1).flatten(-2)


class RMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + NORM_EPS) * self.weight


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        E, H, KV, hd = c["n_embd"], c["n_head"], c["n_head_kv"], 64
        self.H, self.KV, self.hd = H, KV, hd
        self.attn_norm, self.ffn_norm = RMSNorm(E), RMSNorm(E)
        self.wq = nn.Linear(E, H * hd, bias=False)
        self.wk = nn.Linear(E, KV * hd, bias=False)
        self.wv = nn.Linear(E, KV * hd, bias=False)
        self.wo = nn.Linear(H * hd, E, bias=False)
        self.gate = nn.Linear(E, c["n_ff"], bias=False)
        self.up = nn.Linear(E, c["n_ff"], bias=False)
        self.down = nn.Linear(c["n_ff"], E, bias=False)

    def forward(self, x, cos, sin, mask, kv_f16):
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.wk(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.wv(h).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        if kv_f16:  # reference mode: kvtier's (= llama.cpp's non-flash CPU) attention over an f16 KV cache:
            k, v = k.half().float(), v.half().float()  # K (after RoPE) and V stored as f16,
            q = q.half().float()  # Q rounded to f16 for K.Q (src/kv/attention.c)
        rep = self.H // self.KV
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        if kv_f16:
            att = att.half().float()  # and the normalized softmax weights rounded to f16 for the V product
        y = (att @ v).transpose(1, 2).reshape(B, T, self.H * self.hd)
        x = x + self.wo(y)
        h = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, c, vocab):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Embedding(vocab, c["n_embd"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.out_norm = RMSNorm(c["n_embd"])
        self.output = nn.Linear(c["n_embd"], vocab, bias=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["n_layer"]) if n.endswith(("wo.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
        self.cos, self.sin = rope_tables(8192, 64)

    def forward(self, ids, kv_f16=False):
        T = ids.shape[1]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        x = self.tok_embd(ids)
        for b in self.blocks:
            x = b(x, self.cos[:T], self.sin[:T], mask, kv_f16)
        return self.output(self.out_norm(x))


def n_params(m):
    return sum(p.numel() for p in m.parameters())


# ------------------------------------------------------------------------------------------ train
def make_stream(tok, train, chats, seed):
    docs = [tok.encode(chapter_text(t, v)) for t, v in train]
    docs += [tok.encode(chat_prompt(u) + a + IM_END + "\n") for u, a in chats]
    random.Random(seed).shuffle(docs)
    stream = [i for d in docs for i in d]
    return torch.tensor(stream, dtype=torch.long)


def train_model(name, c, vocab, stream, held_ids, seed, logf, curve, teacher=None):
    """Next-token training on random windows of the stream; with a teacher (a trained Llama), knowledge
    distillation instead: the loss is the cross-entropy against the teacher's next-token distribution
    (its KL divergence plus the teacher's entropy), which trains a draft to propose what the target
    would pick. The logged loss is the hard next-token loss either way (comparable curves)."""
    torch.manual_seed(seed)
    m = Llama(c, vocab)
    log(logf, f"[{name}] {n_params(m)} parameters: {json.dumps(c)}"
              + (" (distilled from the teacher's distribution)" if teacher is not None else ""))
    decay = [p for p in m.parameters() if p.dim() == 2]
    nodecay = [p for p in m.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(seed + 1)
    T, B = c["seq"], c["batch"]
    t0 = time.time()
    for step in range(1, c["steps"] + 1):
        lr = c["lr"] * (step / c["warmup"] if step <= c["warmup"] else
                        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - c["warmup"]) / (c["steps"] - c["warmup"]))))
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = torch.randint(0, len(stream) - T - 1, (B,), generator=g)
        x = torch.stack([stream[s:s + T] for s in starts])
        y = torch.stack([stream[s + 1:s + T + 1] for s in starts])
        logits = m(x).view(-1, vocab)
        loss = F.cross_entropy(logits, y.view(-1))
        if teacher is not None:
            with torch.no_grad():
                p_t = teacher(x).view(-1, vocab).softmax(-1)
            train_loss = -(p_t * logits.log_softmax(-1)).sum(-1).mean()
        else:
            train_loss = loss
        opt.zero_grad(set_to_none=True)
        train_loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        el = time.time() - t0
        curve.append((name, step, loss.item(), None))
        if step % 10 == 0 or step == 1 or step == c["steps"]:
            msg = f"[{name}] step {step}/{c['steps']} loss {loss.item():.4f} lr {lr:.2e} {el:.0f}s " \
                  f"({step * B * T / el:.0f} tok/s)"
            if step % 25 == 0 or step == c["steps"]:
                tl = eval_loss(m, held_ids, T, 4)
                curve[-1] = (name, step, loss.item(), tl)
                msg += f" test {tl:.4f}"
            log(logf, msg)
    m.train_seconds = time.time() - t0
    return m


@torch.no_grad()
def eval_loss(m, ids, T, n_windows):
    """Mean next-token loss on n_windows consecutive held-out windows of T tokens (first token BOS)."""
    tot, n = 0.0, 0
    for w in range(min(n_windows, (len(ids) - 1) // T)):
        x = torch.tensor([ids[w * T:(w + 1) * T]])
        y = torch.tensor([ids[w * T + 1:(w + 1) * T + 1]])
        tot += F.cross_entropy(m(x)[0], y[0], reduction="sum").item()
        n += T
    return tot / n


# ----------------------------------------------------------------------------------------- export
def round_f16(m):
    """The weights the f16 GGUF holds: every matrix rounded to f16 (norms stay f32)."""
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 2:
                p.copy_(p.half().float())


def export_gguf(m, tok, path, ftype, name, ctx_len):
    c = m.c
    w = gw.Writer()
    w.str("general.architecture", "llama")
    w.str("general.name", name)
    w.str("general.license", "MIT (weights); training text: KJV, public domain")
    w.u32("general.file_type", 1 if ftype == gw.GGML_F16 else 7)
    w.u32("llama.context_length", ctx_len)
    w.u32("llama.embedding_length", c["n_embd"])
    w.u32("llama.block_count", c["n_layer"])
    w.u32("llama.feed_forward_length", c["n_ff"])
    w.u32("llama.attention.head_count", c["n_head"])
    w.u32("llama.attention.head_count_kv", c["n_head_kv"])
    w.u32("llama.rope.dimension_count", 64)
    w.f32("llama.rope.freq_base", ROPE_BASE)
    w.f32("llama.attention.layer_norm_rms_epsilon", NORM_EPS)
    w.u32("llama.vocab_size", tok.sp.get_piece_size())
    sp = tok.sp
    n = sp.get_piece_size()
    types = []
    for i in range(n):
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else
                     3 if sp.id_to_piece(i) in (IM_START, IM_END) else 1)  # ChatML markers: control (not printed)
    w.str("tokenizer.ggml.model", "llama")
    w.arr_str("tokenizer.ggml.tokens", [sp.id_to_piece(i) for i in range(n)])
    w.arr_f32("tokenizer.ggml.scores", [sp.get_score(i) for i in range(n)])
    w.arr_i32("tokenizer.ggml.token_type", types)
    w.u32("tokenizer.ggml.bos_token_id", tok.bos)
    w.u32("tokenizer.ggml.eos_token_id", tok.eos)
    w.u32("tokenizer.ggml.unknown_token_id", sp.unk_id())
    w.u32("tokenizer.ggml.eot_token_id", tok.im_end)
    w.bool("tokenizer.ggml.add_bos_token", True)
    w.bool("tokenizer.ggml.add_eos_token", False)
    w.bool("tokenizer.ggml.add_space_prefix", True)
    w.str("tokenizer.chat_template", CHAT_TEMPLATE)
    mat = lambda t: t.detach().float().numpy()  # noqa: E731
    w.tensor("token_embd.weight", mat(m.tok_embd.weight), ftype)
    w.tensor("output_norm.weight", mat(m.out_norm.weight), gw.GGML_F32)
    w.tensor("output.weight", mat(m.output.weight), ftype)
    for i, b in enumerate(m.blocks):
        w.tensor(f"blk.{i}.attn_norm.weight", mat(b.attn_norm.weight), gw.GGML_F32)
        w.tensor(f"blk.{i}.ffn_norm.weight", mat(b.ffn_norm.weight), gw.GGML_F32)
        for nm, lin in (("attn_q", b.wq), ("attn_k", b.wk), ("attn_v", b.wv), ("attn_output", b.wo),
                        ("ffn_gate", b.gate), ("ffn_up", b.up), ("ffn_down", b.down)):
            w.tensor(f"blk.{i}.{nm}.weight", mat(lin.weight), ftype)
    w.write(path)


@torch.no_grad()
def perplexity(m, ids, ctx, max_chunks=0):
    """llama-perplexity: windows of ctx tokens, first token BOS, score the second half of each."""
    n_chunk = len(ids) // ctx
    if max_chunks:
        n_chunk = min(n_chunk, max_chunks)
    nll, cnt = 0.0, 0
    first = ctx // 2
    for i in range(n_chunk):
        w = list(ids[i * ctx:(i + 1) * ctx])
        w[0] = 1
        lp = F.log_softmax(m(torch.tensor([w]), kv_f16=True)[0].double(), -1)
        tgt = torch.tensor(ids[i * ctx + first + 1:(i + 1) * ctx])
        nll -= lp[first:ctx - 1].gather(1, tgt[:, None]).sum().item()
        cnt += ctx - 1 - first
    return math.exp(nll / cnt), n_chunk, cnt


@torch.no_grad()
def references(m, tok, held_ids, ctx, prompts):
    ref = {"note": "PyTorch outputs of the f16-rounded weights with kvtier's f16-cache attention numerics (K, V, Q "
                   "and the softmax weights rounded to f16); "
                   "scripts/train-models writes this file"}
    gens = []
    for p in prompts:
        ids = tok.encode(p)
        cur = list(ids)
        for _ in range(64):
            cur.append(int(m(torch.tensor([cur]), kv_f16=True)[0, -1].argmax()))
        gens.append({"prompt": p, "prompt_ids": ids, "greedy_ids": cur[len(ids):],
                     "greedy_text": tok.decode(cur[len(ids):])})
    ref["greedy"] = gens
    seq = held_ids[:128]
    lp = F.log_softmax(m(torch.tensor([seq]), kv_f16=True)[0].double(), -1)
    ref["logprobs"] = {"ids": seq, "next_logprob": [round(lp[i, seq[i + 1]].item(), 6) for i in range(len(seq) - 1)],
                       "last_row_top": sorted(((round(v, 6), int(i)) for i, v in enumerate(lp[-1].tolist())),
                                              reverse=True)[:32]}
    ppl, nch, cnt = perplexity(m, held_ids, ctx, 8)
    ref["perplexity"] = {"ctx": ctx, "chunks": nch, "tokens_scored": cnt, "ppl": ppl}
    return ref


def load_gguf_f16(m, path):
    """Fills m with the matrices and norms of an f16 GGUF written by export_gguf (for --refs-only)."""
    import struct
    b = open(path, "rb").read()
    n_t, n_kv = struct.unpack_from("<QQ", b, 8)
    o = 24

    def rstr(o):
        n, = struct.unpack_from("<Q", b, o)
        return b[o + 8:o + 8 + n].decode("utf-8", "replace"), o + 8 + n
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    for _ in range(n_kv):
        _, o = rstr(o)
        t, = struct.unpack_from("<I", b, o)
        o += 4
        if t == 8:
            _, o = rstr(o)
        elif t == 9:
            et, n = struct.unpack_from("<IQ", b, o)
            o += 12
            if et == 8:
                for _ in range(n):
                    _, o = rstr(o)
            else:
                o += sizes[et] * n
        else:
            o += sizes[t]
    infos = []
    for _ in range(n_t):
        name, o = rstr(o)
        nd, = struct.unpack_from("<I", b, o)
        ne = struct.unpack_from("<%dQ" % nd, b, o + 4)
        typ, off = struct.unpack_from("<IQ", b, o + 4 + 8 * nd)
        o += 4 + 8 * nd + 12
        infos.append((name, ne, typ, off))
    base = (o + gw.ALIGN - 1) // gw.ALIGN * gw.ALIGN
    T = {}
    for name, ne, typ, off in infos:
        assert typ in (gw.GGML_F32, gw.GGML_F16), name
        n = int(np.prod(ne))
        a = np.frombuffer(b, np.float32 if typ == gw.GGML_F32 else np.float16, n, base + off)
        T[name] = torch.tensor(a.astype(np.float32).reshape(tuple(reversed(ne))))
    with torch.no_grad():
        m.tok_embd.weight.copy_(T["token_embd.weight"])
        m.output.weight.copy_(T["output.weight"])
        m.out_norm.weight.copy_(T["output_norm.weight"])
        for i, blk in enumerate(m.blocks):
            blk.attn_norm.weight.copy_(T[f"blk.{i}.attn_norm.weight"])
            blk.ffn_norm.weight.copy_(T[f"blk.{i}.ffn_norm.weight"])
            for nm, lin in (("attn_q", blk.wq), ("attn_k", blk.wk), ("attn_v", blk.wv), ("attn_output", blk.wo),
                            ("ffn_gate", blk.gate), ("ffn_up", blk.up), ("ffn_down", blk.down)):
                lin.weight.copy_(T[f"blk.{i}.{nm}.weight"])


def loss_png(curve, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for name in ("target", "draft"):
        pts = [(s, l) for n, s, l, _ in curve if n == name]
        tps = [(s, t) for n, s, _, t in curve if n == name and t is not None]
        if pts:
            ax.plot(*zip(*pts), label=f"{name} train", lw=0.8)
        if tps:
            ax.plot(*zip(*tps), "o-", label=f"{name} test")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("kvtier trained models (KJV)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="data/models")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--target-steps", type=int, default=CONFIGS["target"]["steps"])
    ap.add_argument("--draft-steps", type=int, default=CONFIGS["draft"]["steps"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--draft-teacher", metavar="GGUF", help="distill the draft from this f16 target GGUF "
                    "(written by this script) instead of training it on the next tokens")
    ap.add_argument("--refs-only", action="store_true", help="no training: rewrite kjv-*-ref.json from the f16 "
                    "GGUF files in --out (keeps the training facts of the old file)")
    ap.add_argument("--only", choices=("target", "draft"), help="train one model (each model's run is independent of "
                    "the other: own seed, own batch generator)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    prompts = ["In the beginning God created", "And the LORD spake unto Moses, saying,",
               chat_prompt("Blessed are the meek: for they shall inherit the earth.")]
    if args.refs_only:
        tok = Tok(os.path.join(args.out, "tokenizer.model"))
        held_ids = tok.encode(open(os.path.join(args.out, "heldout.txt")).read())
        for name in ("target", "draft"):
            if args.only and name != args.only:
                continue
            base = os.path.join(args.out, f"kjv-{name}")
            m = Llama(CONFIGS[name], args.vocab)
            load_gguf_f16(m, base + "-f16.gguf")
            m.eval()
            old = json.load(open(base + "-ref.json"))
            ref = references(m, tok, held_ids, CONFIGS[name]["seq"], prompts)
            for k in ("model", "params", "train_seconds", "final_train_loss", "final_test_loss"):
                ref[k] = old[k]
            with open(base + "-ref.json", "w") as f:
                json.dump(ref, f, indent=1)
            print(f"{base}-ref.json: ppl {ref['perplexity']['ppl']:.4f}")
        return
    t_all = time.time()
    logf = open(os.path.join(args.out, f"train-{args.only}.log" if args.only else "train.log"), "w")
    log(logf, f"train_models: seed {args.seed}, vocab {args.vocab}, torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads")
    train, held, chats = build_corpus(args.out, args.seed)
    tokp = train_tokenizer(args.out, args.vocab, args.seed)
    tok = Tok(tokp)
    stream = make_stream(tok, train, chats, args.seed)
    held_txt = open(os.path.join(args.out, "heldout.txt")).read()
    held_ids = tok.encode(held_txt)
    log(logf, f"corpus: {len(train)} train chapters + {len(chats)} chat samples = {len(stream)} tokens; "
              f"held out {len(held)} chapters, {len(held_txt)} bytes, {len(held_ids)} tokens")
    os.remove(os.path.join(args.out, "train.txt"))
    curve = []
    results = {}
    for name, steps in (("target", args.target_steps), ("draft", args.draft_steps)):
        if args.only and name != args.only:
            continue
        c = dict(CONFIGS[name], steps=steps)
        teacher = None
        if name == "draft" and args.draft_teacher:
            teacher = Llama(CONFIGS["target"], args.vocab)
            load_gguf_f16(teacher, args.draft_teacher)
            teacher.eval()
            for p in teacher.parameters():
                p.requires_grad_(False)
            log(logf, f"[draft] teacher {args.draft_teacher}: held-out loss {eval_loss(teacher, held_ids, c['seq'], 8):.4f}")
        m = train_model(name, c, args.vocab, stream, held_ids, args.seed, logf, curve, teacher)
        m.eval()
        round_f16(m)
        tl = eval_loss(m, held_ids, c["seq"], 8)
        trl = eval_loss(m, stream.tolist(), c["seq"], 8)
        log(logf, f"[{name}] trained in {m.train_seconds:.0f}s; f16 weights: train loss {trl:.4f}, "
                  f"test loss {tl:.4f} (first 8 windows of {c['seq']} tokens of each)")
        base = os.path.join(args.out, f"kjv-{name}")
        export_gguf(m, tok, base + "-f16.gguf", gw.GGML_F16, f"kvtier-kjv-{name}", c["seq"])
        export_gguf(m, tok, base + "-q8_0.gguf", gw.GGML_Q8_0, f"kvtier-kjv-{name}", c["seq"])
        ref = references(m, tok, held_ids, c["seq"], prompts)
        ref["model"] = os.path.basename(base) + "-f16.gguf"
        ref["params"] = n_params(m)
        ref["train_seconds"] = round(m.train_seconds)
        ref["final_train_loss"] = trl
        ref["final_test_loss"] = tl
        with open(base + "-ref.json", "w") as f:
            json.dump(ref, f, indent=1)
        log(logf, f"[{name}] reference ppl (8 chunks of {c['seq']}) {ref['perplexity']['ppl']:.4f}; greedy: "
                  + " | ".join(repr(g["greedy_text"][:60]) for g in ref["greedy"]))
        results[name] = ref
    loss_png(curve, os.path.join(args.out, "loss.png"))
    with open(os.path.join(args.out, "loss.tsv"), "w") as f:
        f.write("model\tstep\ttrain_loss\ttest_loss\n")
        for n, s, l, t in curve:
            f.write(f"{n}\t{s}\t{l:.5f}\t{'' if t is None else f'{t:.5f}'}\n")
    log(logf, f"done in {time.time() - t_all:.0f}s")


if __name__ == "__main__":
    main()
