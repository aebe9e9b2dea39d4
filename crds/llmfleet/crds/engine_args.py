"""`runtime.extraArgs` as the runtime launcher reads them, and every check on them that the spec
alone decides (pure: no I/O).

One module for three readers: the launcher splits and merges `extraArgs` with it (its checks are
a last line), admission refuses the same specs (each check is rendered as a CEL rule of the CRD
from the tables below, `rules()`), and `llmfleet validate` runs the rules' Python twins.

How the launcher reads the words: a word that starts with `-` and a letter (or a second `-`) opens
an option, the words after it (up to the next option) are its values. `--a_b=v` is `--a-b v`,
`-O3` is `--optimization-level 3`, short aliases become their long names, and the old
`--no-enable-x` / `--no-disable-x` spellings become `--disable-x` / `--enable-x`, as vLLM reads
them. A *family* is every spelling of one setting (`-tp` and `--tensor_parallel_size`; the three
switches of CUDA graphs): an extraArgs option replaces the launcher's default of its family and
must agree with the spec's typed field that sets it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

OPTION = "^-[-A-Za-z]"
"""An option word (RE2 and Python alike): `-` then a letter or `-`; `-1` and `-.5` are values."""
ONE_WORD = "^-[-A-Za-z][^=]*[ \t\n\r]"
"""An option word whose flag holds whitespace: a pasted `--max-num-seqs 128`."""
INTEGER = "^[0-9]{1,18}$"
NUMBER = "^([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]{1,3})?$"

ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-dp": "--data-parallel-size",
    "-q": "--quantization",
    "-sc": "--speculative-config",
    "--device-memory-utilization": "--gpu-memory-utilization",
    "-O": "--optimization-level",
}
GROUPS = {
    "--enable-prefix-caching": "prefix-caching",
    "--disable-prefix-caching": "prefix-caching",
    "--enable-chunked-prefill": "chunked-prefill",
    "--disable-chunked-prefill": "chunked-prefill",
    "--enforce-eager": "cuda-graphs",
    "--no-enforce-eager": "cuda-graphs",
    "--optimization-level": "cuda-graphs",
}
"""Options that set the same thing: one of each group at most."""
REFUSED = {"--disable-log-stats": "the launcher's drain and the autoscaler read engine metrics"}
LAUNCHER_OWNED = {
    "--host": "the launcher binds the pod's address",
    "--port": "the pool Services target the engine's port",
    "--served-model-name": "set model.servedName",
    "--shutdown-timeout": "the launcher drains before it stops the engine",
    "--model": "set model.name (the launcher passes it as vllm serve's model)",
}
"""Options only the launcher sets (it refuses them in extraArgs)."""


class ArgsError(ValueError):
    """extraArgs the launcher refuses; the message names the words."""


@dataclass(frozen=True)
class Arg:
    """One option of extraArgs with its values."""

    flag: str
    """As vLLM reads it: long name, dashes, the new negation spelling."""
    values: tuple[str, ...]
    written: str
    """The flag as written, underscores read as dashes (`--no-enable-x` stays so)."""

    @property
    def key(self) -> str:
        """Options with one key set the same thing; a family's key is its group or long name."""
        family = GROUPS.get(self.flag, self.flag)
        return family if family in FAMILY_KEYS else self.written

    def words(self) -> list[str]:
        return [self.flag, *self.values]


def is_option(word: str) -> bool:
    return re.match(OPTION, word) is not None


def _flag(word: str) -> tuple[str, str, list[str]]:
    """(vLLM's flag, the flag as written, inline values) of an option word."""
    flag, eq, value = word.partition("=")
    if flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")
        written = flag
        for old, new in (("--no-enable-", "--disable-"), ("--no-disable-", "--enable-")):
            if flag.startswith(old):
                flag = new + flag.removeprefix(old)
    else:
        if flag.startswith("-O") and len(flag) > 2:
            flag, value, eq = "-O", flag[2:], "="
        written = flag
    return ALIASES.get(flag, flag), written, [value] if eq else []


def split(words: Iterable[str]) -> list[Arg]:
    """Group the words into options (see the module docstring)."""
    options: list[tuple[str, str, list[str]]] = []
    for word in words:
        if is_option(word):
            options.append(_flag(word))
        elif not options:
            raise ArgsError(f"extraArgs must start with an option, not {word!r}")
        else:
            options[-1][2].append(word)
    return [Arg(flag, tuple(values), written) for flag, written, values in options]


# --- The families and their spellings (the CEL rules match words with these) ---------------


def _long(flag: str) -> str:
    """A long flag's spellings as a regex: `-` or `_` between its words."""
    return "--" + "[-_]".join(flag[2:].split("-"))


def _spellings(flag: str) -> list[str]:
    """Regexes of every flag part that reads as `flag` (before `=`)."""
    found = [_long(flag)] if flag.startswith("--") else [flag]
    for new, old in (("--disable-", "--no-enable-"), ("--enable-", "--no-disable-")):
        if flag.startswith(new):
            found.append(_long(old + flag.removeprefix(new)))
    found += [
        _long(alias) if alias.startswith("--") else alias
        for alias, target in ALIASES.items()
        if target == flag and alias != "-O"
    ]
    return found


def word_regex(flags: Iterable[str]) -> str:
    """A regex matching every option word (with or without `=value`) that reads as one of
    `flags`; `-O…` is `--optimization-level`."""
    flags = list(flags)
    parts = [spelling for flag in flags for spelling in _spellings(flag)]
    with_o = "|-O.*" if "--optimization-level" in flags else ""
    return "^((" + "|".join(parts) + ")(=.*)?" + with_o + ")$"


FAMILIES: dict[str, tuple[str, ...]] = {
    **{group: tuple(f for f, g in GROUPS.items() if g == group) for group in set(GROUPS.values())},
    **{target: (target,) for target in set(ALIASES.values()) if target not in GROUPS},
}
"""Key -> the flags that set it, for every setting with several spellings."""
FAMILY_KEYS = frozenset(FAMILIES)


# --- Checks on the words against the spec's typed fields -----------------------------------


@dataclass(frozen=True)
class TypedFields:
    """What the spec's typed fields set on the command line (None: unset, the launcher's
    default or vLLM's applies)."""

    max_model_len: int | None = None
    revision: str | None = None
    tensor_parallel: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    prefix_caching: bool | None = None
    chunked_prefill: bool = True
    max_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    gpu_memory_utilization: float | None = None
    cuda_graphs: bool | None = None
    speculative: bool = False
    kv_transfer: bool = False
    """A prefill or decode pool: the launcher writes `--kv-transfer-config`."""


@dataclass(frozen=True)
class Owned:
    """A flag a typed field sets when the spec sets it: extraArgs may repeat it, with the same
    value, but not contradict it."""

    flag: str
    spec_field: str
    """As the launcher names it, e.g. `runtime.tensorParallel`."""
    cel: str
    """The field in CEL, from the spec's root, e.g. `self.runtime.tensorParallel`."""
    kind: str
    """int, number, string (one value compared), json (never the same: set it in one place)."""
    value: Callable[[TypedFields], object]


OWNED = (
    Owned("--max-model-len", "model.maxModelLen", "self.model.maxModelLen", "int",
          lambda f: f.max_model_len),
    Owned("--revision", "model.revision", "self.model.revision", "string", lambda f: f.revision),
    Owned("--tensor-parallel-size", "runtime.tensorParallel", "self.runtime.tensorParallel",
          "int", lambda f: f.tensor_parallel),
    Owned("--quantization", "runtime.quantization", "self.runtime.quantization", "string",
          lambda f: f.quantization),
    Owned("--kv-cache-dtype", "runtime.kvCacheDtype", "self.runtime.kvCacheDtype", "string",
          lambda f: f.kv_cache_dtype),
    Owned("--max-num-batched-tokens", "runtime.chunkedPrefill.maxBatchedTokens",
          "self.runtime.chunkedPrefill.maxBatchedTokens", "int", lambda f: f.max_batched_tokens),
    Owned("--max-num-seqs", "runtime.maxNumSeqs", "self.runtime.maxNumSeqs", "int",
          lambda f: f.max_num_seqs),
    Owned("--gpu-memory-utilization", "runtime.gpuMemoryUtilization",
          "self.runtime.gpuMemoryUtilization", "number", lambda f: f.gpu_memory_utilization),
    Owned("--speculative-config", "runtime.speculative", "self.runtime.speculative", "json",
          lambda f: True if f.speculative else None),
)  # fmt: skip
"""The value options typed fields own (switches are below: prefix caching, chunked prefill,
CUDA graphs; and `--kv-transfer-config`, which a Disaggregated topology owns)."""


def _one_value(values: tuple[str, ...], kind: str, wanted: object) -> bool:
    if len(values) != 1:
        return False
    (value,) = values
    if kind == "int":
        return re.match(INTEGER, value) is not None and int(value) == wanted
    if kind == "number":
        return re.match(NUMBER, value) is not None and float(value) == wanted
    return kind == "string" and value == wanted


def _switches(fields: TypedFields) -> list[tuple[str, str, str]]:
    """(family, the one flag the spec sets in it, the field and its value in words)."""
    found = []
    if fields.prefix_caching is not None:
        on = fields.prefix_caching
        flag = "--enable-prefix-caching" if on else "--disable-prefix-caching"
        found.append(("prefix-caching", flag, f"runtime.prefixCaching ({str(on).lower()})"))
    if not fields.chunked_prefill:
        found.append(
            ("chunked-prefill", "--disable-chunked-prefill", "runtime.chunkedPrefill.enabled")
        )
    if fields.cuda_graphs is False:
        found.append(("cuda-graphs", "--enforce-eager", "runtime.cudaGraphs (false)"))
    return found


def contradiction(arg: Arg, fields: TypedFields) -> str | None:
    """Why `arg` contradicts a typed field the spec sets (None: it does not)."""
    given = " ".join(arg.words())
    for owned in OWNED:
        wanted = owned.value(fields)
        agrees = _one_value(arg.values, owned.kind, wanted)
        if wanted is not None and arg.flag == owned.flag and not agrees:
            return f"extraArgs {given} contradicts {owned.spec_field} ({wanted})"
    if fields.kv_transfer and arg.flag == "--kv-transfer-config":
        return f"extraArgs {given} contradicts kvTransfer.connector: set it there"
    for family, flag, field_name in _switches(fields):
        if arg.key == family and arg.words() != [flag]:
            return f"extraArgs {given} contradicts {field_name}"
    eager = arg.flag == "--enforce-eager" or arg.words() == ["--optimization-level", "0"]
    if fields.cuda_graphs and eager:
        return (
            f"extraArgs {given} contradicts runtime.cudaGraphs (true, its default): "
            "set runtime.cudaGraphs: false for eager mode"
        )
    return None


def problems(words: list[str], fields: TypedFields) -> list[str]:
    """Everything the launcher refuses in `words` given the spec's typed fields, in its words,
    the first first ([]: the launcher accepts them)."""
    found: list[str] = []
    try:
        args = split(words)
    except ArgsError as error:
        found.append(str(error))
        args = split(words[next((i for i, w in enumerate(words) if is_option(w)), len(words)) :])
    found += [
        f"extraArgs {word!r} is several words: give the option and its value as separate items"
        for word in words
        if re.match(ONE_WORD, word)
    ]
    seen: dict[str, Arg] = {}
    for arg in args:
        if arg.flag in REFUSED:
            found.append(f"extraArgs {arg.flag} is refused: {REFUSED[arg.flag]}")
        if arg.flag in LAUNCHER_OWNED:
            found.append(
                f"extraArgs {' '.join(arg.words())}: {arg.flag} is set by the launcher "
                f"({LAUNCHER_OWNED[arg.flag]})"
            )
        if arg.key in seen:
            found.append(
                f"extraArgs set {' '.join(seen[arg.key].words())} and {' '.join(arg.words())}"
            )
        seen.setdefault(arg.key, arg)
        reason = contradiction(arg, fields)
        if reason:
            found.append(reason)
    return found


# --- The same checks in CEL --------------------------------------------------------------

WORDS = "self.runtime.extraArgs"
_INDICES = "[" + ", ".join(str(i) for i in range(64)) + "]"
"""Every index extraArgs may have (its maxItems): CEL has no indexed `all`."""


def cel_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    for char, code in (("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")):
        escaped = escaped.replace(char, code)
    return f"'{escaped}'"


def _word(i: str) -> str:
    return f"{WORDS}[{i}]"


def _ends(i: str) -> str:
    """CEL: the option at `i` has no value word after it."""
    return f"({i} + 1 >= size({WORDS}) || {_word(f'{i} + 1')}.matches({cel_string(OPTION)}))"


def _single_value(i: str, test: Callable[[str], str]) -> str:
    """CEL: the option at `i` has exactly one value, and `test(value)` holds."""
    inline = f"{_word(i)}.substring({_word(i)}.indexOf('=') + 1)"
    following = _word(f"{i} + 1")
    after = f"({i} + 2 >= size({WORDS}) || {_word(f'{i} + 2')}.matches({cel_string(OPTION)}))"
    return (
        f"({_word(i)}.contains('=') ? ({test(inline)} && {_ends(i)}) : "
        f"({i} + 1 < size({WORDS}) && !{following}.matches({cel_string(OPTION)}) && "
        f"{test(following)} && {after}))"
    )


def _every_word(condition: Callable[[str], str]) -> str:
    return f"{_INDICES}.all(i, i >= size({WORDS}) || {condition('i')})"


def _owned_cel(owned: Owned) -> str:
    regex = cel_string(word_regex([owned.flag]))
    tests = {
        "int": lambda v: f"({v}.matches({cel_string(INTEGER)}) && int({v}) == {owned.cel})",
        "number": lambda v: f"({v}.matches({cel_string(NUMBER)}) && double({v}) == {owned.cel})",
        "string": lambda v: f"{v} == {owned.cel}",
        "json": lambda v: "false",
    }
    test = tests[owned.kind]
    return f"!has({owned.cel}) || " + _every_word(
        lambda i: f"!{_word(i)}.matches({regex}) || {_single_value(i, test)}"
    )


def _switch_cel(family: str, flag: str) -> str:
    """CEL: every word of `family` is `flag` itself (any spelling), without a value."""
    exact = cel_string("^(" + "|".join(_spellings(flag)) + ")$")
    regex = cel_string(word_regex(FAMILIES[family]))
    return _every_word(
        lambda i: f"!{_word(i)}.matches({regex}) || ({_word(i)}.matches({exact}) && {_ends(i)})"
    )


@dataclass(frozen=True)
class ArgsRule:
    """One check of extraArgs: CEL over the spec, a message, and the launcher's check (a
    Python predicate over its problems' words)."""

    cel: str
    message: str
    refuses: Callable[[str], bool]
    """True for the launcher's problems (see `problems`) this rule stands for."""


def _mentions(words: str) -> Callable[[str], bool]:
    return lambda problem: words in problem


def _no_word(regex: str) -> str:
    return f"{WORDS}.all(w, !w.matches({cel_string(regex)}))"


def _norm(w: str) -> str:
    """CEL: the flag of option word `w` as written, underscores read as dashes (`Arg.written`)."""
    return f"({w}.startsWith('--') ? {w}.split('=')[0].replace('_', '-') : {w}.split('=')[0])"


_TWICE = (
    "runtime.extraArgs set one option twice (its spellings and aliases count as one: -tp and "
    "--tensor-parallel-size; --enable-x and --disable-x; --enforce-eager and -O)"
)


def rules() -> list[ArgsRule]:
    """Every check of extraArgs as admission runs it."""
    owned_flags = ", ".join(LAUNCHER_OWNED)
    eager = cel_string(word_regex(["--enforce-eager"]))
    level_0 = cel_string("^(-O0(=.*)?|-O=0|--optimization[-_]level=0)$")
    level = cel_string("^(-O|--optimization[-_]level)$")
    found = [
        ArgsRule(
            f"size({WORDS}) == 0 || {WORDS}[0].matches({cel_string(OPTION)})",
            "runtime.extraArgs must start with an option (-x or --x): not a pasted command "
            "line (`vllm serve MODEL …`), not a value without its option",
            lambda p: "must start with an option" in p,
        ),
        ArgsRule(
            _no_word(ONE_WORD),
            "runtime.extraArgs: each item is one word; give an option and its value as two "
            "items (`--max-num-seqs`, `128`) or as `--max-num-seqs=128`",
            lambda p: "is several words" in p,
        ),
        ArgsRule(
            _no_word(word_regex(REFUSED)),
            "runtime.extraArgs may not turn engine metrics off (--disable-log-stats): the "
            "launcher's drain and the autoscaler read them",
            lambda p: "is refused" in p,
        ),
        ArgsRule(
            _no_word(word_regex(LAUNCHER_OWNED)),
            f"runtime.extraArgs may not set {owned_flags}: the launcher sets them (the model "
            "is model.name, the name clients send model.servedName)",
            lambda p: "is set by the launcher" in p,
        ),
        # Two rules with one message: together they would exceed a rule's cost budget.
        ArgsRule(
            " && ".join(
                f"{WORDS}.filter(w, w.matches({cel_string(word_regex(flags))})).size() <= 1"
                for _, flags in sorted(FAMILIES.items())
            ),
            _TWICE,
            lambda p: p.startswith("extraArgs set "),
        ),
        ArgsRule(
            f"{WORDS}.all(a, !a.matches({cel_string(OPTION)}) || "
            f"{WORDS}.exists_one(w, {_norm('w')} == {_norm('a')}))",
            _TWICE,
            lambda p: p.startswith("extraArgs set "),
        ),
        ArgsRule(
            "!self.runtime.cudaGraphs || "
            + _every_word(
                lambda i: (
                    f"(!{_word(i)}.matches({eager}) && !({_word(i)}.matches({level_0}) "
                    f"&& {_ends(i)}) && !({_word(i)}.matches({level}) && "
                    f"{_single_value(i, lambda v: f'{v} == {chr(39)}0{chr(39)}')}))"
                )
            ),
            "runtime.extraArgs --enforce-eager (or -O0) contradicts runtime.cudaGraphs (true, "
            "its default): set runtime.cudaGraphs: false for eager mode",
            lambda p: "contradicts runtime.cudaGraphs (true" in p,
        ),
    ]
    for owned in OWNED:
        same = "" if owned.kind == "json" else " (extraArgs may repeat it with the same value)"
        found.append(
            ArgsRule(
                _owned_cel(owned),
                f"runtime.extraArgs {owned.flag} contradicts {owned.spec_field}: set it in one "
                f"place{same}",
                _mentions(f"contradicts {owned.spec_field} ("),
            )
        )
    found += [
        ArgsRule(
            "self.topology.mode != 'Disaggregated' || "
            + _no_word(word_regex(["--kv-transfer-config"])),
            "runtime.extraArgs --kv-transfer-config contradicts topology.kvTransfer: "
            "a Disaggregated service's KV transfer is set there",
            lambda p: "contradicts kvTransfer.connector" in p,
        ),
        ArgsRule(
            "!self.runtime.prefixCaching || " + _switch_cel("prefix-caching",
                                                            "--enable-prefix-caching"),
            "runtime.extraArgs --disable-prefix-caching contradicts runtime.prefixCaching "
            "(true, its default): set runtime.prefixCaching: false instead",
            lambda p: "contradicts runtime.prefixCaching (true)" in p,
        ),
        ArgsRule(
            "self.runtime.prefixCaching || " + _switch_cel("prefix-caching",
                                                           "--disable-prefix-caching"),
            "runtime.extraArgs --enable-prefix-caching contradicts runtime.prefixCaching "
            "(false): set it in one place",
            lambda p: "contradicts runtime.prefixCaching (false)" in p,
        ),
        ArgsRule(
            "self.runtime.chunkedPrefill.enabled || "
            + _switch_cel("chunked-prefill", "--disable-chunked-prefill"),
            "runtime.extraArgs --enable-chunked-prefill contradicts runtime.chunkedPrefill."
            "enabled (false): set it in one place",
            lambda p: "contradicts runtime.chunkedPrefill.enabled" in p,
        ),
        ArgsRule(
            "self.runtime.cudaGraphs || " + _switch_cel("cuda-graphs", "--enforce-eager"),
            "runtime.extraArgs -O or --no-enforce-eager contradicts runtime.cudaGraphs "
            "(false): set runtime.cudaGraphs: true to choose an optimization level",
            lambda p: "contradicts runtime.cudaGraphs (false)" in p,
        ),
    ]  # fmt: skip
    return found
