"""Every learner and adapter meets the contract of tests/contract.py."""

import keras

import metalearn
from metalearn.adapters import GradientDescent, MetaSGD, PerStepLearningRates
from tests.contract import LearnerContract, classification_learner


class TestMAML(LearnerContract):
    def make_learner(self):
        return classification_learner(GradientDescent(steps=2, learning_rate=0.1))


class TestFirstOrderMAML(LearnerContract):
    def make_learner(self):
        return classification_learner(GradientDescent(steps=2, learning_rate=0.1,
                                                      first_order=True))


class TestANIL(LearnerContract):
    def make_learner(self):
        return classification_learner(GradientDescent(steps=2, learning_rate=0.1,
                                                      adapt=("head",)))


class TestMetaSGD(LearnerContract):
    def make_learner(self):
        return classification_learner(MetaSGD(steps=1, learning_rate=0.1))


class TestMAMLPlusPlus(LearnerContract):
    """All MAML++ pieces together: LSLR, multi-step loss, derivative-order annealing,
    per-step BatchNorm weights."""

    def make_learner(self):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((6,)), keras.layers.Dense(16, name="hidden0"),
            keras.layers.BatchNormalization(name="bn0"), keras.layers.ReLU(name="relu0"),
            keras.layers.Dense(3, name="head")], name="bn_mlp")
        adapter = PerStepLearningRates(steps=2, learning_rate=0.1, first_order_steps=2,
                                       per_step=("bn0",))
        return classification_learner(adapter, model,
                                      learner_class=metalearn.MultiStepLossLearner,
                                      anneal_steps=10)
