"""A Dockerfile read as data: its final stage's instructions, enough to compare with a recipe
(base, apt packages, pip requirements, copies, user, environment, entrypoint, ports)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for word, args in self.instructions if word == keyword]

    def one(self, keyword: str) -> str:
        found = self.all(keyword)
        assert len(found) == 1, f"{keyword} appears {len(found)} times in the final stage"
        return found[0]


def stages(path: Path) -> list[Stage]:
    """Every stage's instructions: continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    found: list[Stage] = []
    for line in logical:
        word, _, args = line.strip().partition(" ")
        word, args = word.upper(), args.strip()
        if word == "FROM":
            found.append(Stage(args.split()[0]))
        else:
            found[-1].instructions.append((word, args))
    return found


def final(path: Path) -> Stage:
    return stages(path)[-1]


def exec_form(args: str) -> tuple[str, ...]:
    return tuple(json.loads(args))


def env(stage: Stage) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    for args in stage.all("ENV"):
        for word in shlex.split(args):
            key, _, value = word.partition("=")
            pairs.append((key, value))
    return tuple(pairs)


def apt_packages(stage: Stage) -> tuple[str, ...]:
    for run in stage.all("RUN"):
        match = re.search(r"apt-get install -y --no-install-recommends ([^&]+)", run)
        if match:
            return tuple(match[1].split())
    return ()


def pip_installs(stage: Stage) -> list[list[str]]:
    """The arguments of each `pip … install` (options dropped), one list per RUN."""
    installs = []
    for run in stage.all("RUN"):
        for command in run.split("&&"):
            words = shlex.split(command)
            if "pip" in " ".join(words) and "install" in words:
                after = words[words.index("install") + 1 :]
                installs.append([word for word in after if not word.startswith("-")])
    return installs


def copies(stage: Stage) -> list[tuple[str, str]]:
    """(source, destination) of each COPY from the build context."""
    pairs = []
    for args in stage.all("COPY"):
        words = [word for word in args.split() if not word.startswith("--")]
        if "--from=" not in args:
            pairs.append((words[0], words[1]))
    return pairs


def copies_from(stage: Stage) -> list[tuple[str, str, str]]:
    """(stage, source, destination) of each COPY --from=<stage>."""
    found = []
    for args in stage.all("COPY"):
        match = re.search(r"--from=(\S+)", args)
        if match:
            words = [word for word in args.split() if not word.startswith("--")]
            found.append((match[1], words[0], words[1]))
    return found
