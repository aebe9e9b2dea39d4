"""The `InferenceService` resource (llmfleet.dev/v1alpha1, short name `llmsvc`): spec and status.

The operator owns `status` except `status.autoscaling`, which only the autoscaler writes; no
controller ever writes `spec` (GitOps owns it).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field

from llmfleet.crds._base import ApiModel, defaulted
from llmfleet.crds.policy import RolloutSpec, TrafficSpec
from llmfleet.crds.spec import (
    AutoscalingSpec,
    Mode,
    ModelSpec,
    PoolSpec,
    RuntimeSpec,
    SloSpec,
    TopologySpec,
)

GROUP = "llmfleet.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("llmsvc",)
API_VERSION = f"{GROUP}/{VERSION}"


class InferenceServiceSpec(ApiModel):
    model: ModelSpec
    """The model to serve."""
    runtime: RuntimeSpec = defaulted(RuntimeSpec)
    """Engine, GPU and tuning; unset knobs get per-GPU defaults from the launcher."""
    topology: TopologySpec = defaulted(TopologySpec)
    """Unified or disaggregated pools and their replica counts."""
    slo: SloSpec = defaulted(SloSpec)
    """Latency and KV-pressure targets the autoscaler and canary analysis hold the service to."""
    autoscaling: AutoscalingSpec = defaulted(AutoscalingSpec)
    """Autoscaling and warm spares."""
    traffic: TrafficSpec = Field(default_factory=TrafficSpec)
    """Gateway traffic policies."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    """How spec changes roll out."""

    def pools(self) -> dict[str, PoolSpec]:
        """Pool name -> spec, in serving order; a Unified service without one gets the default."""
        topology = self.topology
        if topology.mode == Mode.DISAGGREGATED:
            assert topology.prefill is not None
            assert topology.decode is not None
            return {"prefill": topology.prefill, "decode": topology.decode}
        return {"unified": topology.unified or PoolSpec()}

    @property
    def served_name(self) -> str:
        return self.model.served_name or self.model.name


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    type: Annotated[str, Field(max_length=64)]
    """Ready, Progressing, Degraded, ScalingLimited or CanaryInProgress."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: Annotated[str, Field(max_length=128)] = ""
    """CamelCase reason, e.g. InsufficientGPU."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """What happened and what to do about it."""
    last_transition_time: str | None = None
    """When status last changed (RFC 3339)."""
    observed_generation: int | None = None
    """The spec generation this condition describes."""


class PoolStatus(ApiModel):
    replicas: int = 0
    """Pods of the pool (serving and spare)."""
    ready_replicas: int = 0
    """Pods that are Ready."""
    serving_replicas: int = 0
    """Ready pods that receive traffic."""
    spare_replicas: int = 0
    """Pods kept warm out of traffic."""


class CanaryStatus(ApiModel):
    phase: Annotated[str, Field(max_length=32)] = ""
    """Progressing, Paused, Promoted or RolledBack."""
    weight: int = 0
    """Percent of traffic the canary gets now."""
    step: int = 0
    """Index of the current step."""
    last_analysis: Annotated[str, Field(max_length=4096)] = ""
    """Result of the latest analysis."""


class AutoscalingPoolDecision(ApiModel):
    active: int = Field(ge=0)
    """Serving replicas the autoscaler wants."""
    spares: int = Field(ge=0, default=0)
    """Warm spares the autoscaler wants on top."""
    reason: Annotated[str, Field(max_length=1024)] = ""
    """Why (the policy's reason string)."""


class AutoscalingStatus(ApiModel):
    pools: dict[str, AutoscalingPoolDecision] = {}
    """Decision per pool."""
    last_decision_time: str | None = None
    """When the autoscaler last decided (RFC 3339)."""
    limited: bool = False
    """True when the GPU budget or Pending pods stopped a scale-up."""
    message: Annotated[str, Field(max_length=4096)] = ""
    """Why scaling is limited, when it is."""


class InferenceServiceStatus(ApiModel):
    observed_generation: int | None = None
    """The spec generation the operator last acted on."""
    conditions: Annotated[list[Condition], Field(max_length=16)] = []
    """Ready, Progressing, Degraded, ScalingLimited, CanaryInProgress."""
    pools: dict[str, PoolStatus] = {}
    """Replica counts per pool (unified, or prefill and decode)."""
    serving: Annotated[str, Field(max_length=128)] = ""
    """Serving/desired replicas per pool, e.g. `prefill 2/2 decode 3/4` (a kubectl column)."""
    endpoint: Annotated[str, Field(max_length=512)] = ""
    """Where clients send requests for this service."""
    revision: Annotated[str, Field(max_length=64)] = ""
    """Hash of the pod template currently rolled out."""
    canary: CanaryStatus | None = None
    """Canary progress, during a canary rollout."""
    autoscaling: AutoscalingStatus | None = None
    """Written only by the autoscaler."""


class InferenceService(ApiModel):
    api_version: str = API_VERSION
    """llmfleet.dev/v1alpha1."""
    kind: str = KIND
    """InferenceService."""
    metadata: dict[str, Any] = {}
    """Standard object metadata."""
    spec: InferenceServiceSpec
    """What to serve and how."""
    status: InferenceServiceStatus | None = None
    """What the operator and autoscaler observed."""
