"""zimage's ComfyUI nodes (docs/COMFYUI.md): link or copy this folder into ComfyUI/custom_nodes
after `pip install` of the zimage package into ComfyUI's Python."""

from . import nodes

# The engine's own nodes (loader, text to image) and the MODEL node whose diffusion forward is
# zimage's DiT under ComfyUI's samplers. The MODEL node needs torch and ComfyUI's model classes
# at import; where they are missing (the nodes' unit test) it is left out, saying so.
NODE_CLASS_MAPPINGS = dict(nodes.NODE_CLASS_MAPPINGS)
NODE_DISPLAY_NAME_MAPPINGS = dict(nodes.NODE_DISPLAY_NAME_MAPPINGS)
try:
    from . import zimage_model
except ImportError as e:  # no torch or no ComfyUI model classes
    print(f"zimage: the MODEL node (ZImageModelLoader) is not available: {e}")
else:
    NODE_CLASS_MAPPINGS.update(zimage_model.NODE_CLASS_MAPPINGS)
    NODE_DISPLAY_NAME_MAPPINGS.update(zimage_model.NODE_DISPLAY_NAME_MAPPINGS)

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
