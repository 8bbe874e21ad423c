"""The fine-tuning tasks, one folder a task, and what every task shares.

The package, read downward:

    classification/ squad/ ner/ multiple_choice/
                    one folder per task: data.py (files -> examples -> features, and the record
                    schema), model.py (the head and its loss), metrics / postprocess, serving.py
                    (the exported graph and its signatures), job.py (the task's side of a
                    fine-tuning run, which bert_tf.training.finetuning drives)
    registry.py     one entry per task kind (task.json's `kind`): model, loss, record schema, and
                    the name of its serving module
    models.py       task.json (TaskSpec), building and loading task models from a model directory
    heads.py        what every head shares: output layers, the HeadObjective loss base
    export_graph.py what every exported graph shares: text packing to the batch's length, assets,
                    calls by length groups
    packing.py      segments -> features (`pack_segments`, `pack_inputs`), their records and datasets
    data_files.py   reading a task's files: required files and examples, lines, text pairs, errors
    feature_extraction.py
                    the frozen encoder's chosen layers per token, as JSON lines (the feature-based
                    approach outside a task: python -m bert_tf.extract_features)
    demo_datasets.py
                    the demo's toy tasks in GLUE SST-2's, SWAG's and CoNLL-2003's file layouts
                    (python -m bert_tf.demo_data)

A task's data.py turns its files into examples, its examples into features with `pack_segments`
(Python, FullTokenizer ids) or `pack_inputs` (TensorFlow ops, for GraphTokenizer ids inside a
graph); bert_tf.training.finetuning writes them with `write_records` and reads them back with
`records_dataset`. Both packers follow the original BERT layout and truncation rule:

    [CLS] a [SEP] b [SEP]     segment ids 0 for [CLS], a and the first [SEP]; 1 for b and its [SEP]

and, while the segments are too long, one token is removed from the end of the longest segment
(the last of the longest on a tie; for two segments that is the original `_truncate_seq_pair`).
Padding is id 0 with mask 0 and segment id 0.

Sentence (pair) tasks pass `drop_empty_b=True`: a pair whose b has no tokens (an empty string, or
text such as "\u200b" that tokenizes to nothing) is packed as the single sentence `[CLS] a [SEP]`,
with a's budget max_seq_length - 2, as the original convert_single_example's `if tokens_b:` has
it. SQuAD keeps `[CLS] query [SEP] doc [SEP]` whatever the query holds, as run_squad.py does.
"""
