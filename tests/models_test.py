"""The MAML paper's conv nets: the layer structure each paper variant specifies."""

import numpy as np
import pytest

from metalearn import models


def test_omniglot_net_is_four_strided_blocks_mean_pool_and_linear():
    model = models.omniglot_conv_net(outputs=20)
    convs = [l for l in model.layers if l.name.startswith("conv")]
    assert [c.filters for c in convs] == [64] * 4 and all(c.strides == (2, 2) for c in convs)
    assert sum(l.name.startswith("bn") for l in model.layers) == 4
    assert [l.name for l in model.layers[-2:]] == ["mean_pool", "head"]
    assert model.output_shape == (None, 20)
    assert model(np.zeros((2, 28, 28, 1), np.float32)).shape == (2, 20)


def test_mini_imagenet_net_is_four_max_pooled_blocks_flatten_and_linear():
    model = models.mini_imagenet_conv_net(outputs=5)
    convs = [l for l in model.layers if l.name.startswith("conv")]
    assert [c.filters for c in convs] == [32] * 4 and all(c.strides == (1, 1) for c in convs)
    assert sum(l.name.startswith("pool") for l in model.layers) == 4
    assert model.get_layer("flatten").output.shape == (None, 5 * 5 * 32)  # 84 -> 5
    assert model.get_layer("head").kernel.shape == (800, 5)


def test_bad_pool_is_named():
    with pytest.raises(ValueError, match="pool must be 'mean' or 'flatten', got 'max'"):
        models.conv_net(pool="max")
