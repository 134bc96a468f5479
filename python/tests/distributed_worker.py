"""One rank of test_distributed.py's multi-GPU test (a module of its own: torch.multiprocessing's spawned ranks
import it by name). Every check compares kiln's result with torch.distributed's (NCCL) on the same inputs; an
AssertionError in any rank fails the test with that rank's traceback."""
import gc
import os

import torch
import torch.distributed as dist

import kiln
import kiln.distributed

HIDDEN = 256
TOKENS = (1, 4, 16)


def _ints(n, rank, seed):
    # Small integers: their sums over ranks are exact in bf16, so kiln and NCCL must agree bit for bit.
    g = torch.Generator().manual_seed(seed * 31 + rank)
    return torch.randint(-4, 5, (n,), generator=g).to(torch.bfloat16).cuda()


def _reference(x):
    ref = x.clone()
    dist.all_reduce(ref)
    return ref


def _rmsnorm(h, w, eps):
    hf = h.float()
    return hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _close(a, b, what):
    assert torch.allclose(a.float(), b.float(), rtol=2e-2, atol=2e-2), f"{what}: max diff {(a.float() - b.float()).abs().max()}"


def check_arbitrary_tensors(ar, rank):
    # Aligned multiples of 8 (any choice), an odd count (NCCL), one above max_bytes (NCCL above the last bucket).
    for i, n in enumerate([4096, 1 << 20, 1001, 5 << 20]):
        x = _ints(n, rank, i)
        ref = _reference(x)
        inplace = x.clone()
        assert ar.all_reduce(inplace) is inplace
        assert torch.equal(inplace, ref), f"in place, {n} elements ({ar.choice_for(n)})"
        out = torch.empty(n // 8, 8, dtype=x.dtype, device="cuda") if n % 8 == 0 else torch.empty_like(x)
        before = x.clone()
        assert ar.all_reduce(x, out=out) is out
        assert torch.equal(out.view(-1), ref), f"out of place, {n} elements"
        assert torch.equal(x, before), "out of place: the input changed"
    # A view at an offset that breaks 16-byte alignment runs NCCL, alike on every rank.
    base = _ints(4104, rank, 9)
    view = base[1:4097]
    ref = _reference(view)
    ar.all_reduce(view)
    assert torch.equal(view, ref), "unaligned view"


def check_heap(ar, rank):
    try:
        h = ar.empty(64, 1024)
    except kiln.UnimplementedError:
        return "no heap in this kiln"
    assert h.shape == (64, 1024) and h.dtype == torch.bfloat16 and h.device == torch.device("cuda", rank)
    assert ar.is_symmetric(h) and not ar.is_symmetric(torch.empty_like(h))
    x = _ints(h.numel(), rank, 20).view(64, 1024)
    ref = _reference(x)
    h.copy_(x)
    ar.all_reduce(h)
    assert torch.equal(h, ref), "heap tensor in place"
    out = torch.empty_like(h)
    h.copy_(x)
    ar.all_reduce(h, out=out)
    assert torch.equal(out, ref), "heap tensor out of place"
    assert ar.live_tensors == 1
    del h
    gc.collect()
    torch.cuda.synchronize()
    assert ar.live_tensors == 0, "the heap tensor was not freed"
    return "ok"


def check_fused(ar, rank):
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    dist.broadcast(w, 0)
    # Tuned token counts (the fused kernel or pair), more tokens than tuned and another hidden size (unfused).
    for rows, cols in [(1, HIDDEN), (16, HIDDEN), (3, HIDDEN), (48, HIDDEN), (4, 128)]:
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        res = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        weight = w[:cols].contiguous()
        summed = _reference(x)
        h_ref = summed + res
        y_ref = _rmsnorm(h_ref, weight, 1e-5)
        x0 = x.clone()
        res_in = res.clone()
        y, r = ar.fused_add_rmsnorm(x, res_in, weight, 1e-5)
        assert r is res_in, "the residual is updated in place by default"
        assert torch.equal(x, x0), "x changed"
        _close(r, h_ref, f"residual_out {rows}x{cols} ({ar.fused_choice_for(rows)})")
        _close(y, y_ref, f"y {rows}x{cols} ({ar.fused_choice_for(rows)})")
        # Given outputs, residual untouched.
        res_keep = res.clone()
        y2, r2 = torch.empty_like(x), torch.empty_like(res)
        out = ar.fused_add_rmsnorm(x, res_keep, weight, 1e-5, out=y2, residual_out=r2)
        assert out[0] is y2 and out[1] is r2 and torch.equal(res_keep, res)
        _close(y2, y_ref, "y (out=)")
        # The custom op: residual in place, y returned.
        res_op = res.clone()
        y3 = torch.ops.kiln.all_reduce_fused_add_rmsnorm(x, res_op, weight, 1e-5, ar.handle)
        _close(y3, y_ref, "custom op y")
        _close(res_op, h_ref, "custom op residual")


def check_graph(ar, rank):
    n = 1 << 16
    x = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    try:
        hx = ar.empty(n)
    except kiln.UnimplementedError:
        hx = torch.empty(n, device="cuda", dtype=torch.bfloat16)
    rows = 4
    xf = torch.empty(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    rf = torch.empty(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ar.all_reduce(x)
        torch.ops.kiln.all_reduce(hx, ar.handle)
        y = torch.ops.kiln.all_reduce_fused_add_rmsnorm(xf, rf, w, 1e-5, ar.handle)
    for it in range(3):
        a, b = _ints(n, rank, 30 + it), _ints(n, rank, 40 + it)
        fx = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        fr = torch.randn(rows, HIDDEN, device="cuda", dtype=torch.bfloat16)
        x.copy_(a), hx.copy_(b), xf.copy_(fx), rf.copy_(fr)
        ref_a, ref_b, ref_f = _reference(a), _reference(b), _reference(fx)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(x, ref_a), f"graph replay {it}: arbitrary tensor"
        assert torch.equal(hx, ref_b), f"graph replay {it}: heap tensor"
        _close(rf, ref_f + fr, f"graph replay {it}: fused residual")
        _close(y, _rmsnorm(ref_f + fr, w, 1e-5), f"graph replay {it}: fused y")
    del g, hx
    gc.collect()


def check_compile(ar, rank):
    handle = ar.handle

    def step(x, res, w):
        y = x * 2
        torch.ops.kiln.all_reduce(y, handle)
        return y, torch.ops.kiln.all_reduce_fused_add_rmsnorm(y, res, w, 1e-5, handle)

    x = torch.randn(4, HIDDEN, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(4, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
    res_eager, res_compiled = res.clone(), res.clone()
    y_e, n_e = step(x, res_eager, w)
    torch._dynamo.reset()
    y_c, n_c = torch.compile(step, fullgraph=True)(x, res_compiled, w)
    assert torch.equal(y_c, y_e), "compiled all-reduce"
    _close(n_c, n_e, "compiled fused step")
    _close(res_compiled, res_eager, "compiled fused step's residual")


def check_errors(ar, rank):
    x = torch.zeros(64, device="cuda", dtype=torch.bfloat16)
    for call, match in [(lambda: ar.all_reduce(x, out=torch.empty(63, device="cuda", dtype=torch.bfloat16)), "63 elements"),
                        (lambda: ar.all_reduce(x.float()), "dtype float32"),
                        (lambda: ar.all_reduce(x.cpu()), "on the CPU"),
                        (lambda: ar.all_reduce(x, out=x[:32]), "elements"),
                        (lambda: ar.all_reduce(torch.zeros(8, 8, device="cuda", dtype=torch.bfloat16).t()), "not contiguous")]:
        try:
            call()
        except kiln.InvalidArgumentError as e:
            assert match in str(e), (match, str(e))
        else:
            raise AssertionError(f"no error for {match}")


def run(rank, world, store_path, cache_dir, results_dir):
    torch.cuda.set_device(rank)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    notes = {}
    try:
        ar = kiln.distributed.AllReduce(max_bytes=8 << 20, cache_dir=cache_dir, configs=4,
                                        tune=[4096, 65536, 1 << 20, 8 << 20], hidden_size=HIDDEN, tokens=TOKENS)
        assert (ar.rank, ar.world, ar.device) == (rank, world, rank)
        assert ar.reports and all("chosen" in r for r in ar.reports)
        check_arbitrary_tensors(ar, rank)
        notes["heap"] = check_heap(ar, rank)
        check_fused(ar, rank)
        check_graph(ar, rank)
        check_compile(ar, rank)
        check_errors(ar, rank)
        # close() is refused on every rank while a heap tensor lives on one, then goes through.
        if notes["heap"] == "ok":
            keep = ar.empty(8)  # collective: every rank allocates; only rank 0 keeps it
            if rank != 0:
                del keep
                keep = None
                gc.collect()
            try:
                ar.close()
            except kiln.FailedPreconditionError as e:
                assert "still alive" in str(e)
            else:
                raise AssertionError("close() with a live heap tensor")
            del keep
            gc.collect()
            torch.cuda.synchronize()
        ar.close()
        assert ar.closed
        try:
            torch.ops.kiln.all_reduce(torch.zeros(8, device="cuda", dtype=torch.bfloat16), ar.handle)
        except kiln.NotFoundError:
            pass
        else:
            raise AssertionError("a closed handle ran")
        with open(os.path.join(results_dir, f"rank{rank}.txt"), "w") as f:
            f.write(repr(notes))
    finally:
        dist.destroy_process_group()
