"""The error the local cluster raises for problems a person can act on."""

from llmfleet.core.errors import UserError


class ClusterError(UserError):
    """A problem with the local cluster (bad arguments, a busy port, a failed build, …)."""
