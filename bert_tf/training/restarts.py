"""--num_restarts=N: the paper's remedy for fine-tuning that fails on small data, run for the user.

The BERT paper fine-tuned BERT-large on its small GLUE sets with "several random restarts" and kept
the model best on dev. With N restarts a fine-tuning job trains N times, with seeds --seed,
--seed + 1, ..., each run a whole fine-tuning run of its own in OUTPUT_DIR/restarts/seed-S (its
model directory, eval results and predictions). When the last has been evaluated, the one with the
best dev score (the job's `selection_key`: accuracy, F1, MCC or Pearson as the task reports) is
moved up into OUTPUT_DIR, which becomes that run's model directory, and the others are deleted.
OUTPUT_DIR/eval_results.txt is the kept run's, plus every run's seed and score
(`restart_<i>_seed`, `restart_<i>_<key>`) and `kept_restart`.

OUTPUT_DIR/restarts.json records each run as it ends, so a killed job resumes: finished runs are
not trained again, the one under way resumes from its own checkpoints, and a move that was cut
short is finished. The move puts the `checkpoint` state file last: until it is there, OUTPUT_DIR
holds no checkpoint that loads.
"""

import dataclasses
import gc
import json
import os

import tensorflow as tf

from bert_tf.checkpoints import saves
from bert_tf.model.model_dir import ModelDir
from bert_tf.runtime import io_utils
from bert_tf.training import training_loop

RESTARTS_DIR = "restarts"
RESTARTS_FILE = "restarts.json"
CHECKPOINT_STATE = "checkpoint"  # what tf.train.CheckpointManager names its state file


def restart_seeds(seed, num_restarts):
    """The seeds of the runs: `seed`, then the next ones (so restart 1 is the run without restarts)."""
    return [seed + index for index in range(num_restarts)]


def run_directory(output_dir, seed):
    return os.path.join(output_dir, RESTARTS_DIR, f"seed-{seed}")


class RestartRecord:
    """OUTPUT_DIR/restarts.json: {"seeds": [...], "selection_key": key, "runs": [{"seed", "score",
    "eval_results"}]}. A record of other seeds (another --seed or --num_restarts) is a usage error:
    its kept model may already have replaced the others."""

    def __init__(self, output_dir, seeds):
        self.path = os.path.join(output_dir, RESTARTS_FILE)
        self.seeds = list(seeds)
        self.selection_key = None
        self.runs = []
        if tf.io.gfile.exists(self.path):
            with tf.io.gfile.GFile(self.path) as f:
                data = json.load(f)
            if data["seeds"] != self.seeds:
                raise io_utils.UsageError(
                    f"--output_dir={output_dir} holds restarts of seeds {data['seeds']}, not "
                    f"{self.seeds}: rerun with the --seed and --num_restarts it was made with, or "
                    "use a new --output_dir"
                )
            self.selection_key = data["selection_key"]
            self.runs = data["runs"]

    def find(self, seed):
        return next((run for run in self.runs if run["seed"] == seed), None)

    def add(self, seed, selection_key, eval_results):
        self.selection_key = selection_key
        self.runs.append(
            {
                "seed": seed,
                "score": float(eval_results[selection_key]),
                "eval_results": {k: _plain(v) for k, v in eval_results.items()},
            }
        )
        io_utils.atomic_write_json(
            self.path,
            {"seeds": self.seeds, "selection_key": self.selection_key, "runs": self.runs},
        )

    def best(self):
        """The run with the highest score (the earliest seed on a tie)."""
        return max(self.runs, key=lambda run: (run["score"], -run["seed"]))


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def check_output_dir(output_dir):
    """A restarted job's OUTPUT_DIR must not hold a run made without restarts: a usage error."""
    if ModelDir(output_dir).latest_checkpoint() and not tf.io.gfile.exists(
        os.path.join(output_dir, RESTARTS_FILE)
    ):
        raise io_utils.UsageError(
            f"--output_dir={output_dir} holds a fine-tuned model made without --num_restarts; "
            "use a new --output_dir"
        )


def promote(run_dir, output_dir):
    """Moves every entry of `run_dir` into `output_dir` (replacing), the checkpoint state last, then
    removes the emptied `run_dir`. Safe to call again after a kill: it moves what is left."""
    entries = sorted(tf.io.gfile.listdir(run_dir)) if tf.io.gfile.isdir(run_dir) else []
    entries = [entry.rstrip("/") for entry in entries]
    last = [entry for entry in entries if entry == CHECKPOINT_STATE]
    for entry in [entry for entry in entries if entry != CHECKPOINT_STATE] + last:
        target = os.path.join(output_dir, entry)
        if tf.io.gfile.isdir(target):
            tf.io.gfile.rmtree(target)
        tf.io.gfile.rename(os.path.join(run_dir, entry), target, overwrite=True)
    if tf.io.gfile.isdir(run_dir):
        tf.io.gfile.rmtree(run_dir)


def run(config, run_once, selection_key, log_fn=print):
    """Runs `run_once(config, after_prepare)` (one fine-tuning run, which calls `after_prepare`
    once it has read its data, before training) per restart seed, keeps the best on dev in
    config.output_dir and returns (the kept run's RunResult, or None when it finished in an earlier
    process; OUTPUT_DIR's eval results).

    `selection_key()` names the eval result that ranks the runs, or raises a usage error where the
    run cannot score them.
    """
    output_dir = config.output_dir
    check_output_dir(output_dir)
    seeds = restart_seeds(config.seed, config.num_restarts)
    record = RestartRecord(output_dir, seeds)
    kept, kept_seed = None, None
    for index, seed in enumerate(seeds, 1):
        directory = run_directory(output_dir, seed)
        done = record.find(seed)
        if done is not None:
            log_fn(
                f"restart {index}/{len(seeds)} (seed {seed}): finished earlier, "
                f"{record.selection_key} = {done['score']}"
            )
            continue
        log_fn(f"restart {index}/{len(seeds)} (seed {seed}): {directory}")
        if tf.io.gfile.exists(directory):
            saves.clean_output_dir(directory)
        sub_config = dataclasses.replace(config, output_dir=directory, seed=seed, num_restarts=1)
        result = run_once(sub_config, after_prepare=selection_key)
        key = selection_key()
        if key not in result.eval_results:
            raise RuntimeError(f"the run of seed {seed} has no {key} in its eval results")
        record.add(seed, key, result.eval_results)
        if record.best()["seed"] == seed:
            kept, kept_seed = result, seed  # the best so far stays in memory; the others can go
        del result
        gc.collect()
    best = record.best()
    promote(run_directory(output_dir, best["seed"]), output_dir)
    restarts_dir = os.path.join(output_dir, RESTARTS_DIR)
    if tf.io.gfile.isdir(restarts_dir):
        tf.io.gfile.rmtree(restarts_dir)
    eval_results = summary_results(record, seeds)
    training_loop.write_eval_results(os.path.join(output_dir, "eval_results.txt"), eval_results)
    log_fn(summary_lines(record, seeds, output_dir))
    if kept_seed != best["seed"]:
        return None, eval_results
    files = [os.path.join(output_dir, os.path.basename(path)) for path in kept.output_files]
    return dataclasses.replace(kept, eval_results=eval_results, output_files=files), eval_results


def summary_results(record, seeds):
    """The kept run's eval results plus every run's seed and score, and which run was kept."""
    best = record.best()
    results = dict(best["eval_results"])
    for index, seed in enumerate(seeds, 1):
        results[f"restart_{index}_seed"] = seed
        results[f"restart_{index}_{record.selection_key}"] = record.find(seed)["score"]
    results["kept_restart"] = seeds.index(best["seed"]) + 1
    return results


def summary_lines(record, seeds, output_dir):
    """A line per run (seed and score) and which one OUTPUT_DIR now holds."""
    best = record.best()
    lines = [f"***** Restarts, ranked by {record.selection_key} on dev *****"]
    for index, seed in enumerate(seeds, 1):
        mark = "  <- kept" if seed == best["seed"] else ""
        lines.append(f"  restart {index} (seed {seed}): {record.find(seed)['score']:.4f}{mark}")
    lines.append(f"{output_dir} is the model of seed {best['seed']}")
    return "\n".join(lines)
