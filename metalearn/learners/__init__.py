"""Learners: a model, an inner loop and a loss; embedding learners with heads."""

from metalearn.learners.baseline import ClassifierBaseline
from metalearn.learners.embedding import EmbeddingLearner
from metalearn.learners.learner import (BATCHED_METHODS, Learner, MetricFn,
                                        accuracy, adapt_trajectory, objective, predict_on,
                                        support_objective)
from metalearn.learners.task import Adapted, Resume, TaskRun, Trajectory
from metalearn.learners.multi_step import MultiStepLossLearner
from metalearn.learners.neural_process import LatentNeuralProcessLearner
from metalearn.learners.prototypical import PrototypicalNetworks, ProtoMAML
from metalearn.learners.task_init import FixedInit, PrototypeInit, TaskInit, ZeroInit

__all__ = ["ClassifierBaseline", "EmbeddingLearner", "LatentNeuralProcessLearner", "Learner",
           "MetricFn", "MultiStepLossLearner",
           "PrototypeInit", "PrototypicalNetworks", "ProtoMAML", "TaskInit",
           "FixedInit", "ZeroInit", "accuracy", "predict_on", "support_objective",
           "BATCHED_METHODS", "Adapted", "Resume", "TaskRun", "Trajectory",
           "adapt_trajectory", "objective"]
