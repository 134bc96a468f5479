#!/usr/bin/env python3
"""torch.compile's softmax (and eager torch.softmax) over long rows, the peer of kiln's softmax templates.

For rows in 1, 8, 24, 64 and cols in 128256 (Llama-3 vocabulary) and 152064 (Qwen2.5), bf16, dim=-1: the
compiled kernel (Inductor, default mode) is warmed up, then timed as CUDA-graph replays of --launches calls
rotating over enough inputs to exceed L2 three times (the same method bench_norms uses for kiln's kernels),
median of --samples replays. Writes a JSON list of {rows, cols, torch_compile_us, torch_eager_us, err} that
`bench_norms --torch FILE` merges into its long-row records.

Usage: python softmax_torch.py --json OUT.json [--samples 15] [--launches 50]
"""
import argparse
import json
import math
import statistics

import torch


def graph_time_us(fn, inputs, launches, samples):
    # Capture `launches` calls rotating over the inputs; replay and time with events.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for x in inputs[:3]:
            fn(x)  # warm-up (compiles, autotunes) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(launches):
            fn(inputs[i % len(inputs)])
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3 / launches)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--launches", type=int, default=50)
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    eager = lambda t: torch.softmax(t, dim=-1)  # noqa: E731
    out = []
    for cols in (128256, 152064):
        for rows in (1, 8, 24, 64):
            nbytes = rows * cols * 2
            sets = max(2, min(64, math.ceil(3 * l2 / nbytes)))
            # One static compilation per shape (as a model with fixed decode sizes gets), no dynamic shapes.
            compiled = torch.compile(lambda t: torch.softmax(t, dim=-1), dynamic=False)
            inputs = [torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16) * 4 for _ in range(sets)]
            ref = torch.softmax(inputs[0].double(), dim=-1)
            got = compiled(inputs[0]).double()
            err = ((got - ref).norm() / ref.norm()).item()
            rec = {"rows": rows, "cols": cols, "dtype": "bf16", "err": err,
                   "torch_compile_us": graph_time_us(compiled, inputs, args.launches, args.samples),
                   "torch_eager_us": graph_time_us(eager, inputs, args.launches, args.samples),
                   "torch": torch.__version__}
            print(json.dumps(rec), flush=True)
            out.append(rec)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
