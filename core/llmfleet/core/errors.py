"""The error type for problems a person can act on."""


class UserError(Exception):
    """A problem stated in one line a person can act on (several problems: one line each).

    The CLI prints each line of `str(error)` after `error:` and exits 1; it never shows a
    traceback for these.
    """
