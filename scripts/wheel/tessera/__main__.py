"""The ``tessera`` command: runs the packaged binary on the installed torch's libtorch."""

import importlib.util
import os
import sys

from . import binary


def torch_lib_dir() -> str:
    """The ``lib`` folder of the installed ``torch`` package, found without importing torch."""
    spec = importlib.util.find_spec("torch")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for folder in locations:
        lib = os.path.join(folder, "lib")
        if os.path.isfile(os.path.join(lib, "libtorch_cpu.so")):
            return lib
    sys.exit(
        "tessera: no torch package with libtorch (torch/lib/libtorch_cpu.so) in this Python "
        "environment; install the one tessera was built for: pip install torch==@TORCH_VERSION@"
    )


def main() -> None:
    exe = binary()
    env = dict(os.environ)
    # The binary's rpath names the build machine's libtorch; here it runs on this environment's.
    previous = env.get("LD_LIBRARY_PATH")
    env["LD_LIBRARY_PATH"] = torch_lib_dir() + (os.pathsep + previous if previous else "")
    try:
        os.execve(exe, [exe, *sys.argv[1:]], env)
    except OSError as e:
        sys.exit(f"tessera: cannot run {exe}: {e}")


if __name__ == "__main__":
    main()
