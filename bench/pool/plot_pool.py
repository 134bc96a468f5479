#!/usr/bin/env python3
"""Plots the scaling curves of a `kiln-bench pool` JSON (kernels/s and parallel efficiency against workers,
one line per executor, PCH off and on side by side) and prints its rows as a markdown table.

Usage: plot_pool.py RESULTS.json [--png OUT.png] [--markdown OUT.md] [--title TEXT]
"""
import argparse
import json
import sys

STYLE = {
    "arena": ("tab:blue", "o"),
    "process": ("tab:orange", "s"),
    "threads": ("tab:gray", "^"),
    "inline": ("tab:green", "D"),
    "cpu-reference": ("black", "x"),
}


def rows_by(data):
    out = {}
    for r in data["rows"]:
        out.setdefault((r["executor"], r["pch"]), []).append(r)
    for v in out.values():
        v.sort(key=lambda r: r["workers"])
    return out


def efficiency(rows, key):
    base = next((r for r in rows if r["workers"] == 1), None)
    if not base or not base.get(key):
        return [None] * len(rows)
    return [r[key] / (r["workers"] * base[key]) if r.get(key) else None for r in rows]


def plot(data, png, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = rows_by(data)
    pch_modes = sorted({pch for (_, pch) in groups if _ != "cpu-reference"})
    fig, axes = plt.subplots(2, len(pch_modes), figsize=(6.2 * len(pch_modes), 8.5), squeeze=False)
    cores = data["environment"].get("available_cores", "?")
    for col, pch in enumerate(pch_modes):
        rate_ax, eff_ax = axes[0][col], axes[1][col]
        ideal_drawn = False
        for (executor, p), rows in sorted(groups.items()):
            # The CPU-bound reference does not depend on PCH: it goes in every column's efficiency plot.
            if executor != "cpu-reference" and p != pch:
                continue
            color, marker = STYLE.get(executor, ("tab:purple", "v"))
            ws = [r["workers"] for r in rows]
            if executor != "cpu-reference":
                rate_ax.plot(ws, [r["kernels_per_second"] for r in rows], marker=marker, color=color,
                             label=executor)
                if executor == "arena" and rows[0]["workers"] == 1 and not ideal_drawn:
                    one = rows[0]["kernels_per_second"]
                    rate_ax.plot(ws, [w * one for w in ws], "--", color="tab:blue", alpha=0.4,
                                 label="ideal (workers x arena@1)")
                    ideal_drawn = True
            effs = efficiency(rows, "steady_kernels_per_second")
            eff_ax.plot(ws, [e * 100 if e else None for e in effs], marker=marker, color=color,
                        linestyle=":" if executor == "cpu-reference" else "-",
                        label=executor + (" (machine ceiling)" if executor == "cpu-reference" else ""))
        rate_ax.set_xscale("log", base=2)
        rate_ax.set_yscale("log")
        rate_ax.set_xlabel("workers")
        rate_ax.set_ylabel("kernels per second")
        rate_ax.set_title(f"PCH {'on' if pch else 'off'}: throughput (batch wall time)")
        rate_ax.grid(True, which="both", alpha=0.3)
        rate_ax.legend(fontsize=8)
        eff_ax.axhline(85, color="red", linestyle="--", alpha=0.5, label="target 85%")
        eff_ax.set_xscale("log", base=2)
        eff_ax.set_ylim(0, 110)
        eff_ax.set_xlabel("workers")
        eff_ax.set_ylabel("parallel efficiency, % (saturated rate)")
        eff_ax.set_title(f"PCH {'on' if pch else 'off'}: rate / (workers x 1-worker rate)")
        eff_ax.grid(True, which="both", alpha=0.3)
        eff_ax.legend(fontsize=8)
    env = data["environment"]
    fig.suptitle(title or f"kiln compile pool on {env.get('machine', env.get('device', '?'))}: {cores} cores\n"
                 f"NVRTC {env.get('nvrtc', '?')}, commit {env.get('commit', '?')}, {env.get('date', '?')}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def markdown(data):
    lines = ["| executor | pch | workers | kernels | seconds | kernels/s | efficiency | steady kernels/s | "
             "steady efficiency |", "|---|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        def pct(k):
            return f"{100 * r[k]:.0f}%" if k in r else "-"
        pch = "-" if r["executor"] == "cpu-reference" else ("on" if r["pch"] else "off")
        lines.append(f"| {r['executor']} | {pch} | {r['workers']} | {r['kernels']} | {r['seconds']:.2f} | "
                     f"{r['kernels_per_second']:.2f} | {pct('efficiency')} | "
                     f"{r['steady_kernels_per_second']:.2f} | {pct('steady_efficiency')} |")
    lines += ["", "| executor | workers | submit-to-start median (us) | p90 | completion median (us) | p90 |",
              "|---|---|---|---|---|---|"]
    for o in data.get("overhead", []):
        s, c = o["submit_to_start_us"], o["completion_us"]
        lines.append(f"| {o['executor']} | {o['workers']} | {s['median']:.1f} | {s['p90']:.1f} | "
                     f"{c['median']:.1f} | {c['p90']:.1f} |")
    st = data.get("worker_startup_seconds", {})
    if st.get("n"):
        lines += ["", f"Worker start-up (spawn to hello): median {1e3 * st['median']:.1f} ms, "
                      f"p90 {1e3 * st['p90']:.1f} ms over {st['n']} workers."]
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json")
    ap.add_argument("--png")
    ap.add_argument("--markdown")
    ap.add_argument("--title")
    a = ap.parse_args()
    with open(a.json) as f:
        data = json.load(f)
    if a.png:
        plot(data, a.png, a.title)
    md = markdown(data)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)


if __name__ == "__main__":
    main()
