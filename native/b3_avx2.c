/* The vendored BLAKE3 avx2 kernel, compiled for that instruction set (see b3_core.c);
 * the dispatch calls it only on a CPU that has it. */
#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wsign-conversion" /* upstream's code, kept as it is */
#pragma GCC target("avx2")
#include "blake3/blake3_avx2.c"
#else
typedef int b3_avx2_unused; /* ISO C forbids an empty translation unit */
#endif
