"""A tf.cond that runs only the branch it takes, for branches of very different sizes.

Inside a tf.function, TensorFlow lowers each tf.cond to Switch and Merge ops in the enclosing
graph, and the executor then visits every op of the branch not taken, passing dead tensors. That
is cheap per op, but the serving graphs have branches of hundreds to thousands of ops that a
typical request never takes (the tokenizer's code-point pipeline for non-ASCII text), and
visiting them costs more than a function call (benchmarks/RESULTS.md, "Inference: what each
export choice buys"). An If op left unlowered runs as one kernel that calls the taken branch as a
function.
"""

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

# The attribute TensorFlow's cond_v2 sets to have a cond lowered to Switch/Merge.
_LOWERING_ATTR = "_lower_using_switch_merge"


def cond_as_call(pred, true_fn, false_fn):
    """tf.cond(pred, true_fn, false_fn), kept an If op that runs the taken branch alone.

    Only for conds that are never differentiated (the If op's gradient needs the lowered form's
    intermediates), and whose branches run on one device: an unlowered If runs its branch as a
    function on the If's own device, where lowering places each op on its own. Eagerly it is
    tf.cond, which runs one branch anyway.
    """
    if tf.executing_eagerly():
        return tf.cond(pred, true_fn, false_fn)
    graph = tf.compat.v1.get_default_graph()
    known = len(graph.get_operations())
    outputs = tf.cond(pred, true_fn, false_fn)
    # The branches' ops live in their own graphs, so the cond's If is the one new If op here.
    new_ifs = [op for op in graph.get_operations()[known:] if op.type in ("If", "StatelessIf")]
    if len(new_ifs) != 1:  # v1 control flow builds Switch/Merge, which cannot run unlowered
        raise ValueError(f"cond_as_call needs v2 control flow: the cond made {len(new_ifs)} If ops")
    (if_op,) = new_ifs
    if_op._set_attr(_LOWERING_ATTR, attr_value_pb2.AttrValue(b=False))  # pylint: disable=protected-access
    return outputs
