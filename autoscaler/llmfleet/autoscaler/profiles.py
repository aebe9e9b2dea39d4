"""Capacity profiles the autoscaler sizes pools with, read from a directory at start.

Every `*.json` in the directory is a `CapacityProfile` as `llmfleet-runtime profile` writes it.
A pool uses the newest profile whose `model` is its service's `spec.model.name`; pools without
one fall back to the per-GPU defaults (`capacity.default_capacity`), corrected online.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from llmfleet.core.capacity_profile import CapacityProfile
from llmfleet.core.errors import UserError


class ProfileError(UserError):
    pass


def load_profiles(directory: Path | None) -> dict[str, CapacityProfile]:
    """Model name -> its newest profile. Raises `ProfileError` naming the file that is not one."""
    if directory is None:
        return {}
    if not directory.is_dir():
        raise ProfileError(f"capacity profile directory {directory} does not exist")
    newest: dict[str, CapacityProfile] = {}
    for path in sorted(directory.glob("*.json")):
        try:
            profile = CapacityProfile.model_validate_json(path.read_bytes())
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the document"
            raise ProfileError(
                f"{path}: not a capacity profile ({where}: {first['msg']})"
            ) from error
        known = newest.get(profile.model)
        if known is None or profile.measured_at > known.measured_at:
            newest[profile.model] = profile
    return newest
