/*
 * fastcdc.c - scalar FastCDC kernel (normalized chunking level 2).
 *
 * Algorithm (Xia et al., "FastCDC: a Fast and Efficient Content-Defined
 * Chunking Approach for Data Deduplication", USENIX ATC 2016):
 *
 *   - The first min_size bytes of a chunk are skipped (never a cut point).
 *   - From byte min_size on, a gear hash is rolled: hash = (hash << 1) + gear[b].
 *   - Normalized chunking, level 2: while the chunk is shorter than avg_size
 *     the strict mask (log2(avg)+2 one-bits) is used, which makes a cut less
 *     likely; from avg_size on the loose mask (log2(avg)-2 one-bits) is used,
 *     which makes a cut more likely. Chunk sizes concentrate around avg_size.
 *   - The chunk ends after the first byte whose hash has (hash & mask) == 0,
 *     and at max_size at the latest.
 *
 * Why the masks take the MOST significant bits: the gear hash shifts left, so
 * bit j of the hash only depends on the last j+1 bytes; bits shifted past bit
 * 63 fall off. Only the high bits depend on the whole 64-byte window, the low
 * bits depend on the last few bytes alone (bit 0 on the last byte only). A
 * mask over the low bits would give a window of log2(avg) bytes and cut points
 * strongly correlated with short byte patterns; the high-bit mask
 * ((1 << k) - 1) << (64 - k) uses the full window.
 *
 * A run of identical bytes (notably zeros: sparse files, zero-filled images)
 * quickly reaches a fixed point of the hash; with this gear table that fixed
 * point never matches a mask for the default parameters, so zero runs are cut
 * at max_size into identical chunks, which deduplicate perfectly.
 */
#include "fastcdc.h"

/*
 * The gear table. NEVER CHANGE IT: chunk boundaries depend on every entry,
 * and stored checkpoints are deduplicated by chunk.
 *
 * Generated deterministically as 256 successive outputs of splitmix64
 * (Vigna's reference: state += 0x9e3779b97f4a7c15; z = state;
 * z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 * out = z ^ (z >> 31)) with the state starting at FASTCDC_GEAR_SEED =
 * 0x7370726974652d31 (the ASCII bytes "sprite-1"); entry i is output i.
 * sprite_env/store/_chunker_ref.py regenerates it in Python and the tests
 * compare the two.
 */
const uint64_t fastcdc_gear[256] = {
    UINT64_C(0xcffff7f084fe2378), UINT64_C(0x344566614e9d1c37), UINT64_C(0x50121f72a95d845b),
    UINT64_C(0x6866a7a118b224d7), UINT64_C(0x688c8ff5e7a21648), UINT64_C(0x0acf1241668ae110),
    UINT64_C(0x69e8a2283e1d5144), UINT64_C(0x7cfe265faf7a8dec), UINT64_C(0x70b94a3cb05496c7),
    UINT64_C(0x379829ea41549960), UINT64_C(0xe08b9e68db0e7e28), UINT64_C(0xdc6b8919190165b8),
    UINT64_C(0xb3d509e26b86773a), UINT64_C(0x534c41131a0f73ac), UINT64_C(0x9512faba162cf3a2),
    UINT64_C(0x3ae657d180845572), UINT64_C(0x6499b37f590766f1), UINT64_C(0x62149cb2e0b0f147),
    UINT64_C(0x669642c2bfd2cc0a), UINT64_C(0x25fbf71b65181469), UINT64_C(0xc561fef5a95d3432),
    UINT64_C(0xcc0fb5b39fe64bf8), UINT64_C(0x5b1c5d8f3b326144), UINT64_C(0x5b9a9a08208e4cb2),
    UINT64_C(0x32b59f2dfa43e7a5), UINT64_C(0xfb18bcb16be86f29), UINT64_C(0x283653019dbbec33),
    UINT64_C(0xb916eb57acf12837), UINT64_C(0xa7fbc67c335d0e1e), UINT64_C(0xeec166e183116cb0),
    UINT64_C(0xda4ff32fbb0f69d3), UINT64_C(0xdfdf4403ff964ed2), UINT64_C(0x0238b26f7feb9239),
    UINT64_C(0x5c7bc9c5db4b969e), UINT64_C(0xab540756502b7979), UINT64_C(0x116a69bad55e7eb4),
    UINT64_C(0x7a5ab635ac0ea9ce), UINT64_C(0x7365b3bfffe6db34), UINT64_C(0x0f26c13a8264a717),
    UINT64_C(0x3d44f5a30018ecda), UINT64_C(0x7eb2fdb2bb9b6a71), UINT64_C(0x7e084b6c8d91ac49),
    UINT64_C(0xba0e85d0d48736e3), UINT64_C(0x2aa29d7755cdc704), UINT64_C(0x9359797194877105),
    UINT64_C(0x1a7f04c8b5ca1299), UINT64_C(0x52969cf5793eb401), UINT64_C(0x34f3bcbf74859cc5),
    UINT64_C(0x739c2c2f28198459), UINT64_C(0xb79faeed56beffbd), UINT64_C(0xe3fe17fe256e12ad),
    UINT64_C(0xf9142af3f8869a00), UINT64_C(0x6f4aa88cd00bc58a), UINT64_C(0x240761fa44418fe8),
    UINT64_C(0x4d92f88e716a4eb0), UINT64_C(0x496ce973f0dd9969), UINT64_C(0x40b8a99d3597f5f6),
    UINT64_C(0x2a51b1dd7b8643d7), UINT64_C(0x61bcc6dacf1e873b), UINT64_C(0xef53609f110f7234),
    UINT64_C(0xbfe0136c493ad03a), UINT64_C(0xd2a937a94ef3a846), UINT64_C(0x68645c19b4c495db),
    UINT64_C(0x4853bfa6042cb974), UINT64_C(0x69e2d72fa7b5669f), UINT64_C(0x74e5424ea4dc3faf),
    UINT64_C(0x6232d4ac88893c9a), UINT64_C(0xb9289b086d9e9203), UINT64_C(0x523af642ce5a495b),
    UINT64_C(0x8592077c0a74a2f7), UINT64_C(0x5a08593a3629d5d1), UINT64_C(0xae7b59bc82ae57eb),
    UINT64_C(0xa916b7f030299f9a), UINT64_C(0xefc2b7063c884b37), UINT64_C(0x8329ce109661ceac),
    UINT64_C(0xdb45ed8429415546), UINT64_C(0x751fdaf9faf0e491), UINT64_C(0x19d58a792e98cd57),
    UINT64_C(0xdb1d925b13838b1d), UINT64_C(0x12c87b4fdb87cca6), UINT64_C(0x8b8f3003f8d7c7dd),
    UINT64_C(0x195c3a6058b0d14c), UINT64_C(0x55d0d2816a2d8332), UINT64_C(0xc34b94140364fc13),
    UINT64_C(0x8cbb09919215d66e), UINT64_C(0x5b7af8c10e7c8dfb), UINT64_C(0xdabed3fe9533bcbc),
    UINT64_C(0x7904b30f26d38819), UINT64_C(0x8e61a116149fcf6b), UINT64_C(0x4e50d10943c6c990),
    UINT64_C(0x1a11e10ce0e83337), UINT64_C(0xe1e008bb5055f5c7), UINT64_C(0x74cb556fa011758b),
    UINT64_C(0x0050796ebaf7f37d), UINT64_C(0x3726b492c986a2c5), UINT64_C(0x0fdadd90692b6fbb),
    UINT64_C(0x583c3f785d05e0a2), UINT64_C(0xdf136cf44e0c3aed), UINT64_C(0x11a8427abaebe772),
    UINT64_C(0x7c99568a56825902), UINT64_C(0xed60977c84c99de8), UINT64_C(0x0b779e89e985217e),
    UINT64_C(0xba8039a889ac0b37), UINT64_C(0xccc00ce48de08bd9), UINT64_C(0x00a6ee3cb35269de),
    UINT64_C(0xed087870290017c5), UINT64_C(0xd03bff75e4d9dbcd), UINT64_C(0xa40549018f2700e8),
    UINT64_C(0x602bc908c7d2d247), UINT64_C(0x22aa557fcd5185fa), UINT64_C(0xc5489886d525439c),
    UINT64_C(0x3ca4fc276ed7a282), UINT64_C(0x20295ca9589ca425), UINT64_C(0xf72e03d486b99e49),
    UINT64_C(0x0e9ddddc17f187f6), UINT64_C(0x51f208ed10a76f3e), UINT64_C(0x110e87cc1761f71b),
    UINT64_C(0xc908fab20af6014a), UINT64_C(0x658e033e67a1f9ab), UINT64_C(0xa7d94fd190f1cef8),
    UINT64_C(0x5af7b49e1d0561d4), UINT64_C(0x871d0d7c8c03686a), UINT64_C(0x463e9e1c725005d0),
    UINT64_C(0xae6cb15f8f19c0c9), UINT64_C(0x40581b53c7fb5678), UINT64_C(0xda172b559f58db27),
    UINT64_C(0xc29e57c096b0dcdc), UINT64_C(0xe0e9fb3040359bab), UINT64_C(0x0668ab10d1f000fa),
    UINT64_C(0x52bd7d28ceddb90a), UINT64_C(0xaa117c1877c5138a), UINT64_C(0x1f7a7567f269fc4a),
    UINT64_C(0x5f471b24d5b9deee), UINT64_C(0x45e5f34df0acf0e1), UINT64_C(0x9887913b836ced04),
    UINT64_C(0x34ffe9e6fce4a696), UINT64_C(0xa35eec82aac9aebd), UINT64_C(0xe691e31c48873f18),
    UINT64_C(0x254c7942dff5b82e), UINT64_C(0x05650a46c25dde55), UINT64_C(0x537f551258fff1c6),
    UINT64_C(0x7abbb774ce2a9790), UINT64_C(0xff1582da87b6324b), UINT64_C(0x295e78e0811ec5bf),
    UINT64_C(0xd6dfb126bfdefec2), UINT64_C(0xe44d156f668c8d11), UINT64_C(0xb3c1d979bc39f649),
    UINT64_C(0x139c8f8039320bae), UINT64_C(0x717baf9125576ac0), UINT64_C(0xd2660707997555ff),
    UINT64_C(0xb131513ee501aeba), UINT64_C(0x69be12ae7849fc0d), UINT64_C(0xc77f880b53f17dff),
    UINT64_C(0x19512bf8c0f541c9), UINT64_C(0x86b509e12ce60c9b), UINT64_C(0x972a58ed244bde1b),
    UINT64_C(0x3a127d0d1e57a4b2), UINT64_C(0x659d11b68fc6d599), UINT64_C(0xc864376381b90012),
    UINT64_C(0x3e17babe5175958f), UINT64_C(0x2f23ab759b020a24), UINT64_C(0x065369ade692515c),
    UINT64_C(0xed4c37a86c8929fe), UINT64_C(0xf0e05bc29ff87938), UINT64_C(0x676cfea0cd1cd386),
    UINT64_C(0x9456166a3c50c644), UINT64_C(0x2de1ff73a1530ad9), UINT64_C(0x9e5a89ce68cd46bc),
    UINT64_C(0x32b023e7a17eae84), UINT64_C(0x4dc24d2be9a15c9b), UINT64_C(0x406129a0dcd15086),
    UINT64_C(0x1d68af62e0af7ac9), UINT64_C(0xbf7a6bfba18512d0), UINT64_C(0xb98c5de701505192),
    UINT64_C(0x72abd24c3da7596b), UINT64_C(0x4efba622287737c0), UINT64_C(0x1729df45e39b8b00),
    UINT64_C(0xcb9ae8489e386b9d), UINT64_C(0x51e0f54dde415d19), UINT64_C(0x960b780ea955b088),
    UINT64_C(0x451ca98a0d795086), UINT64_C(0xee39c2936412786f), UINT64_C(0x657eceaef3ed3780),
    UINT64_C(0x88ff8d9401143269), UINT64_C(0x94cb3b2d996c2976), UINT64_C(0xa4a7fc167c2f8aac),
    UINT64_C(0x2a2af866647eb442), UINT64_C(0xd93056821d77c08f), UINT64_C(0xa39128f2125f6f15),
    UINT64_C(0x3ec46e4471d4b7f5), UINT64_C(0x819e96537004d3bc), UINT64_C(0xb33db95c71b8c49a),
    UINT64_C(0x150592734bf9a2dc), UINT64_C(0x6b39e261ab8dd840), UINT64_C(0x123ccc4920b7e081),
    UINT64_C(0xd4dab40d1d513c55), UINT64_C(0x3652375afa049bc3), UINT64_C(0xdf20d76f934b9d9e),
    UINT64_C(0xe8175b9f0617cf08), UINT64_C(0x52492fabec2aa96a), UINT64_C(0xaeec25ae01828fbf),
    UINT64_C(0xc89e0803022a799a), UINT64_C(0xa1b4250ab767d662), UINT64_C(0xff6af1e762a314d4),
    UINT64_C(0xc64b315225e6f1d1), UINT64_C(0x11d5b5d4722fc0eb), UINT64_C(0x5d8f136c1b691130),
    UINT64_C(0x5edee74f74920909), UINT64_C(0x10c1702166f5749d), UINT64_C(0xf6e9ad5a37239ead),
    UINT64_C(0x09554c1e98fd86ec), UINT64_C(0x0d297a70096fd714), UINT64_C(0x9b8e47a829dcfd47),
    UINT64_C(0x08e0f06a1550d3cc), UINT64_C(0x9736c4e30966ec9c), UINT64_C(0x81fee1d4457da1ec),
    UINT64_C(0x37033e13ca25fcfb), UINT64_C(0xc5f57d9580e3c221), UINT64_C(0x868952784c1ba503),
    UINT64_C(0x96c1c27326230c2c), UINT64_C(0xc7e9e72f47cb7dce), UINT64_C(0xb0b7074e11b148cc),
    UINT64_C(0xcd15721998ecb80f), UINT64_C(0x9e5c6899107920b8), UINT64_C(0x947f22e71f039890),
    UINT64_C(0xc0a6a805e30f0774), UINT64_C(0xc5160ea0947650af), UINT64_C(0x4566cb2c977ce28c),
    UINT64_C(0x5d7c110ee875d23e), UINT64_C(0x71b1e99822f03fa6), UINT64_C(0xa4e28abf4f212f01),
    UINT64_C(0xbd4ae435106a0c04), UINT64_C(0x3041a26467765e9b), UINT64_C(0x906d69eb27645872),
    UINT64_C(0x2793ad61861eb616), UINT64_C(0xd7ec4c1d14d2412f), UINT64_C(0x510d4c7d4b3c2b63),
    UINT64_C(0x027fadbd8273841d), UINT64_C(0xb8acba3257e1f2a8), UINT64_C(0x4b0ace52131533fb),
    UINT64_C(0x909825cb7a39ba97), UINT64_C(0xd9a77463de80afbc), UINT64_C(0x561c848f7adc5b07),
    UINT64_C(0x45ec51cbf7fb8a28), UINT64_C(0xa67ba3bd9b603ae3), UINT64_C(0xbbd475a5d8506067),
    UINT64_C(0x9a5be3f7c5e63393), UINT64_C(0x929177f7ca26bba6), UINT64_C(0xda93f35cda1e8568),
    UINT64_C(0x0c221e0df582bf47), UINT64_C(0xee8d1cb180ae7bd8), UINT64_C(0xefba2e0d8bdc415f),
    UINT64_C(0x5ff985ecee4383e4), UINT64_C(0xcc7ff46207f80933), UINT64_C(0x346978e1aa452993),
    UINT64_C(0x9bf3ba8ef5985dd5),
};

/* log2 of a power of two (or of its highest set bit). */
static unsigned log2_floor(size_t x)
{
    unsigned bits = 0;
    while (x > 1u) {
        x >>= 1;
        bits++;
    }
    return bits;
}

/* The k most significant bits set, 1 <= k <= 64. */
static uint64_t high_mask(unsigned k)
{
    return UINT64_MAX << (64u - k);
}

int fastcdc_validate(size_t min_size, size_t avg_size, size_t max_size)
{
    if (!(min_size < avg_size && avg_size < max_size)) {
        return FASTCDC_ERR_ORDER;
    }
    if ((avg_size & (avg_size - 1u)) != 0u) {
        return FASTCDC_ERR_AVG_POW2;
    }
    unsigned bits = log2_floor(avg_size);
    if (bits < FASTCDC_MIN_AVG_BITS || bits > FASTCDC_MAX_AVG_BITS) {
        return FASTCDC_ERR_AVG_POW2;
    }
    return FASTCDC_OK;
}

const char *fastcdc_strerror(int status)
{
    switch (status) {
    case FASTCDC_OK:
        return "ok";
    case FASTCDC_ERR_ORDER:
        return "chunk sizes must satisfy 0 <= min_size < avg_size < max_size";
    case FASTCDC_ERR_AVG_POW2:
        return "avg_size must be a power of two between 2**3 and 2**62";
    default:
        return "unknown fastcdc error";
    }
}

size_t fastcdc_cut(const uint8_t *buf, size_t len, size_t min_size, size_t avg_size,
                   size_t max_size)
{
    size_t n = len < max_size ? len : max_size;
    if (n <= min_size) {
        return n;
    }
    unsigned bits = log2_floor(avg_size);
    const uint64_t mask_s = high_mask(bits + 2u);
    const uint64_t mask_l = high_mask(bits - 2u);
    /* Phase 1 (strict mask) covers bytes [min_size, normal), phase 2 (loose
     * mask) covers [normal, n); two loops, so no per-byte branch on the phase. */
    const size_t normal = avg_size < n ? avg_size : n;
    uint64_t hash = 0;
    size_t i = min_size;
    for (; i < normal; i++) {
        hash = (hash << 1) + fastcdc_gear[buf[i]];
        if ((hash & mask_s) == 0u) {
            return i + 1u;
        }
    }
    for (; i < n; i++) {
        hash = (hash << 1) + fastcdc_gear[buf[i]];
        if ((hash & mask_l) == 0u) {
            return i + 1u;
        }
    }
    return n;
}
