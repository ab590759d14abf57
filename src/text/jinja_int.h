/*
 * jinja_int.h — the Jinja interpreter's internals shared by its files: the memory arena, values
 * (Python semantics), the syntax tree, and the render context.
 *
 *   jinja_value.c    arena, strings, lists, dicts, JSON in, str()/repr()/json.dumps out, equality
 *   jinja_lex.c      template text -> tokens (whitespace control, trim_blocks, lstrip_blocks)
 *   jinja_parse.c    tokens -> syntax tree (statements and expressions)
 *   jinja_eval.c     the renderer: statements, expressions, scopes, macros, loops, caps
 *   jinja_builtins.c filters, tests, globals and the methods of str/list/dict
 *
 * Memory: a template's tree lives in the template's arena (freed with the template); every value
 * built while rendering lives in that render's arena (capped, freed when the render ends), so
 * nothing is reference-counted and an error may unwind with longjmp without leaking.
 */
#ifndef KVT_JINJA_INT_H
#define KVT_JINJA_INT_H

#include <pthread.h>
#include <setjmp.h>

#include "text/jinja.h"
#include "util/strbuf.h"

/* ---- arena ---- */
typedef struct jarena_chunk jarena_chunk;
typedef struct jarena {
    jarena_chunk *head;
    jarena_chunk *spare;          /* empty standard-size chunks to use before malloc */
    size_t used;                  /* bytes handed out, for the cap */
    size_t cap;                   /* 0 = unlimited */
    struct jctx *ctx;             /* when set, exceeding cap raises through ctx */
} jarena;
void *ja_alloc(jarena *a, size_t n); /* zeroed; NULL only when ctx is unset and malloc fails / cap hit */
void *ja_alloc_nz(jarena *a, size_t n); /* the same, not zeroed */
void ja_free_all(jarena *a);
/* Empties the arena and hands back up to max_bytes of its standard-size chunks (the rest are
 * freed), for a later render to reuse as `spare`. */
jarena_chunk *ja_take_chunks(jarena *a, size_t max_bytes);

/* ---- values ---- */
typedef enum {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_MACRO,
    JV_FUNC, JV_LOOP
} jtype;

typedef struct jstr {
    size_t n;
    const char *p; /* not necessarily NUL-terminated */
} jstr;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jmacro jmacro;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct jv {
    uint8_t t;
    uint8_t unsafe; /* JV_UNDEF: made by the sandbox for a mutating method (calling it raises) */
    uint8_t markup; /* JV_STR: a markupsafe.Markup (from |safe, |escape): `+` HTML-escapes a plain
                       str operand, as Markup.__add__ does */
    union {
        bool b;
        int64_t i;
        double f;
        const jstr *s; /* JV_STR; JV_UNDEF: the name that was looked up (may be NULL) */
        jlist *l;
        jdict *d;      /* JV_DICT and JV_NS */
        jmacro *m;
        jfunc *fn;
        jloop *lp;
    };
} jv;

/* jlist kinds: what Python object the sequence stands for */
enum { JL_LIST = 0, JL_GEN, JL_ITEMS, JL_KEYS, JL_VALUES };
struct jlist {
    size_t n, cap;
    jv *v;
    bool tuple;   /* repr with parentheses */
    uint8_t kind; /* JL_GEN: a one-shot generator (map/select/...: no len, not JSON, always true);
                     JL_ITEMS/KEYS/VALUES: dict views (len, iteration, but not JSON, not indexable) */
    size_t pos;   /* JL_GEN: items before pos were consumed */
};
static inline bool jl_special(const jlist *l) { return l->kind != JL_LIST; }

struct jdict {
    size_t n, cap;
    jv *k, *v;
    int32_t *idx;   /* open-addressing index into k/v once n > 8; -1 = empty */
    size_t idx_cap; /* power of two, 0 = no index */
};

struct jnode;
struct jframe;
struct jmacro {
    const struct jnode *def;     /* S_MACRO, or S_CALLBLOCK for a `caller` */
    struct jframe *closure;      /* the scope the macro was defined in */
    jv caller;                   /* JV_MACRO for macros called from a call block, else undefined */
};

struct jfunc {
    int id;       /* a builtin global or a method (jinja_builtins.c) */
    jv self;      /* the bound object for methods */
    const jstr *name;
};

struct jloop {
    jlist *items;
    size_t i;
    uint32_t depth;
};

/* ---- syntax tree ---- */
typedef struct jnlist {
    struct jnode **v;
    uint32_t n, cap;
} jnlist;

enum {
    /* expressions */
    E_CONST = 1, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_NEG, E_POS, E_NOT, E_AND, E_OR, E_BIN, E_CMP, E_COND, E_CONCAT,
    /* statements */
    S_DATA, S_OUTPUT, S_IF, S_FOR, S_SET, S_SETBLOCK, S_MACRO, S_CALLBLOCK, S_FILTERBLOCK, S_BREAK,
    S_CONTINUE, S_BLOCK
};
/* S_MACRO op bits: names its body uses */
enum { MACRO_USES_VARARGS = 1, MACRO_USES_KWARGS = 2, MACRO_USES_CALLER = 4 };
/* E_BIN / E_CMP operators */
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT,
       OP_GE, OP_IN, OP_NOTIN };

typedef struct jnode {
    uint16_t kind;
    uint16_t op;
    uint32_t line, col;
    bool neg;           /* E_TEST: `is not` */
    bool soft;          /* E_FILTER/E_TEST: unknown name inside an if: raises only when evaluated */
    jv val;             /* E_CONST; S_DATA text */
    const jstr *name;   /* E_NAME, E_ATTR, E_FILTER, E_TEST, S_MACRO */
    int fid;            /* E_FILTER / E_TEST: the builtin's id, -1 unknown */
    struct jnode *a, *b, *c;
    jnlist args;        /* items, positional args, loop targets, macro params, S_CMP operands */
    jnlist args2;       /* dict values, keyword values, macro defaults (NULL entries = none) */
    const jstr **kwnames;
    uint32_t n_kw;
    struct jnode *dyn_args, *dyn_kw;
    jnlist body, ebody; /* statement bodies; ebody: else / elif chain */
    uint8_t *cmp_ops;   /* E_CMP: n = args.n */
} jnode;

struct kvt_jinja_template {
    jarena arena;
    jnlist root;
    /* chunks kept from finished renders so the next one does not fault fresh pages in; guarded
     * by mu (renders of one template may run on several threads) */
    pthread_mutex_t mu;
    jarena_chunk *spare;
};

/* ---- render context ---- */
#define JBUF_MAX 1100

typedef struct jframe {
    jdict *vars;
    struct jframe *parent;
} jframe;

typedef struct jctx {
    jarena a;
    jmp_buf jb;
    kvt_strbuf *out;
    kvt_jinja_limits lim;
    uint64_t steps;
    uint32_t depth;
    char *err;
    size_t errlen;
    kvt_status st;
    jdict *globals;
    struct tm_fixed { int y, mo, d, h, mi, s; } now;
    int loop_ctl; /* 0, 1 = break, 2 = continue pending */
    bool json_ascii; /* tojson(ensure_ascii=True) in progress */
    jv filter_input; /* the text a {% filter %} block feeds its filter chain */
    /* scratch text buffers, LIFO, freed by the render on any exit (so raising never leaks) */
    kvt_strbuf bufs[JBUF_MAX];
    int nbufs;
} jctx;

kvt_strbuf *jbuf(jctx *c);              /* a fresh, empty scratch buffer */
jv jbuf_str(jctx *c, kvt_strbuf *b);    /* b's text as an arena string; releases b (top of stack) */
void jbuf_drop(jctx *c, kvt_strbuf *b); /* releases b (top of stack) */

/* raise: formats the message into ctx->err and longjmps to the render's top */
_Noreturn void jraise(jctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
_Noreturn void jraise_node(jctx *c, const jnode *n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jstep(jctx *c, uint64_t n);

/* value constructors (arena) */
static inline jv jv_undef(const jstr *name) { jv v = {0}; v.t = JV_UNDEF; v.s = name; return v; }
static inline jv jv_none(void) { jv v = {0}; v.t = JV_NONE; return v; }
static inline jv jv_bool(bool b) { jv v = {0}; v.t = JV_BOOL; v.b = b; return v; }
static inline jv jv_int(int64_t i) { jv v = {0}; v.t = JV_INT; v.i = i; return v; }
static inline jv jv_float(double f) { jv v = {0}; v.t = JV_FLOAT; v.f = f; return v; }
jv jv_str(jarena *a, const char *p, size_t n);     /* copies */
jv jv_str_ref(jarena *a, const char *p, size_t n); /* borrows p (lives as long as the arena's owner) */
jv jv_strz(jarena *a, const char *s);
jv jv_str_take(jarena *a, kvt_strbuf *b);         /* copies b's bytes into the arena, frees b */
jv jv_list(jarena *a, size_t cap);
jv jv_dict(jarena *a);
void jl_push(jarena *a, jlist *l, jv v);
void jd_set(jarena *a, jdict *d, jv k, jv v);
jv *jd_get(const jdict *d, jv k);                  /* NULL when missing */
jv *jd_gets(const jdict *d, const char *key, size_t n);
const jstr *jstr_new(jarena *a, const char *p, size_t n);

/* Python semantics */
bool jv_truthy(jv v);
bool jv_eq(jctx *c, jv a, jv b, int depth);
int jv_cmp(jctx *c, jv a, jv b, int depth);        /* <0, 0, >0; raises when unorderable */
const char *jv_type_name(jv v);                     /* Python's type name, for messages */
void jv_to_str(jctx *c, kvt_strbuf *b, jv v);       /* str(v) */
void jv_repr(jctx *c, kvt_strbuf *b, jv v, int depth);
jv jv_as_str(jctx *c, jv v);                        /* str(v) as a value (no copy for strings) */
void jv_float_repr(kvt_strbuf *b, double f);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys); indent NULL = None, else the
 * text of one level; item_sep/key_sep NULL = json.dumps' defaults for that indent */
void jv_tojson(jctx *c, kvt_strbuf *b, jv v, const jstr *indent, const jstr *item_sep, const jstr *key_sep,
               bool sort_keys, int depth);
/* JSON text -> value (json.loads). Returns false with a message in err. */
bool jv_from_json(jarena *a, const char *s, size_t n, jv *out, char *err, size_t errlen);
jlist *jv_iterate(jctx *c, jv v);
/* Stable merge sort of ord[0..n) with a comparator that may raise: scratch memory comes from the
 * arena, so unwinding out of it leaks nothing (qsort may malloc). */
void jsort(jctx *c, size_t *ord, size_t n, int (*cmp)(const void *, const void *, void *), void *u);                    /* list(v): raises when not iterable */
size_t ju_len(const char *p, size_t n);              /* code points in UTF-8 text */
size_t ju_offset(const char *p, size_t n, size_t cp); /* byte offset of code point cp (n if past) */

/* ---- lexer / parser ---- */
enum { T_EOF = 0, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT,
       T_OP };
typedef struct jtok {
    int type;
    uint32_t line, col;
    const jstr *s;  /* T_DATA, T_NAME, T_STRING (decoded), T_OP (its text) */
    int64_t i;
    double f;
} jtok;
typedef struct jtoks {
    jtok *v;
    size_t n, cap;
} jtoks;
/* Splits (newline-normalised) template text into tokens; strings live in the template's arena.
 * Returns KVT_ERR_FORMAT with "line L, column C: ..." on a lexical error. */
kvt_status jinja_lex(jarena *a, const char *src, size_t len, jtoks *out, char *err, size_t errlen);
kvt_status jinja_parse(kvt_jinja_template *t, const char *src, size_t len, char *err, size_t errlen);

/* ---- builtins ---- */
int jb_filter_id(const char *name, size_t n);       /* -1 unknown */
int jb_test_id(const char *name, size_t n);
/* args: positional values; kw: names/values */
jv jb_filter(jctx *c, const jnode *n, int id, jv x, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
             size_t nkw, jframe *f);
bool jb_test(jctx *c, const jnode *n, int id, jv x, jv *args, size_t nargs);
bool jb_global(jctx *c, const jstr *name, jv *out);  /* range, namespace, dict, raise_exception, ... */
jv jb_getattr(jctx *c, jv obj, const jstr *name);
jv jb_html_escape(jctx *c, jv s);                   /* markupsafe.escape(str) -> Markup */   /* methods of str/list/dict; undefined if none */
jv jb_call_func(jctx *c, const jnode *n, jfunc *fn, jv *args, size_t nargs, const jstr **kwn, jv *kwv,
                size_t nkw);
/* calls any callable (macro, builtin); used by map/select filters too */
jv je_call(jctx *c, const jnode *n, jv fn, jv *args, size_t nargs, const jstr **kwn, jv *kwv, size_t nkw);

#endif
