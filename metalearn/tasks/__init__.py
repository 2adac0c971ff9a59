"""Tasks: what an episode is and how episodes are sampled."""

from metalearn.tasks.augmentation import ImageAugmentation
from metalearn.tasks.base import SPLITS, Collection, TaskSampler, split_seed
from metalearn.tasks.batches import SupervisedBatches
from metalearn.tasks.classification import FewShotClassification, rotate
from metalearn.tasks import datasets
from metalearn.tasks.gaussian_process import GaussianProcess
from metalearn.tasks.episode import Episode, MaskedLabels, pad_episodes
from metalearn.tasks.meta_dataset import MetaDataset
from metalearn.tasks.random_tasks import RandomLinearClassification, RandomMLPFunctions
from metalearn.tasks.sinusoid import Sinusoid
from metalearn.tasks.whole_class import WholeClassBatches

__all__ = ["Collection", "Episode", "FewShotClassification", "GaussianProcess", "ImageAugmentation",
           "MaskedLabels",
           "MetaDataset", "RandomLinearClassification", "RandomMLPFunctions", "SPLITS", "Sinusoid", "SupervisedBatches", "TaskSampler",
           "WholeClassBatches", "datasets", "pad_episodes", "rotate", "split_seed"]
