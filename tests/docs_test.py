"""The tutorials in docs/ run as written, the front door's code (README.md, docs/getting_started.md)
runs as pasted, and the CAVIA pieces' meta-gradient is exact."""

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import gin
import numpy as np
import pytest
import tensorflow as tf

from metalearn.testing import finite_difference_gradient, relative_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tutorials; docs/hypernetwork.md's code runs in tests/adapters/hypernetwork_test.py.
DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "tutorials", "*.md")))
TUTORIALS = ["first_meta_learner.md", "cavia.md", "custom_learner.md", "gin_and_sweeps.md",
             "several_devices.md", "maml_from_scratch.md", "inner_loop_piece.md",
             "own_head.md", "own_images.md", "outer_rule.md", "in_context.md",
             "learned_optimizer.md", "meta_rl.md", "keras_fit.md"]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(path):
    with open(path) as f:
        return _BLOCK.findall(f.read())


@functools.lru_cache(maxsize=None)  # once per process: classes register with gin once
def run_doc(path):
    namespace = {"__name__": "docs_" + re.sub(r"\W", "_", os.path.basename(path)[:-3])}
    cwd = os.getcwd()
    gin.clear_config()  # a fresh, unlocked gin, as in a new script
    os.chdir(ROOT)  # the tutorials run from the repository root, like the commands
    try:
        for i, block in enumerate(python_blocks(path)):
            exec(compile(block, f"{path}[python block {i}]", "exec"), namespace)
    finally:
        os.chdir(cwd)
        gin.clear_config()
    return namespace


def test_every_tutorial_is_there_with_code():
    names = [os.path.basename(p) for p in DOCS]
    for name in TUTORIALS:
        assert name in names, name
        assert python_blocks(os.path.join(ROOT, "docs", "tutorials", name)), name


@pytest.mark.parametrize("path", [p for p in DOCS if python_blocks(p)],
                         ids=lambda p: os.path.relpath(p, ROOT))
def test_doc_code_runs(path):
    run_doc(path)


FRONT_DOOR = ["README.md", os.path.join("docs", "getting_started.md")]


@functools.lru_cache(maxsize=None)  # the pages share their code: one run per script
def run_pasted(code):
    """``code`` as a script in a fresh Python process, from a new folder outside the
    checkout: the finished process (its return code and output)."""
    folder = tempfile.mkdtemp(prefix="pasted-")
    try:
        script = os.path.join(folder, "pasted.py")
        with open(script, "w") as f:
            f.write(code)
        return subprocess.run([sys.executable, script], cwd=folder,
                              env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True,
                              text=True, timeout=600)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.xdist_group("front_door")  # on one worker, so that run_pasted runs once
@pytest.mark.parametrize("page", FRONT_DOOR)
def test_front_door_code_runs_as_pasted(page):
    """The page's own Python blocks, as they are, one after the other in a fresh Python
    process (what a newcomer pasting them gets), from a folder outside the checkout
    (pages whose blocks are the same text share one run)."""
    blocks = python_blocks(os.path.join(ROOT, page))
    assert blocks, page
    result = run_pasted("\n".join(blocks))
    assert result.returncode == 0, f"{page}'s code failed:\n{result.stderr[-4000:]}"
    assert "(10, 1) 6" in result.stdout  # the output the page shows in a comment


def test_cavia_is_short():
    block = python_blocks(os.path.join(ROOT, "docs", "tutorials", "cavia.md"))[0]
    code = [line for line in block.splitlines() if line.strip()]
    assert len(code) < 50, len(code)


def test_cavia_meta_gradient_matches_finite_differences():
    import keras
    import metalearn
    from metalearn.execution import Unrolled
    doc = run_doc(os.path.join(ROOT, "docs", "tutorials", "cavia.md"))
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((1,), dtype="float64"),
                              doc["Context"](2, name="context", dtype="float64"),
                              keras.layers.Dense(5, activation="tanh", dtype="float64"),
                              keras.layers.Dense(1, dtype="float64")], name="net")
    learner = metalearn.Learner(model, **doc["cavia"](steps=2, learning_rate=0.5),
                                loss=keras.losses.MeanSquaredError(dtype="float64"))
    meta_paths = [v.path for v in learner.meta_variables]
    assert "net/context/context" not in meta_paths and len(meta_paths) == 4
    episodes = metalearn.tasks.Sinusoid(shots=4, queries=3, dtype="float64").sample(
        tf.constant([3, 0], tf.int64), num_tasks=2)
    weights = {p: w for p, w in learner.initial_weights().items() if p in meta_paths}
    context = {"net/context/context": tf.constant([0.3, -0.2], tf.float64)}  # reset: no effect

    def meta_loss(meta_weights):
        return learner.meta_loss(episodes, weights={**meta_weights, **context},
                                 formulation=Unrolled())

    with tf.GradientTape() as tape:
        tape.watch(weights)
        loss = meta_loss(weights)
    exact = {k: g.numpy() for k, g in tape.gradient(loss, weights).items()}
    assert relative_error(exact, finite_difference_gradient(meta_loss, weights)) < 1e-6
    # the inner loop moves the context (from zero) and nothing else
    task = episodes.task(0)
    adapted = learner.adapt(task.support_x, task.support_y,
                            weights={**learner.initial_weights(), **context}).weights
    assert np.abs(adapted["net/context/context"].numpy()).max() > 0
    assert not np.allclose(adapted["net/context/context"].numpy(), [0.3, -0.2])
    for path in meta_paths:
        np.testing.assert_array_equal(adapted[path].numpy(), weights[path].numpy())
    # and adapting lowers the support loss on average
    before = learner.support_loss({**learner.initial_weights(),
                                   "net/context/context": tf.zeros(2, tf.float64)},
                                  task.support_x, task.support_y)
    after = learner.support_loss(adapted, task.support_x, task.support_y)
    assert float(after) < float(before)
