"""Benchmark the compare and root-cause pipeline on large synthetic dumps (``make bench``).

Statistics mode: ``tools/bigdump.py`` writes a train (HF names) / rollout (vLLM names) pair of
msprobe ``dump.json`` files (~``--size-mb`` per side, bare NaN/Infinity tokens included), then
every stage runs in its own subprocess, ``--repeat`` times:

* ``json.load`` of each dump.json (the standard library; the baseline),
* ``orjson.loads`` of each dump.json when orjson is importable (it rejects the NaN/Infinity
  tokens, so it is expected to fail; the failure is reported),
* ``run_compare.py`` end to end,
* ``run_root_cause_analysis.py --reuse-outputs`` (triage only, on the compare outputs),
* ``run_root_cause_analysis.py`` end to end (compare + root cause).

``--ranks``/``--steps`` split each side into that many files (``bigdump.py`` layout); the pipeline
merges them as its input plan decides (by default: the ranks of a step as tensor-parallel
shards), and the memory ratio is then against the largest rank file. ``--sizes`` runs one such
set per size and adds a ``scale`` line per pipeline stage: how its time and peak memory grow
with the input (``make bench-ranks``: 8 ranks per side at 100, 200 and 400 MB per side).

Reference forward (``refmodel``, ``make bench-refmodel``): ``tools/refmodel_bench.py`` writes a
random bf16 Llama checkpoint of ``--refmodel-mb`` (default 300); the numpy forward of
dumpcompare.refmodel runs on ``--refmodel-tokens`` tokens; its peak memory over a baseline process
(imports and headers only) is set against the checkpoint's largest layer.

Wide module (``wide``): ``tools/widedump.py`` writes pairs whose one module returns 10k, 100k and
300k tensors (``--wide-leaves``); ``build_plan`` alone is timed on each, best of ``--repeat``
(and at least 5 s of) runs, and its time per leaf at the largest size is set against that at the smallest (planning
is linear when the two are close; issue 28).

Generation (``generation``): ``tools/gendump.py`` writes the RL shape of issue 23: the trainer's
one forward over prompt + response (``--gen-prompt`` + ``--gen-decode`` tokens) against vLLM's
prefill over the prompt and one decode call per response token in one msprobe step (the rotary
module shared by all layers under layer 0, construct.json naming each call's layer), the same
engine's single forward over all the tokens, and the model as a checkpoint whose forward the dumps
are. Runs are interleaved (one round of every command, ``--repeat`` rounds) and two ratio lines
printed: ``run_compare.py`` on the decode pair without ``--model`` against ``json.load`` of the same
two files (target 1.5x), and with ``--model``/``--token-ids`` against the same command on the
single-forward pair (target 1.2x); a third line gives what ``--model`` adds to each pair (the
reference forward and its per-call judging, without the cost of reading the larger dump). Each
model of ``--gen-models`` gets its pair and its lines: ``small`` (``--gen-layers``,
``--gen-hidden``, ``--gen-vocab``, float32) and ``qwen3-0.6b``, Qwen3-0.6B's shape (28 layers,
hidden 1024, MLP 3072, 16 heads x 64, 8 KV heads; vocab 32000, not its 151936) with a float32
checkpoint (a trainer's master weights), on which the 1.2x target is judged: a real model's
reference forward.

Many modules (``many``): ``tools/manydump.py`` writes a pair of ``--many-calls`` forward calls of an
80-layer model whose shapes alternate between calls, so that no call folds: ~1000 distinct entries
per call per side (issue 28, item 4). Interleaved with ``json.load`` of the same two files and with
``run_compare.py`` on a one-call, two-layer pair (the fixed cost of the interpreter and imports),
two ratio lines: time / ``json.load`` (target 2x) and peak memory over the tiny pair's / the larger
file (target 3x). Two floor lines put the targets beside what no change to the pipeline's own work
removes: ``json.dumps`` of the run's JSON outputs alone against ``json.load`` of the inputs, and
``json.load``'s own peak above the bare interpreter (also run) against the larger file.

Reference forward against transformers (``reftorch``, by name; ``make bench
BENCH_TORCH_PY=<python with torch>``): the numpy forward of dumpcompare.refmodel on a random 1B+
bf16 Llama (``--reftorch-mb``, default 2200 MB) over ``--reftorch-tokens`` tokens (default 1024)
against transformers' CPU forward of the same checkpoint (bf16, ``torch.set_num_threads`` = the
cores; numpy's BLAS takes the cores by itself), interleaved. Both run under ``--python``, which
must import torch and transformers (the stage is skipped otherwise), so one numpy and one machine
load serve both sides; the ratio line gives both medians, both CPU times, both peaks, the
checkpoint, the tokens and that interpreter (targets: time <= 1.5x, memory <= 1x transformers').

Tensor mode: ``python3 -m synth --task tensor`` writes a pair with ``.npy`` tensors; ``np.load``
of every tensor file is the baseline for ``run_compare.py`` and the full root-cause run.

Log-prob triage (``logprobs``): ``tools/logprob_bench.py`` writes 10^6 response tokens per side
as an RL-batch ``.npz`` and as the generic JSONL; ``triage_logprobs.py`` on each is set against
``np.load`` of every array and ``json.loads`` of every line of the same files (target 3x).

Per stage the bench prints the median wall time, the peak memory (the larger of the exact peak
RSS of any one process of the stage, from ``wait4``, and the sampled sum of the RSS of all its
processes), and the ratios of issue 6: pipeline time / baseline time (all files) and peak
memory / size of the largest dump file. A stage that passes ``--stage-timeout`` (default:
``--timeout-factor`` x its baseline) or ``--mem-limit-mb`` is stopped and reported as such.
Progress goes to stderr, the table and the ``ratio`` lines to stdout. Generated files are
removed at the end unless ``--keep``; a pair kept in ``--workdir`` by an earlier run with the
same parameters is reused.

    python3 tools/bench.py                      # ~1 GB per side, 80 layers, 3 repeats
    python3 tools/bench.py --quick              # ~50 MB per side, 1 repeat, small tensor pair
    python3 tools/bench.py --size-mb 200 --stages json,compare --profile --keep --workdir /tmp/b
    python3 tools/bench.py --ranks 8 --sizes 100,200,400 --stages json,compare   # make bench-ranks
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "tools" / "bench_launch.py"
BIGDUMP = ROOT / "tools" / "bigdump.py"
COMPARE = ROOT / "dump-module-mapping-value-compare" / "scripts" / "run_compare.py"
ROOTCAUSE = ROOT / "rl-consistency-analysis" / "scripts" / "run_root_cause_analysis.py"
TRIAGE_LOGPROBS = ROOT / "rl-consistency-analysis" / "scripts" / "triage_logprobs.py"
TESTS = ROOT / "tests"
STAGES = ("json", "orjson", "compare", "triage", "rootcause", "tensor", "logprobs", "wide", "generation", "many",
          "refmodel", "reftorch")
# Stages run when --stages is not given: the refmodel and reftorch stages write checkpoints of hundreds
# of MB (reftorch: over 2 GB) and are asked for by name (make bench runs refmodel after the others).
DEFAULT_STAGES = STAGES[:-2]
PAGE = os.sysconf("SC_PAGE_SIZE")
MB = 1e6

JSON_LOAD = "import json, sys\nwith open(sys.argv[1], 'rb') as f:\n    json.load(f)\n"
ORJSON_LOAD = "import orjson, sys\nwith open(sys.argv[1], 'rb') as f:\n    orjson.loads(f.read())\n"
NP_LOAD = ("import sys, numpy as np\nn = 0\nfor p in sys.argv[1:]:\n"
           "    a = np.load(p, allow_pickle=False)\n    n += a.nbytes\n    del a\nprint(n)\n")
# cProfile around a script; SIGTERM (the bench's timeout) still writes the partial profile.
PROFILE = r"""
import cProfile, runpy, signal, sys
out, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
def _stop(*_):
    raise KeyboardInterrupt
signal.signal(signal.SIGTERM, _stop)
prof = cProfile.Profile()
prof.enable()
try:
    runpy.run_path(script, run_name="__main__")
except (KeyboardInterrupt, SystemExit):
    pass
finally:
    prof.disable()
    prof.dump_stats(out)
"""


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- measuring


@dataclass
class Run:
    wall: float
    cpu: float             # user + system seconds of the process and its waited-for children
    rc: int | None
    maxrss: int            # bytes, exact high-water mark of the largest single process
    tree_peak: int         # bytes, sampled peak of the summed RSS of the process group
    stopped: str | None    # "timeout" / "memory limit" when the bench stopped it
    stdout: str
    stderr: str

    @property
    def peak(self) -> int:
        return max(self.maxrss, self.tree_peak)

    @property
    def ok(self) -> bool:
        return self.stopped is None and self.rc == 0


def _group_rss(pgid: int) -> int:
    """Summed RSS (bytes) of the processes in process group ``pgid``, but its leader (the
    launcher, bench_launch.py, not part of what is measured)."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and int(name) != pgid:
            total += int(fields[21]) * PAGE
    return total


def _killpg(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_measured(cmd: list[str], *, cwd=None, timeout=None, mem_limit=None, grace=10.0,
                 poll=0.2) -> Run:
    """Run ``cmd`` in its own process group; wall time, peak memory, optional limits.

    The command is started by tools/bench_launch.py, which reports the command's own CPU time and
    peak RSS: Linux carries a process's peak RSS over fork and exec, so a command forked straight
    from this process would report at least this process's own peak (the tables it holds)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(suffix=".json") as usage_file:
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-S", str(LAUNCHER), usage_file.name, *map(str, cmd)], cwd=cwd,
                                stdout=out, stderr=err, start_new_session=True)
        state = {"tree": 0, "stopped": None, "term_at": None}
        done = threading.Event()

        def watch():
            while not done.wait(poll):
                rss = _group_rss(proc.pid)
                state["tree"] = max(state["tree"], rss)
                now = time.perf_counter()
                if state["stopped"] is None:
                    if timeout is not None and now - t0 > timeout:
                        state["stopped"] = "timeout"
                    elif mem_limit is not None and rss > mem_limit:
                        state["stopped"] = "memory limit"
                    if state["stopped"]:
                        state["term_at"] = now
                        _killpg(proc.pid, signal.SIGTERM)
                elif now - state["term_at"] > grace:
                    _killpg(proc.pid, signal.SIGKILL)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        watcher.join()
        if state["stopped"]:
            _killpg(proc.pid, signal.SIGKILL)  # leftovers of the group, if any
        out.seek(0)
        err.seek(0)
        try:
            own = json.loads(Path(usage_file.name).read_text() or "null")
        except (OSError, ValueError):
            own = None
        # A run stopped by a limit kills the launcher too: the launcher's figures are then the
        # upper bound (its own few MB and CPU included).
        cpu, maxrss = ((own["cpu"], own["maxrss"]) if own else
                       (usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024))
        return Run(wall=wall, cpu=cpu, rc=proc.returncode,
                   maxrss=maxrss,
                   tree_peak=state["tree"], stopped=state["stopped"],
                   stdout=out.read().decode(errors="replace"),
                   stderr=err.read().decode(errors="replace"))


@dataclass
class Stage:
    name: str
    runs: list[Run] = field(default_factory=list)
    note: str = ""
    skipped: str = ""       # why the stage did not run at all
    timeout: float | None = None

    @property
    def ok_runs(self) -> list[Run]:
        return [r for r in self.runs if r.ok]

    @property
    def failed(self) -> Run | None:
        return next((r for r in self.runs if not r.ok), None)

    @property
    def median(self) -> float | None:
        ok = self.ok_runs
        return statistics.median(r.wall for r in ok) if ok and not self.failed else None

    @property
    def cpu_median(self) -> float | None:
        ok = self.ok_runs
        return statistics.median(r.cpu for r in ok) if ok and not self.failed else None

    @property
    def peak(self) -> int | None:
        return max((r.peak for r in self.runs), default=None)

    def status(self) -> str:
        if self.skipped:
            return self.skipped
        bad = self.failed
        if bad is None:
            return "ok"
        if bad.stopped == "timeout":
            return f"TIMEOUT after {bad.wall:.0f} s"
        if bad.stopped:
            return f"STOPPED at {bad.peak / MB:.0f} MB ({bad.stopped})"
        tail = [ln for ln in bad.stderr.strip().splitlines() if ln.strip()]
        return f"FAILED rc={bad.rc}: {tail[-1][:160] if tail else ''}"


def run_stage(name: str, cmd: list[str], repeat: int, *, cwd=None, timeout=None,
              mem_limit=None) -> Stage:
    st = Stage(name, timeout=timeout)
    for i in range(repeat):
        log(f"{name}: run {i + 1}/{repeat}"
            + (f" (timeout {timeout:.0f} s)" if timeout else ""))
        r = run_measured(cmd, cwd=cwd, timeout=timeout, mem_limit=mem_limit)
        st.runs.append(r)
        log(f"{name}: {r.wall:.2f} s (cpu {r.cpu:.2f} s), peak {r.peak / MB:.0f} MB, "
            + ("ok" if r.ok else st.status()))
        if not r.ok:
            break
    return st


# --------------------------------------------------------------------------- generating


def _params(args, layers: int, size_mb: float) -> dict:
    return {"size_mb": size_mb, "layers": layers, "steps": args.steps, "ranks": args.ranks,
            "faults": args.faults, "variants": args.variants, "seed": args.seed,
            "bigdump_mtime": BIGDUMP.stat().st_mtime}


def make_statistics_pair(args, pair: Path, size_mb: float) -> tuple[dict, bool]:
    """Generate (or reuse) the statistics pair in ``pair``; returns (bigdump summary, reused)."""
    manifest = pair / "manifest.json"
    params = _params(args, args.layers, size_mb)
    if manifest.is_file():
        try:
            old = json.loads(manifest.read_text())
        except ValueError:
            old = {}
        if old.get("params") == params and all(Path(f["path"]).is_file()
                                               for f in old["summary"]["files"]):
            log(f"reusing the statistics pair in {pair}")
            return old["summary"], True
    if pair.exists():
        shutil.rmtree(pair)
    cmd = [args.python, str(BIGDUMP), "--out", str(pair), "--size-mb", str(size_mb),
           "--layers", str(args.layers), "--steps", str(args.steps), "--ranks", str(args.ranks),
           "--variants", str(args.variants), "--seed", str(args.seed)]
    for f in args.faults:
        cmd += ["--fault", f]
    log("generating the statistics pair: " + " ".join(cmd[1:]))
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: bigdump failed:\n{proc.stderr}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    log(f"generated {sum(summary['side_bytes'].values()) / MB:.0f} MB in "
        f"{time.perf_counter() - t0:.1f} s")
    manifest.write_text(json.dumps({"params": params, "summary": summary}))
    return summary, False


def make_tensor_pair(args, work: Path) -> Path:
    out = work / "tensor_pair"
    if out.exists():
        shutil.rmtree(out)
    h = args.tensor_hidden
    heads = max(1, h // 64)
    cmd = [args.python, "-m", "synth", "--out", str(out), "--task", "tensor",
           "--layers", str(args.tensor_layers), "--hidden", str(h),
           "--intermediate", str(args.tensor_intermediate or (h * 11) // 4),
           "--heads", str(heads), "--kv-heads", str(max(1, heads // 4)),
           "--head-dim", str(h // heads), "--seq-len", str(args.tensor_seq_len),
           "--vocab", str(args.tensor_vocab), "--seed", str(args.seed)]
    for f in args.tensor_faults:
        cmd += ["--fault", f]
    log("generating the tensor pair: " + " ".join(cmd[2:]))
    proc = subprocess.run(cmd, cwd=TESTS, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: synth (tensor) failed:\n{proc.stderr}")
    return out


# --------------------------------------------------------------------------- reporting


def _mb(n) -> str:
    return f"{n / MB:.1f}" if n < 10 * MB else f"{n / MB:.0f}"


def _fmt_s(x):
    return "-" if x is None else f"{x:.2f}"


def _ratio(a, b):
    return None if a is None or not b else a / b


def _fmt_ratio(x, lower_bound=False):
    if x is None:
        return "-"
    return (">" if lower_bound else "") + f"{x:.2f}x"


def _verdict(out_dir: Path) -> str:
    try:
        doc = json.loads((out_dir / "output_5_root_cause_report.json").read_text())
    except (OSError, ValueError):
        return "-"
    causes = doc.get("root_causes") or []
    top = causes[0] if causes else {}
    where = top.get("train_module") or top.get("rollout_module") or ""
    if isinstance(where, list):
        where = ", ".join(where)
    return doc.get("verdict", "?") + (f" ({top.get('category', '')} at {where})" if top else "")


def _time_ratio(stage: Stage | None, base: float | None):
    """(ratio, is_lower_bound) of a stage's median time to the baseline."""
    if stage is None or base is None or stage.skipped:
        return None, False
    if stage.median is not None:
        return stage.median / base, False
    bad = stage.failed
    if bad is not None and bad.stopped:
        return bad.wall / base, True
    return None, False


def _cpu_ratio(stage: Stage | None, base: float | None):
    if stage is None or not base or stage.skipped or not stage.runs:
        return None, False
    if stage.cpu_median is not None:
        return stage.cpu_median / base, False
    bad = stage.failed
    return (bad.cpu / base, True) if bad is not None and bad.stopped else (None, False)


def _ratio_parts(stage: Stage, base_time: float | None, base_cpu: float | None) -> dict:
    """What every ratio line shows: time and CPU ratios to the baseline, peak MB, a status tag."""
    peak = stage.peak
    return {"time": _fmt_ratio(*_time_ratio(stage, base_time)),
            "cpu": _fmt_ratio(*_cpu_ratio(stage, base_cpu)),
            "peak_mb": "-" if peak is None else f"{peak / MB:.0f}",
            "tag": "" if stage.failed is None and not stage.skipped else f" [{stage.status()}]"}


def print_report(rows, ratio_lines, info_lines) -> None:
    head = ("stage", "runs", "median s", "min s", "max s", "cpu s", "peak MB", "time ratio",
            "peak ratio", "status")
    table = [head]
    for r in rows:
        table.append(tuple(str(c) for c in r))
    widths = [max(len(row[i]) for row in table) for i in range(len(head) - 1)]
    print()
    for i, row in enumerate(table):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:-1], widths[1:])]
        print("  ".join(cells) + "  " + row[-1])
        if i == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * 6)
    print()
    for line in info_lines:
        print(line)
    for line in ratio_lines:
        print(line)


def stage_row(stage: Stage, base_time=None, base_mem=None):
    if stage.skipped:
        return (stage.name, 0, "-", "-", "-", "-", "-", "-", "-", stage.skipped)
    walls = [r.wall for r in stage.ok_runs]
    tr, lb = _time_ratio(stage, base_time)
    peak = stage.peak
    return (stage.name, len(stage.runs), _fmt_s(stage.median),
            _fmt_s(min(walls) if walls else None), _fmt_s(max(walls) if walls else None),
            _fmt_s(stage.cpu_median if stage.cpu_median is not None
                   else (stage.runs[-1].cpu if stage.runs else None)),
            "-" if peak is None else f"{peak / MB:.0f}", _fmt_ratio(tr, lb),
            _fmt_ratio(_ratio(peak, base_mem), stage.failed is not None and
                       stage.failed.stopped == "memory limit"),
            stage.status())


_WRAPPER_FRAMES = ("<frozen runpy>", "{built-in method builtins.exec}", "run_compare.py:1(<module>)",
                   "{method 'disable' of '_lsprof.Profiler' objects}")


def print_profile(prof: Path, top: int) -> None:
    """Top functions of a cProfile file, without the runpy/exec wrapper frames."""
    import io
    import pstats
    for key in ("cumulative", "tottime"):
        buf = io.StringIO()
        stats = pstats.Stats(str(prof), stream=buf)
        total = stats.total_tt
        stats.sort_stats(key).print_stats(top + 8)
        lines = buf.getvalue().replace(str(ROOT) + os.sep, "").splitlines()
        start = next((i for i, ln in enumerate(lines) if ln.strip().startswith("ncalls")), 0)
        body = [ln for ln in lines[start + 1:]
                if ln.strip() and not any(w in ln for w in _WRAPPER_FRAMES)][:top]
        print(f"\n== cProfile of run_compare.py: top {top} by {key} "
              f"(profiled total {total:.1f} s) ==")
        print(lines[start])
        print("\n".join(body))


def run_statistics(args, work: Path, size_mb: float, stages: set, mem_limit: int, created: list,
                   results: dict, rows: list, ratio_lines: list, info_lines: list) -> None:
    """Generate (or reuse) one statistics set and run its stages; appends to the report lists."""
    py = args.python
    single = len(args.sizes) == 1
    pair = work / ("stats_pair" if single else f"stats_pair_{size_mb:g}mb")
    # A set other than one file per side is named in every line it adds.
    tag = "" if single and args.ranks * args.steps == 1 else \
        f" [{args.steps * args.ranks} file(s) x {size_mb:g} MB per side]"
    summary, reused = make_statistics_pair(args, pair, size_mb)
    if not reused:
        created.append(pair)
    files = [Path(f["path"]) for f in summary["files"]]
    sizes = {str(f["path"]): f["bytes"] for f in summary["files"]}
    larger = summary["largest_file_bytes"]
    per_side = len(files) // 2
    what = "larger file" if per_side == 1 else "largest rank file"
    info_lines.append(
        f"statistics pair{tag}: {len(files)} dump.json ({args.steps} step(s) x {args.ranks} rank(s) "
        f"per side), train {_mb(summary['side_bytes']['train'])} MB, rollout {_mb(summary['side_bytes']['rollout'])} MB, {what} {_mb(larger)} MB, "
        f"{summary['calls']} calls x {summary['entries_per_call']['train']}/"
        f"{summary['entries_per_call']['rollout']} entries (train/rollout), "
        f"{args.layers} layers, faults: {', '.join(args.faults) or 'none'}")
    base_time = base_cpu = None
    if "json" in stages:
        per_file = []
        for f in files:
            side = "train" if f"{os.sep}train{os.sep}" in str(f) else "rollout"
            rel = f.relative_to(pair)
            st = run_stage(f"json.load {rel}{tag}", [py, "-c", JSON_LOAD, str(f)], args.repeat,
                           mem_limit=mem_limit)
            st.note = side
            per_file.append(st)
            if per_side <= 2:  # more files are summed up in the row below only
                rows.append(stage_row(st, None, sizes[str(f)]))
            results["stages"][st.name] = _stage_json(st)
        if all(s.median is not None for s in per_file):
            base_time = sum(s.median for s in per_file)
            peak = max(s.peak for s in per_file)
            cpu = base_cpu = sum(s.cpu_median for s in per_file)
            rows.append((f"json.load all files (sum of medians){tag}", "-", _fmt_s(base_time),
                         "-", "-", _fmt_s(cpu), f"{peak / MB:.0f}", "1.00x",
                         _fmt_ratio(peak / larger), "baseline"))
            results["json_load_total_s" + tag] = base_time
    if "orjson" in stages:
        chk = subprocess.run([py, "-c", "import orjson"], capture_output=True)
        if chk.returncode != 0:
            st = Stage("orjson.loads (each file)", skipped="not installed")
            rows.append(stage_row(st))
            info_lines.append("orjson: not installed for " + py
                              + " (it would reject the NaN/Infinity tokens anyway)")
        else:
            for f in files:
                rel = f.relative_to(pair)
                st = run_stage(f"orjson.loads {rel}", [py, "-c", ORJSON_LOAD, str(f)], 1,
                               mem_limit=mem_limit)
                rows.append(stage_row(st, None, sizes[str(f)]))
                results["stages"][st.name] = _stage_json(st)
                info_lines.append(f"orjson on {rel}: "
                                  + ("parsed" if st.failed is None else
                                     "rejected the file: " + st.status()))
    timeout = args.stage_timeout
    if timeout is None:
        timeout = max(120.0, args.timeout_factor * (base_time or 0.0))
    extra = list(args.pipeline_arg)
    train, rollout = summary["train"], summary["rollout"]
    out_cmp = work / ("out_compare" if single else f"out_compare_{size_mb:g}mb")
    out_full = work / ("out_rootcause" if single else f"out_rootcause_{size_mb:g}mb")
    created += [out_cmp, out_full]
    compare_ok = False
    pipeline = {}
    if "compare" in stages or "triage" in stages:
        cmd = [py, str(COMPARE), "--train", train, "--rollout", rollout,
               "--out-dir", str(out_cmp), "--quiet", *extra]
        st = run_stage("compare (run_compare.py)" + tag, cmd,
                       args.repeat if "compare" in stages else 1,
                       timeout=timeout, mem_limit=mem_limit)
        compare_ok = st.failed is None
        pipeline["compare"] = st
        rows.append(stage_row(st, base_time, larger))
        results["stages"][st.name] = _stage_json(st)
    if "triage" in stages:
        if compare_ok:
            cmd = [py, str(ROOTCAUSE), "--train", train, "--rollout", rollout,
                   "--out-dir", str(out_cmp), "--reuse-outputs", "--quiet", *extra]
            st = run_stage("root cause --reuse-outputs (triage)" + tag, cmd, args.repeat,
                           timeout=timeout, mem_limit=mem_limit)
        else:
            st = Stage("root cause --reuse-outputs (triage)" + tag,
                       skipped="skipped: no compare outputs")
        pipeline["triage"] = st
        rows.append(stage_row(st, base_time, larger))
        results["stages"][st.name] = _stage_json(st)
        if compare_ok:
            info_lines.append(f"verdict (triage on the compare outputs): {_verdict(out_cmp)}")
    if "rootcause" in stages:
        cmd = [py, str(ROOTCAUSE), "--train", train, "--rollout", rollout,
               "--out-dir", str(out_full), "--quiet", *extra]
        st = run_stage("root cause full (compare + triage)" + tag, cmd, args.repeat,
                       timeout=timeout, mem_limit=mem_limit)
        pipeline["rootcause"] = st
        rows.append(stage_row(st, base_time, larger))
        results["stages"][st.name] = _stage_json(st)
        if st.failed is None:
            info_lines.append(f"verdict (full run): {_verdict(out_full)}")
    if pipeline:
        info_lines.append(f"pipeline stage timeout: {timeout:.0f} s, memory limit "
                          f"{mem_limit / MB:.0f} MB")
    for key, label in (("compare", "compare"),
                       ("triage", "root cause triage (--reuse-outputs)"),
                       ("rootcause", "end to end (compare + root cause)")):
        st = pipeline.get(key)
        if st is None:
            continue
        r = _ratio_parts(st, base_time, base_cpu)
        ratio_lines.append(
            f"ratio statistics {label}{tag}: time / json.load({'both' if per_side == 1 else 'all'} files) = "
            f"{r['time']} (target <= 1.5x), cpu time ratio {r['cpu']}; peak memory / {what} = "
            f"{_fmt_ratio(_ratio(st.peak, larger))} (target <= 1.5x); "
            f"median {_fmt_s(st.median)} s, peak {r['peak_mb']} MB{r['tag']}")
        results.setdefault("sets", []).append(
            {"stage": key, "size_mb": size_mb, "files": len(files), "side_bytes": summary["side_bytes"],
             "largest_file_bytes": larger, "json_load_s": base_time, "median_s": st.median,
             "peak_bytes": st.peak})
    results["ratio_lines"] = list(ratio_lines)

    if args.profile:
        prof = work / ("compare.prof" if single else f"compare_{size_mb:g}mb.prof")
        created.append(prof)
        out_prof = work / "out_profile"
        created.append(out_prof)
        cmd = [py, "-c", PROFILE, str(prof), str(COMPARE), "--train", train,
               "--rollout", rollout, "--out-dir", str(out_prof), "--quiet", *extra]
        log("profiling run_compare.py under cProfile")
        r = run_measured(cmd, timeout=timeout, mem_limit=mem_limit, grace=120.0)
        log(f"profile run: {r.wall:.1f} s" + (f" ({r.stopped}, partial profile)"
                                               if r.stopped else ""))
        results["profile"] = {"wall": r.wall, "stopped": r.stopped, "rc": r.rc}
        if prof.is_file():
            results["profile_file"] = str(prof)
            args._profile_path = prof
            args._profile_note = (f"profiled run: {r.wall:.1f} s wall"
                                  + (f", stopped by {r.stopped}: partial profile"
                                     if r.stopped else ""))
        else:
            info_lines.append("profile: no profile written "
                              f"(rc={r.rc}, {r.stopped or 'exited'})")


def scale_lines(sets: list[dict]) -> list[str]:
    """Per pipeline stage, how its time and peak memory grow over the statistics sets, against
    the growth of the input (the sum of both sides' bytes) from the smallest set."""
    lines = []
    for key in dict.fromkeys(s["stage"] for s in sets):
        runs = sorted((s for s in sets if s["stage"] == key),
                      key=lambda s: sum(s["side_bytes"].values()))
        if len(runs) < 2:
            continue
        first = runs[0]

        def grow(s, k):
            return "-" if s[k] is None or not first[k] else f"x{s[k] / first[k]:.2f}"
        cells = []
        for s in runs:
            size = sum(s["side_bytes"].values()) / sum(first["side_bytes"].values())
            peak = "-" if s["peak_bytes"] is None else \
                f"{s['peak_bytes'] / MB:.0f} MB ({grow(s, 'peak_bytes')}), " \
                f"{s['peak_bytes'] / s['largest_file_bytes']:.2f}x the largest file"
            cells.append(f"{s['size_mb']:g} MB/side (input x{size:.2f}): {_fmt_s(s['median_s'])} s "
                         f"({grow(s, 'median_s')}), peak {peak}")
        lines.append(f"scale statistics {key} ({first['files']} files per set): " + "; ".join(cells))
    return lines


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description="Time the compare / root-cause pipeline on large synthetic msprobe dumps "
                    "against json.load and np.load baselines (issue 6).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Stages: " + ", ".join(STAGES) + ". Ratios: pipeline median time / baseline "
               "median time of all files; peak memory / size of the largest dump.json.")
    ap.add_argument("--size-mb", type=float, default=None,
                    help="statistics dump size per side in MB (default 1024; 50 with --quick)")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated sizes per side in MB: one statistics set per size, "
                         "with a line showing how time and memory grow (overrides --size-mb); "
                         "make bench-ranks uses --ranks 8 --sizes 100,200,400")
    ap.add_argument("--layers", type=int, default=80, help="decoder layers (default 80)")
    ap.add_argument("--steps", type=int, default=1, help="step folders per side (default 1)")
    ap.add_argument("--ranks", type=int, default=1, help="rank folders per step (default 1)")
    ap.add_argument("--fault", action="append", default=None,
                    help="synth fault (repeatable); default corrupt:rollout:gate:<layers/2>, "
                         "'none' for a clean pair")
    ap.add_argument("--variants", type=int, default=16, help="bigdump value sets (default 16)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs per timed stage (default 3; 1 with --quick)")
    ap.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                    help="comma-separated subset of: " + ", ".join(STAGES) + " (default: all but refmodel)")
    ap.add_argument("--quick", action="store_true",
                    help="small run: ~50 MB per side, 1 repeat, small tensor pair")
    ap.add_argument("--keep", action="store_true", help="keep generated dumps and outputs")
    ap.add_argument("--workdir", default=None,
                    help="folder for dumps and outputs (default: a new temporary folder); "
                         "a pair kept there with the same parameters is reused")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for the stages (default: this one)")
    ap.add_argument("--pipeline-arg", action="append", default=[],
                    help="extra argument for run_compare.py / run_root_cause_analysis.py "
                         "(repeatable), e.g. --pipeline-arg=--train-step=0")
    ap.add_argument("--timeout-factor", type=float, default=10.0,
                    help="stop a pipeline stage after this many times its baseline "
                         "(default 10; at least 120 s)")
    ap.add_argument("--stage-timeout", type=float, default=None,
                    help="fixed timeout in seconds for every pipeline stage (overrides "
                         "--timeout-factor)")
    ap.add_argument("--mem-limit-mb", type=float, default=None,
                    help="stop a stage whose processes together exceed this RSS "
                         "(default 75%% of physical memory)")
    ap.add_argument("--profile", action="store_true",
                    help="also run run_compare.py once under cProfile (within the timeout) "
                         "and print the top functions")
    ap.add_argument("--profile-top", type=int, default=15)
    ap.add_argument("--tensor-hidden", type=int, default=None,
                    help="hidden size of the tensor pair (default 1024; 128 with --quick)")
    ap.add_argument("--tensor-layers", type=int, default=None,
                    help="layers of the tensor pair (default 2; 2 with --quick)")
    ap.add_argument("--tensor-intermediate", type=int, default=None,
                    help="default 2.75 x hidden")
    ap.add_argument("--tensor-seq-len", type=int, default=None,
                    help="tokens of the tensor pair (default 1024; 16 with --quick)")
    ap.add_argument("--tensor-vocab", type=int, default=None,
                    help="vocabulary of the tensor pair (default 65536: ~2.3 GB of tensors, 268 MB logits per side; 256 with --quick)")
    ap.add_argument("--refmodel-mb", type=float, default=300.0,
                    help="size of the random Llama checkpoint of the refmodel stage (default 300)")
    ap.add_argument("--refmodel-tokens", type=int, default=64, help="tokens of the refmodel forward (default 64)")
    ap.add_argument("--refmodel-dtype", choices=("fp32", "bf16"), default="bf16")
    ap.add_argument("--logprob-tokens", type=int, default=None,
                    help="response tokens per side of the log-prob triage stage (default 10^6; 10^5 with --quick)")
    ap.add_argument("--wide-leaves", default=None,
                    help="comma-separated output counts of the wide stage's one module "
                         "(default 10000,100000,300000; 2000,10000 with --quick)")
    ap.add_argument("--gen-prompt", type=int, default=32, help="prompt tokens of the generation stage (default 32)")
    ap.add_argument("--gen-decode", type=int, default=None,
                    help="decode calls of the generation stage (default 256; 32 with --quick)")
    ap.add_argument("--gen-layers", type=int, default=None,
                    help="decoder layers of the generation model (default 28, a real model's depth, so that the "
                         "interpreter's fixed start-up is not most of what is timed; 4 with --quick)")
    ap.add_argument("--gen-hidden", type=int, default=256, help="hidden size of the generation model (default 256)")
    ap.add_argument("--gen-vocab", type=int, default=1024, help="vocabulary of the generation model (default 1024)")
    ap.add_argument("--gen-models", default=None,
                    help="comma-separated models of the generation stage: small (the --gen-* sizes above) and "
                         "qwen3-0.6b (default both; small with --quick)")
    ap.add_argument("--many-calls", type=int, default=None,
                    help="unfoldable forward calls of the many stage's 80-layer pair (default 40: ~40k modules "
                         "per side; 4 with --quick)")
    ap.add_argument("--reftorch-mb", type=float, default=2200.0,
                    help="size of the random bf16 Llama of the reftorch stage (default 2200: 1.1B parameters)")
    ap.add_argument("--reftorch-tokens", type=int, default=1024, help="tokens of the reftorch forwards (default 1024)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = ap.parse_args(argv)

    q = args.quick
    args.size_mb = args.size_mb if args.size_mb is not None else (50.0 if q else 1024.0)
    args.repeat = args.repeat if args.repeat is not None else (1 if q else 3)
    args.tensor_hidden = args.tensor_hidden or (128 if q else 1024)
    args.tensor_layers = args.tensor_layers or 2
    args.tensor_seq_len = args.tensor_seq_len or (16 if q else 1024)
    args.tensor_vocab = args.tensor_vocab or (256 if q else 65536)
    args.logprob_tokens = args.logprob_tokens or (100_000 if q else 1_000_000)
    args.gen_decode = args.gen_decode or (32 if q else 256)
    args.gen_layers = args.gen_layers or (4 if q else 28)
    args.gen_models = [m.strip() for m in (args.gen_models or ("small" if q else "small,qwen3-0.6b")).split(",")
                       if m.strip()]
    if not args.gen_models or set(args.gen_models) - set(GEN_MODELS):
        ap.error(f"--gen-models: choose among {', '.join(GEN_MODELS)}, got {args.gen_models}")
    args.many_calls = args.many_calls or (4 if q else 40)
    try:
        args.wide_leaves = [int(x) for x in (args.wide_leaves or ("2000,10000" if q else "10000,100000,300000"))
                            .split(",") if x.strip()]
    except ValueError:
        ap.error(f"--wide-leaves: not a comma-separated list of integers: {args.wide_leaves!r}")
    stages = {s.strip() for s in args.stages.split(",") if s.strip()}
    unknown = stages - set(STAGES)
    if unknown:
        ap.error(f"unknown stage(s): {', '.join(sorted(unknown))}")
    try:
        args.sizes = [float(x) for x in args.sizes.split(",") if x.strip()] if args.sizes else [args.size_mb]
    except ValueError:
        ap.error(f"--sizes: not a comma-separated list of numbers: {args.sizes!r}")
    if args.repeat < 1 or args.layers < 1 or not args.sizes or min(args.sizes) <= 0 \
            or args.ranks < 1 or args.steps < 1:
        ap.error("--repeat, --layers, --ranks, --steps and the sizes must be positive")
    faults = args.fault if args.fault is not None else ["auto"]
    faults = [f for f in faults if f.lower() != "none"]
    args.faults = [f"corrupt:rollout:gate:{args.layers // 2}" if f == "auto" else f for f in faults]
    args.tensor_faults = [f"corrupt:rollout:gate:{args.tensor_layers // 2}" if f == "auto" else f
                          for f in faults]
    if args.mem_limit_mb is None:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        mem_limit = int(phys * 0.75)
    else:
        mem_limit = int(args.mem_limit_mb * MB)

    if args.workdir:
        work = Path(args.workdir).resolve()
        work.mkdir(parents=True, exist_ok=True)
    else:
        work = Path(tempfile.mkdtemp(prefix="bench-"))
    created: list[Path] = []
    results: dict = {"params": {k: v for k, v in vars(args).items()}, "stages": {}}
    rows, ratio_lines, info_lines = [], [], []
    py = args.python
    t_start = time.perf_counter()
    try:
        # ---------------------------------------------------------------- statistics mode
        if stages & {"json", "orjson", "compare", "triage", "rootcause"}:
            for size_mb in args.sizes:
                run_statistics(args, work, size_mb, stages, mem_limit, created, results, rows,
                               ratio_lines, info_lines)
            if len(args.sizes) > 1:
                ratio_lines += scale_lines(results.get("sets", []))
                results["ratio_lines"] = list(ratio_lines)

        # ---------------------------------------------------------------- tensor mode
        if "tensor" in stages:
            tpair = make_tensor_pair(args, work)
            created.append(tpair)
            npys = sorted(str(p) for p in tpair.rglob("*.npy"))
            side_bytes = {s: sum(p.stat().st_size for p in (tpair / s).rglob("*.npy"))
                          for s in ("train", "rollout")}
            largest_npy = max((os.path.getsize(p) for p in npys), default=0)
            larger_side = max(side_bytes.values())
            info_lines.append(
                f"tensor pair: {len(npys)} .npy files, train {_mb(side_bytes['train'])} MB, "
                f"rollout {_mb(side_bytes['rollout'])} MB, largest file {_mb(largest_npy)} MB "
                f"(hidden {args.tensor_hidden}, {args.tensor_layers} layers, seq {args.tensor_seq_len}, "
                f"vocab {args.tensor_vocab}, faults: {', '.join(args.tensor_faults) or 'none'})")
            st = run_stage("tensor: np.load all .npy", [py, "-c", NP_LOAD, *npys], args.repeat,
                           mem_limit=mem_limit)
            results["stages"][st.name] = _stage_json(st)
            np_base, np_cpu = st.median, st.cpu_median
            rows.append(stage_row(st, np_base, larger_side))
            ttimeout = args.stage_timeout or max(120.0, args.timeout_factor * (np_base or 0.0))
            train, rollout = str(tpair / "train"), str(tpair / "rollout")
            for key, name, cmd in (
                    ("compare", "tensor: compare (run_compare.py)",
                     [py, str(COMPARE), "--train", train, "--rollout", rollout,
                      "--out-dir", str(work / "out_tensor_compare"), "--quiet"]),
                    ("rootcause", "tensor: root cause full",
                     [py, str(ROOTCAUSE), "--train", train, "--rollout", rollout,
                      "--out-dir", str(work / "out_tensor_rootcause"), "--quiet"])):
                created.append(Path(cmd[cmd.index("--out-dir") + 1]))
                tst = run_stage(name, cmd, args.repeat, timeout=ttimeout, mem_limit=mem_limit)
                results["stages"][tst.name] = _stage_json(tst)
                rows.append(stage_row(tst, np_base, larger_side))
                r = _ratio_parts(tst, np_base, np_cpu)
                ratio_lines.append(
                    f"ratio tensor {key}: time / np.load(all tensor files) = {r['time']}, "
                    f"cpu time ratio {r['cpu']}; peak memory = {r['peak_mb']} MB (target < 1000 MB), "
                    f"peak / larger side's tensor data = {_fmt_ratio(_ratio(tst.peak, larger_side))}; "
                    f"median {_fmt_s(tst.median)} s{r['tag']}")
                if key == "rootcause" and tst.failed is None:
                    info_lines.append(f"verdict (tensor, full run): {_verdict(work / 'out_tensor_rootcause')}")
            results["ratio_lines"] = list(ratio_lines)

        if "logprobs" in stages:
            run_logprobs(args, work, mem_limit, created, results, rows, ratio_lines, info_lines)
        if "wide" in stages:
            run_wide(args, work, mem_limit, created, results, rows, ratio_lines, info_lines)

        if "generation" in stages:
            for model in args.gen_models:
                run_generation(args, model, work, mem_limit, created, results, rows, ratio_lines, info_lines)
        if "many" in stages:
            run_many(args, work, mem_limit, created, results, rows, ratio_lines, info_lines)

        if "refmodel" in stages:
            run_refmodel(args, work, mem_limit, created, results, rows, ratio_lines, info_lines)
        if "reftorch" in stages:
            run_reftorch(args, work, mem_limit, created, results, rows, ratio_lines, info_lines)

        info_lines.append(f"machine: {os.cpu_count()} cores, "
                          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
                          f"python {py}; repeats {args.repeat}; bench wall "
                          f"{time.perf_counter() - t_start:.0f} s; MB = 1e6 bytes; "
                          f"peak = max(exact per-process high-water mark, sampled process-group sum)")
        print_report(rows, ratio_lines, info_lines)
        if getattr(args, "_profile_path", None):
            print("\n" + args._profile_note)
            print_profile(args._profile_path, args.profile_top)
        if args.json:
            results["table"] = rows
            results["info"] = info_lines
            Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            for p in created:
                if p.is_dir():
                    shutil.rmtree(p, ignore_errors=True)
                elif p.exists():
                    p.unlink()
            if not args.workdir:
                shutil.rmtree(work, ignore_errors=True)
    return 0


def run_logprobs(args, work: Path, mem_limit: int, created: list, results: dict, rows: list,
                 ratio_lines: list, info_lines: list) -> None:
    """The log-prob triage on 10^6 tokens against reading the same files (tools/logprob_bench.py)."""
    import logprob_bench as lb

    folder = work / "logprob_pair"
    created.append(folder)
    pair = lb.write_pair(folder, args.logprob_tokens)
    info_lines.append(f"log-prob pair: {pair['tokens']} tokens per side in {pair['sequences']} sequences, "
                      f".npz {_mb(os.path.getsize(pair['rollout']['npz']))} MB and .jsonl "
                      f"{_mb(os.path.getsize(pair['rollout']['jsonl']))} MB per side")
    for fmt, base_name, snippet in (("npz", "np.load", lb.NPZ_LOAD), ("jsonl", "json.loads every line", lb.JSONL_LOADS)):
        files = [pair["rollout"][fmt], pair["train"][fmt]]
        base = run_stage(f"logprobs {fmt}: {base_name} (both sides)", [args.python, "-c", snippet, *files],
                         args.repeat, mem_limit=mem_limit)
        results["stages"][base.name] = _stage_json(base)
        rows.append(stage_row(base, base.median, None))
        out = work / f"out_logprobs_{fmt}"
        created.append(out)
        cmd = [args.python, str(TRIAGE_LOGPROBS), "--rollout", files[0], "--train", files[1],
               "--out-dir", str(out), "--quiet"]
        timeout = args.stage_timeout or max(120.0, args.timeout_factor * (base.median or 0.0))
        st = run_stage(f"logprobs {fmt}: triage_logprobs.py", cmd, args.repeat, timeout=timeout, mem_limit=mem_limit)
        results["stages"][st.name] = _stage_json(st)
        rows.append(stage_row(st, base.median, None))
        r = _ratio_parts(st, base.median, base.cpu_median)
        ratio_lines.append(f"ratio logprobs {fmt}: time / {base_name} of the same files = {r['time']} (target <= 3x), "
                           f"cpu time ratio {r['cpu']}; median {_fmt_s(st.median)} s, peak {r['peak_mb']} MB{r['tag']}")
    results["ratio_lines"] = list(ratio_lines)


def _random_checkpoint(args, folder: Path, size_mb: float, created: list) -> dict:
    """Write a random Llama checkpoint of about ``size_mb`` into ``folder`` (tools/refmodel_bench.py);
    its sizes as that tool reports them."""
    created.append(folder)
    proc = subprocess.run([args.python, str(ROOT / "tools" / "refmodel_bench.py"), "--out", str(folder),
                           "--size-mb", str(size_mb), "--seed", str(args.seed)], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench: refmodel_bench failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_refmodel(args, work: Path, mem_limit: int, created: list, results: dict, rows: list,
                 ratio_lines: list, info_lines: list) -> None:
    """The reference forward on a random Llama checkpoint: time, and peak memory against its
    largest layer (tools/refmodel_bench.py)."""
    import refmodel_bench as rb

    folder = work / "refmodel_llama"
    log(f"writing a random Llama checkpoint of ~{args.refmodel_mb:g} MB in {folder}")
    sizes = _random_checkpoint(args, folder, args.refmodel_mb, created)
    info_lines.append(
        f"refmodel checkpoint: {_mb(sizes['file_bytes'])} MB bf16, {sizes['layers']} layers, largest layer "
        f"{_mb(sizes['largest_layer_bytes'])} MB, head {_mb(sizes['head_bytes'])} MB; "
        f"{args.refmodel_tokens} tokens, dtype {args.refmodel_dtype}")
    common = [str(rb.SCRIPTS), str(folder)]
    base = run_stage("refmodel: imports + headers (baseline)", [args.python, "-c", rb.BASELINE, *common],
                     args.repeat, mem_limit=mem_limit)
    st = run_stage("refmodel: numpy forward", [args.python, "-c", rb.FORWARD, *common, str(args.refmodel_tokens),
                                               args.refmodel_dtype], args.repeat, mem_limit=mem_limit)
    layer = sizes["largest_layer_bytes"]
    for stage in (base, st):
        results["stages"][stage.name] = _stage_json(stage)
        rows.append(stage_row(stage, None, layer))
    if st.peak is not None and base.peak is not None:
        over = st.peak - base.peak
        ratio_lines.append(
            f"ratio refmodel: peak {_mb(st.peak)} MB, over the baseline {_mb(over)} MB = "
            f"{_fmt_ratio(_ratio(over, layer))} the largest layer ({_mb(layer)} MB bf16; float32 in memory is 2x), "
            f"{_fmt_ratio(_ratio(over, sizes['file_bytes']))} the checkpoint; median {_fmt_s(st.median)} s")
        results["refmodel"] = {**sizes, "peak_bytes": st.peak, "baseline_peak_bytes": base.peak,
                               "median_s": st.median}


JSON_LOAD_ALL = "import json, sys\nfor p in sys.argv[1:]:\n    with open(p, 'rb') as f:\n        json.load(f)\n"


def run_interleaved(specs: list[tuple[str, list[str]]], repeat: int, *, timeout=None, mem_limit=None) -> list[Stage]:
    """Run each command once per round, ``repeat`` rounds: ratios between them measured under the
    same load (a shared machine's load drifts between one command's repeats and the next's)."""
    stages = [Stage(name, timeout=timeout) for name, _ in specs]
    for i in range(repeat):
        for st, (name, cmd) in zip(stages, specs):
            if st.failed is not None:
                continue
            log(f"{name}: run {i + 1}/{repeat}")
            r = run_measured(cmd, timeout=timeout, mem_limit=mem_limit)
            st.runs.append(r)
            log(f"{name}: {r.wall:.2f} s (cpu {r.cpu:.2f} s), peak {r.peak / MB:.0f} MB, "
                + ("ok" if r.ok else st.status()))
    return stages


def _reference_verdict(out_dir: Path) -> str:
    try:
        doc = json.loads((out_dir / "output_4_module_analysis.json").read_text())
    except (OSError, ValueError):
        return "-"
    rf = doc.get("reference_forward") or {}
    sides = rf.get("sides") or {}
    parts = [f"{s} {v.get('matching')}/{v.get('points')} points" for s, v in sides.items() if isinstance(v, dict)]
    return f"ran {rf.get('ran')}, {', '.join(parts)}, verdict: {(rf.get('verdict') or {}).get('reason', '-')}"


# The generation stage's models: gendump.py's flags for each. Qwen3-0.6B's shape as its config.json
# gives it (a dense Llama-like decoder; its q/k norms are not modelled; its vocabulary of 151936 cut
# to 32000), float32 as a trainer's master weights are. Not bfloat16: 28 layers of bf16 rounding sit
# near the fixed bf16 tolerance (README "Generations"), and the stage must time the clean path, not
# the fault simulation, whatever the seed.
QWEN3_06B = ["--layers", "28", "--hidden", "1024", "--intermediate", "3072", "--heads", "16", "--kv-heads", "8",
             "--head-dim", "64", "--vocab", "32000", "--dtype", "fp32"]
GEN_MODELS = ("small", "qwen3-0.6b")


def _gen_flags(args, model: str) -> list[str]:
    if model == "qwen3-0.6b":
        return list(QWEN3_06B)
    return ["--layers", str(args.gen_layers), "--hidden", str(args.gen_hidden), "--vocab", str(args.gen_vocab)]


def run_generation(args, model: str, work: Path, mem_limit: int, created: list, results: dict, rows: list,
                   ratio_lines: list, info_lines: list) -> None:
    """A trainer forward over prompt + response against vLLM's prefill and decode calls in one dump
    (tools/gendump.py) of ``model``: run_compare.py against json.load of the same files, and with
    --model against the same command on an engine that ran one forward over the same tokens (issue 23)."""
    py = args.python
    folder = work / f"generation_{model}"
    created.append(folder)
    if folder.exists():
        shutil.rmtree(folder)
    cmd = [py, str(ROOT / "tools" / "gendump.py"), "--out", str(folder), "--prompt", str(args.gen_prompt),
           "--decode", str(args.gen_decode), *_gen_flags(args, model), "--seed", str(args.seed)]
    log(f"generation [{model}]: writing the pair: " + " ".join(cmd[2:]))
    written = run_measured(cmd, timeout=args.stage_timeout or 3600.0, mem_limit=mem_limit)
    if not written.ok:
        sys.exit(f"bench: gendump failed:\n{written.stderr}")
    g = json.loads(written.stdout.strip().splitlines()[-1])
    b = g["bytes"]
    info_lines.append(
        f"generation pair [{model}]: trainer 1 forward over {g['prompt'] + g['decode']} tokens ({_mb(b['train'])} MB), "
        f"vLLM prefill {g['prompt']} + {g['decode']} decode calls in one dump ({_mb(b['rollout_decode'])} MB, "
        f"{g['calls']} calls x {g['entries_per_call']} modules, shared rotary under layer 0) or one forward "
        f"({_mb(b['rollout_prefill'])} MB); {g['layers']} layers, hidden {g['hidden']}, MLP {g['intermediate']}, "
        f"{g['heads']} heads x {g['head_dim']} ({g['kv_heads']} KV), vocab {g['vocab']}, {g['dtype']} checkpoint of "
        f"{_mb(g['model_bytes'])} MB; written in {written.wall:.0f} s (cpu {written.cpu:.0f} s), peak {written.peak / MB:.0f} MB")
    ref = ["--model", g["model"], "--token-ids", g["tokens"]]

    def compare(rollout: str, out: str, extra: list[str]) -> list[str]:
        created.append(work / out)
        return [py, str(COMPARE), "--train", g["train"], "--rollout", rollout, "--out-dir", str(work / out),
                "--quiet", *extra]

    tag = f"generation [{model}]"
    specs = [(f"{tag}: json.load (trainer + decode dump)",
              [py, "-c", JSON_LOAD_ALL, g["files"]["train"], g["files"]["rollout_decode"]]),
             (f"{tag}: compare, {g['decode']} decode calls",
              compare(g["rollout_decode"], f"out_gen_{model}_decode", [])),
             (f"{tag}: compare, one forward", compare(g["rollout_prefill"], f"out_gen_{model}_prefill", [])),
             (f"{tag}: compare --model, one forward",
              compare(g["rollout_prefill"], f"out_gen_{model}_prefill_ref", ref)),
             (f"{tag}: compare --model, {g['decode']} decode calls",
              compare(g["rollout_decode"], f"out_gen_{model}_decode_ref", ref))]
    timeout = args.stage_timeout or 1200.0
    base, plain, one_plain, one, many = run_interleaved(specs, args.repeat, timeout=timeout, mem_limit=mem_limit)
    for st, against in ((base, None), (plain, base), (one_plain, None), (one, one_plain), (many, one)):
        results["stages"][st.name] = _stage_json(st)
        rows.append(stage_row(st, against.median if against else None, None))
    r = _ratio_parts(plain, base.median, base.cpu_median)
    ratio_lines.append(
        f"ratio generation compare [{model}]: time / json.load(both files) = {r['time']} (target <= 1.5x), "
        f"cpu time ratio {r['cpu']}; {g['decode']} decode calls, statistics, no --model; "
        f"median {_fmt_s(plain.median)} s, peak {r['peak_mb']} MB{r['tag']}")
    r = _ratio_parts(many, one.median, one.cpu_median)
    ratio_lines.append(
        f"ratio generation reference [{model}]: time / the same tokens in one forward = {r['time']} "
        f"(target <= 1.2x), cpu time ratio {r['cpu']}; --model --token-ids, {g['decode']} decode calls judged "
        f"one by one; median {_fmt_s(many.median)} s against {_fmt_s(one.median)} s, peak {r['peak_mb']} MB{r['tag']}")
    if None in (plain.median, one_plain.median, one.median, many.median):
        ratio_lines.append(f"what --model adds [{model}]: not measured (a command failed)")
    else:
        # The ratio above also pays for reading a dump that holds every call (hundreds of times the
        # one-forward dump); this line isolates the reference forward and its per-call judging.
        ratio_lines.append(
            f"what --model adds [{model}]: {_fmt_s(many.median - plain.median)} s on {g['decode']} decode calls "
            f"against {_fmt_s(one.median - one_plain.median)} s on one forward over the same tokens (medians; the "
            "same reference forward runs once per side in both)")
    for st, out in ((one, f"out_gen_{model}_prefill_ref"), (many, f"out_gen_{model}_decode_ref")):
        if st.failed is None:
            info_lines.append(f"reference forward [{model}] ({st.name.split(', ', 1)[1]}): "
                              f"{_reference_verdict(work / out)}")
    results.setdefault("generation", {})[model] = {
        **g, "write_s": written.wall, "write_peak_bytes": written.peak, "json_load_s": base.median,
        "compare_s": plain.median, "compare_one_forward_s": one_plain.median,
        "reference_one_forward_s": one.median, "reference_decode_s": many.median}
    results["ratio_lines"] = list(ratio_lines)


TORCH_CHECK = ("import numpy, torch, transformers\n"
               "print(f'torch {torch.__version__}, transformers {transformers.__version__}, numpy {numpy.__version__}')\n")
TORCH_FORWARD = """
import sys, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(int(sys.argv[3]))
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.bfloat16)
model.eval()
n = model.config.vocab_size
ids = torch.arange(int(sys.argv[2])).mul(7919).remainder(n).unsqueeze(0)
with torch.no_grad():
    out = model(input_ids=ids)
print(float(out.logits.float().norm()))
"""


def run_reftorch(args, work: Path, mem_limit: int, created: list, results: dict, rows: list,
                 ratio_lines: list, info_lines: list) -> None:
    """The numpy reference forward against transformers' CPU forward of the same random 1B+ bf16
    Llama over --reftorch-tokens tokens; skipped without torch and transformers."""
    chk = subprocess.run([args.python, "-c", TORCH_CHECK], capture_output=True, text=True)
    if chk.returncode != 0:
        st = Stage("reftorch: transformers forward", skipped="skipped: torch not installed")
        rows.append(stage_row(st))
        results["stages"][st.name] = _stage_json(st)
        ratio_lines.append(f"ratio reftorch: skipped: torch not installed (torch and transformers are not "
                           f"importable by {args.python})")
        results["ratio_lines"] = list(ratio_lines)
        return
    import refmodel_bench as rb

    folder = work / "reftorch_llama"
    log(f"reftorch: writing a random Llama checkpoint of ~{args.reftorch_mb:g} MB in {folder}")
    sizes = _random_checkpoint(args, folder, args.reftorch_mb, created)
    info_lines.append(f"reftorch checkpoint: {_mb(sizes['file_bytes'])} MB bf16 "
                      f"({sizes['file_bytes'] / 2e9:.2f}B parameters), {sizes['layers']} layers; "
                      f"{args.reftorch_tokens} tokens; {args.python}: {chk.stdout.strip()}")
    specs = [("reftorch: transformers forward (bf16, CPU)",
              [args.python, "-c", TORCH_FORWARD, str(folder), str(args.reftorch_tokens), str(os.cpu_count() or 1)]),
             ("reftorch: numpy reference forward (bf16)",
              [args.python, "-c", rb.FORWARD, str(rb.SCRIPTS), str(folder), str(args.reftorch_tokens), "bf16"])]
    torch_st, numpy_st = run_interleaved(specs, args.repeat, timeout=args.stage_timeout or 3600.0,
                                         mem_limit=mem_limit)
    for st, against in ((torch_st, None), (numpy_st, torch_st)):
        results["stages"][st.name] = _stage_json(st)
        rows.append(stage_row(st, against.median if against else None, sizes["file_bytes"]))
    r = _ratio_parts(numpy_st, torch_st.median, torch_st.cpu_median)
    t_peak = torch_st.peak
    t_tag = "" if torch_st.failed is None else f" [transformers: {torch_st.status()}]"
    ratio_lines.append(
        f"ratio reftorch: numpy reference forward / transformers forward: time {r['time']} (target <= 1.5x; "
        f"median {_fmt_s(numpy_st.median)} s against {_fmt_s(torch_st.median)} s), cpu time {r['cpu']} "
        f"({_fmt_s(numpy_st.cpu_median)} s against {_fmt_s(torch_st.cpu_median)} s), peak memory "
        f"{_fmt_ratio(_ratio(numpy_st.peak, t_peak))} (target <= 1x; {r['peak_mb']} MB against "
        f"{'-' if t_peak is None else f'{t_peak / MB:.0f}'} MB); {args.reftorch_tokens} tokens, "
        f"{_mb(sizes['file_bytes'])} MB bf16 checkpoint, interleaved rounds: {args.repeat}, "
        f"both under {args.python}{r['tag']}{t_tag}")
    results["reftorch"] = {**sizes, "tokens": args.reftorch_tokens, "python": args.python,
                           "numpy_median_s": numpy_st.median, "transformers_median_s": torch_st.median,
                           "numpy_cpu_s": numpy_st.cpu_median, "transformers_cpu_s": torch_st.cpu_median,
                           "numpy_peak_bytes": numpy_st.peak, "transformers_peak_bytes": t_peak}
    results["ratio_lines"] = list(ratio_lines)


def run_many(args, work: Path, mem_limit: int, created: list, results: dict, rows: list,
             ratio_lines: list, info_lines: list) -> None:
    """Many distinct modules (tools/manydump.py): run_compare.py against json.load of the same two
    files, its peak memory over a tiny pair's against the larger file (issue 28, item 4)."""
    import manydump

    py = args.python
    pairs = {}
    for name, calls, layers in (("many", args.many_calls, args.layers), ("tiny", 1, 2)):
        folder = work / f"{name}_pair"
        created.append(folder)
        if folder.exists():
            shutil.rmtree(folder)
        log(f"many: writing the {name} pair ({calls} call(s), {layers} layers)")
        pairs[name] = manydump.write_pair(folder, calls, layers, faults=[f"corrupt:rollout:gate:{layers // 2}"],
                                          seed=args.seed)
    m = pairs["many"]
    larger = max(m["bytes"].values())
    info_lines.append(
        f"many pair: {m['calls']} calls that do not fold, {m['layers']} layers, {m['entries']['train']}/"
        f"{m['entries']['rollout']} entries (train/rollout), {_mb(m['bytes']['train'])}/{_mb(m['bytes']['rollout'])} MB")

    def compare(name: str) -> list[str]:
        out = work / f"out_{name}"
        created.append(out)
        return [py, str(COMPARE), "--train", pairs[name]["train"], "--rollout", pairs[name]["rollout"],
                "--out-dir", str(out), "--quiet"]

    specs = [("many: json.load (both files)", [py, "-c", JSON_LOAD_ALL, *m["files"].values()]),
             (f"many: compare, {m['entries']['train']} entries per side", compare("many")),
             ("many: compare, tiny pair (fixed overhead)", compare("tiny")),
             ("many: the interpreter alone", [py, "-c", "pass"])]
    base, big, tiny, bare = run_interleaved(specs, args.repeat, timeout=args.stage_timeout or 1800.0,
                                            mem_limit=mem_limit)
    for st, against, mem in ((base, None, larger), (big, base, larger), (tiny, None, None), (bare, None, None)):
        results["stages"][st.name] = _stage_json(st)
        rows.append(stage_row(st, against.median if against else None, mem))
    r = _ratio_parts(big, base.median, base.cpu_median)
    over = None if big.peak is None or tiny.peak is None else big.peak - tiny.peak
    ratio_lines.append(
        f"ratio many time: compare / json.load(both files) = {r['time']} (target <= 2x), cpu time ratio {r['cpu']}; "
        f"median {_fmt_s(big.median)} s against {_fmt_s(base.median)} s{r['tag']}")
    ratio_lines.append(
        f"ratio many memory: (peak - tiny pair's peak) / larger file = {_fmt_ratio(_ratio(over, larger))} "
        f"(target <= 3x); peak {r['peak_mb']} MB, tiny pair {_mb(tiny.peak or 0)} MB, larger file {_mb(larger)} MB")
    floors = _many_floors(work / "out_many", base, bare, larger)
    ratio_lines += floors["lines"]
    results["many"] = {**m, "json_load_s": base.median, "compare_s": big.median, "peak_bytes": big.peak,
                       "tiny_peak_bytes": tiny.peak, "encode_outputs_s": floors["encode_s"],
                       "output_json_bytes": floors["json_bytes"]}
    results["ratio_lines"] = list(ratio_lines)


def _many_floors(out: Path, base: Stage, bare: Stage, larger: int) -> dict:
    """What no change to the pipeline's own work can remove while the outputs and the parser stay
    as they are: encoding the run's four JSON outputs (json.dumps in this process, median of 3),
    and json.load's own memory above the bare interpreter, each against the targets' terms."""
    files = sorted(out.glob("output_*.json"))
    enc, size = (0.0 if files else None), 0
    for f in files:
        # One document at a time: at 100 calls the four hold 700 MB of JSON.
        with open(f, "rb") as fh:
            doc = json.load(fh)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            n = len(json.dumps(doc, separators=(",", ":")))
            times.append(time.perf_counter() - t)
        enc += statistics.median(times)
        size += n
        del doc
    lines = [f"floor many encoding: json.dumps of the {len(files)} JSON outputs ({_mb(size)} MB) alone takes "
             f"{_fmt_s(enc)} s = {_fmt_ratio(_ratio(enc, base.median))} json.load of the inputs"]
    if base.peak is not None and bare.peak is not None:
        lines.append(f"floor many memory: json.load's own peak above the bare interpreter "
                     f"({_mb(base.peak - bare.peak)} MB) = {_fmt_ratio(_ratio(base.peak - bare.peak, larger))} "
                     f"the larger file")
    return {"lines": lines, "encode_s": enc, "json_bytes": size}


def run_wide(args, work: Path, mem_limit: int, created: list, results: dict, rows: list,
             ratio_lines: list, info_lines: list) -> None:
    """Planning one module of many outputs (tools/widedump.py): time per leaf of build_plan alone
    at each of --wide-leaves, and the largest size's against the smallest's (linear: about 1)."""
    import widedump

    per_leaf = {}
    for n in args.wide_leaves:
        folder = work / f"wide_{n}"
        created.append(folder)
        log(f"wide: writing a pair with one module of {n} outputs")
        widedump.write_pair(folder, n)
        st = run_stage(f"wide: plan {n} leaves (load + name + plan)",
                       [args.python, "-c", widedump.PLAN_TIMING, str(widedump.SCRIPTS), str(folder), str(n),
                        str(args.repeat)], 1, mem_limit=mem_limit)
        results["stages"][st.name] = _stage_json(st)
        rows.append(stage_row(st))
        if st.failed is None:
            per_leaf[n] = json.loads(st.runs[-1].stdout.strip().splitlines()[-1])
    results["wide"] = per_leaf
    if per_leaf:
        info_lines.append("wide: build_plan per leaf (best of >= " + str(args.repeat) + " runs, >= 5 s): " + "; ".join(
            f"{n}: cpu {t['cpu_us_per_leaf']:.1f} us, wall {t['wall_us_per_leaf']:.1f} us" for n, t in per_leaf.items()))
    small, large = min(args.wide_leaves), max(args.wide_leaves)
    if small in per_leaf and large in per_leaf and large > small:
        a, b = per_leaf[small], per_leaf[large]
        ratio_lines.append(
            f"ratio wide: build_plan time per leaf at {large} leaves / at {small} = "
            f"{_fmt_ratio(_ratio(b['cpu_us_per_leaf'], a['cpu_us_per_leaf']))} cpu, "
            f"{_fmt_ratio(_ratio(b['wall_us_per_leaf'], a['wall_us_per_leaf']))} wall (target <= 1.5x: linear)")


def _stage_json(st: Stage) -> dict:
    return {"status": st.status(), "median_s": st.median, "peak_bytes": st.peak,
            "timeout_s": st.timeout,
            "runs": [{"wall_s": r.wall, "cpu_s": r.cpu, "rc": r.rc, "maxrss_bytes": r.maxrss,
                      "tree_peak_bytes": r.tree_peak, "stopped": r.stopped} for r in st.runs]}


if __name__ == "__main__":
    sys.exit(main())
