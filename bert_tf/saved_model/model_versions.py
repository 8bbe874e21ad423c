"""TF Serving's model layout, BASE/<integer version>/: export writes it, the server reads it."""

import os

import tensorflow as tf


def list_versions(base_path):
    """{version: directory name} for the numeric directories under base_path ("00123" is 123).

    Other names are ignored, as TF Serving does.
    """
    try:
        names = tf.io.gfile.listdir(base_path)
    except tf.errors.NotFoundError:
        return {}
    versions = {}
    for name in sorted(names):
        name = name.rstrip("/")
        if name.isdigit() and name.isascii() and tf.io.gfile.isdir(os.path.join(base_path, name)):
            versions.setdefault(int(name), name)
    return versions
