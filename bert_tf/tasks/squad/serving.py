"""The exported SQuAD model: question and context in, the answer, its character span and score out.

`serving_default` takes `question` and `context` string [b] and returns `answer` string [b],
`start` and `end` int32 [b] (character offsets of the answer in the context: context[start:end] in
Python; -1 when there is no answer) and `score` float32 [b] (start logit + end logit of the answer;
for "no answer" the null score).

The original run_squad.py's windowing and span search, inside the graph: the question is cut to
max_query_length tokens, and the context is split into windows every doc_stride tokens
(task.json); the best span over all windows wins (at most 30 tokens, start <= end, inside the
context, each start token scored only in its max-context window), searched exhaustively rather
than among the 20 best starts and ends. A v2 model answers "" when the null score beats the best
span; an empty context has no answer. Windows go through the model a bounded number at a time
(SQUAD_WINDOWS_PER_CHUNK, or length groups), so a megabyte-long context costs time, not memory.
"""

import tensorflow as tf

from bert_tf.runtime import io_utils
from bert_tf.tasks import export_graph

MAX_ANSWER_LENGTH = 30  # run_squad.py's --max_answer_length default
# Windows of an export padded to max_seq_length go through the encoder this many at a time, so a
# huge context costs time, not memory. Length-aware exports run them in groups of similar length
# (export_graph.call_by_length: at most GROUPS_IN_FLIGHT groups of LENGTH_GROUP_ROWS windows at
# once), each padded only to its longest window.
SQUAD_WINDOWS_PER_CHUNK = 32


class SquadModule(export_graph.ServingModule):
    """Extractive question answering: question + context strings -> answer, its character span, its score."""

    def __init__(self, model, packer, spec, assets):
        super().__init__(assets)
        self.model = model
        self.packer = packer
        self.seq_length = packer.seq_length
        self.max_query_length = spec.max_query_length
        self.doc_stride = spec.doc_stride
        self.version_2_with_negative = spec.version_2_with_negative
        if self.seq_length < self.max_query_length + 4:
            raise io_utils.UsageError(
                f"max_seq_length {self.seq_length} leaves no room for the context after max_query_length "
                f"{self.max_query_length} + [CLS] and two [SEP]"
            )
        self.serve = export_graph.serving_function(
            self._serve,
            input_signature=[export_graph.text_spec("question"), export_graph.text_spec("context")],
        )

    def _windows(self, query, doc):
        """run_squad.py's windows: `[CLS] query [SEP] doc[start:start+len] [SEP]`, every doc_stride tokens.

        Returns the encoder inputs [w, s], each window's example [w], and each position's doc
        token index [w, s] (-1 outside the document part), for all windows of all examples.
        """
        seq_length = self.seq_length
        query_lengths, doc_lengths = query.row_lengths(), doc.row_lengths()
        max_tokens = seq_length - query_lengths - 3  # >= 1: checked against max_query_length
        step = tf.minimum(max_tokens, self.doc_stride)
        # The original's loop in closed form: windows start every `step` tokens until one reaches
        # the end; an empty context still gets one (empty) window, so every question gets an answer.
        counts = tf.where(
            doc_lengths <= max_tokens,
            tf.ones_like(doc_lengths),
            (doc_lengths - max_tokens + step - 1) // step + 1,
        )
        example = tf.repeat(tf.range(tf.size(counts, tf.int64)), counts)
        window_start = tf.ragged.range(counts).flat_values * tf.gather(step, example)
        window_length = tf.minimum(
            tf.gather(doc_lengths, example) - window_start, tf.gather(max_tokens, example)
        )

        # Windows are cut at seq_length as in run_squad.py, but padded only as far as the longest
        # window of the batch needs: a short context does not pay for a full window.
        window_tokens = tf.gather(query_lengths, example) + window_length + 3
        width = tf.cast(self.packer.padded_length(window_tokens), tf.int64)
        position = tf.range(width)[tf.newaxis, :]
        q_len = tf.gather(query_lengths, example)[:, tf.newaxis]
        w_len = window_length[:, tf.newaxis]
        doc_begin = q_len + 2  # the first context position
        in_query = (position >= 1) & (position <= q_len)
        in_doc = (position >= doc_begin) & (position < doc_begin + w_len)
        doc_index = tf.where(in_doc, window_start[:, tf.newaxis] + position - doc_begin, -1)

        def gather_tokens(ragged, index, valid):
            # Index into the flat values (with a 0 appended, so an empty batch still gathers).
            flat = tf.concat([ragged.flat_values, [0]], axis=0)
            flat_index = tf.gather(ragged.row_starts(), example)[:, tf.newaxis] + index
            return tf.where(
                valid, tf.gather(flat, tf.where(valid, flat_index, tf.size(flat, tf.int64) - 1)), 0
            )

        ids = gather_tokens(query, position - 1, in_query) + gather_tokens(doc, doc_index, in_doc)
        is_sep = (position == q_len + 1) | (position == doc_begin + w_len)
        ids = tf.where(position == 0, self.packer.cls_id, tf.where(is_sep, self.packer.sep_id, ids))
        length = doc_begin + w_len + 1
        inputs = {
            "input_word_ids": tf.cast(ids, tf.int32),
            "input_mask": tf.cast(position < length, tf.int32),
            "input_type_ids": tf.cast((position >= doc_begin) & (position < length), tf.int32),
        }
        return inputs, example, doc_index, window_start, window_length

    @staticmethod
    def _max_context(doc, example, doc_index, window_start, window_length):
        """Whether each window position is its token's max-context window (run_squad.py's rule) [w, s].

        A token's score in a window is min(left context, right context) + 0.01 * window length;
        the first window with the highest score wins. As an exact integer key: 100 * score,
        then the earlier window.
        """
        in_doc = doc_index >= 0
        offset = doc_index - window_start[:, tf.newaxis]
        length = window_length[:, tf.newaxis]
        context = tf.minimum(offset, length - 1 - offset)
        window_number = tf.range(tf.size(example, tf.int64))[:, tf.newaxis]
        key = (100 * context + length) * (1 << 32) - window_number
        token = (
            tf.gather(doc.row_starts(), example)[:, tf.newaxis] + doc_index
        )  # unique over the batch
        # One spare segment, so the gather below has a row to read when no context has a token.
        num_tokens = tf.size(doc.flat_values, tf.int64) + 1
        best = tf.math.unsorted_segment_max(
            tf.boolean_mask(key, in_doc), tf.boolean_mask(token, in_doc), num_tokens
        )
        return in_doc & (key == tf.gather(best, tf.where(in_doc, token, 0)))

    def _serve(self, question, context):
        """question, context [b] -> answer, start, end, score [b]."""
        tokenizer = self.packer.tokenizer
        query = tokenizer.tokenize(question)[:, : self.max_query_length]
        doc, doc_starts, doc_ends = tokenizer.tokenize_with_offsets(context)
        inputs, example, doc_index, window_start, window_length = self._windows(query, doc)
        logits = ("start_logits", "end_logits")
        if self.packer.dynamic_length:
            outputs = self.packer.call(self.model, inputs, token_outputs=logits)
        else:
            outputs = export_graph.run_in_chunks(
                self.model, inputs, logits, SQUAD_WINDOWS_PER_CHUNK
            )
        start_logits, end_logits = outputs["start_logits"], outputs["end_logits"]

        # Every (start, end) with end - start < MAX_ANSWER_LENGTH, inside the context, start scored
        # in its max-context window: scores [w, s, k] for end = start + k.
        valid_start = self._max_context(doc, example, doc_index, window_start, window_length)
        valid_end = doc_index >= 0
        pad = [[0, 0], [0, MAX_ANSWER_LENGTH - 1]]
        end_padded = tf.pad(end_logits, pad)
        valid_end_padded = tf.pad(valid_end, pad)
        width = tf.shape(end_logits)[1]
        # Position start + k of each start, in one gather each (not a slice per k: fewer ops).
        end_position = tf.range(width)[:, tf.newaxis] + tf.range(MAX_ANSWER_LENGTH)[tf.newaxis]
        ends = tf.gather(end_padded, end_position, axis=1)
        ends_valid = tf.gather(valid_end_padded, end_position, axis=1)
        scores = start_logits[:, :, tf.newaxis] + ends
        scores = tf.where(valid_start[:, :, tf.newaxis] & ends_valid, scores, -float("inf"))
        flat_scores = tf.reshape(scores, [tf.shape(scores)[0], -1])
        window_best = tf.reduce_max(flat_scores, axis=1)
        window_argmax = tf.argmax(flat_scores, axis=1, output_type=tf.int64)

        # The best window of each example: the highest score, the first window on a tie.
        num_examples = tf.size(question, tf.int64)
        best = tf.math.unsorted_segment_max(window_best, example, num_examples)
        window_number = tf.range(tf.size(example, tf.int64))
        candidates = tf.where(
            window_best >= tf.gather(best, example), window_number, tf.size(example, tf.int64)
        )
        winner = tf.math.unsorted_segment_min(candidates, example, num_examples)
        winner = tf.minimum(winner, tf.size(example, tf.int64) - 1)
        start_position = tf.gather(window_argmax, winner) // MAX_ANSWER_LENGTH
        end_position = start_position + tf.gather(window_argmax, winner) % MAX_ANSWER_LENGTH
        first_token = tf.gather_nd(doc_index, tf.stack([winner, start_position], axis=1))
        last_token = tf.gather_nd(doc_index, tf.stack([winner, end_position], axis=1))

        null_scores = start_logits[:, 0] + end_logits[:, 0]
        null = tf.math.unsorted_segment_min(
            null_scores, example, num_examples
        )  # the original keeps the smallest
        # Whether any window has a valid span. Not `best > -inf`: unsorted_segment_max starts from
        # float32's lowest finite value, so `best` is never -inf even when every span is.
        has_answer = (
            tf.math.unsorted_segment_max(
                tf.cast(window_best > -float("inf"), tf.int32), example, num_examples
            )
            > 0
        )
        if self.version_2_with_negative:
            has_answer &= ~(null - best > 0.0)  # null_score_diff_threshold 0.0

        starts = tf.concat([doc_starts.flat_values, [0]], axis=0)
        ends_bytes = tf.concat([doc_ends.flat_values, [0]], axis=0)
        row_starts = doc.row_starts()
        start_byte = tf.gather(
            starts, tf.where(has_answer, row_starts + first_token, tf.size(starts, tf.int64) - 1)
        )
        end_byte = tf.gather(
            ends_bytes, tf.where(has_answer, row_starts + last_token, tf.size(starts, tf.int64) - 1)
        )
        end_byte = export_graph.past_trailing_marks(context, end_byte)
        answer = tf.strings.substr(context, start_byte, end_byte - start_byte)
        start_char, end_char = export_graph.char_offsets(context, start_byte, end_byte)
        return {
            "answer": tf.where(has_answer, answer, ""),
            "start": tf.where(has_answer, tf.cast(start_char, tf.int32), -1),
            "end": tf.where(has_answer, tf.cast(end_char, tf.int32), -1),
            "score": tf.where(has_answer, best, null),
        }
