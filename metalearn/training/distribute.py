"""Outer steps under tf.distribute: the meta-batch split across replicas and machines.

Every replica adapts its own share of the meta-batch's tasks; the meta-gradients are
all-reduced so the update is that of the mean loss over all tasks, whatever the number
of replicas. The same code path serves one device (the default strategy), several local
devices (``MirroredStrategy``) and several machines (``MultiWorkerMirroredStrategy``,
configured by the ``TF_CONFIG`` environment variable).

Rule for the meta-batch: ``meta_batch_size`` must be a multiple of the number of
replicas, so that every replica adapts the same number of tasks; anything else raises
``ValueError`` before training starts.
"""

from __future__ import annotations

import json
import os
from typing import List, Optional, Sequence

import gin
import tensorflow as tf

from metalearn.flags import STRATEGIES  # --strategy's choices: defined there, light
from metalearn.runs import cluster
from metalearn.tasks.base import TaskSampler
from metalearn.tasks.episode import Episode

CROSS_DEVICE_OPS = {
    "nccl": lambda: tf.distribute.NcclAllReduce(),
    "hierarchical_copy": lambda: tf.distribute.HierarchicalCopyAllReduce(),
    "reduce_to_one_device": lambda: tf.distribute.ReductionToOneDevice(),
}


def check_devices(devices: Sequence[str]) -> List[str]:
    """The devices of a mirrored strategy, each checked against the visible (logical)
    ones before anything is built: a device that does not exist would hang the first
    all-reduce.

    Raises:
      ValueError: naming each device that is not visible, and the visible ones.
    """
    devices = [str(d) for d in devices]
    if not devices:
        raise ValueError("make_strategy.devices is empty: give devices such as "
                         "['/gpu:0', '/gpu:1'], or None for every local GPU")
    visible = tf.config.list_logical_devices()
    have = {(tf.DeviceSpec.from_string(d.name).device_type.upper(),
             tf.DeviceSpec.from_string(d.name).device_index) for d in visible}
    missing = []
    for device in devices:
        try:
            spec = tf.DeviceSpec.from_string(device)
        except ValueError:
            missing.append(device)
            continue
        if (str(spec.device_type or "").upper(), spec.device_index or 0) not in have:
            missing.append(device)
    if missing:
        shown = sorted(f"/{t.lower()}:{i}" for t, i in have)
        raise ValueError(f"make_strategy.devices: {missing} not among the visible devices "
                         f"{shown}; a mirrored strategy over a device that does not exist "
                         "would hang at its first all-reduce (several logical CPUs must be "
                         "configured with tf.config.set_logical_device_configuration "
                         "before TensorFlow starts)")
    return devices


@gin.configurable
def make_strategy(name: str = "default", devices: Optional[Sequence[str]] = None,
                  cross_device_ops: Optional[str] = None,
                  peer_timeout: float = 600.0) -> tf.distribute.Strategy:
    """The ``tf.distribute`` strategy called ``name``.

    Args:
      name: ``"default"`` (one device), ``"mirrored"`` (all local GPUs, or the given
        ``devices``, e.g. ``["/cpu:0", "/cpu:1"]``), or ``"multi_worker"`` (one process
        per machine, cluster and role from ``TF_CONFIG``).
      devices: devices for ``"mirrored"``; ``None`` takes every local GPU (or the CPU).
        Checked against the visible devices first (:func:`check_devices`).
      cross_device_ops: all-reduce for ``"mirrored"``: ``None`` (TensorFlow's choice),
        ``"nccl"``, ``"hierarchical_copy"`` or ``"reduce_to_one_device"``.
      peer_timeout: for ``"multi_worker"``, seconds to wait for the cluster's other
        tasks to start (logged, interruptible by ``SIGTERM``) before giving up with
        :class:`~metalearn.runs.cluster.ClusterTimeoutError`; see
        :func:`metalearn.runs.cluster.wait_for_peers`.
    """
    if cross_device_ops is not None and cross_device_ops not in CROSS_DEVICE_OPS:
        raise ValueError(f"cross_device_ops must be one of {sorted(CROSS_DEVICE_OPS)} or "
                         f"None, got {cross_device_ops!r}")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(
            devices=None if devices is None else check_devices(devices),
            cross_device_ops=None if cross_device_ops is None
            else CROSS_DEVICE_OPS[cross_device_ops]())
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("strategy 'multi_worker' needs the TF_CONFIG environment "
                             "variable (cluster and task of this process); see "
                             "docs/concepts/execution.md")
        try:
            tf_config = json.loads(os.environ["TF_CONFIG"])
        except ValueError as error:
            raise ValueError(f"TF_CONFIG is not valid JSON ({error}): "
                             f"{os.environ['TF_CONFIG'][:200]!r}") from error
        if not isinstance(peer_timeout, (int, float)) or not peer_timeout > 0:
            raise ValueError(f"make_strategy.peer_timeout must be a number of seconds > 0, "
                             f"got {peer_timeout!r}")
        # TensorFlow's own wait for the peers cannot be logged, limited or stopped.
        cluster.wait_for_peers(tf_config if isinstance(tf_config, dict) else {},
                               timeout=float(peer_timeout))
        return tf.distribute.MultiWorkerMirroredStrategy()
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {name!r}")


def tasks_per_replica(meta_batch_size: int, strategy: tf.distribute.Strategy) -> int:
    """Each replica's share of the meta-batch; raises unless it divides evenly."""
    replicas = strategy.num_replicas_in_sync
    if int(meta_batch_size) % replicas:
        raise ValueError(f"meta_batch_size={meta_batch_size} does not divide among "
                         f"{replicas} replicas: use a multiple of {replicas}")
    return int(meta_batch_size) // replicas


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints, summaries and results."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy,
                                          tf.distribute.MultiWorkerMirroredStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type in (None, "chief"):
        return True
    has_chief = "chief" in json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    return task_type == "worker" and task_id == 0 and not has_chief


def episode_stream(strategy: tf.distribute.Strategy, sampler: TaskSampler,
                   meta_batch_size: int, seed: int = 0, split: str = "train",
                   start_step: int = 0, num_steps: Optional[int] = None):
    """A distributed dataset giving every replica its own share of each meta-batch.

    Replica ``g`` (of ``R`` in the whole cluster) at step ``s`` draws its tasks from the
    seed ``(seed, split, s * R + g)``: no two replicas or workers share an episode in a
    step, and the union over replicas is a function of the seed alone.
    """
    share = tasks_per_replica(meta_batch_size, strategy)
    replicas = strategy.num_replicas_in_sync

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = replicas // context.num_input_pipelines
        first = context.input_pipeline_id * local
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF  # streams are disjoint by seed
        return sampler.dataset(share, seed=seed, split=split, start_step=start_step,
                               num_steps=num_steps, streams=range(first, first + local),
                               num_streams=replicas).with_options(options)

    return strategy.distribute_datasets_from_function(dataset_fn)


def split_episodes(strategy: tf.distribute.Strategy, episodes: Episode):
    """A fixed global batch of episodes split along the task axis, one slice per replica
    (replica ``g`` gets tasks ``[g * share, (g + 1) * share)``)."""
    share = tasks_per_replica(episodes.num_tasks, strategy)

    def slice_for(context: tf.distribute.ValueContext) -> Episode:
        start = context.replica_id_in_sync_group * share
        return tf.nest.map_structure(lambda t: t[start:start + share], episodes)

    return strategy.experimental_distribute_values_from_function(slice_for)
