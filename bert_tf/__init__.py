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
    # TensorFlow turns its oneDNN kernels on by itself only on CPUs with AVX-512 VNNI, BF16 or AMX.
    # On an AVX2-only CPU they trained all-MiniLM-L6-v2 about 30% faster than the default Eigen
    # kernels (benchmarks/RESULTS.md); a user's own TF_ENABLE_ONEDNN_OPTS=0 still wins. The
    # variable is read when TensorFlow loads, which for a command line is after this point.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
