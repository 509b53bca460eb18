"""Play an arl game in the terminal: ``python -m arl.envs.play arl/Sokoban-v0 [--seed N]``.

Keys: w/a/s/d or the arrow keys move, q quits. On a terminal each key acts at once; with
``--line``, or when stdin is not a terminal (a pipe, a file, a test), input is read line by line
and a line may also be an action name ("up", "left", ...) or several keys ("wwd").
With ``--render DIR`` every state is also saved as an RGB frame, ``DIR/step_000.png`` onwards
(the game's ``frame()``, what ``render_mode="rgb_array"`` returns: `arl.envs.render`).
This module is a UI, so unlike the rest of the library it prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from arl.envs.text import TextEnv

_KEYS = {"w": "Up", "s": "Down", "a": "Left", "d": "Right"}
_ARROWS = {"\x1b[A": "Up", "\x1b[B": "Down", "\x1b[C": "Right", "\x1b[D": "Left"}
_ARROWS_LOWER = {k.lower(): v for k, v in _ARROWS.items()}
_QUIT = "quit"


def _tokens_of_line(line: str, action_names: list[str]) -> list[str | None]:
    """Actions (or _QUIT) in one typed line; None marks something unrecognised."""
    word = line.strip().lower()
    if word in ("q", "quit", "exit"):
        return [_QUIT]
    for name in action_names:
        if word == name.lower():
            return [name]
    out: list[str | None] = []
    i = 0
    while i < len(word):
        if word[i : i + 3] in _ARROWS_LOWER:  # arrow keys typed into a cooked terminal
            out.append(_ARROWS_LOWER[word[i : i + 3]])
            i += 3
        elif word[i] in _KEYS:
            out.append(_KEYS[word[i]])
            i += 1
        elif word[i] == "q":
            out.append(_QUIT)
            break
        elif word[i].isspace():
            i += 1
        else:
            return [None]
    return out


def _line_tokens(action_names: list[str]) -> Iterator[str | None]:
    for line in sys.stdin:
        if line.strip():
            yield from _tokens_of_line(line, action_names)


def _key_tokens() -> Iterator[str | None]:
    """Single keypresses from a terminal in cbreak mode (restored on exit)."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        while True:
            ch = sys.stdin.read(1)
            if ch in ("", "q", "\x03", "\x04"):  # EOF, q, Ctrl-C, Ctrl-D
                yield _QUIT
                return
            if ch == "\x1b":
                ch += sys.stdin.read(2)
                yield _ARROWS.get(ch)
            elif ch.lower() in _KEYS:
                yield _KEYS[ch.lower()]
            elif not ch.isspace():
                yield None
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="arl play", description="Play an arl game in the terminal.")
    parser.add_argument("env_id", nargs="?", default="arl/Sokoban-v0", help="e.g. arl/Sokoban-v0")
    parser.add_argument("--seed", type=int, default=None, help="level seed (default: random)")
    parser.add_argument("--line", action="store_true", help="read whole lines even on a terminal")
    parser.add_argument("--render", type=Path, default=None, metavar="DIR",
                        help="also save each state's RGB frame as DIR/step_NNN.png")
    args = parser.parse_args(argv)

    env = TextEnv(args.env_id)
    text, _info = env.reset(seed=args.seed)
    save_frame = _frame_saver(env, args.render) if args.render is not None else (lambda step: None)
    save_frame(0)
    print(env.instructions)
    print("Keys: w/a/s/d or arrows to move, q to quit (or type an action name and Enter).\n")
    limit = f"/{env.max_steps}" if env.max_steps is not None else ""
    print(f"{text}\nstep 0{limit}  return 0.00")
    total, steps = 0.0, 0
    interactive = sys.stdin.isatty() and not args.line
    tokens = _key_tokens() if interactive else _line_tokens(env.action_names)
    for token in tokens:
        if token == _QUIT:
            print("Bye.")
            break
        if token is None:
            print("Unknown input: use w/a/s/d, arrow keys, an action name, or q.")
            continue
        text, reward, terminated, truncated, info = env.step_action(token)
        total += reward
        steps += 1
        save_frame(steps)
        moved = "" if info["action_effective"] else "  (no effect)"
        print(f"\n{token}{moved}\n{text}\nstep {steps}{limit}  reward {reward:+.2f}  return {total:.2f}")
        if terminated or truncated:
            outcome = "solved!" if info["success"] else ("out of steps." if truncated else "game over.")
            print(f"Episode finished: {outcome} Return {total:.2f} in {steps} steps.")
            break
    env.close()
    if args.render is not None:
        print(f"Frames saved in {args.render}/")
    return 0


def _frame_saver(env: TextEnv, directory: Path):
    """A function that writes the game's current frame as ``directory/step_{n:03d}.png``."""
    from PIL import Image

    frame = getattr(env.unwrapped, "frame", None)
    if not callable(frame):
        raise SystemExit(f"{type(env.unwrapped).__name__} draws no frames (it has no frame() method)")
    directory.mkdir(parents=True, exist_ok=True)

    def save(step: int) -> None:
        Image.fromarray(frame()).save(directory / f"step_{step:03d}.png")

    return save


if __name__ == "__main__":
    sys.exit(main())
