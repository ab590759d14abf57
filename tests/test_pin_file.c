/* test_pin_file.c — the pin list codec (src/cache/pin_file.h): a round trip, and the file as
 * untrusted input: every truncation, a bad checksum, and lengths that lie (with a valid checksum, so
 * only the bounds checks stand between them and an over-read or a huge allocation). */
#include "testutil.h"

#include <xxhash.h>

#include "cache/pin_file.h"

static void encode2(uint8_t **buf, size_t *len) {
    int32_t t1[5] = {1, 2, 3, 4, 5}, t2[2] = {7, 9};
    kvt_pin_rec v[2] = {{.id = 11, .created = 1000, .expires = 0, .ns = "", .tokens = t1, .n_tokens = 5},
                        {.id = 22, .created = 2000, .expires = 3000, .ns = "tenant-a", .tokens = t2, .n_tokens = 2}};
    assert_int_equal(kvt_pin_file_encode(v, 2, buf, len), KVT_OK);
}

/* Rewrites the trailing checksum after a mutation. */
static void reseal(uint8_t *buf, size_t len) {
    uint64_t h = XXH3_64bits(buf, len - 8);
    memcpy(buf + len - 8, &h, 8);
}

static kvt_status decode(const uint8_t *buf, size_t len, uint32_t *n) {
    kvt_pin_rec *v = NULL;
    char err[256] = "";
    kvt_status st = kvt_pin_file_decode(buf, len, &v, n, err, sizeof err);
    if (st != KVT_OK) assert_true(err[0] != '\0'); /* every refusal says why */
    kvt_pin_recs_free(v, *n);
    return st;
}

static void test_round_trip(void **state) {
    (void)state;
    uint8_t *buf;
    size_t len;
    encode2(&buf, &len);
    kvt_pin_rec *v = NULL;
    uint32_t n = 0;
    char err[128];
    assert_int_equal(kvt_pin_file_decode(buf, len, &v, &n, err, sizeof err), KVT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(v[0].id, 11);
    assert_int_equal(v[0].n_tokens, 5);
    assert_int_equal(v[0].tokens[4], 5);
    assert_string_equal(v[0].ns, "");
    assert_int_equal(v[1].expires, 3000);
    assert_string_equal(v[1].ns, "tenant-a");
    assert_int_equal(v[1].tokens[1], 9);
    kvt_pin_recs_free(v, n);
    /* an empty list is a valid file */
    free(buf);
    assert_int_equal(kvt_pin_file_encode(NULL, 0, &buf, &len), KVT_OK);
    assert_int_equal(decode(buf, len, &n), KVT_OK);
    assert_int_equal(n, 0);
    free(buf);
    assert_int_not_equal(kvt_pin_id(1, (int32_t[]){1, 2}, 2), kvt_pin_id(2, (int32_t[]){1, 2}, 2)); /* namespaces differ */
}

static void test_untrusted(void **state) {
    (void)state;
    uint8_t *buf;
    size_t len;
    uint32_t n;
    encode2(&buf, &len);
    for (size_t l = 0; l < len; l++) assert_int_not_equal(decode(buf, l, &n), KVT_OK); /* every truncation */
    uint8_t *m = malloc(len + 8);
    memcpy(m, buf, len);
    m[20] ^= 1; /* a flipped bit: the checksum */
    assert_int_equal(decode(m, len, &n), KVT_ERR_CORRUPT);
    /* lengths that lie, resealed: count, n_tokens, ns_len */
    const struct { size_t off; uint32_t val; } lies[] = {
        {12, 3}, {12, 1}, {12, 0xffffffffu}, {16 + 28, 0xffffffffu}, {16 + 28, 0}, {16 + 28, 6}, {16 + 24, 1000}, {16 + 24, 1},
    };
    for (size_t i = 0; i < sizeof lies / sizeof lies[0]; i++) {
        memcpy(m, buf, len);
        memcpy(m + lies[i].off, &lies[i].val, 4);
        reseal(m, len);
        assert_int_not_equal(decode(m, len, &n), KVT_OK);
    }
    /* a negative token id, a wrong version, trailing bytes */
    memcpy(m, buf, len);
    int32_t neg = -5;
    memcpy(m + 16 + 32, &neg, 4);
    reseal(m, len);
    assert_int_equal(decode(m, len, &n), KVT_ERR_FORMAT);
    memcpy(m, buf, len);
    m[8] = 2;
    reseal(m, len);
    assert_int_equal(decode(m, len, &n), KVT_ERR_FORMAT);
    memcpy(m, buf, len - 8);
    memset(m + len - 8, 0, 8); /* 8 extra bytes before the checksum */
    reseal(m, len + 8);
    assert_int_equal(decode(m, len + 8, &n), KVT_ERR_FORMAT);
    /* a NUL inside the namespace of pin 2 ("tenant-a" starts after pin 1's entry and tokens) */
    memcpy(m, buf, len);
    m[16 + 32 + 20 + 32 + 3] = 0;
    reseal(m, len);
    assert_int_equal(decode(m, len, &n), KVT_ERR_FORMAT);
    /* random bytes never crash */
    uint64_t seed = 7;
    for (int r = 0; r < 2000; r++) {
        memcpy(m, buf, len);
        m[tu_rand(&seed) % len] = (uint8_t)tu_rand(&seed);
        if (r & 1) reseal(m, len);
        kvt_pin_rec *v = NULL;
        char err[64];
        if (kvt_pin_file_decode(m, len, &v, &n, err, sizeof err) == KVT_OK) kvt_pin_recs_free(v, n);
    }
    free(m);
    free(buf);
    /* encode refuses what decode would */
    int32_t t = 1;
    kvt_pin_rec bad = {.id = 1, .ns = "", .tokens = &t, .n_tokens = 0};
    assert_int_equal(kvt_pin_file_encode(&bad, 1, &buf, &len), KVT_ERR_RANGE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_untrusted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
