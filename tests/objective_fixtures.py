"""A research subclass that changes what a learner minimises, shared by the tests of the
outer rules that promise the meta-gradient of the learner's own objective
(outer/truncated_test.py, outer/evolution_test.py): a test module imports these, never
another test module's helpers."""

import tensorflow as tf

import metalearn


class ShiftedObjective(metalearn.Learner):
    """A research subclass that changes what is minimised (``objective_of``): the query
    loss plus a tenth of the squared mean of the query predictions (float64 models)."""

    def objective_of(self, run):
        extra = 0.1 * tf.square(tf.reduce_mean(run.predictions))
        return {**run.metrics, "loss": run.metrics["loss"] + tf.cast(extra, tf.float64)}
