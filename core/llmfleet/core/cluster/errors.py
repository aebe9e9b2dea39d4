"""The one error type the local cluster raises for problems a person can act on."""


class ClusterError(Exception):
    """A problem with the local cluster, stated in one line a person can act on.

    The CLI prints `str(error)` and exits non-zero; it never shows a traceback for these.
    """
