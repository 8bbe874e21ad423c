"""Instances as data: one TrainingInstance, and the padded arrays of many (InstanceBatch).

instances.py makes them by the original algorithm; example_codec.py serializes them.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass
class TrainingInstance:
    """One `[CLS] A [SEP] B [SEP]` example, masked, with where it came from (for logs and tests)."""

    input_ids: list  # after masking, unpadded
    segment_ids: list
    masked_lm_positions: list  # sorted
    masked_lm_ids: list  # the original ids at those positions
    is_random_next: bool
    document_index: int  # index in the block's (shuffled) documents
    random_document_index: int  # where B came from when is_random_next, else -1
    target_seq_length: int
    num_truncated: int  # tokens trimmed by truncate_seq_pair


@dataclasses.dataclass
class InstanceBatch:
    """Masked instances as padded arrays: what the serializer writes."""

    input_ids: np.ndarray  # int32 [n, max_seq_length], after masking, 0-padded
    lengths: np.ndarray  # [n] tokens of each instance
    a_lengths: np.ndarray  # [n] tokens of `[CLS] A [SEP]`, the segment-0 part
    masked_positions: np.ndarray  # [n, max_predictions_per_seq] ascending, 0-padded
    masked_ids: np.ndarray  # [n, max_predictions_per_seq] the ids before masking, 0-padded
    num_masked: np.ndarray  # [n]
    is_random_next: np.ndarray  # bool [n]
    document_index: np.ndarray  # [n]
    random_document_index: np.ndarray  # [n], -1 for an actual next
    target_seq_length: np.ndarray  # [n]
    num_truncated: np.ndarray  # [n]

    def __len__(self):
        return len(self.lengths)

    def instances(self):
        """The batch as TrainingInstance objects (for tests and logs)."""
        result = []
        for row in range(len(self)):
            length, a_length, masked = (
                int(self.lengths[row]),
                int(self.a_lengths[row]),
                int(self.num_masked[row]),
            )
            result.append(
                TrainingInstance(
                    input_ids=self.input_ids[row, :length].tolist(),
                    segment_ids=[0] * a_length + [1] * (length - a_length),
                    masked_lm_positions=self.masked_positions[row, :masked].tolist(),
                    masked_lm_ids=self.masked_ids[row, :masked].tolist(),
                    is_random_next=bool(self.is_random_next[row]),
                    document_index=int(self.document_index[row]),
                    random_document_index=int(self.random_document_index[row]),
                    target_seq_length=int(self.target_seq_length[row]),
                    num_truncated=int(self.num_truncated[row]),
                )
            )
        return result

    @classmethod
    def from_instances(cls, instances, max_seq_length, max_predictions_per_seq):
        """Pads TrainingInstance objects into a batch; an instance that does not fit is a ValueError."""
        n = len(instances)
        input_ids = np.zeros((n, max_seq_length), np.int64)
        positions = np.zeros((n, max_predictions_per_seq), np.int64)
        labels = np.zeros((n, max_predictions_per_seq), np.int64)
        for row, instance in enumerate(instances):
            length, masked = len(instance.input_ids), len(instance.masked_lm_positions)
            if length > max_seq_length or masked > max_predictions_per_seq:
                raise ValueError(f"instance of {length} tokens / {masked} predictions does not fit")
            input_ids[row, :length] = instance.input_ids
            positions[row, :masked] = instance.masked_lm_positions
            labels[row, :masked] = instance.masked_lm_ids
        column = lambda name: np.array([getattr(i, name) for i in instances], np.int64)
        return cls(
            input_ids=input_ids,
            lengths=np.array([len(i.input_ids) for i in instances], np.int64),
            a_lengths=np.array([i.segment_ids.count(0) for i in instances], np.int64),
            masked_positions=positions,
            masked_ids=labels,
            num_masked=np.array([len(i.masked_lm_positions) for i in instances], np.int64),
            is_random_next=np.array([bool(i.is_random_next) for i in instances], bool),
            document_index=column("document_index"),
            random_document_index=column("random_document_index"),
            target_seq_length=column("target_seq_length"),
            num_truncated=column("num_truncated"),
        )
