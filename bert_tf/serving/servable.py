"""A loaded version of a model: its signatures, warm-up, and calls in bounded chunks."""

import dataclasses
import json
import os
import threading
import time

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the tokenizer ops exported graphs use)
from absl import logging
from google.protobuf import text_format
from tensorflow.core.protobuf import saved_model_pb2

from bert_tf.saved_model import warmup
from bert_tf.serving import batching, errors, long_texts, methods
from bert_tf.serving.methods import DEFAULT_SIGNATURE, PREDICT_METHOD


@dataclasses.dataclass
class Signature:
    """One signature of a loaded SavedModel: its function, method and tensor specs."""

    name: str
    method_name: str
    function: object
    inputs: dict  # input name -> tf.TensorSpec
    outputs: dict  # output name -> tf.TensorSpec
    # input name -> np.ndarray: the SignatureDef's defaults, which a request may leave out.
    defaults: dict = dataclasses.field(default_factory=dict)
    # A loaded function's first call instantiates and optimizes its graph (seconds). Concurrent
    # first calls would each do that work, so the first call runs alone under this lock.
    first_call_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    called: bool = False


class Servable:
    """One loaded version of a model: its signatures and their TF Serving metadata."""

    def __init__(self, name, version, path, warmup=True):
        self.name = name
        self.version = version
        self.path = path
        self.loaded = tf.saved_model.load(path)
        meta_graph = _serving_meta_graph(path)
        self.signature_defs = dict(meta_graph.signature_def)
        self.signatures = {}
        for key, function in self.loaded.signatures.items():
            inputs = function.structured_input_signature[1]
            outputs = function.structured_outputs
            if not isinstance(outputs, dict):
                outputs = {"output_0": outputs}
            method = (
                meta_graph.signature_def[key].method_name if key in meta_graph.signature_def else ""
            )
            signature_def = meta_graph.signature_def.get(key)
            defaults = (
                {name: tf.make_ndarray(proto) for name, proto in signature_def.defaults.items()}
                if signature_def is not None
                else {}
            )
            self.signatures[key] = Signature(
                key, method or PREDICT_METHOD, function, dict(inputs), dict(outputs), defaults
            )
        self.words_to_keep = _words_to_keep(path)
        if self.words_to_keep:
            # Here rather than in the first long request, which would hold the GIL for it.
            long_texts.prepare()
        self._batchers = {}
        self._batchers_lock = threading.Lock()
        self.closed = False
        if warmup:
            self._warm_up()

    def _replay(self, request):
        """Runs one warm-up request (a warmup.Request) as the server would run it; a ServingError
        says why it failed."""
        # Its own requests: TF Serving's warm-up has no answer to bound.
        options = methods.RunOptions(max_response_elements=np.iinfo(np.int64).max)
        if request.kind == "predict_log":
            signature = methods.predict_signature(self, request.signature_name)
            methods.predict(self, signature, request.inputs, options)
        elif request.kind == "classify_log":
            methods.classify(self, request.signature_name, request.examples, options)
        elif request.kind == "regress_log":
            methods.regress(self, request.signature_name, request.examples, options)
        else:
            methods.check_multi_inference(self, request.tasks)
            methods.multi_inference(self, request.tasks, request.examples, options)

    def _warm_up(self):
        """Replays the version's warm-up requests, then calls each signature they left out once on a
        one-row dummy batch, before the version serves.

        A loaded function's first call instantiates and optimizes its graph, which takes seconds;
        doing it here keeps that out of the first requests (and out of a version switch). The
        warm-up file (assets.extra/tf_serving_warmup_requests, as TF Serving reads it) has requests
        of lengths across the export's range; a request of it that fails fails the load, as in TF
        Serving. A dummy input the graph rejects (an empty tf.Example, say) still pays the
        instantiation, so errors of the dummy calls are ignored.
        """
        start = time.perf_counter()
        requests = warmup.read_requests(self.path)
        for request in requests:
            try:
                self._replay(request)
            except errors.ServingError as e:
                raise ValueError(
                    f"{warmup.requests_path(self.path)}: warm-up request {request.record}: "
                    f"{e.message}"
                ) from None
        replayed = {
            request.signature_name or DEFAULT_SIGNATURE
            for request in requests
            if request.kind != "multi_inference_log"
        }
        replayed |= {
            task.model_spec.signature_name or DEFAULT_SIGNATURE
            for request in requests
            for task in request.tasks
        }
        for signature in self.signatures.values():
            if signature.name in replayed:
                continue
            dummies = {}
            for name, spec in signature.inputs.items():
                dims = spec.shape.as_list() if spec.shape.rank is not None else [None]
                shape = [1 if size is None else size for size in dims]
                if spec.dtype == tf.string:
                    dummies[name] = np.full(shape, b"", dtype=object)
                else:
                    dummies[name] = np.zeros(shape, dtype=spec.dtype.as_numpy_dtype)
            try:
                call_signature(signature, dummies)
            except Exception:  # Only the graph's instantiation matters here.
                pass
        logging.info(
            "model %s version %d: warmed up %d signatures (%d warm-up records) in %.1fs",
            self.name,
            self.version,
            len(self.signatures),
            len(requests),
            time.perf_counter() - start,
        )

    def run(self, signature, tensors, options, kept=None):
        """Runs `signature` on {input name: np.ndarray} as `options` (methods.RunOptions) say;
        returns {output name: np.ndarray}, only those named in `kept` when given.

        A request of more than options.max_batch_size rows runs as chunks of at most that many,
        one after the other, so its memory is bounded whatever its size (one call on 10,000 rows
        of BERT-base needs tens of GB), and other requests run between its chunks: with
        batching, each chunk queues behind the requests that came while the previous one ran.
        Before each chunk after the first, `options.is_active()` (when given) says whether the
        client still waits: a cancelled or timed-out request stops there, CANCELLED. An answer
        that would hold more than options.max_response_elements elements (of the outputs kept)
        stops as soon as the rows run so far project past it, RESOURCE_EXHAUSTED.
        """
        if self.words_to_keep and signature.method_name == PREDICT_METHOD:
            tensors = {
                name: _cut_texts(value, self.words_to_keep) if value.dtype == object else value
                for name, value in tensors.items()
            }
        batching_options, max_rows = options.batching_options, options.max_batch_size
        rows = _rows(signature, tensors)
        if batching_options is not None and batching.can_merge(signature):
            # A chunk is one task of the batching queue, which takes at most its max_batch_size.
            max_rows = min(
                max_rows or batching_options.max_batch_size, batching_options.max_batch_size
            )
        answer = _AnswerSize(options.max_response_elements, kept, rows)
        if max_rows is None or rows is None or rows <= max_rows:
            return answer.kept(self._run_once(signature, tensors, batching_options))
        chunks = []
        try:
            for start in range(0, rows, max_rows):
                if start and options.is_active is not None and not options.is_active():
                    raise errors.ServingError(
                        "CANCELLED",
                        "the request was cancelled, its deadline passed or the server is stopping; "
                        f"stopped after {start} "
                        f"of its {rows} rows",
                    )
                part = _take(tensors, start, start + max_rows)
                try:
                    outputs = self._run_once(signature, part, batching_options)
                except (
                    errors.ServingError
                ) as e:  # Its row numbers count from the chunk's first row.
                    raise errors.ServingError(
                        e.code,
                        f"{e.message} (in rows {start} to "
                        f"{start + _count(part) - 1} of the "
                        f"request, which runs {max_rows} rows at a time)",
                    ) from e
                if not _one_per_row(outputs, _count(part)):
                    raise _Unchunkable(f"outputs of {signature.name!r} are not one per row")
                answer.add(outputs, _count(part))
                chunks.append((part, outputs))
            chunks = self._even_out(signature, chunks, batching_options)
        except _Unchunkable as e:
            logging.warning(
                "model %s version %d: %s; running %d rows in one call",
                self.name,
                self.version,
                e,
                rows,
            )
            return answer.kept(self._run_once(signature, tensors, batching_options))
        return answer.kept(
            {
                name: np.concatenate([outputs[name] for _, outputs in chunks])
                for name in chunks[0][1]
            }
        )

    def _even_out(self, signature, chunks, batching_options):
        """Makes every chunk's outputs as long as the longest chunk's, exactly as one call would.

        Some outputs are padded to the longest row of their call (NER's entities per text), so a
        chunk without such a row comes out shorter, padded with whatever the model pads with. Such
        a chunk runs again together with the rows that reach the longest sizes (found by
        bisection), which the model then pads as one call on the whole request would; those extra
        rows' outputs are dropped. Chunks of equal shapes are returned as they are.
        """
        names = list(chunks[0][1])
        target = {
            name: tuple(max(sizes) for sizes in zip(*(out[name].shape[1:] for _, out in chunks)))
            for name in names
        }
        short = [
            i
            for i, (_, out) in enumerate(chunks)
            if any(out[name].shape[1:] != target[name] for name in names)
        ]
        if not short:
            return chunks
        needed = {
            (name, axis)
            for name in names
            for axis, size in enumerate(target[name])
            if any(out[name].shape[1 + axis] < size for _, out in chunks)
        }
        witnesses, reached = [], set()
        for name, axis in sorted(needed):
            if (name, axis) in reached:
                continue
            part = next(
                part for part, out in chunks if out[name].shape[1 + axis] == target[name][axis]
            )
            row = self._row_reaching(
                signature, part, name, axis, target[name][axis], batching_options
            )
            outputs = self._run_once(signature, row, batching_options)
            reached |= {(n, a) for n, a in needed if outputs[n].shape[1 + a] == target[n][a]}
            if (name, axis) not in reached:
                raise _Unchunkable(
                    f"output {name!r} of {signature.name!r} depends on more than each row"
                )
            witnesses.append(row)
        extra = _join(witnesses)
        for i in short:
            part, _ = chunks[i]
            rows = _count(part)
            outputs = self._run_once(signature, _join([part, extra]), batching_options)
            outputs = {name: value[:rows] for name, value in outputs.items()}
            if any(outputs[name].shape[1:] != target[name] for name in names):
                raise _Unchunkable(f"outputs of {signature.name!r} depend on more than each row")
            chunks[i] = (part, outputs)
        return chunks

    def _row_reaching(self, signature, part, name, axis, size, batching_options):
        """One row of `part` whose output `name` alone is `size` long along `axis`, by bisection.

        A call's output is as long as its longest row's, so of two halves of rows that reach it,
        one does.
        """
        low, high = 0, _count(part)
        while high - low > 1:
            middle = (low + high) // 2
            outputs = self._run_once(signature, _take(part, low, middle), batching_options)
            if outputs[name].shape[1 + axis] >= size:
                high = middle
            else:
                low = middle
        return _take(part, low, low + 1)

    def _run_once(self, signature, tensors, batching_options):
        """One call of the signature: through its batcher when batching applies, else directly."""
        if batching_options is not None and batching.can_merge(signature):
            with self._batchers_lock:
                batcher = self._batchers.get(signature.name)
                if batcher is None and not self.closed:
                    batcher = self._batchers[signature.name] = batching.Batcher(
                        signature,
                        batching_options,
                        call_signature,
                        f"batcher-{self.name}-{self.version}-{signature.name}",
                    )
            if batcher is not None:
                return batcher.run(tensors)
        return call_signature(signature, tensors)

    def close(self):
        """Stops this version's batchers once their queued requests are done; later calls run unbatched."""
        with self._batchers_lock:
            self.closed = True
            batchers, self._batchers = list(self._batchers.values()), {}
        for batcher in batchers:
            batcher.close()


# Exports whose predict signatures cut every text to max_seq_length tokens, and read nothing
# else of it: their texts can be cut before tokenization (the task.json "kind").
_CUT_KINDS = ("classifier", "regressor", "multiple_choice")
# Texts shorter than this are not looked at: cutting them saves nothing worth the scan.
_CUT_FROM_BYTES = 64 << 10


def _words_to_keep(path):
    """For an export of a _CUT_KINDS task, the words (long_texts.prefix_keeping_tokens) that
    hold every token its texts can keep: max_position_embeddings, which no export's sequence
    length exceeds (`export --max_seq_length` may differ from the task.json it copies); else
    None (nothing is cut)."""
    assets = os.path.join(path, "assets")
    try:
        with tf.io.gfile.GFile(os.path.join(assets, "task.json")) as f:
            kind = json.load(f).get("kind")
        if kind not in _CUT_KINDS:
            return None
        with tf.io.gfile.GFile(os.path.join(assets, "bert_config.json")) as f:
            return int(json.load(f)["max_position_embeddings"])
    except (tf.errors.OpError, ValueError, KeyError, TypeError, AttributeError):
        return None  # not ours to judge: the export serves as it is, uncut


def _cut_texts(texts, words):
    """`texts` (an object array of UTF-8 bytes) with each long one cut after `words` words, which
    gives the same tokens: a 30 MB text would otherwise cost the tokenizer ops about 24 times its
    size in memory. Invalid UTF-8 is left whole, for the model to refuse as before."""
    flat = texts.reshape(-1)
    cut = None
    for index, text in enumerate(flat):
        if not isinstance(text, bytes) or len(text) < _CUT_FROM_BYTES:
            continue
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            continue
        prefix = long_texts.prefix_keeping_tokens(decoded, words)
        if len(prefix) < len(decoded):
            if cut is None:
                cut = flat.copy()
            cut[index] = prefix.encode("utf-8")
    return texts if cut is None else cut.reshape(texts.shape)


class _AnswerSize:
    """A request's answer against the most elements a reply may carry, counting the outputs kept."""

    def __init__(self, limit, kept, rows):
        self.limit, self.kept_names, self.rows = limit, kept, rows
        self.elements = self.rows_run = 0

    def _count(self, outputs):
        names = self.kept_names if self.kept_names is not None else outputs
        return sum(int(np.size(outputs[name])) for name in names)

    def add(self, outputs, rows):
        """Counts a chunk's outputs; past the limit, projected over every row, the request stops."""
        self.elements += self._count(outputs)
        self.rows_run += rows
        projected = self.elements * self.rows // self.rows_run
        if projected > self.limit:
            self._refuse(
                f"about {projected:,} (from its first {self.rows_run} rows of {self.rows})"
            )

    def kept(self, outputs):
        """The outputs kept, once the whole answer is within the limit."""
        elements = self._count(outputs)
        if elements > self.limit:
            self._refuse(f"{elements:,}")
        if self.kept_names is None:
            return outputs
        return {name: outputs[name] for name in self.kept_names}

    def _refuse(self, elements):
        raise errors.ServingError(
            "RESOURCE_EXHAUSTED",
            f"the answer would hold {elements} elements; this server answers at most "
            f"{self.limit:,} a request (--max_response_elements). Ask for fewer rows, or fewer "
            "outputs (gRPC's output_filter)",
        )


class _Unchunkable(Exception):
    """A signature's outputs cannot be split into rows and joined again (say why)."""


def _take(tensors, start, stop):
    """Rows start..stop of a request's inputs; a scalar setting (top_k) goes to every part whole."""
    return {n: v if np.ndim(v) == 0 else v[start:stop] for n, v in tensors.items()}


def _join(parts):
    """Parts of a request's inputs joined row-wise (a scalar setting taken from the first)."""
    first = parts[0]
    return {
        n: v if np.ndim(v) == 0 else np.concatenate([part[n] for part in parts])
        for n, v in first.items()
    }


def _count(tensors):
    """The rows of a request's inputs (of its first non-scalar one)."""
    return next(len(v) for v in tensors.values() if np.ndim(v) >= 1)


def _rows(signature, tensors):
    """The rows of a request that can run in chunks: every input (but scalar settings, such as
    fill_mask's top_k, which every chunk gets whole) and output batch-major; else None."""
    specs = [s for s in signature.inputs.values() if s.shape.rank != 0]
    specs += list(signature.outputs.values())
    if not specs or not all(
        s.shape.rank is not None and s.shape.rank >= 1 and s.shape[0] is None for s in specs
    ):
        return None
    rows = {len(value) for value in tensors.values() if np.ndim(value) >= 1}
    return rows.pop() if len(rows) == 1 else None


def _one_per_row(outputs, rows):
    """Whether every output has `rows` rows (and so can be joined with other chunks' along dim 0)."""
    return all(np.ndim(value) >= 1 and np.shape(value)[0] == rows for value in outputs.values())


def call_signature(signature, arrays):
    """Calls a signature's function on numpy inputs and returns numpy outputs; maps TF errors to HTTP."""
    if not signature.called:
        with signature.first_call_lock:
            if not signature.called:
                try:
                    return _call(signature, arrays)
                finally:
                    signature.called = True
    return _call(signature, arrays)


def _call(signature, arrays):
    """call_signature without the first-call lock."""
    try:
        tensors = {
            name: tf.constant(value, dtype=signature.inputs[name].dtype)
            for name, value in arrays.items()
        }
        outputs = signature.function(**tensors)
    except tf.errors.OpError as e:
        raise errors.from_tf_error(e) from e
    except UnicodeDecodeError as e:  # Before ValueError, its base class.
        raise errors.from_undecodable_tf_error(e) from e
    except (ValueError, TypeError) as e:
        # The function refused the inputs' structure, dtype or shape before running.
        raise errors.invalid_argument(
            f"inputs do not match signature {signature.name!r}: {str(e).splitlines()[0][:500]}"
        ) from e
    if not isinstance(outputs, dict):
        outputs = {"output_0": outputs}
    return {name: value.numpy() for name, value in outputs.items()}


def _serving_meta_graph(path):
    """The MetaGraphDef tagged "serve" in saved_model.pb (or .pbtxt): the one TF Serving loads."""
    proto = saved_model_pb2.SavedModel()
    pb_path = os.path.join(path, "saved_model.pb")
    if tf.io.gfile.exists(pb_path):
        with tf.io.gfile.GFile(pb_path, "rb") as f:
            proto.ParseFromString(f.read())
    else:
        pb_path = os.path.join(path, "saved_model.pbtxt")
        with tf.io.gfile.GFile(pb_path, "r") as f:
            text_format.Parse(f.read(), proto)
    for meta_graph in proto.meta_graphs:
        if "serve" in meta_graph.meta_info_def.tags:
            return meta_graph
    raise ValueError(f"{pb_path}: no MetaGraphDef tagged 'serve'")
