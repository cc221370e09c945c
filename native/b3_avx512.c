/* The vendored BLAKE3 avx512 kernel, compiled for that instruction set (see b3_core.c);
 * the dispatch calls it only on a CPU that has it. */
#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wsign-conversion" /* upstream's code, kept as it is */
#pragma GCC target("avx512f,avx512vl")
#include "blake3/blake3_avx512.c"
#else
typedef int b3_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
