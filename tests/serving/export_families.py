"""Tiny learners of every family the library trains, for the export tests
(tests/serving/families_test.py): each entry builds a learner (Keras seeded) and says
the kind of tasks it serves."""

import keras

import metalearn
from metalearn import heads, models
from metalearn.adapters import (AnnealOrder, AttentiveNeuralProcess,
                                ConditionalNeuralProcess, GradientDescent, GradientStep,
                                Hypernetwork, ImplicitGradientDescent, InContext, InnerAdam,
                                LatentNeuralProcess, LearnedRates, LearnedRule, Mask,
                                MetaSGD, MiniBatches, PerStepWeights, WhileLoop)
from metalearn.functional import gaussian_nll, predictive_mse, softmax_cross_entropy
from metalearn.testing import DIM, WAYS, synthetic_classification, synthetic_regression
from metalearn.tasks import Episode

SIZES = ((1, 2), (3, 1), (2, 5))
"""(shots, queries) per class of the classification tasks served; the regression
tasks have ``WAYS`` times as many examples."""


def mlp(ways=WAYS, hidden=(8,)):
    keras.utils.set_random_seed(0)
    return models.mlp((DIM,), hidden=hidden, outputs=ways, activation="relu")


def bn_mlp():
    """An MLP with BatchNorm (the library's exact batch moments in the inner loop)."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((DIM,)), keras.layers.Dense(8, name="hidden0"),
        keras.layers.BatchNormalization(name="bn0"), keras.layers.ReLU(name="relu0"),
        keras.layers.Dense(WAYS, name="head")], name="bn_mlp")


def classifier(adapter, model=None, learner_class=metalearn.Learner, **kwargs):
    return learner_class(mlp() if model is None else model, adapter=adapter,
                         loss=softmax_cross_entropy, **kwargs)


def hypernetwork(then=None, condition="support"):
    keras.utils.set_random_seed(1)
    inputs = WAYS * DIM if condition == "support" else DIM
    generator = keras.Sequential([keras.Input((inputs,)),
                                  keras.layers.Dense(8 * WAYS + WAYS, name="dense")],
                                 name="generator")
    return classifier(Hypernetwork(generator, generate=("head",), condition=condition,
                                   mode="residual" if then else "replace", then=then))


def embedding(head, **kwargs):
    return metalearn.EmbeddingLearner(mlp(ways=5), head=head, ways=WAYS, **kwargs)


def neural_process(kind):
    keras.utils.set_random_seed(0)
    net = lambda inputs, outputs, name: models.mlp(  # noqa: E731
        (inputs,), hidden=(8,), outputs=outputs, activation="tanh", name=name)
    if kind == "latent":
        adapter = LatentNeuralProcess(net(DIM + 1, 4, "encoder"), net(DIM + 1, 4, "latent"))
        return metalearn.learners.LatentNeuralProcessLearner(
            net(DIM + 4 + 2, 2, "decoder"), adapter, loss=gaussian_nll,
            metrics={"mse": predictive_mse})
    adapter = (ConditionalNeuralProcess if kind == "conditional" else
               AttentiveNeuralProcess)(net(DIM + 1, 4, "encoder"), **(
                   {} if kind == "conditional" else {"heads": 2}))
    return metalearn.Learner(net(DIM + 4, 2, "decoder"), adapter, loss=gaussian_nll)


def in_context(**kwargs):
    keras.utils.set_random_seed(0)
    embedding_net = models.mlp((DIM,), hidden=(8,), outputs=5, activation="relu")
    if "targets" in kwargs:
        return metalearn.Learner(embedding_net, InContext(width=8, depth=1, heads=2,
                                                          **kwargs), loss=gaussian_nll)
    return metalearn.Learner(embedding_net, InContext(ways=WAYS, width=8, depth=1,
                                                      heads=2, **kwargs),
                             loss=softmax_cross_entropy)


FAMILIES = {
    # gradient-based: the inner loop of every update transform and wrapper, traced
    "maml": (lambda: classifier(GradientDescent(2, 0.3)), "classification"),
    "meta_sgd": (lambda: classifier(MetaSGD(2, 0.3)), "classification"),
    "anil": (lambda: classifier(GradientDescent(2, update=[Mask(("head",)),
                                                           GradientStep(0.3)])),
             "classification"),
    "maml_plus_plus": (lambda: classifier(
        GradientDescent(2, update=[AnnealOrder(2), LearnedRates("layer_step", initial=0.3)],
                        wrappers=[PerStepWeights(("bn0",))]), bn_mlp(),
        metalearn.MultiStepLossLearner, anneal_steps=10), "classification"),
    "inner_adam_while_loop": (lambda: classifier(GradientDescent(
        3, update=InnerAdam(0.05), wrappers=[WhileLoop()])), "classification"),
    "mini_batches": (lambda: classifier(GradientDescent(2, 0.3, wrappers=[MiniBatches(2)])),
                     "classification"),
    "imaml": (lambda: classifier(ImplicitGradientDescent(3, 0.1, regularization=2.0,
                                                         cg_steps=2)), "classification"),
    "learned_optimizer": (lambda: classifier(GradientDescent(2, update=LearnedRule(
        0.1, hidden=(4,)))), "classification"),
    "hypermaml": (lambda: hypernetwork(GradientDescent(1, 0.3)), "classification"),
    "hypernetwork_input": (lambda: hypernetwork(condition="input"), "classification"),
    "proto_maml": (lambda: metalearn.ProtoMAML(mlp(), GradientDescent(1, 0.3), ways=WAYS),
                   "classification"),
    # closed-form heads on an embedding
    "protonets": (lambda: metalearn.PrototypicalNetworks(mlp(ways=5), ways=WAYS),
                  "classification"),
    "ridge": (lambda: embedding(heads.RidgeHead()), "classification"),
    "logistic": (lambda: embedding(heads.LogisticHead(steps=3)), "classification"),
    "logistic_regression": (lambda: embedding(heads.LogisticRegressionHead(iterations=3)),
                            "classification"),
    "svm": (lambda: embedding(heads.SVMHead(steps=5)), "classification"),
    "linear_probe": (lambda: embedding(heads.LinearProbeHead(steps=3)), "classification"),
    "head_after_inner_loop": (lambda: embedding(heads.RidgeHead(),
                                                adapter=GradientDescent(1, 0.1)),
                              "classification"),
    # neural processes, in context
    "conditional_np": (lambda: neural_process("conditional"), "regression"),
    "attentive_np": (lambda: neural_process("attentive"), "regression"),
    "latent_np": (lambda: neural_process("latent"), "regression"),
    "in_context": (lambda: in_context(), "classification"),
    "in_context_head": (lambda: in_context(head=heads.PrototypeHead()), "classification"),
    "in_context_gaussian": (lambda: in_context(targets=1, output="gaussian"),
                            "regression"),
}
"""name -> (a function building the learner, the kind of its tasks)."""


def episodes(kind, sizes=SIZES):
    """One episode (no task axis) of ``kind`` at each ``(shots, queries)`` of ``sizes``."""
    found = []
    for i, (shots, queries) in enumerate(sizes):
        batch = synthetic_classification(i, 1, shots=shots, queries=queries) \
            if kind == "classification" else \
            synthetic_regression(i, 1, shots=shots * WAYS, queries=queries * WAYS)
        found.append(Episode(*[t[0] for t in batch]))
    return found


def table(names=None, calls=50) -> str:
    """A markdown table, per family: the export's size on disk, and the latency of one
    task's ``serving_default`` (and of ``predict`` from a cached ``adapt``) loaded in
    this process, the first task's size, median of ``calls`` calls."""
    import os
    import statistics
    import tempfile
    import time

    import tensorflow as tf

    from metalearn.serving import export_saved_model
    rows = ["| family | size (KiB) | serving_default (ms) | predict from adapt (ms) |",
            "| --- | --- | --- | --- |"]
    for name in names or sorted(FAMILIES):
        build, kind = FAMILIES[name]
        task = episodes(kind)[0]
        path = export_saved_model(build(), tempfile.mkdtemp() + "/m", example=task)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path)
                   for f in fs)
        signatures = tf.saved_model.load(path).signatures
        given = {k: getattr(task, k) for k in ("support_x", "support_y", "query_x")}

        def median_ms(fn):
            fn()
            times = []
            for _ in range(calls):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return f"{1000 * statistics.median(times):.2f}"

        serve = median_ms(lambda: signatures["serving_default"](**given))
        cached = "-"
        if "adapt" in signatures:
            solution = signatures["adapt"](support_x=task.support_x,
                                           support_y=task.support_y)
            cached = median_ms(lambda: signatures["predict"](query_x=task.query_x,
                                                             **solution))
        rows.append(f"| {name} | {size / 1024:.0f} | {serve} | {cached} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m tests.serving.export_families
    print(table())
