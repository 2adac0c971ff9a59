"""Tasks: what an episode is and how episodes are sampled."""

from metalearn.tasks.base import SPLITS, TaskSampler, split_seed
from metalearn.tasks.batches import SupervisedBatches
from metalearn.tasks.episode import Episode
from metalearn.tasks.sinusoid import Sinusoid

__all__ = ["Episode", "SPLITS", "Sinusoid", "SupervisedBatches", "TaskSampler",
           "split_seed"]
