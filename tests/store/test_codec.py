import os

import blake3
import pytest

from sprite_env.store import codec


def test_object_id_is_blake3_256() -> None:
    assert codec.object_id(b"abc") == blake3.blake3(b"abc").digest()
    assert len(codec.object_id(b"")) == 32


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"a" * 100_000, codec.Codec.ZSTD),  # compressible
        (os.urandom(100_000), codec.Codec.RAW),  # saves < 3%: kept raw
        (b"tiny", codec.Codec.RAW),
        (b"", codec.Codec.RAW),
    ],
)
def test_encode_picks_codec_and_round_trips(data: bytes, expected: codec.Codec) -> None:
    c, payload = codec.encode(data)
    assert c == expected
    if c == codec.Codec.ZSTD:
        assert len(payload) < len(data) * 0.97
    assert codec.decode(c, payload, len(data)) == data


def test_encode_many_is_encode_of_each() -> None:
    datas = [
        b"a" * 100_000,
        os.urandom(100_000),
        b"",
        b"x" * (codec.TINY - 1),
        b"x" * codec.TINY,
        os.urandom(codec.TINY),
        b"tiny",
        b"abc" * 5000,
    ]
    assert codec.encode_many(datas) == [codec.encode(d) for d in datas]
    assert {c for c, _ in codec.encode_many(datas)} == {codec.Codec.RAW, codec.Codec.ZSTD}
    assert codec.encode_many([]) == []
    assert codec.encode_many([b"", b"ab"]) == [(codec.Codec.RAW, b""), (codec.Codec.RAW, b"ab")]


def test_decode_rejects_garbage_and_wrong_length() -> None:
    c, payload = codec.encode(b"x" * 1000)
    with pytest.raises(ValueError, match="expected"):
        codec.decode(c, payload, 999)
    with pytest.raises(ValueError, match="zstd"):
        codec.decode(codec.Codec.ZSTD, b"\x00" * 20, 1000)
    with pytest.raises(ValueError, match="unknown codec"):
        codec.decode(9, b"", 0)


@pytest.mark.parametrize("n", [0, 1, 64, 1023, 1024, 1025, 16 << 10, (16 << 10) + 1, 3 << 20])
def test_object_id_is_the_blake3_package_s_digest_at_every_size(n: int) -> None:
    data = blake3.blake3(b"seed").digest(length=n)
    want = blake3.blake3(data).digest()
    assert codec.object_id(data) == want
    assert codec.object_id(memoryview(bytearray(data))) == want  # any buffer
    assert codec.object_id(memoryview(data)[1:]) == blake3.blake3(data[1:]).digest()
