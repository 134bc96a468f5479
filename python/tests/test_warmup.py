"""The serving start-up recipe of docs/python.md: a cache built by `kiln precompile` (no GPU needed), then a
process that imports kiln, warms up and runs its first op with no compile and no tuning."""
import json
import os
import re
import subprocess
import sys

import pytest

import kiln
from conftest import HAS_GPU, SOURCE_DIR, needs_torch_gpu

WORKLOAD = {"name": "recipe", "problems": [
    {"op": "gemm", "m": 16, "n": 4096, "k": 4096, "dtype": "bf16", "layout_b": "col"}]}


def recipe_code():
    text = (SOURCE_DIR / "docs" / "python.md").read_text()
    recipe = text.split("<!-- recipe: tested by python/tests/test_warmup.py -->")[1]
    return re.search(r"```python\n(.*?)```", recipe, re.S).group(1)


@pytest.mark.parametrize("workload", [123, 4.5, b"{}", object()])
def test_a_workload_of_the_wrong_type_is_a_type_error(cache_dir, workload):
    # An int once reached open() as a file descriptor (OSError: Bad file descriptor, or a read of whatever fd it was).
    with pytest.raises(TypeError, match="workload is a file path"):
        kiln.warmup(cache_dir, workload)
    with pytest.raises(TypeError, match="workload is a file path"):
        kiln.precompile(workload, arch="sm_90a", cache_dir=cache_dir)


def test_a_workload_file_past_the_limit_is_an_error_naming_it(cache_dir, monkeypatch):
    # /dev/zero was read until memory ran out; the C++ side bounds the same file by the same variable.
    monkeypatch.setenv("KILN_MAX_WORKLOAD_BYTES", "1K")
    with pytest.raises(kiln.OutOfRangeError, match="workload file '/dev/zero' is larger than 1024 bytes"):
        kiln.precompile("/dev/zero", arch="sm_90a", cache_dir=cache_dir)
    monkeypatch.setenv("KILN_MAX_WORKLOAD_BYTES", "lots")
    with pytest.raises(kiln.InvalidArgumentError, match="KILN_MAX_WORKLOAD_BYTES='lots'"):
        kiln.precompile("/dev/zero", arch="sm_90a", cache_dir=cache_dir)


def test_a_workload_path_that_is_no_file_is_an_error_naming_it(cache_dir, tmp_path):
    with pytest.raises(kiln.NotFoundError, match=f"cannot read workload file '{tmp_path}/missing.json'"):
        kiln.precompile(tmp_path / "missing.json", arch="sm_90a", cache_dir=cache_dir)
    with pytest.raises(kiln.InvalidArgumentError, match=f"workload file '{tmp_path}' is a directory"):
        kiln.precompile(str(tmp_path), arch="sm_90a", cache_dir=cache_dir)
    # A NUL byte would cut the path short in the C++ side's open(): refused whole.
    with pytest.raises(kiln.InvalidArgumentError, match="NUL byte"):
        kiln.precompile(f"{tmp_path}/w.json\0/etc/passwd", arch="sm_90a", cache_dir=cache_dir)


def test_warmup_without_a_gpu_is_a_clear_error(cache_dir):
    if HAS_GPU:
        pytest.skip("a GPU is here: the no-GPU path is not reachable")
    with pytest.raises((kiln.NoDriverError, kiln.NoDeviceError)):
        kiln.warmup(cache_dir, WORKLOAD)


@needs_torch_gpu
def test_serving_recipe(kiln_cli, tmp_path, cache_dir):
    workload = tmp_path / "workload.json"
    workload.write_text(json.dumps(WORKLOAD))
    # The build machine's step (it needs no GPU; here it runs where one is).
    subprocess.run([kiln_cli, "precompile", "--workload", str(workload), "--arch", "sm_90a", "--cache-dir",
                    cache_dir], check=True, capture_output=True)
    env = dict(os.environ, KILN_CACHE=cache_dir, KILN_WORKLOAD=str(workload))
    run = subprocess.run([sys.executable, "-c", recipe_code()], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1/1 problems ready" in run.stdout
    # A second process finds the decision too: nothing is measured.
    run = subprocess.run([sys.executable, "-c", recipe_code()], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 from cached decisions, 0 tuned now, 0 kernels compiled" in run.stdout


@needs_torch_gpu
def test_warmup_from_cached_decisions_only(cache_dir):
    import torch
    import kiln.torch  # noqa: F401
    x = torch.randn(4, 256, device="cuda", dtype=torch.bfloat16)
    with kiln.Tuner(cache_dir=cache_dir, configs=4):
        kiln.softmax(x)  # tunes and stores the decision
    fresh = kiln.Tuner(cache_dir=cache_dir, mode="strict", configs=4)
    report = kiln.warmup(tuner=fresh)  # no workload: every decision for this GPU
    assert report.ready == 1 and report.from_cached_decision == 1 and report.tuned == 0, report
    assert kiln.current_tuner() is fresh
    kiln.softmax(x)
    assert fresh.stats()["hits"] == 1 and fresh.stats()["misses"] == 0


def test_background_warmup_without_a_gpu_reports_the_error_on_wait(cache_dir):
    if HAS_GPU:
        pytest.skip("a GPU is here: the no-GPU path is not reachable")
    task = kiln.warmup(cache_dir, WORKLOAD, wait=False)
    assert isinstance(task, kiln.WarmupTask)
    with pytest.raises((kiln.NoDriverError, kiln.NoDeviceError)):
        task.wait()
    assert task.done()
    # A finished background warm-up leaves the tuner free for the next one.
    with pytest.raises((kiln.NoDriverError, kiln.NoDeviceError)):
        kiln.warmup(tuner=task.tuner, workload=WORKLOAD)


@needs_torch_gpu
def test_background_warmup_serves_the_first_call_and_a_capture_without_loading_twice(cache_dir):
    import torch
    import kiln.torch  # noqa: F401
    xs = [torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16) for rows in (4, 8)]
    with kiln.Tuner(cache_dir=cache_dir, configs=4):
        for x in xs:
            kiln.softmax(x)  # tunes and stores the decisions
    torch.cuda.synchronize()
    fresh = kiln.Tuner(cache_dir=cache_dir, mode="strict", configs=4)
    task = kiln.warmup(tuner=fresh, wait=False, threads=2)  # every decision for this GPU
    assert kiln.current_tuner() is fresh
    kiln.softmax(xs[0])  # loads it now if the warm-up has not reached it, else waits for it; never twice
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = torch.ops.kiln.softmax(xs[1])  # its own tuned kernel, not the nearest size or torch's
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y.float(), torch.softmax(xs[1].float(), -1), atol=2e-2, rtol=2e-2)
    report = task.wait()
    assert task.done() and report.ready + report.taken_by_calls == 2, report
    assert report.tuned == 0 and report.compiled == 0 and report.taken_by_calls <= 1, report
    s = fresh.stats()
    # A problem the call took over is its one miss; nothing is loaded twice, and the capture got its own kernel.
    assert s["misses"] == report.taken_by_calls and s["capture_nearest"] == 0 and s["capture_errors"] == 0, s
    assert 1 <= len(report.slowest) <= 2 and all(x["chosen"] and x["load_seconds"] >= 0 for x in report.slowest)
