#!/usr/bin/env python3
"""Factorize golden cases on OTHER inputs, from a re-statement of Composer 0.32.1's solver.

Composer itself is not installed here, so this file restates, operation for operation, the
parts of ``composer/algorithms/factorize/factorize_core.py`` and ``factorize_modules.py`` that
``tests/golden/generate.py`` records in the solver sections of the ``factorize`` case
(``_lstsq``, ``_svd_initialize``, ``factorize_matrix``, ``factorize_conv2d``,
``FactorizedLinear`` / ``FactorizedConv2d`` ``solution_for_rank`` + ``apply_solution``), with
the same precision (float32) and the same least-squares driver (``gels``, which
``generate.py`` forces for this case). It then writes a complete ``factorize`` golden case in
which the ``matrix/*``, ``conv/*`` and ``set_rank/*`` tensors and results come from new seeds
and shapes (the surgery part is copied from the repository's golden file: it has no solver),
so the Rust golden test runs unchanged on them:

    PYTHONPATH=<torch> python3 plugins/factorize/tests/composer_reference.py --out /tmp/fz
    for d in /tmp/fz/*/; do TESSERA_GOLDEN_DIR=$d cargo test --release -p factorize --test golden; done

or ``--cargo`` to run that loop itself. Like ``generate.py`` it keeps torch/MKL on their AVX2
kernels (and one thread), so its float32 rounding differs from the Rust test's (which runs
libtorch with its default kernels): the comparison is between two different roundings of the
same computation, as with Composer's real files. Only torch is needed (no numpy, no
safetensors package).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import platform
import struct
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

if platform.machine().lower() in ('x86_64', 'amd64'):
    for _k, _v in (('ATEN_CPU_CAPABILITY', 'avx2'), ('ONEDNN_MAX_CPU_ISA', 'AVX2'), ('MKL_ENABLE_INSTRUCTIONS', 'AVX2')):
        os.environ.setdefault(_k, _v)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[3]

# ----------------------------------------------------------------------------------------------
# safetensors, read and written with torch alone
# ----------------------------------------------------------------------------------------------
_DTYPES = {'F32': torch.float32, 'F64': torch.float64, 'I64': torch.int64, 'I32': torch.int32,
           'U8': torch.uint8, 'BF16': torch.bfloat16, 'F16': torch.float16, 'BOOL': torch.bool}
_NAMES = {v: k for k, v in _DTYPES.items()}


def read_safetensors(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    raw = path.read_bytes()
    (n,) = struct.unpack('<Q', raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop('__metadata__', {})
    data = raw[8 + n:]
    out = OrderedDict()
    for name, e in header.items():
        a, b = e['data_offsets']
        dt = _DTYPES[e['dtype']]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=dt) if b > a else torch.zeros(0, dtype=dt)
        out[name] = t.reshape(e['shape']).clone()
    return out, meta


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], meta: dict):
    header, chunks, off = OrderedDict(), [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        nbytes = t.numel() * t.element_size()
        chunks.append(ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b'')
        header[name] = dict(dtype=_NAMES[t.dtype], shape=list(t.shape), data_offsets=[off, off + nbytes])
        off += nbytes
    header['__metadata__'] = meta
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    path.write_bytes(struct.pack('<Q', len(h)) + h + b''.join(chunks))


# ----------------------------------------------------------------------------------------------
# Composer 0.32.1's solver, restated (factorize_core.py / factorize_modules.py)
# ----------------------------------------------------------------------------------------------
def _lstsq(A, B):
    # Composer: torch.linalg.lstsq(A, B).solution; generate.py forces driver='gels' for this case
    return torch.linalg.lstsq(A, B, driver='gels').solution


def _nmse(Y, Y_hat):
    d = Y - Y_hat
    return float((d * d).mean() / Y.var())


def _svd_initialize(Wa, Wb, k):
    W = Wa if Wb is None else Wa @ Wb
    U, s, Vt = torch.linalg.svd(W, full_matrices=False)
    Wa_svd, Wb_svd = U[:, :k], Vt[:k]
    s_sqrt = torch.sqrt(s[:k])
    Wa_svd *= s_sqrt
    Wb_svd *= s_sqrt.reshape(-1, 1)
    return Wa_svd, Wb_svd


class Solution:

    def __init__(self):
        self.Wa = self.Wb = self.bias = None
        self.rank = -1
        self.nmse = 0.0


def factorize_matrix(X, Y, Wa, Wb=None, bias=None, rank=.25, n_iters=3):
    X, Y, Wa = X.detach(), Y.detach(), Wa.detach()
    Wb = Wb.detach() if Wb is not None else None
    if rank < 1:
        rank = min(int(rank * X.shape[1]), Wa.shape[1])
    k = int(rank)
    sol = Solution()
    original_bias = None
    if bias is not None:
        original_bias = bias.detach()
        Y = Y - original_bias
        sol.bias = original_bias
    if k >= X.shape[1] or k >= Y.shape[1]:
        sol.Wa = _lstsq(X, Y)
        return sol
    if k >= Wa.shape[1]:
        sol.Wa, sol.Wb = Wa, Wb
        return sol
    Wa, Wb = _svd_initialize(Wa, Wb, k)
    Ya = _lstsq(X, Y)
    for _ in range(n_iters):
        Wb = _lstsq(X @ Wa, Y)
        Wa = _lstsq(Wb.T, Ya.T).T
    sol.Wa, sol.Wb, sol.rank = Wa, Wb, k
    Y_hat = (X @ Wa) @ Wb
    bias = (Y - Y_hat).mean(dim=0)
    if original_bias is not None:
        bias += original_bias
    sol.bias = bias
    Y_hat += bias
    sol.nmse = _nmse(Y, Y_hat)
    return sol


def factorize_conv2d(X, Wa, Wb=None, rank=.25, biasA=None, biasB=None, n_iters=3, padding=0):
    X, Wa = X.detach(), Wa.detach()
    ks = Wa.shape[2:]
    X_mat = F.unfold(X, kernel_size=ks, padding=padding).transpose(1, 2)
    X_mat = X_mat.reshape(-1, X_mat.shape[2])
    Wa = Wa.reshape(Wa.shape[0], -1).T
    Y_mat = X_mat @ Wa
    if biasA is not None:
        Y_mat += biasA.detach()
    if Wb is not None:
        Wb = Wb.detach().reshape(Wb.shape[0], -1).T
        Y_mat = Y_mat @ Wb
        if biasB is not None:
            Y_mat += biasB.detach()
    ret = factorize_matrix(X_mat, Y_mat, Wa, Wb, rank=rank, n_iters=n_iters)
    to_w = lambda m, kk: None if m is None else m.T.reshape(m.shape[1], -1, *kk)  # noqa: E731
    ret.Wa, ret.Wb = to_w(ret.Wa, ks), to_w(ret.Wb, (1, 1))
    return ret


class FactorizedLinear(nn.Module):
    """Composer's FactorizedLinear (module0: no bias; module1: bias), with set_rank."""

    def __init__(self, in_f, out_f, latent):
        super().__init__()
        self.latent_size = latent
        self.module0 = nn.Linear(in_f, latent, bias=False)
        self.module1 = nn.Linear(latent, out_f, bias=True)

    def forward(self, x):
        return self.module1(self.module0(x))

    def set_rank(self, x, rank):
        target = self(x)
        sol = factorize_matrix(x, target, self.module0.weight.T, self.module1.weight.T, bias=self.module1.bias,
                               rank=rank)
        self.latent_size = sol.rank
        with torch.no_grad():
            self.module1.bias.copy_(sol.bias)
            self.module0.weight = nn.Parameter(sol.Wa.T)
            self.module1.weight = nn.Parameter(sol.Wb.T)


class FactorizedConv2d(nn.Module):
    """Composer's FactorizedConv2d (k x k conv without bias, then 1x1 conv with bias), with set_rank."""

    def __init__(self, cin, cout, k, latent, padding):
        super().__init__()
        self.latent_size, self.padding = latent, padding
        self.module0 = nn.Conv2d(cin, latent, k, padding=padding, bias=False)
        self.module1 = nn.Conv2d(latent, cout, 1, bias=True)

    def forward(self, x):
        return self.module1(self.module0(x))

    def set_rank(self, x, rank):
        sol = factorize_conv2d(x, self.module0.weight, self.module1.weight, rank=rank, biasA=self.module0.bias,
                               biasB=self.module1.bias, padding=self.padding)
        self.latent_size = sol.rank
        with torch.no_grad():
            self.module1.bias.copy_(sol.bias)
            self.module0.weight = nn.Parameter(sol.Wa)
            self.module1.weight = nn.Parameter(sol.Wb)


# ----------------------------------------------------------------------------------------------
# the solver sections of the factorize case, on other seeds and shapes
# ----------------------------------------------------------------------------------------------
def solver_sections(seed: int):
    """The tensors and results of generate.py's matrix/conv/set_rank sections, drawn from `seed`,
    with shapes that vary with the seed (same kinds of problems: correlated inputs, a random
    weight and bias, ranks below, at a fraction of, and at or above the smaller dimension)."""
    g = torch.Generator().manual_seed(seed)
    pick = lambda options: options[int(torch.randint(len(options), (1,), generator=g))]  # noqa: E731
    T, res = OrderedDict(), OrderedDict()

    def add(key, t, role):
        T[key] = (t.detach().contiguous().clone(), role)

    D, M, N = pick([24, 32, 40]), pick([20, 24, 36]), pick([64, 80, 96])
    mix = torch.randn(D, D, generator=g) / math.sqrt(D)
    X = torch.randn(N, D, generator=g) @ (torch.eye(D) + 2 * mix)
    W = torch.randn(D, M, generator=g) / math.sqrt(D)
    b = torch.randn(M, generator=g)
    Y = X @ W + b
    add('matrix/X', X, 'input')
    add('matrix/W', W, 'input')
    add('matrix/bias', b, 'input')
    add('matrix/Y', Y, 'aux')
    mres = OrderedDict()
    r6 = pick([4, 6, 8])
    for rank, n_iters in [(r6, 0), (r6, 1), (r6, 3), (0.25, 3), (min(D, M), 3)]:
        sol = factorize_matrix(X, Y, W, bias=b, rank=rank, n_iters=n_iters)
        tag = f'matrix/rank={rank:g},n_iters={n_iters}'
        add(f'{tag}/Wa', sol.Wa, 'output')
        if sol.Wb is not None:
            add(f'{tag}/Wb', sol.Wb, 'output')
            add(f'{tag}/WaWb', sol.Wa @ sol.Wb, 'aux')
        add(f'{tag}/bias', sol.bias, 'output')
        y_hat = X @ sol.Wa @ sol.Wb + sol.bias if sol.Wb is not None else X @ sol.Wa + sol.bias
        add(f'{tag}/y_hat', y_hat, 'aux')
        mres[tag] = dict(rank=sol.rank, reported_nmse=sol.nmse, recomputed_nmse=float(((Y - y_hat)**2).mean() / Y.var()))
    res['factorize_matrix'] = mres

    cin, cout, hw = pick([6, 8]), pick([12, 16]), pick([6, 7])
    Xc = torch.randn(2, cin, hw, hw, generator=g)
    Wc = torch.randn(cout, cin, 3, 3, generator=g) / math.sqrt(cin * 9)
    bc = torch.randn(cout, generator=g) * 0.1
    add('conv/X', Xc, 'input')
    add('conv/W', Wc, 'input')
    add('conv/biasA', bc, 'input')
    cres = OrderedDict()
    for rank in (pick([3, 4, 5]), 0.1, 0.25):
        sol = factorize_conv2d(Xc, Wc, rank=rank, biasA=bc, padding=1)
        tag = f'conv/rank={rank:g}'
        add(f'{tag}/Wa', sol.Wa, 'output')
        if sol.Wb is not None:
            add(f'{tag}/Wb', sol.Wb, 'output')
            add(f'{tag}/bias', sol.bias, 'output')
            y_hat = F.conv2d(F.conv2d(Xc, sol.Wa, padding=1), sol.Wb, sol.bias)
        else:
            y_hat = F.conv2d(Xc, sol.Wa, padding=1)
        add(f'{tag}/y_hat', y_hat, 'aux')
        y_ref = F.conv2d(Xc, Wc, bc, padding=1)
        cres[tag] = dict(rank=sol.rank, reported_nmse=sol.nmse, recomputed_nmse=float(((y_ref - y_hat)**2).mean() /
                                                                                      y_ref.var()),
                         has_Wb=sol.Wb is not None, has_bias=sol.bias is not None)
    add('conv/y_original', F.conv2d(Xc, Wc, bc, padding=1), 'aux')
    res['factorize_conv2d'] = cres

    torch.manual_seed(seed)
    lin_f, lin_lat, lin_to = pick([48, 64]), pick([12, 16]), pick([4, 6])
    conv_in, conv_out, conv_lat, conv_to = pick([12, 16]), pick([24, 32]), pick([6, 8]), pick([2, 3])
    fl = FactorizedLinear(lin_f, lin_f, lin_lat)
    fc = FactorizedConv2d(conv_in, conv_out, 3, conv_lat, padding=1)
    xl = torch.randn(40, lin_f, generator=g)
    xcv = torch.randn(4, conv_in, 7, 7, generator=g)
    for kind, mod in (('linear', fl), ('conv', fc)):
        for k, v in mod.state_dict().items():
            add(f'set_rank/{kind}/before/{k}', v, 'param')
    add('set_rank/linear/input', xl, 'input')
    add('set_rank/conv/input', xcv, 'input')
    with torch.no_grad():
        add('set_rank/linear/out_before', fl(xl), 'aux')
        add('set_rank/conv/out_before', fc(xcv), 'aux')
    fl.set_rank(xl, lin_to)
    fc.set_rank(xcv, conv_to)
    for kind, mod in (('linear', fl), ('conv', fc)):
        for k, v in mod.state_dict().items():
            add(f'set_rank/{kind}/after/{k}', v, 'output')
    with torch.no_grad():
        add('set_rank/linear/out_after', fl(xl), 'output')
        add('set_rank/conv/out_after', fc(xcv), 'output')
    res['set_rank'] = dict(linear=dict(from_latent=lin_lat, to=lin_to, latent_after=fl.latent_size),
                           conv=dict(from_latent=conv_lat, to=conv_to, latent_after=fc.latent_size))
    return T, res


def write_case(golden_dir: Path, out: Path, seed: int):
    """The repository's factorize case with its solver sections replaced by `seed`'s."""
    meta = json.loads((golden_dir / 'factorize.json').read_text())
    tensors, st_meta = read_safetensors(golden_dir / 'factorize.safetensors')
    solver = ('matrix/', 'conv/', 'set_rank/')
    for k in [k for k in tensors if k.startswith(solver)]:
        del tensors[k]
        del meta['tensors'][k]
    new, results = solver_sections(seed)
    for k, (t, role) in new.items():
        tensors[k] = t
        meta['tensors'][k] = dict(shape=list(t.shape), dtype=str(t.dtype).replace('torch.', ''), role=role)
    meta['results'].update(results)
    meta['notes'] = list(meta.get('notes', [])) + [
        f'solver sections (matrix/, conv/, set_rank/) regenerated by plugins/factorize/tests/composer_reference.py '
        f'with seed {seed} (torch {torch.__version__}, AVX2 kernels), a re-statement of Composer 0.32.1\'s solver']
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / 'factorize.safetensors', tensors, dict(st_meta, source=f'composer_reference.py seed={seed}'))
    (out / 'factorize.json').write_text(json.dumps(meta, indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--out', required=True, help='folder; one sub-folder seed-<n> per seed')
    ap.add_argument('--seeds', default='1-20', help='e.g. 1-20 or 3,5,8')
    ap.add_argument('--golden', default=str(REPO / 'tests' / 'golden'), help='folder of factorize.json/.safetensors')
    ap.add_argument('--cargo', action='store_true', help='run the golden test on every folder written')
    args = ap.parse_args()
    seeds = []
    for part in args.seeds.split(','):
        a, _, b = part.partition('-')
        seeds.extend(range(int(a), int(b or a) + 1))
    failed = []
    for seed in seeds:
        d = Path(args.out) / f'seed-{seed}'
        write_case(Path(args.golden), d, seed)
        if not args.cargo:
            print(f'wrote {d}')
            continue
        env = dict(os.environ, TESSERA_GOLDEN_DIR=str(d))
        for k in ('ATEN_CPU_CAPABILITY', 'ONEDNN_MAX_CPU_ISA', 'MKL_ENABLE_INSTRUCTIONS'):
            env.pop(k, None)  # the Rust side runs with libtorch's default kernels
        r = subprocess.run(['cargo', 'test', '--release', '-p', 'factorize', '--test', 'golden', '-q'], cwd=REPO,
                           env=env, capture_output=True, text=True)
        ok = r.returncode == 0
        print(f'seed {seed}: {"ok" if ok else "FAILED"}', flush=True)
        if not ok:
            failed.append(seed)
            print('\n'.join(l for l in (r.stdout + r.stderr).splitlines() if 'panicked' in l or 'exceeds' in l
                            or l.startswith('test ')))
    if args.cargo:
        print(f'{len(seeds) - len(failed)}/{len(seeds)} seeds passed' + (f'; failed: {failed}' if failed else ''))
        sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
