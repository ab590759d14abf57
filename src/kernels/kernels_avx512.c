/*
 * kernels_avx512.c — AVX-512 (F+BW+VL) + VNNI instantiation of kernels_x86_tmpl.h: u8×s8 dots use
 * 256-bit vpdpbusd, f32-family kernels use 512-bit vectors, tiles are 4 weight rows × 4 activation
 * rows (32 vector registers). On an AVX-512 CPU without VNNI the AVX2 kernels are used instead (so
 * no instruction outside the CPU's feature set can be emitted).
 */
#include "kernels_internal.h"

#if KVT_X86
#define KVT_SFX avx512
#define KVT_TGT_STR "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define KVT_VNNI 1
#define KVT_TR 4
#define KVT_ZMM 1
#include "kernels_x86_tmpl.h"

void kq_fill_avx512(kq_table *t, bool vnni) {
    if (vnni) fill_table_avx512(t);
    else kq_fill_avx2(t);
}
#endif
