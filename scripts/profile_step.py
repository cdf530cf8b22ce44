"""Where the time of a real training step goes: ``torch.profiler`` and cProfile over steps of a run of
the command line, with everything the run does (Lightning's loop, the data loader, logging, metrics,
callbacks), not a hand-written loop.

The run is ``python -m snntrain <overrides>``; from training step ``--start`` of epoch ``--epoch``
(counted from 0: the default 1 profiles an epoch whose data are cached and whose kernels are tuned),
``--steps`` steps are recorded, the device synchronised at both ends. Written to ``--out``:

* ``profile.txt``: wall time per step; torch.profiler operators by total CPU time (host) and by
  self device time (GPU kernels); cProfile's Python functions by cumulative and by own time; with
  ``--stacks`` (in place of cProfile), where the host waits for the device: every synchronising CUDA
  call (``cudaStreamSynchronize``, a blocking ``cudaMemcpy``, ...) grouped by the Python stack that
  made it.
* ``trace.json``: the torch.profiler timeline (chrome://tracing or https://ui.perfetto.dev).
* ``profile.pstats``: cProfile's raw statistics, for callers and callees
  (``python -m pstats profile.pstats``, then ``callers <function>``; or snakeviz).

Under DDP (``trainer.devices=2``) every process profiles the same steps and writes
``profile_rank<N>.txt`` and ``trace_rank<N>.json``.

    python scripts/profile_step.py --out $OUT -- task=detect data.augment=false backend=triton
    python scripts/profile_step.py --out $OUT --start 20 --steps 20 -- data=synthetic model.stem=imagenet
    python scripts/profile_step.py --out $OUT --no-python -- data=synthetic trainer.devices=2
    python scripts/profile_step.py --out $OUT --stacks -- task=detect compile=reduce-overhead

Profiling slows the host (cProfile most: compare steps of one profile, not profiled with unprofiled
times; ``--no-python`` leaves cProfile out). The run's own output goes to ``<out>/run``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import re
import sys
import time
from pathlib import Path

import lightning as L
import torch

from snntrain.callbacks import synchronized_clock


class StepProfile(L.Callback):
    """Records training steps ``start .. start+steps-1`` of epoch ``epoch`` and writes the tables."""

    def __init__(self, out: Path, epoch: int, start: int, steps: int, python: bool = True,
                 stacks: bool = False) -> None:
        self.out, self.epoch, self.start, self.steps = out, epoch, start, steps
        self.python, self.stacks = python and not stacks, stacks
        self.done = False
        self._prof = self._py = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.done or trainer.current_epoch != self.epoch or batch_idx != self.start:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        synchronized_clock(trainer)  # the device idle before the profiled window opens
        # Python stacks (for the table of host waits) come from Python's profiling hook, which cProfile also
        # needs: one or the other
        self._prof = torch.profiler.profile(activities=activities, with_stack=self.stacks)
        self._prof.__enter__()
        if self.python:
            self._py = cProfile.Profile()
            self._py.enable()
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._prof is None:
            return
        last = batch_idx + 1 >= trainer.num_training_batches
        if batch_idx != self.start + self.steps - 1 and not last:
            return
        if self._py is not None:
            self._py.disable()
        seconds = synchronized_clock(trainer) - self._t0
        self._prof.__exit__(None, None, None)
        self.write(batch_idx + 1 - self.start, seconds, trainer.global_rank, trainer.world_size)
        self._prof = self._py = None
        self.done = True

    def write(self, steps: int, seconds: float, rank: int = 0, world: int = 1) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tag = f"_rank{rank}" if world > 1 else ""  # under DDP every process profiles its own steps
        table = self._prof.key_averages()
        device = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        parts = [f"steps {steps}, wall per step (profiled) {1000 * seconds / steps:.2f} ms\n",
                 "\n## operators by total CPU time (host)\n",
                 table.table(sort_by="cpu_time_total", row_limit=40, max_name_column_width=80),
                 f"\n## operators by {device.replace('_', ' ')}\n",
                 table.table(sort_by=device, row_limit=25, max_name_column_width=80)]
        trace = self.out / f"trace{tag}.json"
        self._prof.export_chrome_trace(str(trace))
        if self.stacks:
            parts += ["\n## where the host waits for the device (synchronising calls by Python stack)\n",
                      host_waits(trace_events(trace))]
        if self._py is not None:
            for key, title in (("cumulative", "cumulative"), ("tottime", "own")):
                buf = io.StringIO()
                pstats.Stats(self._py, stream=buf).sort_stats(key).print_stats(50)
                parts += [f"\n## Python functions by {title} time (cProfile)\n", buf.getvalue()]
            self._py.dump_stats(str(self.out / f"profile{tag}.pstats"))  # callers: pstats, snakeviz
        (self.out / f"profile{tag}.txt").write_text("".join(parts))


#: CUDA runtime calls that block the host until the device (or a stream) has finished its queued work.
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


_OWN_FRAME = re.compile(r"(^|/)profile_step\.py\(")  # this script's frames, not those of the run


def trace_events(path: Path) -> list[dict]:
    """The events of a Chrome trace that torch.profiler exported (``export_chrome_trace``, once per profile). With
    ``with_stack=True`` it holds every Python function call as an interval (``cat: python_function``) beside the
    operators and CUDA runtime calls, on every PyTorch version (whether ``prof.events()`` links operators to
    their Python frames differs between versions)."""
    import json

    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def host_waits(events: list[dict], names: tuple[str, ...] = WAITS, depth: int = 12) -> str:
    """The calls named ``names`` (default: the synchronising CUDA calls) among ``events`` (:func:`trace_events`
    of a profile recorded with ``with_stack=True``), grouped by the innermost ``depth`` Python frames that
    enclose them: count, total host time, and the stack."""
    by_thread: dict = {}
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        python = e.get("cat") == "python_function"
        if python or e.get("name") in names:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    groups: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    for thread in by_thread.values():
        # outer intervals first where two start together: a sweep keeps the Python frames open at each call
        thread.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        open_frames: list[tuple[float, str]] = []  # (end, name), outermost first
        for e in thread:
            ts, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            while open_frames and open_frames[-1][0] < ts:
                open_frames.pop()
            if e.get("cat") == "python_function":
                open_frames.append((end, e["name"]))
                continue
            stack = tuple(f for _, f in reversed(open_frames) if not _OWN_FRAME.search(f))[:depth]
            groups.setdefault((e["name"], stack), []).append(float(e["dur"]))
    if not groups:
        return "none\n"
    lines = []
    for (name, stack), times in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{name}: {len(times)} calls, {sum(times) / 1e3:.2f} ms\n")
        lines += [f"    {frame}\n" for frame in stack]
    return "".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("profile_step"))
    p.add_argument("--epoch", type=int, default=1, help="epoch to profile (0-based)")
    p.add_argument("--start", type=int, default=10, help="first profiled training step of that epoch")
    p.add_argument("--steps", type=int, default=10, help="steps to record")
    p.add_argument("--no-python", action="store_true", help="leave cProfile out")
    p.add_argument("--stacks", action="store_true",
                   help="record Python stacks with torch.profiler (in place of cProfile) and write where the host "
                        "waits for the device")
    p.add_argument("overrides", nargs="*", help="command-line overrides of the run")
    args = p.parse_args()
    for name in ("epoch", "start"):
        if getattr(args, name) < 0:
            p.error(f"--{name}={getattr(args, name)} must be >= 0")
    if args.steps < 1:
        p.error(f"--steps={args.steps} must be >= 1")

    from hydra import compose, initialize_config_module

    from snntrain.cli import train
    from snntrain.config_keys import upgrade_overrides

    out = args.out.resolve()
    given, notes = upgrade_overrides(args.overrides)  # keys that moved keep working, as with python -m snntrain
    for note in notes:
        print(f"snntrain: {note}", file=sys.stderr)
    overrides = [*given, f"paths.output_dir={out / 'run'}"]
    if not any(o.startswith("trainer.max_epochs=") for o in given):
        overrides.append(f"trainer.max_epochs={args.epoch + 1}")
    with initialize_config_module(config_module="snntrain.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    profile = StepProfile(out, args.epoch, args.start, args.steps, python=not args.no_python, stacks=args.stacks)
    train(cfg, callbacks=[profile])
    if not profile.done:
        raise SystemExit(f"step {args.start} of epoch {args.epoch} was never reached: the run has fewer steps "
                         "(lower --start/--epoch or give more data)")
    print(f"profile: {sorted(out.glob('profile*.txt'))}  trace: {sorted(out.glob('trace*.json'))}")


if __name__ == "__main__":
    main()
