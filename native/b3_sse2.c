/* The vendored BLAKE3 sse2 kernel, compiled for that instruction set (see b3_core.c);
 * the dispatch calls it only on a CPU that has it. */
#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wsign-conversion" /* upstream's code, kept as it is */
#pragma GCC target("sse2")
#include "blake3/blake3_sse2.c"
#else
typedef int b3_sse2_unused; /* ISO C forbids an empty translation unit */
#endif
