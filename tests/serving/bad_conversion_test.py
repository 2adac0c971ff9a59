"""Bad exports to LiteRT and ONNX: a gradient-based learner where the format cannot take
its inner loop's gradients, refused naming the learner and the format before anything is
traced (no example episode is even given: the check comes first, and nothing is
written), and a set size that is not a number of examples. Cases of docs/errors.md
(tests/bad_input.py)."""

import keras

import metalearn
from metalearn.serving import UnsupportedExport, export_litert, export_onnx
from tests.bad_input import Case, check, parametrize

TITLE = "Exports to LiteRT and ONNX"


def _maml() -> metalearn.Learner:
    keras.utils.set_random_seed(0)
    return metalearn.Learner(metalearn.models.mlp((1,), hidden=(4,), outputs=1),
                             adapter=metalearn.adapters.GradientDescent(), loss="mse")


def _protonets() -> metalearn.PrototypicalNetworks:
    return metalearn.PrototypicalNetworks(metalearn.models.mlp((2,), hidden=(), outputs=3),
                                          ways=3)


def _refused(export, learner, tmp_path, **kwargs) -> None:
    try:
        export(learner, str(tmp_path / "exported"), example=None, **kwargs)
    finally:
        assert not (tmp_path / "exported").exists()


CASES = [
    Case("ONNX of a gradient-based learner", "`export_onnx(maml)`, `python -m "
         "metalearn.export --format=onnx` of a MAML run", UnsupportedExport,
         "Learner (adapter GradientDescent) cannot be exported to 'onnx': its inner loop "
         "takes gradients", lambda p: _refused(export_onnx, _maml(), p), None,
         "the learner, its adapter, the format and the formats it can go to"),
    Case("LiteRT of a gradient-based learner without Select TF ops", "`export_litert(maml)`"
         ", `--format=litert` of a MAML run without `--select_tf_ops`", UnsupportedExport,
         "Learner (adapter GradientDescent) cannot be exported to 'litert' with builtin "
         "ops", lambda p: _refused(export_litert, _maml(), p), None,
         "the learner, its adapter, the format and `select_tf_ops` (Flex delegate needed)"),
    Case("LiteRT set size not a number of examples", "`export_litert(protonets, "
         "support_size=0)`", ValueError, "support_size must be a positive number of "
         "examples, got 0", lambda p: _refused(export_litert, _protonets(), p,
                                               support_size=0), None, "the argument"),
    Case("ONNX set size not a number of examples", "`export_onnx(protonets, "
         "query_size=2.5)`", ValueError, "query_size must be a positive number of "
         "examples, got 2.5", lambda p: _refused(export_onnx, _protonets(), p,
                                                 query_size=2.5), None, "the argument"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
