/* fuzz_ssd_file.c — libFuzzer target: the SSD cache file reader (cache/ssd_cache.h,
 * kvt_ssd_read_file_info) that `kvtier cache ls|inspect|verify` and the startup scan use, on
 * arbitrary bytes. The input is written to one temporary file per process (created once with
 * mkstemp, rewritten each run) and read back with payload verification and token extraction.
 * Built by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/ssd_cache.h"

static char g_path[64];
static int g_fd = -1;

static void cleanup(void) {
    if (g_path[0]) unlink(g_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (g_fd < 0) {
        snprintf(g_path, sizeof g_path, "/tmp/kvt-fuzz-ssd-XXXXXX");
        g_fd = mkstemp(g_path);
        if (g_fd < 0) {
            perror("fuzz_ssd_file: mkstemp");
            abort();
        }
        atexit(cleanup);
    }
    if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, data, size, 0) != (ssize_t)size) abort();
    kvt_ssd_file_info info;
    int32_t tokens[64];
    char err[256];
    memset(&info, 0, sizeof info);
    (void)kvt_ssd_read_file_info(g_path, true, &info, tokens, 64, err, sizeof err);
    (void)kvt_ssd_read_file_info(g_path, false, &info, NULL, 0, err, sizeof err);
    return 0;
}
