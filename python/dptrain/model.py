"""dptrain.Model: fit, evaluate, predict, save and export, over libdptrain's trainer.

Every option of `dptrain train` is a keyword argument of fit(), spelled in snake_case
(--weight-decay is weight_decay=...), with the CLI's defaults: the library's option table
(dp_train_option_set) parses and checks them, so a value the CLI refuses is refused here with the
same message.  Keras-style aliases: batch_size= for batch, optimizer= for optim,
validation_split= for val_split, learning_rate= for lr.
"""
import atexit
import ctypes
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref

import numpy as np

from . import _lib
from ._lib import InvalidArgumentError, Error, NotFoundError, lib, check

_ALIASES = {"batch_size": "batch", "optimizer": "optim", "validation_split": "val_split", "learning_rate": "lr"}
# options that name what Model() and Model.load() decide, and the CLI's own
_NOT_FIT = {"model": "the model is Model(...)'s argument", "model_file": "the model is Model(...)'s argument",
            "resume": "continue a run with dptrain.Model.load(checkpoint).fit(...)"}
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


# ---- computing on a thread that takes no signal -------------------------------------------------

class _Terminated(BaseException):
    """SIGTERM during a run (fit's handler, where SIGTERM had Python's default): the run stops at a
    step as for Ctrl-C, then the process exits 143, as the CLI does (a launcher's stop: mpirun's,
    Slurm's; docs/cluster.md "Stopping a job cleanly")."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _blocked(fn, on_interrupt=None):
    """fn() (a library call returning a status) on a thread of its own that blocks SIGINT and SIGTERM,
    while this thread waits.  No signal handler may run on a thread that computes (include/dp/train.h,
    `stop`: oneDNN's GEMM moves the stack pointer into the heap while it runs); Python runs its
    handlers on the main thread, which here only waits.  A KeyboardInterrupt (or _Terminated)
    during the wait calls on_interrupt() once, waits for fn to return and is then raised again
    (_Terminated as SystemExit(143)).  A negative status raises the library's error, with the
    message from fn's thread."""
    box = {}

    def body():
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            rc = fn()
            box["rc"] = rc
            if isinstance(rc, int) and rc < 0:
                box["msg"] = _lib.errmsg()
        except BaseException as e:  # (handed to the waiting thread)
            box["exc"] = e
        finally:
            done.set()

    # (The wait is on an Event, not Thread.join: Python 3.11's join, interrupted by Ctrl-C, may mark
    # a thread that still runs as ended, bpo-45274's fix.)
    done = threading.Event()
    th = threading.Thread(target=body, name="dptrain", daemon=True)
    th.start()
    interrupted = None
    while not done.is_set():
        try:
            done.wait(0.05)
        except (KeyboardInterrupt, _Terminated) as e:
            if interrupted is None:
                interrupted = e
                if on_interrupt:
                    on_interrupt()
    th.join()
    if "exc" in box:
        raise box["exc"]
    rc = box.get("rc")
    err = _lib.error(rc, box.get("msg")) if isinstance(rc, int) and rc < 0 else None
    if interrupted is not None:
        if err is not None:  # (the stop did not go as asked: say why)
            raise err from interrupted
        if isinstance(interrupted, _Terminated):
            raise SystemExit(128 + signal.SIGTERM)
        raise interrupted
    if err is not None:
        raise err
    return rc


# ---- several processes: MPI ---------------------------------------------------------------------

_job = None


def _launched_by_mpi():
    """As the CLI decides (tools/dptrain/main.c): an MPI launcher started this process."""
    env = os.environ
    if any(v in env for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")):
        return True
    return "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1") or 1) > 1


def _job_free():
    global _job
    if _job is not None:
        for t in list(_Trainer.live):  # (a trainer of the job goes before the job's communicator)
            t.free()
        lib.dp_comm_free(_job)  # finalizes MPI if the library initialised it
        _job = None


def job(backend="auto"):
    """The communicator of this process with the others of an MPI job (a ctypes pointer), or None for
    one process.  backend: "auto" (MPI when an MPI launcher started the process and the library has
    the mpi backend), "mpi" or "thread".  Made once per process (MPI initialised unless someone, such
    as mpi4py, did already) and freed at exit."""
    global _job
    if backend not in ("auto", "mpi", "thread"):
        raise InvalidArgumentError("backend: expected auto, thread or mpi, got %r" % (backend,))
    if backend == "thread" or (backend == "auto" and not (_launched_by_mpi() and
                                                          lib.dp_comm_backend_available(b"mpi"))):
        return None
    if _job is None:
        c = ctypes.c_void_p()
        check(lib.dp_comm_init(ctypes.byref(c), b"mpi", None))
        _job = c
        atexit.register(_job_free)
    return _job


def rank():
    """This process's rank in the MPI job (0 without one)."""
    c = job()
    return lib.dp_comm_rank(c) if c else 0


def world():
    """The processes in the MPI job (1 without one)."""
    c = job()
    return lib.dp_comm_world(c) if c else 1


# ---- the trainer's handle ------------------------------------------------------------------------

class _Trainer:
    """A struct dp_trainer and what it borrows (arrays, strings); freed with the last reference
    (parameters() views hold one)."""

    live = weakref.WeakSet()

    def __init__(self, handle, keep):
        self.h = handle
        self.keep = keep
        _Trainer.live.add(self)

    def free(self):
        if self.h:
            lib.dp_trainer_free(self.h)
            self.h = None

    def __del__(self):
        self.free()


class History(list):
    """fit()'s records, one dict per epoch (metrics.jsonl's epoch records); .history is Keras's view:
    key -> list of the epochs' values."""

    @property
    def history(self):
        keys = []
        for r in self:
            keys += [k for k in r if k not in keys]
        return {k: [r.get(k) for r in self] for k in keys}


def _text(v):
    """An option's value as the CLI's text (None: a flag given with no value)."""
    if v is True:
        return None
    if v is False:
        return "0"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, float):
        return repr(v)
    return str(v)


class Model:
    """A dptrain model: a spec ("mlp", "cnn:32,64", "resnet:20,16", "mlp:hidden=128,dropout=0.1"), the
    path of a model file (docs/models.md), or a model file's text; or Model.load(checkpoint)."""

    def __init__(self, model="mlp"):
        self._init()
        if not isinstance(model, str) or not model:
            raise InvalidArgumentError("Model(): a model spec, a model file's path or its text, got %r" % (model,))
        if "\n" in model:  # a model file's text
            self._tmp = tempfile.mkdtemp(prefix="dptrain-")
            self._model_opt = ("model-file", os.path.join(self._tmp, "model.txt"))
            with open(self._model_opt[1], "w") as f:
                f.write(model)
        elif os.path.isfile(model):
            self._model_opt = ("model-file", os.path.abspath(model))
        elif model.endswith(".txt") or os.sep in model:
            raise NotFoundError("%s: no such model file (a spec is a name such as mlp, cnn:32,64)" % model,
                                _lib.DP_ENOENT)
        else:
            self._model_opt = ("model", model)

    def _init(self):
        self._t = None          # the trainer after fit (or load)
        self._ckpt = None       # a checkpoint to continue from
        self._current = False   # _ckpt holds the trainer's state
        self._epoch = 0         # epochs trained
        self._out = None
        self._tmp = None
        self._model_opt = None
        self._defaults = {}     # options of the first fit (from_torch: init_from, its weights)
        self.history = History()

    def __del__(self):
        if getattr(self, "_tmp", None):
            shutil.rmtree(self._tmp, ignore_errors=True)

    @classmethod
    def load(cls, path, layout=None):
        """The model of a checkpoint (dptrain train's, or save()'s), ready to evaluate, predict, export,
        or fit further (its optimizer state, batch, seed and schedule continue; fit's options override
        them).  layout="nhwc" for a model trained on (N, H, W, C) arrays."""
        m = cls.__new__(cls)
        m._init()
        m._ckpt = os.path.abspath(path)
        m._current = True
        if not os.path.isfile(m._ckpt):
            raise NotFoundError("%s: no such checkpoint" % path, _lib.DP_ENOENT)
        p = lib.dp_train_params_new()
        if not p:
            raise MemoryError("dptrain: out of memory")
        try:
            keep = [m._ckpt.encode()]
            epoch, shape, outputs, reg = ctypes.c_int64(), (ctypes.c_int64 * 3)(), ctypes.c_int64(), ctypes.c_int()
            check(lib.dp_train_params_from_ckpt(p, keep[0], ctypes.byref(epoch), ctypes.byref(shape),
                                                ctypes.byref(outputs), ctypes.byref(reg)))
            if min(shape) < 1:
                raise Error("%s: a language model's checkpoint (token input); use the CLI (dptrain eval, sample)"
                            % path)
            m._epoch = epoch.value
            # the trainer needs data: one sample of zeros of the model's input, normalised as the run was
            C, H, W = shape
            x = np.zeros((1, H, W, C) if layout == "nhwc" else (1, C, H, W), np.float32)
            opts = {"epochs": max(1, m._epoch), "workers": 1, "prefetch": 0}  # (nothing runs: no step)
            if layout:
                opts["layout"] = layout
            y = np.zeros((1, outputs.value), np.float32) if reg.value else None  # (a regression's targets)
            m._t = m._make(p, keep, x, y, None, opts, backend="thread", need_y=False)
        finally:
            lib.dp_train_params_free(p)
        return m

    # ---- options and the trainer ----

    def _make(self, p, keep, X, y, val, opts, backend="auto", events=None, stop=None, need_y=True):
        """A trainer from params p, the arrays and the options (names as fit takes them)."""
        arrays = []

        def put(which, a, name):
            arr, d, _ = _lib.as_array(a, name)
            if arr is not None:
                arrays.append(arr)
                keep.append(d)
                check(lib.dp_train_params_set_array(p, which.encode(), ctypes.byref(d)))

        given = []
        for k, v in opts.items():
            if v is None:
                continue
            name = _ALIASES.get(k, k)
            b, t = name.encode(), _text(v)
            tb = t.encode() if t is not None else None
            keep += [b, tb]
            check(lib.dp_train_option_set(p, b, tb))
            given.append(b)
        if X is not None:
            put("x", X, "X")
            if y is None and need_y:
                raise InvalidArgumentError("fit: X without y (the labels, or a regression's targets)")
            put("y", y, "y")
        if val is not None:
            if not (isinstance(val, (tuple, list)) and len(val) == 2):
                raise InvalidArgumentError("validation_data: a pair (X, y)")
            put("test_x", val[0], "validation X")
            put("test_y", val[1], "validation y")
        for b in given:
            check(lib.dp_train_option_check(p, b))
        comm = job(backend)
        cb = _lib.EVENT_FN(events) if events else ctypes.cast(None, _lib.EVENT_FN)
        keep += [cb, stop]
        lib.dp_train_params_set_hooks(p, cb, None, ctypes.byref(stop) if stop is not None else None, comm)
        keep.append(arrays)
        t = _Trainer(ctypes.c_void_p(), keep)  # (freed with t, also when a Ctrl-C ends the wait)
        _blocked(lambda: lib.dp_trainer_init(ctypes.byref(t.h), p))
        return t

    def fit(self, X=None, y=None, epochs=None, batch_size=None, validation_data=None, verbose="auto",
            backend="auto", **options):
        """Trains on X (samples: (N, D), (N, H, W), (N, C, H, W), or (N, H, W, C) with layout="nhwc") and
        y (classes (N,), or a regression's targets (N,) / (N, K) with loss="mse"), and returns the
        History of its epochs.  X and y are borrowed when C-contiguous of a dtype the library reads
        (float32, float64, uint8, int8, int16, int32, int64, bool), else copied once; borrowed arrays
        must not change while the model lives.  X None: the data options (data=, labels=, ...) name
        files, as the CLI's do.  A second fit continues the first (its epochs are more epochs).
        Ctrl-C stops at a step boundary, writes out/checkpoint.bin when out= is set, and re-raises.
        verbose: 0 silent; 1 a line per epoch, and on a terminal a progress line as steps end; 2 a
        line per epoch only; "auto" (default): 1 on a terminal (not in a notebook), else 0."""
        opts = dict(options)
        for k in opts:
            if k.replace("-", "_") in _NOT_FIT:
                raise InvalidArgumentError("fit(%s=...): %s" % (k, _NOT_FIT[k.replace("-", "_")]))
        if batch_size is not None:
            opts["batch"] = batch_size
        if "progress" in opts:  # the CLI's --progress: none, lines (bar, auto: as verbose="auto")
            pr = opts.pop("progress")
            verbose = 0 if pr == "none" else 1 if pr in ("lines", "bar") else "auto"
        if verbose == "auto":
            verbose = 1 if sys.stderr.isatty() and "ipykernel" not in sys.modules else 0
        if "workers" not in opts:  # the CLI's default: one per core this process may use
            local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1") or 1) if job(backend) else 1
            opts["workers"] = max(1, min(256, lib.dp_cpus_allowed() // max(1, local)))
        p = lib.dp_train_params_new()
        if not p:
            raise MemoryError("dptrain: out of memory")
        keep = []
        records = History()
        buf = ctypes.create_string_buffer(8192)
        is_root = rank() == 0 if job(backend) else True

        # verbose 1 on a terminal: a progress line redrawn as steps end (at most 5 times a second)
        live = verbose == 1 and is_root and sys.stderr.isatty()
        drawn = [0.0]

        def on_event(arg, ev):
            try:
                kind = ctypes.cast(ev, ctypes.POINTER(ctypes.c_int))[0]
                if kind == 0 and live and time.monotonic() - drawn[0] > 0.2:  # DP_EVENT_STEP
                    drawn[0] = time.monotonic()
                    if lib.dp_event_json(ev, buf, len(buf)) > 0:
                        r = json.loads(buf.value.decode())
                        sys.stderr.write("\r\x1b[Kepoch %d/%d  step %d/%d  loss %.4f" % (
                            r["epoch"], r["epochs"], r["step_in_epoch"], r["steps_per_epoch"], r.get("loss") or 0))
                        sys.stderr.flush()
                if kind != 1:  # DP_EVENT_EPOCH
                    return
                n = lib.dp_event_json(ev, buf, len(buf))
                if n > 0:
                    r = json.loads(buf.value.decode())
                    r["workers"] = workers  # (metrics.jsonl's "workers": the job's)
                    records.append(r)
                    if verbose and is_root:
                        if live:
                            sys.stderr.write("\r\x1b[K")
                        self._print_epoch(r)
            except Exception as e:  # (an exception cannot cross the library)
                print("dptrain: event: %s" % e, file=sys.stderr)

        stop = ctypes.c_int(0)
        workers = int(opts["workers"]) * world() if job(backend) else int(opts["workers"])
        try:
            if self._t is not None or self._ckpt is not None:
                # continue: this model's state as a checkpoint, resumed (optimizer state and all)
                out = opts.get("out")
                if self._t is not None and not self._current:
                    folder = out if out else self._tmpdir()
                    os.makedirs(folder, exist_ok=True)
                    ck = os.path.abspath(os.path.join(folder, "checkpoint.bin" if out else "model.ckpt"))
                    if out and os.path.abspath(out) != (self._out or "") and os.path.exists(ck):
                        raise InvalidArgumentError("out=%s holds another run (%s): choose another folder"
                                                   % (out, ck))
                    check(lib.dp_trainer_save(self._t.h, ck.encode()))
                    self._ckpt = ck
                ckb = self._ckpt.encode()
                keep.append(ckb)
                shape = (ctypes.c_int64 * 3)()
                check(lib.dp_train_params_from_ckpt(p, ckb, None, ctypes.byref(shape), None, None))
                per = int(np.prod(np.shape(X)[1:])) if X is not None and np.ndim(X) > 1 else None
                if per is not None and min(shape) > 0 and per != shape[0] * shape[1] * shape[2]:
                    raise InvalidArgumentError("X: samples of %d values, but this model takes %d x %d x %d = %d "
                                               "(the data it was trained on)" % (per, shape[0], shape[1], shape[2],
                                                                                  shape[0] * shape[1] * shape[2]))
                opts["epochs"] = self._epoch + (epochs if epochs is not None else 1)
            else:
                opts = dict(self._defaults, **opts)
                opts[self._model_opt[0]] = self._model_opt[1]
                if epochs is not None:
                    opts["epochs"] = epochs
            t = self._make(p, keep, X, y, validation_data, opts, backend=backend, events=on_event, stop=stop)
        finally:
            lib.dp_train_params_free(p)
        self._t = t

        def interrupted():
            stop.value = 1
            if is_root:
                print("\ndptrain: stopping after this step%s" % (
                    ", with a checkpoint in %s" % opts["out"] if opts.get("out") else ""), file=sys.stderr)

        # SIGTERM (a launcher's stop) stops at a step too, where Python would die at once
        term = threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        if term:
            signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            _blocked(lambda: lib.dp_trainer_run(t.h), on_interrupt=interrupted)
        except (KeyboardInterrupt, SystemExit):
            self._settle(records, opts)
            raise
        except _Terminated:  # (a SIGTERM just outside the wait)
            self._settle(records, opts)
            raise SystemExit(128 + signal.SIGTERM)
        except Error:
            self._t = None
            raise
        finally:
            if term:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._settle(records, opts)
        stopped = lib.dp_trainer_stopped(t.h)
        if stopped >= 0:  # another process of the job was signalled: the job stopped at this step
            if is_root:
                print("\ndptrain: stopped after step %d on another process's signal%s" % (
                    stopped, ", with a checkpoint in %s" % opts["out"] if opts.get("out") else ""), file=sys.stderr)
            raise KeyboardInterrupt("the job was stopped after step %d by another process's signal" % stopped)
        return records

    def _settle(self, records, opts):
        self.history.extend(records)
        if records:
            self._epoch = records[-1]["epoch"]
        # the run folder's checkpoint holds this state (written at the end, or at the stop)
        self._current = bool(opts.get("out"))
        if opts.get("out"):
            self._out = os.path.abspath(opts["out"])
            self._ckpt = os.path.join(self._out, "checkpoint.bin")

    def _tmpdir(self):
        if not self._tmp:
            self._tmp = tempfile.mkdtemp(prefix="dptrain-")
        return self._tmp

    @staticmethod
    def _print_epoch(r):
        s = "epoch %d  loss %.4f  acc %.2f%%" % (r["epoch"], r.get("train_loss") or float("nan"),
                                                100 * (r.get("train_acc") or 0))
        if "test_acc" in r and "test_mae" not in r:
            s += "  val acc %.2f%%  val loss %.4f" % (100 * r["test_acc"], r["test_loss"])
        elif "test_rmse" in r:
            s += "  val rmse %.4g  val mae %.4g" % (r["test_rmse"], r["test_mae"])
        s += "  %.0f samples/s" % r.get("samples_per_s", 0)
        print(s, file=sys.stderr, flush=True)

    def _need(self):
        if self._t is None:
            raise Error("the model has no weights yet: fit() it, or dptrain.Model.load(checkpoint)")
        return self._t

    # ---- the trained model ----

    def evaluate(self, X, y, batch_size=None):
        """{'loss': mean loss, 'accuracy': fraction correct} on X, y (normalised as the training data
        was); a regression's: {'loss': mean squared error, 'rmse': ..., 'mae': ...}.  batch_size is
        accepted for Keras's habit; the library evaluates in its own chunks."""
        t = self._need()
        xa, xd, _ = _lib.as_array(X, "X")
        ya, yd, _ = _lib.as_array(y, "y")
        acc, loss = ctypes.c_double(), ctypes.c_double()
        _blocked(lambda: lib.dp_trainer_evaluate_arrays(t.h, ctypes.byref(xd), ctypes.byref(yd),
                                                        ctypes.byref(acc), ctypes.byref(loss)))
        if lib.dp_trainer_regression(t.h):
            return {"loss": loss.value, "rmse": float(np.sqrt(loss.value)), "mae": acc.value}
        return {"loss": loss.value, "accuracy": acc.value}

    def predict(self, X, batch_size=None):
        """The model's outputs for X, an (N, outputs) float32 array: logits per class (the prediction is
        their argmax), or a regression's values.  Evaluated in the library's chunks (batch_size is
        accepted for Keras's habit)."""
        t = self._need()
        xa, xd, _ = _lib.as_array(X, "X")
        K = lib.dp_trainer_outputs(t.h)
        out = np.empty((xd.shape[0], K), np.float32)
        ptr = out.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        _blocked(lambda: lib.dp_trainer_predict(t.h, ctypes.byref(xd), ptr, out.size))
        return out

    def save(self, path):
        """Writes a checkpoint (dptrain's format: `dptrain eval --ckpt`, `ckpt info`, a resume, and
        Model.load read it)."""
        check(lib.dp_trainer_save(self._need().h, os.fsencode(path)))

    def export_safetensors(self, path):
        """Writes the weights as safetensors with PyTorch's names, and the normalisation in its metadata
        (what `dptrain ckpt export` writes)."""
        check(lib.dp_trainer_export(self._need().h, os.fsencode(path)))

    def param_hash(self):
        """The FNV-1a 64 hash of the parameters and buffers, as a 16-digit hex string (the CLI's and
        `dptrain ckpt info`'s "param hash")."""
        return "%016x" % lib.dp_trainer_param_hash(self._need().h)

    def parameters(self, buffers=True):
        """dict name -> numpy view (float32, read-only) of each parameter (and buffer, such as
        BatchNorm's running statistics), with PyTorch's names and shapes.  Views of this model's
        current weights: a later fit() makes new ones."""
        t = self._need()
        out = {}
        name, ndim, isbuf = ctypes.c_char_p(), ctypes.c_int(), ctypes.c_int()
        shape, data = (ctypes.c_int64 * 4)(), ctypes.POINTER(ctypes.c_float)()
        for i in range(lib.dp_trainer_param_count(t.h)):
            check(lib.dp_trainer_param_info(t.h, i, ctypes.byref(name), ctypes.byref(ndim), ctypes.byref(shape),
                                            ctypes.byref(data), ctypes.byref(isbuf)))
            if isbuf.value and not buffers:
                continue
            dims = tuple(shape[d] for d in range(ndim.value))
            if not data:
                raise Error("parameters(): ZeRO 3 keeps shards of the weights until fit() ends")
            n = int(np.prod(dims)) if dims else 1
            carr = (ctypes.c_float * n).from_address(ctypes.addressof(data.contents))
            carr._owner = t  # the view keeps the trainer alive
            v = np.frombuffer(carr, dtype=np.float32).reshape(dims)
            v.flags.writeable = False
            out[name.value.decode()] = v
        return out

    def to_torch(self):
        """The weights as a PyTorch state_dict (copies, PyTorch's names): for the nn.Sequential given
        to dptrain.from_torch, module.load_state_dict(m.to_torch()) makes it this model."""
        from ._torch import state_dict
        return state_dict(self)

    @property
    def epochs_trained(self):
        return self._epoch
