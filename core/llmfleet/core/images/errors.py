"""The image builder's one error type."""

from __future__ import annotations

from llmfleet.core.errors import UserError


class ImageError(UserError):
    """An image cannot be built; the message says why and what to do."""
