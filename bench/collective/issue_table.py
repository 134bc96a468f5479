#!/usr/bin/env python3
"""Issue 19's table from one device call: kiln-bench allreduce --heap (eager decisions, and optionally a run with
graph decisions) and PyTorch's anchor (../shared/device/allreduce_anchor.py, one JSON object per line).

Per size: bytes, kiln_eager_us, nccl_eager_us (NCCL through kiln's harness on the same tensors), torch_nccl_eager_us
(the anchor's), symm_mem_best_us (the faster of PyTorch's symmetric-memory one-shot and two-shot), kiln_graph_us,
nccl_graph_us, and kiln's eager time over the best peer's (< 1: kiln faster). Prints a Markdown table, writes JSON,
and a plot when matplotlib is there.
"""
import argparse
import json


def load_anchor(path):
    rows = {}
    if not path:
        return rows
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        rows[r["KiB"] * 1024] = r
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--eager", required=True, help="kiln-bench allreduce --heap JSON (eager decisions)")
    ap.add_argument("--graph", help="kiln-bench allreduce --heap --graph JSON (graph decisions)")
    ap.add_argument("--anchor", help="allreduce_anchor.py output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--plot")
    a = ap.parse_args()
    eager = json.load(open(a.eager))
    graph = {r["bytes"]: r for r in json.load(open(a.graph))["sizes"]} if a.graph else {}
    anchor = load_anchor(a.anchor)
    rows = []
    for r in eager["sizes"]:
        b = r["bytes"]
        an = anchor.get(b, {})
        symm = [v for v in (an.get("symm_one_shot_us"), an.get("symm_two_shot_us")) if v is not None]
        g = graph.get(b, r)
        row = {
            "bytes": b,
            "kiln_eager_us": r.get("kiln_eager_us"),
            "nccl_eager_us": r.get("nccl_eager_us"),
            "torch_nccl_eager_us": an.get("nccl_us"),
            "symm_mem_best_us": min(symm) if symm else None,
            "kiln_eager_out_of_place_us": r.get("kiln_eager_out_of_place_us"),
            "kiln_eager_staged_us": r.get("kiln_eager_staged_us"),
            "kiln_graph_us": g.get("kiln_graph_us"),
            "nccl_graph_us": g.get("nccl_graph_us"),
            "torch_nccl_graph_us": an.get("nccl_graph_us"),
            "kiln_chosen": r.get("chosen"),
            "call": eager.get("headline_call"),
        }
        peers = [v for v in (row["nccl_eager_us"], row["torch_nccl_eager_us"], row["symm_mem_best_us"]) if v]
        row["eager_over_best_peer"] = row["kiln_eager_us"] / min(peers) if peers and row["kiln_eager_us"] else None
        rows.append(row)
    out = {"world": eager.get("world"), "environment": eager.get("environment"), "headline_call": eager.get("headline_call"),
           "graph_decisions_from": a.graph or a.eager, "rows": rows}
    json.dump(out, open(a.out, "w"), indent=1)

    def f(v):
        return "-" if v is None else f"{v:.1f}"
    print("| bytes | kiln eager | kiln eager out of place | kiln eager staged | NCCL eager | torch NCCL eager | "
          "symm-mem best | kiln graph | NCCL graph | eager / best peer |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ratio = "-" if r["eager_over_best_peer"] is None else f"{r['eager_over_best_peer']:.2f}"
        print(f"| {r['bytes']} | {f(r['kiln_eager_us'])} | {f(r['kiln_eager_out_of_place_us'])} | "
              f"{f(r['kiln_eager_staged_us'])} | {f(r['nccl_eager_us'])} | {f(r['torch_nccl_eager_us'])} | "
              f"{f(r['symm_mem_best_us'])} | {f(r['kiln_graph_us'])} | {f(r['nccl_graph_us'])} | {ratio} |")
    if a.plot:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception as ex:  # the table and JSON are the record; the plot is a convenience
            print("no plot:", ex)
            return
        x = [r["bytes"] for r in rows]
        fig, ax = plt.subplots(figsize=(9, 5))
        for key, label in [("kiln_eager_us", "kiln eager"), ("nccl_eager_us", "NCCL eager"),
                           ("symm_mem_best_us", "PyTorch symm-mem best (eager)"), ("kiln_graph_us", "kiln graph"),
                           ("nccl_graph_us", "NCCL graph")]:
            pts = [(xx, r[key]) for xx, r in zip(x, rows) if r[key]]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes (bf16)")
        ax.set_ylabel("µs per all-reduce")
        ax.set_title(f"all-reduce, {out['world']} GPUs, {out['headline_call']} heap tensors")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        fig.savefig(a.plot, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    main()
