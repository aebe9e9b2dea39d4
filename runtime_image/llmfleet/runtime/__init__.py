"""The runtime launcher, warm-up, drain and capacity profiler (issue 4)."""
