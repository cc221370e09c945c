"""Shared helpers for benchmarks that time sprite-env side by side with peer tools.

Every tool is run as a child process and measured the same way: wall time around
``subprocess.run``, CPU time as the ``RUSAGE_CHILDREN`` delta (user + sys of the child
and every descendant it waited for: both ends of a shell pipeline, xargs' children).
Tools are alternated within each round (ABC ABC ABC) so that noise on a shared VM hits
all of them alike; before each timed run the page cache is dropped (when root) so every
tool starts cold (and dirty pages are always written back first, warm or cold).

Typical use::

    tools = [Tool("a", lambda: ["cmd", ...], prepare=..., output_bytes=...), ...]
    samples = run_rounds(tools, reps=3, cold=True)
    rows = [summarize(t.name, samples[t.name], nbytes) for t in tools]
    print(markdown_table(HEADERS, [r.cells() for r in rows]))
    write_results("ingest", payload)
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# -- measuring ----------------------------------------------------------------------------


#: The repository (this file's parent's parent): results name paths relative to it.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rel(path: str) -> str:
    """A path as the results record it: relative to the repository, or under
    ``$BENCH_DATA`` when elsewhere (never one machine's absolute path)."""
    r = os.path.relpath(path, _REPO)
    return os.path.join("$BENCH_DATA", os.path.basename(path)) if r.startswith("..") else r


def drop_caches() -> bool:
    """Writes back dirty pages and drops the page cache; False unless running as root."""
    if os.geteuid() != 0:
        return False
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


@dataclass
class Sample:
    """One timed run of one tool."""

    wall: float  # seconds
    user: float  # CPU seconds, children (see module docstring)
    sys: float
    output_bytes: int | None = None  # what the tool left on disk, if it writes anything
    extra: dict[str, Any] = field(default_factory=dict)  # tool-specific, e.g. its stdout

    @property
    def cpu(self) -> float:
        return self.user + self.sys


def run_timed(argv: Sequence[str], *, env: dict[str, str] | None = None) -> tuple[Sample, str]:
    """Runs ``argv`` to completion; returns its timing and its stdout (stderr passes through).

    Raises:
        subprocess.CalledProcessError: the command failed.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, env=env, check=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    sample = Sample(wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime)
    return sample, proc.stdout


def shell(script: str) -> list[str]:
    """An argv running ``script`` under bash with ``pipefail`` (any failing stage fails it)."""
    return ["bash", "-c", "set -euo pipefail\n" + script]


@dataclass
class Tool:
    """A tool to time.

    Attributes:
        name: its label in the table.
        argv: builds the command line (called before each run, after ``prepare``).
        prepare: untimed, before the cache drop: e.g. delete the previous output.
        output_bytes: untimed, after the run: bytes the run left on disk (None: no output).
        parse: untimed, after the run: extra facts from the tool's stdout.
    """

    name: str
    argv: Callable[[], list[str]]
    prepare: Callable[[], None] | None = None
    output_bytes: Callable[[], int | None] | None = None
    parse: Callable[[str], dict[str, Any]] | None = None


def run_rounds(
    tools: Sequence[Tool], reps: int, *, cold: bool, log: Callable[[str], None] | None = None
) -> dict[str, list[Sample]]:
    """Runs every tool ``reps`` times, alternating them within each round.

    Args:
        tools: what to run, in round order.
        reps: rounds.
        cold: drop the page cache before each timed run (needs root; else warns once).
        log: called with a one-line summary of each run.
    """
    samples: dict[str, list[Sample]] = {t.name: [] for t in tools}
    warned = False
    for rnd in range(reps):
        for tool in tools:
            if tool.prepare is not None:
                tool.prepare()
            os.sync()  # so that one tool's pending writeback does not land on the next
            if cold and not drop_caches() and not warned:
                print(
                    "warning: cannot drop the page cache (not root): runs are warm", file=sys.stderr
                )
                warned = True
            sample, out = run_timed(tool.argv())
            if tool.output_bytes is not None:
                sample.output_bytes = tool.output_bytes()
            if tool.parse is not None:
                sample.extra = tool.parse(out)
            samples[tool.name].append(sample)
            if log is not None:
                log(
                    f"round {rnd + 1}/{reps}  {tool.name:<28} {sample.wall:8.2f} s wall"
                    f"  {sample.cpu:8.2f} s CPU"
                )
    return samples


def tree_bytes(path: str) -> int:
    """Sum of the sizes of the regular files under ``path`` (symlinks not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(root, name))
            if st.st_mode & 0o170000 == 0o100000:
                total += st.st_size
    return total


def path_bytes(path: str) -> int:
    """Bytes of a file, or of the regular files under a directory; 0 if missing."""
    if os.path.isdir(path):
        return tree_bytes(path)
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


# -- summarizing --------------------------------------------------------------------------


@dataclass
class Summary:
    """A tool's samples reduced to the figures the tables show."""

    name: str
    runs: int
    wall_median: float
    wall_min: float
    wall_max: float
    mb_per_s: float  # input bytes / median wall, 10**6 bytes per second
    cpu_median: float  # user + sys seconds
    output_bytes: int | None  # median over the runs (they should all agree)
    input_bytes: int

    @property
    def cores(self) -> float:
        """Average cores busy: CPU / wall."""
        return self.cpu_median / self.wall_median if self.wall_median else 0.0


def summarize(name: str, samples: Sequence[Sample], input_bytes: int) -> Summary:
    walls = [s.wall for s in samples]
    med = statistics.median(walls)
    outs = [s.output_bytes for s in samples if s.output_bytes is not None]
    return Summary(
        name=name,
        runs=len(samples),
        wall_median=med,
        wall_min=min(walls),
        wall_max=max(walls),
        mb_per_s=input_bytes / med / 1e6 if med else float("inf"),
        cpu_median=statistics.median(s.cpu for s in samples),
        output_bytes=int(statistics.median(outs)) if outs else None,
        input_bytes=input_bytes,
    )


def ratio(a: float | None, b: float | None) -> str:
    """``a / b`` as ``"0.42x"``; ``"-"`` when either is missing or ``b`` is zero."""
    if a is None or b is None or b == 0:
        return "-"
    r = a / b
    return f"{r:.2f}x" if r < 100 else f"{r:.0f}x"


def mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:,.1f}"


def summary_cells(s: Summary) -> list[str]:
    """Cells for ``SUMMARY_HEADERS``."""
    return [
        s.name,
        f"{s.wall_median:.2f}",
        f"{s.wall_min:.2f}-{s.wall_max:.2f}",
        f"{s.mb_per_s:,.1f}",
        f"{s.cpu_median:.2f}",
        f"{s.cores:.2f}",
        mb(s.output_bytes),
        ratio(s.output_bytes, s.input_bytes) if s.output_bytes is not None else "-",
    ]


SUMMARY_HEADERS = [
    "tool",
    "wall s (median)",
    "min-max",
    "MB/s",
    "CPU s",
    "cores",
    "output MB",
    "out/in",
]


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A GitHub-flavoured markdown table.

    Args:
        align: one letter per column, ``l`` or ``r``; default: the first column left, the
            others right. Pipes in cells are escaped.
    """
    align = align or "l" + "r" * (len(headers) - 1)
    table = [[c.replace("|", "\\|") for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        out = [
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(cells, widths, align, strict=True)
        ]
        return "| " + " | ".join(out) + " |"

    sep = ["-" * w if a == "l" else "-" * (w - 1) + ":" for w, a in zip(widths, align, strict=True)]
    return "\n".join([line(table[0]), "| " + " | ".join(sep) + " |", *map(line, table[1:])])


# -- recording ----------------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), ""
            )
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "root": os.geteuid() == 0,
        "loadavg_at_end": os.getloadavg(),  # other work on a shared VM skews everything
    }


def today() -> str:
    return datetime.date.today().isoformat()


def write_results(
    stem: str, payload: dict[str, Any], path: str | None = None, suffix: str = ""
) -> str:
    """Writes ``payload`` (plus date and machine) as JSON, atomically; returns the path.

    The default path is ``benchmarks/results/<stem>-<date><suffix>.json``.
    """
    if path is None:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        path = os.path.join(RESULTS_DIR, f"{stem}-{today()}{suffix}.json")
    doc = {"date": today(), "machine": machine_info(), **payload}
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, default=_jsonable)
        f.write("\n")
    os.replace(tmp, path)
    return path


def _jsonable(o: object) -> object:
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)  # type: ignore[call-overload]
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


# -- one command, its own rusage (peak RSS) -----------------------------------------------


#: GNU time: a command started from this (possibly large) Python process inherits its
#: resident set in ru_maxrss (Linux counts the pre-exec image), so peak RSS is taken from a
#: small intermediate process instead, ``/usr/bin/time -f %M``, when there is one.
GNU_TIME = "/usr/bin/time"


@dataclass
class Measured:
    """One run of one command: wall and CPU from ``os.wait4`` on that child alone.

    ``max_rss_kib`` is the peak resident set of the largest single process among the
    command and the descendants it waited for (Linux ``ru_maxrss``), not a sum over a
    pipeline. It comes from GNU time when ``rss_exact``; otherwise from ``wait4`` directly,
    which is an upper bound (at least this process's own resident set when it forked).
    """

    wall: float  # seconds
    user: float  # CPU seconds of the command and its waited-for descendants
    sys: float
    max_rss_kib: int
    rss_exact: bool
    returncode: int
    stdout: str
    stderr: str

    @property
    def cpu(self) -> float:
        return self.user + self.sys

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def run_measured(
    argv: Sequence[str], *, cwd: str | None = None, env: dict[str, str] | None = None
) -> Measured:
    """Runs ``argv`` to completion (stdin from /dev/null, output captured in temp files).

    Unlike :func:`run_timed` it does not raise on a non-zero exit: the caller decides.

    Raises:
        OSError: the command could not be started.
    """
    import tempfile

    use_time = os.access(GNU_TIME, os.X_OK)
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.NamedTemporaryFile("r", suffix=".rss") as rss,
    ):
        full = [GNU_TIME, "-q", "-o", rss.name, "-f", "%M", *argv] if use_time else list(argv)
        start = time.perf_counter()
        proc = subprocess.Popen(
            full, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
        )
        _pid, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait
        max_rss, exact = ru.ru_maxrss, False
        if use_time:
            lines = [ln for ln in rss.read().splitlines() if ln.strip()]
            if lines and lines[-1].strip().isdigit():
                max_rss, exact = int(lines[-1]), True
        out.seek(0)
        err.seek(0)
        return Measured(
            wall=wall,
            user=ru.ru_utime,
            sys=ru.ru_stime,
            max_rss_kib=max_rss,
            rss_exact=exact,
            returncode=proc.returncode,
            stdout=out.read().decode(errors="replace"),
            stderr=err.read().decode(errors="replace"),
        )


def du_bytes(path: str) -> int | None:
    """``du -sb PATH``: apparent bytes of everything under it; None if it is missing."""
    if not os.path.exists(path):
        return None
    out = subprocess.run(["du", "-sb", path], check=True, stdout=subprocess.PIPE, text=True)
    return int(out.stdout.split()[0])
