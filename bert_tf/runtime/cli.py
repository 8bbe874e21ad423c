"""What every `python -m bert_tf.<job>` shares: flags made from the job's arguments, exit codes, flag logging.

The contract: a job's library takes one arguments dataclass; each field made with `arg()` carries its
flag's help, and `define_flags` turns those fields into absl flags (same names, defaults from the
dataclass, types from the annotations; a `list` field is a comma-separated flag). Only a CLI
module reads FLAGS, through `args_from_flags` or `job_main`. `run` gives every job the same exits:
2 with one line for a usage error (a bad flag, a missing or bad input), 1 with the message for a
run that cannot go on (a JobFailure such as a diverged loss, or a file system error naming the file).
"""

import dataclasses
import gc
import os
import sys

from absl import app, flags, logging

from bert_tf.runtime.io_utils import (
    JobFailure,
    Preempted,
    UsageError,
    atomic_write_text,
    os_error_message,
)


def arg(default=None, help="", choices=None, default_factory=None):  # noqa: A002 (absl's own name)
    """A field of a job's arguments dataclass that is also its command-line flag, with the flag's help."""
    metadata = {"help": help, "choices": tuple(choices) if choices else None}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def inherit(base, name, default=dataclasses.MISSING, more_help=""):
    """A field with `base`'s flag help (the same flag in another job's arguments) followed by
    `more_help`, and with `base`'s default unless another is given."""
    field = {f.name: f for f in dataclasses.fields(base)}[name]
    default = field.default if default is dataclasses.MISSING else default
    metadata = dict(field.metadata)
    if more_help:
        metadata["help"] = f"{metadata['help']} {more_help}"
    return dataclasses.field(default=default, metadata=metadata)


def check_fraction(name, value):
    """A UsageError naming --`name` unless `value` is in [0, 1); None (unset) passes."""
    if value is not None and not 0 <= value < 1:
        raise UsageError(f"--{name} must be in [0, 1), got {value}")


def flag_fields(args_class):
    """The fields of `args_class` that are flags (made with `arg()`)."""
    return [field for field in dataclasses.fields(args_class) if "help" in field.metadata]


def define_flags(args_class, flag_values=flags.FLAGS, module_name=None, **defaults):
    """Defines an absl flag for every `arg()` field of `args_class`; `defaults` override the dataclass's.

    The type follows the annotation (bool, int, float, list: comma-separated, else string; an enum
    where the field lists choices). A flag already defined (by another job's args in this process)
    is left as it is. The flags belong to the calling module (`module_name` by default), so
    `--help` lists them.
    """
    module_name = module_name or sys._getframe(1).f_globals.get("__name__")
    if module_name == "__main__":
        module_name = sys.argv[0]  # absl's --help lists the flags of the module it finds there
    instance = args_class(**defaults)
    for field in flag_fields(args_class):
        if field.name in flag_values:
            continue
        default, help_text, choices = (
            getattr(instance, field.name),
            field.metadata["help"],
            field.metadata["choices"],
        )
        common = dict(flag_values=flag_values, module_name=module_name)
        if choices:
            flags.DEFINE_enum(field.name, default, list(choices), help_text, **common)
        elif field.type is bool:
            flags.DEFINE_bool(field.name, default, help_text, **common)
        elif field.type is int:
            flags.DEFINE_integer(field.name, default, help_text, **common)
        elif field.type is float:
            flags.DEFINE_float(field.name, default, help_text, **common)
        elif field.type is list:
            flags.DEFINE_list(field.name, default, help_text, **common)
        else:
            flags.DEFINE_string(field.name, default, help_text, **common)


def args_from_flags(args_class, flag_values=flags.FLAGS):
    """An `args_class` filled from the parsed flags of its `arg()` fields."""
    return args_class(
        **{field.name: flag_values[field.name].value for field in flag_fields(args_class)}
    )


def job_main(
    args_class, run_fn, job_name, required=(), flag_values=flags.FLAGS, clean_output_dir=None
):
    """The absl `main` of a job: its flags -> `args_class` -> `run_fn(args)`.

    Refuses stray arguments and missing `required` flags (usage errors), writes the resolved flags
    into the args' `output_dir` when it has one, and removes that directory again when it made it
    and a usage error stops the run before anything else was written there. An existing output_dir
    is first given to `clean_output_dir(output_dir)`, which removes what a killed run left, so that
    on a nearly full disk the space is freed before anything is written.
    """

    def main(argv):
        if len(argv) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
        args = args_from_flags(args_class, flag_values)
        for name in required:
            if getattr(args, name) in (None, ""):
                raise UsageError(f"--{name} is required")
        output_dir = getattr(args, "output_dir", None)
        if not output_dir:
            run_fn(args)  # (absl's app.run would print a returned value and exit with 1)
            return
        # TensorFlow's file system (gs:// too); a job with an output_dir imports TensorFlow anyway.
        import tensorflow as tf

        created = not tf.io.gfile.exists(output_dir)
        if clean_output_dir and not created:
            clean_output_dir(output_dir)
        tf.io.gfile.makedirs(output_dir)
        log_flags(output_dir, job_name)
        try:
            run_fn(args)
        except UsageError:
            if created and tf.io.gfile.listdir(output_dir) == [f"{job_name}.flags"]:
                tf.io.gfile.rmtree(output_dir)
            raise

    return main


def _parse_flags_or_exit(argv, known_only=False):
    """Parses absl flags; a bad flag exits with code 2 (absl's own parser exits with 1).

    With `known_only`, arguments that are not this process's flags are returned (after argv[0])
    instead of refused."""
    try:
        return flags.FLAGS(argv, known_only=known_only)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        print("Try --helpfull for the list of flags.", file=sys.stderr)
        sys.exit(2)


def run(main, pass_unknown_flags=False):
    """Runs an absl `main`; a UsageError or flag error prints one line and exits with code 2, a
    JobFailure or an error of the file system (a full disk, a read-only one, a folder that cannot
    be made) logs its message (naming the file) and exits with code 1; a preempted run (Preempted:
    it saved and stopped on SIGTERM) says where it stopped and exits with the code it carries.

    With `pass_unknown_flags`, `main(argv)` gets the arguments absl does not know (another
    library's options, such as Beam's) in argv[1:], and must refuse those it cannot use.
    """

    def guarded(argv):
        try:
            return main(argv)
        except UsageError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        except Preempted as e:
            print(f"preempted: {e}", flush=True)
            sys.exit(e.exit_code)
        except Exception as e:
            message = str(e) if isinstance(e, JobFailure) else os_error_message(e)
            if message is None:
                raise
            logging.error("%s", message)
            print(f"error: {message}", flush=True)
            sys.exit(1)

    # What the job imported (with TensorFlow and Keras, about 320,000 objects the collector
    # tracks) lives until the process exits. Frozen, it is skipped by the collector's full passes
    # and by the collection at exit: a short run_classifier job spent 0.4 s less collecting and
    # exited 1 s sooner. (Without a collection first, the imports' own garbage is kept: once.)
    gc.freeze()
    app.run(
        guarded, flags_parser=lambda argv: _parse_flags_or_exit(argv, known_only=pass_unknown_flags)
    )


def log_flags(output_dir, job_name, extra_args=(), write_text=atomic_write_text):
    """Writes the job's resolved flags to OUTPUT_DIR/<job_name>.flags, reusable with --flagfile.

    `extra_args` (--name=value arguments the job passed on, such as Beam's pipeline options) are
    written after them; `write_text(path, text)` writes the file (atomically).
    """
    path = os.path.join(output_dir, f"{job_name}.flags")
    write_text(path, flags.FLAGS.flags_into_string() + "".join(f"{a}\n" for a in extra_args))
    logging.info("flags written to %s", path)
