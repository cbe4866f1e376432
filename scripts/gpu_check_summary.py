"""The end of scripts/gpu-check.sh: reads what its steps left in DETAILS (env.json,
steps.jsonl, results/*.json), prints the figures against the targets and writes
OUT/summary.json with every figure (the raw results too).

    python3 scripts/gpu_check_summary.py DETAILS [OUT]     # OUT: DETAILS by default

Targets (issue 23): Tessera's step time at most 1.0x PyTorch eager's on ResNet-50 (bf16,
channels-last, batch 256); GPT-2 small MFU at least 40 %.
"""

import json
import sys
from pathlib import Path

RESNET_RATIO_TARGET = 1.0
MFU_TARGET = 0.40


def last_json(path):
    """The last line of a file that parses as a JSON object, or None."""
    try:
        lines = path.read_text().strip().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def main():
    out = Path(sys.argv[1])
    dest = Path(sys.argv[2]) if len(sys.argv) > 2 else out
    try:
        env = json.loads((out / "env.json").read_text())
    except (OSError, json.JSONDecodeError):
        env = {}
    steps = []
    if (out / "steps.jsonl").is_file():
        steps = [json.loads(l) for l in (out / "steps.jsonl").read_text().splitlines() if l]
    results = {}
    for path in sorted((out / "results").glob("*.json")):
        value = last_json(path)
        if value is not None:
            results[path.stem] = value
    status = {s["step"]: s for s in steps}

    def ok(name):
        r = results.get(name)
        return r if r is not None and "error" not in r and status.get(name, {}).get("status") == "ok" else None

    figures = {}
    quick = str(env.get("quick", "0")) == "1"
    lines = ["== Figures against the targets"]
    if quick:
        lines.append("QUICK rehearsal: tiny sizes on the rehearsal's device; these figures prove "
                     "that every step runs, they measure nothing (targets not judged)")

    def verdict(met):
        return "not judged (QUICK)" if quick else ("met" if met else "NOT met")

    # ResNet-50: images/s and the step-time ratio against eager.
    t, e, c = ok("resnet50-tessera"), ok("resnet50-eager"), ok("resnet50-compile")
    rn = {}
    for side, r in (("tessera", t), ("eager", e), ("compile", c)):
        if r:
            rn[side] = {"images_per_second": r["images_per_second"], "step_ms": r["step_ms"]}
    if t or e or c:
        any_r = t or e or c
        lines.append(f"ResNet-50 bf16 channels-last, batch {any_r['batch']}, "
                     f"{any_r['size']}x{any_r['size']}:")
        for side in ("tessera", "eager", "compile"):
            v = rn.get(side)
            lines.append(f"  {side:8} " + (f"{v['images_per_second']:9.1f} images/s, step "
                                           f"{v['step_ms']:.1f} ms" if v else "no figure"))
    if t and e:
        ratio = t["step_ms"] / e["step_ms"]
        rn["step_time_ratio_tessera_over_eager"] = ratio
        rn["target_ratio"] = RESNET_RATIO_TARGET
        rn["target_met"] = None if quick else ratio <= RESNET_RATIO_TARGET
        lines.append(f"  step time Tessera / eager: {ratio:.3f}x (target <= "
                     f"{RESNET_RATIO_TARGET:.1f}x: {verdict(rn['target_met'])})")
    if t and c:
        rn["step_time_ratio_tessera_over_compile"] = t["step_ms"] / c["step_ms"]
        lines.append(f"  step time Tessera / torch.compile: {t['step_ms'] / c['step_ms']:.3f}x")
    if rn:
        figures["resnet50"] = rn

    # GPT-2: tokens/s and MFU.
    t, e, c = ok("gpt2-tessera"), ok("gpt2-eager"), ok("gpt2-compile")
    a = ok("gpt2-alibi-tessera")
    g = {}
    for side, r in (("tessera", t), ("eager", e), ("compile", c), ("tessera_alibi", a)):
        if r:
            g[side] = {k: r[k] for k in ("tokens_per_second", "step_ms", "mfu", "achieved_tflops")}
    any_r = t or e or c or a
    if any_r:
        q = any_r["width"] // any_r["heads"]
        lines.append(f"GPT-2 (L={any_r['layers']}, H={any_r['heads']}, C={any_r['width']}, "
                     f"V={any_r['vocab']}) bf16, batch {any_r['batch']} x {any_r['seq']} tokens:")
        formula = (f"MFU = (6*N + 12*L*H*Q*T) * tokens/s / peak, N = {any_r['params_without_wpe']:,} "
                   f"parameters without wpe, L={any_r['layers']}, H={any_r['heads']}, Q={q}, "
                   f"T={any_r['seq']}: {any_r['flops_per_token']:,} FLOPs/token; peak "
                   f"{any_r['peak_tflops']:g} TFLOP/s (H200 dense bf16)")
        g["formula"] = formula
        g["flops_per_token"] = any_r["flops_per_token"]
        g["peak_tflops"] = any_r["peak_tflops"]
        for side in ("tessera", "eager", "compile", "tessera_alibi"):
            v = g.get(side)
            lines.append(f"  {side:13} " + (
                f"{v['tokens_per_second']:10.0f} tokens/s, step {v['step_ms']:.1f} ms, "
                f"{v['achieved_tflops']:.1f} TFLOP/s, MFU {100 * v['mfu']:.1f}%" if v else "no figure"))
        lines.append(f"  {formula}")
    if t:
        g["target_mfu"] = MFU_TARGET
        g["target_met"] = None if quick else t["mfu"] >= MFU_TARGET
        lines.append(f"  Tessera MFU {100 * t['mfu']:.1f}% (target >= {100 * MFU_TARGET:.0f}%: "
                     f"{verdict(g['target_met'])})")
    if t and e:
        g["step_time_ratio_tessera_over_eager"] = t["step_ms"] / e["step_ms"]
        lines.append(f"  step time Tessera / eager: {t['step_ms'] / e['step_ms']:.3f}x")
    if t and c:
        g["step_time_ratio_tessera_over_compile"] = t["step_ms"] / c["step_ms"]
        lines.append(f"  step time Tessera / torch.compile: {t['step_ms'] / c['step_ms']:.3f}x")
    if t and a:
        g["alibi_step_time_ratio"] = a["step_ms"] / t["step_ms"]
        lines.append(f"  with ALiBi / without: {a['step_ms'] / t['step_ms']:.3f}x step time")
    if len(g) > 0:
        figures["gpt2"] = g

    # NCCL and resume.
    if "nccl" in status:
        s = status["nccl"]
        figures["nccl"] = {"status": s["status"], "backend_in_log": s["note"],
                           **({"run": results["nccl"]} if "nccl" in results else {})}
        lines.append(f"NCCL, 1 rank: {s['status']} ({s['note']})")
    if "resume" in status:
        res = {"status": status["resume"]["status"], "mode": status["resume"]["note"]}
        for other in ("resumed", "straight-b"):
            r = results.get(f"resume-straight-a-vs-{other}")
            if r:
                res[other] = r
        if "resume-deterministic" in status:
            res["deterministic"] = status["resume-deterministic"]["status"]
        figures["resume"] = res
        parts = [f"{o}: {'bit-for-bit' if res[o]['identical'] else 'DIFFERS'} "
                 f"({res[o]['tensors'] - res[o]['differing']}/{res[o]['tensors']} tensors equal)"
                 for o in ("resumed", "straight-b") if o in res]
        lines.append(f"resume ({res['mode']}): {res['status']}; " + "; ".join(parts))

    lines.append("")
    lines.append("== Steps")
    for s in steps:
        note = f" ({s['note']})" if s["note"] else ""
        lines.append(f"  {s['step']:22} {s['status']:22} {s['seconds']:4d} s{note}")
    print("\n".join(lines))
    summary = {"env": env, "figures": figures, "steps": steps, "results": results}
    (dest / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
