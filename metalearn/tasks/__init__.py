"""Tasks: what an episode is and how episodes are sampled."""

from metalearn.tasks.base import SPLITS, TaskSampler, split_seed
from metalearn.tasks.classification import FewShotClassification, rotate
from metalearn.tasks import datasets
from metalearn.tasks.episode import Episode
from metalearn.tasks.sinusoid import Sinusoid

__all__ = ["Episode", "FewShotClassification", "SPLITS", "Sinusoid", "TaskSampler",
           "datasets", "rotate", "split_seed"]
