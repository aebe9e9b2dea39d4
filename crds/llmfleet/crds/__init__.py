"""API types for InferenceService (pydantic v2) and the CRD renderer (issue 3)."""
