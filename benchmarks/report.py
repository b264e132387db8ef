"""Turn a results dict (see engine.py / run.py) into Markdown: the throughput table, convolution
efficiency, start-up times, the Darknet reference, the targets of issue #5 (met or missed, and by how
much) and the per-layer hotspots."""
from __future__ import annotations

from collections import defaultdict

# Targets (issue #5), all on 2 cores and against PyTorch's faster memory layout.
TRAIN_RATIO = 1.0
INFER_B1_RATIO = 1.0
INFER_BIG_RATIO = 0.8
CONV_PEAK_SHARE = 0.5
WARM_START_S = 1.5
COLD_START_S = 30.0


def _num(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _ips(c: dict) -> str:
    if "error" in c:
        return "error"
    if "images_per_s" not in c:
        return "–"
    lo, hi = c["phase_batch"] / c["max_s"], c["phase_batch"] / c["min_s"]
    return f"{_num(c['images_per_s'])} ({_num(lo)}–{_num(hi)})"


def _peer_name(kind: str) -> str:
    return {"torch": "NCHW", "torch-cl": "channels_last"}.get(kind, kind)


def _peak(results: dict) -> float | None:
    return (results.get("sgemm") or {}).get("numpy_gflops")


def _phase_peak(results: dict, ph: dict) -> float | None:
    """The sgemm rate to compare a phase with: the one measured during that phase (same machine
    load), else the suite's."""
    return ph.get("sgemm_gflops") or _peak(results)


def throughput_table(results: dict) -> list[str]:
    lines = ["| network | phase | darkpy img/s (min–max) | PyTorch img/s (min–max), layout | darkpy / PyTorch "
             "| darkpy GFLOP/s (% of sgemm) | peak RSS MB darkpy / PyTorch | outputs equal |",
             "|---|---|---|---|---|---|---|---|"]
    for net in results["networks"]:
        for ph in net["phases"]:
            cs = ph["contenders"]
            for c in cs.values():
                c["phase_batch"] = ph["batch"]
            d = cs.get("darkpy", {})
            peer = ph.get("peer")
            t = cs.get(peer, {}) if peer else {}
            torch_cell = f"{_ips(t)}, {_peer_name(peer)}" if peer else _torch_missing(ph)
            ratio = f"**{ph['ratio']:.2f}×**" if "ratio" in ph else "–"
            gf = "–"
            peak = _phase_peak(results, ph)
            if "gflops" in d:
                share = f" ({100 * d['gflops'] / peak:.0f} %)" if peak else ""
                gf = f"{_num(d['gflops'])}{'*' if ph['mode'] == 'train' else ''}{share}"
            rss = f"{d.get('maxrss_mb', 0):.0f} / " + (f"{t.get('maxrss_mb', 0):.0f}" if t else "–")
            lines.append(f"| {net['name']} | {ph['phase']} | {_ips(d)} | {torch_cell} | {ratio} | {gf} | {rss} "
                         f"| {_check_cell(ph)} |")
            for c in cs.values():
                c.pop("phase_batch", None)
    lines.append("")
    lines.append("GFLOP/s counts Darknet's FLOPs (convolutional and connected layers); \\* training counts "
                 "3× the forward FLOPs (forward, input gradient, weight gradient). The % compares with numpy's "
                 "sgemm measured during the same phase (so under the same machine load). darkpy computes "
                 "3×3 stride-1 convolutions by Winograd F(2×2, 3×3), which needs 2.25× fewer multiplications "
                 "than the count, so those layers can exceed 100 % of sgemm (PyTorch's oneDNN may do the "
                 "same).")
    return lines


def _torch_missing(ph: dict) -> str:
    if ph.get("torch_skipped"):
        return f"not translated ({ph['torch_skipped']})"
    errs = [k for k, c in ph["contenders"].items() if k != "darkpy" and "error" in c]
    return "error (" + ", ".join(errs) + ")" if errs else "–"


def _check_cell(ph: dict) -> str:
    checks = ph.get("checks") or {}
    if not checks:
        return "–"
    worst = max(c.get("max_rel_err", float("inf")) for c in checks.values())
    ok = all(c["ok"] for c in checks.values())
    n = max(c.get("outputs_compared", 0) for c in checks.values())
    what = f"{n} output{'s' if n != 1 else ''}"
    cell = f"{'yes' if ok else '**NO**'} ({what}, {worst:.1e})"
    losses = [c["train_loss"] for c in checks.values() if "train_loss" in c]
    if losses and not losses[0]["compared"]:
        cell += "; loss not compared (dropout)"
    return cell


def conv_table(results: dict) -> list[str]:
    lines = ["| network | phase | darkpy conv GFLOP/s | sgemm GFLOP/s (that phase, else the suite's) "
             "| darkpy % of sgemm | PyTorch conv GFLOP/s |", "|---|---|---|---|---|---|"]
    for net in results["networks"]:
        for ph in net["phases"]:
            if "conv_forward_gflops" not in ph:
                continue
            g, peak = ph["conv_forward_gflops"], _phase_peak(results, ph)
            share = f"{100 * g / peak:.0f} %" if peak else "–"
            tg = ph.get("torch_conv_forward_gflops")
            lines.append(f"| {net['name']} | {ph['phase']} | {g:.1f} | {peak or float('nan'):.0f} | {share} "
                         f"| {f'{tg:.1f}' if tg else '–'} |")
    return lines


def startup_lines(s: dict | None) -> list[str]:
    if not s:
        return ["(not run)"]
    if "skipped" in s:
        return [f"skipped: {s['skipped']}"]
    lines = ["| what | seconds | target |", "|---|---|---|",
             f"| cold start (fresh kernel cache), `{s['command']}` | {s['cold_s']:.1f} "
             f"(says it compiles: {'yes' if s['cold_says_compiling'] else '**no**'}) "
             f"| ≤ {COLD_START_S:.0f}, and says so |",
             f"| warm start, same command (median of {len(s['warm_samples_s'])}) | {s['warm_s']:.2f} "
             f"| ≤ {WARM_START_S} |"]
    for cmd, r in s["no_kernel_commands"].items():
        lines.append(f"| `{cmd}` | {r['s']:.2f} (kernels compiled: {r['compiled']}) | compiles none |")
    return lines


def darknet_lines(d: dict | None) -> list[str]:
    if not d:
        return ["(not run)"]
    if "skipped" in d:
        return [f"skipped: {d['skipped']}"]
    lines = [f"Executable: `{d['executable']}` (`darknet speed`, batch 1, same thread count via OMP_NUM_THREADS)",
             "", "| network | Darknet img/s |", "|---|---|"]
    for name, r in d["networks"].items():
        lines.append(f"| {name} | {r['images_per_s']:.3g} |" if "images_per_s" in r else f"| {name} | error |")
    return lines


def targets(results: dict) -> list[str]:
    """Each target of issue #5 with what was measured; a missed one says by how much."""
    out = []

    def mark(ok: bool | None, text: str) -> None:
        out.append(f"- {'met' if ok else '**missed**' if ok is not None else 'n/a'}: {text}")

    for net in results["networks"]:
        for ph in net["phases"]:
            if "ratio" not in ph:
                continue
            r = ph["ratio"]
            if ph["mode"] == "train":
                goal = TRAIN_RATIO
            elif ph["batch"] == 1:
                goal = INFER_B1_RATIO
            else:
                goal = INFER_BIG_RATIO
            label = f"{net['name']} {ph['phase']}: darkpy/PyTorch {r:.2f}× (target ≥ {goal}×)"
            if r < goal:
                label += f", short by {100 * (1 - r / goal):.0f} % (needs {goal / r:.1f}× faster)"
            mark(r >= goal, label)
    for net in results["networks"]:
        for ph in net["phases"]:
            peak = _phase_peak(results, ph)
            if "conv_forward_gflops" in ph and peak and ph["batch"] >= 64:
                share = ph["conv_forward_gflops"] / peak
                mark(share >= CONV_PEAK_SHARE, f"{net['name']} {ph['phase']} conv forward at "
                     f"{100 * share:.0f} % of the sgemm rate (target ≥ {100 * CONV_PEAK_SHARE:.0f} %)")
    for net in results["networks"]:
        for ph in net["phases"]:
            peer = ph.get("peer")
            d, t = ph["contenders"].get("darkpy", {}), ph["contenders"].get(peer or "", {})
            if "maxrss_mb" in d and "maxrss_mb" in t:
                ok = d["maxrss_mb"] <= t["maxrss_mb"]
                extra = "" if ok else f", {100 * (d['maxrss_mb'] / t['maxrss_mb'] - 1):.0f} % over"
                if not ok and d.get("darkpy_buffers_mb"):
                    extra += " (darkpy allocates " + ", ".join(
                        f"{k} {v:.0f}" for k, v in d["darkpy_buffers_mb"].items()) + " MB)"
                mark(ok, f"{net['name']} {ph['phase']} peak RSS {d['maxrss_mb']:.0f} MB vs PyTorch "
                     f"{t['maxrss_mb']:.0f} MB{extra}")
    s = results.get("startup") or {}
    if "warm_s" in s:
        mark(s["warm_s"] <= WARM_START_S, f"warm start {s['warm_s']:.2f} s (target ≤ {WARM_START_S} s)")
        mark(s["cold_s"] <= COLD_START_S and s["cold_says_compiling"],
             f"cold start {s['cold_s']:.1f} s (target ≤ {COLD_START_S:.0f} s), says it is compiling: "
             f"{'yes' if s['cold_says_compiling'] else 'no'}")
        for cmd, r in s["no_kernel_commands"].items():
            mark(r["compiled"] == 0 and r["rc"] == 0, f"`{cmd}` compiled {r['compiled']} kernel files (exit {r['rc']})")
    return out


def hotspots(results: dict, top: int = 8) -> list[str]:
    """Where darkpy loses most time to PyTorch, per layer and per layer kind (inference phases),
    and darkpy's own training profile (forward / backward / update per kind)."""
    lines = []
    rows = []
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for net in results["networks"]:
        for ph in net["phases"]:
            for row in ph.get("layers") or []:
                if ph["mode"] != "infer" or "torch_fwd_ms" not in row:
                    continue
                if row["darkpy_fwd_ms"] > row["torch_fwd_ms"]:
                    rows.append((row["darkpy_fwd_ms"] - row["torch_fwd_ms"], net["name"], ph["phase"], row))
                k = by_kind[row["kind"]]
                k[0] += row["darkpy_fwd_ms"]
                k[1] += row["torch_fwd_ms"]
    if rows:
        lines += ["Per layer kind, all networks and inference phases with per-layer timing (sums of "
                  "per-layer forward times):", "",
                  "| layer kind | darkpy ms | PyTorch ms | darkpy / PyTorch time |", "|---|---|---|---|"]
        for kind, (d, t) in sorted(by_kind.items(), key=lambda kv: kv[1][1] - kv[1][0]):
            ratio = f"{d / t:.1f}×" if t > 0 else "–"
            lines.append(f"| {kind} | {d:.0f} | {t:.0f} | {ratio} |")
        lines += ["", f"The {top} layers where darkpy loses the most time:", "",
                  "| network | phase | layer | output (c, h, w) | MFLOP | darkpy ms | PyTorch ms | darkpy GFLOP/s |",
                  "|---|---|---|---|---|---|---|---|"]
        for gap, name, phase, row in sorted(rows, key=lambda r: -r[0])[:top]:
            gf = row["mflop"] / row["darkpy_fwd_ms"] if row["darkpy_fwd_ms"] > 0 and row["mflop"] else 0
            lines.append(f"| {name} | {phase} | {row['index']} {row['kind']} | {tuple(row['out_shape'])} | "
                         f"{row['mflop']:.0f} | {row['darkpy_fwd_ms']:.1f} | {row['torch_fwd_ms']:.1f} | "
                         f"{gf:.1f} |")
    train_rows = []
    for net in results["networks"]:
        for ph in net["phases"]:
            if ph["mode"] == "train" and ph.get("layers"):
                kinds: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
                for row in ph["layers"]:
                    kinds[row["kind"]][0] += row.get("darkpy_fwd_ms", 0.0)
                    kinds[row["kind"]][1] += row.get("darkpy_bwd_ms", 0.0)
                total = sum(f + b for f, b in kinds.values())
                parts = ", ".join(f"{k} {f:.0f}+{b:.0f} ms" for k, (f, b) in
                                  sorted(kinds.items(), key=lambda kv: -sum(kv[1])) if f + b >= 0.02 * total)
                train_rows.append(f"- {net['name']} {ph['phase']} (forward+backward per kind, total "
                                  f"{total:.0f} ms): {parts}")
    if train_rows:
        lines += ["", "darkpy's training step by layer kind:", ""] + train_rows
    return lines or ["(no per-layer data: run with per-layer timing)"]


def layer_text(net: dict, ph: dict) -> str:
    """A plain-text per-layer table for one phase (`python -m benchmarks.run --layers CFG`)."""
    rows = ph.get("layers") or []
    train = ph["mode"] == "train"
    head = f"{net['name']} {ph['phase']}"
    cols = "  idx kind             output (c,h,w)        MFLOP   darkpy fwd ms" + (
        "  darkpy bwd ms" if train else "   torch fwd ms   ratio   darkpy GFLOP/s")
    lines = [head, cols]
    for r in rows:
        shape = "x".join(str(v) for v in r.get("out_shape", [])) if r["index"] is not None else ""
        idx = f"{r['index']:5d}" if r["index"] is not None else "    -"
        line = f"{idx} {r['kind']:<16} {shape:<18} {r.get('mflop', 0):9.1f} {r['darkpy_fwd_ms']:14.2f}"
        if train:
            line += f" {r.get('darkpy_bwd_ms', 0):14.2f}"
        elif "torch_fwd_ms" in r:
            t = r["torch_fwd_ms"]
            ratio = r["darkpy_fwd_ms"] / t if t > 0 else float("inf")
            gf = r.get("mflop", 0) / r["darkpy_fwd_ms"] if r["darkpy_fwd_ms"] > 0 else 0
            line += f" {t:14.2f} {ratio:7.1f}x {gf:14.1f}"
        lines.append(line)
    total_d = sum(r["darkpy_fwd_ms"] + r.get("darkpy_bwd_ms", 0) for r in rows)
    total_t = sum(r.get("torch_fwd_ms", 0) for r in rows)
    lines.append(f"      total darkpy {total_d:.1f} ms" + (f", torch {total_t:.1f} ms" if total_t else ""))
    return "\n".join(lines)


def machine_line(results: dict) -> str:
    m = results["machine"]
    v = m["versions"]
    blas = (results.get("sgemm") or {}).get("blas") or {}
    peak = _peak(results)
    tpk = (results.get("sgemm") or {}).get("torch_gflops")
    load = f"{m['loadavg_start'][0]:.1f} at the start, {m.get('loadavg_end', [float('nan')])[0]:.1f} at the end"
    return (f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gb']} GB; {m['threads']} threads for each "
            f"framework; Python {v['python']}, numpy {v['numpy']}, numba {v['numba']}, torch {v.get('torch')}; "
            f"BLAS {blas.get('internal_api')} {blas.get('version')} ({blas.get('architecture')} kernels). "
            f"sgemm peak at {m['threads']} threads: {peak or float('nan'):.0f} GFLOP/s through numpy"
            + (f", {tpk:.0f} through torch" if tpk else "") + f". Load average {load} (the machine is shared: "
            "samples alternate between frameworks, so load slows both alike, but absolute numbers move).")


def summary_block(results: dict) -> str:
    """The machine and the throughput table, for benchmarks/README.md."""
    return "\n".join([f"From `{results['command']}`, {results['machine']['date']}. " + machine_line(results),
                      "", *throughput_table(results), "",
                      "Targets, hotspots and start-up times: [RESULTS.md](RESULTS.md)."])


def markdown(results: dict) -> str:
    m = results["machine"]
    lines = [
        "# darkpy benchmark results",
        "",
        f"Generated by `{results['command']}` on {m['date']}.",
        "",
        machine_line(results),
        "",
        "Every phase first checks that darkpy and PyTorch give the same outputs (every layer at batch 1; "
        + ("otherwise the heads and the logits feeding a softmax head" if results.get("check_logits")
           else "otherwise the heads") +
        "; the cell gives the largest difference relative to the output's magnitude), "
        "then times them alternately: median images/s over the samples, min–max in brackets. PyTorch is "
        "timed in NCHW and channels_last; the faster one is the peer of the ratio.",
        "",
        "## Throughput",
        "",
        *throughput_table(results),
        "",
        "## Convolution layers, forward pass (the target is for batch 64)",
        "",
        *conv_table(results),
        "",
        "## Start-up of the `darkpy` command",
        "",
        *startup_lines(results.get("startup")),
        "",
        "## Darknet C reference",
        "",
        *darknet_lines(results.get("darknet")),
        "",
        "## Targets (issue #5)",
        "",
        *targets(results),
        "",
        "## Where the time goes",
        "",
        *hotspots(results),
        "",
    ]
    return "\n".join(lines)
