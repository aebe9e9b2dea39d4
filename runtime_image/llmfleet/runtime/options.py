"""Command-line options with their origin, and how `extraArgs` merge with the launcher's.

An option comes from the spec (a field the user set), a launcher default (with its reason), the
launcher itself (ports, model: never overridable) or `extraArgs`. extraArgs replace defaults of
the same option; contradicting the spec, each other, or a launcher-owned option is an error,
never a silent merge. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from llmfleet.crds import engine_args
from llmfleet.crds.engine_args import GROUPS, TypedFields
from llmfleet.runtime.errors import ExitCode, LauncherError


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
        return GROUPS.get(self.flag, self.flag)

    def words(self) -> list[str]:
        return [self.flag, *self.values]


def split_args(words: list[str]) -> list[Option]:
    """Group `extraArgs` into options as vLLM reads them (`engine_args.split`)."""
    try:
        args = engine_args.split(words)
    except engine_args.ArgsError as error:
        raise LauncherError(ExitCode.CONFLICTING_ARGS, str(error)) from None
    return [Option(arg.flag, arg.values, Origin.EXTRA) for arg in args]


def merge(
    ours: list[Option], words: list[str], fields: TypedFields, decisions: list[str]
) -> list[Option]:
    """Our options with `extraArgs` (`words`) merged in: an extra option replaces a default of
    the same key; anything admission refuses (`engine_args.problems`: a contradiction with a
    typed field, a launcher-owned option, one set twice) is refused here too, as a last line."""
    problems = engine_args.problems(words, fields)
    if problems:
        raise LauncherError(ExitCode.CONFLICTING_ARGS, problems[0])
    extra = split_args(words)
    seen = {option.key: option for option in extra}
    merged: list[Option] = []
    for option in ours:
        replacement = seen.get(option.key)
        if replacement is None:
            merged.append(option)
            continue
        given = " ".join(replacement.words())
        if option.origin is Origin.LAUNCHER:  # engine_args.LAUNCHER_OWNED lists it: refused above
            raise LauncherError(
                ExitCode.CONFLICTING_ARGS,
                f"extraArgs {given}: {option.flag} is set by the launcher",
            )
        if option.origin is Origin.DEFAULT:
            decisions.append(f"extraArgs {given} replaces the default {' '.join(option.words())}")
        # A SPEC option that extraArgs repeat agrees with them (checked above): theirs stays.
    return merged + extra
