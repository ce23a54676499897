"""Where ``tau`` keeps its logins: one JSON file of profiles in the user's config folder.

``$TAU_CONFIG`` names the file outright; otherwise it is ``$XDG_CONFIG_HOME/taugrid/config.json``
(``~/.config/taugrid/config.json``). It holds tokens, so it is written with mode 0600 (and its
folder 0700), replaced atomically, and a file others can read is refused until fixed.
``TAU_URL``, ``TAU_TOKEN`` and ``TAU_WORKSPACE`` override what the profile says, for CI.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_PROFILE = "default"


class ConfigError(Exception):
    """The config file cannot be read or written; the message says what to do."""


def config_path() -> Path:
    named = os.environ.get("TAU_CONFIG")
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "taugrid" / "config.json"


@dataclass(frozen=True)
class Profile:
    """Where to reach a portal and as whom: what one ``tau login`` stored."""

    name: str
    url: str | None
    token: str | None
    workspace: str | None

    def to_dict(self) -> dict[str, str]:
        stored = {"url": self.url, "token": self.token, "workspace": self.workspace}
        return {key: value for key, value in stored.items() if value}


def read_config(path: Path | None = None) -> dict[str, Any]:
    path = path or config_path()
    try:
        info = path.stat()
    except FileNotFoundError:
        return {"profiles": {}}
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path} holds API tokens but others may read it; run `chmod 600 {path}` "
            "(or `tau logout` and `tau login` again)."
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path}: {error}; fix or remove it.") from None
    if not isinstance(data, dict) or not isinstance(data.get("profiles", {}), dict):
        raise ConfigError(f"{path} is not a tau config file; fix or remove it.")
    data.setdefault("profiles", {})
    return data


def write_config(data: dict[str, Any], path: Path | None = None) -> Path:
    """Write the whole file (mode 0600), atomically: a crash leaves the old file."""
    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".config-", dir=path.parent)
    try:
        os.fchmod(handle, 0o600)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def chosen_profile_name(asked: str | None, data: dict[str, Any]) -> str:
    return asked or os.environ.get("TAU_PROFILE") or data.get("current") or DEFAULT_PROFILE


def load_profile(asked: str | None) -> Profile:
    """The profile asked for (``--profile``, ``$TAU_PROFILE``, the last one logged in to),
    with the ``TAU_*`` environment on top."""
    data = read_config()
    name = chosen_profile_name(asked, data)
    stored = data["profiles"].get(name) or {}
    return Profile(
        name=name,
        url=os.environ.get("TAU_URL") or stored.get("url"),
        token=os.environ.get("TAU_TOKEN") or stored.get("token"),
        workspace=os.environ.get("TAU_WORKSPACE") or stored.get("workspace"),
    )


def save_profile(profile: Profile) -> Path:
    data = read_config()
    data["profiles"][profile.name] = profile.to_dict()
    data["current"] = profile.name
    return write_config(data)


def forget_profile(name: str) -> bool:
    """Remove a profile; whether there was one."""
    data = read_config()
    if data["profiles"].pop(name, None) is None:
        return False
    if data.get("current") == name:
        data.pop("current")
    write_config(data)
    return True
