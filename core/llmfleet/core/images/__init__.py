"""llmfleet's container images, built here without Docker (`llmfleet images build`).

The public surface, for the CLI and the local system:
- `IMAGE_NAMES`: `control-plane`, `engine-local`, `runtime`;
- `ensure_image(name, progress=None) -> BuiltImage`: the image for the current sources, built
  if missing (waiting on another process's build of it); `BuiltImage` has `name`, `reference`,
  `digest`, `archive` (an OCI image-layout tar for `ctr -n k8s.io images import`), `size`;
- `built_images()`: the last image built of each name.

recipe.py holds what each image is; the Dockerfiles say the same (tests/images checks it).
"""

from llmfleet.core.images.builder import BuiltImage, build_image, built_images, ensure_image
from llmfleet.core.images.errors import ImageError
from llmfleet.core.images.recipe import IMAGE_NAMES, RECIPES

__all__ = [
    "IMAGE_NAMES",
    "RECIPES",
    "BuiltImage",
    "ImageError",
    "build_image",
    "built_images",
    "ensure_image",
]
