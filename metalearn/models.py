"""Plain Keras model builders: nothing meta about them.

The few-shot backbones: the 4-block conv nets of MAML (:func:`omniglot_conv_net`,
:func:`mini_imagenet_conv_net`) and Prototypical Networks (:func:`protonets_conv_net`),
ResNet-12 (:func:`resnet12`, MetaOptNet/TADAM) and Wide ResNets (:func:`wide_resnet`,
WRN-28-10). All are Keras Sequential or functional models of stock layers (and
:class:`metalearn.layers.DropBlock`), so every learner runs them unmodified.
:func:`frozen` fixes some of a model's layers (a pre-trained embedding that the outer
step does not train).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple

import gin
import keras

from metalearn.layers import DropBlock


@gin.configurable
def frozen(model: keras.Model = gin.REQUIRED, layers: Sequence[str] = (".*",),
           exclude: Sequence[str] = ()) -> keras.Model:
    """``model`` with the layers whose names a pattern of ``layers`` matches
    (``re.search``) and none of ``exclude`` does set ``trainable = False``: their weights
    are no longer trainable variables, so no learner meta-trains them (a learner's
    meta-variables are its model's trainable variables) nor adapts them per task, and a
    frozen BatchNormalization normalises with its moving statistics (Keras' inference
    mode) in training too. E.g. CAML's frozen pre-trained embedding under an in-context
    learner, its weights from :class:`metalearn.training.WarmStart`::

        MODEL = @frozen()
        frozen.model = @omniglot_conv_net()
        frozen.exclude = ('head',)      # the linear head stays trainable

    Raises:
      ValueError: the patterns select no layer (the message lists the layers).
    """
    chosen = [layer for layer in model.layers
              if any(re.search(p, layer.name) for p in layers)
              and not any(re.search(p, layer.name) for p in exclude)]
    if not [layer for layer in chosen if layer.weights]:
        raise ValueError(f"frozen: layers={tuple(layers)!r}, exclude={tuple(exclude)!r} "
                         f"select no layer with weights of model {model.name!r}, whose "
                         f"layers are {[layer.name for layer in model.layers]}")
    for layer in chosen:
        layer.trainable = False
    return model


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
def linear(input_shape: Tuple[int, ...] = (784,), units: int = 10,
           initializer: str = "random_normal", dtype: Optional[str] = None,
           name: str = "linear") -> keras.Model:
    """``x @ kernel + bias``: the ``Linear`` layer of the tf.keras crash course for
    researchers (kernel and bias both initialised from N(0, 0.05) by default)."""
    return keras.Sequential([
        keras.Input(tuple(input_shape), dtype=dtype),
        keras.layers.Dense(int(units), kernel_initializer=initializer,
                           bias_initializer=initializer, dtype=dtype, name="dense")],
        name=name)


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
    # Every argument explicit: gin bindings of conv_net must not change the paper's net.
    return conv_net(input_shape, outputs, filters=64, blocks=4, kernel_size=3,
                    downsample="stride", batch_norm=True, pool="mean", dtype=dtype,
                    name="omniglot_conv_net")


@gin.configurable
def mini_imagenet_conv_net(outputs: int = 5,
                           input_shape: Tuple[int, int, int] = (84, 84, 3),
                           dtype: Optional[str] = None) -> keras.Model:
    """MAML's mini-ImageNet net: 4 x [conv 32, BatchNorm, ReLU, 2x2 max-pool], flatten,
    linear (an 84x84 input leaves a 5x5x32 map: 800 features)."""
    return conv_net(input_shape, outputs, filters=32, blocks=4, kernel_size=3,
                    downsample="max_pool", batch_norm=True, pool="flatten", dtype=dtype,
                    name="mini_imagenet_conv_net")


@gin.configurable
def protonets_conv_net(outputs: int = 5, input_shape: Tuple[int, int, int] = (84, 84, 3),
                       dtype: Optional[str] = None) -> keras.Model:
    """Prototypical Networks' embedding (Snell et al., 2017): 4 x [conv 64, BatchNorm,
    ReLU, 2x2 max-pool], flatten (an 84x84 input leaves 5x5x64: 1600 features), and a
    linear head (drop it with ``drop_head='head'`` for an embedding learner)."""
    return conv_net(input_shape, outputs, filters=64, blocks=4, kernel_size=3,
                    downsample="max_pool", batch_norm=True, pool="flatten", dtype=dtype,
                    name="protonets_conv_net")


def _positive(name: str, values: Sequence[int]) -> Tuple[int, ...]:
    values = tuple(values)
    if not values or not all(isinstance(v, int) and v > 0 for v in values):
        raise ValueError(f"{name} must be a non-empty sequence of positive ints, got "
                         f"{values!r}")
    return values


def _pooled(x, pool: str, dtype: Optional[str]):
    if pool == "mean":
        return keras.layers.GlobalAveragePooling2D(dtype=dtype, name="mean_pool")(x)
    if pool == "flatten":
        return keras.layers.Flatten(dtype=dtype, name="flatten")(x)
    raise ValueError(f"pool must be 'mean' or 'flatten', got {pool!r}")


def _conv(filters: int, kernel: int, name: str, dtype: Optional[str], strides: int = 1):
    # He-normal over fan-out, no bias (BatchNorm follows): the PyTorch papers' convs.
    return keras.layers.Conv2D(
        filters, kernel, strides=strides, padding="same", use_bias=False, dtype=dtype,
        kernel_initializer=keras.initializers.VarianceScaling(
            2.0, mode="fan_out", distribution="untruncated_normal"), name=name)


def _batch_norm(name: str, dtype: Optional[str]):
    # PyTorch's BatchNorm2d defaults (momentum 0.1 there is 0.9 here; eps 1e-5).
    return keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, dtype=dtype,
                                           name=name)


@gin.configurable
def resnet12(input_shape: Tuple[int, int, int] = (84, 84, 3), outputs: int = 5,
             widths: Sequence[int] = (64, 160, 320, 640), drop_rate: float = 0.0,
             drop_block_size: int = 5, drop_schedule_steps: int = 0,
             pool: str = "flatten", leak: float = 0.1, dtype: Optional[str] = None,
             seed: Optional[int] = None, name: str = "resnet12") -> keras.Model:
    """ResNet-12 of TADAM (Oreshkin et al., 2018) and MetaOptNet (Lee et al., 2019).

    Four residual blocks (one per entry of ``widths``), each
    ``[conv3x3-BN-LeakyReLU, conv3x3-BN-LeakyReLU, conv3x3-BN] + [conv1x1-BN]
    (shortcut)``, then LeakyReLU(``leak``), 2x2 max-pool and, with ``drop_rate > 0``,
    :class:`~metalearn.layers.DropBlock`: block size 1 (dropout) after blocks 1-2 and
    ``drop_block_size`` after blocks 3-4 (MetaOptNet: ``DB(0.9, 1)`` twice, then
    ``DB(0.9, 5)`` on ImageNet derivatives or ``DB(0.9, 2)`` on CIFAR ones), whose keep
    probability falls linearly from 1 over ``drop_schedule_steps`` meta-steps. Then the
    embedding (``pool="flatten"``: MetaOptNet's, 5x5x640 = 16000 features at 84x84;
    ``"mean"``: global average pool, 640) and a linear ``head`` with ``outputs`` logits
    (``drop_head='head'`` for embedding learners). Convolutions have no bias.
    Layers are named ``block{i}_conv{j}``, ``block{i}_bn{j}``, ``block{i}_shortcut``,
    ``block{i}_shortcut_bn``, ``block{i}_add``, ``block{i}_pool``, ``block{i}_drop``.

    Args:
      widths: filters of each block (64-160-320-640 in the papers; small ones for tests).
      drop_rate: DropBlock's ``1 - keep`` (MetaOptNet: 0.1); 0: no DropBlock layers.
      seed: DropBlock seeds are ``seed + block``; ``None``: drawn (see DropBlock).
    """
    widths = _positive("widths", widths)
    inputs = keras.Input(tuple(input_shape), dtype=dtype)
    x = inputs
    for i, width in enumerate(widths, start=1):
        shortcut = _batch_norm(f"block{i}_shortcut_bn", dtype)(
            _conv(width, 1, f"block{i}_shortcut", dtype)(x))
        for j in (1, 2, 3):
            x = _batch_norm(f"block{i}_bn{j}", dtype)(_conv(width, 3, f"block{i}_conv{j}",
                                                            dtype)(x))
            if j < 3:
                x = keras.layers.LeakyReLU(leak, dtype=dtype, name=f"block{i}_relu{j}")(x)
        x = keras.layers.Add(dtype=dtype, name=f"block{i}_add")([x, shortcut])
        x = keras.layers.LeakyReLU(leak, dtype=dtype, name=f"block{i}_relu")(x)
        x = keras.layers.MaxPooling2D(2, dtype=dtype, name=f"block{i}_pool")(x)
        if drop_rate > 0:
            late = i > len(widths) // 2
            x = DropBlock(drop_rate, block_size=drop_block_size if late else 1,
                          schedule_steps=drop_schedule_steps if late else 0,
                          seed=None if seed is None else seed + i, dtype=dtype,
                          name=f"block{i}_drop")(x)
    x = _pooled(x, pool, dtype)
    outputs_ = keras.layers.Dense(int(outputs), dtype=dtype, name="head")(x)
    return keras.Model(inputs, outputs_, name=name)


@gin.configurable
def wide_resnet(input_shape: Tuple[int, int, int] = (84, 84, 3), outputs: int = 5,
                depth: int = 28, widen_factor: int = 10, base_width: int = 16,
                drop_rate: float = 0.0, pool: str = "mean", dtype: Optional[str] = None,
                name: Optional[str] = None) -> keras.Model:
    """Wide ResNet WRN-``depth``-``widen_factor`` (Zagoruyko & Komodakis, 2016); the
    WRN-28-10 of LEO and Activation to Parameter by default.

    A conv3x3 of ``base_width`` filters, then three groups of ``(depth - 4) / 6``
    pre-activation blocks ``[BN-ReLU-conv3x3, (dropout), BN-ReLU-conv3x3]`` of
    ``base_width * widen_factor * (1, 2, 4)`` filters, strides 1, 2, 2 (the first block
    of a group changes the width; its shortcut is a conv1x1 of the activated input,
    the others are identities), then BN-ReLU, the embedding (``pool="mean"``: global
    average pool, 640 features for WRN-28-10) and a linear ``head``. Layers are named
    ``group{g}_block{b}_{bn1,conv1,drop,bn2,conv2,shortcut,add}``.

    Args:
      depth: ``6 n + 4`` (28: four blocks per group).
      widen_factor: the width multiplier ``k``.
      base_width: 16 in the paper (smaller for tests).
      drop_rate: dropout between the two convolutions of each block (0.3 in the
        paper's CIFAR runs; 0 here by default).

    Raises:
      ValueError: ``depth`` is not ``6 n + 4`` with ``n >= 1``.
    """
    if not isinstance(depth, int) or depth < 10 or (depth - 4) % 6:
        raise ValueError(f"wide_resnet depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, "
                         f"...), got {depth!r}")
    _positive("widen_factor and base_width", (widen_factor, base_width))
    blocks = (depth - 4) // 6
    inputs = keras.Input(tuple(input_shape), dtype=dtype)
    x = _conv(base_width, 3, "conv0", dtype)(inputs)
    width = base_width
    for g, (multiple, stride) in enumerate(((1, 1), (2, 2), (4, 2)), start=1):
        out = base_width * widen_factor * multiple
        for b in range(1, blocks + 1):
            prefix = f"group{g}_block{b}"
            strides = stride if b == 1 else 1
            activated = keras.layers.ReLU(dtype=dtype, name=f"{prefix}_relu1")(
                _batch_norm(f"{prefix}_bn1", dtype)(x))
            y = _conv(out, 3, f"{prefix}_conv1", dtype, strides)(activated)
            if drop_rate > 0:
                y = keras.layers.Dropout(drop_rate, dtype=dtype, name=f"{prefix}_drop")(y)
            y = keras.layers.ReLU(dtype=dtype, name=f"{prefix}_relu2")(
                _batch_norm(f"{prefix}_bn2", dtype)(y))
            y = _conv(out, 3, f"{prefix}_conv2", dtype)(y)
            shortcut = x if (width == out and strides == 1) else \
                _conv(out, 1, f"{prefix}_shortcut", dtype, strides)(activated)
            x = keras.layers.Add(dtype=dtype, name=f"{prefix}_add")([y, shortcut])
            width = out
    x = keras.layers.ReLU(dtype=dtype, name="relu")(_batch_norm("bn", dtype)(x))
    x = _pooled(x, pool, dtype)
    head = keras.layers.Dense(int(outputs), dtype=dtype, name="head")(x)
    return keras.Model(inputs, head, name=name or f"wrn_{depth}_{widen_factor}")
