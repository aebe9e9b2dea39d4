"""Shared pieces of llmfleet: the CLI, logging, and the local Kubernetes cluster."""
