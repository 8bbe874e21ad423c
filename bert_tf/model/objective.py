"""The plug-in between a training job and the loop: the loss, the statistics it sums, its metrics."""


class Objective:
    """What a training job plugs into the loop: its loss, the statistics it sums, its metrics.

    Pretraining's is MLM + NSP (masked_lm.PretrainingObjective); each fine-tuning task's is
    its head's loss (tasks.heads.HeadObjective).

    `model` holds the trainable variables. Every statistic is a SUM over the examples of a
    replica's batch; the loop adds them over replicas and steps, and `metrics` turns the global
    sums into the reported values. `stat_names[0]` must be "loss": the replica's share of the
    global loss, so its sum over replicas is the global loss.
    """

    model = None
    stat_names = ("loss",)

    def denominators(self, batch):
        """Local sums that normalize the loss (all-reduced before the forward pass)."""
        raise NotImplementedError

    def loss_and_stats(self, batch, global_denominators, training):
        """(this replica's share of the global loss, {stat name: local sum})."""
        raise NotImplementedError

    def metrics(self, sums, num_steps):
        """{metric name: value} from the global sums over `num_steps` steps."""
        raise NotImplementedError
