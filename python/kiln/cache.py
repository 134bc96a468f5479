"""The kernel cache: statistics, portable bundles and the fleet's remote cache (what ``kiln cache
stats|export|import|push|pull`` do).

Every function takes ``cache_dir`` (default: ``$KILN_CACHE_DIR``, else ``~/.cache/kiln``) and shares the
process's open cache with the tuners on that folder. None needs a GPU.

The remote functions take ``remote``: a Redis URL (``redis://[user:password@]host:port/db`` or
``unix:///path?db=N``), ``None`` for ``$KILN_REMOTE_CACHE``, or ``""`` for none; ``key_file``: the fleet key
(mode 600) that signs what is sent and verifies what is read, ``None`` for ``$KILN_CACHE_KEY_FILE``, ``""`` for
none (then only decisions and timings travel, unless ``allow_unsigned=True`` on a trusted network). Keys and
passwords never appear in an error or a log. See docs/fleet.md.
"""
import os

from . import _C


def _dir(cache_dir):
    return "" if cache_dir is None else os.fspath(cache_dir)


def _path(p):
    return None if p is None else os.fspath(p)


def stats(cache_dir=None, *, remote=None, key_file=None, allow_unsigned=False):
    """Counts of decisions, timings, failures and binaries (by arch), sizes, and the folder.

    With a remote (``remote``, else ``$KILN_REMOTE_CACHE``), ``stats["remote"]`` also says what it holds and its
    counters, as ``kiln cache stats --remote`` does: ``url`` (password shown as ``***``), ``signing``,
    ``reachable`` (else ``error`` says why: an unreachable remote is reported, not raised), ``binaries``,
    ``decisions``, ``timing_problems``, ``used_memory``, ``max_memory``, ``eviction_policy``, ``fleet`` (the
    counters every kiln process adds when it closes) and ``process``: this process's use of it (``hits``,
    ``misses``, ``refused`` and by reason, ``errors``, ``skipped``, ``published``, ``queue_drops``,
    ``write_errors``, ``withheld``, ``breaker``: ``"closed"``, ``"open"`` or ``"half-open"``, ``last_error``).
    ``stats["remote"]`` is None without a remote.
    """
    s = _C._cache_stats(_dir(cache_dir))
    s["remote"] = _C._cache_remote_stats(remote, _path(key_file), allow_unsigned)
    return s


def push(remote=None, cache_dir=None, *, key_file=None, allow_unsigned=False, decisions_only=False, arch=None):
    """Publishes this cache's decisions, timings and binaries to the remote (``kiln cache push``).

    ``decisions_only``: decisions alone. ``arch`` (``"sm_90a"``): only binaries for it, and problems of devices
    of its compute capability. Binaries are sent signed with the fleet key, or not at all without one
    (``withheld``). Returns the counts: ``decisions``, ``timings``, ``binaries`` sent, ``withheld``, ``failed``
    (entries the remote did not store, e.g. a full Redis), ``errors`` (the first lines), ``remote``,
    ``signing``. Raises kiln.UnavailableError / kiln.TimeoutError when the remote cannot be reached (what was
    sent before stays), kiln.FailedPreconditionError when no remote is named. Runs without the GIL.
    """
    return _C._cache_push(remote, _dir(cache_dir), _path(key_file), allow_unsigned, decisions_only, arch or "")


def pull(remote=None, cache_dir=None, *, key_file=None, allow_unsigned=False, decisions_only=False, arch=None):
    """Fetches what the remote holds, verifies each value and stores those that pass (``kiln cache pull``).

    Selection as in push(). Values that fail their checks (unsigned, signed with another key, edited,
    truncated, stored under another key) are never stored: ``refused`` counts them. Binaries are fetched only
    with a fleet key (or ``allow_unsigned``). Returns the counts as push() does, with ``refused``. Raises as
    push(). Runs without the GIL.
    """
    return _C._cache_pull(remote, _dir(cache_dir), _path(key_file), allow_unsigned, decisions_only, arch or "")


def export_bundle(path, cache_dir=None, *, binaries=False, prefix="", sign_key=None):
    """Writes the cache's decisions and timings (and the cubins with ``binaries=True``) to a JSON bundle.

    ``prefix`` keeps only problems whose canonical key starts with it. ``sign_key``: a key file (32 bytes to
    4 KiB, mode 600) to sign the bundle with (HMAC-SHA256), so importers holding it store its cubins.
    Returns the counts written.
    """
    return _C._cache_export(os.fspath(path), _dir(cache_dir), binaries, prefix,
                            os.fspath(sign_key) if sign_key else "")


def import_bundle(path, cache_dir=None, *, trusted_keys=(), trust_unsigned=False):
    """Verifies every entry of a bundle and stores those that pass. Returns the counts, the rejected
    entries and the reasons, and what the signature check found.

    Cubins are code from elsewhere: they are stored only from a bundle signed with one of ``trusted_keys``
    (key files), or from an unsigned bundle with ``trust_unsigned=True``; otherwise decisions and timings
    alone are imported (``binaries_trusted`` is False)."""
    return _C._cache_import(os.fspath(path), _dir(cache_dir), [os.fspath(k) for k in trusted_keys],
                            trust_unsigned)


export = export_bundle
import_ = import_bundle
