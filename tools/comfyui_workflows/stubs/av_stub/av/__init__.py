"""A stand-in for PyAV (35 MB wheel) in the headless zimage ComfyUI check: ComfyUI's comfy_api
imports av at start-up for its video types; no video node runs in the check."""
from . import container, subtitles  # noqa: F401


def __getattr__(name):
    raise AttributeError(f"av.{name}: PyAV is not installed (headless check stand-in)")
