"""The first checkpoint, cold: sprite-env side by side with restic and borg (issue 12.2).

Usage::

    python benchmarks/bench_first.py [--layers small,medium] [--data DIR]
                                     [--reps 3] [--baseline REV] [--work DIR] [--out FILE]

Each layer is one of ``../shared/bench``'s (``make_dataset.sh DIR small|medium``), read in
place (every tool only reads it). Per round, the tools in turn (the first one rotates from
round to round): the repository (store) and its cache wiped and created empty (untimed),
``sync`` and ``echo 3 > /proc/sys/vm/drop_caches``, then one timed backup of the layer:

- sprite-env: ``sprite-env --root LAYER --store STORE checkpoints create`` (offline), run
  from a copy of ``sprite_env/`` as committed at HEAD (``git archive``) with the built
  extension of the working tree, so commits landing meanwhile are not measured half-way;
- ``sprite-env@REV`` (with ``--baseline REV``): the same from the package at REV (with the
  same extension: an older package simply does not call what it does not know), to show
  what a change bought in the same run;
- restic: ``restic backup`` (repository version 2, compression auto), borg: ``borg create
  --compression zstd,3``.

Wall and CPU (``wait4``) of every run, peak RSS, and ``du -sb`` of the repository after it.
Output: markdown on stdout, JSON in ``benchmarks/results/first-<date>.json`` (paths in it
relative to the repository).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from _peers import (  # noqa: E402
    drop_caches,
    du_bytes,
    markdown_table,
    ratio,
    rel,
    run_measured,
    write_results,
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rmtree(path: str) -> None:
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", path], check=True)


def freeze(rev: str, dest: str) -> str:
    """A copy of ``sprite_env/`` at ``rev`` plus the working tree's built extension."""
    os.makedirs(dest)
    archive = subprocess.run(
        ["git", "-C", REPO, "archive", rev, "sprite_env"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    for name in os.listdir(os.path.join(REPO, "sprite_env")):
        if name.endswith(".so"):
            src = os.path.join(REPO, "sprite_env", name)
            subprocess.run(["cp", "-p", src, os.path.join(dest, "sprite_env")], check=True)
    commit = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", rev], capture_output=True, text=True
    )
    return commit.stdout.strip()


class Tool:
    def __init__(self, name: str, work: str) -> None:
        self.name = name
        self.dir = os.path.join(work, name.replace("@", "-at-"))
        self.repo = os.path.join(self.dir, "repo")
        self.cache = os.path.join(self.dir, "cache")
        self.env = dict(os.environ)

    def init(self, layer: str) -> None:
        raise NotImplementedError

    def backup(self, layer: str) -> tuple[list[str], str | None]:
        raise NotImplementedError

    def wipe(self) -> None:
        rmtree(self.repo)
        rmtree(self.cache)

    def untimed(self, argv: list[str], cwd: str | None = None) -> None:
        p = subprocess.run(argv, cwd=cwd, env=self.env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {p.returncode}: {p.stderr[-400:]}")


class Sprite(Tool):
    def __init__(self, name: str, work: str, src: str) -> None:
        super().__init__(name, work)
        self.env["PYTHONPATH"] = src
        self.cmd = [sys.executable, "-P", "-m", "sprite_env"]

    def init(self, layer: str) -> None:
        self.untimed([*self.cmd, "--root", layer, "--store", self.repo, "store", "init"])

    def backup(self, layer: str) -> tuple[list[str], str | None]:
        base = [*self.cmd, "--root", layer, "--store", self.repo]
        return [*base, "checkpoints", "create", "--comment", "first", "--json"], None


class Restic(Tool):
    def __init__(self, work: str) -> None:
        super().__init__("restic", work)
        self.env.update(RESTIC_PASSWORD="bench", RESTIC_CACHE_DIR=self.cache)

    def init(self, layer: str) -> None:
        self.untimed(["restic", "init", "-q", "-r", self.repo])

    def backup(self, layer: str) -> tuple[list[str], str | None]:
        return ["restic", "-r", self.repo, "backup", "--quiet", "."], layer


class Borg(Tool):
    def __init__(self, work: str) -> None:
        super().__init__("borg", work)
        self.env.update(BORG_BASE_DIR=self.cache, BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK="yes")

    def init(self, layer: str) -> None:
        self.untimed(["borg", "init", "-e", "none", self.repo])

    def backup(self, layer: str) -> tuple[list[str], str | None]:
        return ["borg", "create", "--compression", "zstd,3", f"{self.repo}::first", "."], layer


def _load() -> float:
    return os.getloadavg()[0]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", default="small,medium")
    p.add_argument(  # as the other benchmarks: $BENCH_DATA, else benchmarks/.data/bench-data
        "--data", default=os.environ.get("BENCH_DATA", os.path.join(HERE, ".data", "bench-data"))
    )
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--baseline", help="also run sprite-env as of this git revision")
    p.add_argument("--tools", default="sprite-env,restic,borg")
    p.add_argument("--work", default=os.path.join(HERE, ".data", "scratch-first"))
    p.add_argument("--out")
    args = p.parse_args()
    if not drop_caches():
        log("WARNING: not root: the runs are not cold")
    rmtree(args.work)
    os.makedirs(args.work)
    tools: list[Tool] = []
    head = freeze("HEAD", os.path.join(args.work, "src-head"))
    versions = {"sprite-env": head}
    for name in args.tools.split(","):
        if name == "sprite-env":
            tools.append(Sprite("sprite-env", args.work, os.path.join(args.work, "src-head")))
        elif name == "restic":
            tools.append(Restic(args.work))
        elif name == "borg":
            tools.append(Borg(args.work))
        else:
            raise SystemExit(f"unknown tool {name}")
    if args.baseline:
        base = freeze(args.baseline, os.path.join(args.work, "src-base"))
        label = f"sprite-env@{base}"
        versions[label] = base
        tools.insert(1, Sprite(label, args.work, os.path.join(args.work, "src-base")))
    results: dict[str, Any] = {"versions": versions, "layers": {}}
    for layer_name in args.layers.split(","):
        layer = os.path.join(args.data, layer_name)
        if not os.path.isdir(layer):
            raise SystemExit(
                f"no layer at {layer}: bash ../shared/bench/make_dataset.sh {layer} {layer_name}"
            )
        runs: dict[str, list[dict[str, Any]]] = {t.name: [] for t in tools}
        for rep in range(args.reps):
            order = tools[rep % len(tools) :] + tools[: rep % len(tools)]
            for t in order:
                t.wipe()
                os.makedirs(t.dir, exist_ok=True)
                t.init(layer)
                drop_caches()
                load = _load()
                argv, cwd = t.backup(layer)
                m = run_measured(argv, cwd=cwd, env=t.env)
                size = du_bytes(t.repo)
                run = {
                    "wall": m.wall,
                    "user": m.user,
                    "sys": m.sys,
                    "max_rss_kib": m.max_rss_kib,
                    "store_bytes": size,
                    "load": load,
                    "ok": m.ok,
                }
                if not m.ok:
                    run["stderr"] = m.stderr[-500:]
                runs[t.name].append(run)
                log(f"{layer_name} {t.name} rep {rep}: {m.wall:.2f} s, load {load:.1f}, ok={m.ok}")
        summary = {}
        for name, rs in runs.items():
            good = [r for r in rs if r["ok"]]
            summary[name] = {
                "wall_median": statistics.median(r["wall"] for r in good) if good else None,
                "cpu_median": statistics.median(r["user"] + r["sys"] for r in good)
                if good
                else None,
                "store_bytes": good[-1]["store_bytes"] if good else None,
            }
        results["layers"][layer_name] = {"path": rel(layer), "runs": runs, "summary": summary}
        rows = []
        ref = summary.get("restic", {})
        for name, s in summary.items():
            rows.append(
                [
                    name,
                    f"{s['wall_median']:.2f}" if s["wall_median"] is not None else "FAILED",
                    f"{s['cpu_median']:.2f}" if s["cpu_median"] is not None else "-",
                    f"{(s['store_bytes'] or 0) / 1e6:.1f}",
                    ratio(s["wall_median"], ref.get("wall_median")),
                    ratio(s["store_bytes"], ref.get("store_bytes")),
                ]
            )
        print(f"\n### first checkpoint, cold: {layer_name} ({args.reps} rounds, medians)\n")
        heads = ["tool", "wall s", "CPU s", "store MB", "time vs restic", "store vs restic"]
        print(markdown_table(heads, rows, "lrrrrr"))
    for t in tools:
        t.wipe()
    out = write_results("first", results, args.out)
    print(f"\nJSON: {os.path.relpath(out, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
