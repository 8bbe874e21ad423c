"""bert_tf: BERT end to end in TensorFlow/Keras: data, pretraining, fine-tuning, export, serving."""

import os
import sys

__version__ = "0.1.0"

# `python -m bert_tf.<job>`: Python sets sys.argv[0] to "-m" while it imports this package, before
# the job imports TensorFlow. A command line is quiet by default (see bert_tf.quiet); a library
# import changes nothing.
if sys.argv[:1] == ["-m"]:
    from bert_tf import quiet

    quiet.install()
    # On Linux TensorFlow turns its oneDNN kernels on by itself only where the CPU has AVX-512
    # VNNI or BF16, AVX-VNNI or AMX (DefaultOneDnnPolicy in tensorflow/core/util/port.cc). On an
    # AVX2-only CPU they fine-tuned all-MiniLM-L6-v2 about 30% faster than the default Eigen
    # kernels (benchmarks/RESULTS.md). A user's own TF_ENABLE_ONEDNN_OPTS still wins. TensorFlow
    # reads the variable when it loads, which for a command line comes after this point.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
