"""A labelled data set held in memory: what every classification loader returns."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class LabelledImages:
    """Decoded examples with integer class labels, ready for episode samplers.

    Attributes:
      images: ``[examples, height, width, channels]`` array (uint8 or float32).
      labels: ``[examples]`` integer class ids in ``0 .. len(class_names) - 1``.
      class_names: a name per class id (e.g. ``"Greek/character03"`` or ``"7"``).
      groups: optional ``[classes]`` group name per class (Omniglot's alphabet), for
        splits by group.
      preprocessing: how the images were made from the raw data (e.g. ``{"image_size":
        28, "invert": True}``), so that a trained run can prepare new images the same way.
    """

    images: np.ndarray
    labels: np.ndarray
    class_names: Sequence[str]
    groups: Optional[Sequence[str]] = None
    preprocessing: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} labels")
        if self.images.ndim != 4:
            raise ValueError("images must be [examples, height, width, channels], got "
                             f"shape {self.images.shape}")
        if len(self.labels) and (self.labels.min() < 0 or
                                 self.labels.max() >= len(self.class_names)):
            raise ValueError(f"labels must lie in [0, {len(self.class_names)}), got "
                             f"[{self.labels.min()}, {self.labels.max()}]")
        if self.groups is not None and len(self.groups) != len(self.class_names):
            raise ValueError(f"{len(self.groups)} groups for {len(self.class_names)} classes")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)
