"""The fleet's remote cache from Python, against a real redis-server on a loopback port in a temporary folder:
kiln.cache.push / pull between two cache folders (decisions-only and arch selections), a tampered value refused
and counted (in the pull's counts, the Tuner's stats and kiln.cache.stats), a killed Redis (errors raised by
explicit calls, reported by stats, nothing local lost), bad arguments, and no key in any message.

redis-server: $KILN_REDIS_SERVER, else on PATH (the project's setup installs it). Without one these tests fail,
unless KILN_ALLOW_NO_REDIS=1 says to skip them. No GPU needed, but for the last test (skipped without one): a
decision tuned through one Tuner's folder and pushed is read through by a strict Tuner on another folder.
"""
import os
import shutil
import socket
import subprocess
import time

import pytest

import kiln
from conftest import needs_gpu

SMALL = [{"op": "softmax", "rows": 1, "cols": 256}]
KEY = "python-fleet-key-material-0123456789-never-printed"
OTHER_KEY = "another-fleets-key-material-abcdefghij-never-printed"
REMOTE_ENV = ["KILN_REMOTE_CACHE", "KILN_CACHE_KEY_FILE", "KILN_REMOTE_ALLOW_UNSIGNED",
              "KILN_REMOTE_CONNECT_TIMEOUT_MS", "KILN_REMOTE_READ_TIMEOUT_MS"]


def _redis_binary():
    exe = os.environ.get("KILN_REDIS_SERVER")
    if exe:
        return exe if os.access(exe, os.X_OK) else None
    return shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server") if os.access(p, os.X_OK)), None)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server of this test's own, and a few commands to look at or damage what kiln stored."""

    def __init__(self, exe, folder):
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(folder), "--save", "",
             "--appendonly", "no", "--daemonize", "no", "--logfile", str(folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # polling its start against a deadline, never a fixed wait
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited at start (see {folder / 'redis.log'})")
            try:
                if self.command("PING") == "PONG":
                    return
            except OSError:
                pass
            time.sleep(0.01)
        self.kill()
        raise RuntimeError("redis-server did not answer PING within 20 s")

    def command(self, *args):
        """One command in RESP; the reply as str/bytes/int/list."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
            parts = [b"*%d\r\n" % len(args)]
            for a in args:
                a = a if isinstance(a, bytes) else str(a).encode()
                parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
            s.sendall(b"".join(parts))
            f = s.makefile("rb")
            return self._reply(f)

    def _reply(self, f):
        line = f.readline().rstrip(b"\r\n")
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = f.read(n + 2)[:n]
            return data
        if kind == b"*":
            return [self._reply(f) for _ in range(int(rest))]
        raise RuntimeError(f"odd reply {line!r}")

    def keys(self, pattern):
        return sorted(self.command("KEYS", pattern))

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def redis(tmp_path, monkeypatch):
    for name in REMOTE_ENV:
        monkeypatch.delenv(name, raising=False)
    exe = _redis_binary()
    if exe is None:
        why = "no redis-server (install the redis-server package, or set KILN_REDIS_SERVER)"
        if os.environ.get("KILN_ALLOW_NO_REDIS") == "1":
            pytest.skip(why)
        pytest.fail(why + " (KILN_ALLOW_NO_REDIS=1 skips the Redis tests)")
    folder = tmp_path / "redis"
    folder.mkdir()
    server = Redis(exe, folder)
    yield server
    server.kill()


def _key(tmp_path, name, content, mode=0o600):
    path = tmp_path / name
    path.write_text(content)
    path.chmod(mode)
    return str(path)


def _no_secrets(text):
    for secret in (KEY, OTHER_KEY, "hunter2secret"):
        assert secret not in text, text


@pytest.fixture
def built(tmp_path):
    """A cache folder with the SMALL workload's kernels compiled for sm_90, and how many."""
    folder = str(tmp_path / "build")
    r = kiln.precompile(SMALL, arch="sm_90", cache_dir=folder, configs=2, executor="inline")
    assert r["compiled"] > 0
    return folder, r["compiled"]


def test_push_then_pull_into_another_folder(redis, tmp_path, built):
    folder, n = built
    key = _key(tmp_path, "fleet.key", KEY)
    r = kiln.cache.push(redis.url, folder, key_file=key)
    assert (r["binaries"], r["withheld"], r["failed"], r["signing"]) == (n, 0, 0, True)
    assert r["remote"] == redis.url
    assert len(redis.keys("kiln:f*:bin:sm_90:*")) == n

    other = str(tmp_path / "gpu")
    r = kiln.cache.pull(redis.url, other, key_file=key)
    assert (r["binaries"], r["refused"], r["failed"]) == (n, 0, 0)
    assert kiln.cache.stats(other, remote="")["binaries"] == n

    picky = str(tmp_path / "picky")
    assert kiln.cache.pull(redis.url, picky, key_file=key, decisions_only=True)["binaries"] == 0
    assert kiln.cache.pull(redis.url, picky, key_file=key, arch="sm_80")["binaries"] == 0
    assert kiln.cache.stats(picky, remote="")["binaries"] == 0
    assert kiln.cache.pull(redis.url, picky, key_file=key, arch="sm_90")["binaries"] == n


def test_without_a_key_binaries_stay_home(redis, tmp_path, built, monkeypatch):
    folder, n = built
    r = kiln.cache.push(redis.url, folder, key_file="")
    assert (r["binaries"], r["withheld"], r["signing"]) == (0, n, False)
    assert redis.keys("kiln:f*:bin:*") == []
    # The environment names the remote and the key when the call does not.
    monkeypatch.setenv("KILN_REMOTE_CACHE", redis.url)
    monkeypatch.setenv("KILN_CACHE_KEY_FILE", _key(tmp_path, "fleet.key", KEY))
    r = kiln.cache.push(cache_dir=folder)
    assert (r["binaries"], r["withheld"], r["signing"]) == (n, 0, True)


def test_a_tampered_value_is_refused_and_counted(redis, tmp_path, built):
    folder, n = built
    key = _key(tmp_path, "fleet.key", KEY)
    assert kiln.cache.push(redis.url, folder, key_file=key)["binaries"] == n
    slot = redis.keys("kiln:f*:bin:*")[0]
    value = bytearray(redis.command("GET", slot))
    value[len(value) // 2] ^= 0x40
    redis.command("SET", slot, bytes(value))

    other = str(tmp_path / "gpu")
    tuner = kiln.Tuner(cache_dir=other, remote=redis.url, key_file=key)  # holds the process's tier for the remote
    r = kiln.cache.pull(redis.url, other, key_file=key)
    assert (r["binaries"], r["refused"]) == (n - 1, 1)
    assert kiln.cache.stats(other, remote="")["binaries"] == n - 1
    counters = tuner.stats()["remote"]
    assert counters["refused"] == 1 and counters["refused_signature"] + counters["refused_malformed"] == 1
    assert counters["breaker"] == "closed" and counters["signing"]
    s = kiln.cache.stats(other, remote=redis.url, key_file=key)["remote"]
    assert s["reachable"] and s["binaries"] == n and s["process"]["refused"] == 1
    _no_secrets(counters["last_error"])

    # Another fleet's key: every binary refused, no key in what is said.
    r = kiln.cache.pull(redis.url, str(tmp_path / "other"), key_file=_key(tmp_path, "other.key", OTHER_KEY))
    assert (r["binaries"], r["refused"]) == (0, n)
    for line in r["errors"]:
        _no_secrets(line)


def test_a_killed_redis_leaves_the_cache_local_and_says_so(redis, tmp_path, built):
    folder, n = built
    key = _key(tmp_path, "fleet.key", KEY)
    tuner = kiln.Tuner(cache_dir=folder, remote=redis.url, key_file=key)
    assert tuner.stats()["remote"]["breaker"] == "closed"
    redis.kill()
    with pytest.raises((kiln.UnavailableError, kiln.TimeoutError)) as e:
        kiln.cache.push(redis.url, folder, key_file=key)
    assert f"pushing to {redis.url}" in str(e.value)
    _no_secrets(str(e.value))
    s = kiln.cache.stats(folder, remote=redis.url, key_file=key)
    assert s["binaries"] == n  # nothing local lost
    assert s["remote"]["reachable"] is False and redis.url in s["remote"]["error"]
    # Local work goes on: everything is found in the local cache.
    again = kiln.precompile(SMALL, arch="sm_90", cache_dir=folder, configs=2, executor="inline")
    assert again["compiled"] == 0 and again["failed"] == 0


def test_bad_arguments_and_keys_are_said_without_the_key(redis, tmp_path):
    with pytest.raises(kiln.InvalidArgumentError, match="remote cache URL"):
        kiln.Tuner(cache_dir=str(tmp_path / "a"), remote="http://cache:1")
    loose = _key(tmp_path, "loose.key", KEY, mode=0o644)
    with pytest.raises(kiln.KilnError) as e:
        kiln.Tuner(cache_dir=str(tmp_path / "a"), remote=redis.url, key_file=loose)
    assert "loose.key" in str(e.value)
    _no_secrets(str(e.value))
    with pytest.raises(kiln.KilnError) as e:
        kiln.cache.pull(redis.url, str(tmp_path / "b"), key_file=_key(tmp_path, "short.key", "hunter2secret"))
    _no_secrets(str(e.value))
    with pytest.raises(kiln.FailedPreconditionError, match="no remote cache named"):
        kiln.cache.push(None, str(tmp_path / "c"))
    with pytest.raises(kiln.InvalidArgumentError):
        kiln.cache.pull(redis.url, str(tmp_path / "c"), arch="bogus")
    assert kiln.cache.stats(str(tmp_path / "c"))["remote"] is None
    assert kiln.Tuner(cache_dir=str(tmp_path / "d"), mode="use").stats()["remote"] is None
    # A password in the URL is shown as ***, in the counters and in errors.
    url = f"redis://kiln:hunter2secret@127.0.0.1:{_free_port()}/0"
    t = kiln.Tuner(cache_dir=str(tmp_path / "e"), remote=url, key_file="")
    assert "kiln:***@" in t.stats()["remote"]["remote"]
    with pytest.raises(kiln.UnavailableError) as e:
        kiln.cache.pull(url, str(tmp_path / "e"), key_file="")
    _no_secrets(str(e.value))


@needs_gpu
def test_gpu_a_decision_pushed_from_one_folder_is_read_through_in_another(redis, tmp_path):
    key = _key(tmp_path, "fleet.key", KEY)
    first = kiln.Tuner(cache_dir=str(tmp_path / "a"), remote=redis.url, key_file=key)
    try:
        r = kiln.warmup(workload=SMALL, tuner=first)
        assert r.ready == 1 and r.failed == 0, str(r)
        pushed = kiln.cache.push(redis.url, str(tmp_path / "a"), key_file=key)
        assert pushed["decisions"] == 1 and pushed["binaries"] >= 1 and pushed["withheld"] == 0
        # Another machine's empty folder, strict: the decision and its kernels come from the remote, verified.
        second = kiln.Tuner(cache_dir=str(tmp_path / "b"), mode="strict", remote=redis.url, key_file=key)
        r = kiln.warmup(workload=SMALL, tuner=second)
        assert (r.ready, r.from_cached_decision, r.tuned, r.compiled) == (1, 1, 0, 0), str(r)
        remote = second.stats()["remote"]
        assert remote["hits"] >= 2 and remote["refused"] == 0
    finally:
        kiln._C._set_default_tuner(None)
