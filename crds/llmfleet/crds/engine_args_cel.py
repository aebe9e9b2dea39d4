"""The checks of `runtime.extraArgs` (`engine_args`) as CEL rules of the CRD (pure).

Each rule is rendered from `engine_args`' tables: the families' spellings as regexes (RE2 and
Python read them alike; tests/crds/test_engine_args.py checks them against the launcher's
reading), the typed fields' options, and the words at each index of the list (CEL has no indexed
`all`, so the rules walk a literal list of every index extraArgs may have). A rule's Python twin
is the launcher's own check: it refuses when `engine_args.problems` reports what it stands for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmfleet.crds._base import cel_string
from llmfleet.crds.engine_args import (
    AT_LEAST_ONE,
    BATCHED_TOKENS,
    FAMILIES,
    FIT_WHY,
    FRACTION,
    INTEGER,
    KV_CACHE_BYTES,
    LAUNCHER_OWNED,
    LOAD_FORMAT,
    NUM_SEQS,
    NUMBER,
    ONE_WORD,
    OPTION,
    OWNED,
    PIPELINE_PARALLEL,
    REFUSED,
    SMALL_INTEGER,
    STREAMER,
    VALUE_OPTIONS,
    Owned,
    spellings,
    word_regex,
)

WORDS = "self.runtime.extraArgs"
_INDICES = "[" + ", ".join(str(i) for i in range(64)) + "]"
"""Every index extraArgs may have (its maxItems): CEL has no indexed `all`."""


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
    exact = cel_string("^(" + "|".join(spellings(flag)) + ")$")
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


def _sizes(flag: str) -> str:
    """CEL: the first value of each option of `flag`'s family ('' when it has none)."""
    regex = cel_string(word_regex([flag]))
    value = (
        f"({_word('i')}.contains('=') ? {_word('i')}.substring({_word('i')}.indexOf('=') + 1) : "
        f"(i + 1 < size({WORDS}) && !{_word('i + 1')}.matches({cel_string(OPTION)}) ? "
        f"{_word('i + 1')} : ''))"
    )
    return (
        f"{_INDICES}.filter(i, i < size({WORDS}) && {_word('i')}.matches({regex})).map(i, {value})"
    )


def first_values(flag: str) -> str:
    """CEL: the first value of each option of `flag` in extraArgs, as read word by word ('' when
    it has none); `engine_args.first_values` is its Python twin."""
    return _sizes(flag)


def _parallelism_cel() -> str:
    """CEL twin of `engine_args.parallelism` (no list computed inside another's loop: the cost
    estimate multiplies them)."""
    count = "self.runtime.gpu.count"
    small = cel_string(SMALL_INTEGER)
    tensor, data = _sizes("--tensor-parallel-size"), _sizes("--data-parallel-size")
    given_tp = f"{WORDS}.exists(w, w.matches({cel_string(word_regex(['--tensor-parallel-size']))}))"
    base = f"(has(self.runtime.tensorParallel) ? self.runtime.tensorParallel : {count})"
    return (
        f"{tensor}.all(t, !t.matches({small}) || int(t) <= {count}) && ({given_tp} ? "
        f"{data}.all(d, !d.matches({small}) || int(d) <= {count}) : "
        f"{data}.all(d, !d.matches({small}) || int(d) * {base} <= {count}))"
    )


def _engines_fit_cel() -> str:
    """CEL twin of `engine_args.engines_fit`: the first value of each size (CEL has no `let`, and
    binding a list with a one-item `all` leaves its size unknown to the cost estimate, which
    then exceeds the budget a hundredfold; each use below is a list of its own, added up)."""
    count, small = "self.runtime.gpu.count", cel_string(SMALL_INTEGER)
    typed = "self.runtime.tensorParallel"
    pps, tps = _sizes(PIPELINE_PARALLEL), _sizes("--tensor-parallel-size")
    dps = _sizes("--data-parallel-size")
    p, t = f"int({pps}[0])", f"int({tps}[0])"
    d = f"(size({dps}) > 0 && {dps}[0].matches({small}) ? int({dps}[0]) : 1)"

    def fits(tensor: str) -> str:
        # tensor x pipeline first: at most 8 when it passes, so x data cannot overflow an int.
        return (
            f"({tensor} * {p} <= {count} && {count} % ({tensor} * {p}) == 0 && "
            f"{d} * {tensor} * {p} <= {count})"
        )

    # Without -pp: -tp beside -dp, when -tp fits and divides the count (other rules' otherwise;
    # t is then at most 8, so d x t cannot overflow an int).
    without = (
        f"(size({tps}) == 0 || !{tps}[0].matches({small}) || {t} == 0 || {t} > {count} || "
        f"{count} % {t} != 0 || {d} * {t} <= {count})"
    )
    return (
        f"size({pps}) == 0 ? {without} : (!{pps}[0].matches({small}) || {p} == 0 || "
        f"(size({tps}) > 0 ? (!{tps}[0].matches({small}) || {t} == 0 || {fits(t)}) : "
        f"has({typed}) ? {fits(typed)} : {count} % {p} == 0))"
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
        *(
            ArgsRule(
                _no_word(word_regex([flag])),
                f"runtime.extraArgs may not set {flag}: {why}",
                lambda p, flag=flag: f"extraArgs {flag} is refused" in p,  # type: ignore[misc]
            )
            for flag, why in REFUSED.items()
        ),
        ArgsRule(
            _every_word(
                lambda i: (
                    f"!{_word(i)}.matches({cel_string(word_regex(VALUE_OPTIONS))}) || "
                    f"{_single_value(i, lambda v: 'true')}"
                )
            ),
            "runtime.extraArgs gives an option that takes one value none, or several ("
            + ", ".join(VALUE_OPTIONS)
            + "): vLLM refuses the command line",
            lambda p: "takes one value" in p,
        ),
        ArgsRule(
            " && ".join(
                f"{_sizes(flag)}.all(v, v.matches({cel_string(INTEGER)}) && int(v) >= 1)"
                for flag in AT_LEAST_ONE
            )
            + f" && {_sizes(FRACTION)}.all(v, !v.matches({cel_string(NUMBER)}) || "
            "(double(v) > 0.0 && double(v) <= 1.0))",
            "runtime.extraArgs gives an option a number vLLM refuses: "
            + ", ".join(AT_LEAST_ONE)
            + f" a whole number, at least 1, {FRACTION} in (0, 1]",
            lambda p: "cannot take" in p,
        ),
        ArgsRule(
            "!has(self.runtime.gpuMemoryUtilization) || " + _no_word(word_regex([KV_CACHE_BYTES])),
            f"runtime.extraArgs {KV_CACHE_BYTES} and runtime.gpuMemoryUtilization both size "
            "the KV cache: vLLM takes the bytes, ignoring the fraction; set one of them",
            lambda p: "both size the KV cache" in p,
        ),
        ArgsRule(
            "!has(self.model.source) || !(self.model.source.startsWith('s3://') || "
            "self.model.source.startsWith('gs://')) || "
            + _every_word(
                lambda i: (
                    f"!{_word(i)}.matches({cel_string(word_regex([LOAD_FORMAT]))}) || "
                    + _single_value(i, lambda v: f"{v}.startsWith({cel_string(STREAMER)})")
                )
            ),
            f"runtime.extraArgs {LOAD_FORMAT} contradicts model.source: an s3:// or gs:// "
            f"source is read only by the Run:ai streamer ({LOAD_FORMAT} {STREAMER}, which the "
            "launcher sets)",
            lambda p: "contradicts model.source" in p,
        ),
        ArgsRule(
            "!has(self.runtime.maxNumSeqs) || "
            f"{_sizes(BATCHED_TOKENS)}.all(v, !v.matches({cel_string(INTEGER)}) || "
            "int(v) >= self.runtime.maxNumSeqs)",
            f"runtime.extraArgs {BATCHED_TOKENS} is below runtime.maxNumSeqs: every running "
            "sequence decodes a token in each step (vLLM refuses to start otherwise)",
            lambda p: "is below runtime.maxNumSeqs" in p,
        ),
        ArgsRule(
            "self.runtime.chunkedPrefill.enabled || !has(self.model.maxModelLen) || "
            f"{_sizes(BATCHED_TOKENS)}.all(v, !v.matches({cel_string(INTEGER)}) || "
            "int(v) >= self.model.maxModelLen)",
            f"runtime.extraArgs {BATCHED_TOKENS} is below model.maxModelLen with chunked "
            "prefill off: a step must hold a whole prompt (vLLM refuses to start otherwise)",
            lambda p: "is below model.maxModelLen" in p,
        ),
        ArgsRule(
            "!has(self.runtime.chunkedPrefill.maxBatchedTokens) || "
            f"{_sizes(NUM_SEQS)}.all(v, !v.matches({cel_string(INTEGER)}) || "
            "int(v) <= self.runtime.chunkedPrefill.maxBatchedTokens)",
            f"runtime.extraArgs {NUM_SEQS} is above runtime.chunkedPrefill.maxBatchedTokens: "
            "every running sequence decodes a token in each step (vLLM refuses to start "
            "otherwise)",
            lambda p: "is above runtime.chunkedPrefill.maxBatchedTokens" in p,
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
            _parallelism_cel(),
            "runtime.extraArgs --tensor-parallel-size or --data-parallel-size ask for more GPUs "
            "than a pod has: tensor x data parallel must not exceed runtime.gpu.count (1 by "
            "default; without -tp in extraArgs the tensor-parallel size is "
            "runtime.tensorParallel, or gpu.count)",
            _mentions("(tensor x data parallel)"),
        ),
        ArgsRule(
            _engines_fit_cel(),
            "runtime.extraArgs parallel sizes do not fit runtime.gpu.count (1 by default): one "
            "engine takes tensor x pipeline parallel GPUs (pipeline 1 without -pp), which must "
            "divide gpu.count, and each data-parallel rank (-dp, 1 by default) one engine "
            "(with -pp but without -tp in extraArgs or runtime.tensorParallel, the "
            "tensor-parallel size follows: gpu.count / -pp)",
            lambda p: p.endswith(FIT_WHY),
        ),
        ArgsRule(
            f"{_sizes('--tensor-parallel-size')}.all(t, !t.matches({cel_string(SMALL_INTEGER)}) "
            "|| int(t) == 0 || int(t) > self.runtime.gpu.count || "
            "self.runtime.gpu.count % int(t) == 0)",
            "runtime.extraArgs --tensor-parallel-size must divide runtime.gpu.count (1 by "
            "default), as runtime.tensorParallel must: the GPUs left over would idle",
            lambda p: "does not divide the pod's" in p,
        ),
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
