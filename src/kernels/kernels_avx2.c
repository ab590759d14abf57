/*
 * kernels_avx2.c — AVX2+FMA+F16C instantiation of kernels_x86_tmpl.h (tiles of 4 weight rows ×
 * 2 activation rows: 16 ymm registers). Compiled without global -m flags: every function carries
 * __attribute__((target("avx2,fma,f16c"))) and is only called after CPUID says so.
 */
#include "kernels_internal.h"

#if KVT_X86
#define KVT_SFX avx2
#define KVT_TGT_STR "avx2,fma,f16c"
#define KVT_VNNI 0
#define KVT_TR 2
#define KVT_ZMM 0
#include "kernels_x86_tmpl.h"

void kq_fill_avx2(kq_table *t) { fill_table_avx2(t); }
#endif
