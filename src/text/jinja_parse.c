/*
 * jinja_parse.c — tokens -> syntax tree, following jinja2's parser (precedence, tuples, tests,
 * filters, call arguments, conditional expressions, statements).
 *
 * Expression precedence, loosest first (as jinja2.parser):
 *   cond (`a if b else c`) < or < and < not < compare (== != < <= > >= in, not in)
 *   < + - < ~ < * / // % < ** < unary - + < postfix (.attr [item] (call)) then | filter / is test.
 *
 * Invariants:
 *   1. Nesting (statement blocks, brackets, unary chains, `else` chains) is counted and capped at
 *      KVT_JINJA_MAX_NESTING, so parsing recursion is bounded whatever the input.
 *   2. Every error carries the line and column of the offending token.
 *   3. An unknown filter or test is a parse error unless it sits inside an {% if %} body, where
 *      (as jinja2 does) it only raises when evaluated.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "text/jinja_int.h"

typedef struct {
    jarena *a;
    jtoks *t;
    size_t i;
    int depth;
    int in_if;
    int in_loop;
    jnode *macro; /* the macro whose body is being parsed (its op gets MACRO_USES_* bits) */
    char *err;
    size_t errlen;
    kvt_status st;
    jmp_buf jb;
} ps;

static _Noreturn void pfail(ps *P, const jtok *k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static _Noreturn void pfail(ps *P, const jtok *k, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    P->st = kvt_errf(P->err, P->errlen, KVT_ERR_FORMAT, "template: line %u, column %u: %s", k->line, k->col, msg);
    longjmp(P->jb, 1);
}

static jtok *cur(ps *P) { return &P->t->v[P->i]; }
static jtok *peek(ps *P, size_t k) { return P->i + k < P->t->n ? &P->t->v[P->i + k] : &P->t->v[P->t->n - 1]; }
static void adv(ps *P) {
    if (P->i + 1 < P->t->n) P->i++;
}
static bool is_op(const jtok *k, const char *op) { return k->type == T_OP && k->s->n == strlen(op) && !memcmp(k->s->p, op, k->s->n); }
static bool is_name(const jtok *k, const char *nm) { return k->type == T_NAME && k->s->n == strlen(nm) && !memcmp(k->s->p, nm, k->s->n); }
static bool skip_op(ps *P, const char *op) {
    if (!is_op(cur(P), op)) return false;
    adv(P);
    return true;
}
static bool skip_name(ps *P, const char *nm) {
    if (!is_name(cur(P), nm)) return false;
    adv(P);
    return true;
}
static const char *tok_desc(const jtok *k) {
    switch (k->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_STRING: return "string";
    case T_INT:
    case T_FLOAT: return "number";
    default: return NULL;
    }
}
static _Noreturn void unexpected(ps *P, const char *want) {
    jtok *k = cur(P);
    const char *d = tok_desc(k);
    if (d) pfail(P, k, "expected %s, got %s", want, d);
    pfail(P, k, "expected %s, got '%.*s'", want, (int)(k->s->n > 40 ? 40 : k->s->n), k->s->p);
}
static void expect_op(ps *P, const char *op) {
    if (!skip_op(P, op)) {
        char w[16];
        snprintf(w, sizeof w, "'%s'", op);
        unexpected(P, w);
    }
}
static void enter(ps *P) {
    if (++P->depth > KVT_JINJA_MAX_NESTING) pfail(P, cur(P), "template nested too deeply (more than %d levels)", KVT_JINJA_MAX_NESTING);
}
static void leave(ps *P) { P->depth--; }

static jnode *node(ps *P, int kind, const jtok *at) {
    jnode *n = ja_alloc(P->a, sizeof *n);
    if (!n) pfail(P, at, "out of memory");
    n->kind = (uint16_t)kind;
    n->line = at->line;
    n->col = at->col;
    n->fid = -1;
    return n;
}
static void nl_push(ps *P, jnlist *l, jnode *x) {
    if (l->n == l->cap) {
        uint32_t nc = l->cap ? l->cap * 2 : 4;
        jnode **nv = ja_alloc(P->a, nc * sizeof *nv);
        if (!nv) pfail(P, cur(P), "out of memory");
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}

static jnode *parse_expr(ps *P, bool with_cond);
static jnode *parse_tuple(ps *P, bool with_cond, bool explicit_parens, const char *extra_end);
static jnode *parse_unary(ps *P, bool with_filter);
static jnode *parse_or(ps *P);

static jnode *parse_primary(ps *P) {
    jtok *k = cur(P);
    jnode *n;
    switch (k->type) {
    case T_NAME:
        adv(P);
        if (is_name(k, "true") || is_name(k, "True") || is_name(k, "false") || is_name(k, "False")) {
            n = node(P, E_CONST, k);
            n->val = jv_bool(k->s->p[0] == 't' || k->s->p[0] == 'T');
        } else if (is_name(k, "none") || is_name(k, "None")) {
            n = node(P, E_CONST, k);
            n->val = jv_none();
        } else {
            n = node(P, E_NAME, k);
            n->name = k->s;
            if (P->macro) /* jinja2 lets a macro take extra arguments only when its body uses these */
                P->macro->op |= is_name(k, "varargs") ? MACRO_USES_VARARGS
                              : is_name(k, "kwargs")  ? MACRO_USES_KWARGS
                              : is_name(k, "caller")  ? MACRO_USES_CALLER : 0;
        }
        return n;
    case T_STRING: {
        n = node(P, E_CONST, k);
        adv(P);
        if (cur(P)->type != T_STRING) {
            n->val.t = JV_STR;
            n->val.s = k->s;
            return n;
        }
        kvt_strbuf b = {0};
        kvt_strbuf_add(&b, k->s->p, k->s->n);
        while (cur(P)->type == T_STRING) {
            kvt_strbuf_add(&b, cur(P)->s->p, cur(P)->s->n);
            adv(P);
        }
        n->val.t = JV_STR;
        n->val.s = jstr_new(P->a, b.p ? b.p : "", b.n);
        kvt_strbuf_free(&b);
        if (!n->val.s) pfail(P, k, "out of memory");
        return n;
    }
    case T_INT:
    case T_FLOAT:
        n = node(P, E_CONST, k);
        n->val = k->type == T_INT ? jv_int(k->i) : jv_float(k->f);
        adv(P);
        return n;
    case T_OP:
        if (is_op(k, "(")) {
            adv(P);
            enter(P);
            n = parse_tuple(P, true, true, NULL);
            leave(P);
            expect_op(P, ")");
            return n;
        }
        if (is_op(k, "[")) {
            adv(P);
            enter(P);
            n = node(P, E_LIST, k);
            while (!is_op(cur(P), "]")) {
                if (n->args.n) {
                    expect_op(P, ",");
                    if (is_op(cur(P), "]")) break;
                }
                nl_push(P, &n->args, parse_expr(P, true));
            }
            leave(P);
            expect_op(P, "]");
            return n;
        }
        if (is_op(k, "{")) {
            adv(P);
            enter(P);
            n = node(P, E_DICT, k);
            while (!is_op(cur(P), "}")) {
                if (n->args.n) {
                    expect_op(P, ",");
                    if (is_op(cur(P), "}")) break;
                }
                nl_push(P, &n->args, parse_expr(P, true));
                expect_op(P, ":");
                nl_push(P, &n->args2, parse_expr(P, true));
            }
            leave(P);
            expect_op(P, "}");
            return n;
        }
        break;
    default: break;
    }
    unexpected(P, "an expression");
}

static void parse_call_args(ps *P, jnode *n) {
    /* after '(' */
    enter(P);
    const jstr *kws[256];
    jnlist kwv = {0};
    uint32_t nk = 0;
    bool first = true;
    while (!is_op(cur(P), ")")) {
        if (!first) {
            expect_op(P, ",");
            if (is_op(cur(P), ")")) break;
        }
        first = false;
        if (skip_op(P, "**")) n->dyn_kw = parse_expr(P, true);
        else if (skip_op(P, "*")) n->dyn_args = parse_expr(P, true);
        else if (cur(P)->type == T_NAME && is_op(peek(P, 1), "=")) {
            if (nk >= 256) pfail(P, cur(P), "too many keyword arguments");
            kws[nk++] = cur(P)->s;
            adv(P);
            adv(P);
            nl_push(P, &kwv, parse_expr(P, true));
        } else {
            if (nk || n->dyn_args || n->dyn_kw) pfail(P, cur(P), "positional argument follows keyword argument");
            nl_push(P, &n->args, parse_expr(P, true));
        }
    }
    leave(P);
    expect_op(P, ")");
    if (nk) {
        n->kwnames = ja_alloc(P->a, nk * sizeof *n->kwnames);
        if (!n->kwnames) pfail(P, cur(P), "out of memory");
        memcpy(n->kwnames, kws, nk * sizeof *kws);
        n->n_kw = nk;
        n->args2 = kwv;
    }
}

static jnode *parse_subscript(ps *P) {
    jtok *k = cur(P);
    jnode *a = NULL, *b = NULL, *c = NULL;
    if (!is_op(k, ":")) {
        a = parse_expr(P, true);
        if (!is_op(cur(P), ":")) return a;
    }
    jnode *s = node(P, E_SLICE, k);
    expect_op(P, ":");
    if (!is_op(cur(P), "]") && !is_op(cur(P), ",") && !is_op(cur(P), ":")) b = parse_expr(P, true);
    if (skip_op(P, ":"))
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) c = parse_expr(P, true);
    s->a = a;
    s->b = b;
    s->c = c;
    return s;
}

static jnode *parse_postfix(ps *P, jnode *n) {
    for (;;) {
        jtok *k = cur(P);
        if (is_op(k, ".")) {
            adv(P);
            jtok *a = cur(P);
            if (a->type == T_NAME) {
                jnode *x = node(P, E_ATTR, k);
                x->a = n;
                x->name = a->s;
                adv(P);
                n = x;
            } else if (a->type == T_INT) {
                jnode *x = node(P, E_ITEM, k), *key = node(P, E_CONST, a);
                key->val = jv_int(a->i);
                x->a = n;
                x->b = key;
                adv(P);
                n = x;
            } else unexpected(P, "an attribute name");
        } else if (is_op(k, "[")) {
            adv(P);
            enter(P);
            jnode *x = node(P, E_ITEM, k);
            x->a = n;
            jnode *sub = parse_subscript(P);
            if (is_op(cur(P), ",")) {
                /* a tuple key (a dict's); a slice is only ever the whole subscript (a slice node is
                 * evaluated as the subscript of x, never on its own) */
                jnode *t = node(P, E_TUPLE, k);
                nl_push(P, &t->args, sub);
                while (skip_op(P, ",")) {
                    if (is_op(cur(P), "]")) break;
                    nl_push(P, &t->args, parse_subscript(P));
                }
                for (uint32_t i = 0; i < t->args.n; i++)
                    if (t->args.v[i]->kind == E_SLICE) pfail(P, k, "a slice inside a tuple subscript is not supported");
                sub = t;
            }
            leave(P);
            expect_op(P, "]");
            if (sub->kind == E_SLICE) {
                sub->kind = E_SLICE;
                x->kind = E_SLICE;
                x->b = sub->a;
                x->c = sub;
            } else x->b = sub;
            n = x;
        } else if (is_op(k, "(")) {
            adv(P);
            jnode *x = node(P, E_CALL, k);
            x->a = n;
            parse_call_args(P, x);
            n = x;
        } else return n;
    }
}

static jnode *parse_filter(ps *P, jnode *operand, bool start_inline) {
    /* at a name after '|' */
    for (;;) {
        if (!start_inline) {
            if (!skip_op(P, "|")) return operand;
        }
        start_inline = false;
        jtok *k = cur(P);
        if (k->type != T_NAME) unexpected(P, "a filter name");
        adv(P);
        kvt_strbuf nm = {0};
        kvt_strbuf_add(&nm, k->s->p, k->s->n);
        while (is_op(cur(P), ".") && peek(P, 1)->type == T_NAME) {
            adv(P);
            kvt_strbuf_addstr(&nm, ".");
            kvt_strbuf_add(&nm, cur(P)->s->p, cur(P)->s->n);
            adv(P);
        }
        jnode *f = node(P, E_FILTER, k);
        f->name = jstr_new(P->a, nm.p ? nm.p : "", nm.n);
        kvt_strbuf_free(&nm);
        if (!f->name) pfail(P, k, "out of memory");
        f->fid = jb_filter_id(f->name->p, f->name->n);
        if (f->fid < 0) {
            if (!P->in_if) pfail(P, k, "no filter named '%.*s'", (int)f->name->n, f->name->p);
            f->soft = true;
        }
        f->a = operand;
        if (skip_op(P, "(")) parse_call_args(P, f);
        operand = f;
    }
}

static jnode *parse_test(ps *P, jnode *operand) {
    jtok *at = cur(P); /* 'is' */
    adv(P);
    bool neg = skip_name(P, "not");
    jtok *k = cur(P);
    if (k->type != T_NAME) unexpected(P, "a test name");
    adv(P);
    jnode *t = node(P, E_TEST, at);
    t->name = k->s;
    t->neg = neg;
    t->a = operand;
    t->fid = jb_test_id(k->s->p, k->s->n);
    if (t->fid < 0) {
        if (!P->in_if) pfail(P, k, "no test named '%.*s'", (int)k->s->n, k->s->p);
        t->soft = true;
    }
    jtok *c = cur(P);
    if (skip_op(P, "(")) parse_call_args(P, t);
    else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT || is_op(c, "[") ||
              is_op(c, "{")) &&
             !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(P, c, "you cannot chain multiple tests with is");
        jnode *arg = parse_postfix(P, parse_primary(P));
        nl_push(P, &t->args, arg);
    }
    return t;
}

static jnode *parse_filter_expr(ps *P, jnode *n) {
    for (;;) {
        if (is_op(cur(P), "|")) n = parse_filter(P, n, false);
        else if (is_name(cur(P), "is")) n = parse_test(P, n);
        else if (is_op(cur(P), "(")) {
            jtok *k = cur(P);
            adv(P);
            jnode *x = node(P, E_CALL, k);
            x->a = n;
            parse_call_args(P, x);
            n = x;
        } else return n;
    }
}

static jnode *parse_unary(ps *P, bool with_filter) {
    jtok *k = cur(P);
    jnode *n;
    if (is_op(k, "-") || is_op(k, "+")) {
        adv(P);
        enter(P);
        n = node(P, k->s->p[0] == '-' ? E_NEG : E_POS, k);
        n->a = parse_unary(P, false);
        leave(P);
    } else n = parse_primary(P);
    n = parse_postfix(P, n);
    if (with_filter) n = parse_filter_expr(P, n);
    return n;
}

static jnode *binop(ps *P, const jtok *k, int op, jnode *a, jnode *b) {
    jnode *n = node(P, E_BIN, k);
    n->op = (uint16_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(ps *P) {
    jnode *n = parse_unary(P, true);
    while (is_op(cur(P), "**")) {
        jtok *k = cur(P);
        adv(P);
        n = binop(P, k, OP_POW, n, parse_unary(P, true));
    }
    return n;
}
static jnode *parse_math2(ps *P) {
    jnode *n = parse_pow(P);
    for (;;) {
        jtok *k = cur(P);
        int op = is_op(k, "*") ? OP_MUL : is_op(k, "/") ? OP_DIV : is_op(k, "//") ? OP_FLOORDIV : is_op(k, "%") ? OP_MOD : 0;
        if (!op) return n;
        adv(P);
        n = binop(P, k, op, n, parse_pow(P));
    }
}
static jnode *parse_concat(ps *P) {
    jtok *k = cur(P);
    jnode *n = parse_math2(P);
    if (!is_op(cur(P), "~")) return n;
    jnode *c = node(P, E_CONCAT, k);
    nl_push(P, &c->args, n);
    while (skip_op(P, "~")) nl_push(P, &c->args, parse_math2(P));
    return c;
}
static jnode *parse_math1(ps *P) {
    jnode *n = parse_concat(P);
    for (;;) {
        jtok *k = cur(P);
        int op = is_op(k, "+") ? OP_ADD : is_op(k, "-") ? OP_SUB : 0;
        if (!op) return n;
        adv(P);
        n = binop(P, k, op, n, parse_concat(P));
    }
}
static jnode *parse_compare(ps *P) {
    jtok *k0 = cur(P);
    jnode *first = parse_math1(P);
    jnode *c = NULL;
    uint8_t ops[64];
    for (;;) {
        jtok *k = cur(P);
        int op = is_op(k, "==") ? OP_EQ : is_op(k, "!=") ? OP_NE : is_op(k, "<") ? OP_LT : is_op(k, "<=") ? OP_LE
               : is_op(k, ">") ? OP_GT : is_op(k, ">=") ? OP_GE : is_name(k, "in") ? OP_IN : 0;
        if (!op && is_name(k, "not") && is_name(peek(P, 1), "in")) {
            op = OP_NOTIN;
            adv(P);
        }
        if (!op) break;
        adv(P);
        if (!c) {
            c = node(P, E_CMP, k0);
            c->a = first;
        }
        if (c->args.n >= 64) pfail(P, k, "comparison chain too long");
        ops[c->args.n] = (uint8_t)op;
        nl_push(P, &c->args, parse_math1(P));
    }
    if (!c) return first;
    c->cmp_ops = ja_alloc(P->a, c->args.n);
    if (!c->cmp_ops) pfail(P, k0, "out of memory");
    memcpy(c->cmp_ops, ops, c->args.n);
    return c;
}
static jnode *parse_not(ps *P) {
    jtok *k = cur(P);
    if (is_name(k, "not")) {
        adv(P);
        enter(P);
        jnode *n = node(P, E_NOT, k);
        n->a = parse_not(P);
        leave(P);
        return n;
    }
    return parse_compare(P);
}
/* a left-associative chain `x KW x KW x` over the next tighter level */
static jnode *parse_chain(ps *P, const char *kw, int kind, jnode *(*tighter)(ps *)) {
    jnode *n = tighter(P);
    while (is_name(cur(P), kw)) {
        jtok *k = cur(P);
        adv(P);
        jnode *x = node(P, kind, k);
        x->a = n;
        x->b = tighter(P);
        n = x;
    }
    return n;
}
static jnode *parse_and(ps *P) { return parse_chain(P, "and", E_AND, parse_not); }
static jnode *parse_or(ps *P) { return parse_chain(P, "or", E_OR, parse_and); }
static jnode *parse_cond(ps *P) {
    jnode *n = parse_or(P);
    while (is_name(cur(P), "if")) {
        jtok *k = cur(P);
        adv(P);
        enter(P);
        jnode *x = node(P, E_COND, k);
        x->b = n;
        x->a = parse_or(P);
        if (skip_name(P, "else")) x->c = parse_cond(P);
        leave(P);
        n = x;
    }
    return n;
}
static jnode *parse_expr(ps *P, bool with_cond) { return with_cond ? parse_cond(P) : parse_or(P); }

static bool tuple_end(ps *P, const char *extra_end) {
    jtok *k = cur(P);
    if (k->type == T_VAR_END || k->type == T_BLOCK_END || k->type == T_EOF) return true;
    if (is_op(k, ")") || is_op(k, "]") || is_op(k, "}") || is_op(k, "=")) return true;
    if (extra_end && is_name(k, extra_end)) return true;
    return false;
}

static jnode *parse_tuple(ps *P, bool with_cond, bool explicit_parens, const char *extra_end) {
    jtok *k = cur(P);
    jnode *t = node(P, E_TUPLE, k);
    bool is_tuple = false;
    for (;;) {
        if (t->args.n) expect_op(P, ",");
        if (tuple_end(P, extra_end)) break;
        nl_push(P, &t->args, parse_expr(P, with_cond));
        if (is_op(cur(P), ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (t->args.n) return t->args.v[0];
        if (!explicit_parens) unexpected(P, "an expression");
    }
    return t;
}

/* assignment targets: name, ns.attr, or a tuple of names */
static jnode *parse_target(ps *P, bool with_ns, const char *extra_end) {
    jtok *k = cur(P);
    jnode *first = NULL;
    jnode *t = node(P, E_TUPLE, k);
    bool tuple = false;
    for (;;) {
        jtok *a = cur(P);
        jnode *x;
        if (skip_op(P, "(")) {
            enter(P);
            x = parse_target(P, false, NULL);
            leave(P);
            expect_op(P, ")");
        } else {
            if (a->type != T_NAME) unexpected(P, "a name to assign to");
            adv(P);
            if (with_ns && is_op(cur(P), ".") && peek(P, 1)->type == T_NAME) {
                adv(P);
                x = node(P, E_ATTR, a);
                jnode *base = node(P, E_NAME, a);
                base->name = a->s;
                x->a = base;
                x->name = cur(P)->s;
                adv(P);
            } else {
                x = node(P, E_NAME, a);
                x->name = a->s;
            }
        }
        if (!first) first = x;
        nl_push(P, &t->args, x);
        if (!skip_op(P, ",")) break;
        tuple = true;
        if (is_op(cur(P), "=") || (extra_end && is_name(cur(P), extra_end)) || is_op(cur(P), ")")) break;
    }
    return tuple ? t : first;
}

static void expect_block_end(ps *P) {
    if (cur(P)->type != T_BLOCK_END) unexpected(P, "'%}'");
    adv(P);
}

/* parses statements until {% <one of ends> %}; leaves the cursor on the end name; returns its index */
static int parse_body(ps *P, jnlist *body, const char *const *ends, int n_ends);

static jnode *parse_statement(ps *P) {
    jtok *bk = cur(P); /* T_BLOCK_BEGIN */
    adv(P);
    jtok *k = cur(P);
    if (k->type != T_NAME) unexpected(P, "a statement name");
    adv(P);
    enter(P);
    jnode *n;
    if (is_name(k, "if")) {
        n = node(P, S_IF, k);
        n->a = parse_tuple(P, false, false, NULL);
        expect_block_end(P);
        P->in_if++;
        static const char *const ends[] = {"elif", "else", "endif"};
        jnode *cur_if = n;
        for (;;) {
            int e = parse_body(P, &cur_if->body, ends, 3);
            if (e == 0) {
                jtok *ek = cur(P);
                adv(P);
                jnode *x = node(P, S_IF, ek);
                x->a = parse_tuple(P, false, false, NULL);
                expect_block_end(P);
                nl_push(P, &cur_if->ebody, x);
                cur_if = x;
                continue;
            }
            if (e == 1) {
                adv(P);
                expect_block_end(P);
                static const char *const e2[] = {"endif"};
                parse_body(P, &cur_if->ebody, e2, 1);
            }
            adv(P);
            expect_block_end(P);
            break;
        }
        P->in_if--;
    } else if (is_name(k, "for")) {
        n = node(P, S_FOR, k);
        n->b = parse_target(P, false, "in");
        if (!skip_name(P, "in")) unexpected(P, "'in'");
        n->a = parse_tuple(P, false, false, "recursive");
        if (skip_name(P, "if")) n->c = parse_expr(P, true);
        if (is_name(cur(P), "recursive")) pfail(P, cur(P), "recursive loops are not supported");
        expect_block_end(P);
        static const char *const ends[] = {"else", "endfor"};
        P->in_loop++;
        int e = parse_body(P, &n->body, ends, 2);
        P->in_loop--;
        if (e == 0) {
            adv(P);
            expect_block_end(P);
            static const char *const e2[] = {"endfor"};
            parse_body(P, &n->ebody, e2, 1);
        }
        adv(P);
        expect_block_end(P);
    } else if (is_name(k, "set")) {
        jnode *target = parse_target(P, true, NULL);
        if (skip_op(P, "=")) {
            n = node(P, S_SET, k);
            n->b = target;
            n->a = parse_tuple(P, true, false, NULL);
            expect_block_end(P);
        } else {
            n = node(P, S_SETBLOCK, k);
            n->b = target;
            if (is_op(cur(P), "|")) n->c = parse_filter(P, NULL, false);
            expect_block_end(P);
            static const char *const ends[] = {"endset"};
            parse_body(P, &n->body, ends, 1);
            adv(P);
            expect_block_end(P);
        }
    } else if (is_name(k, "macro") || is_name(k, "call")) {
        bool call = is_name(k, "call");
        n = node(P, call ? S_CALLBLOCK : S_MACRO, k);
        if (!call) {
            if (cur(P)->type != T_NAME) unexpected(P, "a macro name");
            n->name = cur(P)->s;
            adv(P);
        }
        if (!call || is_op(cur(P), "(")) {
            expect_op(P, "(");
            while (!is_op(cur(P), ")")) {
                if (n->args.n) expect_op(P, ",");
                jtok *pk = cur(P);
                if (pk->type != T_NAME) unexpected(P, "a parameter name");
                adv(P);
                jnode *p = node(P, E_NAME, pk);
                p->name = pk->s;
                nl_push(P, &n->args, p);
                nl_push(P, &n->args2, skip_op(P, "=") ? parse_expr(P, true) : NULL);
            }
            expect_op(P, ")");
        }
        if (call) {
            n->a = parse_expr(P, true);
            if (n->a->kind != E_CALL) pfail(P, k, "expected a call after {%% call %%}");
        }
        expect_block_end(P);
        static const char *const e1[] = {"endmacro"}, *const e2[] = {"endcall"};
        int save_loop = P->in_loop;
        jnode *save_macro = P->macro;
        P->in_loop = 0;
        if (!call) P->macro = n;
        parse_body(P, &n->body, call ? e2 : e1, 1);
        P->in_loop = save_loop;
        P->macro = save_macro;
        adv(P);
        expect_block_end(P);
    } else if (is_name(k, "filter")) {
        n = node(P, S_FILTERBLOCK, k);
        n->c = parse_filter(P, NULL, true);
        expect_block_end(P);
        static const char *const ends[] = {"endfilter"};
        parse_body(P, &n->body, ends, 1);
        adv(P);
        expect_block_end(P);
    } else if (is_name(k, "break") || is_name(k, "continue")) {
        if (!P->in_loop) pfail(P, k, "'%.*s' outside of a loop", (int)k->s->n, k->s->p);
        n = node(P, is_name(k, "break") ? S_BREAK : S_CONTINUE, k);
        expect_block_end(P);
    } else if (is_name(k, "generation")) { /* transformers' AssistantTracker tag: renders its body */
        n = node(P, S_BLOCK, k);
        expect_block_end(P);
        static const char *const ends[] = {"endgeneration"};
        parse_body(P, &n->body, ends, 1);
        adv(P);
        expect_block_end(P);
    } else {
        (void)bk;
        pfail(P, k, "unknown or unsupported tag '%.*s'", (int)(k->s->n > 40 ? 40 : k->s->n), k->s->p);
    }
    leave(P);
    return n;
}

static int parse_body(ps *P, jnlist *body, const char *const *ends, int n_ends) {
    for (;;) {
        jtok *k = cur(P);
        switch (k->type) {
        case T_EOF:
            if (!ends) return -1;
            pfail(P, k, "unexpected end of template: missing '{%% %s %%}'", ends[n_ends - 1]);
        case T_DATA: {
            jnode *d = node(P, S_DATA, k);
            d->val.t = JV_STR;
            d->val.s = k->s;
            nl_push(P, body, d);
            adv(P);
            break;
        }
        case T_VAR_BEGIN: {
            adv(P);
            jnode *o = node(P, S_OUTPUT, k);
            o->a = parse_tuple(P, true, false, NULL);
            if (cur(P)->type != T_VAR_END) unexpected(P, "'}}'");
            adv(P);
            nl_push(P, body, o);
            break;
        }
        case T_BLOCK_BEGIN: {
            jtok *nm = peek(P, 1);
            for (int e = 0; ends && e < n_ends; e++)
                if (is_name(nm, ends[e])) {
                    adv(P);
                    return e;
                }
            if (nm->type == T_NAME && nm->s->n >= 3 &&
                (!memcmp(nm->s->p, "end", 3) || is_name(nm, "elif") || is_name(nm, "else")))
                pfail(P, nm, "unexpected '%.*s'%s", (int)(nm->s->n > 40 ? 40 : nm->s->n), nm->s->p,
                      ends ? "" : " (no block is open)");
            nl_push(P, body, parse_statement(P));
            break;
        }
        default: unexpected(P, "template data or a tag");
        }
    }
}

kvt_status jinja_parse(kvt_jinja_template *t, const char *src, size_t len, char *err, size_t errlen) {
    /* newline normalisation and keep_trailing_newline=False */
    char *s = malloc(len + 1);
    if (!s) return kvt_errf(err, errlen, KVT_ERR_NOMEM, "template: out of memory");
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    jtoks toks = {0};
    kvt_status st = jinja_lex(&t->arena, s, n, &toks, err, errlen);
    free(s);
    if (st != KVT_OK) {
        free(toks.v);
        return st;
    }
    ps P = {0};
    P.a = &t->arena;
    P.t = &toks;
    P.err = err;
    P.errlen = errlen;
    if (setjmp(P.jb)) {
        free(toks.v);
        return P.st;
    }
    parse_body(&P, &t->root, NULL, 0);
    free(toks.v);
    return KVT_OK;
}
