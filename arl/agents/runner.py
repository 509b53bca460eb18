"""Agent runners: agent code that plays one episode through an OpenAI-compatible client.

A runner knows nothing of tokens, engines or training (docs/architecture.md §7). It gets a client with the
`openai.AsyncOpenAI` shape (anything with ``await client.chat.completions.create(...)``) and a
model name, plays one episode and reports an `EpisodeResult`. The same runner runs unchanged
against arl's in-process client, arl's HTTP proxy, or any real OpenAI-compatible server.

The shortest agent is a plain async function, ``async def agent(client, seed) -> result``, with no
class and no arl import: `FunctionRunner` runs it as an `AgentRunner` and `as_episode_result`
reads what it returns (a score, a bool, a dict of `EpisodeResult` fields, or an `EpisodeResult`).
"""

from __future__ import annotations

import abc
import json
import math
import numbers
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, get_args

import attrs

from arl._renamed import old_names, renamed_fields

RunnerStatus = Literal["Finished", "Failed", "NoData", "Timeout"]
STATUSES: tuple[str, ...] = get_args(RunnerStatus)

# Bounds on what an agent may report (an agent that runs model-written code is not trusted): a
# result past them is malformed, and its episode ends as "agent_error" with the reason.
MAX_RESULT_BYTES = 4 * 2**20  # the JSON document (pull mode's frame limit, `pipe_transport.MAX_BODY`)
MAX_RESULT_DEPTH = 16  # nesting of that document: step_infos hold flat dicts, so 3 levels are used
MAX_RESULT_STEPS = 1 << 16  # entries of step_scores / step_infos (one per model call)
MAX_RESULT_METRICS = 256
MAX_ERROR_CHARS = 1 << 16  # a longer error text is cut (kept: it is the agent's own diagnosis)
# |score| and |step score| at most this: finite, and far enough from float64's range that group
# statistics (squares, sums over a batch) cannot overflow into inf and NaN advantages.
MAX_ABS_SCORE = 1e9
# The step_infos keys of a `StepReport` (a wire format agent code writes: the strings stay). Their
# old names STATE_KEY and GAME_STATE_KEY still import, with a DeprecationWarning (`__getattr__`).
OBSERVATION_INFO_KEY = "state"  # the raw observation the step's action was taken in
# that state's full key (an arl game's state_key()), which GiGPO's state key hashes; before "state"
STATE_KEY_INFO_KEY = "state_key"
StepAlignment = Literal["exact", "last_missing", "mismatch", "unreported", "none"]


@renamed_fields(state="observation")
@attrs.frozen
class StepReport:
    """One env step as a runner reports it: the k-th report belongs to the k-th model call.

    ``observation`` is the raw observation the action was taken in; ``state_key`` the full key of
    that state (an arl game's ``state_key()``, which names what the text may leave out: an
    inventory, a counter). GiGPO groups steps on the hash of ``state_key``, else of ``observation``
    (for an env that is not an arl game); a runner that reports neither gets the hash of the call's
    last user message, which may carry turn counters and split equal states apart. ``info`` holds
    the other keys (``action_effective``, ``success``). ``action_valid`` is None when the runner
    does not say: such a step counts as valid for training (no invalid penalty) and is left out of
    ``valid_action_rate``, which averages only the steps that reported it.
    On the wire it is ``step_scores[k]`` and ``step_infos[k]`` of the `EpisodeResult`, whose
    ``"state"`` entry (`OBSERVATION_INFO_KEY`) carries ``observation``. ``state``, the old name of
    ``observation``, still works as a keyword and an attribute, with a DeprecationWarning.
    """

    reward: float
    observation: str | None = None
    action: str | None = None
    action_valid: bool | None = None  # None: not reported
    info: dict[str, Any] = attrs.Factory(dict)
    state_key: str | None = None

    def to_info(self) -> dict[str, Any]:
        """The ``step_infos`` entry of this report."""
        out = dict(self.info)
        if self.action_valid is not None:
            out["action_valid"] = self.action_valid
        if self.action is not None:
            out["action"] = self.action
        if self.observation is not None:
            out[OBSERVATION_INFO_KEY] = self.observation
        if self.state_key is not None:
            out[STATE_KEY_INFO_KEY] = self.state_key
        return out


class ChatClient(Protocol):
    """The part of `openai.AsyncOpenAI` a runner uses: ``client.chat.completions.create``."""

    chat: Any


@attrs.define
class EpisodeResult:
    """What a runner reports about its episode (the env's view; no tokens).

    ``score`` is the episode return (sum of rewards); ``step_scores`` the reward of each env step,
    in the order of the model calls that drove them. ``exit_reason`` uses the rollout vocabulary
    (`arl.rollout.records.EXIT_REASONS`): "terminated", "truncated", "env_error", "agent_error",
    "timeout", "no_data", ...
    """

    status: RunnerStatus = attrs.field(default="Finished", validator=attrs.validators.in_(STATUSES))
    score: float = 0.0
    step_scores: list[float] = attrs.Factory(list)
    exit_reason: str = "terminated"
    success: bool = False
    metrics: dict[str, float] = attrs.Factory(dict)
    error: str | None = None  # exception text for abnormal exits
    # Optional per-step env facts, aligned with step_scores (keys: action, action_valid,
    # action_effective, success, state, state_key: `StepReport`); managers copy them onto their
    # Turns for the rollout metrics and GiGPO's anchor keys.
    step_infos: list[dict[str, Any]] = attrs.Factory(list)

    @classmethod
    def from_steps(cls, steps: list[StepReport], **fields: Any) -> EpisodeResult:
        """A result whose ``score`` is the sum of the steps' rewards (unless given) and whose
        ``step_scores`` / ``step_infos`` are the reports, in model-call order."""
        fields.setdefault("score", sum(s.reward for s in steps))
        return cls(step_scores=[s.reward for s in steps], step_infos=[s.to_info() for s in steps], **fields)

    def steps(self, n_calls: int) -> tuple[list[StepReport | None], StepAlignment]:
        """The reports for ``n_calls`` model calls, one per call, and how they lined up.

        A runner reports one step per model call; the last call's step may be missing (the env
        crashed on it, or time ran out): ``"last_missing"``, that call gets None. A result with no
        step scores and no step infos at all (an agent that reports only how the episode went, as
        an agent function returning a score does) is ``"unreported"``: every call gets None, and
        the manager scores each call's sample with the episode's score. Any other count, or
        ``step_infos`` that is neither empty nor as long as ``step_scores``, is ``"mismatch"``:
        every call gets None, because no call can be told its own step. ``"none"``: no calls.

        >>> r = EpisodeResult(step_scores=[0.0, 1.0], step_infos=[{"state": "a"}, {"state": "b"}])
        >>> [s.observation for s in r.steps(2)[0]], r.steps(3)[1], r.steps(4)[1]
        (['a', 'b'], 'last_missing', 'mismatch')
        >>> EpisodeResult(score=1.0).steps(2)
        ([None, None], 'unreported')
        """
        if n_calls == 0:
            return [], "none"
        scores, infos = list(self.step_scores), list(self.step_infos)
        if not scores and not infos:
            return [None] * n_calls, "unreported"
        if len(scores) not in (n_calls, n_calls - 1) or len(infos) not in (0, len(scores)):
            return [None] * n_calls, "mismatch"
        reports: list[StepReport | None] = []
        for k, reward in enumerate(scores):
            info = dict(infos[k]) if infos else {}
            observation = info.pop(OBSERVATION_INFO_KEY, None)
            key = info.pop(STATE_KEY_INFO_KEY, None)
            action = info.pop("action", None)
            valid = info.pop("action_valid", None)
            reports.append(StepReport(
                reward=float(reward), observation=observation if isinstance(observation, str) else None,
                action=action if isinstance(action, str) else None,
                action_valid=None if valid is None else bool(valid), info=info,
                state_key=key if isinstance(key, str) else None))
        alignment: StepAlignment = "exact" if len(scores) == n_calls else "last_missing"
        return reports + [None] * (n_calls - len(scores)), alignment

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    def problem(self) -> str | None:
        """Why this result cannot be trained on (a score that is not a finite number within
        `MAX_ABS_SCORE`, too many steps or metrics), or None. Checked at the rollout boundary for
        every runner, in-process ones too: one NaN would end the whole training step."""
        numbers = [("score", self.score)]
        if not isinstance(self.step_scores, list | tuple) or len(self.step_scores) > MAX_RESULT_STEPS:
            return f"step_scores must be a list of at most {MAX_RESULT_STEPS} numbers"
        if not isinstance(self.step_infos, list | tuple) or len(self.step_infos) > MAX_RESULT_STEPS:
            return f"step_infos must be a list of at most {MAX_RESULT_STEPS} objects"
        if not isinstance(self.metrics, dict) or len(self.metrics) > MAX_RESULT_METRICS:
            return f"metrics must be an object of at most {MAX_RESULT_METRICS} numbers"
        numbers += [(f"step_scores[{i}]", v) for i, v in enumerate(self.step_scores)]
        numbers += [(f"metrics[{k!r}]", v) for k, v in self.metrics.items()]
        for name, value in numbers:
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                return f"{name} is not a number ({type(value).__name__})"
            if not math.isfinite(number):
                return f"{name} is not finite ({number})"
            if abs(number) > MAX_ABS_SCORE and not name.startswith("metrics"):
                return f"{name} = {number:g} is beyond +-{MAX_ABS_SCORE:g}"
        return None

    @classmethod
    def from_json(cls, data: Any) -> EpisodeResult:
        """Parse a result written by an out-of-process agent; unknown keys are ignored.

        Raises ValueError/TypeError on a malformed document (the caller turns that into data):
        wrong types, non-finite or out-of-range scores, sizes past the `MAX_RESULT_*` bounds.
        """
        if not isinstance(data, dict):
            raise TypeError(f"episode result must be a JSON object, got {type(data).__name__}")
        fields = {f.name for f in attrs.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in fields}
        result = cls(**kwargs)
        problem = result.problem()
        if problem is not None:
            raise ValueError(problem)
        result.score = float(result.score)
        result.step_scores = [float(s) for s in result.step_scores]
        result.success = bool(result.success)
        result.exit_reason = str(result.exit_reason)
        result.metrics = {str(k): float(v) for k, v in dict(result.metrics).items()}
        result.step_infos = [dict(i) for i in result.step_infos]
        if result.error is not None:
            result.error = str(result.error)[:MAX_ERROR_CHARS]
        return result

    @classmethod
    def from_bytes(cls, raw: bytes | str) -> EpisodeResult:
        """Parse the JSON document an out-of-process agent sent (push mode's result file, pull
        mode's end frame). ValueError/TypeError for anything malformed: too large or too deeply
        nested (`MAX_RESULT_BYTES`, `MAX_RESULT_DEPTH`; a deep one would otherwise raise
        RecursionError in the parser), NaN / Infinity literals, or a bad result (`from_json`)."""
        if len(raw) > MAX_RESULT_BYTES:
            raise ValueError(f"result of {len(raw)} bytes exceeds {MAX_RESULT_BYTES}")
        try:
            data = json.loads(raw, parse_constant=_no_constant)
        except RecursionError:  # the parser recurses per level: thousands of "[" end it here
            raise ValueError(f"result nested deeper than {MAX_RESULT_DEPTH} levels") from None
        _check_depth(data)  # what it parsed may still be deeper than anything downstream expects
        return cls.from_json(data)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a result may hold (scores must be finite)")


def _check_depth(data: Any) -> None:
    """Refuse a parsed document nested deeper than `MAX_RESULT_DEPTH` (walked without recursion)."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_RESULT_DEPTH:
                raise ValueError(f"result nested deeper than {MAX_RESULT_DEPTH} levels")
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))


class AgentRunner(abc.ABC):
    """Plays one episode per `run_job(seed)` through ``client`` (OpenAI-compatible, async)."""

    def __init__(self, client: ChatClient, model: str = "arl") -> None:
        self.client = client
        self.model = model

    @abc.abstractmethod
    async def run_job(self, seed: int) -> EpisodeResult:
        """Play the episode of ``seed``; report failures as data where the runner can."""


AgentFunction = Callable[..., Awaitable[Any]]  # async def agent(client, seed, **kwargs) -> result


def as_episode_result(value: Any) -> EpisodeResult:
    """What an agent function returned, as the `EpisodeResult` of its episode.

    - an `EpisodeResult`: itself;
    - a bool: success, with score 1.0 (True) or 0.0 (False);
    - a number: the episode's score, success False (return a dict to report success too);
    - a dict of `EpisodeResult` fields (``score``, ``success``, ``status``, ``exit_reason``,
      ``error``, ``metrics``, ``step_scores``, ``step_infos``), read as an agent program's result
      is (`EpisodeResult.from_json`: types and bounds checked); a key that is no field is refused,
      so a misspelt ``sucess`` cannot pass for a failure.

    Anything else, or a dict that does not hold, raises TypeError / ValueError; out of an episode's
    `run_job` that ends the episode ``agent_error`` with the reason. Scores are checked at the
    rollout boundary as every runner's are (`EpisodeResult.problem`: finite, within `MAX_ABS_SCORE`).

    >>> as_episode_result(0.5).score, as_episode_result(True).success, as_episode_result(True).score
    (0.5, True, 1.0)
    >>> r = as_episode_result({"score": 1, "success": True, "metrics": {"calls": 3}})
    >>> r.score, r.success, r.status, r.metrics
    (1.0, True, 'Finished', {'calls': 3.0})
    >>> as_episode_result({"score": 1.0, "sucess": True})
    Traceback (most recent call last):
    ...
    ValueError: an agent's result dict holds no field 'sucess' (fields: status, score, step_scores, exit_reason, \
success, metrics, error, step_infos)
    >>> as_episode_result("done")
    Traceback (most recent call last):
    ...
    TypeError: an agent function returns a score, a bool, a dict of EpisodeResult fields or an EpisodeResult, not str
    """
    if isinstance(value, EpisodeResult):
        return value
    if isinstance(value, bool):
        return EpisodeResult(score=float(value), success=value)
    if isinstance(value, numbers.Real):
        return EpisodeResult(score=float(value))
    if isinstance(value, dict):
        fields = [f.name for f in attrs.fields(EpisodeResult)]
        unknown = [k for k in value if k not in fields]
        if unknown:
            raise ValueError(f"an agent's result dict holds no field {', '.join(map(repr, unknown))} "
                             f"(fields: {', '.join(fields)})")
        return EpisodeResult.from_json(value)
    raise TypeError("an agent function returns a score, a bool, a dict of EpisodeResult fields or an EpisodeResult, "
                    f"not {type(value).__name__}")


class FunctionRunner(AgentRunner):
    """An agent that is one async function, run as an `AgentRunner`: ``run_job(seed)`` awaits
    ``fn(client, seed, **kwargs)`` and returns `as_episode_result` of what it returns.

    The function needs no arl import: it gets the episode's OpenAI-compatible client and the seed
    (its own task, level or question for that seed: the members of a group share one), makes its
    model calls through that client (any ``model`` name: arl serves one policy) and returns how the
    episode went. arl builds one per episode (the runner factory that
    `arl.rollout.runners.make_runner_factory` makes of it, as for ``rollout.proxy.runner:
    my_pkg.my_mod:agent`` naming an async function).
    """

    def __init__(self, client: ChatClient, fn: AgentFunction, kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(client)
        self.fn = fn
        self.kwargs = dict(kwargs or {})

    async def run_job(self, seed: int) -> EpisodeResult:
        return as_episode_result(await self.fn(self.client, seed, **self.kwargs))


# STATE_KEY and GAME_STATE_KEY, the old names of OBSERVATION_INFO_KEY and STATE_KEY_INFO_KEY
__getattr__ = old_names(__name__, globals(), STATE_KEY="OBSERVATION_INFO_KEY", GAME_STATE_KEY="STATE_KEY_INFO_KEY")
