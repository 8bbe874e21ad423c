"""pytorch_model.bin (a torch.save zip archive of tensors) read into numpy arrays without torch."""

import pickle
import zipfile

import numpy as np


class _TorchStorage:
    """A storage class named in a pytorch_model.bin pickle: carries the numpy dtype only."""

    def __init__(self, dtype):
        self.dtype = dtype


_TORCH_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
}


def _rebuild_tensor(storage, offset, size, stride, *unused):
    """torch._utils._rebuild_tensor_v2 for numpy: a strided view of the storage, copied."""
    itemsize = storage.dtype.itemsize
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * itemsize for s in stride)
    )
    return np.array(view)


def read_pytorch_bin(path):
    """Reads a torch.save zip archive of tensors into numpy arrays without importing torch.

    The archive holds `<root>/data.pkl` (a pickle whose tensors reference storages by key) and
    `<root>/data/<key>` (raw little-endian storage bytes). The unpickler below resolves only the
    handful of globals a state dict needs and refuses everything else, so no code is executed.
    """
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path}: not a zip-format torch checkpoint (legacy torch<1.6 files are "
            "not supported without torch; re-save it or use model.safetensors)"
        )
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise ValueError(f"{path}: expected one data.pkl, found {pickles}")
        root = pickles[0][: -len("data.pkl")]

        class Unpickler(pickle.Unpickler):
            def find_class(self, module, name):
                if module == "collections" and name == "OrderedDict":
                    import collections

                    return collections.OrderedDict
                if module == "torch._utils" and name == "_rebuild_tensor_v2":
                    return _rebuild_tensor
                if module == "torch" and name in _TORCH_STORAGE_DTYPES:
                    return _TorchStorage(np.dtype(_TORCH_STORAGE_DTYPES[name]))
                if module == "torch" and name == "BFloat16Storage":
                    raise ValueError(f"{path}: bfloat16 tensors are not supported without torch")
                raise pickle.UnpicklingError(f"{path}: refusing to load {module}.{name}")

            def persistent_load(self, pid):
                kind, storage_type, key, _location, _numel = pid
                if kind != "storage":
                    raise pickle.UnpicklingError(f"{path}: unknown persistent id {kind!r}")
                data = archive.read(f"{root}data/{key}")
                return np.frombuffer(data, dtype=storage_type.dtype.newbyteorder("<"))

        with archive.open(pickles[0]) as f:
            state = Unpickler(f).load()
    if not isinstance(state, dict):
        raise ValueError(f"{path}: expected a state dict, got {type(state).__name__}")
    return {name: value for name, value in state.items() if isinstance(value, np.ndarray)}
