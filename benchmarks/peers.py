r"""The meta-step of benchmarks/meta_step.py written in PyTorch and JAX: one JSON line per
configuration, the same fields, each configuration in a fresh process.

    # the peers live in their own virtual environment (benchmarks/README.md, "Peers")
    python -m benchmarks.peers --python=/work/peers_venv/bin/python \
        --framework=pytorch,jax,jax_vmap --meta_batch=8 --inner_steps=1 --order=second
    /work/peers_venv/bin/python -m benchmarks.peers --check   # the gradients agree

Workload (as meta_step's): the MAML paper's Omniglot net, the architecture of
``metalearn.models.omniglot_conv_net`` (4 x [3x3 conv, 64 filters, stride 2, TensorFlow's
"same" padding, with bias; BatchNorm on the batch's statistics, epsilon 1e-3 as Keras';
ReLU], global mean-pool, linear 64 -> 5), 28x28x1 random images, 5-way 1-shot with 15
queries per class, inner SGD with learning rate 0.4 on every weight for ``S`` steps,
second order (or first), the mean query loss over the meta-batch, outer Adam(1e-3),
float32. The initial weights (Glorot-uniform kernels, zero biases) and images are drawn
with NumPy, the same for every peer.

The peers, each written from its framework's public API:

- ``pytorch``: the loop of the PyTorch meta-learning libraries. Per task, the inner steps
  on functional weights (``torch.func.functional_call`` on an ``nn.Module``, gradients by
  ``torch.autograd.grad(..., create_graph=True)`` for second order), the query loss,
  ``(loss / B).backward()`` right away (the task's graph is freed before the next task),
  then one ``optimizer.step()`` (``torch.optim.Adam``) per meta-batch. BatchNorm is
  ``nn.BatchNorm2d(track_running_stats=False)``: batch statistics in the support and the
  query passes, as metalearn's training mode. Eager, NCHW; the asymmetric "same" padding
  of a stride-2 conv (0 before, 1 after) is an explicit ``F.pad``.
- ``jax``: ``jax.jit(jax.value_and_grad(task_loss))`` of one task (second order through
  the inner ``jax.grad``), the tasks' gradients summed in a Python loop (a jitted tree
  add per task), then a jitted Adam update (optax's ``adam`` when optax is installed, else
  the same update written here: ``adam`` in the result says which).
  ``jax.lax.conv_general_dilated`` (NHWC/HWIO, "SAME"), BatchNorm by hand.
- ``jax_vmap``: one ``jax.jit`` of the whole step: the mean over a ``jax.vmap``'d task
  loss, its gradient and the Adam update.

Every step ends when its loss is on the host and its update is done (PyTorch on a CPU is
synchronous; JAX waits with ``block_until_ready`` on the new weights). The fields are
meta_step's: ``compile_s`` (first call minus the median step; tracing and XLA for JAX,
next to nothing for eager PyTorch), ``ms_min/median/max`` of ``--steps`` timed steps
after ``--warmup``, ``cpu_ms_median`` (user + system time of every thread),
``peak_rss_mib`` (``ru_maxrss`` at the end, as meta_step's), ``step_rss_mib`` (that peak
minus the resident memory right before the first step), ``import_rss_mib`` (the
framework imported), ``before_step_rss_mib`` (plus the model, optimizer state and data),
``first_call_peak_mib``, ``after_first_call_rss_mib``, ``steady_peak_mib`` (``VmHWM`` of
the later steps alone, reset after the first call). ``threads`` is PyTorch's intra-op and
inter-op pool sizes (``--threads`` sets the first; 0 leaves each framework's default,
one per core); JAX's thread pool is XLA's and cannot be sized here.

This module imports neither framework at the top: the parent process (any Python) runs
each configuration with ``--python``'s interpreter, and a framework missing there comes
back as the configuration with an ``error``. ``--check`` (run with the peers'
interpreter) compares the meta-gradients of PyTorch, JAX (both forms) and metalearn on one
small float64 configuration; metalearn's side runs under ``--metalearn_python`` (the
TensorFlow environment) on the same weights and images passed through an ``.npz``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

import numpy as np

from benchmarks import rss_mib, time_steps

WAYS, SHOTS, QUERIES, SIZE, CHANNELS = 5, 1, 15, 28, 1
FILTERS, BLOCKS, KERNEL, STRIDE = 64, 4, 3, 2
INNER_LEARNING_RATE, OUTER_LEARNING_RATE = 0.4, 1e-3
BN_EPSILON = 1e-3  # keras.layers.BatchNormalization's default, which conv_net keeps
FRAMEWORKS = ("pytorch", "jax", "jax_vmap")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- what every peer shares: weights, images, the net's shape ------------------------

def weight_names(blocks: int = BLOCKS) -> List[str]:
    """The weights in metalearn's order and naming (Keras paths without the model's
    name): ``conv{i}/kernel`` (HWIO), ``conv{i}/bias``, ``bn{i}/gamma``, ``bn{i}/beta``,
    ``head/kernel`` (in, out), ``head/bias``."""
    names = []
    for i in range(blocks):
        names += [f"conv{i}/kernel", f"conv{i}/bias", f"bn{i}/gamma", f"bn{i}/beta"]
    return names + ["head/kernel", "head/bias"]


def initial_weights(filters: int = FILTERS, blocks: int = BLOCKS, seed: int = 0,
                    dtype=np.float32, perturb: bool = False) -> Dict[str, np.ndarray]:
    """Glorot-uniform kernels (Keras' default), zero biases, unit scales; ``perturb``
    draws biases, scales and offsets at random too (so the check exercises them)."""
    rng = np.random.default_rng(seed)
    glorot = lambda shape, fan_in, fan_out: rng.uniform(
        -1, 1, shape) * np.sqrt(6.0 / (fan_in + fan_out))
    weights, channels = {}, CHANNELS
    for i in range(blocks):
        area = KERNEL * KERNEL
        weights[f"conv{i}/kernel"] = glorot((KERNEL, KERNEL, channels, filters),
                                            area * channels, area * filters)
        weights[f"conv{i}/bias"] = np.zeros(filters)
        weights[f"bn{i}/gamma"] = np.ones(filters)
        weights[f"bn{i}/beta"] = np.zeros(filters)
        channels = filters
    weights["head/kernel"] = glorot((filters, WAYS), filters, WAYS)
    weights["head/bias"] = np.zeros(WAYS)
    if perturb:
        for name in weights:
            if not name.endswith("kernel"):
                weights[name] = weights[name] + 0.2 * rng.standard_normal(weights[name].shape)
    return {k: np.asarray(v, dtype) for k, v in weights.items()}


def episodes(tasks: int, seed: int = 0, dtype=np.float32) -> Dict[str, np.ndarray]:
    """Random images and 5-way labels as meta_step's ``_episodes`` draws them: NHWC
    ``[tasks, examples, 28, 28, 1]``, labels ``[tasks, examples]`` (int64)."""
    rng = np.random.default_rng(seed)
    labels = lambda n: np.tile(np.repeat(np.arange(WAYS), n), (tasks, 1)).astype(np.int64)
    images = lambda n: rng.random((tasks, WAYS * n, SIZE, SIZE, CHANNELS)).astype(dtype)
    support_x = images(SHOTS)
    query_x = images(QUERIES)
    return dict(support_x=support_x, support_y=labels(SHOTS), query_x=query_x,
                query_y=labels(QUERIES))


def same_padding(size: int, blocks: int = BLOCKS):
    """TensorFlow's "same" padding of each stride-2 3x3 conv, ``(before, after)`` per
    block, for a ``size`` x ``size`` input: 28 -> 14 -> 7 -> 4 -> 2 gives (0, 1), (0, 1),
    (1, 1), (0, 1)."""
    pads = []
    for _ in range(blocks):
        out = -(-size // STRIDE)
        total = max((out - 1) * STRIDE + KERNEL - size, 0)
        pads.append((total // 2, total - total // 2))
        size = out
    return pads


# --- PyTorch -----------------------------------------------------------------------

def torch_net(filters: int, blocks: int, dtype):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class OmniglotConvNet(nn.Module):
        def __init__(self):
            super().__init__()
            pads = same_padding(SIZE, blocks)
            self.pads = [None if a == b else (a, b, a, b) for a, b in pads]
            self.convs = nn.ModuleList(
                nn.Conv2d(CHANNELS if i == 0 else filters, filters, KERNEL, STRIDE,
                          padding=pads[i][0] if pads[i][0] == pads[i][1] else 0)
                for i in range(blocks))
            self.bns = nn.ModuleList(
                nn.BatchNorm2d(filters, eps=BN_EPSILON, track_running_stats=False)
                for _ in range(blocks))
            self.head = nn.Linear(filters, WAYS)

        def forward(self, x):  # NCHW
            for pad, conv, bn in zip(self.pads, self.convs, self.bns):
                if pad is not None:
                    x = F.pad(x, pad)  # (left, right, top, bottom)
                x = F.relu(bn(conv(x)))
            return self.head(x.mean(dim=(2, 3)))

    return OmniglotConvNet().to(dtype)


def _torch_name(name: str) -> str:
    layer, what = name.split("/")
    if layer == "head":
        return {"kernel": "head.weight", "bias": "head.bias"}[what]
    i = layer[-1]
    return {"kernel": f"convs.{i}.weight", "bias": f"convs.{i}.bias",
            "gamma": f"bns.{i}.weight", "beta": f"bns.{i}.bias"}[what]


def _to_torch_layout(name: str, value: np.ndarray) -> np.ndarray:
    if name.startswith("conv") and name.endswith("kernel"):
        return value.transpose(3, 2, 0, 1)  # HWIO -> OIHW
    if name == "head/kernel":
        return value.T  # (in, out) -> (out, in)
    return value


def _from_torch_layout(name: str, value: np.ndarray) -> np.ndarray:
    if name.startswith("conv") and name.endswith("kernel"):
        return value.transpose(2, 3, 1, 0)  # OIHW -> HWIO
    if name == "head/kernel":
        return value.T
    return value


class TorchPeer:
    """The plain PyTorch MAML loop (see the module's docstring)."""

    def __init__(self, weights: Dict[str, np.ndarray], inner_steps: int, order: str):
        import torch
        self.torch = torch
        dtype = torch.float64 if next(iter(weights.values())).dtype == np.float64 \
            else torch.float32
        blocks = sum(1 for n in weights if n.endswith("gamma"))
        filters = weights["bn0/gamma"].shape[0]
        self.net = torch_net(filters, blocks, dtype)
        self.net.train()  # batch statistics in every pass
        with torch.no_grad():
            parameters = dict(self.net.named_parameters())
            for name, value in weights.items():
                parameters[_torch_name(name)].copy_(
                    torch.from_numpy(np.ascontiguousarray(_to_torch_layout(name, value))))
        self.names = list(weights)
        self.params = dict(self.net.named_parameters())
        self.inner_steps, self.second_order = inner_steps, order == "second"
        self.optimizer = torch.optim.Adam(self.params.values(), lr=OUTER_LEARNING_RATE)

    def batch(self, data: Dict[str, np.ndarray]):
        """The episodes as tensors: images NCHW, labels int64."""
        torch = self.torch
        nchw = lambda x: torch.from_numpy(np.ascontiguousarray(x.transpose(0, 1, 4, 2, 3)))
        return (nchw(data["support_x"]), torch.from_numpy(data["support_y"]),
                nchw(data["query_x"]), torch.from_numpy(data["query_y"]))

    def _loss(self, weights, x, y):
        import torch.nn.functional as F
        return F.cross_entropy(self.torch.func.functional_call(self.net, weights, (x,)), y)

    def accumulate_gradients(self, batch) -> float:
        """Each task's meta-gradient / B added into ``.grad``; returns the mean query loss."""
        support_x, support_y, query_x, query_y = batch
        tasks, total = support_x.shape[0], 0.0
        for t in range(tasks):
            fast = self.params
            for _ in range(self.inner_steps):
                loss = self._loss(fast, support_x[t], support_y[t])
                grads = self.torch.autograd.grad(loss, list(fast.values()),
                                                 create_graph=self.second_order)
                fast = {name: w - INNER_LEARNING_RATE * g
                        for (name, w), g in zip(fast.items(), grads)}
            query_loss = self._loss(fast, query_x[t], query_y[t])
            (query_loss / tasks).backward()  # frees this task's graph
            total += query_loss.item()
        return total / tasks

    def step(self, batch) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.accumulate_gradients(batch)
        self.optimizer.step()
        return loss

    def meta_gradients(self, batch) -> Dict[str, np.ndarray]:
        """The mean meta-gradient over the batch's tasks, in metalearn's names and layouts."""
        self.optimizer.zero_grad(set_to_none=True)
        self.accumulate_gradients(batch)
        return {name: _from_torch_layout(name, self.params[_torch_name(name)].grad.numpy())
                for name in self.names}


# --- JAX ---------------------------------------------------------------------------

def _hand_adam(jnp, learning_rate, b1=0.9, b2=0.999, eps=1e-8):
    """Adam (Kingma & Ba) as optax's ``adam``: ``(init, update)`` on pytrees."""
    import jax

    def init(params):
        zeros = jax.tree.map(jnp.zeros_like, params)
        return (jnp.zeros([], jnp.int32), zeros, zeros)

    def update(grads, state, params=None):
        count, mu, nu = state
        count = count + 1
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, nu, grads)
        c1, c2 = 1 - b1 ** count, 1 - b2 ** count
        updates = jax.tree.map(
            lambda m, v: -learning_rate * (m / c1) / (jnp.sqrt(v / c2) + eps), mu, nu)
        return updates, (count, mu, nu)

    return init, update


class JaxPeer:
    """JAX: a jitted per-task meta-gradient summed in a Python loop (``vmap=False``), or
    one jit of the vmapped batch (``vmap=True``); see the module's docstring."""

    def __init__(self, weights: Dict[str, np.ndarray], inner_steps: int, order: str,
                 vmap: bool = False):
        import jax
        import jax.numpy as jnp
        if next(iter(weights.values())).dtype == np.float64:
            jax.config.update("jax_enable_x64", True)
        self.jax, self.jnp, self.vmap = jax, jnp, vmap
        self.names = list(weights)
        self.params = {k: jnp.asarray(v) for k, v in weights.items()}
        blocks = sum(1 for n in weights if n.endswith("gamma"))
        second_order = order == "second"
        try:
            import optax
            init, update = optax.adam(OUTER_LEARNING_RATE)
            self.adam = f"optax {optax.__version__}"
        except ImportError:
            init, update = _hand_adam(jnp, OUTER_LEARNING_RATE)
            self.adam = "by hand (benchmarks/peers.py)"
        self.opt_state = init(self.params)

        def forward(params, x):  # NHWC
            for i in range(blocks):
                x = jax.lax.conv_general_dilated(
                    x, params[f"conv{i}/kernel"], (STRIDE, STRIDE), "SAME",
                    dimension_numbers=("NHWC", "HWIO", "NHWC")) + params[f"conv{i}/bias"]
                mean = jnp.mean(x, axis=(0, 1, 2))
                variance = jnp.mean(jnp.square(x - mean), axis=(0, 1, 2))
                x = (x - mean) * jax.lax.rsqrt(variance + BN_EPSILON)
                x = jax.nn.relu(x * params[f"bn{i}/gamma"] + params[f"bn{i}/beta"])
            return jnp.mean(x, axis=(1, 2)) @ params["head/kernel"] + params["head/bias"]

        def loss(params, x, y):
            logits = jax.nn.log_softmax(forward(params, x))
            return -jnp.mean(jnp.take_along_axis(logits, y[:, None], axis=1))

        def task_loss(params, support_x, support_y, query_x, query_y):
            fast = params
            for _ in range(inner_steps):
                grads = jax.grad(loss)(fast, support_x, support_y)
                if not second_order:
                    grads = jax.lax.stop_gradient(grads)
                fast = jax.tree.map(lambda w, g: w - INNER_LEARNING_RATE * g, fast, grads)
            return loss(fast, query_x, query_y)

        def apply(params, opt_state, grads, tasks):
            grads = jax.tree.map(lambda g: g / tasks, grads)
            updates, opt_state = update(grads, opt_state, params)
            return jax.tree.map(jnp.add, params, updates), opt_state

        if vmap:
            def batch_loss(params, support_x, support_y, query_x, query_y):
                return jnp.mean(jax.vmap(task_loss, in_axes=(None, 0, 0, 0, 0))(
                    params, support_x, support_y, query_x, query_y))
            self._batch_grad = jax.jit(jax.value_and_grad(batch_loss))

            def whole_step(params, opt_state, support_x, support_y, query_x, query_y):
                loss_, grads = jax.value_and_grad(batch_loss)(
                    params, support_x, support_y, query_x, query_y)
                params, opt_state = apply(params, opt_state, grads, 1)  # already a mean
                return params, opt_state, loss_
            self._whole_step = jax.jit(whole_step)
        else:
            self._task_grad = jax.jit(jax.value_and_grad(task_loss))
            self._add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
            self._apply = jax.jit(apply, static_argnums=3)

    def batch(self, data: Dict[str, np.ndarray]):
        """The episodes on the device: whole arrays for vmap, one tuple per task else."""
        jnp = self.jnp
        labels = lambda y: y.astype(np.int32)
        arrays = (data["support_x"], labels(data["support_y"]), data["query_x"],
                  labels(data["query_y"]))
        if self.vmap:
            return tuple(jnp.asarray(a) for a in arrays)
        return [tuple(jnp.asarray(a[t]) for a in arrays) for t in range(len(arrays[0]))]

    def _summed(self, batch):
        total = None
        for task in batch:  # a Python loop over the tasks
            value = self._task_grad(self.params, *task)
            total = value if total is None else self._add(total, value)
        return total

    def step(self, batch) -> float:
        if self.vmap:
            self.params, self.opt_state, loss = self._whole_step(
                self.params, self.opt_state, *batch)
            tasks = 1
        else:
            loss, grads = self._summed(batch)
            self.params, self.opt_state = self._apply(self.params, self.opt_state, grads,
                                                      len(batch))
            tasks = len(batch)
        self.jax.block_until_ready(self.params)
        return float(loss) / tasks

    def meta_gradients(self, batch) -> Dict[str, np.ndarray]:
        if self.vmap:
            grads = self._batch_grad(self.params, *batch)[1]
            tasks = 1
        else:
            grads = self._summed(batch)[1]
            tasks = len(batch)
        return {name: np.asarray(grads[name]) / tasks for name in self.names}


# --- one configuration in this process ---------------------------------------------

def _import(framework: str):
    """Imports the framework (and reports its versions), or raises ImportError."""
    if framework == "pytorch":
        import torch
        import torch.func  # noqa: F401
        return {"torch": torch.__version__, "numpy": np.__version__}
    import jax
    import jax.numpy  # noqa: F401
    import jaxlib
    versions = {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
                "numpy": np.__version__}
    try:
        import optax
        versions["optax"] = optax.__version__
    except ImportError:
        pass
    return versions


def run_one(config: dict, steps: int, warmup: int) -> dict:
    """Times one configuration (a dict as :func:`configs` gives) in this process."""
    framework = config["framework"]
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    threads = int(config.get("threads", 0))
    if threads and framework != "pytorch":
        raise ValueError(f"--threads is for pytorch only ({framework}: XLA's pool)")
    versions = _import(framework)
    imported = rss_mib()
    if framework == "pytorch":
        import torch
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(0)
        peer = TorchPeer(initial_weights(), config["inner_steps"], config["order"])
        thread_sizes = [torch.get_num_threads(), torch.get_num_interop_threads()]
    else:
        peer = JaxPeer(initial_weights(), config["inner_steps"], config["order"],
                       vmap=framework == "jax_vmap")
        thread_sizes = "xla default"
    batches = [peer.batch(episodes(config["meta_batch"], seed)) for seed in range(2)]
    result = dict(config)
    result.update(time_steps(peer.step, batches, steps, warmup, config["meta_batch"],
                             imported))
    result.update(threads=thread_sizes, device="cpu", versions=versions,
                  python=sys.executable)
    if framework != "pytorch":
        result["adam"] = peer.adam
    else:
        result["adam"] = "torch.optim.Adam"
    return result


def configs(frameworks, meta_batches, inner_steps, orders, threads=0):
    for framework, batch, steps, order in itertools.product(
            frameworks, meta_batches, inner_steps, orders):
        yield dict(framework=framework, meta_batch=int(batch), inner_steps=int(steps),
                   order=order, threads=int(threads))


def measure(config: dict, steps: int, warmup: int, timeout: float,
            python: Optional[str] = None) -> dict:
    """Runs one configuration in a fresh process of ``python`` (default: this one) and
    returns its JSON result, or the configuration with ``error`` (the child's error line,
    its last line of stderr, or the timeout)."""
    python = python or sys.executable
    child = [python, "-m", "benchmarks.peers", "--child", json.dumps(config),
             f"--steps={steps}", f"--warmup={warmup}"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    try:
        out = subprocess.run(child, capture_output=True, text=True, timeout=timeout,
                             env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return dict(config, error=f"timed out after {timeout} s")
    except OSError as error:  # no such interpreter
        return dict(config, error=f"cannot run {python}: {error}")
    for prefix in ("RESULT ", "ERROR "):
        lines = [l for l in out.stdout.splitlines() if l.startswith(prefix)]
        if lines:
            text = lines[-1][len(prefix):]
            return json.loads(text) if prefix == "RESULT " else dict(config, error=text)
    return dict(config, error=(out.stderr.strip().splitlines() or ["?"])[-1])


def _child(config: dict, steps: int, warmup: int) -> int:
    try:
        result = run_one(config, steps, warmup)
    except ImportError as error:
        print(f"ERROR {config['framework']} is not installed for {sys.executable} "
              f"({error}): run with --python=<the peers' interpreter> "
              "(benchmarks/README.md, 'Peers')", flush=True)
        return 2
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# --- the check: the meta-gradients agree -------------------------------------------

CHECK = dict(meta_batch=2, inner_steps=2, filters=4, blocks=BLOCKS)


def metalearn_gradients(inputs: str, outputs: str) -> None:
    """Under the TensorFlow environment: metalearn's meta-gradient
    (``MetaGradient().directions``, the mean over tasks) of the weights and
    episodes in ``inputs`` (an .npz of :func:`check`), for each order and for the
    formulation 'unrolled' (and 'accumulate', 'map_fn', the benchmarked ones:
    ``metalearn.execution.formulation(name)``),
    written to ``outputs`` as ``{order}/{batching}/{weight name}``."""
    import keras
    import tensorflow as tf
    import metalearn
    from metalearn import execution
    from metalearn.tasks import Episode
    data = dict(np.load(inputs))
    filters, blocks, inner_steps = (int(data[k]) for k in ("filters", "blocks",
                                                             "inner_steps"))
    episode = Episode(*(tf.constant(data[k] if k.endswith("x") else
                                    data[k].astype(np.int32))
                        for k in ("support_x", "support_y", "query_x", "query_y")))
    results = {}
    for order, batching in itertools.product(("second", "first"),
                                             ("unrolled", "accumulate", "map_fn")):
        model = metalearn.models.conv_net((SIZE, SIZE, CHANNELS), WAYS, filters=filters,
                                          blocks=blocks, kernel_size=KERNEL,
                                          downsample="stride", batch_norm=True,
                                          pool="mean", dtype="float64")
        for variable in model.trainable_variables:
            variable.assign(data["w/" + variable.path.split("/", 1)[1]])
        learner = metalearn.Learner(
            model, metalearn.adapters.GradientDescent(
                steps=inner_steps, learning_rate=INNER_LEARNING_RATE,
                first_order=order == "first"),
            # dtype: a Keras loss computes in floatx (float32) unless told otherwise
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                            dtype="float64"))
        gradients, _ = metalearn.MetaGradient().directions(
            learner, episode, execution.formulation(batching))
        for variable, gradient in zip(learner.meta_variables, gradients):
            results[f"{order}/{batching}/" + variable.path.split("/", 1)[1]] = \
                np.asarray(gradient)
    np.savez(outputs, **results)


def _difference(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]):
    """Largest absolute difference over all weights, and the largest gradient entry."""
    assert set(a) == set(b), (sorted(a), sorted(b))
    diff = max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
    scale = max(float(np.max(np.abs(a[k]))) for k in a)
    return diff, scale


def check(metalearn_python: Optional[str], tolerance: float = 1e-8) -> int:
    """PyTorch, JAX (loop and vmap) and metalearn agree on one float64 meta-gradient."""
    weights = initial_weights(CHECK["filters"], CHECK["blocks"], seed=1,
                              dtype=np.float64, perturb=True)
    data = episodes(CHECK["meta_batch"], seed=2, dtype=np.float64)
    print(f"check: float64, B={CHECK['meta_batch']}, S={CHECK['inner_steps']}, "
          f"{CHECK['filters']} filters, {CHECK['blocks']} blocks, 28x28x1, 5-way 1-shot, "
          f"15 queries; tolerance {tolerance:g} on max |difference| / max(1, max |grad|)")
    failures = 0

    def report(what, a, b):
        nonlocal failures
        diff, scale = _difference(a, b)
        ok = diff <= tolerance * max(1.0, scale)
        failures += not ok
        print(f"  {what}: max |diff| {diff:.3e} (max |grad| {scale:.3e}) "
              f"{'ok' if ok else 'FAIL'}", flush=True)

    grads = {}
    for order in ("second", "first"):
        torch_peer = TorchPeer(weights, CHECK["inner_steps"], order)
        grads[order] = torch_peer.meta_gradients(torch_peer.batch(data))
        for vmap in (False, True):
            jax_peer = JaxPeer(weights, CHECK["inner_steps"], order, vmap=vmap)
            report(f"{order} order: pytorch vs {'jax_vmap' if vmap else 'jax'}",
                   grads[order], jax_peer.meta_gradients(jax_peer.batch(data)))
    apart, scale = _difference(grads["second"], grads["first"])
    differ = apart > 1e3 * tolerance * max(1.0, scale)
    failures += not differ
    print(f"  pytorch: second vs first order differ by {apart:.3e} (they must: "
          f"{'ok' if differ else 'FAIL, the second-order terms are missing'})")

    if metalearn_python:
        with tempfile.TemporaryDirectory() as folder:
            inputs, outputs = (os.path.join(folder, n) for n in ("in.npz", "out.npz"))
            np.savez(inputs, **{"w/" + k: v for k, v in weights.items()}, **data,
                     **{k: np.asarray(v) for k, v in CHECK.items()})
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
            out = subprocess.run([metalearn_python, "-m", "benchmarks.peers",
                                  "--metalearn_gradients", inputs, outputs],
                                 capture_output=True, text=True, env=env, cwd=ROOT)
            if out.returncode or not os.path.exists(outputs):
                print(f"  metalearn ({metalearn_python}) failed: "
                      f"{(out.stderr.strip().splitlines() or ['?'])[-1]}")
                return 1
            theirs = dict(np.load(outputs))
        for order in ("second", "first"):
            for batching in ("unrolled", "accumulate", "map_fn"):
                prefix = f"{order}/{batching}/"
                report(f"{order} order: pytorch vs metalearn ({batching})", grads[order],
                       {k[len(prefix):]: v for k, v in theirs.items()
                        if k.startswith(prefix)})
    else:
        print("  metalearn: skipped (no --metalearn_python)")
    print("check: " + ("all agree" if failures == 0 else f"{failures} FAILED"))
    return 1 if failures else 0


# --- the command line --------------------------------------------------------------

def _list(text: str) -> List[str]:
    return [t for t in text.split(",") if t]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.peers",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--framework", type=_list, default=list(FRAMEWORKS),
                   help="pytorch, jax, jax_vmap (comma-separated)")
    p.add_argument("--meta_batch", type=_list, default=["8", "32"])
    p.add_argument("--inner_steps", type=_list, default=["1", "5"])
    p.add_argument("--order", type=_list, default=["second", "first"])
    p.add_argument("--steps", type=int, default=10, help="timed meta-steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (pytorch only; 0: the default)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    p.add_argument("--python", default=sys.executable,
                   help="the interpreter that has the peers (default: this one)")
    p.add_argument("--output", default="", help="also append the JSON lines here")
    p.add_argument("--check", action="store_true",
                   help="compare the meta-gradients of the peers and metalearn")
    p.add_argument("--metalearn_python",
                   default=getattr(sys, "_base_executable", None) or "python",
                   help="--check: the interpreter with TensorFlow and metalearn "
                        "('' to skip; default: the one this virtual environment was "
                        "made from)")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--metalearn_gradients", nargs=2, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.child:
        return _child(json.loads(args.child), args.steps, args.warmup)
    if args.metalearn_gradients:
        metalearn_gradients(*args.metalearn_gradients)
        return 0
    if args.check:
        return check(args.metalearn_python or None)
    for config in configs(args.framework, args.meta_batch, args.inner_steps, args.order,
                          args.threads):
        line = json.dumps(measure(config, args.steps, args.warmup, args.timeout,
                                  args.python))
        print(line, flush=True)
        if args.output:
            with open(args.output, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
