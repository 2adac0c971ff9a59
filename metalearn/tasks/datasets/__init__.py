"""Data set loaders for classification tasks: each returns ``LabelledImages``, or a
``{split: LabelledImages}`` mapping for benchmarks with a canonical class split."""

from metalearn.tasks.datasets.base import (LabelledImages, clear_caches, default_cache_dir,
                                           select_classes, split_class_names)
from metalearn.tasks.datasets.checksums import ChecksumError, verify_download
from metalearn.tasks.datasets.cifar import load_cifar_fs, load_fc100
from metalearn.tasks.datasets.cub import load_cub
from metalearn.tasks.datasets.folder import load_image_folder
from metalearn.tasks.datasets.meta_dataset import load_meta_dataset_source
from metalearn.tasks.datasets.mini_imagenet import load_mini_imagenet
from metalearn.tasks.datasets.mnist import load_mnist
from metalearn.tasks.datasets.omniglot import MINIMAL_SPLIT, load_omniglot
from metalearn.tasks.datasets.tfds_images import TFDSImages
from metalearn.tasks.datasets.tiered_imagenet import load_tiered_imagenet

__all__ = ["ChecksumError", "LabelledImages", "MINIMAL_SPLIT", "TFDSImages", "clear_caches",
           "default_cache_dir", "load_cifar_fs",
           "load_cub",
           "load_fc100", "load_image_folder", "load_meta_dataset_source", "load_mini_imagenet",
           "load_mnist", "load_omniglot", "load_tiered_imagenet", "select_classes",
           "split_class_names", "verify_download"]
