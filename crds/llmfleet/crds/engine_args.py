"""`runtime.extraArgs` as the runtime launcher reads them, and every check on them that the spec
alone decides (pure: no I/O).

One module for three readers: the launcher splits and merges `extraArgs` with it (its checks are
a last line), admission refuses the same specs (`engine_args_cel` renders each check as a CEL
rule of the CRD from the tables below), and `llmfleet validate` runs the rules' Python twins,
which are the checks here.

How the launcher reads the words: a word that starts with `-` and a letter (or a second `-`) opens
an option, the words after it (up to the next option) are its values. `--a_b=v` is `--a-b v`,
`-O3` is `--optimization-level 3`, short aliases become their long names, and the old
`--no-enable-x` / `--no-disable-x` spellings become `--disable-x` / `--enable-x`, as vLLM reads
them. A *family* is every spelling of one setting (`-tp` and `--tensor_parallel_size`; the three
switches of CUDA graphs): an extraArgs option replaces the launcher's default of its family and
must agree with the spec's typed field that sets it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

OPTION = "^-[-A-Za-z]"
"""An option word (RE2 and Python alike): `-` then a letter or `-`; `-1` and `-.5` are values."""
ONE_WORD = "^-[-A-Za-z][^=]*[ \t\n\r]"
"""An option word whose flag holds whitespace: a pasted `--max-num-seqs 128`."""
INTEGER = "^[0-9]{1,18}$"
SMALL_INTEGER = "^[0-9]{1,9}$"
"""A parallel size: small enough that the product of two fits an int64 in CEL."""
NUMBER = "^([0-9]+([.][0-9]*)?|[.][0-9]+)([eE][-+]?[0-9]{1,3})?$"

ALIASES = {
    "-tp": "--tensor-parallel-size",
    "-dp": "--data-parallel-size",
    "-pp": "--pipeline-parallel-size",
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
REFUSED = {
    "--disable-log-stats": "the launcher's drain and the autoscaler read engine metrics",
    "--api-key": "the gateway, its health checks and the launcher call the engine without a "
    "key (tenants' keys are the gateway's)",
    "--ssl-keyfile": "the gateway, Prometheus and the launcher speak plain HTTP to the engine",
    "--ssl-certfile": "the gateway, Prometheus and the launcher speak plain HTTP to the engine",
    "--headless": "it starts no API server, and the pool Services send requests to it",
}
"""Options the launcher refuses outright (flag -> why)."""
LAUNCHER_OWNED = {
    "--host": "the launcher binds the pod's address",
    "--port": "the pool Services target the engine's port",
    "--served-model-name": "set model.servedName",
    "--shutdown-timeout": "the launcher drains before it stops the engine",
    "--model": "set model.name (the launcher passes it as vllm serve's model)",
    "--uds": "the engine serves the pod's port, which the pool Services target",
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


def spellings(flag: str) -> list[str]:
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
    parts = [spelling for flag in flags for spelling in spellings(flag)]
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
    gpu_count: int = 1
    """GPUs in each pod (`runtime.gpu.count`)."""
    streamed_source: bool = False
    """`model.source` is `s3://` or `gs://`: the launcher loads it with `--load-format
    runai_streamer`."""


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
    reason = _overridden(arg, fields)
    if reason:
        return reason
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


def _overridden(arg: Arg, fields: TypedFields) -> str | None:
    """Why `arg` would make vLLM ignore what a typed field asks for (None: it does not)."""
    given = " ".join(arg.words())
    if fields.gpu_memory_utilization is not None and arg.flag == KV_CACHE_BYTES:
        return (
            f"extraArgs {given} and runtime.gpuMemoryUtilization "
            f"({fields.gpu_memory_utilization}) both size the KV cache: vLLM takes the bytes, "
            "ignoring the fraction"
        )
    streamer = len(arg.values) == 1 and arg.values[0].startswith(STREAMER)
    if fields.streamed_source and arg.flag == LOAD_FORMAT and not streamer:
        return (
            f"extraArgs {given} contradicts model.source (s3:// or gs://, which only the "
            f"Run:ai streamer reads: --load-format {STREAMER})"
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
        if arg.flag in VALUE_OPTIONS and len(arg.values) != 1:
            found.append(
                f"extraArgs {' '.join(arg.words())}: {arg.flag} takes one value, "
                f"not {len(arg.values)}"
            )
        reason = out_of_range(arg)
        if reason:
            found.append(reason)
    for reason in (parallelism(args, fields), engines_fit(words, fields)):
        if reason:
            found.append(reason)
    found += [
        f"extraArgs {' '.join(arg.words())}: {size} does not divide the pod's {fields.gpu_count} "
        "GPUs (runtime.gpu.count)"
        for arg in args
        if arg.flag == TENSOR_PARALLEL
        and (size := _size(arg))
        and size <= fields.gpu_count
        and fields.gpu_count % size
    ]
    found += engine_limits(args, fields)
    return found


KV_CACHE_BYTES, LOAD_FORMAT, STREAMER = "--kv-cache-memory-bytes", "--load-format", "runai_streamer"
VALUE_OPTIONS = (*(owned.flag for owned in OWNED), "--data-parallel-size",
                 "--pipeline-parallel-size", "--kv-transfer-config", KV_CACHE_BYTES,
                 LOAD_FORMAT)  # fmt: skip
"""Options that take exactly one value (vLLM's parser refuses the command line otherwise)."""
AT_LEAST_ONE = ("--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size",
                "--max-num-seqs", "--max-num-batched-tokens")  # fmt: skip
"""Options whose value, a whole number, must be at least 1 (as their typed fields' are)."""
FRACTION = "--gpu-memory-utilization"
"""An option whose value, a number, must be in (0, 1] (as `runtime.gpuMemoryUtilization`)."""


def first_value(arg: Arg) -> str:
    """The option's first value ('' without one): what vLLM reads when it starts at all."""
    return arg.values[0] if arg.values else ""


@functools.lru_cache(maxsize=64)
def _flag_pattern(flag: str) -> re.Pattern[str]:
    """`word_regex([flag])` compiled, once per flag: an admission check of one spec reads the
    same few flags dozens of times."""
    return re.compile(word_regex([flag]))


def first_values(words: list[str], flag: str) -> list[str]:
    """The first value of each option word that reads as `flag` ('' without one), word by word
    as the CEL rules read them (`engine_args_cel.first_values`): whatever the list starts with."""
    pattern = _flag_pattern(flag)
    found = []
    for i, word in enumerate(words):
        if pattern.match(word) is None:
            continue
        if "=" in word:
            found.append(word.partition("=")[2])
        elif i + 1 < len(words) and not is_option(words[i + 1]):
            found.append(words[i + 1])
        else:
            found.append("")
    return found


def out_of_range(arg: Arg) -> str | None:
    """Why the number `arg` gives is one vLLM refuses (None: it is not, or not a number)."""
    value = first_value(arg)
    # Not a whole number at all ('' too: an empty word, or none) is refused as well: vLLM's
    # parser refuses it, and the launcher reads these sizes to plan the pod's GPUs.
    if arg.flag in AT_LEAST_ONE and not (re.match(INTEGER, value) and int(value) >= 1):
        return (f"extraArgs {' '.join(arg.words())}: {arg.flag} cannot take {value!r} "
                "(a whole number, at least 1)")  # fmt: skip
    if arg.flag == FRACTION and re.match(NUMBER, value) and not 0 < float(value) <= 1:
        return f"extraArgs {' '.join(arg.words())}: {arg.flag} cannot take {value} (in (0, 1])"
    return None


BATCHED_TOKENS, NUM_SEQS = "--max-num-batched-tokens", "--max-num-seqs"


def engine_limits(args: list[Arg], fields: TypedFields) -> list[str]:
    """vLLM's start-time limits between a number extraArgs give and a typed field (both typed:
    the spec's own rules): the step budget holds every running sequence (`--max-num-batched-
    tokens` >= `runtime.maxNumSeqs`, `--max-num-seqs` <= `chunkedPrefill.maxBatchedTokens`),
    and a whole prompt with chunked prefill off (>= `model.maxModelLen`)."""
    limits = (
        # (option, the typed field's value, its name, True when the option must be at least it)
        (BATCHED_TOKENS, fields.max_num_seqs, "runtime.maxNumSeqs", True),
        (BATCHED_TOKENS, None if fields.chunked_prefill else fields.max_model_len,
         "model.maxModelLen with chunked prefill off", True),
        (NUM_SEQS, fields.max_batched_tokens, "runtime.chunkedPrefill.maxBatchedTokens", False),
    )  # fmt: skip
    found = []
    for arg in args:
        value = first_value(arg)
        if re.match(INTEGER, value) is None:
            continue
        for flag, bound, name, at_least in limits:
            if arg.flag != flag or bound is None:
                continue
            if at_least and int(value) < bound:
                found.append(f"extraArgs {' '.join(arg.words())} is below {name} ({bound}): "
                             "vLLM's limits refuse it")  # fmt: skip
            if not at_least and int(value) > bound:
                found.append(f"extraArgs {' '.join(arg.words())} is above {name} ({bound}): "
                             "vLLM's limits refuse it")  # fmt: skip
    return found


TENSOR_PARALLEL, DATA_PARALLEL = "--tensor-parallel-size", "--data-parallel-size"
PIPELINE_PARALLEL = "--pipeline-parallel-size"
FIT_WHY = (
    "(runtime.gpu.count: tensor x pipeline parallel must divide it, and x data parallel not "
    "exceed it)"
)
"""The end of every problem `engines_fit` reports (its rule's twin looks for it)."""


def _size(arg: Arg) -> int | None:
    """A parallel size given in extraArgs: its first value, when a small whole number."""
    value = arg.values[0] if arg.values else ""
    return int(value) if re.match(SMALL_INTEGER, value) else None


def parallelism(args: list[Arg], fields: TypedFields) -> str | None:
    """Why the parallel sizes extraArgs give need more GPUs than a pod has (vLLM fails to start
    when tensor x data parallel exceeds them); None when they fit, as far as checked: `-tp t`
    needs t GPUs; `-dp d` needs d x the tensor-parallel size, which is `tensorParallel` (the GPU
    count when unset), or 1 when extraArgs set `-tp` too: the product of the first `-tp` and
    the first `-dp` is `engines_fit`'s (a CEL rule that multiplies every option of the list by
    every other exceeds the API server's cost budget)."""
    count = fields.gpu_count
    tensor = [size for a in args if a.flag == TENSOR_PARALLEL and (size := _size(a)) is not None]
    data = [size for a in args if a.flag == DATA_PARALLEL and (size := _size(a)) is not None]
    given_tp = any(a.flag == TENSOR_PARALLEL for a in args)
    base = 1 if given_tp else fields.tensor_parallel or count
    over = [t for t in tensor if t > count] + [d * base for d in data if d * base > count]
    if over:
        return (
            f"extraArgs ask for {over[0]} GPUs (tensor x data parallel) but a pod has "
            f"{count} (runtime.gpu.count)"
        )
    return None


def first_size(words: list[str], flag: str) -> int | None:
    """The first value extraArgs give `flag`, word by word (`first_values`), when it is a small
    whole number; None when they give none, or something else (other checks refuse that)."""
    values = first_values(words, flag)
    return int(values[0]) if values and re.match(SMALL_INTEGER, values[0]) else None


def default_tensor_parallel(count: int, pipeline_size: int | None) -> int:
    """The launcher's tensor-parallel size when neither `runtime.tensorParallel` nor extraArgs
    set one: one engine over all the pod's GPUs, so `gpu.count / -pp` when extraArgs give a
    pipeline-parallel size that divides the count (else the count: `engines_fit` refuses that)."""
    if pipeline_size and pipeline_size <= count and count % pipeline_size == 0:
        return count // pipeline_size
    return count


def engines_fit(words: list[str], fields: TypedFields) -> str | None:
    """Why the engines extraArgs' parallel sizes make do not fit the pod's GPUs (None: they do,
    or extraArgs give no size this checks). One engine takes tensor x pipeline GPUs (pipeline 1
    without `-pp`) and the data-parallel ranks one engine each (vLLM refuses to start on fewer
    GPUs), and the engine's GPUs must divide the pod's, as `runtime.tensorParallel` must (the
    rest would idle). The sizes are the first value of each option (`first_values`; one option
    twice is refused apart). A `-dp` left out is 1 (the launcher's default follows: the GPUs
    left over).

    With `-pp p`: the tensor size is extraArgs' `-tp`, else `runtime.tensorParallel`, else it
    follows: `gpu.count / p` (`default_tensor_parallel`), so that only p dividing the count is
    checked. Without `-pp`: only extraArgs' `-tp t` beside `-dp d` is checked here, when t fits
    and divides the count (`parallelism` and the divisibility check refuse the rest, and `-dp`
    against `tensorParallel` or the count). Values that are no small whole number, or 0, are
    other checks' to refuse."""
    count = fields.gpu_count
    pipes, tensors = first_values(words, PIPELINE_PARALLEL), first_values(words, TENSOR_PARALLEL)
    datas = first_values(words, DATA_PARALLEL)
    d = int(datas[0]) if datas and re.match(SMALL_INTEGER, datas[0]) else 1
    if not pipes:
        return _tensor_by_data(tensors, d, count)
    p = _positive(pipes)
    t = _positive(tensors) if tensors else fields.tensor_parallel
    if p is None or (tensors and t is None):
        return None
    if t is None:  # the tensor size follows -pp: gpu.count / p
        return (
            None
            if count % p == 0
            else f"extraArgs {PIPELINE_PARALLEL} {p} must divide the pod's {count} GPUs {FIT_WHY}"
        )
    if t * p <= count and count % (t * p) == 0 and d * t * p <= count:
        return None
    return (
        f"extraArgs {PIPELINE_PARALLEL} {p}: tensor x pipeline x data parallel ({t} x {p} x {d}) "
        f"must fit the pod's {count} GPUs {FIT_WHY}"
    )


def _positive(values: list[str]) -> int | None:
    """The first of `first_values`' values when it is a small whole number above 0, else None."""
    return (
        int(values[0]) if values and re.match(SMALL_INTEGER, values[0]) and int(values[0]) else None
    )


def _tensor_by_data(tensors: list[str], d: int, count: int) -> str | None:
    """`engines_fit` without `-pp`: extraArgs' first `-tp` x `d` against the count, when that
    `-tp` is a size that fits and divides it (other checks refuse the rest)."""
    if not tensors or not re.match(SMALL_INTEGER, tensors[0]):
        return None
    t = int(tensors[0])
    if t == 0 or t > count or count % t or d * t <= count:
        return None
    return (
        f"extraArgs {TENSOR_PARALLEL} {t} and {DATA_PARALLEL} {d}: tensor x pipeline x data "
        f"parallel ({t} x 1 x {d}) must fit the pod's {count} GPUs {FIT_WHY}"
    )
