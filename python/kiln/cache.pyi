"""The kernel cache: statistics, portable bundles and the fleet's remote cache."""
import os
from typing import Any, Optional, Sequence, Union

_Path = Union[str, os.PathLike]

def stats(cache_dir: Optional[_Path] = None, *, remote: Optional[str] = None, key_file: Optional[_Path] = None,
          allow_unsigned: bool = False) -> dict[str, Any]: ...
def export_bundle(path: _Path, cache_dir: Optional[_Path] = None, *, binaries: bool = False, prefix: str = "",
                  sign_key: Optional[_Path] = None) -> dict[str, int]: ...
def import_bundle(path: _Path, cache_dir: Optional[_Path] = None, *, trusted_keys: Sequence[_Path] = (),
                  trust_unsigned: bool = False) -> dict[str, Any]: ...
def push(remote: Optional[str] = None, cache_dir: Optional[_Path] = None, *, key_file: Optional[_Path] = None,
         allow_unsigned: bool = False, decisions_only: bool = False, arch: Optional[str] = None) -> dict[str, Any]: ...
def pull(remote: Optional[str] = None, cache_dir: Optional[_Path] = None, *, key_file: Optional[_Path] = None,
         allow_unsigned: bool = False, decisions_only: bool = False, arch: Optional[str] = None) -> dict[str, Any]: ...

export = export_bundle
import_ = import_bundle
