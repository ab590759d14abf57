#!/usr/bin/env bash
# e2e: every chat template in tests/fixtures/templates (45 real templates, README there) rendered by
# `kvtier template render` over every conversation in tests/fixtures/conversations, 5 variants each
# (add_generation_prompt true/false, enable_thinking unset/true/false), must equal Debian
# python3-jinja2's rendering byte for byte (tests/jinja_oracle.py: transformers' environment and
# helpers); where Python raises, kvtier must fail too. Also: the multi-turn prefix property per
# template, compared with the list of known breaks in tests/fixtures/templates/prefix-breaks.txt,
# and the CLI's error paths (a template that does not parse, one that raises).
set -u
BUILD=${BUILD:-build}
KV=$BUILD/kvtier
T=$(mktemp -d "${TMPDIR:-/tmp}/kvt-e2e-tmpl-XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
ok()  { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails+1)); }
/usr/bin/python3 -c 'import jinja2' 2>/dev/null || { echo "skipped: missing dependency: python3-jinja2 (scripts/install-deps)"; exit 77; }

# 1. byte-for-byte against the oracle
if /usr/bin/python3 tests/jinja_oracle.py compare --kvtier "$KV" --templates tests/fixtures/templates \
     --conversations tests/fixtures/conversations --snippets tests/fixtures/jinja_snippets.json \
     --prefix-report "$T/prefix.txt" >"$T/cmp.txt" 2>&1; then
  ok "$(grep "^matched" "$T/cmp.txt"); $(grep "^snippets" "$T/cmp.txt")"
else
  cat "$T/cmp.txt"; bad "templates differ from python3-jinja2"
fi

# 2. the prefix property: breaks are properties of the templates (thinking prompts, re-rendered
#    tails); the list is documented in docs/chat-templates.md and must not change silently
if diff -u tests/fixtures/templates/prefix-breaks.txt "$T/prefix.txt" >"$T/prefix.diff"; then
  ok "prefix property: $(wc -l <"$T/prefix.txt") known breaks, no new ones"
else
  cat "$T/prefix.diff"; bad "prefix property changed (update tests/fixtures/templates/prefix-breaks.txt and the docs)"
fi

# 3. error paths of `kvtier template render`
echo '[{"role": "user", "content": "hi"}]' >"$T/m.json"
printf 'line one\n{%% for m in messages %%}\n{{ m.content }\n' >"$T/broken.jinja"
"$KV" template render --template "$T/broken.jinja" --messages "$T/m.json" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "line 3" "$T/err"; then ok "a template that does not parse: $(cat "$T/err")"
else bad "broken template: rc=$rc $(cat "$T/err")"; fi
printf '{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}' >"$T/raise.jinja"
"$KV" template render --template "$T/raise.jinja" --messages "$T/m.json" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "roles must alternate" "$T/err" && [ ! -s "$T/out" ]; then ok "a template that raises"
else bad "raising template: rc=$rc $(cat "$T/err")"; fi
echo '{"not": "a list"}' >"$T/bad.json"
"$KV" template render --template tests/fixtures/templates/Qwen-Qwen3-0.6B.jinja --messages "$T/bad.json" >"$T/out" 2>"$T/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "messages" "$T/err"; then ok "messages that are not a list"; else bad "bad messages: rc=$rc"; fi
# strftime_now: the fixed date, and --date
printf '{{ strftime_now("%%d %%b %%Y") }}' >"$T/date.jinja"
[ "$("$KV" template render --template "$T/date.jinja" --messages "$T/m.json")" = "01 Jan 2026" ] && ok "strftime_now default date" || bad "strftime_now default"
[ "$("$KV" template render --template "$T/date.jinja" --messages "$T/m.json" --date 2025-07-26)" = "26 Jul 2025" ] && ok "--date" || bad "--date"

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all template checks passed"
