"""Makes a copy of the torch-sys crate whose C++ wrapper compiles against another libtorch.

tch's wrapper (libtch/torch_api_generated.cpp) has one C function per ATen operator of the
libtorch it was generated for. Against an older libtorch a few of those operators do not exist
or take other arguments, and the crate does not compile. This copies the crate to DEST, asks the
compiler which wrapper functions fail against LIBTORCH's headers (`g++ -fsyntax-only`, about 10 s
a pass), and replaces only their bodies with an error raised at call time ("not in libtorch
VERSION"), which tch turns into a `TchError` like any libtorch error. Every other function, and
the Rust side, stays as it was. Repeats until the wrapper compiles (at most 4 passes); fails,
naming the errors, when something other than a wrapper function breaks.

    python3 scripts/patch_torch_sys.py TORCH_SYS_SRC DEST LIBTORCH VERSION

Used by scripts/build-for-torch.sh. Prints the stubbed functions, one per line, on stderr.
"""

import os
import re
import shutil
import subprocess
import sys

GENERATED = "libtch/torch_api_generated.cpp"
FAILING = re.compile(r"In function [‘'`]void (atg_\w+)\(")


def failing_functions(path, libtorch, crate):
    """The wrapper functions with a compile error, and the compiler's output."""
    cmd = [
        os.environ.get("CXX", "g++"),
        "-fsyntax-only",
        "-std=c++17",
        "-DGLOG_USE_GLOG_EXPORT",
        f"-I{libtorch}/include",
        f"-I{libtorch}/include/torch/csrc/api/include",
        f"-I{crate}/libtch",
        path,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode == 0:
        return set(), ""
    names, current = set(), None
    for line in out.stderr.splitlines():
        m = FAILING.search(line)
        if m:
            current = m.group(1)
        elif " error: " in line and current:
            names.add(current)
    return names, out.stderr


def stub(source, name, version):
    """`source` with the body of C function `name` replaced by a call-time error."""
    start = re.search(rf"\nvoid {name}\(", source)
    if not start:
        raise SystemExit(f"{name}: not found in {GENERATED}")
    body = source.index("{", start.end())
    end = source.index("\n}\n", body)
    message = f"{name[4:]} is not available in libtorch {version} (tch wrapper stub)"
    return (
        source[: body + 1]
        + f'\n  PROTECT(throw std::runtime_error("{message}");)'
        + source[end:]
    )


def main():
    if len(sys.argv) != 5:
        raise SystemExit(__doc__)
    src, dest, libtorch, version = sys.argv[1:]
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)
    path = os.path.join(dest, GENERATED)
    stubbed = []
    for _ in range(4):
        names, errors = failing_functions(path, libtorch, dest)
        if not errors:
            break
        if not names:
            raise SystemExit(f"the wrapper fails to compile outside its functions:\n{errors[-4000:]}")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for name in sorted(names):
            source = stub(source, name, version)
            stubbed.append(name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
    else:
        raise SystemExit(f"the wrapper still fails after stubbing {len(stubbed)} functions")
    # torch_api.cpp is hand-written: it must compile as is.
    _, errors = failing_functions(os.path.join(dest, "libtch/torch_api.cpp"), libtorch, dest)
    if errors:
        raise SystemExit(f"libtch/torch_api.cpp does not compile against {libtorch}:\n{errors[-4000:]}")
    for name in stubbed:
        print(name, file=sys.stderr)
    print(f"{len(stubbed)} wrapper functions stubbed for libtorch {version}", file=sys.stderr)


if __name__ == "__main__":
    main()
