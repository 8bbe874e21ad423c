"""A finished study as the paper shows it: OUTPUT_DIR/RESULTS.md and charts made with matplotlib.

- RESULTS.md: the paper's table (Table 5, 6 or 7) filled with what the study measured, the
  command, the scale's recipe and each step's wall time;
- <study>.png: the table as a bar chart;
- curves.png, and curves/<run>.png for every run: pretraining's language-model loss by step (from
  the run's TensorBoard scalars) and each fine-tuning run's dev score by epoch (eval_history.jsonl).
"""

import dataclasses
import math
import os
import statistics

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server

import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
import tensorflow as tf  # noqa: E402

from bert_tf.experiments import plan  # noqa: E402
from bert_tf.runtime import io_utils  # noqa: E402
from bert_tf.training import finetuning

# A pretraining run's language-model loss in its scalars: the masked LM's, or the left-to-right's.
LM_LOSS_KEYS = ("masked_lm_loss", "ltr_loss")
TITLES = {
    "tasks": "Table 5: ablation over the pre-training tasks",
    "sizes": "Table 6: ablation over BERT model size",
    "features": "Table 7: the feature-based approach on tagging",
    "masking": "Table 8: masking strategies, fine-tuned and feature-based",
    "layers": "What each layer knows: a frozen-feature probe on every layer",
    "steps": "Appendix C.1: fine-tuned accuracy against pretraining steps",
    "nsp": "Table 5's NSP ablation across every task kind",
}


@dataclasses.dataclass(frozen=True)
class SeedScores:
    """A cell's dev scores over its seeds: shown as mean ± std (n), charted as the mean."""

    scores: tuple

    @property
    def mean(self):
        return statistics.fmean(self.scores)

    @property
    def std(self):
        return statistics.stdev(self.scores) if len(self.scores) > 1 else 0.0

    def __str__(self):
        return f"{self.mean:.3f} ± {self.std:.3f} ({len(self.scores)})"


def cell(scores):
    """A table cell from a cell's runs: None before any finished, a float for one run, else the
    SeedScores of those finished; a skipped cell's reason as it is."""
    if isinstance(scores, str):
        return scores
    done = tuple(s for s in scores if s is not None)
    if not done:
        return None
    return done[0] if len(scores) == 1 else SeedScores(done)


def read_key_values(path):
    """A `key = value` file (eval_results.txt) as a dict of floats ({} without the file)."""
    if not os.path.exists(path):
        return {}
    values = {}
    with open(path) as f:
        for line in f:
            key, sep, value = line.partition(" = ")
            if sep:
                try:
                    values[key.strip()] = float(value)
                except ValueError:
                    pass
    return values


def read_scalars(log_dir):
    """{tag: [(step, value), ...]} of the TensorBoard event files in `log_dir`."""
    series = {}
    if not os.path.isdir(log_dir):
        return series
    for name in sorted(os.listdir(log_dir)):
        if ".tfevents." not in name:
            continue
        for record in tf.data.TFRecordDataset(os.path.join(log_dir, name)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                number = (
                    float(tf.make_ndarray(value.tensor))
                    if value.HasField("tensor")
                    else value.simple_value
                )
                series.setdefault(value.tag, []).append((event.step, number))
    return {tag: sorted(points) for tag, points in series.items()}


def lm_loss_curve(model_dir):
    """(key, [(step, loss)]) of a pretraining run's language-model loss; (None, []) before any."""
    scalars = read_scalars(os.path.join(model_dir, "train"))
    for key in LM_LOSS_KEYS:
        if key in scalars:
            return key, scalars[key]
    return None, []


def lm_perplexity(model_dir):
    """exp(the held-out language-model loss) of a pretraining run, or None."""
    results = read_key_values(os.path.join(model_dir, "eval_results.txt"))
    for key in LM_LOSS_KEYS:
        if key in results:
            return math.exp(min(results[key], 700.0))
    return None


def finetuning_results(steps):
    """{row: {column: cell}} (see `cell`) and {run name: (column, [(epoch, score)])}."""
    runs, curves = {}, {}
    for step in steps:
        if step.kind == "skipped":
            runs.setdefault(step.row, {})[step.column] = step.reason
        if step.kind != "finetuning":
            continue
        run_dir = os.path.dirname(step.done_file)
        score = step.task.score(read_key_values(step.done_file))
        runs.setdefault(step.row, {}).setdefault(step.column, []).append(score)
        history = [
            (e["epoch"], step.task.score(e))
            for e in finetuning.read_eval_history(run_dir)
            if step.task.score(e) is not None
        ]
        curves[step.name] = (step.column, history)
    table = {
        row: {c: cell(scores) for c, scores in columns.items()} for row, columns in runs.items()
    }
    return table, curves


def markdown_table(header, rows):
    """A markdown table; None cells show as a dash (not run yet), SeedScores as mean ± std (n)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = ["–" if c is None else f"{c:.3f}" if isinstance(c, float) else str(c) for c in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def study_table(study, steps):
    """(header, rows) of the study's table in the paper's layout."""
    table, _ = finetuning_results(steps)
    columns = list(dict.fromkeys(s.column for s in steps if s.kind == "finetuning"))
    if study == "masking":
        maskings = {m.row: m for m in plan.MASKINGS}
        return ["Masked", "MASK", "SAME", "RND", *columns], [
            [
                plan.MASKING_UNITS[maskings[row].masking],
                *(f"{p}%" for p in maskings[row].shares),
                *(scores.get(c) for c in columns),
            ]
            for row, scores in table.items()
        ]
    if study in ("steps", "layers"):
        first = "Pretraining steps" if study == "steps" else "Layer (0: embeddings)"
        return [first, *columns], [
            [int(row), *(scores.get(c) for c in columns)] for row, scores in table.items()
        ]
    if study in ("tasks", "nsp"):
        return ["Tasks", *columns], [
            [row, *(scores.get(c) for c in columns)] for row, scores in table.items()
        ]
    if study == "sizes":
        rows = []
        for step in steps:
            if step.kind != "pretraining":
                continue
            layers, hidden, heads = plan.size_shape(step.row)
            scores = table.get(step.row, {})
            perplexity = lm_perplexity(os.path.dirname(step.done_file))
            rows.append([layers, hidden, heads, perplexity, *(scores.get(c) for c in columns)])
        return ["#L", "#H", "#A", "LM (ppl)", *columns], rows
    rows = []
    for row, scores in table.items():
        if row == "Fine-tuning approach":
            rows.append([row, *scores.values()])
            rows.append(["Feature-based approach (frozen encoder, two-layer BiLSTM on):", ""])
        else:
            rows.append([row, *scores.values()])
    return ["System", "Dev F1"], rows


def is_scored(table_cell):
    """Whether a table cell holds a score (a 0.0 too), not a dash or a skipped run's reason."""
    return isinstance(table_cell, (float, SeedScores))


def chart_value(table_cell):
    """The bar of a table cell: its score, or its seeds' mean; 0 for anything else."""
    if isinstance(table_cell, SeedScores):
        return table_cell.mean
    return table_cell if isinstance(table_cell, float) else 0.0


def chart_error(table_cell):
    """The error bar of a table cell: its seeds' standard deviation, else 0."""
    return table_cell.std if isinstance(table_cell, SeedScores) else 0.0


def bar_chart(path, title, header, rows, first_score_column):
    """The table's scores as grouped bars, one group per row."""
    columns = header[first_score_column:]
    scored = [r for r in rows if any(is_scored(c) for c in r[first_score_column:])]
    figure, axes = plt.subplots(figsize=(max(6, 1.6 * len(scored) + 2), 4.5))
    width = 0.8 / max(1, len(columns))
    for index, column in enumerate(columns):
        cells = [r[first_score_column + index] for r in scored]
        values = [chart_value(c) for c in cells]
        errors = [chart_error(c) for c in cells]
        positions = [i + index * width for i in range(len(scored))]
        bars = axes.bar(positions, values, width, label=column, yerr=errors, capsize=2)
        axes.bar_label(bars, fmt="%.3f", fontsize=7)
    labels = [" / ".join(str(c) for c in r[:first_score_column]) for r in scored]
    axes.set_xticks([i + width * (len(columns) - 1) / 2 for i in range(len(scored))])
    axes.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel("dev score")
    axes.set_ylim(0, 1.05)
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    save(figure, path)


def line_chart(path, title, header, rows):
    """Each score column against the first column (steps, layers), with the seeds' spread."""
    figure, axes = plt.subplots(figsize=(6.5, 4.5))
    for index, column in enumerate(header[1:], start=1):
        points = [(r[0], r[index]) for r in rows if is_scored(r[index])]
        if not points:
            continue
        x = [step for step, _ in points]
        y = [chart_value(c) for _, c in points]
        errors = [chart_error(c) for _, c in points]
        axes.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=column)
    axes.set_xlabel(header[0])
    axes.set_ylabel("dev score")
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    save(figure, path)


def save(figure, path):
    """Writes the figure as a PNG atomically and closes it."""
    figure.tight_layout()
    with io_utils.atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110)
    plt.close(figure)


def plot_curve(path, title, xlabel, ylabel, series):
    """One chart of named (x, y) series."""
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, points in series.items():
        if points:
            axes.plot(*zip(*points), marker="o" if len(points) < 30 else None, label=label)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    if len(series) > 1:
        axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
    save(figure, path)


def curves(output_dir, steps):
    """curves/<run>.png for every run and curves.png with all of them; returns the PNGs' paths."""
    paths = []
    pretraining = {}
    for step in steps:
        if step.kind == "pretraining":
            key, points = lm_loss_curve(os.path.dirname(step.done_file))
            if points:
                pretraining[f"{step.row} ({key})"] = points
                path = os.path.join(output_dir, "curves", f"{step.name}.png")
                plot_curve(path, f"pretraining: {step.row}", "step", key, {step.row: points})
                paths.append(path)
    _, finetuned = finetuning_results(steps)
    by_task = {}
    for step in steps:
        if step.kind == "finetuning" and finetuned[step.name][1]:
            column, points = finetuned[step.name]
            label = step.row if step.seed is None else f"{step.row}, seed {step.seed}"
            by_task.setdefault(column, {})[label] = points
            path = os.path.join(output_dir, "curves", f"{step.name}.png")
            plot_curve(path, f"{label}: {column}", "epoch", "dev score", {label: points})
            paths.append(path)
    panels = ([("pretraining", pretraining)] if pretraining else []) + sorted(by_task.items())
    if panels:
        figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
        for ax, (name, series) in zip(axes[0], panels):
            for label, points in series.items():
                ax.plot(*zip(*points), marker="o" if len(points) < 30 else None, label=label)
            ax.set_title(name if name == "pretraining" else f"fine-tuning: {name}", fontsize=10)
            ax.set_xlabel("step" if name == "pretraining" else "epoch")
            ax.set_ylabel("LM loss" if name == "pretraining" else "dev score")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        path = os.path.join(output_dir, "curves.png")
        save(figure, path)
        paths.append(path)
    return paths


def seeds_text(args):
    """How many seeds each fine-tuning cell ran, for the recipe line."""
    count = plan.finetune_seed_count(args)
    if count == 1:
        return f", seed {args.seed}."
    return (
        f", seeds {args.seed} to {args.seed + count - 1} for every cell (mean ± standard deviation "
        "(runs))."
    )


def pretraining_text(args, recipe):
    """What the study's models are: the --init_checkpoint given, or the scale's pretraining."""
    if args.init_checkpoint:
        return (
            f"the model studied is --init_checkpoint ({args.init_checkpoint}), not pretrained here"
        )
    return (
        f"{recipe['model_size']} models pretrained for "
        f"{args.pretraining_steps or recipe['pretraining_steps']} steps of "
        f"{recipe['pretraining_batch']} sequences of {recipe['max_seq_length']} tokens (learning "
        f"rate {recipe['pretraining_learning_rate']:g})"
    )


def write_report(args, steps, times, command):
    """RESULTS.md and the charts; returns RESULTS.md's path."""
    header, rows = study_table(args.study, steps)
    first_score = {"sizes": 4, "masking": 4}.get(args.study, 1)
    chart = os.path.join(args.output_dir, f"{args.study}.png")
    if args.study in ("steps", "layers"):
        line_chart(chart, TITLES[args.study], header, rows)
    else:
        bar_chart(chart, TITLES[args.study], header, rows, first_score)
    curve_files = curves(args.output_dir, steps)
    recipe = plan.SCALES[args.scale]
    total = sum(times.get(s.name, 0.0) for s in steps)
    lines = [
        f"# {TITLES[args.study]}",
        "",
        markdown_table(header, rows),
        "",
        f"![{args.study}]({os.path.basename(chart)})",
        "",
        f"Scale `{args.scale}`: {pretraining_text(args, recipe)}; every fine-tuning run: learning rate "
        f"{args.finetune_learning_rate or recipe['finetune_learning_rate']:g}, "
        f"{args.finetune_epochs or recipe['finetune_epochs']:g} epochs"
        + (
            f" ({args.bilstm_epochs or recipe['bilstm_epochs']:g} where a BiLSTM is trained from "
            "scratch)"
            if args.study != "sizes"
            else ""
        )
        + f", batch {recipe['finetune_batch']}, "
        + ("standard AdamW" if recipe["finetune_bias_correction"] else "the original's AdamW")
        + seeds_text(args),
        "",
        f"Command: `{command}`",
        "",
        "Learning curves: " + ", ".join(os.path.relpath(p, args.output_dir) for p in curve_files),
        "",
        markdown_table(
            ["step", "wall s"],
            [[s.name, None if s.name not in times else f"{times[s.name]:.0f}"] for s in steps],
        ),
        "",
        f"Total: {total / 60:.1f} min.",
    ]
    path = os.path.join(args.output_dir, "RESULTS.md")
    io_utils.atomic_write_text(path, "\n".join(lines) + "\n")
    return path
