"""Helpers shared by the tests of neural processes and of the outer rules that must see a
learner's own objective (adapters/neural_process_test.py, outer/evolution_test.py): a
test module imports these, never another test module's helpers."""

import keras

import metalearn
from metalearn import models
from metalearn.adapters import LatentNeuralProcess
from metalearn.functional import gaussian_nll, predictive_mse
from metalearn.learners import LatentNeuralProcessLearner


def latent_learner(x_size=1, y_size=1, representation=8, latent=3, hidden=(16,),
                   output="gaussian", dtype=None):
    """A small NP: encoder and latent encoder [x, y] -> r, 2 z; decoder [x, r, z] -> y."""
    keras.utils.set_random_seed(0)
    mlp = lambda inputs, outputs, name: models.mlp(  # noqa: E731
        (inputs,), hidden=hidden, outputs=outputs, activation="tanh", dtype=dtype, name=name)
    outputs = 2 * y_size if output == "gaussian" else y_size
    adapter = LatentNeuralProcess(mlp(x_size + y_size, representation, "encoder"),
                                  mlp(x_size + y_size, 2 * latent, "latent_encoder"),
                                  output=output)
    decoder = mlp(x_size + representation + latent, outputs, "decoder")
    if output == "gaussian":
        return LatentNeuralProcessLearner(decoder, adapter, loss=gaussian_nll,
                                          metrics={"mse": predictive_mse})
    return LatentNeuralProcessLearner(decoder, adapter,
                                      loss=metalearn.testing.softmax_cross_entropy,
                                      metrics={"accuracy": "accuracy"})
