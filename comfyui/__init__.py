"""zimage's ComfyUI nodes (docs/COMFYUI.md): link or copy this folder into ComfyUI/custom_nodes
after `pip install` of the zimage package into ComfyUI's Python."""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
