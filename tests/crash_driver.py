"""``python -m metalearn.train`` that SIGKILLs itself at a chosen point (tests only).

    CRASH_AT=step:13 python -m tests.crash_driver --gin_file=... --workdir=...

``CRASH_AT`` (unset: no kill, plain ``metalearn.train``):
  * ``step:N``: right after meta-step N has run (before any checkpoint of step N);
  * ``mid_save:N``: inside the save of checkpoint N, after its data and index files
    are written and before the ``checkpoint`` state file records it;
  * ``after_save:N``: right after checkpoint N is saved and recorded.
  * ``sigterm:N``: ``SIGTERM`` to this process right after meta-step N has run (what a
    scheduler or ``timeout`` sends; training saves a checkpoint and exits 143).
  * ``hang:N``: a Python environment's simulator hangs (its ``task_reward`` sleeps for
    an hour) in the collection of the batch after meta-step N, once it has printed
    ``SIMULATOR HUNG`` (for a test to send ``SIGTERM``, or to let a time limit pass).
The kill is ``SIGKILL`` to this process: no handler, no cleanup, no flush.
"""

import os
import signal

from absl import app
from tensorflow.python.checkpoint import checkpoint_management

from metalearn import train as entry_point
from metalearn.training import loop


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _install(spec: str) -> None:
    where, number = spec.split(":")
    number = int(number)
    if where in ("step", "sigterm"):
        die = _die if where == "step" else lambda: os.kill(os.getpid(), signal.SIGTERM)
        make = loop.make_meta_step  # the builder the training loop calls

        def make_killing(learner, *args, **kwargs):
            step = make(learner, *args, **kwargs)

            def killing(batch):
                result = step(batch)
                if int(learner.meta_step.numpy()) == number:
                    die()
                return result
            return killing
        loop.make_meta_step = make_killing
    elif where == "hang":
        import sys
        import time

        from metalearn.rl import gym
        make = loop.make_meta_step

        def make_hanging(learner, *args, **kwargs):
            step = make(learner, *args, **kwargs)
            gym.GymCollector._call = hanging_call(gym.GymCollector._call, learner)
            return step

        def hanging_call(call, learner):
            def hang(*args, **kwargs):
                print("SIMULATOR HUNG", flush=True)
                sys.stderr.flush()
                time.sleep(3600)

            def calling(self, where, t, phase, name, function, *args, **kwargs):
                if name.endswith(".task_reward") and int(learner.meta_step.numpy()) >= number:
                    function = hang
                return call(self, where, t, phase, name, function, *args, **kwargs)
            return calling
        loop.make_meta_step = make_hanging
    elif where == "mid_save":
        record = checkpoint_management.update_checkpoint_state_internal

        def record_or_die(*args, **kwargs):
            if kwargs["model_checkpoint_path"].endswith(f"ckpt-{number}"):
                _die()
            return record(*args, **kwargs)
        checkpoint_management.update_checkpoint_state_internal = record_or_die
    elif where == "after_save":
        save = checkpoint_management.CheckpointManager.save

        def save_then_die(self, checkpoint_number=None, **kwargs):
            path = save(self, checkpoint_number=checkpoint_number, **kwargs)
            if checkpoint_number == number:
                _die()
            return path
        checkpoint_management.CheckpointManager.save = save_then_die
    else:
        raise ValueError("CRASH_AT must be step:N, sigterm:N, hang:N, mid_save:N or "
                         "after_save:N, "
                         f"got {spec!r}")


if __name__ == "__main__":
    if os.environ.get("CRASH_AT"):
        _install(os.environ["CRASH_AT"])
    app.run(entry_point.main)
