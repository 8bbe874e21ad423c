"""python -m bert_tf.playground: see what BERT sees, on a local web page.

    python -m bert_tf.playground --model_dir=build/demo/minilm_pretrained
    python -m bert_tf.playground --vocab_file=vocab.txt --do_lower_case=true   # no model
    python -m bert_tf.playground --model_dir=DIR --corpus=corpus.txt --port=8080
    python -m bert_tf.playground --model_dir=DIR --host=0.0.0.0 --allowed_origins=http://myhost:8080

Serves one page on http://127.0.0.1:8080/ with six views: input representation, MLM masking, next
sentence, fill-mask, records and attention. Without --model_dir the representation, masking and
next-sentence views work from the vocabulary alone, and the model views say what is missing.
Nothing is fetched from outside: the page's files are in the package.

Whatever --host it binds, it answers a browser only at a loopback address or the bound one (the
Host and Origin headers are checked, 0.0.0.0 included), so that no other web site can drive it; to
open it by another name (from another machine, say), list that origin in --allowed_origins.
"""

from bert_tf.runtime import job_process  # noqa: F401  (first: it sets the process up before TensorFlow loads)

# isort: split

import dataclasses

from bert_tf.playground import server, views
from bert_tf.runtime import cli, io_utils
from bert_tf.runtime.cli import arg


@dataclasses.dataclass
class PlaygroundArgs:
    """A playground: what it runs on, and where it listens."""

    model_dir: str = arg(
        "",
        "A model directory (run_pretraining's or convert_checkpoint's; with pretraining heads for "
        "fill-mask and next-sentence). Its vocab.txt and casing are used.",
    )
    vocab_file: str = arg("", "Without --model_dir: the vocabulary to tokenize with.")
    do_lower_case: bool = arg(
        True, "Without --model_dir: whether to lower case the input (a model carries its own)."
    )
    corpus: str = arg(
        "",
        "A text file in create_pretraining_data's format (one sentence per line, a blank line "
        "between documents) to draw next-sentence pairs from; default the embedded demo corpus.",
    )
    port: int = arg(8080, "The port to listen on (0: any free port).")
    host: str = arg(
        "127.0.0.1", "The address to listen on. Anything but loopback shows your files to others."
    )
    allowed_origins: list = arg(
        default_factory=list,
        help="Origins whose pages may use the playground besides its loopback and bound addresses' "
        "own, comma-separated scheme://host[:port], such as http://myhost:8080 to open it by that "
        "name from another machine; each one's host:port is let in as a Host too.",
    )
    max_seq_length: int = arg(
        128,
        "Where inputs are cut, as the fine-tuning and data jobs cut them (at most the model's).",
    )
    max_predictions_per_seq: int = arg(
        20, "The masking view's cap on masked positions, as create_pretraining_data's flag."
    )


def run(args, on_ready=None):
    """Serves the playground until interrupted; `on_ready(server)` is called once it listens."""
    if args.model_dir and args.vocab_file:
        raise io_utils.UsageError("give --model_dir or --vocab_file, not both")
    if not 0 <= args.port <= 65535:
        raise io_utils.UsageError(f"--port must be in [0, 65535], got {args.port}")
    origins = [server.parse_origin(origin) for origin in args.allowed_origins if origin.strip()]
    playground = views.Playground(
        views.PlaygroundSettings(
            model_dir=args.model_dir,
            vocab_file=args.vocab_file,
            do_lower_case=args.do_lower_case,
            corpus=args.corpus,
            max_seq_length=args.max_seq_length,
            max_predictions_per_seq=args.max_predictions_per_seq,
        )
    )
    try:
        httpd = server.PlaygroundServer(playground, args.host, args.port, allowed_origins=origins)
    except OSError as e:
        raise io_utils.UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from e
    try:
        print(f"playground at {httpd.url}  (Ctrl+C stops it)", flush=True)
        if not httpd.is_loopback:
            print(
                f"warning: {args.host} is not a loopback address: a program that reaches this "
                "port can use the playground (browsers only from its own addresses and "
                "--allowed_origins), and its records view reads any file it is given a path to",
                flush=True,
            )
        if on_ready is not None:
            on_ready(httpd)
        httpd.wait()
    except KeyboardInterrupt:
        pass
    finally:
        httpd.stop()


def main(argv):
    """absl's main: flags -> PlaygroundArgs."""
    if len(argv) > 1:
        raise io_utils.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    run(cli.args_from_flags(PlaygroundArgs))


if __name__ == "__main__":
    cli.define_flags(PlaygroundArgs)
    cli.run(main)
