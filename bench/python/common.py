"""Shared by the Python benchmarks: device/commit info, interleaved timing, table + JSON output."""
import json
import os
import statistics
import subprocess
import time


def environment():
    import torch
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    return {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "commit": commit or os.environ.get("KILN_COMMIT", "")}


def host_us(fn, calls=200):
    """Mean host time of one call, µs: the time to return, not the kernel's (no sync inside the loop)."""
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def interleaved(variants, rounds, measure):
    """measure(fn) for each variant, interleaved over rounds (a warm machine drifts); median per variant."""
    samples = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(measure(fn))
    return {name: {"median": statistics.median(v), "min": min(v), "max": max(v)} for name, v in samples.items()}


def table(rows, columns):
    widths = [max(len(str(c)), *(len(f"{r.get(c, '')}") for r in rows)) for c in columns]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(f"{r.get(c, '')}".ljust(w) for c, w in zip(columns, widths)) for r in rows]
    return "\n".join(lines)


def write_json(path, payload):
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {path}")
