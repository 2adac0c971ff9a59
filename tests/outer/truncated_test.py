"""TruncatedUnroll and PersistentES on a learner (metalearn.outer.truncated): truncated
backpropagation with the truncation covering the horizon is MetaGradient (float64,
1e-10); the carried trajectory is the inner loop's own (inner Adam's state carried, in
a while-loop); PES's mean over particles is the full-unroll gradient of the horizon's
objective within a stated standard-error tolerance (fixed seeds) where truncated ES's
is not; a run stopped mid-horizon and resumed through metalearn.train ends
bit-identical; bad input named."""

import functools
import os

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn.adapters import GradientDescent, InnerAdam, PerStepWeights, WhileLoop
from metalearn.execution import MapFn
from metalearn.outer import MetaGradient, PersistentES, TruncatedUnroll
from metalearn.testing import (carried_segment_gradients, evolution_noise, relative_error,
                               values)
from metalearn.testing.tasks import mse, regression_episodes
from metalearn.training import (build_experiment, distribute, make_meta_step, parse_config,
                                restore, train)
from tests.objective_fixtures import ShiftedObjective


def learner(adapter, hidden=(4,)):
    keras.utils.set_random_seed(5)
    model = metalearn.models.mlp((2,), hidden=hidden, outputs=1, activation="tanh",
                                 dtype="float64")
    return metalearn.Learner(model, adapter, loss=mse)


def two_steps(model, rule, formulation):
    """``model``'s meta-variables after two outer steps of ``rule`` (on the episodes of
    seeds 0 and 1: 3 tasks, 4 shots), traced once (a carrying rule's variables, made
    at the first trace, do not have the step traced again)."""
    step = make_meta_step(model, rule, formulation)
    for seed in (0, 1):
        step(regression_episodes(tasks=3, shots=4, seed=seed))
    assert step.experimental_get_tracing_count() == 1
    return values(model)


@functools.lru_cache(maxsize=None)
def meta_gradient_steps(formulation):
    """:func:`two_steps` of MetaGradient (SGD 0.3) on the plain learner (GradientDescent
    3 steps of 0.2), run once per formulation: the reference of the tests below."""
    return two_steps(learner(GradientDescent(3, 0.2)),
                     MetaGradient(keras.optimizers.SGD(0.3)), formulation)


@pytest.mark.parametrize("formulation", ["map_fn", "batched"])
def test_truncation_covering_the_horizon_is_the_meta_gradient(formulation):
    """Two outer steps (each a whole horizon: the trajectory restarts) of TruncatedUnroll
    with truncation = horizon = the adapter's 3 steps, against MetaGradient: the
    meta-variables agree to 1e-10 in float64."""
    found = {"truncated": two_steps(learner(GradientDescent(3, 0.2)), TruncatedUnroll(
        keras.optimizers.SGD(0.3), horizon=3, truncation=3), formulation),
             "gradient": meta_gradient_steps(formulation)}
    start = values(learner(GradientDescent(3, 0.2)))
    for path, value in found["gradient"].items():
        assert not np.allclose(value, start[path])
        np.testing.assert_allclose(found["truncated"][path], value, rtol=1e-10, atol=1e-10)


def objective_learner(kind):
    """A learner whose objective is not the last step's query loss: MAML++'s
    multi-step loss (uniform step weights at these meta-steps) or a subclass's."""
    keras.utils.set_random_seed(5)
    model = metalearn.models.mlp((2,), hidden=(4,), outputs=1, activation="tanh",
                                 dtype="float64")
    if kind == "maml++":
        return metalearn.MultiStepLossLearner(model, GradientDescent(3, 0.2), loss=mse,
                                              anneal_steps=10 ** 6)
    return ShiftedObjective(model, GradientDescent(3, 0.2), loss=mse)


@pytest.mark.parametrize("formulation", ["map_fn", "accumulate"])
@pytest.mark.parametrize("kind", ["maml++", "subclass"])
def test_an_objective_changing_learner_covering_the_horizon_is_the_meta_gradient(
        kind, formulation):
    """0.3: the segment measured the last step's query loss, not the learner's
    objective (MAML++'s update 3.8e-2 away from MetaGradient's on SGD(0.3)). The segment
    is the learner's own task run, so with K = T the two agree to 1e-10 in float64."""
    found = {name: two_steps(objective_learner(kind), rule, formulation) for name, rule in (
        ("truncated", TruncatedUnroll(keras.optimizers.SGD(0.3), horizon=3, truncation=3)),
        ("gradient", MetaGradient(keras.optimizers.SGD(0.3))))}
    plain = meta_gradient_steps(formulation)
    for path, value in found["gradient"].items():
        assert not np.allclose(value, plain[path])  # the objective matters
        np.testing.assert_allclose(found["truncated"][path], value, rtol=1e-10, atol=1e-10)


def test_maml_plus_plus_segments_sum_to_its_objective():
    """K = 1 of T = 3: each segment's objective is MAML++'s weighted query loss of its
    one step, weighted as in the whole horizon; the three segments' figures sum to the
    multi-step loss of the whole trajectory (1e-12), at unchanged meta-variables."""
    model = objective_learner("maml++")
    episodes = regression_episodes(tasks=3, shots=4)
    rule = TruncatedUnroll(keras.optimizers.SGD(0.3), horizon=3, truncation=1)
    rule.build(model)
    segments = [rule.step(model, episodes, MapFn(), apply=no_update)["loss"].numpy()
                for _ in range(3)]
    whole = model.meta_metrics(episodes, formulation=MapFn())["loss"].numpy()
    np.testing.assert_allclose(np.sum(segments, axis=0), whole, rtol=1e-12, atol=1e-12)


def no_update(learner, directions, metrics):
    """An ``apply`` that moves nothing and hands the directions back as figures."""
    return {**metrics, **{f"direction_{k}": d for k, d in enumerate(directions)}}


def assert_carried_is_the_inner_loop(rule, model, episodes, steps):
    """The rule's carried weights are each task's weights after ``steps`` inner steps
    (float64, 1e-12); returns them."""
    _, carried, _, _ = rule.read_carried()
    for i in range(episodes.num_tasks):
        task = episodes.task(i)
        adapted = model.adapt(task.support_x, task.support_y, steps=steps).weights
        for path, value in carried.items():
            np.testing.assert_allclose(value[i].numpy(), adapted[path].numpy(),
                                       rtol=1e-12, atol=1e-12)
    return carried


def test_the_carried_trajectory_is_the_inner_loop():
    """Inner Adam (its moments carried) in a while-loop, 6 steps in segments of 2: the
    carried weights after the horizon's three segments are each task's weights after 6
    inner steps; the next outer step starts again from the initial weights."""
    model = learner(GradientDescent(6, update=InnerAdam(0.05), wrappers=[WhileLoop()]))
    rule = TruncatedUnroll(keras.optimizers.SGD(0.1), horizon=6, truncation=2)
    episodes = regression_episodes(tasks=3, shots=4)
    other = regression_episodes(tasks=3, shots=4, seed=7)
    step = tf.function(lambda batch: rule.step(model, batch, metalearn.execution.MapFn(),
                                               apply=no_update))
    rule.build(model)
    step(episodes)
    step(other)  # ignored: the horizon's episodes are the first batch's
    step(other)
    assert int(rule.position.numpy()) == 0
    assert_carried_is_the_inner_loop(rule, model, episodes, steps=6)
    first = step(other)  # a new horizon, on this batch: the loss after 2 steps
    expected = np.mean([model.run_task(other.task(i), steps=2).metrics["loss"].numpy()
                        for i in range(other.num_tasks)])
    np.testing.assert_allclose(np.mean(first["loss"].numpy()), expected, rtol=1e-12)


@pytest.mark.parametrize("kind, jit_compile", [("pes", False), ("truncated", True)],
                         ids=["pes", "truncated-xla"])
def test_two_replicas_each_carry_their_own_tasks(kind, jit_compile):
    """Two replicas with two tasks each against one replica with the four, inner Adam
    in a while-loop over a horizon of 4 steps in segments of 2, three outer steps (the
    third starts a new horizon): every replica carries its own tasks' weights and
    moments, so the losses, the meta-variables and the carried state (every task's, in
    one layout whatever the replicas) agree to 1e-12 in float64. (The carrying is
    CarriedTrajectory's, shared by both rules: PES in a graph, TruncatedUnroll under
    XLA.)"""
    def rule():
        if kind == "truncated":
            return TruncatedUnroll(keras.optimizers.SGD(0.3), horizon=4, truncation=2)
        return PersistentES(keras.optimizers.SGD(0.3), horizon=4, truncation=2,
                            population=2, sigma=0.1, seed=3)

    found = {}
    for replicas in (1, 2):
        strategy = mirrored(replicas) if replicas > 1 else tf.distribute.get_strategy()
        with strategy.scope():
            model = learner(GradientDescent(4, update=InnerAdam(0.05), wrappers=[WhileLoop()]))
        outer = rule()
        step = make_meta_step(model, outer, "map_fn", jit_compile=jit_compile,
                              strategy=strategy)
        losses = []
        for seed in range(3):
            batch = regression_episodes(tasks=4, shots=4, seed=seed)
            if replicas > 1:
                batch = distribute.split_episodes(strategy, batch)
            losses.append(float(step(batch)["loss"].numpy()))
        assert step.experimental_get_tracing_count() == 1  # the carried state made once
        found[replicas] = (losses, values(model), outer)
    np.testing.assert_allclose(found[2][0], found[1][0], rtol=1e-12)
    for path, value in found[1][1].items():
        np.testing.assert_allclose(found[2][1][path], value, rtol=1e-12, atol=1e-14)
    # the carried state is laid out as one replica's (every task, replica-major): the
    # same shapes and values, so a checkpoint restores on either count
    for two, one in zip(found[2][2].carried, found[1][2].carried):
        assert two.shape == one.shape
        np.testing.assert_allclose(two.numpy(), one.numpy(), rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match=r"was built on 2 replica\(s\) and carries their "
                                         r"tasks' state; it cannot run on 1"):
        found[2][2].build(model)  # outside the strategy: one replica


HORIZON, TRUNCATION, TASKS = 4, 2, 2


def horizon_gradient(model, episodes):
    """The full-unroll gradient of the horizon's objective: the sum over segments of the
    mean query loss after each segment's last step (steps 2 and 4), one tape around
    the whole inner trajectory (learner.adapt_trajectory)."""
    with tf.GradientTape() as tape:
        total = 0.0
        for i in range(episodes.num_tasks):
            task = episodes.task(i)
            trajectory = metalearn.learners.adapt_trajectory(model, task.support_x, task.support_y,
                                                steps=HORIZON)
            for end in range(TRUNCATION, HORIZON + 1, TRUNCATION):
                total += model.task_loss(task.query_y,
                                         model.predict(trajectory[end], task.query_x))
        total = total / episodes.num_tasks
    return np.concatenate([np.ravel(g) for g in tape.gradient(total, model.meta_variables)])


def pes_runs(persistent, runs=16, population=64, noise_reuse=False):
    """``runs`` independent estimates (each summed over the horizon's two segments; the
    noise differs through the step counter) of PES, noise-reuse ES or truncated ES on a
    linear model with two inner steps per segment, and the full-unroll gradient."""
    model = learner(GradientDescent(HORIZON, 0.3), hidden=())
    episodes = regression_episodes(tasks=TASKS, shots=4)
    rule = PersistentES(keras.optimizers.SGD(0.1), horizon=HORIZON, truncation=TRUNCATION,
                        population=population, sigma=1e-3, persistent=persistent, seed=1,
                        noise_reuse=noise_reuse)
    rule.build(model)
    step = tf.function(lambda batch: rule.step(model, batch, metalearn.execution.MapFn(),
                                               apply=no_update))
    estimates = []
    for _ in range(runs):
        total = 0.0
        for _ in range(HORIZON // TRUNCATION):
            figures = step(episodes)
            total = total + np.concatenate(
                [np.ravel(figures[f"direction_{k}"].numpy())
                 for k in range(len(model.meta_variables))])
            model.meta_step.assign_add(1)
        estimates.append(total)
    return np.array(estimates), horizon_gradient(model, episodes)


@pytest.mark.parametrize("rule", ["pes", "noise_reuse", "truncated_es"])
def test_pes_and_noise_reuse_are_unbiased_and_truncated_es_is_not(rule):
    """16 runs of 64 antithetic pairs: the mean of PES's and of noise-reuse ES's
    estimates is within 4 standard errors of the full-unroll gradient (plus 1e-3 of its
    norm for the O(sigma^2) smoothing) in every coordinate; truncated ES's is more than
    8 standard errors away in some coordinate (it misses the initial weights' effect on
    the second segment's loss)."""
    runs, exact = pes_runs(rule != "truncated_es", noise_reuse=rule == "noise_reuse")
    mean, error = runs.mean(0), runs.std(0, ddof=1) / np.sqrt(len(runs))
    deviation = np.abs(mean - exact)
    if rule != "truncated_es":
        assert np.all(deviation <= 4 * error + 1e-3 * np.linalg.norm(exact)), \
            (mean, exact, error)
    else:
        assert np.any(deviation > 8 * error), (mean, exact, error)


def test_noise_reuse_keeps_a_pairs_noise_for_the_horizon():
    """Noise-reuse ES's two segments of a horizon estimate with the same noise: on a
    linear model whose segments' losses differ, the two directions are parallel per
    pair (one pair), and the next horizon draws new noise."""
    model = learner(GradientDescent(HORIZON, 0.3), hidden=())
    episodes = regression_episodes(tasks=TASKS, shots=4)
    rule = PersistentES(keras.optimizers.SGD(0.1), horizon=HORIZON, truncation=TRUNCATION,
                        population=1, sigma=1e-3, seed=1, noise_reuse=True)
    rule.build(model)
    step = tf.function(lambda batch: rule.step(model, batch, metalearn.execution.MapFn(),
                                               apply=no_update))
    directions = []
    for _ in range(3):
        figures = step(episodes)
        directions.append(np.concatenate([np.ravel(figures[f"direction_{k}"].numpy())
                                          for k in range(len(model.meta_variables))]))
        model.meta_step.assign_add(1)
    cosine = lambda a, b: abs(a @ b) / np.linalg.norm(a) / np.linalg.norm(b)
    assert cosine(directions[0], directions[1]) > 1 - 1e-9
    assert cosine(directions[1], directions[2]) < 0.9
    with pytest.raises(ValueError, match="noise_reuse=True keeps each pair's noise for the "
                                         "whole horizon and needs persistent=True"):
        PersistentES(horizon=4, truncation=2, persistent=False, noise_reuse=True)


FILES = ["experiments/sinusoid/maml.gin", "experiments/learners/truncated.gin"]
SMALL = ["INNER_STEPS = 4", "HORIZON = 4",
         "TRUNCATION = 1", "INNER_LR = 0.1", "Experiment.meta_batch_size = 2",
         "mlp.hidden = (8,)", "Loop.log_every = 1", "Loop.checkpoint_every = 2",
         "Experiment.formulation = @MapFn()", "keras.optimizers.Adam.learning_rate = 0.01"]


def _files(extra=()):
    """FILES, or MAML's file and the learner in ``extra`` (pes.gin) in place of
    truncated.gin: one outer-rule learner, never one re-binding another's
    (validation.check_roles)."""
    others = [f for f in extra if f.endswith(".gin")]
    return FILES[:1] + others if others else list(FILES)


def mirrored(replicas=2):
    """Logical CPUs (tests/conftest.py), reduced on one device: TensorFlow's collectives
    cannot be reused across the strategies of one test process
    (tests/training/distribute_test.py)."""
    return distribute.make_strategy("mirrored", [f"/cpu:{i}" for i in range(replicas)],
                                    cross_device_ops="reduce_to_one_device")


def _run(workdir, steps, extra=(), replicas=1):
    files = _files(extra)
    params = [p for p in extra if not p.endswith(".gin")]
    parse_config(files, SMALL + params + [f"Loop.num_steps = {steps}"])
    strategy = mirrored(replicas) if replicas > 1 else None
    experiment = build_experiment(strategy)
    train(experiment, workdir, strategy=strategy)
    return experiment


PES_EXTRA = ("experiments/learners/pes.gin", "PersistentES.population = 2")
_MIRRORED_PES = {}


def mirrored_pes_run(tmp_path_factory):
    """The uninterrupted PES run on two mirrored replicas (6 outer steps, gin config
    cleared after), made once per process: the reference of both the resumed run and
    the two workers below (tests marked ``xdist_group("mirrored_pes")``, on one
    worker). Returns the experiment and its workdir; neither test changes them."""
    if not _MIRRORED_PES:
        workdir = str(tmp_path_factory.mktemp("mirrored_pes"))
        try:
            _MIRRORED_PES["run"] = _run(workdir, 6, PES_EXTRA, replicas=2), workdir
        finally:
            gin.clear_config()
    return _MIRRORED_PES["run"]


@pytest.mark.xdist_group("mirrored_pes")
@pytest.mark.parametrize("extra, replicas", [((), 1), (PES_EXTRA, 2)],
                         ids=["truncated", "pes-2-replicas"])
def test_a_run_resumed_mid_horizon_ends_bit_identical(tmp_path, tmp_path_factory, extra,
                                                      replicas):
    """metalearn.train with the gin file: stopped after 3 outer steps (mid-horizon:
    segment 3 of 4) and resumed to 6, against 6 uninterrupted: the meta-variables and
    the rule's carried state (position, episodes, trajectories, PES's noise sums; on two
    replicas every replica's tasks) are bit-identical. (TruncatedUnroll on one replica,
    PES on two: the checkpointed state is CarriedTrajectory's, PES adding its noise
    sums. The uninterrupted PES run is mirrored_pes_run's.)"""
    if replicas > 1:
        whole = mirrored_pes_run(tmp_path_factory)[0]
    try:
        if replicas == 1:
            whole = _run(str(tmp_path / "whole"), 6, extra, replicas)
        _run(str(tmp_path / "broken"), 3, extra, replicas)
        resumed = _run(str(tmp_path / "broken"), 6, extra, replicas)
        rule = resumed.outer_rule
        assert isinstance(rule, PersistentES if extra else TruncatedUnroll)
        assert int(rule.position.numpy()) == 2 and int(resumed.learner.meta_step.numpy()) == 6
        for path, value in values(whole.learner).items():
            np.testing.assert_array_equal(values(resumed.learner)[path], value, err_msg=path)
        assert len(rule.carried) == len(whole.outer_rule.carried) > 4
        for mine, theirs in zip(rule.carried, whole.outer_rule.carried):
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
        assert restore(str(tmp_path / "broken")).learner.meta_step.numpy() == 6
    finally:
        gin.clear_config()


def per_step_learner():
    """Inner Adam in a while-loop, 4 steps, the first layer's bias a per-step copy
    (PerStepWeights), each copy moved off the model's value so every step's differs."""
    model = learner(GradientDescent(4, update=InnerAdam(0.05),
                                    wrappers=[PerStepWeights(("hidden0/bias",)), WhileLoop()]),
                    hidden=(3,))
    copies = [v for v in model.meta_variables if "per_step" in v.path]
    assert len(copies) == 1 and copies[0].shape == (5, 3)
    rng = np.random.default_rng(2)
    copies[0].assign(copies[0].numpy() + 0.5 * rng.standard_normal((5, 3)))
    return model, copies[0]


@pytest.mark.parametrize("kind", ["truncated", "pes"])
def test_per_step_weights_are_set_for_each_segment_from_the_meta_variables(kind):
    """Horizon 4 in segments of 2 with per-step copies: the second segment starts from
    copy 2 (not the carried trajectory's copy 0), so its reported loss is each task's
    query loss after the whole 4-step inner loop (PES: its particles' mean, sigma 1e-7,
    equal to O(sigma^2)); the carried weights are the inner loop's."""
    model, _ = per_step_learner()
    rule = (TruncatedUnroll(keras.optimizers.SGD(0.1), horizon=4, truncation=2)
            if kind == "truncated" else
            PersistentES(keras.optimizers.SGD(0.1), horizon=4, truncation=2, population=2,
                         sigma=1e-7))
    episodes = regression_episodes(tasks=3, shots=4)
    step = tf.function(lambda batch: rule.step(model, batch, MapFn(), apply=no_update))
    rule.build(model)
    step(episodes)
    second = step(episodes)
    expected = [model.run_task(episodes.task(i), steps=4).metrics["loss"].numpy()
                for i in range(episodes.num_tasks)]
    np.testing.assert_allclose(second["loss"].numpy(), expected, rtol=1e-9)
    if kind == "truncated":
        carried = assert_carried_is_the_inner_loop(rule, model, episodes, steps=4)
        assert "hidden0/bias" not in carried


def test_a_segments_gradient_reaches_the_per_step_copies_it_uses():
    """The second segment's truncated gradient (the carried state held constant) is
    float64 central differences of that segment's mean query loss in every
    meta-variable, the per-step copies included: copies 2-4 get one, copies 0-1 (the
    first segment's) none."""
    model, copies = per_step_learner()
    analytic, numeric = carried_segment_gradients(
        TruncatedUnroll(keras.optimizers.SGD(0.1), horizon=4, truncation=2), model,
        regression_episodes(tasks=2, shots=4))
    assert relative_error(analytic, numeric) < 1e-6
    per_step = analytic[copies.path]
    assert np.all(per_step[:2] == 0) and np.all(np.abs(per_step[2:]).max(axis=1) > 1e-4)


def test_es_perturbations_reach_the_per_step_copies():
    """Truncated ES with one pair, sigma 1e-5, at the horizon's first segment: its
    estimate is ``eps (g . eps)`` to O(sigma^2), ``g`` TruncatedUnroll's gradient there
    and ``eps`` the pair's noise, in every meta-variable, the per-step copies
    included."""
    episodes = regression_episodes(tasks=2, shots=4)
    found = {}
    for name, rule in (("es", PersistentES(keras.optimizers.SGD(0.1), horizon=4,
                                           truncation=2, population=1, sigma=1e-5,
                                           persistent=False, seed=3)),
                       ("gradient", TruncatedUnroll(keras.optimizers.SGD(0.1), horizon=4,
                                                    truncation=2))):
        model, copies = per_step_learner()
        rule.build(model)
        figures = tf.function(lambda b: rule.step(model, b, MapFn(), apply=no_update))(
            episodes)
        found[name] = [figures[f"direction_{k}"].numpy()
                       for k in range(len(model.meta_variables))]
    variables = model.meta_variables
    eps = [evolution_noise([3, 0], 0, k, v.shape) for k, v in enumerate(variables)]
    projection = sum(np.sum(g * e) for g, e in zip(found["gradient"], eps))
    expected = {v.path: e * projection for v, e in zip(variables, eps)}
    estimate = {v.path: d for v, d in zip(variables, found["es"])}
    assert relative_error(estimate, expected) < 1e-6
    assert np.abs(estimate[copies.path]).max() > 1e-4


@pytest.mark.xdist_group("mirrored_pes")
def test_two_workers_carry_their_tasks_as_two_replicas_do(tmp_path, tmp_path_factory):
    """PES through metalearn.train on a MultiWorkerMirroredStrategy of two worker
    processes (loopback, one replica each), 6 outer steps over horizons of 4: the
    chief's checkpoint holds the meta-variables, position and carried state (both
    workers' tasks: episodes, particles' trajectories, noise sums) of the same run on
    two mirrored replicas in one process (each replica's tasks are its stream's, the
    same in both: mirrored_pes_run's), to 1e-6."""
    from tests import distributed_case
    extra = PES_EXTRA
    workdir = str(tmp_path / "workers")
    args = ["-m", "metalearn.train", "--strategy=multi_worker", f"--workdir={workdir}"]
    args += [f"--gin_file={f}" for f in _files(extra)]
    args += [f"--gin_param={p}" for p in SMALL + [extra[1], "Loop.num_steps = 6"]]
    distributed_case.wait_for(distributed_case.launch_workers(args), timeout=400)
    mirrored_run, mirrored_dir = mirrored_pes_run(tmp_path_factory)
    workers = restore(workdir)
    assert int(workers.learner.meta_step.numpy()) == 6
    assert int(workers.outer_rule.position.numpy()) == 2
    moved = values(mirrored_run.learner)
    for path, value in values(workers.learner).items():
        np.testing.assert_allclose(value, moved[path], rtol=1e-6, atol=1e-9, err_msg=path)
    readers = [tf.train.load_checkpoint(os.path.join(d, "checkpoints"))
               for d in (workdir, mirrored_dir)]
    carried = [k for k in readers[1].get_variable_to_shape_map() if "outer_rule/carried/" in k]
    assert len(carried) == len(mirrored_run.outer_rule.carried) > 4
    for key in carried:
        mine, theirs = (r.get_tensor(key) for r in readers)
        assert np.abs(theirs).max() > 0, key
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-9, err_msg=key)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"TruncatedUnroll: truncation \(10 steps\) is "
                                         r"longer than the horizon \(8 steps\)"):
        TruncatedUnroll(horizon=8, truncation=10)
    with pytest.raises(ValueError, match=r"PersistentES: truncation \(3 steps\) must "
                                         r"divide the horizon \(8 steps\)"):
        PersistentES(horizon=8, truncation=3)
    with pytest.raises(ValueError, match=r"PersistentES.sigma \(the noise scale\) must be "
                                         r"> 0, got 0.0"):
        PersistentES(horizon=8, truncation=2, sigma=0.0)
    with pytest.raises(ValueError, match=r"PersistentES.population \(antithetic pairs\) "
                                         r"must be a whole number >= 1, got 0"):
        PersistentES(horizon=8, truncation=2, population=0)
    with pytest.raises(TypeError, match="carries a GradientDescent inner loop across outer "
                                        "steps; the learner's adapter is NoAdaptation"):
        TruncatedUnroll(horizon=2, truncation=1).build(
            learner(metalearn.adapters.NoAdaptation()))
