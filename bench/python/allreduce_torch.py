"""Eager all-reduce from Python, per call: kiln.distributed on heap tensors (in place) and on ordinary tensors,
against torch.distributed.all_reduce (NCCL) and PyTorch's symmetric-memory one-shot / two-shot, bf16, 4 KiB to
256 MiB, one process per GPU, all measured in the same run.

    python allreduce_torch.py [--gpus N] [--min-bytes B] [--max-bytes B] [--iters N] [--rounds R] [--json FILE]

Per size and variant: `iters` calls back to back on the current stream between two CUDA events (so host time
per call counts when it exceeds the GPU's), the per-call time's maximum over ranks; `rounds` rounds with the
variants interleaved, the median round reported. Inputs are refreshed before each round; every variant's
result is checked against NCCL's once. kiln is tuned first (decisions cached in --cache-dir: a second run
measures nothing) for the two kinds of call it is timed in.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")


def per_call_us(fn, iters):
    torch.cuda.synchronize()
    dist.barrier()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    t = torch.tensor([start.elapsed_time(stop) * 1000.0 / iters], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def iters_for(nbytes, base):
    return max(10, min(base, (base * (1 << 20)) // max(nbytes, 1)))


def worker(rank, world, args, store_path):
    import kiln.distributed
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    group = dist.group.WORLD
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except Exception as e:  # noqa: BLE001 - the peer is optional
        symm_mem = None
        if rank == 0:
            print("no torch symmetric memory:", e)
    sizes = []
    b = args.min_bytes
    while b <= args.max_bytes:
        sizes.append(b)
        b *= 4
    ar = kiln.distributed.AllReduce(max_bytes=args.max_bytes, heap_bytes=args.max_bytes + (1 << 20),
                                    cache_dir=args.cache_dir, configs=args.configs, tune=False)
    ar.tune(calls=("symmetric in-place", "staged"))
    rows = []
    for nbytes in sizes:
        n = nbytes // 2
        g = torch.Generator(device="cuda").manual_seed(rank)
        src = torch.randint(-3, 4, (n,), device="cuda", generator=g).to(torch.bfloat16)
        ref = src.clone()
        dist.all_reduce(ref)
        # Drop the previous size's heap tensor first (the variants' closures hold it too): the heap is sized for
        # one tensor of the largest size, not two.
        heap = variants = None
        heap = ar.empty(n)
        plain = torch.empty_like(src)
        nccl_buf = torch.empty_like(src)
        variants = {
            "kiln_heap_us": (heap, lambda: ar.all_reduce(heap)),
            "kiln_staged_us": (plain, lambda: ar.all_reduce(plain)),
            "nccl_us": (nccl_buf, lambda: dist.all_reduce(nccl_buf)),
        }
        if symm_mem is not None:
            try:
                sbuf = symm_mem.empty(n, device="cuda", dtype=torch.bfloat16)
                symm_mem.rendezvous(sbuf, group.group_name)
                if nbytes <= args.one_shot_max:
                    variants["symm_one_shot_us"] = (
                        sbuf, lambda: torch.ops.symm_mem.one_shot_all_reduce(sbuf, "sum", group.group_name))
                variants["symm_two_shot_us"] = (
                    sbuf, lambda: torch.ops.symm_mem.two_shot_all_reduce_(sbuf, "sum", group.group_name))
            except Exception as e:  # noqa: BLE001
                if rank == 0:
                    print(f"symm_mem at {nbytes} bytes: {str(e)[:120]}")
        # Check each variant once against NCCL's result.
        errors = {}
        for name, (buf, fn) in variants.items():
            buf.copy_(src)
            out = fn()
            got = out if name == "symm_one_shot_us" else buf
            if not torch.equal(got, ref):
                errors[name] = "wrong result"
        iters = iters_for(nbytes, args.iters)
        times = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (buf, fn) in variants.items():
                buf.copy_(src)
                for _ in range(3):
                    fn()  # warm-up
                times[name].append(per_call_us(fn, iters))
        row = {"bytes": nbytes, "iters": iters, "kiln_choice": ar.choice_for(n, "symmetric in-place"),
               "kiln_staged_choice": ar.choice_for(n, "staged")}
        for name, ts in times.items():
            row[name] = round(statistics.median(ts), 2)
        peers = [row[k] for k in ("nccl_us", "symm_one_shot_us", "symm_two_shot_us") if k in row]
        row["best_peer_us"] = min(peers)
        row["kiln_heap_speedup"] = round(row["best_peer_us"] / row["kiln_heap_us"], 3)
        if errors:
            row["errors"] = errors
        rows.append(row)
        if rank == 0:
            print(f"{nbytes:>10} B  kiln heap {row['kiln_heap_us']:>9.2f}  staged {row['kiln_staged_us']:>9.2f}  "
                  f"nccl {row['nccl_us']:>9.2f}  one-shot {row.get('symm_one_shot_us', float('nan')):>9.2f}  "
                  f"two-shot {row.get('symm_two_shot_us', float('nan')):>9.2f}  best/kiln "
                  f"{row['kiln_heap_speedup']:.3f}  ({row['kiln_choice']}){'  ' + str(errors) if errors else ''}",
                  flush=True)
        del heap
        torch.cuda.synchronize()
    if rank == 0 and args.json:
        meta = {"gpus": world, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                "dtype": "bfloat16", "commit": os.environ.get("KILN_COMMIT", ""), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)
        print("wrote", args.json)
    torch.cuda.synchronize()
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # no teardown: symmetric-memory handles can hang the process group's destruction


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    p.add_argument("--min-bytes", type=int, default=4 << 10)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--one-shot-max", type=int, default=64 << 20, help="largest size symm_mem one-shot is timed at")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--configs", type=int, default=24)
    p.add_argument("--cache-dir", default=os.environ.get("KILN_CACHE_DIR"))
    p.add_argument("--json")
    args = p.parse_args()
    if args.gpus < 2:
        print(f"needs 2 or more GPUs, found {args.gpus}")
        return 2
    if args.cache_dir is None:
        args.cache_dir = tempfile.mkdtemp(prefix="kiln-allreduce-cache-")
    store = tempfile.mktemp(prefix="kiln-allreduce-store-")
    print(f"gpus {args.gpus}, torch {torch.__version__}, cache {args.cache_dir}", flush=True)
    mp.spawn(worker, args=(args.gpus, args, store), nprocs=args.gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
