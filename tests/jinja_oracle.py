#!/usr/bin/python3
"""jinja_oracle.py — the reference renderer for kvtier's Jinja interpreter: Debian's python3-jinja2
configured as Hugging Face transformers renders chat templates (ImmutableSandboxedEnvironment,
trim_blocks=True, lstrip_blocks=True, loopcontrols; tojson = json.dumps(ensure_ascii=False, ...),
raise_exception, strftime_now on a fixed date).

  jinja_oracle.py render --template F --messages M [--tools T] [--kwargs JSON] [--no-generation-prompt]
                  [--bos-token B] [--eos-token E] [--date YYYY-MM-DD]
      prints the prompt (exit 1 with the exception on stderr when the template raises)

  jinja_oracle.py compare --kvtier BIN --templates DIR --conversations DIR [--prefix-report FILE]
      renders every template x conversation x variant with both and compares byte for byte; a
      render that raises in Python must fail in kvtier too. Also checks the multi-turn prefix
      property. Exit 0 only when everything matches.

Must run with /usr/bin/python3 (Debian's python3-jinja2).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_DATE = datetime.datetime(2026, 1, 1, 0, 0, 0)
BOS, EOS = "<s>", "</s>"


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


_compiled = {}


def render(env, src, messages, tools, gen, kwargs, bos=BOS, eos=EOS):
    tmpl = _compiled.get(src)
    if tmpl is None:
        tmpl = _compiled[src] = env.from_string(src)  # may raise: a template that does not compile
    ctx = dict(kwargs)
    ctx.update(messages=messages, tools=tools, documents=None, add_generation_prompt=gen, bos_token=bos,
               eos_token=eos)
    return tmpl.render(**ctx)


def cmd_render(a):
    now = datetime.datetime.strptime(a.date, "%Y-%m-%d") if a.date else FIXED_DATE
    env = make_env(now)
    src = open(a.template, encoding="utf-8").read()
    msgs = json.load(open(a.messages, encoding="utf-8"))
    tools = json.load(open(a.tools, encoding="utf-8")) if a.tools else None
    kw = json.loads(a.kwargs) if a.kwargs else {}
    try:
        out = render(env, src, msgs, tools, not a.no_generation_prompt, kw, a.bos_token, a.eos_token)
    except Exception as e:  # the template raised
        print("%s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 1
    sys.stdout.write(out)
    return 0


VARIANTS = [  # (add_generation_prompt, kwargs)
    (True, {}),
    (False, {}),
    (True, {"enable_thinking": True}),
    (True, {"enable_thinking": False}),
    (False, {"enable_thinking": False}),
]


def run_kvtier(binary, tfile, msgs, tools, gen, kw, tmpdir):
    mf = os.path.join(tmpdir, "m.json")
    with open(mf, "w", encoding="utf-8") as f:
        json.dump(msgs, f, ensure_ascii=False)
    cmd = [binary, "template", "render", "--template", tfile, "--messages", mf, "--bos-token", BOS, "--eos-token", EOS]
    if tools is not None:
        tf = os.path.join(tmpdir, "t.json")
        with open(tf, "w", encoding="utf-8") as f:
            json.dump(tools, f, ensure_ascii=False)
        cmd += ["--tools", tf]
    if kw:
        cmd += ["--kwargs", json.dumps(kw)]
    if not gen:
        cmd.append("--no-generation-prompt")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace").strip()


def first_diff(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def cmd_compare(a):
    env = make_env(FIXED_DATE)
    templates = sorted(f for f in os.listdir(a.templates) if f.endswith(".jinja") and (not a.only or a.only in f))
    convs = sorted(f for f in os.listdir(a.conversations) if f.endswith(".json"))
    total = match = both_raise = 0
    failures = []
    prefix_lines = []
    per_template = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        for t in templates:
            tfile = os.path.join(a.templates, t)
            src = open(tfile, encoding="utf-8").read()
            ok_t = n_t = 0
            for cname in convs:
                conv = json.load(open(os.path.join(a.conversations, cname), encoding="utf-8"))
                msgs, tools = conv["messages"], conv.get("tools")
                for gen, kw in VARIANTS:
                    total += 1
                    n_t += 1
                    try:
                        want = render(env, src, msgs, tools, gen, kw).encode("utf-8")
                        raised = None
                    except Exception as e:
                        want, raised = None, "%s: %s" % (type(e).__name__, e)
                    rc, got, err = run_kvtier(a.kvtier, tfile, msgs, tools, gen, kw, tmpdir)
                    label = "%s x %s gen=%s kwargs=%s" % (t, cname, gen, json.dumps(kw))
                    if raised is not None:
                        if rc != 0:
                            match += 1
                            ok_t += 1
                            both_raise += 1
                        else:
                            failures.append("%s: python raised (%s) but kvtier rendered %d bytes" % (label, raised[:120], len(got)))
                    elif rc != 0:
                        failures.append("%s: kvtier failed: %s" % (label, err[:300]))
                    elif got != want:
                        i = first_diff(got, want)
                        failures.append("%s: differs at byte %d:\n    kvtier: %r\n    python: %r" % (
                            label, i, got[max(0, i - 60):i + 60], want[max(0, i - 60):i + 60]))
                    else:
                        match += 1
                        ok_t += 1
            per_template[t] = (ok_t, n_t)
            # multi-turn prefix property over the tool-loop conversation and a plain one
            for cname in ("03-multi-turn.json", "12-tool-loop-reasoning.json", "06-one-tool-call.json"):
                conv = json.load(open(os.path.join(a.conversations, cname), encoding="utf-8"))
                msgs, tools = conv["messages"], conv.get("tools")
                for k in range(1, len(msgs)):
                    if msgs[k]["role"] != "assistant" or msgs[k - 1]["role"] == "assistant":
                        continue
                    try:
                        before = render(env, src, msgs[:k], tools, True, {})
                        after = render(env, src, msgs[:k + 1], tools, False, {})
                    except Exception:
                        continue
                    if not after.startswith(before):
                        i = first_diff(before, after)
                        prefix_lines.append("%s x %s: turn %d re-renders from char %d: %r -> %r" % (
                            t, cname, k, i, before[i:i + 50], after[i:i + 50]))
    # small snippets that exercise one feature each, rendered over conversation 03
    snippets = json.load(open(a.snippets, encoding="utf-8")) if a.snippets else []
    conv = json.load(open(os.path.join(a.conversations, "03-multi-turn.json"), encoding="utf-8"))
    snip_ok = 0
    with tempfile.TemporaryDirectory() as tmpdir:
        for i, sn in enumerate(snippets):
            tfile = os.path.join(tmpdir, "s.jinja")
            with open(tfile, "w", encoding="utf-8") as f:
                f.write(sn)
            try:
                want, raised = render(env, sn, conv["messages"], None, True, {}).encode("utf-8"), None
            except Exception as e:
                want, raised = None, "%s: %s" % (type(e).__name__, e)
            rc, got, err = run_kvtier(a.kvtier, tfile, conv["messages"], None, True, {}, tmpdir)
            if raised is not None:
                if rc != 0:
                    snip_ok += 1
                else:
                    failures.append("snippet %d %r: python raised (%s), kvtier gave %r" % (i, sn, raised[:100], got))
            elif rc != 0:
                failures.append("snippet %d %r: kvtier failed: %s (python: %r)" % (i, sn, err[:200], want))
            elif got != want:
                failures.append("snippet %d %r:\n    kvtier: %r\n    python: %r" % (i, sn, got, want))
            else:
                snip_ok += 1
    print("templates: %d, conversations: %d, variants: %d" % (len(templates), len(convs), len(VARIANTS)))
    if snippets:
        print("snippets: %d of %d agree" % (snip_ok, len(snippets)))
    for t, (ok, n) in per_template.items():
        if ok != n:
            print("  %-55s %d/%d" % (t, ok, n))
    print("matched %d of %d renders (%d of them: both raise)" % (match, total, both_raise))
    for f in failures[:40]:
        print("MISMATCH " + f)
    if len(failures) > 40:
        print("... %d more mismatches" % (len(failures) - 40))
    if a.prefix_report:
        with open(a.prefix_report, "w", encoding="utf-8") as f:
            f.write("\n".join(prefix_lines) + ("\n" if prefix_lines else ""))
        print("prefix property: %d breaks written to %s" % (len(prefix_lines), a.prefix_report))
    return 0 if not failures else 1


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render")
    r.add_argument("--template", required=True)
    r.add_argument("--messages", required=True)
    r.add_argument("--tools")
    r.add_argument("--kwargs")
    r.add_argument("--no-generation-prompt", action="store_true")
    r.add_argument("--bos-token", default=BOS)
    r.add_argument("--eos-token", default=EOS)
    r.add_argument("--date")
    c = sub.add_parser("compare")
    c.add_argument("--kvtier", required=True)
    c.add_argument("--templates", required=True)
    c.add_argument("--conversations", required=True)
    c.add_argument("--prefix-report")
    c.add_argument("--snippets", help="a JSON list of small templates to compare too")
    c.add_argument("--only", help="only the templates whose file name contains this")
    a = ap.parse_args()
    return cmd_render(a) if a.cmd == "render" else cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
