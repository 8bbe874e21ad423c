"""The exported tagger: text in, entities with their character spans out.

`serving_default` takes `text` string [b] and returns the entities, padded to the batch's largest
count: `entity_text` and `entity_type` string [b, e] (padding ""), `start` and `end` int32 [b, e]
(character offsets, text[start:end]; padding -1) and `num_entities` int32 [b]. As in training
(bert_tf.tasks.ner), each whitespace-separated word takes the label predicted for its first token,
only the first words whose tokens all fit in max_seq_length - 2 are tagged, and entities are read
as conlleval reads BIO: B-X starts one, I-X continues one of type X (or starts one after O or
another type), any other label is outside.
"""

import tensorflow as tf

from bert_tf.tasks import export_graph


class NerModule(export_graph.ServingModule):
    """Named-entity tagging: text -> entities (text, type, character span), padded to the batch's most."""

    def __init__(self, model, packer, spec, assets):
        super().__init__(assets)
        self.model = model
        self.packer = packer
        prefixes, types = [], []
        for label in spec.labels:
            prefix, _, entity_type = label.partition("-")
            is_tag = prefix in ("B", "I") and entity_type
            prefixes.append({"B": 1, "I": 2}[prefix] if is_tag else 0)  # 0: outside
            types.append(entity_type if is_tag else "")
        type_names = sorted(set(t for t in types if t))
        self.label_prefix = tf.constant(prefixes, tf.int32)
        self.label_type = tf.constant([type_names.index(t) if t else -1 for t in types], tf.int32)
        self.type_names = tf.constant(type_names or [""], tf.string)
        self.serve = export_graph.serving_function(
            self._serve, input_signature=[export_graph.text_spec("text")]
        )

    def _serve(self, text):
        """text [b] -> entity_text, entity_type, start, end [b, e] and num_entities [b]."""
        tokenizer = self.packer.tokenizer
        ids, token_starts, token_ends = tokenizer.tokenize_with_offsets(text)
        # Words: a token starts one where whitespace (a gap in the offsets) precedes it, as the
        # training data's words were whitespace-separated; a word's first token carries its tag.
        position = tf.ragged.range(ids.row_lengths()).flat_values
        starts, ends = token_starts.flat_values, token_ends.flat_values
        previous_end = tf.concat([[-1], ends[:-1]], axis=0)
        is_first = (position == 0) | (starts > previous_end)
        word = tf.cumsum(tf.cast(is_first, tf.int64)) - 1
        num_words = tf.reduce_sum(tf.cast(is_first, tf.int64))
        # As in training (tasks/ner.py), only whole words go in: the first words whose tokens all
        # fit in max_seq_length - 2; the words after them are not tagged.
        word_last = tf.math.unsorted_segment_max(position, word, num_words)
        kept_words = word_last < self.packer.seq_length - 2
        kept_tokens = tf.gather(kept_words, word)
        ids = tf.ragged.boolean_mask(ids, ids.with_flat_values(kept_tokens))
        logits = self.packer.call(
            self.model, self.packer.pack_ids([ids]), token_outputs=("logits",)
        )["logits"]

        word_row = tf.boolean_mask(token_starts.value_rowids(), is_first & kept_tokens)
        word_start = tf.boolean_mask(starts, is_first & kept_tokens)
        word_end = tf.boolean_mask(tf.math.unsorted_segment_max(ends, word, num_words), kept_words)
        word_position = tf.boolean_mask(position, is_first & kept_tokens) + 1  # after [CLS]
        word_logits = tf.gather_nd(logits, tf.stack([word_row, word_position], axis=1))
        label = tf.argmax(word_logits, axis=-1, output_type=tf.int32)
        prefix, entity_type = tf.gather(self.label_prefix, label), tf.gather(self.label_type, label)

        # BIO as conlleval reads it: B-X starts an entity; I-X continues one of type X, or starts one.
        previous_prefix = tf.concat([[0], prefix[:-1]], axis=0)
        previous_type = tf.concat([[-1], entity_type[:-1]], axis=0)
        same_row = tf.concat([[False], word_row[1:] == word_row[:-1]], axis=0)
        continues = (
            (prefix == 2) & same_row & (previous_prefix != 0) & (previous_type == entity_type)
        )
        inside = prefix != 0
        begins = inside & ~continues
        entity = tf.cumsum(tf.cast(begins, tf.int64)) - 1
        num_entities_total = tf.reduce_sum(tf.cast(begins, tf.int64))
        entity_of_word = tf.boolean_mask(entity, inside)
        entity_start = tf.math.unsorted_segment_min(
            tf.boolean_mask(word_start, inside), entity_of_word, num_entities_total
        )
        entity_end = tf.math.unsorted_segment_max(
            tf.boolean_mask(word_end, inside), entity_of_word, num_entities_total
        )
        entity_row = tf.boolean_mask(word_row, begins)
        entity_type_name = tf.gather(self.type_names, tf.boolean_mask(entity_type, begins))
        entity_text = tf.gather(text, entity_row)
        entity_end = export_graph.past_trailing_marks(entity_text, entity_end)
        start_char, end_char = export_graph.char_offsets(entity_text, entity_start, entity_end)
        entity_text = tf.strings.substr(entity_text, entity_start, entity_end - entity_start)

        num_rows = tf.size(text, tf.int64)

        def by_row(values, padding):
            # entity_row ascends within [0, num_rows) by construction; checking it added about 80
            # ops a call to each of the four.
            rows = tf.RaggedTensor.from_value_rowids(
                values, entity_row, nrows=num_rows, validate=False
            )
            return rows.to_tensor(padding)

        return {
            "entity_text": by_row(entity_text, ""),
            "entity_type": by_row(entity_type_name, ""),
            "start": by_row(tf.cast(start_char, tf.int32), -1),
            "end": by_row(tf.cast(end_char, tf.int32), -1),
            "num_entities": tf.math.unsorted_segment_sum(
                tf.ones_like(entity_row, tf.int32), entity_row, num_rows
            ),
        }
