"""Command-line options with their origin, and how `extraArgs` merge with the launcher's.

An option comes from the spec (a field the user set), a launcher default (with its reason), the
launcher itself (ports, model: never overridable) or `extraArgs`. extraArgs replace defaults of
the same option; contradicting the spec, each other, or a launcher-owned option is an error,
never a silent merge. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmfleet.runtime.errors import ExitCode, LauncherError

# Options that set the same thing (vLLM dest, or one group for related switches).
_ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
    "-sc": "--speculative-config",
    "--device-memory-utilization": "--gpu-memory-utilization",
    "-O": "--optimization-level",
}
_GROUPS = {
    "--enable-prefix-caching": "prefix-caching",
    "--disable-prefix-caching": "prefix-caching",
    "--enable-chunked-prefill": "chunked-prefill",
    "--disable-chunked-prefill": "chunked-prefill",
    "--enforce-eager": "cuda-graphs",
    "--no-enforce-eager": "cuda-graphs",
    "--optimization-level": "cuda-graphs",
}
# The drain and the autoscaler read the engine's metrics; this would turn them off.
_REFUSED = {"--disable-log-stats": "the launcher's drain and the autoscaler read engine metrics"}


class Origin(StrEnum):
    SPEC = "spec"
    DEFAULT = "default"
    LAUNCHER = "launcher"
    EXTRA = "extraArgs"


@dataclass(frozen=True)
class Option:
    flag: str
    values: tuple[str, ...] = ()
    origin: Origin = Origin.DEFAULT
    reason: str = ""
    spec_field: str = ""
    """For SPEC options: the config field that set it (named in conflict errors)."""

    @property
    def key(self) -> str:
        return _GROUPS.get(self.flag, self.flag)

    def words(self) -> list[str]:
        return [self.flag, *self.values]


def split_args(words: list[str]) -> list[Option]:
    """Group `extraArgs` into options: a word starting with `-` opens one, the words after it
    (up to the next option) are its values. `--a_b=v` is `--a-b v`, `-O3` is
    `--optimization-level 3`, and short aliases become their long names, as vLLM reads them."""
    options: list[tuple[str, list[str]]] = []
    for word in words:
        if word.startswith("-") and not _is_number(word):
            flag, eq, value = word.partition("=")
            if flag.startswith("--"):
                flag = "--" + flag[2:].replace("_", "-")
                # vLLM still accepts the old `--no-enable-x` / `--no-disable-x` spellings.
                for old, new in (("--no-enable-", "--disable-"), ("--no-disable-", "--enable-")):
                    if flag.startswith(old):
                        flag = new + flag.removeprefix(old)
            elif flag.startswith("-O") and len(flag) > 2:
                flag, value, eq = "-O", flag[2:], "="
            flag = _ALIASES.get(flag, flag)
            options.append((flag, [value] if eq else []))
        elif not options:
            raise LauncherError(
                ExitCode.CONFLICTING_ARGS, f"extraArgs must start with an option, not {word!r}"
            )
        else:
            options[-1][1].append(word)
    return [Option(flag, tuple(values), Origin.EXTRA) for flag, values in options]


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def merge(ours: list[Option], extra: list[Option], decisions: list[str]) -> list[Option]:
    seen: dict[str, Option] = {}
    for option in extra:
        if option.flag in _REFUSED:
            raise LauncherError(
                ExitCode.CONFLICTING_ARGS,
                f"extraArgs {option.flag} is refused: {_REFUSED[option.flag]}",
            )
        if option.key in seen:
            raise LauncherError(
                ExitCode.CONFLICTING_ARGS,
                f"extraArgs set {' '.join(seen[option.key].words())} "
                f"and {' '.join(option.words())}",
            )
        seen[option.key] = option
    merged: list[Option] = []
    for option in ours:
        replacement = seen.get(option.key)
        if replacement is None:
            merged.append(option)
            continue
        given = " ".join(replacement.words())
        if option.origin is Origin.LAUNCHER:
            raise LauncherError(
                ExitCode.CONFLICTING_ARGS,
                f"extraArgs {given}: {option.flag} is set by the launcher",
            )
        if option.origin is Origin.SPEC and replacement.words() != option.words():
            raise LauncherError(
                ExitCode.CONFLICTING_ARGS,
                f"extraArgs {given} contradicts {option.spec_field} ({' '.join(option.words())})",
            )
        if option.origin is Origin.DEFAULT:
            decisions.append(f"extraArgs {given} replaces the default {' '.join(option.words())}")
    return merged + extra
