"""Requests the API server itself has counted (`apiserver_request_total`, by verb, resource and
subresource): what a test reads to say a component is silent, not what the component says."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection

from tests.cluster.kube import Kube

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def api_requests(
    kube: Kube, verbs: Collection[str], resources: Collection[tuple[str, str]]
) -> Counter[tuple[str, str, str]]:
    """(verb, resource, subresource) -> requests counted so far, for `verbs` (e.g. LIST, GET,
    APPLY) on `resources` ((resource, subresource) pairs; "" for the object itself)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for line in kube.kubectl("get", "--raw", "/metrics").splitlines():
        found = _SAMPLE.match(line)
        if found is None:
            continue
        labels = dict(_LABEL.findall(found["labels"]))
        key = (labels.get("resource", ""), labels.get("subresource", ""))
        if labels.get("verb") in verbs and key in resources:
            counts[(labels["verb"], *key)] += int(float(found["value"]))
    return counts


def since(
    before: Counter[tuple[str, str, str]], after: Counter[tuple[str, str, str]]
) -> dict[tuple[str, str, str], int]:
    """The counts that moved between two readings."""
    return {key: after[key] - before[key] for key in after if after[key] != before[key]}
