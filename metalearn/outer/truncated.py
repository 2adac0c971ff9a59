"""Truncated unrolls and persistent evolution strategies as outer rules on a learner: the
inner trajectory carried across outer steps in segments of ``truncation`` steps.

A *horizon* is ``T`` inner steps on one meta-batch of tasks; each outer step runs one
segment of ``K = truncation`` steps of it, continuing every task's inner loop where the
previous outer step left it, and updates the meta-variables. After ``T / K`` outer
steps the trajectory starts again: new episodes (the outer step's batch), weights back
to the initial ones. What carries over is state of the rule (non-trainable variables,
checkpointed with the run, so a resumed run continues bit-identically):

* ``position``: the segment within the horizon (``0 .. T / K - 1``);
* the horizon's episodes (read from the batch when ``position`` is 0);
* each task's adapted weights (the paths the inner loop changes) and the inner update's
  state (momenta, a learned optimizer's accumulators), per particle for
  :class:`PersistentES` (``2 population`` trajectories: ``+`` and ``-``);
* :class:`PersistentES`'s accumulated noise ``xi`` (one per antithetic pair).

The segment's loss is each task's objective of its run of the segment (the learner's
:meth:`~metalearn.Learner.objective_of`: the query loss after the segment's last step
for a plain learner; MAML++'s weighted query losses of the segment's steps, weighted as
in the whole horizon); the horizon's objective is their sum over the segments (for a
plain learner the loss along the trajectory sampled every ``K`` steps; with ``K = T``,
the learner's own meta-objective, MAML++'s included).

* :class:`TruncatedUnroll`: truncated backpropagation. The gradient of the segment's
  loss, the carried state a constant; in the first segment the trajectory starts at the
  meta-variables, so with ``K = T`` it is :class:`~metalearn.outer.MetaGradient`'s
  gradient. Biased for ``K < T``: the initial weights get no gradient after the first
  segment, and the effect of per-step meta-variables (learned rates, a learned
  optimizer) on later segments through the state is dropped.
* :class:`PersistentES`: PES (Vicol et al., 2021), antithetic. Pair ``j`` draws
  ``eps_j`` (ES's noise, :func:`metalearn.outer.evolution.noise`, under
  ``[seed, meta_step]``), adds it to ``xi_j`` and runs the segment with every
  meta-variable at ``theta +- sigma eps_j`` from its own ``+`` and ``-`` states; the
  estimate ``sum_j xi_j (L+_j - L-_j) / (2 N sigma)`` summed over the horizon is
  unbiased for the gradient of the smoothed objective. ``persistent=False`` is
  truncated ES (``eps_j`` in place of ``xi_j``: biased as truncated backpropagation);
  ``noise_reuse=True`` is noise-reuse ES (Li et al., 2023: one ``eps_j`` per pair for
  the whole horizon, in place of ``xi_j``; unbiased as PES).

The learner's adapter must be a :class:`~metalearn.adapters.GradientDescent` (any
update transforms: learned rates, inner Adam, a :class:`~metalearn.adapters.LearnedRule`;
any wrappers). Weights a wrapper sets per step
(:class:`~metalearn.adapters.PerStepWeights`' copies) are not carried: each segment sets
them from the meta-variables for its first step (``GradientDescent.resume``), so its
gradient and perturbations reach them. Under a strategy of several replicas each replica
carries its own tasks' trajectories: the carried variables hold every replica's tasks
along their task axis (replica-major, so their shapes do not depend on the number of
replicas), a replica reads its tasks' slice, and the slices are gathered by the strategy (in the
cross-replica context) before they are assigned; the directions are averaged over the
replicas as any rule's are. A checkpoint restores on any number of replicas dividing
the meta-batch (each then carries the tasks dealt to it); a rule object built on ``R``
replicas runs on ``R``. The estimators on an explicit unroll are in
:mod:`metalearn.outer.persistent`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import gin
import keras
import tensorflow as tf

from metalearn.execution import figures_signature
from metalearn.learners.learner import Learner, check_resumable
from metalearn.learners.task import Resume
from metalearn.outer.evolution import check_population, check_sigma, noise, pair_seed
from metalearn.outer.persistent import check_truncation
from metalearn.outer.rule import Directions, Metrics, OptimizerRule
from metalearn.ranges import WHOLE, check_range

FIRST_REPLICA = tf.VariableAggregation.ONLY_FIRST_REPLICA
"""The carried variables' aggregation: assigned in the cross-replica context (the
replicas' slices gathered), or on one replica; never a sum of replicas' values."""

Carried = Tuple[Dict[str, tf.Tensor], Any]
"""One trajectory's state for a batch of tasks: adapted weights by path and the inner
update's state, each with a leading task axis."""


class CarriedTrajectory(OptimizerRule):
    """The carried-state mechanism :class:`TruncatedUnroll` and :class:`PersistentES`
    share (the module's docstring): the horizon's position, episodes and trajectories as
    non-trainable variables of the rule, a segment of ``truncation`` inner steps for a
    batch of tasks, and the reset every ``horizon / truncation`` outer steps.

    Args:
      optimizer: a Keras optimizer applying the directions (Adam, 1e-3 by default).
      horizon: inner steps of a whole trajectory ``T``.
      truncation: inner steps per outer step ``K`` (``1 <= K <= T``, dividing ``T``).
    """

    #: trajectories carried for each task (``2 population`` for PES)
    trajectories: int = 1

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 horizon: int = gin.REQUIRED, truncation: int = gin.REQUIRED):
        super().__init__(optimizer)
        self.truncation, self.horizon = check_truncation(truncation, horizon,
                                                         type(self).__name__)
        self.segments = self.horizon // self.truncation
        self.position: Optional[tf.Variable] = None
        self.replicas = 1
        self.carried: List[tf.Variable] = []
        self._layout: Optional[Tuple[Any, Any, Any]] = None
        self._task_axes: List[Optional[int]] = []
        self._compiled_segment: Optional[Callable] = None

    def build(self, learner: Learner) -> None:
        super().build(learner)
        check_resumable(learner, type(self).__name__)
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if self.position is None:
            self.replicas = replicas
            self.position = tf.Variable(tf.constant(0, tf.int64), trainable=False,
                                        name="position", aggregation=FIRST_REPLICA)
        elif replicas != self.replicas:
            raise ValueError(f"{type(self).__name__} was built on {self.replicas} "
                             f"replica(s) and carries their tasks' state; it cannot run on "
                             f"{replicas} (build a new rule: a checkpoint's carried state "
                             f"restores on any count)")

    # --- the carried state ------------------------------------------------------------

    def extra_state(self, learner: Learner) -> List[tf.TensorSpec]:
        """Specs of a subclass's own carried tensors (PES's ``xi``); none here."""
        return []

    def _ensure_carried(self, learner: Learner, episodes: Any) -> None:
        """Creates the carried variables (once, at the first trace, outside the traced
        function, not lifted: the step is traced once) with the shapes of this batch:
        the episodes, and per trajectory and task the adapted weights and the update's
        state. A checkpoint read before they exist is restored into them as they are
        created."""
        if self._layout is not None:
            return
        one = tf.nest.map_structure(lambda t: t[0], episodes)
        start = learner.run_task(one, resume=Resume.start_of(self.horizon))
        begun, state = start.adapted.weights, start.inner_state
        paths = learner.adapter.adapted_paths(begun)
        tasks = episodes.num_tasks  # this replica's
        lead = ([self.trajectories] if self.trajectories > 1 else []) + [tasks]
        spec = lambda t, lead: tf.TensorSpec(lead + t.shape.as_list(), t.dtype)
        weights = {p: spec(begun[p], lead) for p in paths}
        state = tf.nest.map_structure(lambda t: spec(t, lead), state)
        stored = tf.nest.map_structure(lambda t: spec(t, []), episodes)
        self._layout = (stored, weights, state)
        stored_flat = tf.nest.flatten(stored)
        trajectory = tf.nest.flatten(weights) + tf.nest.flatten(state)
        extra = self.extra_state(learner)
        # the task axis of each (None: the same on every replica, PES's noise sums)
        self._task_axes = ([0] * len(stored_flat) + [len(lead) - 1] * len(trajectory)
                           + [None] * len(extra))
        with tf.init_scope():
            for i, (s, axis) in enumerate(zip(stored_flat + trajectory + extra,
                                              self._task_axes)):
                shape = s.shape.as_list()
                if axis is not None:  # every replica's tasks, replica-major: the
                    shape[axis] *= self.replicas  # shape does not depend on replicas
                self.carried.append(tf.Variable(  # appended: a restore waiting on the
                    tf.zeros(shape, s.dtype), trainable=False,  # list's entries fills
                    name=f"carried_{i}", aggregation=FIRST_REPLICA,  # each as made
                    # made eagerly here: not lifted out of the trace, which would have
                    # the enclosing tf.function trace the step a second time
                    experimental_enable_variable_lifting=False))

    def read_carried(self) -> Tuple[Any, Dict[str, tf.Tensor], Any, List[tf.Tensor]]:
        """``(episodes, weights, state, extra)`` as carried (tensors; this replica's
        tasks)."""
        stored, weights, state = self._layout
        values = [tf.convert_to_tensor(v) for v in self.carried]
        if self.replicas > 1:  # this replica's tasks
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            values = [v if axis is None else self._replica_slice(v, axis, replica)
                      for v, axis in zip(values, self._task_axes)]
        sizes = [len(tf.nest.flatten(s)) for s in (stored, weights, state)]
        parts, at = [], 0
        for structure, size in zip((stored, weights, state), sizes):
            parts.append(tf.nest.pack_sequence_as(structure, values[at:at + size]))
            at += size
        return parts[0], parts[1], parts[2], values[at:]

    def _replica_slice(self, value: tf.Tensor, axis: int, replica: tf.Tensor) -> tf.Tensor:
        share = value.shape[axis] // self.replicas
        begin = [0] * value.shape.rank
        begin[axis] = replica * share
        size = [-1] * value.shape.rank
        size[axis] = share
        return tf.slice(value, tf.stack(begin), size)

    def store(self, values: List[tf.Tensor]) -> tf.Tensor:
        """Assigns the carried variables (in :meth:`read_carried`'s order, flattened) and
        moves to the next segment (back to 0 after the horizon's last). On several
        replicas each gives its tasks' values, gathered along the task axis in the
        cross-replica context by the strategy (its ``cross_device_ops``)."""
        values = [tf.cast(x, v.dtype) for v, x in zip(self.carried, values)]
        if self.replicas > 1:
            return tf.distribute.get_replica_context().merge_call(
                self._store_gathered, args=(values,))
        return self._assign(values)

    def _store_gathered(self, strategy: tf.distribute.Strategy,
                        values: List[Any]) -> tf.Tensor:
        return self._assign([strategy.experimental_local_results(x)[0] if axis is None
                             else strategy.gather(x, axis=axis)
                             for x, axis in zip(values, self._task_axes)])

    def _assign(self, values: List[tf.Tensor]) -> tf.Tensor:
        assigns = [v.assign(x) for v, x in zip(self.carried, values)]
        with tf.control_dependencies(assigns):
            return self.position.assign((self.position + 1) % self.segments)

    # --- one segment ---------------------------------------------------------------------

    def horizon_episodes(self, episodes: Any) -> Any:
        """The episodes of the current horizon: the batch at its first segment, the
        stored ones after."""
        stored = self.read_carried()[0]
        fresh = tf.equal(self.position, 0)
        return tf.nest.map_structure(lambda new, old: tf.where(fresh, new, old),
                                     episodes, stored)

    def segment(self, learner: Learner, episodes: Any, formulation: Any,
                weights: Dict[str, tf.Tensor], state: Any
                ) -> Tuple[Dict[str, tf.Tensor], Any, Metrics]:
        """``truncation`` inner steps for every task of ``episodes`` (the horizon's)
        from the carried ``weights`` and ``state`` (``[tasks, ...]``; at the horizon's
        first segment from the learner's initial weights instead, read here, so that
        gradients and perturbations reach them): the weights and state after, and the
        per-task figures of the learner's run of the segment
        (:meth:`~metalearn.Learner.run_task` with a
        :class:`~metalearn.learners.task.Resume`: its objective, so a learner that
        weighs every step, MAML++'s, is honoured; with ``truncation = horizon``
        :class:`~metalearn.outer.MetaGradient`'s)."""
        fresh = tf.equal(self.position, 0)
        start = tf.cast(self.position, tf.int32) * self.truncation
        initial = learner.initial_weights()

        def one_task(args):
            episode, carried_weights, carried_state = args
            run = learner.run_task(episode, weights=initial, resume=Resume(
                carried_weights, carried_state, start, self.truncation, self.horizon, fresh))
            return ({p: run.adapted.weights[p] for p in carried_weights}, run.inner_state,
                    run.metrics)

        spec = lambda t: tf.TensorSpec(t.shape[1:], t.dtype)
        signature = (tf.nest.map_structure(spec, weights), tf.nest.map_structure(spec, state),
                     figures_signature(learner))
        resolved = formulation.resolve(learner, episodes, self.truncation)
        return resolved.per_task(learner, one_task, (episodes, weights, state), signature)

    # --- the step ------------------------------------------------------------------------

    def estimate(self, learner: Learner, episodes: Any, formulation: Any
                 ) -> Tuple[Directions, Metrics, List[tf.Tensor]]:
        """The directions, the per-task figures and the carried state after this
        segment (flattened, :meth:`store`'s order); nothing assigned."""
        raise NotImplementedError

    def directions(self, learner, episodes, formulation):
        """This segment's directions and figures (the carried state not advanced:
        :meth:`step` does that)."""
        self._ensure_carried(learner, episodes)
        directions, metrics, _ = self.estimate(learner, episodes, formulation)
        return directions, metrics

    def step(self, learner, episodes, formulation, apply=None, jit_compile=False):
        """One segment: the directions, the carried state stored and the position
        advanced, then ``apply`` (the guards' or this rule's)."""
        self._ensure_carried(learner, episodes)
        run = self.estimate
        if jit_compile:
            if self._compiled_segment is None:
                self._compiled_segment = tf.function(self.estimate, jit_compile=True)
            run = self._compiled_segment
        directions, metrics, carried = run(learner, episodes, formulation)
        with tf.control_dependencies([self.store(carried)]):
            directions = [tf.identity(d) for d in directions]
        return (apply or self.apply)(learner, directions, metrics)


@gin.configurable
class TruncatedUnroll(CarriedTrajectory):
    """Truncated backpropagation through a carried inner trajectory (the module's
    docstring): each outer step backpropagates through one segment of ``truncation``
    inner steps, the state it starts from a constant, and a Keras optimizer applies the
    gradient of the segment's mean query loss. ``truncation = horizon``:
    :class:`~metalearn.outer.MetaGradient` with ``horizon`` inner steps.

    Args:
      optimizer: a Keras optimizer; defaults to Adam with learning rate 1e-3.
      horizon: inner steps of a whole trajectory.
      truncation: inner steps per outer step (dividing ``horizon``).
    """

    @classmethod
    def configured_class(cls) -> type:
        return TruncatedUnroll

    def estimate(self, learner, episodes, formulation):
        episodes = self.horizon_episodes(episodes)
        _, weights, state, _ = self.read_carried()
        variables = learner.meta_variables
        with tf.GradientTape() as tape:
            weights, state, metrics = self.segment(learner, episodes, formulation,
                                                   weights, state)
            loss = tf.reduce_mean(metrics["loss"])
        gradients = tape.gradient(loss, variables,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        carried = (tf.nest.flatten(episodes) + tf.nest.flatten(weights)
                   + tf.nest.flatten(state))
        return list(gradients), metrics, carried


@gin.configurable
class PersistentES(CarriedTrajectory):
    """Persistent evolution strategies (Vicol et al., 2021) through a carried inner
    trajectory, antithetic (the module's docstring), applied by a Keras optimizer.

    Each outer step runs one segment for ``2 population`` particles (every task's inner
    loop at ``theta + sigma eps_j`` and at ``theta - sigma eps_j``, each from its own
    carried state; nothing assigned, no tape) and estimates
    ``sum_j xi_j (L+_j - L-_j) / (2 population sigma)``, ``L`` the segment's mean query
    loss. The figures reported are the per-task figures averaged over the particles.

    Args:
      optimizer: a Keras optimizer; defaults to Adam with learning rate 1e-3.
      horizon: inner steps of a whole trajectory.
      truncation: inner steps per outer step (dividing ``horizon``).
      population: antithetic pairs, >= 1.
      sigma: the noise scale, > 0.
      persistent: ``False``: truncated ES (``eps_j`` in place of ``xi_j``; biased).
      seed: the noise stream's seed (pair ``j``'s noise at outer step ``s`` is
        :class:`~metalearn.outer.EvolutionStrategies`' under ``[seed, s]``).
      noise_reuse: noise-reuse ES (Li et al., 2023): pair ``j`` draws its noise once per
        horizon (under ``[seed, s0]``, ``s0`` the outer step the horizon started at) and
        every segment's estimate is ``eps_j (L+_j - L-_j) / (2 sigma)`` averaged over the
        pairs; the particles stay at ``theta +- sigma eps_j`` for the whole horizon, so
        the estimate is unbiased like PES's without accumulating ``xi``. Needs
        ``persistent=True``.
    """

    def __init__(self, optimizer: Optional[keras.optimizers.Optimizer] = None,
                 horizon: int = gin.REQUIRED, truncation: int = gin.REQUIRED,
                 population: int = 8, sigma: float = 0.01, persistent: bool = True,
                 seed: int = 0, noise_reuse: bool = False):
        super().__init__(optimizer, horizon, truncation)
        self.population = int(check_population(population, "PersistentES"))
        self.sigma = float(check_sigma(sigma, "PersistentES"))
        self.seed = int(check_range("PersistentES", "seed", seed, WHOLE))
        self.persistent = bool(persistent)
        self.noise_reuse = bool(noise_reuse)
        if self.noise_reuse and not self.persistent:
            raise ValueError("PersistentES: noise_reuse=True keeps each pair's noise for "
                             "the whole horizon and needs persistent=True; got "
                             "persistent=False (truncated ES draws new noise every segment)")
        self.trajectories = 2 * self.population

    @classmethod
    def configured_class(cls) -> type:
        return PersistentES

    def extra_state(self, learner):
        return [tf.TensorSpec([self.population] + list(v.shape), v.dtype)
                for v in learner.meta_variables]

    def estimate(self, learner, episodes, formulation):
        episodes = self.horizon_episodes(episodes)
        _, weights, state, xi = self.read_carried()
        fresh = tf.equal(self.position, 0)
        variables = learner.meta_variables
        values = [tf.convert_to_tensor(v) for v in variables]
        step = tf.cast(learner.meta_step, tf.int64)
        if self.noise_reuse:  # one draw per horizon: the step it started at
            step = step - tf.convert_to_tensor(self.position)
        seed = tf.stack([tf.constant(self.seed, tf.int64), step])
        shapes, dtypes = [v.shape for v in variables], [v.dtype for v in variables]
        n = self.population
        flat_weights, flat_state = tf.nest.flatten(weights), tf.nest.flatten(state)
        particle = lambda flat, i: [tf.gather(t, i) for t in flat]

        def member(values_k, i):
            w = tf.nest.pack_sequence_as(weights, particle(flat_weights, i))
            s = tf.nest.pack_sequence_as(state, particle(flat_state, i))
            with keras.StatelessScope(state_mapping=list(zip(variables, values_k))):
                w, s, metrics = self.segment(learner, episodes, formulation, w, s)
            return tf.nest.flatten(w) + tf.nest.flatten(s), metrics

        # one graph for a particle's segment, called for both members of every pair
        # (traced inline, the first pair and the loop's body held four copies)
        member = tf.function(member, autograph=False)

        def pair(j):
            eps = noise(pair_seed(seed, j), shapes, dtypes)
            index = tf.cast(j, tf.int32)
            xi_j = [tf.where(fresh, tf.zeros_like(e), tf.gather(x, index)) + e
                    for x, e in zip(xi, eps)]
            plus, plus_metrics = member([v + self.sigma * e for v, e in zip(values, eps)],
                                        index)
            minus, minus_metrics = member([v - self.sigma * e for v, e in zip(values, eps)],
                                          index + n)
            weight = (tf.reduce_mean(plus_metrics["loss"])
                      - tf.reduce_mean(minus_metrics["loss"]))
            summed = {k: plus_metrics[k] + minus_metrics[k] for k in plus_metrics}
            return plus, minus, xi_j, eps, weight, summed

        scale = 1.0 / (2.0 * n * self.sigma)
        plus, minus, xi_0, eps_0, weight, sums = pair(tf.constant(0, tf.int64))
        array = lambda t: tf.TensorArray(t.dtype, size=n, element_shape=t.shape)
        arrays = [[array(t).write(0, t) for t in group] for group in (plus, minus, xi_0)]
        direction = lambda xi_j, eps_j: (eps_j if self.noise_reuse or not self.persistent
                                         else xi_j)
        totals = [tf.cast(weight, d.dtype) * d for d in direction(xi_0, eps_0)]

        def body(j, arrays, totals, sums):
            plus, minus, xi_j, eps_j, weight, summed = pair(j)
            index = tf.cast(j, tf.int32)
            arrays = [[a.write(index, t) for a, t in zip(group, values)]
                      for group, values in zip(arrays, (plus, minus, xi_j))]
            totals = [t + tf.cast(weight, d.dtype) * d
                      for t, d in zip(totals, direction(xi_j, eps_j))]
            return j + 1, arrays, totals, {k: sums[k] + summed[k] for k in sums}

        _, arrays, totals, sums = tf.while_loop(
            lambda j, *_: j < n, body, (tf.constant(1, tf.int64), arrays, totals, sums))
        plus, minus, xi = [[a.stack() for a in group] for group in arrays]
        carried = (tf.nest.flatten(episodes)
                   + [tf.concat([p, m], 0) for p, m in zip(plus, minus)] + xi)
        metrics = {k: total / tf.cast(2 * n, total.dtype) for k, total in sums.items()}
        return [t * tf.constant(scale, t.dtype) for t in totals], metrics, carried
