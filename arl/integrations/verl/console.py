"""verl's console metrics (``trainer.logger=[console]``) read back from a launch's output.

verl's console logger prints one line per training step: ``step:N - key:value - key:value ...``
(numpy scalars as ``np.float64(8.0)``). The CPU fit's test (tests/integrations/verl/test_verl_fit.py)
and the side-by-side benchmark (benchmarks/verl_side_by_side.py) read the metrics from there.
"""

from __future__ import annotations

import re

_STEP = re.compile(r"\bstep:(\d+) - (.*)$")
_NUMBER = re.compile(r"^(?:np\.\w+\()?(-?(?:\d+\.?\d*(?:e[-+]?\d+)?|nan|inf))\)?$")


def step_metrics(log: str) -> dict[int, dict[str, float]]:
    """verl's console lines in ``log`` as {step: {key: value}} (non-numeric values are left out; a
    step printed twice keeps its last line).

    >>> step_metrics("(TaskRunner pid=1) step:2 - actor/loss:0.5 - num_turns/mean:np.float64(8.0) - x:abc")
    {2: {'actor/loss': 0.5, 'num_turns/mean': 8.0}}
    """
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = _STEP.search(line)
        if match is None:
            continue
        metrics = {}
        for item in match.group(2).split(" - "):
            key, _, value = item.rpartition(":")
            number = _NUMBER.match(value.strip())
            if key and number:
                metrics[key.strip()] = float(number.group(1))
        steps[int(match.group(1))] = metrics
    return steps
