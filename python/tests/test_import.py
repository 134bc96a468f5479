import pathlib
import subprocess
import sys

import kiln


def test_imports_without_torch():
    # torch is optional: block it and import kiln in a fresh interpreter.
    code = "import sys; sys.modules['torch'] = None; import kiln; print(kiln.__version__, kiln.gemm.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[1] == "gemm"
    assert out.split()[0] == kiln.__version__


def test_kiln_torch_needs_torch():
    code = "import sys; sys.modules['torch'] = None\ntry:\n import kiln.torch\nexcept ImportError: print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ok"


def test_public_api():
    for name in ["Tuner", "Kernel", "autotune", "cache", "compile", "gemm", "rmsnorm", "softmax", "precompile",
                 "warmup", "WarmupReport", "KilnError", "CompileError", "CaptureMissError", "current_tuner"]:
        assert hasattr(kiln, name), name
    for name in kiln.__all__:
        assert hasattr(kiln, name), name
    assert kiln._C.nvrtc_version[0] >= 12


def test_stubs_and_docstrings_ship():
    pkg = pathlib.Path(kiln.__file__).parent
    assert (pkg / "py.typed").exists()
    assert (pkg / "__init__.pyi").exists()
    assert (pkg / "_C.pyi").exists()
    for f in [kiln.gemm, kiln.rmsnorm, kiln.softmax, kiln.compile, kiln.warmup, kiln.precompile, kiln.Tuner,
              kiln.Kernel.launch, kiln.cache.stats]:
        assert f.__doc__ and len(f.__doc__) > 40, f


def test_stubs_name_everything_public():
    pkg = pathlib.Path(kiln.__file__).parent
    stub = (pkg / "__init__.pyi").read_text()
    for name in ["Tuner", "Kernel", "autotune", "compile", "gemm", "rmsnorm", "softmax", "precompile", "warmup",
                 "WarmupReport", "current_tuner"]:
        assert name in stub, name


def test_tuner_mode_and_context():
    t = kiln.Tuner(mode="off")
    assert t.mode == "off"
    before = kiln.current_tuner()
    with t as inner:
        assert inner is t
        assert kiln.current_tuner() is t
        with kiln.autotune(False) as u:
            assert u.mode == "use"
            assert kiln.current_tuner() is u
        assert kiln.current_tuner() is t
    assert kiln.current_tuner() is before
    assert t.stats()["hits"] == 0
    assert "mode='off'" in repr(t)
