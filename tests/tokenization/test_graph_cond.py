"""cond_as_call: tf.cond's values, with the If op kept whole (not lowered to Switch/Merge)."""

import numpy as np
import tensorflow as tf

from bert_tf.tokenization.graph_cond import _LOWERING_ATTR, cond_as_call
from bert_tf.tokenization.graph_tokenizer import GraphTokenizer


def lowering_of_ifs(graph):
    """The _lower_using_switch_merge attribute of each If op of `graph` (None where unset)."""
    found = []
    for op in graph.get_operations():
        if op.type in ("If", "StatelessIf"):
            try:
                found.append(op.get_attr(_LOWERING_ATTR))
            except ValueError:
                found.append(None)
    return found


def test_values_equal_tf_cond_on_both_branches():
    def branches(x):
        return (
            lambda: {"sum": tf.reduce_sum(x), "rows": tf.shape(x)[0]},
            lambda: {"sum": -tf.reduce_max(x), "rows": tf.constant(-1)},
        )

    @tf.function(autograph=False)
    def ours(x):
        return cond_as_call(tf.size(x) > 3, *branches(x))

    @tf.function(autograph=False)
    def reference(x):
        return tf.cond(tf.size(x) > 3, *branches(x))

    for value in ([[1.0, 2.0], [3.0, 4.0]], [[5.0, -1.0]]):
        got, want = ours(tf.constant(value)), reference(tf.constant(value))
        assert {k: v.numpy().tolist() for k, v in got.items()} == {
            k: v.numpy().tolist() for k, v in want.items()
        }
    spec = tf.TensorSpec([None, 2], tf.float32)
    assert lowering_of_ifs(ours.get_concrete_function(spec).graph) == [False]
    assert lowering_of_ifs(reference.get_concrete_function(spec).graph) == [True]


def test_a_nested_cond_inside_is_lowered_as_usual():
    @tf.function(autograph=False)
    def f(x):
        return cond_as_call(
            x > 0, lambda: tf.cond(x > 10, lambda: x * 3, lambda: x * 2), lambda: -x
        )

    assert [f(tf.constant(v)).numpy() for v in (20, 5, -4)] == [60, 10, 4]
    graph = f.get_concrete_function(tf.TensorSpec([], tf.int32)).graph
    assert lowering_of_ifs(graph) == [False]
    inside = [
        node.attr[_LOWERING_ATTR].b
        for function in graph.as_graph_def().library.function
        for node in function.node_def
        if node.op in ("If", "StatelessIf")
    ]
    assert inside == [True]


def test_eagerly_it_is_tf_cond():
    assert cond_as_call(tf.constant(True), lambda: tf.constant(1), lambda: tf.constant(2)) == 1


def test_the_tokenizers_ascii_test_runs_one_branch(tmp_path):
    """Plain-ASCII and other batches each take their own path through one unlowered If."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "cafe", "the", "."]) + "\n")
    tokenizer = GraphTokenizer(str(vocab), do_lower_case=True)
    graph = tokenizer.tokenize.get_concrete_function().graph
    assert False in lowering_of_ifs(graph)
    ids = tokenizer.tokenize(tf.constant(["The cafe.", "the Café ."]))
    np.testing.assert_array_equal(ids.to_list(), [[5, 4, 6], [5, 4, 6]])
