/*
 * cmds.h — the kvtier subcommands. Each returns a process exit status (0 ok, 1 runtime error,
 * 2 usage error) and prints its own --help. main.c dispatches on argv[1].
 * Ownership: argv is borrowed; each command creates and frees everything it uses before returning.
 */
#ifndef KVT_CMDS_H
#define KVT_CMDS_H

int cmd_gen_model(int argc, char **argv);  /* cmd_gen_model.c */
int cmd_inspect(int argc, char **argv);    /* cmd_inspect.c */
int cmd_run(int argc, char **argv);        /* cmd_run.c */
int cmd_bench(int argc, char **argv);      /* cmd_bench.c */
int cmd_chat(int argc, char **argv);       /* cmd_chat.c */
int cmd_demo(int argc, char **argv);       /* cmd_demo.c: the `make run` main job */
int cmd_tokenize(int argc, char **argv);   /* cmd_tokenize.c */
int cmd_serve(int argc, char **argv);      /* cmd_serve.c */
int cmd_cache(int argc, char **argv);      /* cmd_cache.c */
int cmd_perplexity(int argc, char **argv); /* cmd_perplexity.c */
int cmd_template(int argc, char **argv);   /* cmd_template.c */
int cmd_quantize(int argc, char **argv);   /* cmd_quantize.c */

#endif
