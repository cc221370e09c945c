/*
 * fastcdc.h - content-defined chunking (FastCDC, normalized chunking level 2).
 *
 * Plain C11, no Python. This is the scalar reference kernel behind
 * sprite_env._native; sprite_env/store/_chunker_ref.py implements exactly the
 * same algorithm in pure Python and the test suite checks that the two agree.
 *
 * Chunk boundaries are part of the on-disk format: the same bytes must always
 * cut at the same places or deduplication against existing checkpoints breaks.
 * Never change the gear table, the seed, the masks or the cut rule below
 * (tests/store/test_chunker.py pins them with a golden test).
 */
#ifndef SPRITE_ENV_FASTCDC_H
#define SPRITE_ENV_FASTCDC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Seed of the splitmix64 stream the gear table was generated from ("sprite-1"). */
#define FASTCDC_GEAR_SEED UINT64_C(0x7370726974652d31)

/* Bounds on log2(avg_size): the loose mask has log2(avg)-2 one-bits (>= 1) and
 * the strict mask log2(avg)+2 one-bits (<= 64). */
#define FASTCDC_MIN_AVG_BITS 3u
#define FASTCDC_MAX_AVG_BITS 62u

/* The 256-entry gear table (see fastcdc.c for how it was generated). */
extern const uint64_t fastcdc_gear[256];

/* Result codes of fastcdc_validate(). */
enum fastcdc_status {
    FASTCDC_OK = 0,
    FASTCDC_ERR_ORDER = 1,   /* not min_size < avg_size < max_size */
    FASTCDC_ERR_AVG_POW2 = 2 /* avg_size not a power of two in [2^3, 2^62] */
};

/* Checks chunking parameters. Returns FASTCDC_OK or one of the errors above. */
int fastcdc_validate(size_t min_size, size_t avg_size, size_t max_size);

/* Human-readable message for a fastcdc_validate() result. */
const char *fastcdc_strerror(int status);

/*
 * Length of the next chunk starting at buf[0], for a stream whose remaining
 * bytes are buf[0 .. len).
 *
 * Precondition: fastcdc_validate(min_size, avg_size, max_size) == FASTCDC_OK.
 *
 * Returns len if len <= min_size, otherwise a value in (min_size, n] where
 * n = min(len, max_size): the chunk ends right after the first byte i
 * (min_size <= i < n) at which the gear hash, started from 0 at byte min_size,
 * satisfies (hash & mask) == 0, or at n if there is no such byte. The mask is
 * the strict one (log2(avg)+2 high bits) for bytes i < avg_size and the loose
 * one (log2(avg)-2 high bits) from avg_size on. The result never exceeds
 * max_size. A result equal to len (< max_size) means "end of data", not a cut:
 * more data might extend that chunk.
 *
 * Returns 0 only for len == 0. Reads no byte at or past min(len, max_size).
 */
size_t fastcdc_cut(const uint8_t *buf, size_t len, size_t min_size, size_t avg_size,
                   size_t max_size);

#ifdef __cplusplus
}
#endif

#endif /* SPRITE_ENV_FASTCDC_H */
