"""Plain Keras model builders: nothing meta about them."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import gin
import keras


@gin.configurable
def mlp(input_shape: Tuple[int, ...] = (1,), hidden: Sequence[int] = (40, 40),
        outputs: int = 1, activation: str = "relu", dtype: Optional[str] = None,
        name: str = "mlp") -> keras.Model:
    """A multilayer perceptron; the defaults are the MAML paper's sinusoid net 1-40-40-1."""
    layers = [keras.Input(tuple(input_shape), dtype=dtype)]
    layers += [keras.layers.Dense(int(width), activation=activation, dtype=dtype,
                                  name=f"hidden{i}") for i, width in enumerate(hidden)]
    layers.append(keras.layers.Dense(int(outputs), dtype=dtype, name="head"))
    return keras.Sequential(layers, name=name)


@gin.configurable
def conv_net(input_shape: Tuple[int, int, int] = (28, 28, 1), outputs: int = 5,
             filters: int = 64, blocks: int = 4, kernel_size: int = 3,
             downsample: str = "stride", batch_norm: bool = True, pool: str = "mean",
             dtype: Optional[str] = None, name: str = "conv_net") -> keras.Model:
    """The MAML paper's few-shot conv net.

    ``blocks`` x [3x3 conv ``filters``, BatchNorm, ReLU], downsampling by 2 in each block,
    then a global mean-pool (or flattening) and a linear head with ``outputs`` logits.

    Args:
      downsample: ``"stride"`` (stride-2 convolutions, the Omniglot net) or
        ``"max_pool"`` (2x2 max-pooling after each block, the mini-ImageNet net with
        ``filters=32``).
      pool: how the last feature map reaches the head: ``"mean"`` (global mean-pool,
        the Omniglot net) or ``"flatten"`` (the mini-ImageNet net).
    """
    if downsample not in ("stride", "max_pool"):
        raise ValueError(f"downsample must be 'stride' or 'max_pool', got {downsample!r}")
    if pool not in ("mean", "flatten"):
        raise ValueError(f"pool must be 'mean' or 'flatten', got {pool!r}")
    strides = 2 if downsample == "stride" else 1
    layers = [keras.Input(tuple(input_shape), dtype=dtype)]
    for i in range(blocks):
        layers.append(keras.layers.Conv2D(filters, kernel_size, strides=strides,
                                          padding="same", dtype=dtype, name=f"conv{i}"))
        if batch_norm:
            layers.append(keras.layers.BatchNormalization(dtype=dtype, name=f"bn{i}"))
        layers.append(keras.layers.ReLU(dtype=dtype, name=f"relu{i}"))
        if downsample == "max_pool":
            layers.append(keras.layers.MaxPooling2D(2, dtype=dtype, name=f"pool{i}"))
    if pool == "mean":
        layers.append(keras.layers.GlobalAveragePooling2D(dtype=dtype, name="mean_pool"))
    else:
        layers.append(keras.layers.Flatten(dtype=dtype, name="flatten"))
    layers.append(keras.layers.Dense(outputs, dtype=dtype, name="head"))
    return keras.Sequential(layers, name=name)


@gin.configurable
def omniglot_conv_net(outputs: int = 5, input_shape: Tuple[int, int, int] = (28, 28, 1),
                      dtype: Optional[str] = None) -> keras.Model:
    """MAML's Omniglot net: 4 x [conv 64 stride 2, BatchNorm, ReLU], mean-pool, linear."""
    return conv_net(input_shape, outputs, filters=64, downsample="stride", dtype=dtype,
                    name="omniglot_conv_net")


@gin.configurable
def mini_imagenet_conv_net(outputs: int = 5,
                           input_shape: Tuple[int, int, int] = (84, 84, 3),
                           dtype: Optional[str] = None) -> keras.Model:
    """MAML's mini-ImageNet net: 4 x [conv 32, BatchNorm, ReLU, 2x2 max-pool], flatten,
    linear (an 84x84 input leaves a 5x5x32 map: 800 features)."""
    return conv_net(input_shape, outputs, filters=32, downsample="max_pool", pool="flatten",
                    dtype=dtype,
                    name="mini_imagenet_conv_net")
