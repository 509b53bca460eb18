"""Run metrics: one flat dict per step to `run_dir/metrics.jsonl` and TensorBoard, read back,
and drawn as a learning-curve PNG.

Keys keep their namespace as the TensorBoard tag (`rollout/...`, `env/<id>/...`, `train/...`,
`timing/...`, `eval/...`), so TensorBoard groups them by section. The JSONL file is the record
of truth (strict JSON, one row per `log` call, flushed per line); TensorBoard is a view of it.

This module never prints and never configures logging; warnings go to `getLogger(__name__)`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
DEFAULT_CURVE_KEYS: tuple[str, ...] = (
    "eval/success_rate",
    "rollout/success_rate",
    "rollout/mean_episode_score",
    "rollout/action_effective_rate",
    "train/loss",
    "train/grad_norm",
)

Rows = list[dict[str, Any]]
T = TypeVar("T")


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become `a/b` keys, so a caller may pass `{"env": {"frozenlake": {...}}}`."""
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _scalar(v: Any) -> Any:
    """Unwrap numpy scalars and one-element tensors/arrays to Python numbers; others unchanged."""
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    item = getattr(v, "item", None)
    if callable(item):
        try:
            return item()
        except (ValueError, RuntimeError):  # more than one element
            return v
    return v


def _json_value(v: Any) -> Any:
    """Strict-JSON form: non-finite floats become null, non-numbers their string."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    return str(v)


def _tb_value(v: Any) -> float | None:
    """The float TensorBoard gets, or None to skip (strings, None, NaN, inf)."""
    if isinstance(v, (bool, int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    return None


def _parse_lines(path: Path) -> Iterator[dict[str, Any]]:
    with path.open("r", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                # A crash mid-write can tear the last line; everything before it is intact.
                log.warning("%s:%d: unreadable metrics line skipped", path, n)
                continue
            if isinstance(row, dict):
                yield row


def read_metrics(run_dir: str | os.PathLike[str]) -> Rows:
    """Rows of `run_dir/metrics.jsonl` (or of the .jsonl file given), in file order; [] if none."""
    path = Path(run_dir)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    return list(_parse_lines(path))


def _truncate_after(path: Path, step: int) -> None:
    """Rewrite `path` keeping rows with step <= `step`, atomically (temp file + os.replace)."""
    kept = [row for row in _parse_lines(path) if isinstance(row.get("step"), int) and row["step"] <= step]
    fd, tmp = tempfile.mkstemp(prefix=".metrics-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in kept:
                f.write(json.dumps(row, allow_nan=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class MetricsLogger:
    """Append per-step metrics to `run_dir/metrics.jsonl` and TensorBoard (`run_dir/tb`).

    `resume_step=k` continues a run resumed from the checkpoint of step k: JSONL rows with
    step > k (written after that checkpoint by the interrupted run) are dropped, and TensorBoard
    hides events from step k+1 on (`purge_step`), so the resumed run logs those steps afresh.
    Without `resume_step` an existing file is appended to (with a warning).

    Values: ints, floats, bools, numpy scalars and one-element tensors are numbers; NaN/inf are
    stored as null in JSONL and skipped in TensorBoard; anything else is stored as its string in
    JSONL and skipped in TensorBoard. Nested dicts are flattened to `a/b` keys.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = True,
        jsonl: bool = True,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        self._file = None
        self._writer = None
        if jsonl:
            if self.path.exists():
                if resume_step is not None:
                    _truncate_after(self.path, resume_step)
                elif self.path.stat().st_size > 0:
                    log.warning("%s exists and this is not a resume: appending to it", self.path)
            self._file = self.path.open("a", encoding="utf-8")
        if tensorboard:
            # Imported here: tensorboard is heavy and optional for jsonl-only use.
            from torch.utils.tensorboard import SummaryWriter

            purge = resume_step + 1 if resume_step is not None else None
            self._writer = SummaryWriter(str(self.run_dir / TB_DIR), purge_step=purge)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record one row `{"step": step, **metrics}`."""
        flat = {k: _scalar(v) for k, v in _flatten(metrics).items()}
        if "step" in flat:
            raise ValueError("'step' is reserved for the step argument, not a metric key")
        if self._file is not None:
            row = {"step": int(step), **{k: _json_value(v) for k, v in flat.items()}}
            self._file.write(json.dumps(row, allow_nan=False) + "\n")
            self._file.flush()
        if self._writer is not None:
            for k, v in flat.items():
                f = _tb_value(v)
                if f is not None:
                    self._writer.add_scalar(k, f, global_step=int(step))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def progress(
    iterable: Iterable[T] | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    disable: bool | None = None,
) -> Any:
    """A tqdm progress bar on stderr for long work (training steps, evaluation panels).

    `disable=None` hides it when stderr is not a terminal, so logs of batch jobs and test output
    stay clean; it never prints anything else.
    """
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True, leave=False)


# ---------------------------------------------------------------------------------------- curves


def _series(rows: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for row in rows:
        v, s = row.get(key), row.get("step")
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and isinstance(s, int):
            xs.append(float(s))
            ys.append(float(v))
    return xs, ys


def _as_runs(
    source: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
) -> dict[str, Sequence[Mapping[str, Any]]]:
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        return {(p.name if p.is_dir() else p.parent.name) or str(p): read_metrics(p)}
    if isinstance(source, Mapping):
        return {
            str(name): read_metrics(v) if isinstance(v, (str, os.PathLike)) else list(v)
            for name, v in source.items()
        }
    return {"run": list(source)}


def plot_learning_curve(
    run_dir_or_rows: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Mapping[str, Any],
    out_png: str | os.PathLike[str],
    keys: Sequence[str] = DEFAULT_CURVE_KEYS,
    *,
    title: str | None = None,
) -> Path:
    """Draw one subplot per key (vs step) and write `out_png`; returns its path.

    `run_dir_or_rows` is a run directory, a list of metric rows, or a dict `name -> run dir or
    rows` to compare several runs on the same axes. Keys with no finite value in any run are
    skipped. Uses the Agg canvas directly (no pyplot), so it is safe off the main thread and on
    machines without a display.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    runs = _as_runs(run_dir_or_rows)
    present = [k for k in keys if any(_series(rows, k)[0] for rows in runs.values())]
    if title is None:
        title = " vs ".join(runs)

    ncols = 1 if len(present) <= 1 else 2
    nrows = max(1, math.ceil(len(present) / ncols))
    fig = Figure(figsize=(5.0 * ncols, 3.2 * nrows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle(title)
    if not present:
        log.warning("no finite values for any of %s: writing an empty curve", list(keys))
        ax = fig.add_subplot(1, 1, 1)
        ax.text(0.5, 0.5, "no data for\n" + "\n".join(keys), ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    for i, key in enumerate(present):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for name, rows in runs.items():
            xs, ys = _series(rows, key)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3, label=name)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)
        if key.rsplit("/", 1)[-1].endswith(("_rate", "_frac")):  # fractions on a fixed 0..1 axis (docs/metrics.md)
            ax.set_ylim(-0.02, 1.02)
        if len(runs) > 1:
            ax.legend(fontsize=8)

    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out
