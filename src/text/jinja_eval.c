/*
 * jinja_eval.c — renders a parsed template: statements, expressions, scopes, macros and loops, with
 * the caps that bound a render (kvt_jinja_limits), and the public create/free/render entry points.
 *
 * Scopes follow jinja2: the render has a root frame over the context variables; each for-loop
 * iteration and each macro call gets a fresh frame whose parent is the enclosing one, so a `set`
 * inside a loop body is not seen after the loop (namespace() objects carry state across).
 *
 * Invariants:
 *   1. Every error raises with jraise: the message goes to ctx->err and control longjmps to
 *      kvt_jinja_render, which frees the render's arena and scratch buffers. Nothing allocated
 *      during a render outlives it except the returned text.
 *   2. depth counts nested evaluations (statements, expressions, macro calls) and never exceeds
 *      lim.max_depth; steps counts loop iterations, macro calls and items filters visit, capped
 *      at lim.max_steps; the output (and each captured block) is capped at lim.max_output bytes.
 *   3. loop_ctl is non-zero only while a {% break %}/{% continue %} unwinds to its loop.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_int.h"

#define KEEP_CHUNK_BYTES (8u << 20) /* per template: memory kept between renders for reuse */

static const kvt_jinja_limits k_default_limits = {400, 5000000, 32u << 20, 256u << 20};

_Noreturn void jraise(jctx *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (c->err && c->errlen) vsnprintf(c->err, c->errlen, fmt, ap);
    va_end(ap);
    c->st = KVT_ERR_INVALID_ARG;
    longjmp(c->jb, 1);
}

_Noreturn void jraise_node(jctx *c, const jnode *n, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    jraise(c, "%s (template line %u)", msg, n ? n->line : 0);
}

void jstep(jctx *c, uint64_t n) {
    c->steps += n;
    if (c->steps > c->lim.max_steps)
        jraise(c, "the template ran more than %llu steps (cap)", (unsigned long long)c->lim.max_steps);
}

kvt_strbuf *jbuf(jctx *c) {
    if (c->nbufs >= JBUF_MAX) jraise(c, "template nested too deeply");
    kvt_strbuf *b = &c->bufs[c->nbufs++];
    memset(b, 0, sizeof *b);
    return b;
}
void jbuf_drop(jctx *c, kvt_strbuf *b) {
    kvt_strbuf_free(b);
    if (c->nbufs > 0 && b == &c->bufs[c->nbufs - 1]) c->nbufs--;
}
jv jbuf_str(jctx *c, kvt_strbuf *b) {
    if (b->oom) jraise(c, "out of memory");
    jv v = jv_str(&c->a, b->p ? b->p : "", b->n);
    jbuf_drop(c, b);
    return v;
}

static void out_check(jctx *c) {
    if (c->out->oom) jraise(c, "out of memory");
    if (c->out->n > c->lim.max_output) jraise(c, "the template produced more than %zu bytes (cap)", c->lim.max_output);
}

static void enter(jctx *c, const jnode *n) {
    if (++c->depth > c->lim.max_depth)
        jraise_node(c, n, "the template nested deeper than %u levels (recursion cap)", c->lim.max_depth);
}

/* ---- scopes ---- */
static jframe *frame_new(jctx *c, jframe *parent) {
    jframe *f = ja_alloc(&c->a, sizeof *f);
    f->vars = jv_dict(&c->a).d;
    f->parent = parent;
    return f;
}
static jv strkey(const jstr *s) {
    jv k = {0};
    k.t = JV_STR;
    k.s = s;
    return k;
}
static jv lookup(jctx *c, jframe *f, const jstr *name) {
    for (; f; f = f->parent) {
        jv *v = jd_get(f->vars, strkey(name));
        if (v) return *v;
    }
    jv *g = jd_get(c->globals, strkey(name));
    if (g) return *g;
    jv out;
    if (jb_global(c, name, &out)) return out;
    return jv_undef(name);
}

static _Noreturn void raise_undef(jctx *c, const jnode *n, jv u) {
    if (u.unsafe && u.s) jraise(c, "%.*s", (int)u.s->n, u.s->p);
    if (u.s) jraise_node(c, n, "'%.*s' is undefined", (int)u.s->n, u.s->p);
    jraise_node(c, n, "undefined value");
}

static jv eval(jctx *c, jframe *f, const jnode *n);
static void exec_body(jctx *c, jframe *f, const jnlist *body);

/* ---- attribute / item access (jinja2's sandboxed getattr / getitem) ---- */
static jv loop_attr(jctx *c, jloop *lp, const jstr *name) {
    size_t n = lp->items->n, i = lp->i;
#define IS(s) (name->n == strlen(s) && !memcmp(name->p, s, name->n))
    if (IS("index")) return jv_int((int64_t)i + 1);
    if (IS("index0")) return jv_int((int64_t)i);
    if (IS("revindex")) return jv_int((int64_t)(n - i));
    if (IS("revindex0")) return jv_int((int64_t)(n - i - 1));
    if (IS("first")) return jv_bool(i == 0);
    if (IS("last")) return jv_bool(i + 1 == n);
    if (IS("length")) return jv_int((int64_t)n);
    if (IS("depth")) return jv_int(lp->depth);
    if (IS("depth0")) return jv_int(lp->depth - 1);
    if (IS("previtem")) return i > 0 ? lp->items->v[i - 1] : jv_undef(name);
    if (IS("nextitem")) return i + 1 < n ? lp->items->v[i + 1] : jv_undef(name);
#undef IS
    jv self = {0};
    self.t = JV_LOOP;
    self.lp = lp;
    return jb_getattr(c, self, name);
}

static jv getattr_v(jctx *c, const jnode *n, jv obj, const jstr *name) {
    switch (obj.t) {
    case JV_UNDEF: raise_undef(c, n, obj);
    case JV_DICT: {
        jv m = jb_getattr(c, obj, name); /* dict methods win, as in Python's getattr */
        if (m.t != JV_UNDEF || m.unsafe) return m;
        jv *v = jd_get(obj.d, strkey(name));
        return v ? *v : jv_undef(name);
    }
    case JV_NS: {
        jv *v = jd_get(obj.d, strkey(name));
        return v ? *v : jv_undef(name);
    }
    case JV_LOOP: return loop_attr(c, obj.lp, name);
    default: return jb_getattr(c, obj, name);
    }
}

static bool index_of(int64_t i, size_t n, size_t *out) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *out = (size_t)i;
    return true;
}

static jv getitem_v(jctx *c, const jnode *n, jv obj, jv key) {
    if (obj.t == JV_UNDEF) raise_undef(c, n, obj);
    bool intkey = key.t == JV_INT || key.t == JV_BOOL;
    int64_t ki = key.t == JV_INT ? key.i : key.t == JV_BOOL ? key.b : 0;
    size_t at;
    if (obj.t == JV_LIST && jl_special(obj.l)) return jv_undef(NULL); /* not subscriptable */
    if (obj.t == JV_LIST && intkey) {
        if (index_of(ki, obj.l->n, &at)) return obj.l->v[at];
    } else if (obj.t == JV_STR && intkey) {
        size_t len = ju_len(obj.s->p, obj.s->n);
        if (index_of(ki, len, &at)) {
            size_t a = ju_offset(obj.s->p, obj.s->n, at), b = ju_offset(obj.s->p, obj.s->n, at + 1);
            return jv_str_ref(&c->a, obj.s->p + a, b - a);
        }
    } else if (obj.t == JV_DICT || obj.t == JV_NS) {
        jv *v = jd_get(obj.d, key);
        if (v) return *v;
    } else if (obj.t == JV_LOOP && key.t == JV_STR) {
        return loop_attr(c, obj.lp, key.s);
    }
    if (key.t == JV_STR && obj.t != JV_NS) return jb_getattr(c, obj, key.s); /* methods, else undefined */
    return jv_undef(NULL);
}

/* Python slice indices for a sequence of length len */
static void slice_idx(jctx *c, const jnode *n, jv a, jv b, jv s, int64_t len, int64_t *start, int64_t *stop,
                      int64_t *step) {
    *step = 1;
    if (s.t != JV_NONE && s.t != JV_UNDEF) {
        if (s.t != JV_INT && s.t != JV_BOOL) jraise_node(c, n, "slice indices must be integers or None");
        *step = s.t == JV_INT ? s.i : s.b;
        if (*step == 0) jraise_node(c, n, "slice step cannot be zero");
    }
    int64_t def_start = *step < 0 ? len - 1 : 0, def_stop = *step < 0 ? -1 : len;
    jv in[2] = {a, b};
    int64_t *o[2] = {start, stop};
    int64_t d[2] = {def_start, def_stop};
    for (int k = 0; k < 2; k++) {
        if (in[k].t == JV_NONE || in[k].t == JV_UNDEF) {
            *o[k] = d[k];
            continue;
        }
        if (in[k].t != JV_INT && in[k].t != JV_BOOL) jraise_node(c, n, "slice indices must be integers or None");
        int64_t v = in[k].t == JV_INT ? in[k].i : in[k].b;
        if (v < 0) {
            v += len;
            if (v < 0) v = *step < 0 ? -1 : 0;
        } else if (v >= len) v = *step < 0 ? len - 1 : len;
        *o[k] = v;
    }
}

static jv do_slice(jctx *c, const jnode *n, jv obj, jv a, jv b, jv s) {
    if (obj.t == JV_UNDEF) raise_undef(c, n, obj);
    int64_t st, sp, step;
    if (obj.t == JV_LIST && !jl_special(obj.l)) {
        slice_idx(c, n, a, b, s, (int64_t)obj.l->n, &st, &sp, &step);
        jv r = jv_list(&c->a, 0);
        r.l->tuple = obj.l->tuple;
        for (int64_t i = st; step > 0 ? i < sp : i > sp; i += step) jl_push(&c->a, r.l, obj.l->v[i]);
        return r;
    }
    if (obj.t == JV_STR) {
        size_t len = ju_len(obj.s->p, obj.s->n);
        slice_idx(c, n, a, b, s, (int64_t)len, &st, &sp, &step);
        if (step == 1 && len == obj.s->n) return jv_str_ref(&c->a, obj.s->p + st, sp > st ? (size_t)(sp - st) : 0);
        kvt_strbuf *buf = jbuf(c);
        for (int64_t i = st; step > 0 ? i < sp : i > sp; i += step) {
            size_t x = ju_offset(obj.s->p, obj.s->n, (size_t)i), y = ju_offset(obj.s->p, obj.s->n, (size_t)i + 1);
            kvt_strbuf_add(buf, obj.s->p + x, y - x);
        }
        return jbuf_str(c, buf);
    }
    return jv_undef(NULL);
}

/* ---- arithmetic ---- */
static bool num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static bool intlike(jv v) { return v.t == JV_INT || v.t == JV_BOOL; }
static int64_t ival(jv v) { return v.t == JV_INT ? v.i : v.t == JV_BOOL ? v.b : 0; }
static double fval(jv v) { return v.t == JV_FLOAT ? v.f : (double)ival(v); }

static const char *op_sym(int op) {
    static const char *s[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    return op >= OP_ADD && op <= OP_POW ? s[op] : "?";
}

static _Noreturn void type_err(jctx *c, const jnode *n, int op, jv a, jv b) {
    if (a.t == JV_UNDEF) raise_undef(c, n, a);
    if (b.t == JV_UNDEF) raise_undef(c, n, b);
    jraise_node(c, n, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), jv_type_name(a), jv_type_name(b));
}

static jv repeat(jctx *c, const jnode *n, jv seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.t == JV_STR) {
        if (seq.s->n && (uint64_t)times > c->lim.max_memory / seq.s->n) jraise_node(c, n, "string repetition too large");
        kvt_strbuf *b = jbuf(c);
        for (int64_t i = 0; i < times; i++) kvt_strbuf_add(b, seq.s->p, seq.s->n);
        return jbuf_str(c, b);
    }
    if (seq.l->n && (uint64_t)times > c->lim.max_memory / (seq.l->n * sizeof(jv))) jraise_node(c, n, "list repetition too large");
    jv r = jv_list(&c->a, 0);
    r.l->tuple = seq.l->tuple;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.l->n; k++) jl_push(&c->a, r.l, seq.l->v[k]);
    return r;
}

static jv binop(jctx *c, const jnode *n, int op, jv a, jv b) {
    if (num(a) && num(b)) {
        bool ints = intlike(a) && intlike(b);
        int64_t x = ival(a), y = ival(b), r;
        double fx = fval(a), fy = fval(b);
        switch (op) {
        case OP_ADD:
            if (ints) {
                if (__builtin_add_overflow(x, y, &r)) jraise_node(c, n, "integer overflow");
                return jv_int(r);
            }
            return jv_float(fx + fy);
        case OP_SUB:
            if (ints) {
                if (__builtin_sub_overflow(x, y, &r)) jraise_node(c, n, "integer overflow");
                return jv_int(r);
            }
            return jv_float(fx - fy);
        case OP_MUL:
            if (ints) {
                if (__builtin_mul_overflow(x, y, &r)) jraise_node(c, n, "integer overflow");
                return jv_int(r);
            }
            return jv_float(fx * fy);
        case OP_DIV:
            if (fy == 0) jraise_node(c, n, "division by zero");
            return jv_float(fx / fy);
        case OP_FLOORDIV:
        case OP_MOD:
            if (ints) {
                if (y == 0) jraise_node(c, n, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) jraise_node(c, n, "integer overflow");
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) q--, m += y;
                return jv_int(op == OP_MOD ? m : q);
            }
            if (fy == 0) jraise_node(c, n, "float division by zero");
            {
                double m = fmod(fx, fy);
                if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
                if (op == OP_MOD) return jv_float(m);
                return jv_float(floor(fx / fy));
            }
        case OP_POW:
            if (ints && y >= 0) {
                int64_t acc = 1, base = x;
                for (int64_t e = y; e; e >>= 1) {
                    if (e & 1)
                        if (__builtin_mul_overflow(acc, base, &acc)) jraise_node(c, n, "integer overflow");
                    if (e > 1 && __builtin_mul_overflow(base, base, &base)) jraise_node(c, n, "integer overflow");
                }
                return jv_int(acc);
            }
            if (fx == 0 && fy < 0) jraise_node(c, n, "0.0 cannot be raised to a negative power");
            return jv_float(pow(fx, fy));
        }
    }
    if (op == OP_ADD && a.t == JV_STR && b.t == JV_STR) {
        bool mk = a.markup || b.markup;
        if (mk && !a.markup) a = jb_html_escape(c, a);
        if (mk && !b.markup) b = jb_html_escape(c, b);
        kvt_strbuf *s = jbuf(c);
        kvt_strbuf_add(s, a.s->p, a.s->n);
        kvt_strbuf_add(s, b.s->p, b.s->n);
        jv r = jbuf_str(c, s);
        r.markup = mk;
        return r;
    }
    if (op == OP_ADD && a.t == JV_LIST && b.t == JV_LIST && a.l->tuple == b.l->tuple && !jl_special(a.l) &&
        !jl_special(b.l)) {
        jv r = jv_list(&c->a, a.l->n + b.l->n);
        r.l->tuple = a.l->tuple;
        for (size_t i = 0; i < a.l->n; i++) jl_push(&c->a, r.l, a.l->v[i]);
        for (size_t i = 0; i < b.l->n; i++) jl_push(&c->a, r.l, b.l->v[i]);
        return r;
    }
    if (op == OP_MUL && (a.t == JV_STR || (a.t == JV_LIST && !jl_special(a.l))) && intlike(b)) return repeat(c, n, a, ival(b));
    if (op == OP_MUL && (b.t == JV_STR || (b.t == JV_LIST && !jl_special(b.l))) && intlike(a)) return repeat(c, n, b, ival(a));
    if (op == OP_MOD && a.t == JV_STR) jraise_node(c, n, "printf-style string formatting is not supported");
    type_err(c, n, op, a, b);
}

static bool contains(jctx *c, const jnode *n, jv item, jv cont) {
    switch (cont.t) {
    case JV_STR:
        if (item.t != JV_STR) jraise_node(c, n, "'in <string>' requires string as left operand, not %s", jv_type_name(item));
        return item.s->n == 0 || memmem(cont.s->p, cont.s->n, item.s->p, item.s->n) != NULL;
    case JV_LIST: {
        jlist *l = jv_iterate(c, cont);
        jstep(c, l->n);
        for (size_t i = 0; i < l->n; i++)
            if (jv_eq(c, item, l->v[i], 0)) return true;
        return false;
    }
    case JV_DICT: return jd_get(cont.d, item) != NULL;
    case JV_UNDEF: return false;
    default: jraise_node(c, n, "argument of type '%s' is not iterable", jv_type_name(cont));
    }
}

static bool compare(jctx *c, const jnode *n, int op, jv a, jv b) {
    switch (op) {
    case OP_EQ: return jv_eq(c, a, b, 0);
    case OP_NE: return !jv_eq(c, a, b, 0);
    case OP_IN: return contains(c, n, a, b);
    case OP_NOTIN: return !contains(c, n, a, b);
    }
    if (num(a) && num(b) && (isnan(fval(a)) || isnan(fval(b)))) return false;
    int r = jv_cmp(c, a, b, 0);
    switch (op) {
    case OP_LT: return r < 0;
    case OP_LE: return r <= 0;
    case OP_GT: return r > 0;
    default: return r >= 0;
    }
}

/* ---- calls ---- */
static void eval_args(jctx *c, jframe *f, const jnode *n, jv **args, size_t *nargs, const jstr ***kwn, jv **kwv,
                      size_t *nkw, size_t extra_kw) {
    size_t na = n->args.n, nk = n->n_kw;
    jlist *dyn = NULL;
    jdict *dk = NULL;
    if (n->dyn_args) {
        jv d = eval(c, f, n->dyn_args);
        dyn = jv_iterate(c, d);
        na += dyn->n;
    }
    if (n->dyn_kw) {
        jv d = eval(c, f, n->dyn_kw);
        if (d.t != JV_DICT) jraise_node(c, n, "argument after ** must be a mapping, not %s", jv_type_name(d));
        dk = d.d;
        nk += dk->n;
    }
    *args = ja_alloc(&c->a, (na + 1) * sizeof(jv));
    *kwn = ja_alloc(&c->a, (nk + extra_kw + 1) * sizeof(jstr *));
    *kwv = ja_alloc(&c->a, (nk + extra_kw + 1) * sizeof(jv));
    size_t i = 0;
    for (uint32_t k = 0; k < n->args.n; k++) (*args)[i++] = eval(c, f, n->args.v[k]);
    for (size_t k = 0; dyn && k < dyn->n; k++) (*args)[i++] = dyn->v[k];
    *nargs = i;
    size_t j = 0;
    for (uint32_t k = 0; k < n->n_kw; k++) {
        (*kwn)[j] = n->kwnames[k];
        (*kwv)[j++] = eval(c, f, n->args2.v[k]);
    }
    for (size_t k = 0; dk && k < dk->n; k++) {
        if (dk->k[k].t != JV_STR) jraise_node(c, n, "keywords must be strings");
        (*kwn)[j] = dk->k[k].s;
        (*kwv)[j++] = dk->v[k];
    }
    *nkw = j;
}

static jv call_macro(jctx *c, const jnode *n, jmacro *m, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
                     size_t nkw) {
    enter(c, n);
    jstep(c, 1);
    const jnode *d = m->def;
    jframe *f = frame_new(c, m->closure);
    jv varargs = jv_list(&c->a, 0);
    varargs.l->tuple = true;
    jv kwargs = jv_dict(&c->a);
    bool *set = ja_alloc(&c->a, d->args.n + 1);
    bool is_macro = d->kind == S_MACRO;
    if (is_macro && nargs > d->args.n && !(d->op & MACRO_USES_VARARGS))
        jraise_node(c, n, "macro '%.*s' takes not more than %u argument(s)", (int)d->name->n, d->name->p, d->args.n);
    for (size_t i = 0; i < nargs; i++) {
        if (i < d->args.n) {
            jd_set(&c->a, f->vars, strkey(d->args.v[i]->name), args[i]);
            set[i] = true;
        } else jl_push(&c->a, varargs.l, args[i]);
    }
    jv caller = m->caller;
    for (size_t k = 0; k < nkw; k++) {
        uint32_t p = 0;
        for (; p < d->args.n; p++)
            if (d->args.v[p]->name->n == kwn[k]->n && !memcmp(d->args.v[p]->name->p, kwn[k]->p, kwn[k]->n)) break;
        if (p < d->args.n) {
            if (set[p]) jraise_node(c, n, "macro got multiple values for argument '%.*s'", (int)kwn[k]->n, kwn[k]->p);
            jd_set(&c->a, f->vars, strkey(d->args.v[p]->name), kwv[k]);
            set[p] = true;
        } else if (kwn[k]->n == 6 && !memcmp(kwn[k]->p, "caller", 6) && (!is_macro || (d->op & MACRO_USES_CALLER)))
            caller = kwv[k];
        else if (!is_macro || (d->op & MACRO_USES_KWARGS)) jd_set(&c->a, kwargs.d, strkey(kwn[k]), kwv[k]);
        else
            jraise_node(c, n, "macro '%.*s' takes no keyword argument '%.*s'", (int)d->name->n, d->name->p,
                        (int)kwn[k]->n, kwn[k]->p);
    }
    for (uint32_t p = 0; p < d->args.n; p++)
        if (!set[p])
            jd_set(&c->a, f->vars, strkey(d->args.v[p]->name),
                   d->args2.v[p] ? eval(c, f, d->args2.v[p]) : jv_undef(d->args.v[p]->name));
    static const jstr s_varargs = {7, "varargs"}, s_kwargs = {6, "kwargs"}, s_caller = {6, "caller"};
    jd_set(&c->a, f->vars, strkey(&s_varargs), varargs);
    jd_set(&c->a, f->vars, strkey(&s_kwargs), kwargs);
    if (caller.t != JV_UNDEF) jd_set(&c->a, f->vars, strkey(&s_caller), caller);
    kvt_strbuf *save = c->out, *b = jbuf(c);
    c->out = b;
    exec_body(c, f, &d->body);
    c->out = save;
    c->depth--;
    return jbuf_str(c, b);
}

jv je_call(jctx *c, const jnode *n, jv fn, jv *args, size_t nargs, const jstr **kwn, jv *kwv, size_t nkw) {
    switch (fn.t) {
    case JV_MACRO: return call_macro(c, n, fn.m, args, nargs, kwn, kwv, nkw);
    case JV_FUNC: return jb_call_func(c, n, fn.fn, args, nargs, kwn, kwv, nkw);
    case JV_UNDEF: raise_undef(c, n, fn);
    default: jraise_node(c, n, "'%s' object is not callable", jv_type_name(fn));
    }
}

/* ---- expressions ---- */
static jv eval_filter(jctx *c, jframe *f, const jnode *n) {
    jv x = n->a ? eval(c, f, n->a) : c->filter_input;
    if (n->fid < 0) jraise_node(c, n, "No filter named '%.*s'.", (int)n->name->n, n->name->p);
    jv *args, *kwv;
    const jstr **kwn;
    size_t na, nk;
    eval_args(c, f, n, &args, &na, &kwn, &kwv, &nk, 0);
    return jb_filter(c, n, n->fid, x, args, na, kwn, kwv, nk, f);
}

static jv eval(jctx *c, jframe *f, const jnode *n) {
    enter(c, n);
    jv r;
    switch (n->kind) {
    case E_CONST: r = n->val; break;
    case E_NAME: r = lookup(c, f, n->name); break;
    case E_LIST:
    case E_TUPLE:
        r = jv_list(&c->a, n->args.n);
        r.l->tuple = n->kind == E_TUPLE;
        for (uint32_t i = 0; i < n->args.n; i++) jl_push(&c->a, r.l, eval(c, f, n->args.v[i]));
        break;
    case E_DICT:
        r = jv_dict(&c->a);
        for (uint32_t i = 0; i < n->args.n; i++) {
            jv k = eval(c, f, n->args.v[i]);
            if (k.t == JV_LIST && !k.l->tuple) jraise_node(c, n, "unhashable type: 'list'");
            if (k.t == JV_DICT) jraise_node(c, n, "unhashable type: 'dict'");
            jd_set(&c->a, r.d, k, eval(c, f, n->args2.v[i]));
        }
        break;
    case E_ATTR: r = getattr_v(c, n, eval(c, f, n->a), n->name); break;
    case E_ITEM: {
        jv o = eval(c, f, n->a);
        r = getitem_v(c, n, o, eval(c, f, n->b));
        break;
    }
    case E_SLICE: {
        jv o = eval(c, f, n->a);
        jv a = n->b ? eval(c, f, n->b) : jv_none();
        jv b = n->c->b ? eval(c, f, n->c->b) : jv_none();
        jv s = n->c->c ? eval(c, f, n->c->c) : jv_none();
        r = do_slice(c, n, o, a, b, s);
        break;
    }
    case E_CALL: {
        jv fn = eval(c, f, n->a);
        jv *args, *kwv;
        const jstr **kwn;
        size_t na, nk;
        eval_args(c, f, n, &args, &na, &kwn, &kwv, &nk, 0);
        r = je_call(c, n, fn, args, na, kwn, kwv, nk);
        break;
    }
    case E_FILTER: r = eval_filter(c, f, n); break;
    case E_TEST: {
        jv x = eval(c, f, n->a);
        if (n->fid < 0) jraise_node(c, n, "No test named '%.*s'.", (int)n->name->n, n->name->p);
        jv *args, *kwv;
        const jstr **kwn;
        size_t na, nk;
        eval_args(c, f, n, &args, &na, &kwn, &kwv, &nk, 0);
        bool t = jb_test(c, n, n->fid, x, args, na);
        r = jv_bool(n->neg ? !t : t);
        break;
    }
    case E_NEG:
    case E_POS: {
        jv x = eval(c, f, n->a);
        if (x.t == JV_UNDEF) raise_undef(c, n, x);
        if (!num(x)) jraise_node(c, n, "bad operand type for unary %c: '%s'", n->kind == E_NEG ? '-' : '+', jv_type_name(x));
        if (n->kind == E_POS) r = x.t == JV_BOOL ? jv_int(x.b) : x;
        else if (x.t == JV_FLOAT) r = jv_float(-x.f);
        else {
            if (ival(x) == INT64_MIN) jraise_node(c, n, "integer overflow");
            r = jv_int(-ival(x));
        }
        break;
    }
    case E_NOT: r = jv_bool(!jv_truthy(eval(c, f, n->a))); break;
    case E_AND: {
        jv a = eval(c, f, n->a);
        r = jv_truthy(a) ? eval(c, f, n->b) : a;
        break;
    }
    case E_OR: {
        jv a = eval(c, f, n->a);
        r = jv_truthy(a) ? a : eval(c, f, n->b);
        break;
    }
    case E_BIN: {
        jv a = eval(c, f, n->a);
        jv b = eval(c, f, n->b);
        r = binop(c, n, n->op, a, b);
        break;
    }
    case E_CMP: {
        jv a = eval(c, f, n->a);
        r = jv_bool(true);
        for (uint32_t i = 0; i < n->args.n; i++) {
            jv b = eval(c, f, n->args.v[i]);
            if (!compare(c, n, n->cmp_ops[i], a, b)) {
                r = jv_bool(false);
                break;
            }
            a = b;
        }
        break;
    }
    case E_COND:
        if (jv_truthy(eval(c, f, n->a))) r = eval(c, f, n->b);
        else r = n->c ? eval(c, f, n->c) : jv_undef(NULL);
        break;
    case E_CONCAT: {
        kvt_strbuf *b = jbuf(c);
        for (uint32_t i = 0; i < n->args.n; i++) {
            jv x = eval(c, f, n->args.v[i]);
            if (x.t != JV_UNDEF) jv_to_str(c, b, x);
        }
        r = jbuf_str(c, b);
        break;
    }
    default: jraise_node(c, n, "internal error: bad expression node");
    }
    c->depth--;
    return r;
}

/* ---- statements ---- */
static void assign(jctx *c, jframe *f, const jnode *t, jv v) {
    if (t->kind == E_NAME) {
        jd_set(&c->a, f->vars, strkey(t->name), v);
    } else if (t->kind == E_ATTR) {
        jv ns = lookup(c, f, t->a->name);
        if (ns.t != JV_NS) jraise_node(c, t, "cannot assign attribute on non-namespace object");
        jd_set(&c->a, ns.d, strkey(t->name), v);
    } else { /* tuple */
        jlist *l = jv_iterate(c, v);
        if (l->n != t->args.n)
            jraise_node(c, t, l->n > t->args.n ? "too many values to unpack (expected %u)" : "not enough values to unpack (expected %u)",
                        t->args.n);
        for (uint32_t i = 0; i < t->args.n; i++) assign(c, f, t->args.v[i], l->v[i]);
    }
}

static void write_str(jctx *c, jv v) {
    if (v.t == JV_UNDEF) return;
    jv_to_str(c, c->out, v);
    out_check(c);
}

static jv capture(jctx *c, jframe *f, const jnlist *body) {
    kvt_strbuf *save = c->out, *b = jbuf(c);
    c->out = b;
    exec_body(c, f, body);
    c->out = save;
    return jbuf_str(c, b);
}

static void exec_for(jctx *c, jframe *f, const jnode *n) {
    jv it = eval(c, f, n->a);
    jlist *src = jv_iterate(c, it);
    jlist *items = src;
    if (n->c) { /* loop filter: evaluated with the target bound, before the loop */
        items = jv_list(&c->a, 0).l;
        for (size_t i = 0; i < src->n; i++) {
            jstep(c, 1);
            jframe *tf = frame_new(c, f);
            assign(c, tf, n->b, src->v[i]);
            if (jv_truthy(eval(c, tf, n->c))) jl_push(&c->a, items, src->v[i]);
        }
    } else if (src->n) { /* snapshot: the body cannot change what it iterates */
        items = jv_list(&c->a, src->n).l;
        memcpy(items->v, src->v, src->n * sizeof(jv));
        items->n = src->n;
    }
    if (!items->n) {
        if (n->ebody.n) exec_body(c, f, &n->ebody);
        return;
    }
    jloop *lp = ja_alloc(&c->a, sizeof *lp);
    lp->items = items;
    lp->depth = 1; /* loop.depth counts `recursive` levels, which are not supported */
    jv lv = {0};
    lv.t = JV_LOOP;
    lv.lp = lp;
    static const jstr s_loop = {4, "loop"};
    for (size_t i = 0; i < items->n; i++) {
        jstep(c, 1);
        lp->i = i;
        jframe *lf = frame_new(c, f);
        jd_set(&c->a, lf->vars, strkey(&s_loop), lv);
        assign(c, lf, n->b, items->v[i]);
        exec_body(c, lf, &n->body);
        if (c->loop_ctl == 1) {
            c->loop_ctl = 0;
            break;
        }
        c->loop_ctl = 0;
    }
}

static void exec_stmt(jctx *c, jframe *f, const jnode *n) {
    enter(c, n);
    switch (n->kind) {
    case S_DATA:
        kvt_strbuf_add(c->out, n->val.s->p, n->val.s->n);
        out_check(c);
        break;
    case S_OUTPUT: write_str(c, eval(c, f, n->a)); break;
    case S_IF:
        if (jv_truthy(eval(c, f, n->a))) exec_body(c, f, &n->body);
        else exec_body(c, f, &n->ebody);
        break;
    case S_FOR: exec_for(c, f, n); break;
    case S_SET: assign(c, f, n->b, eval(c, f, n->a)); break;
    case S_SETBLOCK: {
        jv v = capture(c, f, &n->body);
        if (n->c) {
            jv save = c->filter_input;
            c->filter_input = v;
            v = eval(c, f, n->c);
            c->filter_input = save;
        }
        assign(c, f, n->b, v);
        break;
    }
    case S_MACRO: {
        jv m = {0};
        m.t = JV_MACRO;
        m.m = ja_alloc(&c->a, sizeof *m.m);
        m.m->def = n;
        m.m->closure = f;
        jd_set(&c->a, f->vars, strkey(n->name), m);
        break;
    }
    case S_CALLBLOCK: {
        jv caller = {0};
        caller.t = JV_MACRO;
        caller.m = ja_alloc(&c->a, sizeof *caller.m);
        caller.m->def = n;
        caller.m->closure = f;
        const jnode *call = n->a;
        jv fn = eval(c, f, call->a);
        jv *args, *kwv;
        const jstr **kwn;
        size_t na, nk;
        eval_args(c, f, call, &args, &na, &kwn, &kwv, &nk, 1);
        static const jstr s_caller = {6, "caller"};
        kwn[nk] = &s_caller;
        kwv[nk++] = caller;
        write_str(c, je_call(c, call, fn, args, na, kwn, kwv, nk));
        break;
    }
    case S_FILTERBLOCK: {
        jv v = capture(c, f, &n->body);
        jv save = c->filter_input;
        c->filter_input = v;
        v = eval(c, f, n->c);
        c->filter_input = save;
        write_str(c, v);
        break;
    }
    case S_BREAK: c->loop_ctl = 1; break;
    case S_CONTINUE: c->loop_ctl = 2; break;
    case S_BLOCK: exec_body(c, f, &n->body); break;
    default: jraise_node(c, n, "internal error: bad statement node");
    }
    c->depth--;
}

static void exec_body(jctx *c, jframe *f, const jnlist *body) {
    for (uint32_t i = 0; i < body->n && !c->loop_ctl; i++) exec_stmt(c, f, body->v[i]);
}

/* ---- public API ---- */
kvt_status kvt_jinja_template_create(const char *src, size_t len, kvt_jinja_template **out, char *err,
                                     size_t errlen) {
    *out = NULL;
    if (!src) len = 0;
    kvt_jinja_template *t = calloc(1, sizeof *t);
    if (!t) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "template: out of memory");
    pthread_mutex_init(&t->mu, NULL);
    kvt_status st = jinja_parse(t, src ? src : "", len, err, errlen);
    if (st != KVT_OK) {
        kvt_jinja_template_free(t);
        return st;
    }
    *out = t;
    return KVT_OK;
}

void kvt_jinja_template_free(kvt_jinja_template *t) {
    if (!t) return;
    ja_free_all(&t->arena);
    jarena spare = {.spare = t->spare};
    ja_free_all(&spare);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static bool parse_now(const char *s, struct tm_fixed *t) {
    memset(t, 0, sizeof *t);
    int n = sscanf(s, "%d-%d-%d %d:%d:%d", &t->y, &t->mo, &t->d, &t->h, &t->mi, &t->s);
    if (n != 3 && n != 6) return false;
    return t->y >= 1 && t->y <= 9999 && t->mo >= 1 && t->mo <= 12 && t->d >= 1 && t->d <= 31 && t->h >= 0 &&
           t->h < 24 && t->mi >= 0 && t->mi < 60 && t->s >= 0 && t->s < 61;
}

kvt_status kvt_jinja_render(const kvt_jinja_template *t, const char *ctx_json, size_t ctx_len,
                            const kvt_jinja_render_opts *opts, char **out, size_t *out_len, char *err,
                            size_t errlen) {
    *out = NULL;
    if (out_len) *out_len = 0;
    jctx *c = calloc(1, sizeof *c);
    if (!c) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "template: out of memory");
    c->lim = opts && opts->limits ? *opts->limits : k_default_limits;
    if (!c->lim.max_depth) c->lim.max_depth = k_default_limits.max_depth;
    if (!c->lim.max_steps) c->lim.max_steps = k_default_limits.max_steps;
    if (!c->lim.max_output) c->lim.max_output = k_default_limits.max_output;
    if (!c->lim.max_memory) c->lim.max_memory = k_default_limits.max_memory;
    c->err = err;
    c->errlen = errlen;
    if (!parse_now(opts && opts->now ? opts->now : KVT_JINJA_DEFAULT_DATE, &c->now)) {
        free(c);
        return kvt_errf(err, errlen, KVT_ERR_INVALID_ARG, "template: bad date '%s' (want YYYY-MM-DD[ HH:MM:SS])", opts->now);
    }
    c->a.cap = c->lim.max_memory;
    pthread_mutex_lock((pthread_mutex_t *)&t->mu);
    c->a.spare = ((kvt_jinja_template *)t)->spare;
    ((kvt_jinja_template *)t)->spare = NULL;
    pthread_mutex_unlock((pthread_mutex_t *)&t->mu);
    kvt_strbuf outb = {0};
    kvt_status st = KVT_OK;
    if (setjmp(c->jb)) {
        st = c->st ? c->st : KVT_ERR_INVALID_ARG;
        goto done;
    }
    c->a.ctx = c;
    c->globals = jv_dict(&c->a).d;
    if (ctx_json && ctx_len) {
        jv g;
        if (!jv_from_json(&c->a, ctx_json, ctx_len, &g, err, errlen)) {
            st = KVT_ERR_FORMAT;
            goto done;
        }
        if (g.t != JV_DICT) {
            st = kvt_errf(err, errlen, KVT_ERR_FORMAT, "template: the context must be a JSON object");
            goto done;
        }
        c->globals = g.d;
    }
    c->out = &outb;
    jframe *root = frame_new(c, NULL);
    exec_body(c, root, &t->root);
    if (outb.oom) jraise(c, "out of memory");
    *out = kvt_strbuf_take(&outb, out_len);
    if (!*out) st = kvt_errf(err, errlen, KVT_ERR_NOMEM, "template: out of memory");
done:
    kvt_strbuf_free(&outb);
    for (int i = 0; i < c->nbufs; i++) kvt_strbuf_free(&c->bufs[i]);
    {
        jarena_chunk *keep = ja_take_chunks(&c->a, KEEP_CHUNK_BYTES);
        kvt_jinja_template *mt = (kvt_jinja_template *)t;
        pthread_mutex_lock(&mt->mu);
        if (!mt->spare) mt->spare = keep, keep = NULL;
        pthread_mutex_unlock(&mt->mu);
        jarena rest = {.spare = keep};
        ja_free_all(&rest);
    }
    free(c);
    return st;
}
