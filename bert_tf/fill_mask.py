"""python -m bert_tf.fill_mask: ask a pretrained model what it was trained on.

    python -m bert_tf.fill_mask --model_dir=build/demo/minilm_pretrained [--top_k=5] "the capital of france is [MASK] ."
    python -m bert_tf.fill_mask --model_dir=build/demo/minilm_pretrained --next_sentence "he went out ." "it rained ."
    python -m bert_tf.fill_mask --model_dir=build/demo/minilm_pretrained --evaluate_file=build/demo/heldout.txt

Fill-mask prints, for every [MASK] of every text, a table of the top-k tokens with their ids and
probabilities, then the text with the best tokens put in. --next_sentence takes the texts as pairs
(A B A B ...) and prints each pair's IsNext probability. --input_file reads the texts from a file
instead, one a line (`text_a ||| text_b` for a pair, as extract_features reads pairs). The model
directory needs its MLM head for fill-mask and its NSP head for --next_sentence: a directory
without it (a Hugging Face BertModel converted, a fine-tuned classifier) exits 2 naming the head.
--evaluate_file measures both heads on held-out text first (bert_tf.pretraining.heldout says how)
and prints the two accuracies, a line each; texts given too are answered after them.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

from bert_tf.pretraining import heldout, masked_lm
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg
from bert_tf.tasks import data_files
from bert_tf.tokenization import tokenizer_rules


@dataclasses.dataclass
class FillMaskArgs:
    """A fill_mask run: the model directory, what to ask, and how much to show."""

    model_dir: str = arg(None, "A model directory with pretraining heads.")
    top_k: int = arg(masked_lm.DEFAULT_TOP_K, "How many tokens to show for each [MASK].")
    next_sentence: bool = arg(
        False, "Score sentence pairs (text_a text_b ...) instead: the IsNext probability."
    )
    input_file: str = arg(
        "", "Read the texts from this file, one a line (`text_a ||| text_b` with --next_sentence)."
    )
    evaluate_file: str = arg(
        "",
        "Held-out text in the pretraining format (python -m bert_tf.corpus --heldout_file): print "
        "the model's fill-mask top-1 accuracy and next-sentence accuracy on it.",
    )
    max_questions: int = arg(
        heldout.DEFAULT_MAX_QUESTIONS,
        "With --evaluate_file: at most this many sentences to fill masks in, and pairs to score.",
    )
    max_seq_length: int = arg(
        0, "Where texts are cut, by the original's rule (0: the model's max_position_embeddings)."
    )


def read_texts(args, texts):
    """The texts (or pairs, with --next_sentence) from the command line or --input_file."""
    if args.input_file and texts:
        raise io_utils.UsageError("give texts on the command line or --input_file, not both")
    if args.input_file:
        pairs = data_files.read_text_pairs(args.input_file, "--input_file")
        if not args.next_sentence:
            return [a if b is None else f"{a} ||| {b}" for a, b in pairs]
        unpaired = [row for row, (_, b) in enumerate(pairs, start=1) if b is None]
        if unpaired:
            raise io_utils.UsageError(
                f"{args.input_file}:{unpaired[0]}: --next_sentence needs `text_a ||| text_b`"
            )
        return pairs
    if not texts:
        if args.evaluate_file:
            return []
        raise io_utils.UsageError("give the texts to ask about, --input_file or --evaluate_file")
    if not args.next_sentence:
        return list(texts)
    if len(texts) % 2:
        raise io_utils.UsageError(
            f"--next_sentence takes pairs of texts (A B A B ...), got {len(texts)} texts"
        )
    return list(zip(texts[::2], texts[1::2]))


def print_fill_mask(results, print_fn=print):
    """A small table for each [MASK] of each result."""
    for result in results:
        print_fn(result.text)
        for index, mask in enumerate(result.masks, start=1):
            print_fn(f"  [MASK] {index} of {len(result.masks)} (position {mask.position})")
            width = max(len("token"), *(len(t) for t in mask.tokens))
            print_fn(f"    {'#':>2}  {'token':<{width}}  {'id':>6}  probability")
            for rank, (token, token_id, p) in enumerate(
                zip(mask.tokens, mask.token_ids, mask.probabilities), start=1
            ):
                print_fn(f"    {rank:>2}  {token:<{width}}  {token_id:>6}  {p:.4f}")
        if result.cut_masks:
            print_fn(f"  {result.cut_masks} [MASK]s past max_seq_length were cut: no prediction")
        print_fn(f"  filled: {result.filled}")


def evaluate(args, model):
    """Prints the model's two accuracies on --evaluate_file; returns the HeldoutScores."""
    try:
        scores = heldout.evaluate(model, args.evaluate_file, args.max_questions)
    except ValueError as e:  # fewer than two documents
        raise io_utils.UsageError(f"--evaluate_file: {e}") from e
    for line in scores.lines():
        print(line, flush=True)
    return scores


def run(args, texts=()):
    """Answers the texts; returns the FillMaskResults, or the IsNext probabilities."""
    if not args.model_dir:
        raise io_utils.UsageError("--model_dir is required")
    if args.max_seq_length and args.max_seq_length < 3:
        raise io_utils.UsageError(f"--max_seq_length must be at least 3, got {args.max_seq_length}")
    if args.max_questions < 1:
        raise io_utils.UsageError(f"--max_questions must be at least 1, got {args.max_questions}")
    if args.evaluate_file:
        io_utils.require_file(args.evaluate_file, "--evaluate_file")
    inputs = read_texts(args, texts)
    try:
        model = masked_lm.MaskedLM(args.model_dir, args.max_seq_length or None)
    except tokenizer_rules.VocabError as e:  # a vocabulary without [MASK], or a duplicated line
        raise io_utils.UsageError(str(e)) from e
    except ValueError as e:  # the only other: max_seq_length outside the model's range
        raise io_utils.UsageError(f"--max_seq_length: {e}") from e
    vocab_size = model.config.vocab_size
    if not 1 <= args.top_k <= vocab_size:
        raise io_utils.UsageError(f"--top_k must be in [1, {vocab_size}], got {args.top_k}")
    if args.evaluate_file:
        evaluate(args, model)
        if not inputs:
            return []
    if args.next_sentence:
        probabilities = model.next_sentence([a for a, _ in inputs], [b for _, b in inputs])
        for (text_a, text_b), p in zip(inputs, probabilities):
            print(f"IsNext {p:.4f}  {text_a} ||| {text_b}", flush=True)
        return probabilities
    try:
        results = model.fill_mask(inputs, args.top_k)
    except masked_lm.NoMaskError as e:
        raise io_utils.UsageError(str(e)) from e
    print_fill_mask(results, lambda line: print(line, flush=True))
    return results


def main(argv):
    """absl's main: flags -> FillMaskArgs; the positional arguments are the texts."""
    run(cli.args_from_flags(FillMaskArgs), argv[1:])


if __name__ == "__main__":
    cli.define_flags(FillMaskArgs)
    cli.run(main)
