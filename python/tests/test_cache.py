"""Precompile (no GPU), cache statistics and bundles, and the CLI seeing the same cache."""
import json
import subprocess

import pytest

import kiln

SMALL = [{"op": "softmax", "rows": 1, "cols": 256}]


def test_precompile_then_stats(cache_dir):
    r = kiln.precompile(SMALL, arch="sm_90", cache_dir=cache_dir, configs=2, executor="inline")
    assert r["problems"] == 1 and r["failed"] == 0 and r["failures"] == []
    assert r["kernels"] > 0 and r["compiled"] > 0
    s = kiln.cache.stats(cache_dir)
    assert s["binaries"] == r["compiled"]
    assert s["binaries_by_arch"] == {"sm_90": r["compiled"]}
    # A second precompile finds everything cached.
    again = kiln.precompile(SMALL, arch="sm_90", cache_dir=cache_dir, configs=2, executor="inline")
    assert again["compiled"] == 0 and again["cached"] == again["kernels"]


def test_workload_forms(tmp_path, cache_dir):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"name": "w", "problems": SMALL}))
    by_path = kiln.precompile(path, arch="sm_90", cache_dir=cache_dir, configs=2, executor="inline")
    by_text = kiln.precompile(path.read_text(), arch="sm_90", cache_dir=cache_dir, configs=2, executor="inline")
    by_dict = kiln.precompile({"name": "w", "problems": SMALL}, arch="sm_90", cache_dir=cache_dir, configs=2)
    assert by_path["kernels"] == by_text["kernels"] == by_dict["kernels"]


def test_export_import_round_trip(tmp_path, cache_dir):
    kiln.precompile(SMALL, arch="sm_90", cache_dir=cache_dir, configs=2, executor="inline")
    bundle = tmp_path / "bundle.json"
    n = kiln.cache.export_bundle(bundle, cache_dir, binaries=True)
    assert n["binaries"] == kiln.cache.stats(cache_dir)["binaries"]
    other = str(tmp_path / "other")
    # Unsigned: the cubins are not trusted unless the importer says so.
    r = kiln.cache.import_bundle(bundle, other)
    assert r["binaries"] == 0 and r["rejected"] == 0 and not r["binaries_trusted"]
    r = kiln.cache.import_bundle(bundle, other, trust_unsigned=True)
    assert r["binaries"] == n["binaries"] and r["rejected"] == 0 and r["binaries_trusted"]
    assert kiln.cache.stats(other)["binaries"] == n["binaries"]


def test_signed_bundle_is_trusted_by_its_key_only(tmp_path, cache_dir):
    kiln.precompile(SMALL, arch="sm_90", cache_dir=cache_dir, configs=2, executor="inline")
    key, wrong = tmp_path / "k.key", tmp_path / "w.key"
    for path, byte in ((key, b"k"), (wrong, b"w")):
        path.write_bytes(byte * 32)
        path.chmod(0o600)
    bundle = tmp_path / "signed.json"
    n = kiln.cache.export_bundle(bundle, cache_dir, binaries=True, sign_key=key)
    r = kiln.cache.import_bundle(bundle, str(tmp_path / "a"), trusted_keys=[key])
    assert r["binaries_trusted"] and r["binaries"] == n["binaries"]
    r = kiln.cache.import_bundle(bundle, str(tmp_path / "b"), trusted_keys=[wrong])
    assert not r["binaries_trusted"] and r["binaries"] == 0


def test_import_rejects_a_truncated_bundle(tmp_path, cache_dir):
    kiln.precompile(SMALL, arch="sm_90", cache_dir=cache_dir, configs=2, executor="inline")
    bundle = tmp_path / "bundle.json"
    kiln.cache.export(bundle, cache_dir, binaries=True)
    text = bundle.read_text()
    bundle.write_text(text[: len(text) // 2])
    with pytest.raises(kiln.CorruptError, match="not a kiln cache bundle"):
        kiln.cache.import_(bundle, str(tmp_path / "other"))


def test_cli_precompile_is_seen_by_python(kiln_cli, tmp_path, cache_dir):
    w = tmp_path / "w.json"
    w.write_text(json.dumps({"name": "w", "problems": SMALL}))
    subprocess.run([kiln_cli, "precompile", "--workload", str(w), "--arch", "sm_90", "--cache-dir", cache_dir,
                    "--configs", "2"], check=True, capture_output=True)
    s = kiln.cache.stats(cache_dir)
    assert s["binaries"] > 0
    assert kiln.precompile(SMALL, arch="sm_90", cache_dir=cache_dir, configs=2)["compiled"] == 0
