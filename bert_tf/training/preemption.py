"""SIGTERM, the notice a cloud gives before it takes a machine: training saves and stops.

While `Trainer.train` runs, SIGTERM no longer ends the process; it is noted, and after the loop in
progress (`--steps_per_loop` steps) every worker learns whether any of them got one (one small
all-reduce across the cluster, so that they all stop at the same step). They then save a checkpoint
of that step and raise `Preempted`; the CLIs print one line and exit with `--preempted_exit_code`
(0 by default). Rerunning the same command on every worker resumes from that step.

Why not `tf.distribute.experimental.PreemptionCheckpointHandler` (TF 2.21): on a Google Cloud CPU or
TPU VM it does nothing (it asks the metadata server where it runs, and skips those platforms); it
restores the newest checkpoint itself, past the trainer's resume rules (a checkpoint marked suspect
after a diverged loss, --resume_from); its step count lives in the chief's directory, which the
other workers save beside rather than in; and for a non-chief worker it makes `workertemp_N`
folders next to the output directory, in the user's parent folder.
"""

import contextlib
import signal
import threading

from absl import logging


class Notice:
    """Whether this process got SIGTERM while the notice was watched."""

    def __init__(self):
        self.received = False


@contextlib.contextmanager
def sigterm_notice():
    """Yields a Notice that SIGTERM sets instead of ending the process; the previous handler is
    back afterwards. Off the main thread (where Python cannot take signals) SIGTERM is not watched."""
    notice = Notice()
    if threading.current_thread() is not threading.main_thread():
        yield notice
        return

    def note(signum, frame):
        del frame
        if not notice.received:
            logging.warning(
                "got %s: saving a checkpoint after the steps in progress, then stopping",
                signal.Signals(signum).name,
            )
        notice.received = True

    previous = signal.signal(signal.SIGTERM, note)
    try:
        yield notice
    finally:
        signal.signal(signal.SIGTERM, previous)
