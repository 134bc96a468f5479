"""kiln's ops as torch custom ops: ``torch.ops.kiln.gemm``, ``torch.ops.kiln.rmsnorm``, ``torch.ops.kiln.softmax``.

    import kiln.torch
    y = torch.ops.kiln.gemm(x, w.t(), bias, "gelu")      # eager
    f = torch.compile(model, fullgraph=True)             # traced through the fake implementations

They run in eager mode, under ``torch.compile(fullgraph=True)`` (fake/meta implementations give the output
shapes; Inductor calls the op as an extern kernel) and inside CUDA-graph capture. Nothing allocates,
synchronises or tunes inside a capture: tune the problems first (run them once eagerly, or ``kiln.warmup``);
a miss during capture runs the selection of the nearest tuned size of the same problem, else the op's torch
fallback (``torch.mm`` + epilogue, torch's RMSNorm and softmax), except in ``strict`` mode, where it raises
kiln.CaptureMissError. Forward only (no autograd).
"""
import torch

from . import _C

_lib = torch.library.Library("kiln", "DEF")
_lib.define("gemm(Tensor a, Tensor b, Tensor? bias=None, str epilogue='', Tensor? residual=None, "
            "float alpha=1.0, float beta=1.0, bool b_constant=False) -> Tensor")
_lib.define("rmsnorm(Tensor x, Tensor weight, float eps=1e-06) -> Tensor")
_lib.define("fused_add_rmsnorm(Tensor x, Tensor(a!) residual, Tensor weight, float eps=1e-06) -> Tensor")
_lib.define("softmax(Tensor x, float scale=1.0) -> Tensor")


# The torch compositions a miss inside capture falls back on (same math as kiln's kernels, fp32 inside).
def _gemm_torch(a, b, bias, epilogue, residual, alpha, beta):
    v = torch.mm(a, b).float()
    ops = [op for op in epilogue.replace(",", "+").replace("_", "+").split("+") if op and op != "none"]
    if bias is not None and "bias" not in ops:
        ops.insert(0, "bias")
    if residual is not None and "residual" not in ops:
        ops.append("residual")
    for op in ops:
        if op == "scale":
            v = v * alpha
        elif op == "bias":
            v = v + bias.float()
        elif op == "residual":
            v = v + beta * residual.float()
        elif op == "relu":
            v = torch.relu(v)
        elif op == "gelu":
            v = torch.nn.functional.gelu(v, approximate="tanh")
        elif op == "silu":
            v = torch.nn.functional.silu(v)
    return v.to(a.dtype)


def _rmsnorm_torch(h, weight, eps):
    hf = h.float()
    return (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(h.dtype)


def _fused_add_rmsnorm_torch(x, residual, weight, eps):
    residual.add_(x)
    return _rmsnorm_torch(residual, weight, eps)


def _softmax_torch(x, scale):
    return torch.softmax(x.float() * scale, dim=-1).to(x.dtype)


# The dispatcher calls kiln's C++ directly (no Python frame per call); it runs these compositions on a miss
# inside capture, except in strict mode.
_C._set_torch_fallbacks(_gemm_torch, _rmsnorm_torch, _fused_add_rmsnorm_torch, _softmax_torch)
_lib.impl("gemm", _C._op_gemm, "CUDA")
_lib.impl("rmsnorm", _C._op_rmsnorm, "CUDA")
_lib.impl("fused_add_rmsnorm", _C._op_fused_add_rmsnorm, "CUDA")
_lib.impl("softmax", _C._op_softmax, "CUDA")


@torch.library.register_fake("kiln::gemm")
def _gemm_fake(a, b, bias=None, epilogue="", residual=None, alpha=1.0, beta=1.0, b_constant=False):
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "kiln::gemm takes 2-D a and b")
    torch._check(a.shape[1] == b.shape[0], lambda: f"kiln::gemm: inner sizes {a.shape[1]} and {b.shape[0]} differ")
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.register_fake("kiln::rmsnorm")
def _rmsnorm_fake(x, weight, eps=1e-6):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kiln::fused_add_rmsnorm")
def _fused_add_rmsnorm_fake(x, residual, weight, eps=1e-6):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("kiln::softmax")
def _softmax_fake(x, scale=1.0):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


gemm = torch.ops.kiln.gemm
rmsnorm = torch.ops.kiln.rmsnorm
fused_add_rmsnorm = torch.ops.kiln.fused_add_rmsnorm
softmax = torch.ops.kiln.softmax

__all__ = ["gemm", "rmsnorm", "fused_add_rmsnorm", "softmax"]
