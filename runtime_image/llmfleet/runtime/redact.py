"""What the launcher logs, with secrets taken out (pure).

The launcher logs the engine's whole command line and its decisions. A secret can reach them
two ways: a flag that takes one (`--api-key`, `--hf-token`, given through `extraArgs`), or a
value that is also the value of a secret-looking environment variable (`HF_TOKEN` from a
Secret, pasted into an argument). Both are replaced by `REDACTED`, as are passwords in URLs
(`scheme://user:password@host`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
SECRET_FLAGS = ("--api-key", "--hf-token")
"""vLLM options whose value is a secret."""
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE
)
"""Environment variable names whose values are treated as secrets."""
MIN_SECRET_CHARS = 6
"""Shorter values are not searched for (a `1` or `true` would blank out half the log)."""
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:)[^/\s@]+@")


def secret_values(*environs: Mapping[str, str]) -> list[str]:
    """Values of the secret-looking variables of `environs`, longest first (so that a secret
    containing another is replaced whole)."""
    found = {
        value
        for environ in environs
        for name, value in environ.items()
        if SECRET_NAME.search(name) and len(value) >= MIN_SECRET_CHARS
    }
    return sorted(found, key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret value, and every URL password, replaced."""
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", text)


def redact_argv(argv: list[str], secrets: Iterable[str]) -> list[str]:
    """`argv` with the values of `SECRET_FLAGS` (`--flag value` and `--flag=value`) and every
    secret value replaced."""
    secrets = list(secrets)
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = word.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(word)
                hide_next = True
            continue
        out.append(redact(word, secrets))
    return out
