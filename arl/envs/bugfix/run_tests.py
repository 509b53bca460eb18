"""A tiny test runner for the hidden tests, run inside the sandbox at evaluation time.

    python -I -S -B run_tests.py TEST_FILE MODULE_DIR   (stdin: one line, a nonce)

Runs every ``test_*`` function of TEST_FILE in file order, with MODULE_DIR (the agent's work dir)
last on ``sys.path``, and writes one line per test, ``<nonce> ["name", passed, "detail"]``, to the
stdout it started with. Why not pytest: pytest's start-up costs ~0.3 s more per evaluation inside
the sandbox, and it honours files the agent controls (a ``conftest.py``, a ``pytest.py`` on the
path) that could rewrite the results. Here the code under test cannot fake a report without the
nonce, which it never sees; its prints go to /dev/null; results of tests that ran survive a later
hang (the caller counts tests without a line as failed). Standard library only, and run without
``site`` (``-S``: a venv's many ``.pth`` files cost ~0.15 s a start): this file is copied into the
sandbox and must run without arl, and the tasks' modules need nothing else.
"""

import importlib.util
import json
import os
import sys


def main() -> None:
    nonce = sys.stdin.readline().strip()
    test_file, module_dir = sys.argv[1], sys.argv[2]
    report = os.fdopen(os.dup(1), "w")
    sys.stdout = sys.stderr = open(os.devnull, "w")
    sys.path.append(module_dir)  # last: a module of the agent's cannot shadow the standard library

    def emit(name: str, passed: bool, detail: str = "") -> None:
        report.write(f"{nonce} {json.dumps([name, passed, detail[:300]])}\n")
        report.flush()

    spec = importlib.util.spec_from_file_location("hidden_tests", test_file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 -- the module under test may raise anything, even SystemExit
        emit("<import>", False, f"{type(exc).__name__}: {exc}")
        return
    for name, fn in list(vars(module).items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001
                emit(name, False, f"{type(exc).__name__}: {exc}")
            else:
                emit(name, True)


if __name__ == "__main__":
    main()
