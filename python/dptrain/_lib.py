"""libdptrain.so through ctypes: finding it, the prototypes, errors and arrays.

The library is found, in this order, through
  1. $DPTRAIN_LIB: the library file itself, or the folder that holds it;
  2. the build tree this package sits in: <repo>/build/libdptrain.so (python/dptrain/ -> ../../build);
  3. the folder `make install` recorded beside the package (_install.py: LIBDIR), when the package
     was installed by `make install`;
  4. the installed library by its soname, libdptrain.so.0, where the loader finds it (ldconfig's
     cache, LD_LIBRARY_PATH), as ctypes.util.find_library("dptrain") names it.
"""
import ctypes
import ctypes.util
import os

import numpy as np

SONAME = "libdptrain.so.0"

# include/dp/common.h's codes
DP_EINVAL = -1
DP_ENOENT = -6


class Error(Exception):
    """An error of the library: its message (dp_errmsg) and code (a negative DP_E* value)."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class InvalidArgumentError(Error, ValueError):
    """The input was wrong (DP_EINVAL): a bad option value, array, shape or label."""


class NotFoundError(Error, FileNotFoundError):
    """A file the run needs is missing (DP_ENOENT): a model file, a checkpoint, data."""


def _candidates():
    env = os.environ.get("DPTRAIN_LIB")
    if env:
        yield os.path.join(env, "libdptrain.so") if os.path.isdir(env) else env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "..", "..", "build", "libdptrain.so")
    try:
        from . import _install  # written by `make install`
        if getattr(_install, "LIBDIR", None):
            yield os.path.join(_install.LIBDIR, SONAME)
    except ImportError:
        pass
    yield SONAME
    found = ctypes.util.find_library("dptrain")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            # RTLD_GLOBAL: Open MPI's plugins, which the library may load, look for libmpi's symbols
            # in the global scope
            return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError("dptrain: libdptrain.so not found; tried " + "; ".join(tried) +
                      ". Build it (make), install it (make install), or point DPTRAIN_LIB at it.")


lib, path = _load()

c_int, c_int64, c_uint64, c_double, c_char_p, c_void_p, c_size_t = (
    ctypes.c_int, ctypes.c_int64, ctypes.c_uint64, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p,
    ctypes.c_size_t)


class DpArray(ctypes.Structure):
    """struct dp_array (include/dp/data.h)."""
    _fields_ = [("data", c_void_p), ("dtype", c_int), ("ndim", c_int), ("shape", c_int64 * 8)]


class DpTrainOption(ctypes.Structure):
    """struct dp_train_option (include/dp/train.h)."""
    _fields_ = [("name", c_char_p), ("arg", c_char_p), ("group", c_char_p), ("help", c_char_p),
                ("optional", c_int)]


EVENT_FN = ctypes.CFUNCTYPE(None, c_void_p, c_void_p)

_protos = {
    "dp_errmsg": (c_char_p, []),
    "dp_strerror": (c_char_p, [c_int]),
    "dp_cpus_allowed": (c_int, []),
    "dp_train_params_new": (c_void_p, []),
    "dp_train_params_free": (None, [c_void_p]),
    "dp_train_option_set": (c_int, [c_void_p, c_char_p, c_char_p]),
    "dp_train_option_check": (c_int, [c_void_p, c_char_p]),
    "dp_train_option_name": (c_char_p, [c_int]),
    "dp_train_option_find": (ctypes.POINTER(DpTrainOption), [c_char_p]),
    "dp_train_params_set_array": (c_int, [c_void_p, c_char_p, ctypes.POINTER(DpArray)]),
    "dp_train_params_set_hooks": (None, [c_void_p, EVENT_FN, c_void_p, c_void_p, c_void_p]),
    "dp_train_params_from_ckpt": (c_int, [c_void_p, c_char_p, ctypes.POINTER(c_int64), ctypes.POINTER(c_int64 * 3),
                                          ctypes.POINTER(c_int64), ctypes.POINTER(c_int)]),
    "dp_event_json": (c_int, [c_void_p, c_char_p, c_size_t]),
    "dp_trainer_init": (c_int, [ctypes.POINTER(c_void_p), c_void_p]),
    "dp_trainer_run": (c_int, [c_void_p]),
    "dp_trainer_stopped": (c_int64, [c_void_p]),
    "dp_trainer_free": (None, [c_void_p]),
    "dp_trainer_save": (c_int, [c_void_p, c_char_p]),
    "dp_trainer_param_hash": (c_uint64, [c_void_p]),
    "dp_trainer_note": (c_char_p, [c_void_p]),
    "dp_trainer_data_note": (c_char_p, [c_void_p]),
    "dp_trainer_predict": (c_int, [c_void_p, ctypes.POINTER(DpArray), ctypes.POINTER(ctypes.c_float), c_int64]),
    "dp_trainer_outputs": (c_int64, [c_void_p]),
    "dp_trainer_regression": (c_int, [c_void_p]),
    "dp_trainer_evaluate_arrays": (c_int, [c_void_p, ctypes.POINTER(DpArray), ctypes.POINTER(DpArray),
                                           ctypes.POINTER(c_double), ctypes.POINTER(c_double)]),
    "dp_trainer_export": (c_int, [c_void_p, c_char_p]),
    "dp_trainer_param_count": (c_int, [c_void_p]),
    "dp_trainer_param_info": (c_int, [c_void_p, c_int, ctypes.POINTER(c_char_p), ctypes.POINTER(c_int),
                                      ctypes.POINTER(c_int64 * 4), ctypes.POINTER(ctypes.POINTER(ctypes.c_float)),
                                      ctypes.POINTER(c_int)]),
    "dp_comm_backend_available": (c_int, [c_char_p]),
    "dp_comm_init": (c_int, [ctypes.POINTER(c_void_p), c_char_p, c_void_p]),
    "dp_comm_rank": (c_int, [c_void_p]),
    "dp_comm_world": (c_int, [c_void_p]),
    "dp_comm_free": (None, [c_void_p]),
    "dp_comm_kill_job": (c_int, [c_void_p, c_int]),
}
for _name, (_res, _args) in _protos.items():
    _f = getattr(lib, _name)
    _f.restype, _f.argtypes = _res, _args


def errmsg():
    """The library's last message on this thread (dp_errmsg: the buffer is per thread)."""
    m = lib.dp_errmsg()
    return m.decode("utf-8", "replace") if m else ""


def error(rc, message=None):
    """The exception for status rc: InvalidArgumentError (also a ValueError) for DP_EINVAL."""
    if message is None:
        message = errmsg()
    if not message:
        message = (lib.dp_strerror(rc) or b"error").decode()
    cls = InvalidArgumentError if rc == DP_EINVAL else NotFoundError if rc == DP_ENOENT else Error
    e = cls(message, rc)
    if cls is NotFoundError:  # (OSError's constructor took the message as errno)
        e.args = (message,)
    return e


def check(rc):
    """Raises the library's error for a negative status; call it on the thread that made the call."""
    if rc < 0:
        raise error(rc)
    return rc


# numpy dtype -> enum dp_npy_dtype (include/dp/data.h)
DTYPES = {np.dtype(np.float32): 0, np.dtype(np.float64): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3,
          np.dtype(np.int16): 4, np.dtype(np.int32): 5, np.dtype(np.int64): 6, np.dtype(np.bool_): 7}


def as_array(a, name):
    """(numpy array the library may read, struct dp_array describing it, borrowed?).

    Borrowed (no copy) when a is a C-contiguous numpy array in native byte order of a dtype the
    library reads (float32, float64, uint8, int8, int16, int32, int64, bool); anything else
    (a list, a Fortran-ordered or strided view, another dtype, a big-endian array) is copied once,
    as float32 for floating data and int64 for integers."""
    if a is None:
        return None, None, False
    borrowed = (isinstance(a, np.ndarray) and a.flags["C_CONTIGUOUS"] and a.dtype.isnative and
                a.dtype in DTYPES)
    if not borrowed:
        arr = np.asarray(a)
        if arr.dtype.kind == "O" or arr.dtype.kind in "SUV":
            raise InvalidArgumentError("%s: an array of numbers is needed, got dtype %s" % (name, arr.dtype))
        if arr.dtype not in DTYPES or not arr.dtype.isnative:
            arr = arr.astype(np.int64 if arr.dtype.kind in "iu" else np.float32)
        a = np.ascontiguousarray(arr)
    if a.ndim < 1 or a.ndim > 8:
        raise InvalidArgumentError("%s: %d dimensions; an array of samples needs 1 to 8" % (name, a.ndim))
    d = DpArray()
    d.data = a.ctypes.data if a.size else None
    d.dtype = DTYPES[a.dtype]
    d.ndim = a.ndim
    for i, n in enumerate(a.shape):
        d.shape[i] = n
    if not a.size:
        raise InvalidArgumentError("%s: an empty array (shape %s)" % (name, a.shape))
    return a, d, borrowed
