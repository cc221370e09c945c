"""The full restore, cold: ``checkpoints export`` beside restic restore and borg extract
(issue 12, the table's "full restore into an empty directory" row).

Usage::

    python benchmarks/bench_restore.py [--layers small,medium] [--data DIR] [--reps 3]
                                       [--tools sprite-env,sprite-env-daemon,restic,borg]
                                       [--baseline REV] [--no-verify] [--work DIR] [--out FILE]

Each layer is one of ``../shared/bench``'s (``make_dataset.sh DIR small|medium``), only read.
Per layer, untimed: one first checkpoint of it per tool (``bench_first``'s tools: the
sprite-env store, a restic repository, a borg repository) and the tree oracle's manifest of
the layer (``_tree.manifest``, plus its hard-link groups). Then ``--reps`` rounds, the tools
in turn (the first one rotates from round to round); before each run the target directory
is made anew and empty, then ``sync`` and ``echo 3 > /proc/sys/vm/drop_caches``; timed:

- sprite-env: ``sprite-env --root EMPTY --store STORE checkpoints export v0 DIR`` (offline,
  as a user runs it on the store's machine), from a copy of ``sprite_env/`` as committed at
  HEAD (``git archive``) with the working tree's built extension;
- sprite-env-daemon: the same export through a running daemon (``sprite-env daemon --root
  EMPTY --store COPY --no-view --no-journal``, COPY a ``cp -a`` of the store, as a daemon
  holds its store's lock; started once per layer, untimed):
  ``sprite-env --socket SOCK checkpoints export v0 DIR``; the daemon does the work, so its
  CPU is the daemon's (``/proc/PID/stat`` before and after) and its peak RSS the daemon's
  high-water mark (``VmHWM``, over its whole life);
- ``sprite-env@REV`` (``--baseline REV``): the offline export of the package at REV;
- restic: ``restic restore latest --target DIR`` (its cache kept, as on the machine that
  made the backup); borg: ``borg extract REPO::first`` run in DIR.

Every result is compared with the layer by the tree oracle (content, modes, owners, ns
mtimes, xattrs, device numbers) and by its hard-link groups (``--no-verify`` skips it).
Wall and CPU (``wait4``), peak RSS (GNU time), medians, ratios against restic. sprite-env
syncs the file system at the end of an export (``syncfs``); restic and borg do not, so the
next ``sync`` (untimed) writes their data back. Output: markdown on stdout, JSON in
``benchmarks/results/restore-<date>.json`` (paths relative to the repository, a data set
elsewhere as ``$BENCH_DATA/<profile>``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import layer as layer_mod  # noqa: E402
from _peers import (  # noqa: E402
    drop_caches,
    markdown_table,
    ratio,
    rel,
    run_measured,
    write_results,
)
from _tree import compare, manifest, verdict  # noqa: E402
from bench_first import Borg, Restic, Sprite, Tool, freeze, log, rmtree  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def link_groups(root: str) -> list[list[str]]:
    """The hard-link groups under ``root`` (non-directories with more than one name), each
    as its sorted paths, sorted: two trees link alike when these are equal."""
    by_inode: dict[tuple[int, int], list[str]] = {}
    for path, st in layer_mod.walk(root):
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            by_inode.setdefault((st.st_dev, st.st_ino), []).append(path)
    return sorted(sorted(g) for g in by_inode.values() if len(g) > 1)


def freeze_whole(rev: str, dest: str) -> str:
    """``bench_first.freeze`` plus what the copy's symlinks point to outside ``sprite_env/``
    (``sprite_env/llm.txt`` names the repository's ``llm.txt``, which the daemon installs)."""
    commit = freeze(rev, dest)
    for dirpath, _dirs, files in os.walk(os.path.join(dest, "sprite_env")):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.islink(path) and not os.path.exists(path):
                target = os.path.relpath(os.path.realpath(path), dest)
                archive = subprocess.run(
                    ["git", "-C", REPO, "archive", rev, target], capture_output=True, check=True
                ).stdout
                subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return commit


# -- the tools' restores ------------------------------------------------------------------


class SpriteExport(Sprite):
    """``checkpoints export`` offline, on the store ``bench_first``'s ``Sprite`` made."""

    def __init__(self, name: str, work: str, src: str) -> None:
        super().__init__(name, work, src)
        self.empty_root = os.path.join(self.dir, "root")

    def restore(self, target: str) -> tuple[list[str], str | None]:
        os.makedirs(self.empty_root, exist_ok=True)
        base = [*self.cmd, "--root", self.empty_root, "--store", self.repo]
        return [*base, "checkpoints", "export", "v0", target, "--json"], None


class DaemonExport(SpriteExport):
    """The same export through a daemon serving the store (started by :meth:`start`)."""

    def __init__(self, name: str, work: str, src: str, store_of: Sprite) -> None:
        super().__init__(name, work, src)
        self.store_of = store_of
        self.state = os.path.join(self.dir, "state")
        self.socket = os.path.join(self.state, "api.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    def init(self, layer: str) -> None:
        """A copy of the offline tool's store (a daemon holds its store's lock)."""
        rmtree(self.repo)
        os.makedirs(self.dir, exist_ok=True)
        self.untimed(["cp", "-a", self.store_of.repo, self.repo])

    def wipe(self) -> None:
        self.stop()
        rmtree(self.state)
        super().wipe()

    def start(self) -> None:
        os.makedirs(self.empty_root, exist_ok=True)
        os.makedirs(self.state, exist_ok=True)
        argv = [*self.cmd, "daemon", "--root", self.empty_root, "--store", self.repo]
        argv += ["--state", self.state, "--no-view", "--no-journal"]
        argv += ["--auto-interval", "0"]
        logf = open(os.path.join(self.dir, "daemon.log"), "ab")  # noqa: SIM115 (the daemon's)
        self.proc = subprocess.Popen(
            argv, env=self.env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT
        )
        logf.close()
        deadline = time.monotonic() + 120
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"daemon did not start: see {self.dir}/daemon.log")
            time.sleep(0.05)
        self.untimed([*self.cmd, "--socket", self.socket, "checkpoints", "list", "--json"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restore(self, target: str) -> tuple[list[str], str | None]:
        return [
            *self.cmd,
            "--socket",
            self.socket,
            "checkpoints",
            "export",
            "v0",
            target,
            "--json",
        ], None

    def cpu(self) -> float:
        """The daemon's user + sys seconds so far."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def hwm_kib(self) -> int:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        return 0


class ResticRestore(Restic):
    def restore(self, target: str) -> tuple[list[str], str | None]:
        return ["restic", "-r", self.repo, "restore", "latest", "--target", target], None


class BorgExtract(Borg):
    def restore(self, target: str) -> tuple[list[str], str | None]:
        return ["borg", "extract", f"{self.repo}::first"], target


# -- one layer ----------------------------------------------------------------------------


def first_checkpoint(t: Tool, layer: str) -> None:
    """The tool's repository with one backup of ``layer`` (untimed)."""
    t.wipe()
    os.makedirs(t.dir, exist_ok=True)
    t.init(layer)
    argv, cwd = t.backup(layer)
    t.untimed(argv, cwd=cwd)


def run_layer(tools: list[Tool], layer: str, reps: int, work: str, verify: bool) -> dict[str, Any]:
    log(f"{rel(layer)}: first checkpoints (untimed)")
    for t in tools:
        if not isinstance(t, DaemonExport):
            first_checkpoint(t, layer)
    expected = manifest(layer) if verify else {}
    expected_links = link_groups(layer) if verify else []
    for t in tools:
        if isinstance(t, DaemonExport):
            t.init(layer)
            t.start()
    target = os.path.join(work, "target")
    runs: dict[str, list[dict[str, Any]]] = {t.name: [] for t in tools}
    try:
        for rep in range(reps):
            order = tools[rep % len(tools) :] + tools[: rep % len(tools)]
            for t in order:
                rmtree(target)
                os.makedirs(target)
                drop_caches()
                load = os.getloadavg()[0]
                argv, cwd = t.restore(target)  # type: ignore[attr-defined]
                daemon = t if isinstance(t, DaemonExport) else None
                cpu0 = daemon.cpu() if daemon else 0.0
                m = run_measured(argv, cwd=cwd, env=t.env)
                run: dict[str, Any] = {
                    "wall": m.wall,
                    "user": m.user,
                    "sys": m.sys,
                    "cpu": m.cpu,
                    "max_rss_kib": m.max_rss_kib,
                    "load": load,
                    "ok": m.ok,
                }
                if daemon:
                    run["client_cpu"] = m.cpu
                    run["cpu"] = daemon.cpu() - cpu0
                    run["max_rss_kib"] = daemon.hwm_kib()
                if not m.ok:
                    run["stderr"] = m.stderr[-500:]
                elif verify:
                    v = compare(expected, manifest(target))
                    links_ok = link_groups(target) == expected_links
                    run["verify"] = {**v, "links_ok": links_ok}
                    run["ok"] = v["ok"] and links_ok
                runs[t.name].append(run)
                log(
                    f"{os.path.basename(layer)} {t.name} rep {rep}: {m.wall:.2f} s, "
                    f"CPU {run['cpu']:.2f} s, load {load:.1f}, "
                    f"{verdict(run.get('verify')) if verify else 'not verified'}"
                    f"{'' if run.get('verify', {}).get('links_ok', True) else ' LINKS DIFFER'}"
                )
    finally:
        for t in tools:
            if isinstance(t, DaemonExport):
                t.stop()
        rmtree(target)
    summary: dict[str, Any] = {}
    for name, rs in runs.items():
        good = [r for r in rs if r["ok"]]
        summary[name] = {
            "wall_median": statistics.median(r["wall"] for r in good) if good else None,
            "cpu_median": statistics.median(r["cpu"] for r in good) if good else None,
            "max_rss_kib": max(r["max_rss_kib"] for r in good) if good else None,
            "ok_runs": len(good),
            "runs": len(rs),
        }
    return {"path": rel(layer), "entries": len(expected), "runs": runs, "summary": summary}


def table(summary: dict[str, Any]) -> str:
    ref = summary.get("restic", {})
    rows = []
    for name, s in summary.items():
        wall, cpu, rss = s["wall_median"], s["cpu_median"], s["max_rss_kib"]
        rows.append(
            [
                name,
                f"{wall:.2f}" if wall is not None else "FAILED",
                f"{cpu:.2f}" if cpu is not None else "-",
                f"{rss / 1024:.0f}" if rss is not None else "-",
                f"{s['ok_runs']}/{s['runs']}",
                ratio(wall, ref.get("wall_median")),
                ratio(cpu, ref.get("cpu_median")),
            ]
        )
    heads = [
        "tool",
        "wall s",
        "CPU s",
        "peak RSS MiB",
        "verified",
        "time vs restic",
        "CPU vs restic",
    ]
    return markdown_table(heads, rows, "lrrrrrr")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="small,medium")
    p.add_argument(  # as the other benchmarks: $BENCH_DATA, else benchmarks/.data/bench-data
        "--data", default=os.environ.get("BENCH_DATA", os.path.join(HERE, ".data", "bench-data"))
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tools", default="sprite-env,sprite-env-daemon,restic,borg")
    p.add_argument("--baseline", help="also run sprite-env's export as of this git revision")
    p.add_argument("--no-verify", action="store_true", help="skip the tree oracle")
    p.add_argument("--work", default=os.path.join(HERE, ".data", "scratch-restore"))
    p.add_argument("--out")
    args = p.parse_args()
    if not drop_caches():
        log("WARNING: not root: the runs are not cold")
    rmtree(args.work)
    os.makedirs(args.work)
    head_src = os.path.join(args.work, "src-head")
    versions = {"sprite-env": freeze_whole("HEAD", head_src)}
    tools: list[Tool] = []
    offline: SpriteExport | None = None
    for name in args.tools.split(","):
        if name == "sprite-env":
            offline = SpriteExport("sprite-env", args.work, head_src)
            tools.append(offline)
        elif name == "sprite-env-daemon":
            if offline is None:
                raise SystemExit("sprite-env-daemon needs sprite-env before it in --tools")
            tools.append(DaemonExport(name, args.work, head_src, offline))
        elif name == "restic":
            tools.append(ResticRestore(args.work))
        elif name == "borg":
            tools.append(BorgExtract(args.work))
        else:
            raise SystemExit(f"unknown tool {name}")
    if args.baseline:
        base_src = os.path.join(args.work, "src-base")
        base = freeze_whole(args.baseline, base_src)
        label = f"sprite-env@{base}"
        versions[label] = base
        tools.insert(1, SpriteExport(label, args.work, base_src))
    results: dict[str, Any] = {"versions": versions, "reps": args.reps, "layers": {}}
    try:
        for layer_name in args.layers.split(","):
            layer = os.path.join(args.data, layer_name)
            if not os.path.isdir(layer):
                raise SystemExit(
                    f"no layer at {layer}: bash ../shared/bench/make_dataset.sh {layer} "
                    f"{layer_name}"
                )
            res = run_layer(tools, layer, args.reps, args.work, not args.no_verify)
            results["layers"][layer_name] = res
            print(f"\n### full restore, cold: {layer_name} ({args.reps} rounds, medians)\n")
            print(table(res["summary"]))
            sys.stdout.flush()
    finally:
        for t in tools:
            with contextlib.suppress(Exception):
                t.wipe()
    out = write_results("restore", results, args.out)
    print(f"\nJSON: {os.path.relpath(out, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
