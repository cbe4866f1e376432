#!/usr/bin/env python3
"""Runs the tests' Python scripts one after another in one interpreter, so that torch,
torchvision and transformers are imported once per test process instead of once per script
(`import torch` costs about 2 s of CPU, transformers' models 4-5 s; most reference scripts
compute for a fraction of that). `tests/common/lib.rs` (`python`) starts it and sends it the
commands it would have run as `python3 ARGS...`.

Protocol: one JSON object per line on stdin, `{"argv": ["script.py", "arg", ...], "env":
{"NAME": "value"}}` or `{"argv": ["-c", "code", "arg", ...], "env": {}}` (`env`: variables set
for this command only); one JSON line back on the worker's standard output, `{"code": N,
"stdout": "...", "stderr": "..."}` (what C++ code writes straight to file descriptor 1 goes to
its stderr instead). The worker exits at the end of its input.

Each command runs as `python3 ARGV` would, in this process: `sys.argv`, `sys.path[0]` (the
script's folder, or '' for `-c`), `__name__ == "__main__"`, `SystemExit` as the exit code, an
uncaught exception printed to its stderr with exit code 1. What a script may change and a
fresh interpreter would not have is put back after it: `sys.argv`, `sys.path`, the working
folder, the environment, the warning filters, and torch's default dtype, grad mode, thread count,
deterministic-algorithm setting and print options (as torch had them when the worker started);
`sys.stdin` is empty. The modules a script imports (`pytorch_models`, transformers, ...) stay
imported. Output written by C++ code straight to the file descriptors, not through
`sys.stdout`, is not captured.
"""

import io
import json
import os
import runpy
import sys
import traceback
import warnings

# A fresh `python3 script.py` has the script's folder first on its path, not this one's.
del sys.path[0]

try:
    import torch

    TORCH_DEFAULTS = (
        torch.get_default_dtype(),
        torch.is_grad_enabled(),
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
    )
except ImportError:
    torch = None


def _run(argv, env):
    """Runs one command with `env` added to the environment; returns (exit code, stdout,
    stderr)."""
    out, err = io.StringIO(), io.StringIO()
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_cwd, saved_env = os.getcwd(), dict(os.environ)
    saved_stdin, saved_stdout, saved_stderr = sys.stdin, sys.stdout, sys.stderr
    code = 0
    with warnings.catch_warnings():
        # stdin empty, as the tests start a fresh interpreter (the worker's own is its requests).
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(""), out, err
        os.environ.update(env)
        try:
            if argv[0] == "-c":
                sys.argv = ["-c"] + argv[2:]
                sys.path.insert(0, "")
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
            else:
                # `__file__` absolute, as Python 3.9+ gives a script run as `python3 script.py`.
                script = os.path.abspath(argv[0])
                sys.argv = list(argv)
                sys.path.insert(0, os.path.dirname(script))
                runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            if e.code is None:
                code = 0
            elif isinstance(e.code, int):
                code = e.code
            else:
                print(e.code, file=err)
                code = 1
        except BaseException:  # noqa: BLE001 - as the interpreter reports any uncaught error
            traceback.print_exc(file=err)
            code = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - a script may have closed its streams
                pass
            sys.stdin, sys.stdout, sys.stderr = saved_stdin, saved_stdout, saved_stderr
            sys.argv, sys.path[:] = saved_argv, saved_path
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_env)
    if torch is not None:
        dtype, grad, threads, deterministic = TORCH_DEFAULTS
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        torch.set_printoptions(profile="default")
    return code, out.getvalue(), err.getvalue()


def main():
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        code, stdout, stderr = _run(request["argv"], request.get("env", {}))
        replies.write(json.dumps({"code": code, "stdout": stdout, "stderr": stderr}) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
