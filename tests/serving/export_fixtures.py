"""The tiny learners and tasks the export tests share: a sinusoid MAML, a 3-way
Prototypical Networks conv net on 8x8 images, and such an image task."""

import keras
import tensorflow as tf

import metalearn
from metalearn import models
from metalearn.adapters import GradientDescent
from metalearn.tasks import Episode


def sinusoid_learner():
    keras.utils.set_random_seed(0)
    model = models.mlp((1,), hidden=(16, 16), outputs=1)
    return metalearn.Learner(model, adapter=GradientDescent(steps=3, learning_rate=0.05),
                             loss="mse")


def image_episode(shots, queries, ways=3, seed=0):
    """A float32 ``ways``-way task on 8x8 one-channel images, labels ``0 .. ways - 1``."""
    keys = tf.random.experimental.stateless_split([seed, 5], 3)
    centres = tf.random.stateless_normal([ways, 1, 8, 8, 1], keys[0])
    examples = lambda key, n: tf.reshape(
        centres + 0.5 * tf.random.stateless_normal([ways, n, 8, 8, 1], key), [-1, 8, 8, 1])
    labels = lambda n: tf.repeat(tf.range(ways), n)
    return Episode(examples(keys[1], shots), labels(shots), examples(keys[2], queries),
                   labels(queries))


def protonets_learner():
    keras.utils.set_random_seed(0)
    model = models.conv_net((8, 8, 1), outputs=3, filters=4, blocks=2)
    return metalearn.PrototypicalNetworks(model, ways=3, drop_head="head")
