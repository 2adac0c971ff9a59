"""Keras-native meta-training: :class:`MetaModel`, a learner and an outer rule as a
``keras.Model`` whose ``fit`` takes the library's one meta-step (Keras' callbacks, a
resumable fit, ``keras.saving``). Tutorial: docs/tutorials/keras_fit.md."""

from metalearn.keras.model import SKIPPED, MetaModel

__all__ = ["MetaModel", "SKIPPED"]
