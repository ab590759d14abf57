/* cmd_template.c — `kvtier template render`: render a chat template (a GGUF's own, or a file) over
 * messages given as JSON, exactly as the server would, and print the prompt; --bench times it. */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cmds.h"
#include "gguf/gguf.h"
#include "text/chat.h"
#include "text/tokenizer.h"
#include "util/common.h"

static void usage(void) {
    printf("usage: kvtier template render (-m MODEL | --template FILE) --messages FILE.json\n"
           "                              [--tools FILE.json] [--kwargs JSON] [--no-generation-prompt]\n"
           "                              [--bos-token T] [--eos-token T] [--date YYYY-MM-DD] [--bench N]\n"
           "  -m, --model F          take tokenizer.chat_template, bos_token and eos_token from a GGUF\n"
           "  --template F           a Jinja chat template file (bos/eos tokens \"\" unless given)\n"
           "  --messages F           a JSON list of messages, passed to the template as is\n"
           "  --tools F              a JSON list of tools (default: tools = none)\n"
           "  --kwargs JSON          extra template variables, e.g. '{\"enable_thinking\": false}'\n"
           "  --no-generation-prompt add_generation_prompt = false (default true)\n"
           "  --bos-token, --eos-token  override the bos_token / eos_token variables\n"
           "  --date D               the date strftime_now() formats (default 2026-01-01)\n"
           "  --bench N              render N times; print the median and best time instead of the prompt\n"
           "The prompt is written to stdout byte for byte (no newline added). A template that raises\n"
           "prints its message to stderr and exits 1.\n");
}

static char *slurp_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap + 1);
    while (b) {
        if (n == cap) {
            if (cap > ((size_t)1 << 30)) { /* 1 GiB: refuse */
                free(b);
                b = NULL;
                break;
            }
            char *nb = realloc(b, cap * 2 + 1);
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    fclose(f);
    if (b) {
        b[n] = 0;
        *len = n;
    }
    return b;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int cmd_template(int argc, char **argv) {
    const char *model = NULL, *tfile = NULL, *mfile = NULL, *toolsf = NULL, *kwargs = NULL, *bos = NULL,
               *eos = NULL, *date = NULL;
    bool no_gen = false;
    uint32_t bench = 0;
    if (argc < 2 || strcmp(argv[1], "render")) {
        if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
            usage();
            return 0;
        }
        usage();
        return 2;
    }
    kvt_args a;
    kvt_args_init(&a, argc - 1, argv + 1, "template render", usage);
    while (kvt_args_next(&a)) {
        if (kvt_args_is(&a, "-m", "--model")) model = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--template")) tfile = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--messages")) mfile = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--tools")) toolsf = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--kwargs")) kwargs = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--bos-token")) bos = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--eos-token")) eos = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--date")) date = kvt_args_str(&a);
        else if (kvt_args_is(&a, NULL, "--bench")) bench = kvt_args_u32(&a, 1, 1000000);
        else if (kvt_args_flag(&a, NULL, "--no-generation-prompt")) no_gen = true;
        else kvt_args_unknown(&a);
    }
    if (a.failed) return 2;
    if (a.help) return 0;
    if ((model != NULL) == (tfile != NULL) || !mfile || a.n_positional) {
        fprintf(stderr, "kvtier template render: give one of -m MODEL or --template FILE, and --messages FILE\n");
        return 2;
    }
    char err[1024] = "";
    int rc = 1;
    kvt_gguf *g = NULL;
    kvt_tokenizer *t = NULL;
    kvt_chat_template *c = NULL;
    char *tmpl = NULL, *msgs = NULL, *tools = NULL, *out = NULL;
    size_t tl = 0, ml = 0, ol = 0, xl = 0;
    kvt_status st;
    if (model) {
        if ((st = kvt_gguf_open(model, &g, err, sizeof err)) != KVT_OK ||
            (st = kvt_tokenizer_create(g, &t, err, sizeof err)) != KVT_OK)
            goto fail;
        const char *s;
        uint64_t n;
        if (!kvt_gguf_get_str(g, "tokenizer.chat_template", &s, &n)) {
            snprintf(err, sizeof err, "%s has no tokenizer.chat_template", model);
            goto fail;
        }
        st = kvt_chat_template_create_jinja(s, (size_t)n, t, bos, eos, &c, err, sizeof err);
    } else {
        if (!(tmpl = slurp_file(tfile, &tl))) {
            snprintf(err, sizeof err, "cannot read %s", tfile);
            goto fail;
        }
        st = kvt_chat_template_create_jinja(tmpl, tl, NULL, bos ? bos : "", eos ? eos : "", &c, err, sizeof err);
    }
    if (st != KVT_OK) goto fail;
    if (!(msgs = slurp_file(mfile, &ml))) {
        snprintf(err, sizeof err, "cannot read %s", mfile);
        goto fail;
    }
    if (toolsf && !(tools = slurp_file(toolsf, &xl))) {
        snprintf(err, sizeof err, "cannot read %s", toolsf);
        goto fail;
    }
    kvt_chat_set_date(date);
    kvt_chat_opts o = {.add_generation_prompt = !no_gen, .tools_json = tools, .kwargs_json = kwargs};
    if (bench) {
        double *ms = malloc(bench * sizeof *ms);
        if (!ms) goto fail;
        for (uint32_t i = 0; i < bench; i++) {
            double t0 = kvt_now_ms();
            st = kvt_chat_render_json(c, msgs, ml, &o, &out, &ol, err, sizeof err);
            ms[i] = kvt_now_ms() - t0;
            if (st != KVT_OK) {
                free(ms);
                goto fail;
            }
            if (i + 1 < bench) free(out), out = NULL;
        }
        qsort(ms, bench, sizeof *ms, cmp_d);
        printf("template render: %zu bytes of messages -> %zu bytes of prompt; %u runs: median %.3f ms, best %.3f ms\n",
               ml, ol, bench, ms[bench / 2], ms[0]);
        free(ms);
        rc = 0;
        goto done;
    }
    if ((st = kvt_chat_render_json(c, msgs, ml, &o, &out, &ol, err, sizeof err)) != KVT_OK) goto fail;
    fwrite(out, 1, ol, stdout);
    fflush(stdout);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "kvtier template render: %s\n", err[0] ? err : "out of memory");
done:
    free(out);
    free(tools);
    free(msgs);
    free(tmpl);
    kvt_chat_template_free(c);
    kvt_tokenizer_free(t);
    kvt_gguf_free(g);
    return rc;
}
