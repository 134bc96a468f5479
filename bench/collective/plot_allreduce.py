#!/usr/bin/env python3
"""Plots a `kiln-bench allreduce --json` file beside the peers' anchor lines (../shared/device/allreduce_anchor.py
output, same machine and call): latency per size (log-log) and bus bandwidth, eager and in CUDA graphs, and
prints a markdown table of kiln's dispatcher against the best peer at each size.

Usage: plot_allreduce.py KILN.json ANCHOR.txt [--png OUT.png] [--markdown OUT.md]
"""
import argparse
import json


def load_anchor(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["KiB"] * 1024] = r
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kiln")
    ap.add_argument("anchor")
    ap.add_argument("--png")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    k = json.load(open(a.kiln))
    peers = load_anchor(a.anchor)
    world = k["world"]
    sizes = [r["bytes"] for r in k["sizes"]]
    ev = lambda r, n: r["eager_us"].get(n) if isinstance(r["eager_us"].get(n), (int, float)) else None
    gr = lambda r, n: r["graph_us"].get(n) if isinstance(r["graph_us"].get(n), (int, float)) else None
    lines = ["| size | kiln chosen | kiln eager µs | kiln graph µs | NCCL eager (kiln) | best peer µs (which) | kiln eager ÷ best peer | kiln graph ÷ best peer |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in k["sizes"]:
        b = r["bytes"]
        p = peers.get(b)
        best = None
        if p:
            cands = {n: p.get(n) for n in ("nccl_us", "nccl_graph_us", "symm_one_shot_us", "symm_two_shot_us") if p.get(n)}
            if cands:
                which = min(cands, key=cands.get)
                best = (cands[which], which.replace("_us", ""))
        d, g = ev(r, "dispatch"), gr(r, "dispatch")
        ratio = f"{d / best[0]:.2f} | {g / best[0]:.2f}" if best and d and g else "— | —"
        size = f"{b // 1024} KiB" if b < 1 << 20 else f"{b >> 20} MiB"
        lines.append(f"| {size} | {r['chosen'][:40]} | {d:.1f} | {g:.1f} | {ev(r, 'nccl'):.1f} | "
                     + (f"{best[0]:.1f} ({best[1]}) | {ratio} |" if best else "— | — | — |"))
    table = "\n".join(lines)
    print(table)
    if a.markdown:
        open(a.markdown, "w").write(table + "\n")
    if a.png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
        series = [("kiln dispatcher, eager", [ev(r, "dispatch") for r in k["sizes"]], "tab:red", "-o"),
                  ("kiln dispatcher, graph", [gr(r, "dispatch") for r in k["sizes"]], "tab:red", "--o"),
                  ("NCCL via kiln, eager", [ev(r, "nccl") for r in k["sizes"]], "tab:blue", "-s"),
                  ("NCCL via kiln, graph", [gr(r, "nccl") for r in k["sizes"]], "tab:blue", "--s"),
                  ("NCCL symmetric memory via kiln, graph", [gr(r, "nccl_symmetric") for r in k["sizes"]],
                   "tab:purple", "--x")]
        ps = sorted(peers)
        for n, c, st in (("nccl_us", "tab:gray", "-^"), ("nccl_graph_us", "tab:gray", "--^"),
                         ("symm_one_shot_us", "tab:green", "-D"), ("symm_two_shot_us", "tab:olive", "-v")):
            xs = [b for b in ps if peers[b].get(n)]
            series.append((f"PyTorch {n[:-3].replace('_', ' ')}", [peers[b][n] for b in xs], c, st, xs))
        for s in series:
            xs = s[4] if len(s) > 4 else sizes
            pts = [(x, y) for x, y in zip(xs, s[1]) if y]
            if not pts:
                continue
            X, Y = zip(*pts)
            ax1.plot(X, Y, s[3], color=s[2], label=s[0], markersize=4)
            ax2.plot(X, [x * 2 * (world - 1) / world / (y * 1e3) for x, y in pts], s[3], color=s[2], markersize=4)
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("message bytes (bf16)")
            ax.grid(True, which="both", alpha=0.3)
        ax1.set_yscale("log")
        ax1.set_ylabel("µs per all-reduce (max over ranks)")
        ax2.set_ylabel("bus bandwidth GB/s")
        ax1.legend(fontsize=7)
        env = k.get("environment", {})
        fig.suptitle(f"all-reduce, {world}x {env.get('device', 'GPU')}, commit {env.get('commit', '?')}"
                     f"{', in place' if k.get('in_place') else ', zero-copy input' if k.get('zero_copy') else ''}")
        fig.tight_layout()
        fig.savefig(a.png, dpi=110)


if __name__ == "__main__":
    main()
