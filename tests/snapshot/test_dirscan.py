"""The native directory scan encodes exactly what the Python walk encodes."""

from __future__ import annotations

import os
import socket
import time

import pytest

from sprite_env.snapshot import capture, dircache
from tests.helpers import trees

native = pytest.importorskip("sprite_env._native")


def _python_blob(path: bytes, now: int) -> bytes:
    sigs = {}
    for name in os.listdir(path):
        st = os.lstat(os.path.join(path, name))
        sigs[name] = dircache.sig_of(st, now)
    return dircache.encode_sigs(sigs)


def test_blob_matches_python_on_every_directory(tmp_path: os.PathLike[str]) -> None:
    root = os.path.join(os.fsencode(tmp_path), b"t")
    spec = {k: v for k, v in trees.sample_spec().items() if not k.startswith(b"hard")}
    trees.build_tree(root, spec)
    time.sleep(0.1)  # past the racy window (a racy child makes the scan irregular)
    now = time.time_ns()
    checked = 0
    for dirpath, _dirs, _files in os.walk(root):
        fd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            blob, subdirs, *_counts, irregular = native.scan_dir(
                fd, now, dircache.RACY_NS, os.fstat(fd).st_dev
            )
        finally:
            os.close(fd)
        if irregular:  # times/ holds a file dated 2100: always racy, read every time
            assert dirpath.endswith(b"/times")
            continue
        assert blob == _python_blob(dirpath, now)
        assert subdirs == sorted(
            n
            for n in os.listdir(dirpath)
            if os.path.isdir(os.path.join(dirpath, n))
            and not os.path.islink(os.path.join(dirpath, n))
        )
        checked += 1
    assert checked > 60


def test_sockets_and_hard_links_ask_for_the_slow_path(tmp_path: os.PathLike[str]) -> None:
    d = os.fspath(tmp_path)
    with open(os.path.join(d, "a"), "w") as f:
        f.write("a")
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        later = 2**62  # "now" far in the future: nothing is racy
        assert native.scan_dir(fd, later, 0, os.fstat(fd).st_dev)[-1] is False
        os.link(os.path.join(d, "a"), os.path.join(d, "b"))
        assert native.scan_dir(fd, later, 0, os.fstat(fd).st_dev)[-1] is True
        os.unlink(os.path.join(d, "b"))
        now = time.time_ns()  # "a" was written just now: racy, so it vouches for nothing
        assert native.scan_dir(fd, now, dircache.RACY_NS, os.fstat(fd).st_dev)[-1] is True
        s = socket.socket(socket.AF_UNIX)
        s.bind(os.path.join(d, "sock"))
        s.close()
        assert native.scan_dir(fd, later, 0, os.fstat(fd).st_dev)[-1] is True
    finally:
        os.close(fd)
    with pytest.raises(OSError, match="Bad file descriptor"):
        native.scan_dir(-1, 0, 0, 0)


def test_captures_agree_with_and_without_the_native_scan(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from sprite_env.checkpoints import Engine

    tops = []
    for use_native in (True, False):
        # the same tree twice (the sample's mtimes are explicit), once per walk
        root = os.path.join(os.fspath(tmp_path), f"layer-{use_native}")
        trees.build_tree(root, trees.sample_spec())
        time.sleep(0.1)
        if not use_native:
            monkeypatch.setattr(capture, "_scan_dir", None)
        with Engine(root, os.path.join(os.fspath(tmp_path), f"store-{use_native}")) as e:
            first = e.create()
            assert e.create().top_tree == first.top_tree
            with open(os.path.join(root, "deep", "d", "changed"), "w") as f:
                f.write("x")
            time.sleep(0.1)
            second = e.create()
            assert second.top_tree != first.top_tree
            assert e.create().top_tree == second.top_tree
            tops.append(first.top_tree)
    assert tops[0] == tops[1]


@pytest.mark.parametrize("entries", [256, 257, 700])
def test_small_and_large_directories_alike(tmp_path: os.PathLike[str], entries: int) -> None:
    """Up to 256 entries the scan keeps the GIL and lists once; past that it lists the rest
    and stats without it: both give the blob and subdirectories of the Python walk."""
    root = os.fsencode(tmp_path)
    for i in range(entries):
        p = os.path.join(root, b"e%04d" % ((i * 7919) % 10_000))  # not listed in name order
        if i % 5 == 0:
            os.mkdir(p)
        else:
            with open(p, "wb") as f:
                f.write(b"x" * i)
    now = 2**62  # nothing is racy
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        blob, subdirs, files, nbytes, *_rest, irregular = native.scan_dir(
            fd, now, 0, os.fstat(fd).st_dev
        )
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0  # the caller's offset is left alone
    finally:
        os.close(fd)
    assert not irregular
    assert blob == _python_blob(root, now)
    assert subdirs == sorted(n for n in os.listdir(root) if os.path.isdir(os.path.join(root, n)))
    assert files == entries - len(subdirs)
    assert nbytes == sum(i for i in range(entries) if i % 5)
