"""iMAML's inner solve is an ordinary GradientDescent built from the pieces, so it takes
pieces it could not before (a Mask, an inner optimizer); the meta-gradient is still the
one the implicit function theorem gives, checked on a linear model against the closed
form (the same kind of reference as tests/adapters/implicit_test.py, extended to a
mask)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import metalearn
from metalearn import execution
from metalearn import models
from metalearn.adapters import (GradientDescent, GradientStep, ImplicitGradientDescent,
                                InnerAdam, InnerMomentum, Learned, Mask, Proximal, WhileLoop)
from metalearn.testing import (LearnerContract, assert_meta_gradient_matches_finite_differences,
                               classification_learner, mse, regression_episodes)

LAMBDA = 0.7


def _closed_form(kernel, bias, episodes, masked):
    """The implicit meta-gradient d mean_i L_query(phi*_i) / d (kernel, bias) on a linear
    model with squared error, phi* the proximal optimum of the support loss over the
    adapted weights: all of them, or (``masked``) the kernel alone, the bias held at its
    value (its gradient then has the mixed term through d phi* / d bias)."""
    grads_k, grads_b = [], []
    for i in range(episodes.num_tasks):
        xs, ys = episodes.support_x[i].numpy(), episodes.support_y[i].numpy()
        xq, yq = episodes.query_x[i].numpy(), episodes.query_y[i].numpy()
        if masked:
            system = 2 * xs.T @ xs / len(xs) + LAMBDA * np.eye(len(kernel))
            phi = np.linalg.solve(system, LAMBDA * kernel + 2 * xs.T @ (ys - bias) / len(xs))
            residual = xq @ phi + bias - yq
            query_phi = 2 * xq.T @ residual / len(xq)
            dphi_dbias = np.linalg.solve(system, -2 * xs.T @ np.ones((len(xs), 1)) / len(xs))
            grads_k.append(LAMBDA * np.linalg.solve(system, query_phi))
            grads_b.append(2 * np.sum(residual) / len(xq) + (dphi_dbias.T @ query_phi)[0])
        else:
            aug = lambda x: np.concatenate([x, np.ones((len(x), 1))], axis=1)
            xs, xq = aug(xs), aug(xq)
            system = 2 * xs.T @ xs / len(xs) + LAMBDA * np.eye(len(kernel) + 1)
            theta = np.concatenate([kernel, bias[None]], axis=0)
            phi = np.linalg.solve(system, LAMBDA * theta + 2 * xs.T @ ys / len(xs))
            grad = LAMBDA * np.linalg.solve(system, 2 * xq.T @ (xq @ phi - yq) / len(xq))
            grads_k.append(grad[:-1])
            grads_b.append(grad[-1])
    return np.mean(grads_k, axis=0), np.mean(grads_b, axis=0)


def _meta_gradient(adapter, formulation="unrolled"):
    keras.utils.set_random_seed(5)
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    learner = metalearn.Learner(model, adapter, loss=mse)
    episodes = regression_episodes(tasks=3, shots=5)
    kernel, bias = learner.meta_variables

    @tf.function
    def meta_gradient():
        with tf.GradientTape() as tape:
            loss = learner.meta_loss(episodes,
                                     formulation=execution.formulation(formulation))
        return tape.gradient(loss, learner.meta_variables)

    grad_k, grad_b = meta_gradient()
    return (grad_k.numpy(), grad_b.numpy()), (kernel.numpy(), bias.numpy()), episodes


@pytest.mark.parametrize("update,masked", [
    (InnerMomentum(0.1, 0.5), False),                      # an inner optimizer
    ([Mask(("kernel",)), GradientStep(0.2)], True),        # ANIL-style: the bias fixed
    ([Mask(("kernel",)), InnerMomentum(0.1, 0.5)], True),  # both
], ids=["momentum", "mask", "mask_momentum"])
def test_meta_gradient_with_inner_pieces_equals_the_implicit_closed_form(update, masked):
    adapter = ImplicitGradientDescent(steps=300, regularization=LAMBDA, cg_steps=3,
                                      update=update)
    (grad_k, grad_b), (kernel, bias), episodes = _meta_gradient(adapter)
    expected_k, expected_b = _closed_form(kernel, bias, episodes, masked)
    np.testing.assert_allclose(grad_k, expected_k, rtol=1e-8)
    np.testing.assert_allclose(grad_b, expected_b, rtol=1e-8)


def test_inner_adam_reaches_the_same_meta_gradient():
    # Adam takes another path to (near) the same proximal optimum; the implicit
    # meta-gradient depends on the point reached alone.
    adapter = ImplicitGradientDescent(steps=600, regularization=LAMBDA, cg_steps=3,
                                      update=InnerAdam(0.02))
    (grad_k, grad_b), (kernel, bias), episodes = _meta_gradient(adapter)
    expected_k, expected_b = _closed_form(kernel, bias, episodes, masked=False)
    np.testing.assert_allclose(grad_k, expected_k, rtol=1e-4)
    np.testing.assert_allclose(grad_b, expected_b, rtol=1e-4)


def test_the_inner_solve_is_a_gradient_descent_of_pieces():
    adapter = ImplicitGradientDescent(steps=4, learning_rate=0.1, regularization=2.0,
                                      clip_norm=1.0)
    assert isinstance(adapter.inner, GradientDescent)
    kinds = [type(p).__name__ for p in adapter.inner.update.transforms]
    assert kinds == ["Proximal", "ClipByGlobalNorm", "GradientStep"]
    assert [type(w) for w in adapter.inner.wrappers] == [WhileLoop]
    assert adapter.learning_rate == 0.1 and adapter.regularization == 2.0
    adapter.regularization = 0.5
    assert adapter.proximal.regularization == 0.5
    with pytest.raises(ValueError, match="either learning_rate"):
        ImplicitGradientDescent(learning_rate=0.1, update=GradientStep(0.1))


def test_a_learned_inner_hyperparameter_is_refused():
    model = models.mlp((2,), hidden=(), outputs=1, dtype="float64")
    adapter = ImplicitGradientDescent(steps=2, update=GradientStep(Learned(0.1, "layer")))
    with pytest.raises(ValueError, match="inner solve cannot meta-learn"):
        metalearn.Learner(model, adapter, loss=mse)


def test_proximal_in_plain_gradient_descent_matches_finite_differences():
    # Outside iMAML the proximal term is an ordinary transform whose state (the starting
    # weights) is differentiated like every state.
    keras.utils.set_random_seed(0)
    model = models.mlp((2,), hidden=(3,), outputs=1, activation="tanh", dtype="float64")
    adapter = GradientDescent(2, update=[Proximal(0.5), GradientStep(0.3)])
    learner = metalearn.Learner(model, adapter, loss=mse)
    assert_meta_gradient_matches_finite_differences(learner,
                                                    regression_episodes(tasks=2, shots=4))


class TestImplicitMaskedAdam(LearnerContract):
    covers = (ImplicitGradientDescent, Proximal)

    def make_learner(self):
        return classification_learner(ImplicitGradientDescent(
            steps=3, regularization=1.0, cg_steps=2,
            update=[Mask(("head",)), InnerAdam(0.05)]))


def test_the_moved_names_still_import_from_their_old_places():
    import metalearn.pieces as pieces
    from metalearn.adapters import Capabilities, Piece, SplitLoss
    from metalearn.adapters.base import clamp_step, select_paths
    from metalearn.adapters.implicit_diff import ConjugateGradient, implicit_solution
    assert (Piece, Capabilities, SplitLoss) == (pieces.Piece, pieces.Capabilities,
                                                pieces.SplitLoss)
    assert (clamp_step, select_paths) == (pieces.clamp_step, pieces.select_paths)
    assert (ConjugateGradient, implicit_solution) == (pieces.ConjugateGradient,
                                                      pieces.implicit_solution)
