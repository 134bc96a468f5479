"""The kernel cache: statistics and portable bundles (what ``kiln cache stats|export|import`` do).

Every function takes ``cache_dir`` (default: ``$KILN_CACHE_DIR``, else ``~/.cache/kiln``) and shares the
process's open cache with the tuners on that folder. None needs a GPU.
"""
import os

from . import _C


def _dir(cache_dir):
    return "" if cache_dir is None else os.fspath(cache_dir)


def stats(cache_dir=None):
    """Counts of decisions, timings, failures and binaries (by arch), sizes, and the folder."""
    return _C._cache_stats(_dir(cache_dir))


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
