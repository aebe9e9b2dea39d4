"""Routing as plugins: filters -> weighted scorers (each score in [0,1]) -> picker.

Pure code: nothing here imports httpx or kubernetes, and nothing does I/O. `registry` maps
plugin names to factories; a profile in the settings names the plugins and their weights.
"""
