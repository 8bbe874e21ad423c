"""What every `python -m bert_tf.<job>` shares: exit codes, flag logging."""

import os
import sys

from absl import app, flags, logging

from bert_tf.io_utils import UsageError, atomic_path


def _parse_flags_or_exit(argv):
    """Parses absl flags; a bad flag exits with code 2 (absl's own parser exits with 1)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        print("Try --helpfull for the list of flags.", file=sys.stderr)
        sys.exit(2)


def run(main):
    """Runs an absl `main`; a UsageError or flag error prints one line and exits with code 2."""

    def guarded(argv):
        try:
            return main(argv)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    app.run(guarded, flags_parser=_parse_flags_or_exit)


def log_flags(output_dir, job_name):
    """Writes the job's resolved flags to OUTPUT_DIR/<job_name>.flags, reusable with --flagfile."""
    path = os.path.join(output_dir, f"{job_name}.flags")
    with atomic_path(path) as tmp:
        flags.FLAGS.append_flags_into_file(tmp)
    logging.info("flags written to %s", path)
