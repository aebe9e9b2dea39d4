"""The SLO-aware autoscaler and the fleet simulator (issue 6)."""
