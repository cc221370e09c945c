/* Builds the vendored BLAKE3 C implementation (native/blake3/, unchanged, CC0): the
 * portable core and the CPU dispatch. The SIMD kernels are in b3_sse2.c, b3_sse41.c,
 * b3_avx2.c and b3_avx512.c, one translation unit each: their static helpers share names,
 * and each needs its own instruction set (a pragma here, as setuptools gives every source
 * of an extension the same flags). pagesum.c, bulkread.c and _native.c's blake3_256 use it. */
#pragma GCC diagnostic ignored "-Wsign-conversion" /* upstream's code, kept as it is */
#include "blake3/blake3.c"
#include "blake3/blake3_dispatch.c"
#include "blake3/blake3_portable.c"
