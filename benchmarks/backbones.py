"""Parameter counts of the few-shot backbones at the papers' widths, by building them.

    PYTHONPATH=. python -m benchmarks.backbones     # a few seconds; one JSON line each

For each backbone: trainable weights of the embedding (everything below the linear
``head``, which embedding learners drop), BatchNorm's moving statistics (not trained),
and the embedding's size. See benchmarks/README.md.
"""

from __future__ import annotations

import json

import numpy as np

from metalearn import models

BACKBONES = {
    "mini_imagenet_conv_net (MAML, 32 filters, 84x84)":
        lambda: models.mini_imagenet_conv_net(5, (84, 84, 3)),
    "protonets_conv_net (Snell et al., 64 filters, 84x84)":
        lambda: models.protonets_conv_net(5, (84, 84, 3)),
    "resnet12 (64-160-320-640, 84x84, flatten)":
        lambda: models.resnet12((84, 84, 3), 5, drop_rate=0.1),
    "resnet12 (64-160-320-640, 32x32, flatten)":
        lambda: models.resnet12((32, 32, 3), 5, drop_rate=0.1),
    "wide_resnet (WRN-28-10, 84x84, mean-pool)":
        lambda: models.wide_resnet((84, 84, 3), 5, depth=28, widen_factor=10),
}


def count(model) -> dict:
    head = model.get_layer("head")
    size = lambda variables: int(sum(np.prod(v.shape) for v in variables))
    return {"embedding_trainable": size(model.trainable_variables) -
            size(head.trainable_variables),
            "batch_norm_statistics": size(model.non_trainable_variables) -
            size([v for v in model.non_trainable_variables if "iterations" in v.path]),
            "features": int(np.prod(head.input.shape[1:]))}


def main() -> None:
    for name, build in BACKBONES.items():
        print(json.dumps({"backbone": name, **count(build())}), flush=True)


if __name__ == "__main__":
    main()
