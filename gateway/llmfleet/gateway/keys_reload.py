"""Keep the API keys current: re-read their source (the keys file, or the Secret) every
`api_keys_reload_seconds` and swap in a changed document (`Tenants.reload`).

A source that cannot be read or parsed leaves the keys in force as they were (a Secret being
rewritten, an API server away for a moment) and says so in the log once per distinct problem;
the next good read takes over. Nothing else changes at a reload: the requests in flight keep
their tenant, and every tenant keeps its buckets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from llmfleet.gateway.tenants import Tenants, TenantsError

log = logging.getLogger("llmfleet.gateway.keys")


@dataclass
class KeysReloader:
    tenants: Tenants
    read: Callable[[], str]
    """Reads the keys document (blocking: a file or the Kubernetes API); TenantsError or
    OSError when it cannot."""
    where: str
    """The source, in log lines (the file's path, or NAMESPACE/NAME of the Secret)."""
    text: str
    """The document in force."""
    _problem: str = ""

    async def once(self) -> bool:
        """Read the source; True when a changed document was swapped in."""
        try:
            text = await asyncio.to_thread(self.read)
            if text == self.text:
                self._problem = ""
                return False
            self.tenants.reload(text)
        except (TenantsError, OSError) as error:
            problem = str(error)
            if problem != self._problem:
                log.warning("API keys from %s not reloaded, the old ones stay: %s",
                            self.where, problem)  # fmt: skip
            self._problem = problem
            return False
        self.text, self._problem = text, ""
        log.info("API keys reloaded from %s", self.where)
        return True

    async def forever(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.once()
