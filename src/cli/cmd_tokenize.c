/* cmd_tokenize.c — `kvtier tokenize`: tokenize text with a GGUF model's tokenizer and print the
 * ids and/or pieces. */
#include <stdio.h>
#include <stdlib.h>

#include "args.h"
#include "cmds.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"

static void usage(void) {
    printf("usage: kvtier tokenize -m MODEL [--ids|--pieces] [--no-special] [--no-bos] [--file F | TEXT | -]\n"
           "  -m, --model F    GGUF file (a vocab-only GGUF works)\n"
           "  --ids            print only the token ids, as one line [a, b, ...]\n"
           "  --pieces         print only the pieces, one per line\n"
           "                   (default: one line per token: id -> 'piece')\n"
           "  --no-special     do not parse control tokens written in the text\n"
           "  --no-bos         do not add BOS even if the model wants it\n"
           "  -f, --file F     read the text from F ('-' = stdin); TEXT '-' also reads stdin\n");
}

static char *slurp(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    for (;;) {
        if (n == cap) {
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return NULL;
            }
            b = nb;
            cap *= 2;
        }
        size_t r = fread(b + n, 1, cap - n, f);
        if (r == 0) break;
        n += r;
    }
    *len = n;
    return b;
}

static void print_escaped(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\'') fputs("\\'", stdout);
        else if (c == '\\') fputs("\\\\", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *file = NULL;
    bool ids_only = false, pieces_only = false, no_special = false, no_bos = false;
    kvt_args a;
    kvt_args_init(&a, argc, argv, "tokenize", usage);
    while (kvt_args_next(&a)) {
        if (kvt_args_is(&a, "-m", "--model")) model = kvt_args_str(&a);
        else if (kvt_args_is(&a, "-f", "--file")) file = kvt_args_str(&a);
        else if (kvt_args_flag(&a, NULL, "--ids")) ids_only = true;
        else if (kvt_args_flag(&a, NULL, "--pieces")) pieces_only = true;
        else if (kvt_args_flag(&a, NULL, "--no-special")) no_special = true;
        else if (kvt_args_flag(&a, NULL, "--no-bos")) no_bos = true;
        else kvt_args_unknown(&a);
    }
    if (a.failed) return 2;
    if (a.help) return 0;
    if (!model) {
        fprintf(stderr, "kvtier tokenize: -m MODEL is required\n");
        return 2;
    }
    if (ids_only && pieces_only) {
        fprintf(stderr, "kvtier tokenize: --ids and --pieces are mutually exclusive\n");
        return 2;
    }
    if ((file != NULL) + (a.n_positional > 0) != 1 || a.n_positional > 1) {
        fprintf(stderr, "kvtier tokenize: give exactly one of TEXT, '-' or --file F\n");
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    const char *src = file ? file : a.positional[0];
    if (file || !strcmp(src, "-")) {
        FILE *f = strcmp(src, "-") ? fopen(src, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "kvtier tokenize: cannot open %s\n", src);
            return 1;
        }
        text = slurp(f, &len);
        if (f != stdin) fclose(f);
    } else {
        len = strlen(src);
        text = malloc(len + 1);
        if (text) memcpy(text, src, len + 1);
    }
    if (!text) {
        fprintf(stderr, "kvtier tokenize: out of memory reading the text\n");
        return 1;
    }
    char err[256];
    kvt_gguf *g = NULL;
    kvt_tokenizer *t = NULL;
    if (kvt_gguf_open(model, &g, err, sizeof err) != KVT_OK ||
        kvt_tokenizer_create(g, &t, err, sizeof err) != KVT_OK) {
        fprintf(stderr, "kvtier tokenize: %s\n", err);
        kvt_gguf_free(g);
        free(text);
        return 1;
    }
    int rc = 0;
    bool add_bos = !no_bos && kvt_tokenizer_add_bos(t);
    int64_t n = kvt_tokenize(t, text, len, add_bos, !no_special, NULL, 0);
    int32_t *ids = n >= 0 ? malloc((size_t)(n ? n : 1) * sizeof *ids) : NULL;
    if (!ids) {
        fprintf(stderr, "kvtier tokenize: out of memory\n");
        rc = 1;
    } else {
        kvt_tokenize(t, text, len, add_bos, !no_special, ids, n);
        if (ids_only) {
            putchar('[');
            for (int64_t i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
            puts("]");
        } else {
            char buf[512];
            for (int64_t i = 0; i < n; i++) {
                int32_t l = kvt_token_to_bytes(t, ids[i], true, buf, sizeof buf);
                if (l > (int32_t)sizeof buf) l = sizeof buf;
                if (pieces_only) {
                    fwrite(buf, 1, (size_t)l, stdout);
                    putchar('\n');
                } else {
                    printf("%6d -> '", ids[i]);
                    print_escaped(buf, (size_t)l);
                    puts("'");
                }
            }
        }
        fprintf(stderr, "%lld tokens (tokenizer %s, pre %s)\n", (long long)n, kvt_tokenizer_model_name(t),
                kvt_tokenizer_pre_name(t));
    }
    free(ids);
    free(text);
    kvt_tokenizer_free(t);
    kvt_gguf_free(g);
    return rc;
}
