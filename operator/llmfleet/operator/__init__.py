"""The kopf operator: InferenceService -> Deployments, Services, ConfigMap, PDB (issue 3)."""
