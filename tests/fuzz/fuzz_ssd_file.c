/* fuzz_ssd_file.c — libFuzzer target: the SSD cache file reader (cache/ssd_cache.h,
 * kvt_ssd_read_file_info) that `kvtier cache ls|inspect|verify` and the startup scan use, on
 * arbitrary bytes. The input is written to one temporary file per process (created once with
 * mkstemp, rewritten each run) and read back with payload verification and token extraction.
 * Then, where the input carries a plausible header length (u32 at byte 12), the same bytes with
 * the header checksum (XXH3 at byte 16) repaired are read again, so mutations reach the header's
 * consistency checks and the section reads behind the checksum. Built by `make fuzz`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "cache/ssd_cache.h"

static char g_path[64];
static int g_fd = -1;

static void cleanup(void) {
    if (g_path[0]) unlink(g_path);
}

static void check(const uint8_t *data, size_t size) {
    if (ftruncate(g_fd, 0) != 0 || pwrite(g_fd, data, size, 0) != (ssize_t)size) abort();
    kvt_ssd_file_info info;
    int32_t tokens[64];
    char err[256];
    memset(&info, 0, sizeof info);
    (void)kvt_ssd_read_file_info(g_path, true, &info, tokens, 64, err, sizeof err);
    (void)kvt_ssd_read_file_info(g_path, false, &info, NULL, 0, err, sizeof err);
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
    check(data, size);
    if (size >= 24) {
        const uint32_t hsize = (uint32_t)data[12] | (uint32_t)data[13] << 8 | (uint32_t)data[14] << 16 |
                               (uint32_t)data[15] << 24;
        if (hsize >= 24 && hsize <= size) {
            uint8_t *copy = malloc(size);
            memcpy(copy, data, size);
            memset(copy + 16, 0, 8);
            uint64_t h = XXH3_64bits(copy, hsize);
            for (int i = 0; i < 8; i++) copy[16 + i] = (uint8_t)(h >> (8 * i));
            check(copy, size);
            free(copy);
        }
    }
    return 0;
}
