"""Masked-LM + next-sentence pretraining data: documents -> instances -> tf.train.Example TFRecords.

The records are the original BERT `create_pretraining_data.py`'s, made by its algorithm rule for
rule; what differs is that the work streams, runs in parallel and stays deterministic. The modules,
in the order the data flows through them:

  documents.py         reading documents from text files (byte ranges, long lines, pieces of long
                       documents, the original's blank-line rule) or tfds, and tokenizing them
                       into `Block`s: flat id arrays with sentence and document offsets
  tokenized_corpus.py  every unit's tokens on disk, and the original's random-next draw over all
                       of it
  instances.py         the instance algorithm, to be read beside the original script: document
                       shuffle, dupe_factor passes, A and B, truncation, masking, instance shuffle
  instance_data.py     an instance as data, and a batch of them as padded arrays
  schema.py            the record format, declared once (also read by bert_tf.pretraining.input_pipeline)
  example_codec.py     the tf.train.Example encoder in NumPy, and a small decoder for logs
  inspection.py        records decoded back to text (inspect_records, the playground)
  tfrecord.py          TFRecord framing, the part writer
  plan.py              work units, output shards, settings, manifests and resume; an output file
                       assembled from its parts
  worker.py            what a worker process does with a unit: tokenize it, then build its records
  job.py               `run(PretrainingDataArgs)`: plan, worker processes, output files,
                       summary.json
  beam.py              the same units as an Apache Beam pipeline (`PretrainingDataArgs.runner`)
  files.py             local paths through os, remote ones (gs://) through Beam's FileSystems
  corpus.py            the embedded default corpus: the docstrings of installed packages as prose

How the corpus is cut (the streaming design)
  The original reads the whole corpus, shuffles its documents, runs `dupe_factor` passes and
  shuffles every instance, so it holds corpus x dupe_factor instances in memory. Here the input is
  cut into *work units*, contiguous byte ranges of about 1 MiB of the concatenated input files, and
  a document belongs to the unit that holds its position. Each unit's documents are grouped into
  *blocks* of about 1 MiB of text, and on each block the original algorithm runs its document
  shuffle, `dupe_factor` passes with fresh masks and instance shuffle. "Random next" segments,
  though, come from the whole input, as in the original. A block's instances are masked and
  serialized a few thousand at a time, so memory does not grow with the corpus. Every block has its
  own random generators, seeded from (random_seed, unit index, block index), so a block's records
  depend on nothing but the input and the settings: any number of worker processes gives
  byte-identical files.

No module here imports TensorFlow at import time: the worker processes never load it (~3 s of
start-up and ~0.8 GB of RSS each). Only `schema.feature_spec` (for readers) and the tfds reader
import it, when called.
"""
