"""Bad bindings of the formulations and the runtime (``Experiment.formulation``,
``Auto``, ``Accumulate``, ``Runtime``). Cases of docs/errors.md (tests/bad_input.py)."""

from tests.bad_input import SINUSOID, check, gin_case, gin_only, parametrize

TITLE = "Formulations and the runtime"

CASES = [
    gin_case("unknown formulation", "Experiment.formulation = 'loop'", ValueError,
             "unknown formulation 'loop': one of ['accumulate', 'auto', 'batched', "
             "'map_fn', 'unrolled']"),
    gin_case("thread pools that are not two counts", "Runtime.threads = (2,)",
             ValueError, "Runtime.threads must be (intra_op, inter_op), two whole numbers"),
    gin_case("memory budget that is not a size", "Auto.memory_budget = '2 gigs'",
             ValueError, "memory_budget must be bytes or a size like '2GiB'",
             base=SINUSOID + ["Experiment.formulation = @Auto()"]),
    gin_case("no task in flight", "Accumulate.parallel_iterations = 0", ValueError,
             "Accumulate.parallel_iterations must be a whole number >= 1, got 0",
             base=SINUSOID + ["Experiment.formulation = @Accumulate()"]),
    gin_only("unknown dtype policy", "Runtime.dtype_policy = 'float17'", ValueError,
             "Runtime.dtype_policy:"),
]


@parametrize(CASES)
def test_bad_input_raises_the_documented_error(case, tmp_path):
    check(case, tmp_path)
