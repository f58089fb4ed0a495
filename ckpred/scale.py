"""Training past one machine: ``model.backend=dask`` on a Dask cluster.

Two routes, both on existing engines (Dask's ``distributed`` scheduler and LightGBM's Dask
interface):

* **A partitioned Parquet dataset larger than one process's memory.** A directory of Parquet
  files (:func:`write_partitions`; ``part-00000.parquet`` ...) in which every query — one
  shape of one (arch, dtype, layout) — lies whole inside one file. Each file is one Dask
  partition: the workers read it, pick the training rows and targets exactly as
  :func:`ckpred.fitting.fit_method` does for one table (:func:`ckpred.fitting.prepare`,
  :func:`~ckpred.fitting.training_rows`, :func:`~ckpred.models.training_target`), compute
  the features with the partition's own arch/dtype/layout constants, and LightGBM's
  ``DaskLGBMRanker`` / ``DaskLGBMRegressor`` trains data-parallel on the rows the workers
  hold (``group`` sizes are computed per partition, which is why a query must not span two
  files: :func:`check_partitions` refuses such a dataset with :class:`QuerySplitError`).
  The client never holds the table; each worker holds its share of the training features.
  The fitted booster is put back into the pipeline of :func:`ckpred.models.build_pipeline`
  (``to_local()``), so export, ONNX and the runtimes are unchanged.
* **CV folds of an in-memory table** (``train model.backend=dask`` on ordinary data): every
  (fold, method) fit is a task on the same cluster (:func:`submit_fits`).

``model.dask.address`` names a running scheduler; null starts a ``LocalCluster`` of
``model.dask.n_workers`` single-threaded worker processes (:func:`dask_client`). Dask is
imported only here and only when used, so the default path does not need it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

import lightgbm as lgb
import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow.parquet as pq
from lightgbm import DaskLGBMRanker, DaskLGBMRegressor
from sklearn.compose import TransformedTargetRegressor
from sklearn.pipeline import Pipeline

from ckpred import evaluate as ev
from ckpred import vocab
from ckpred.data.partitions import (COMBO_COLUMNS, DATASET_DIR, MANIFEST, describe_part, read_manifest,
                                    write_manifest)
from ckpred.data.table import canonical_arrow, write_table
from ckpred.dtypes import load_dtype
from ckpred.errors import CkpredError, ConfigValueError, InputFileError
from ckpred.features import build_features
from ckpred.fitting import LearnedMethod, Prepared, model_method, predict, prepare, training_rows
from ckpred.kernels.base import OpDefinition
from ckpred.models import (Recipe, build_estimator, build_pipeline, failure_estimator, failure_model, fit_failure_model,
                           predicted_ok, query_sizes, set_failure_model, target_name, training_target)
from ckpred.schema import (DaskConfig, Hardware, LayoutConfig, RecipeConfig, RowsConfig, TrainConfig,
                           ValidityModelConfig, arch_config)
from ckpred.transfer import Fitted, fit_learned

if TYPE_CHECKING:  # the optional dask extra
    from dask.array import Array as DaskArray
    from distributed import Client, Future
from ckpred.util import atomic_dir

_Y, _Q = "_ckpred_y", "_ckpred_query"
#: Training-frame column: the row failed when measured (the learned failure model's label).
_F = "_ckpred_failed"

log = logging.getLogger(__name__)


class QuerySplitError(CkpredError, ValueError):
    """A query (one shape of one arch/dtype/layout) has rows in more than one partition.

    LightGBM's Dask ranker takes the ``group`` sizes of each partition on its own, so a query
    split across files would become two queries silently.
    """

    def __init__(self, path: str, key: str, files: list[str]) -> None:
        self.path, self.key, self.files = path, key, files
        super().__init__(f"cannot train on {path}: query {key} has rows in {len(files)} partitions {files}; "
                         "allowed: every query whole inside one file (write the dataset partitioned by query, "
                         "ckpred.scale.write_partitions)")


# -- the dataset on disk ---------------------------------------------------------------------
def write_partitions(frames: Iterable[pd.DataFrame], out_dir: str | Path, op: OpDefinition) -> dict[str, Any]:
    """Write canonical tables as a partitioned Parquet dataset, one file per frame.

    Each frame must hold whole queries and one (arch, dtype, layout); the frames come one at a
    time (a generator), so the dataset can be far larger than memory. Columns are the
    canonical schema (:func:`ckpred.data.table.write_table`). Returns the manifest (also
    written as ``_ckpred_partitions.json``): op, query columns, and per file its rows and combo.
    The directory is written beside ``out_dir`` and swapped in at the end
    (:func:`ckpred.util.atomic_dir`): a failed run leaves the previous dataset whole. An existing
    ``out_dir`` is replaced only when it is empty or a dataset ckpred wrote
    (:data:`ckpred.data.partitions.DATASET_DIR`); anything else is refused before any write.
    """
    with atomic_dir(out_dir, DATASET_DIR) as out:  # a failed run leaves the previous dataset whole
        parts: list[dict[str, Any]] = []
        for i, frame in enumerate(frames):
            name = f"part-{i:05d}.parquet"
            arrow = canonical_arrow(frame, op)
            write_table(arrow, out / name, op)
            # described from the table just written, not read back; refuses a part that mixes combos
            parts.append(describe_part(out / name, arrow))
        return write_manifest(out, op, parts)


def _query_keys(frame: pd.DataFrame, op: OpDefinition) -> pd.Series:
    """``arch/dtype/layout/<group key values>`` of each row (call it on distinct rows: it is slow)."""
    cols = [*COMBO_COLUMNS, *op.group_key]
    out = frame[cols[0]].astype(str)
    for c in cols[1:]:
        out = out + "/" + frame[c].astype(str)
    return out


def check_partitions(key_frames: Iterable[tuple[str, pd.Series]], path: str) -> None:
    """Refuse a dataset in which a query spans partitions (:class:`QuerySplitError`).

    ``key_frames`` gives, per partition file, the distinct query keys it holds.
    """
    seen: dict[str, str] = {}
    for file, keys in key_frames:
        for key in keys:
            first = seen.setdefault(key, file)
            if first != file:
                raise QuerySplitError(path, key, [first, file])


# -- one partition -> training rows ------------------------------------------------------------
def layout_config(name: str) -> Any:
    """``layout/<name>.yaml`` of the config dirs in use as a checked :class:`ckpred.schema.LayoutConfig`."""
    layout = vocab.current().layout(name)
    return LayoutConfig(name=layout.name, a=layout.a, b=layout.b, c=layout.c, code=layout.code)


def combo_config(frame: pd.DataFrame) -> Hardware:
    """``arch``, ``dtype``, ``layout`` configs of a partition (from its one combo's names)."""
    row = frame.iloc[0]
    return Hardware(arch=arch_config(str(row["arch"])), dtype=load_dtype(str(row["dtype"])),
                    layout=layout_config(str(row["layout"])))


@dataclass
class PartitionRecipe:
    """What every partition needs to turn its rows into training rows (pickled to the workers)."""

    op: OpDefinition
    recipe: Recipe
    rows: RowsConfig
    seed: int
    #: Output columns of the feature step (the same for every arch/dtype/layout).
    n_features: int = 0
    #: Queries whose stable hash falls in [test_lo, test_hi) are held out (test) — none by default.
    test_lo: float = 0.0
    test_hi: float = 0.0
    #: Baselines scored beside the model on the held-out queries (``random``, ``best_static``,
    #: ``analytical``); none by default.
    baselines: tuple[str, ...] = ()
    #: Problem fields the best-static order is learned per (``baselines.best_static_by``).
    static_by: tuple[str, ...] = ()

    def held_out(self, frame: pd.DataFrame) -> np.ndarray:
        """bool per row: its query is held out for testing (a stable hash of the query key)."""
        if self.test_hi <= self.test_lo:
            return np.zeros(len(frame), dtype=bool)
        cols = [*COMBO_COLUMNS, *self.op.group_key]
        h = pd.util.hash_pandas_object(frame[cols], index=False).to_numpy()
        u = (h >> np.uint64(11)).astype(np.float64) / float(2 ** 53)
        return (u >= self.test_lo) & (u < self.test_hi)

    def features(self, combo: Hardware) -> Any:
        return build_features(self.recipe.features, self.op, combo.arch, combo.dtype, combo.layout)

    def training_frame(self, frame: pd.DataFrame, number: int) -> pd.DataFrame:
        """The training rows of one partition: float32 features, target ``_ckpred_y``, the
        query code ``_ckpred_query`` (rows contiguous per query) and ``_ckpred_failed`` (the row
        failed when measured: the label of the learned failure model, ``validity.learned``)."""
        frame = frame[~self.held_out(frame)].reset_index(drop=True)
        names = self.feature_names()
        if len(frame) == 0:
            return self.empty_frame(names)
        combo = combo_config(frame)
        data = prepare(frame, self.op, combo, arch=combo.arch)
        model = self.recipe.model
        max_rows = int(model.max_rows_per_query) if model.name == "lgbm_ranker" else 2 ** 62
        # seeded per partition: the same rows whichever backend or worker reads the file
        rng = np.random.default_rng([int(self.seed), int(number)])
        rows = training_rows(data, np.arange(data.groups.n_shapes), self.rows, max_rows=max_rows, rng=rng)
        if len(rows) == 0:
            return self.empty_frame(names)
        codes = data.groups.codes[rows]
        y = training_target(data.perf[rows], codes, model, self.recipe.target)
        if model.name != "lgbm_ranker":
            y = build_estimator(model, self.recipe.target).transformer.fit_transform(
                np.asarray(y, dtype=np.float64).reshape(-1, 1)).ravel()
        Xt = self.features(combo).fit_transform(data.X.iloc[rows])
        out = pd.DataFrame(np.asarray(Xt, dtype=np.float32), columns=names)
        out[_Y] = np.asarray(y, dtype=np.float64)
        out[_Q] = np.asarray(codes, dtype=np.int64)
        # the in-memory fit's label (ckpred.fitting.fit_method): measured perf 0 = failed
        out[_F] = data.perf[rows] <= 0
        return out

    def feature_names(self) -> list[str]:
        """Column names of the features in a training frame (``f0`` ... ``f<n-1>``)."""
        return [f"f{i}" for i in range(self.n_features)]

    def empty_frame(self, names: list[str]) -> pd.DataFrame:
        out = pd.DataFrame({n: pd.Series(dtype=np.float32) for n in names})
        out[_Y] = pd.Series(dtype=np.float64)
        out[_Q] = pd.Series(dtype=np.int64)
        out[_F] = pd.Series(dtype=bool)
        return out


def _head(file: str, rows: int = 8) -> pd.DataFrame:
    """The first rows of a Parquet file, without reading the rest.

    Raises
    ------
    InputFileError
        When the file holds no row.
    """
    batch = next(pq.ParquetFile(file).iter_batches(batch_size=rows), None)
    if batch is None:
        raise InputFileError(file, "holds no row; allowed: a partition with at least one row")
    return batch.to_pandas()


# -- the cluster -------------------------------------------------------------------------------
@contextmanager
def dask_client(dask_cfg: DaskConfig) -> Iterator[Any]:
    """A ``distributed.Client``: on ``dask_cfg.address``, or on a new ``LocalCluster`` of
    ``n_workers`` single-threaded worker processes with ``memory_limit`` each (closed on exit).

    Worker processes get ``OMP_NUM_THREADS=1`` so LightGBM's threads match the one Dask thread.
    """
    try:  # lazy: distributed is the optional dask extra (~1 s to import), needed only by a cluster run
        from distributed import Client, LocalCluster
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigValueError("model.backend", "dask", "local, or install the dask extra "
                               "(pip install 'ckpred[dask]')") from exc
    if dask_cfg.address:
        timeout = float(getattr(dask_cfg, "timeout_s", 10.0))
        reach_scheduler(str(dask_cfg.address), timeout)
        try:
            client = Client(str(dask_cfg.address), timeout=timeout)
        except (OSError, TimeoutError) as exc:  # it went away between the two
            raise _unreachable(str(dask_cfg.address), timeout, exc) from None
        try:
            yield client
        finally:
            client.close()
        return
    limit = str(dask_cfg.memory_limit)
    if limit != "auto":  # Dask would refuse it only from inside the starting cluster
        from dask.utils import parse_bytes  # lazy: dask is the optional dask extra

        try:
            parse_bytes(limit)
        except ValueError:
            raise ConfigValueError("model.dask.memory_limit", limit, "a size such as 4GiB or 512MB, or auto") from None
    # the scheduler and nannies run in this process: their start/stop chatter is not the run's
    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        cluster = LocalCluster(n_workers=int(dask_cfg.n_workers), threads_per_worker=1, processes=True,
                               memory_limit=limit, dashboard_address=":0",
                               env={"OMP_NUM_THREADS": "1"})
        try:
            with Client(cluster) as client:
                yield client
        finally:
            # a worker slow to stop is killed by its nanny, which logs the broken connection
            quiet.setLevel(logging.CRITICAL)
            cluster.close()
    finally:
        quiet.setLevel(level)


def reach_scheduler(address: str, timeout: float) -> None:
    """Connect to the Dask scheduler at ``address`` and complete Distributed's handshake within
    ``timeout`` seconds, else refuse the run by name.

    ``distributed.Client`` bounds the connection, not the handshake after it: a socket that
    accepts and never answers held a run for minutes before a traceback.

    Raises
    ------
    ckpred.errors.ConfigValueError
        Naming ``model.dask.address``, the address and what happened.
    """
    from distributed.comm import connect  # lazy: distributed is the optional dask extra

    async def probe() -> None:
        comm = await asyncio.wait_for(connect(address, timeout=timeout), timeout)
        await comm.close()

    try:
        asyncio.run(probe())
    except (OSError, TimeoutError, asyncio.TimeoutError, ValueError) as exc:
        raise _unreachable(address, timeout, exc) from None


def _unreachable(address: str, timeout: float, exc: BaseException) -> ConfigValueError:
    why = str(exc) or f"no answer to the handshake within {timeout:g} s"
    return ConfigValueError("model.dask.address", address,
                            f"the address of a running Dask scheduler (not reached within model.dask.timeout_s="
                            f"{timeout:g} s: {type(exc).__name__}: {why})")


# -- fitting on a partitioned dataset ------------------------------------------------------------
def partition_files(path: str | Path, op: OpDefinition, manifest: dict[str, Any] | None = None) -> list[str]:
    """The partition files of the dataset at ``path`` (``manifest``: its manifest, already read)."""
    manifest = manifest if manifest is not None else read_manifest(path, op)
    return [str(Path(path) / p["file"]) for p in manifest["partitions"]]


def _first_with_rows(files: list[str], path: str | Path) -> str:
    """The first of ``files`` that holds a row (the feature step is fitted on a few of its rows)."""
    for file in files:
        if pq.ParquetFile(file).metadata.num_rows:
            return file
    raise InputFileError(str(Path(path) / MANIFEST), "every partition holds 0 rows; allowed: at least one "
                                                      "partition with rows")


def _keys_of(file: str, op: OpDefinition) -> tuple[str, np.ndarray]:
    cols = [*COMBO_COLUMNS, *op.group_key]
    frame = pd.read_parquet(file, columns=cols).drop_duplicates()
    return Path(file).name, _query_keys(frame, op).to_numpy()


def _training_part(file: str, number: int, part: PartitionRecipe) -> pd.DataFrame:
    return part.training_frame(pd.read_parquet(file), number)


def _assemble(pipe: Pipeline, fitted_model: lgb.LGBMModel, target: str) -> Pipeline:
    """Put a fitted estimator into ``pipe``, whose feature step is fitted already (on a few rows of
    one partition: the feature groups learn no statistics)."""
    step = pipe.named_steps["model"]
    if isinstance(step, TransformedTargetRegressor):
        # the partitions already applied the target transform; the TTR only inverts it
        step.regressor_ = fitted_model
        step.transformer_ = step.transformer.fit(np.zeros((1, 1)))
        step._training_dim = 1
    else:
        pipe.steps[-1] = ("model", fitted_model)
    pipe.ckpred_target_ = target
    return pipe


def check_recipe(recipe: Recipe) -> None:
    if int(recipe.model.early_stopping_rounds) > 0:
        raise ConfigValueError("model.early_stopping_rounds", int(recipe.model.early_stopping_rounds),
                               "0 with model.backend=dask on a partitioned dataset (no early stopping there)")


@dataclass
class Placed:
    """A partitioned dataset's files and, on a cluster, the worker of each (:func:`placement`),
    for a caller that fits several times on one dataset and cluster."""

    files: list[str]
    where: list[str] | None = None


@dataclass
class PartitionFit:
    """One fit on a partitioned dataset: the partitions' recipe, the unfitted LightGBM estimator
    (the ranker, or the regressor inside the target transform) and the learned validity mask's
    config (None = no failure model)."""

    part: PartitionRecipe
    estimator: Any
    is_ranker: bool
    validity: ValidityModelConfig | None = None


def fit_partitioned(cfg: RecipeConfig, op: OpDefinition, path: str | Path, *, backend: str, client: Client | None = None,
                    test: tuple[float, float] = (0.0, 0.0), placed: Placed | None = None,
                    seed: int | None = None) -> tuple[Pipeline, dict[str, Any]]:
    """Fit the config's model recipe on a partitioned dataset; returns (pipeline, fit info).

    Parameters
    ----------
    cfg : RecipeConfig
        A composed train config (``features``, ``model``, ``target``, ``rows``, ``seed``, and
        ``arch``/``dtype``/``layout`` for the returned pipeline's feature constants).
    backend : {"dask", "local"}
        ``dask``: LightGBM's Dask estimator on ``client``, one partition per file. ``local``:
        the same training rows gathered in this process and LightGBM's ordinary estimator (for
        data that fits in memory; what the Dask fit is compared with).
    test : (float, float)
        Queries whose stable hash lies in this range are held out (see :func:`score_partitioned`).
    placed : Placed, optional
        The dataset's partition files and, for ``dask``, the worker of each; by default read
        from the manifest and placed here.
    seed : int, optional
        Seed of the row sample, the model and the failure model; default ``cfg.seed``. A CV
        fold passes ``cfg.seed + fold`` as the in-memory CV does.

    With ``validity.learned`` the learned failure model is fitted too, on the same training rows
    and features as the ranking model (as in :func:`ckpred.fitting.fit_method`): ``dask``:
    LightGBM's ``DaskLGBMRegressor`` with :func:`ckpred.models.failure_estimator`'s parameters,
    kept only when a distributed predict flags at least one training row above
    ``validity.threshold``; ``local``: :func:`ckpred.models.fit_failure_model`. The fit info then
    says ``failure_model`` (kept or not) and ``failed_rows``.
    """
    method = model_method(cfg)
    check_recipe(method.recipe)
    seed = int(cfg.seed) if seed is None else int(seed)
    placed = placed if placed is not None else Placed(partition_files(path, op))
    pipe = build_pipeline(method.recipe, op, cfg.arch, cfg.dtype)
    head = _head(_first_with_rows(placed.files, path))
    n_features = len(pipe.named_steps["features"].fit(op.encode_frame(head)).get_feature_names_out())
    part = PartitionRecipe(op=op, recipe=method.recipe, rows=method.rows, seed=seed,
                           n_features=n_features, test_lo=float(test[0]), test_hi=float(test[1]))
    model_cfg = method.recipe.model
    estimator = build_estimator(model_cfg, method.recipe.target, seed)
    is_ranker = model_cfg.name == "lgbm_ranker"
    validity = method.validity if method.validity is not None and bool(method.validity.learned) else None
    job = PartitionFit(part, estimator if is_ranker else estimator.regressor, is_ranker, validity)
    info: dict[str, Any] = {"backend": backend, "partitions": len(placed.files)}
    t0 = time.perf_counter()
    if backend == "local":
        check_partitions((_keys_of(f, op) for f in placed.files), str(path))
        fitted, rows = _fit_local(job, placed.files, pipe, info)
    elif backend == "dask":
        if client is None:
            raise ValueError("fit_partitioned: backend='dask' needs a distributed client")
        where = placed.where if placed.where is not None else placement(client, placed.files, op, str(path))
        fitted, rows = _fit_on_cluster(job, client, Placed(placed.files, where), pipe, info)
    else:
        raise ConfigValueError("model.backend", backend, "one of ['local', 'dask']")
    info.update(train_rows=int(rows), fit_s=round(time.perf_counter() - t0, 2),
                trees=int(fitted.booster_.current_iteration()))
    return _assemble(pipe, fitted, target_name(model_cfg, method.recipe.target)), info


def _fit_local(job: PartitionFit, files: list[str], pipe: Pipeline, info: dict[str, Any]) -> tuple[lgb.LGBMModel, int]:
    """The training rows of every partition gathered here and LightGBM's ordinary estimator (with
    the failure model, recorded in ``info``); returns (fitted estimator, training rows)."""
    frames = [f for f in (_training_part(f, i, job.part) for i, f in enumerate(files)) if len(f)]
    # query codes restart in every partition: the group sizes are taken per partition
    fit_kw = {"group": np.concatenate([query_sizes(f[_Q].to_numpy()) for f in frames])} if job.is_ranker else {}
    train = pd.concat(frames, ignore_index=True)
    del frames
    Xt = train[job.part.feature_names()].to_numpy()
    job.estimator.fit(Xt, train[_Y].to_numpy(), **fit_kw)
    if job.validity is not None:
        failed = train[_F].to_numpy()
        failure = fit_failure_model(pipe, None, failed, job.validity, job.part.seed, Xt=Xt)
        info.update(failure_model=failure is not None, failed_rows=int(failed.sum()))
    return job.estimator, len(train)


def _fit_on_cluster(job: PartitionFit, client: Client, placed: Placed, pipe: Pipeline,
                    info: dict[str, Any]) -> tuple[Any, int]:
    """:func:`_fit_dask`, its failure model set on ``pipe`` and recorded in ``info``; returns
    (fitted local estimator, training rows)."""
    fitted, rows, failure, n_failed = _fit_dask(client, placed, job)
    if job.validity is not None:
        set_failure_model(pipe, failure, float(job.validity.threshold))
        info.update(failure_model=failure is not None, failed_rows=int(n_failed))
    return fitted, rows


def _columns(frame: pd.DataFrame, columns: str | list[str], dtype: npt.DTypeLike) -> np.ndarray:
    return frame[columns].to_numpy(dtype=dtype)


def _query_sizes_of(frame: pd.DataFrame) -> np.ndarray:
    return query_sizes(frame[_Q].to_numpy()).astype(np.int64)


def spread(combos: list[str], workers: list[str]) -> list[str]:
    """The worker each partition goes to: every combo's files dealt round robin over the
    workers, starting one worker further for each combo.

    Data-parallel LightGBM finds each feature's histogram bins on one worker's rows; a worker
    holding only some arch/dtype combos would bin the hardware features (constant within a
    combo) on too few values, so every worker gets files of every combo that has enough files.
    """
    seen: dict[str, int] = {}
    order = {c: i for i, c in enumerate(dict.fromkeys(combos))}
    out = []
    for c in combos:
        k = seen.get(c, 0)
        seen[c] = k + 1
        out.append(workers[(k + order[c]) % len(workers)])
    return out


def placement(client: Client, files: list[str], op: OpDefinition, path: str) -> list[str]:
    """The worker of each partition file (:func:`spread` of their combos over the client's
    workers), after checking that no query is split across files (:func:`check_partitions`;
    only the key columns are read, on the workers)."""
    keys = client.gather(client.map(_keys_of, files, op=op, pure=False))
    check_partitions(keys, path)
    combos = [json.dumps(sorted(set(k.rsplit("/", len(op.group_key))[0] for k in ks))) for _, ks in keys]
    return spread(combos, sorted(client.scheduler_info()["workers"]))


def _fit_dask(client: Client, placed: Placed, job: PartitionFit) -> tuple[lgb.LGBMModel, int, Any, int]:
    """The ranking model fitted data-parallel on the partitions' training rows, each partition on
    its worker; returns (local model, training rows, failure model or None, failed training
    rows). With ``job.validity`` (the ``validity`` config, ``learned`` on) the failure model is
    fitted on the same rows (see :func:`_fit_failures`)."""
    # lazy: dask is the optional dask extra (dask.array ~1 s to import), needed only by a cluster run
    import dask
    import dask.array as da  # lazy: as above

    files, where, part, names = placed.files, placed.where or [], job.part, job.part.feature_names()
    is_ranker, validity = job.is_ranker, job.validity

    # each partition's training rows, then its X / y / group arrays, pinned to one worker
    def pinned(fn: Callable[..., Any], *args: object, worker: str) -> Future:
        return client.submit(fn, *args, workers=[worker], allow_other_workers=False, pure=False)

    frames = [pinned(_training_part, f, i, part, worker=w) for i, (f, w) in enumerate(zip(files, where))]
    lengths = np.asarray(client.gather([pinned(len, fr, worker=w) for fr, w in zip(frames, where)]))
    X_parts, y_parts, g_futures, f_parts = [], [], [], []
    for fr, w, n in zip(frames, where, lengths):
        if n == 0:
            continue
        X_parts.append(da.from_delayed(dask.delayed(pinned(_columns, fr, names, np.float32, worker=w)),
                                       shape=(int(n), len(names)), dtype=np.float32))
        y_parts.append(da.from_delayed(dask.delayed(pinned(_columns, fr, _Y, np.float64, worker=w)),
                                       shape=(int(n),), dtype=np.float64))
        if validity is not None:
            f_parts.append(da.from_delayed(dask.delayed(pinned(_columns, fr, _F, np.float64, worker=w)),
                                           shape=(int(n),), dtype=np.float64))
        if is_ranker:
            g_futures.append(pinned(_query_sizes_of, fr, worker=w))
    # every partition's number of queries in one round trip
    g_parts = [da.from_delayed(dask.delayed(g), shape=(int(n),), dtype=np.int64)
               for g, n in zip(g_futures, client.gather([client.submit(len, g) for g in g_futures]))]
    del frames
    X, y = da.concatenate(X_parts), da.concatenate(y_parts)
    lengths = lengths[lengths > 0]
    # Dask gives each worker its threads
    params = {k: v for k, v in job.estimator.get_params().items() if k != "n_jobs"}
    cls = DaskLGBMRanker if is_ranker else DaskLGBMRegressor
    model = cls(client=client, **params)
    fit_kw: dict[str, Any] = {"group": da.concatenate(g_parts)} if is_ranker else {}
    with warnings.catch_warnings():
        # LightGBM's Dask estimators pass n_jobs on and then warn that Dask's threads replace it
        warnings.filterwarnings("ignore", message="Parameter n_jobs will be ignored")
        model.fit(X, y, **fit_kw)
        failure, n_failed = (None, 0) if validity is None else \
            _fit_failures(client, X, da.concatenate(f_parts), validity, part.seed)
    return model.to_local(), int(lengths.sum()), failure, n_failed


def _fit_failures(client: Client, X: DaskArray, failed: DaskArray, validity: ValidityModelConfig,
                  seed: int) -> tuple[lgb.LGBMRegressor | None, int]:
    """The learned failure model on the Dask arrays of the ranking model's training rows: a
    ``DaskLGBMRegressor`` with :func:`ckpred.models.failure_estimator`'s parameters on the 0/1
    label ``failed``, kept (as a local ``LGBMRegressor``) only when a distributed predict flags
    at least one training row above ``validity.threshold`` (the rule of
    :func:`ckpred.models.fit_failure_model`). Returns (model or None, failed rows)."""
    n_failed = int(client.compute(failed.sum()).result())
    if n_failed == 0 or n_failed == int(failed.shape[0]):
        return None, n_failed
    params = {k: v for k, v in failure_estimator(validity, seed).get_params().items() if k != "n_jobs"}
    model = DaskLGBMRegressor(client=client, **params)
    model.fit(X, failed)
    flagged = int(client.compute((model.predict(X) > float(validity.threshold)).sum()).result())
    return (model.to_local() if flagged else None), n_failed


# -- scoring held-out queries ------------------------------------------------------------------
def _static_part(file: str, part: PartitionRecipe) -> tuple[pd.Series, int]:
    """The training side of ``best_static`` on one partition: per kernel the sum of ``perf /
    best`` over the partition's training (not held-out) queries, and how many of them have a
    valid kernel (:func:`ckpred.evaluate.best_static_sums`; summed over partitions on the client)."""
    op = part.op
    columns = list(dict.fromkeys([*COMBO_COLUMNS, *op.group_key, "kernel_name", "tflops", "is_valid",
                                  *part.static_by]))
    frame = pd.read_parquet(file, columns=columns)
    frame = frame[~part.held_out(frame)].reset_index(drop=True)
    if len(frame) == 0:
        return pd.Series(dtype=np.float64), 0
    # the perf and the queries exactly as ckpred.fitting.prepare computes them
    perf = ev.measured_perf(frame["tflops"].to_numpy(), frame["is_valid"].to_numpy())
    groups = ev.ShapeGroups.from_keys(op.shape_keys(frame))
    return ev.best_static_sums(ev.static_keys(frame, np.arange(len(frame)), part.static_by), perf, groups)


def best_static_order(part: PartitionRecipe, files: list[str], client: Client | None = None) -> pd.Series:
    """The ``best_static`` order learned on the training queries of every partition: per kernel
    its mean ``perf / best`` over them (what :func:`ckpred.evaluate.best_static_scores` learns on
    one table), from per-partition sums and counts (on the cluster with ``client``, else here)."""
    if client is None:
        parts = [_static_part(f, part) for f in files]
    else:
        parts = client.gather(client.map(_static_part, files, part=part, pure=False))
    sums = [s for s, _ in parts if len(s)]
    if not sums:
        return pd.Series(dtype=np.float64)
    total = pd.concat(sums).groupby(level=0, sort=False).sum()
    return total / max(sum(n for _, n in parts), 1)


def _empty_scores() -> pd.DataFrame:
    return pd.DataFrame({"method": pd.Series(dtype=str), "query": pd.Series(dtype=str),
                         "efficiency": pd.Series(dtype=np.float64), "top1": pd.Series(dtype=np.float64)})


def _score_part(file: str, number: int, part: PartitionRecipe, pipe: Pipeline,
                static: pd.Series | None = None) -> tuple[pd.DataFrame, str | None]:
    """Per held-out query of one partition and per method (the model, then ``part.baselines``):
    the metrics of :func:`ckpred.evaluate.shape_metrics`, the query's family and the chosen
    kernel. Returns the rows and why the analytical baseline was skipped here (or None).

    With a learned failure model on ``pipe`` the model picks among the rule-valid kernels it
    predicts to run, falling back to the rules where it predicts none
    (:func:`ckpred.evaluate.learned_selection_mask`, as the in-memory CV scores it)."""
    frame = pd.read_parquet(file)
    frame = frame[part.held_out(frame)].reset_index(drop=True)
    if len(frame) == 0:
        return _empty_scores(), None
    combo = combo_config(frame)
    data = prepare(frame, part.op, combo, arch=combo.arch)
    features = part.features(combo).fit(data.X.head(8))
    scorer = Pipeline([("features", features), ("model", pipe.named_steps["model"])])
    mask = data.selectable
    if failure_model(pipe) is not None:
        set_failure_model(scorer, failure_model(pipe), pipe.ckpred_failure_threshold_)
        mask = ev.learned_selection_mask(mask, predicted_ok(scorer, data.X), data.groups)
    per_method = {"model": ev.shape_metrics(data.perf, predict(scorer, data.X), data.groups, mask)}
    if "best_static" in part.baselines and static is not None:
        scores = ev.best_static_apply(static, ev.static_keys(data.table, np.arange(len(data.table)), part.static_by))
        per_method["best_static"] = ev.shape_metrics(data.perf, scores, data.groups, data.selectable)
    note = None
    if "analytical" in part.baselines:
        try:  # the partition's own arch and dtype constants
            scores = ev.op_analytical_scores(data.table, part.op, combo.arch, combo.dtype)
            per_method["analytical"] = ev.shape_metrics(data.perf, scores, data.groups, data.selectable)
        except (KeyError, NotImplementedError) as exc:
            note = f"skipped: {exc}"
    if "random" in part.baselines:
        per_method["random"] = ev.random_shape_metrics(data.perf, data.groups)
    keys = _query_keys(frame.iloc[data.groups.first_rows()], part.op).to_numpy()
    kernels = data.table["kernel_name"].to_numpy()
    out = []
    for method in (m for m in ev.METHODS if m in per_method):
        ps = per_method[method]
        chosen = ps["chosen_row"].to_numpy()
        head = pd.DataFrame({"method": method, "query": keys, "family": data.shapes["family"].to_numpy()})
        if "best_pipeline" in data.shapes:
            head["best_pipeline"] = data.shapes["best_pipeline"].to_numpy()
        head["kernel"] = np.where(chosen >= 0, kernels[np.maximum(chosen, 0)], "") if method != "random" else ""
        out.append(pd.concat([head, ps.drop(columns=["chosen_row", "best_row"]).reset_index(drop=True)], axis=1))
    return pd.concat(out, ignore_index=True), note


def score_all(pipe: Pipeline, part: PartitionRecipe, files: list[str], client: Client | None = None,
               static: pd.Series | None = None) -> tuple[pd.DataFrame, list[str]]:
    """:func:`_score_part` of every partition (on the cluster with ``client``) and the
    analytical baseline's skip reasons."""
    if client is None:
        got = [_score_part(f, i, part, pipe, static) for i, f in enumerate(files)]
    else:
        remote = client.scatter(pipe, broadcast=True)
        order = None if static is None else client.scatter(static, broadcast=True)
        got = client.gather(client.map(_score_part, files, range(len(files)), part=part, pipe=remote,
                                       static=order, pure=False))
    notes = sorted({note for _, note in got if note})
    frames = [frame for frame, _ in got if len(frame)]  # an empty one would turn the counts into floats
    return (pd.concat(frames, ignore_index=True) if frames else _empty_scores()), notes


def scoring_recipe(cfg: RecipeConfig, op: OpDefinition, test: tuple[float, float], baselines: tuple[str, ...] = (),
                    static_by: tuple[str, ...] = ()) -> PartitionRecipe:
    method = model_method(cfg)
    return PartitionRecipe(op=op, recipe=method.recipe, rows=method.rows, seed=int(cfg.seed),
                           test_lo=float(test[0]), test_hi=float(test[1]), baselines=baselines,
                           static_by=static_by)


def score_partitioned(pipe: Pipeline, cfg: RecipeConfig, op: OpDefinition, path: str | Path, *, test: tuple[float, float],
                      client: Client | None = None) -> pd.DataFrame:
    """Per-query efficiency (and top-1 and the other per-shape metrics) of ``pipe`` on the
    held-out queries of a partitioned dataset that have a valid kernel (each partition scored
    where it is read: on the cluster with ``client``, else here)."""
    out, _ = score_all(pipe, scoring_recipe(cfg, op, test), partition_files(path, op), client)
    return out[out["efficiency"].notna()].reset_index(drop=True)


def summary(per_query: pd.DataFrame, method: str = "model") -> dict[str, float]:
    """Mean and P10 per-query efficiency and top-1 share (the figures ``train`` reports) of one
    method's rows (all rows when ``per_query`` has no ``method`` column)."""
    if "method" in per_query:
        per_query = per_query[per_query["method"] == method]
    eff = per_query["efficiency"].to_numpy()
    return {"queries": int(len(eff)), "mean": float(eff.mean()), "p10": float(np.percentile(eff, 10)),
            "top1": float(per_query["top1"].mean())}


# -- CV folds of an in-memory table as tasks -------------------------------------------------------
def submit_fits(client: Client, jobs: list[tuple[LearnedMethod, np.ndarray, int]], data: Prepared, op: OpDefinition,
                cfg: RecipeConfig) -> list[Future]:
    """Submit :func:`ckpred.transfer.fit_learned` for each ``(method, train_shapes, seed)`` as a task
    on ``client``; the prepared table is sent to the workers once. Returns the futures in order
    (each resolves to ``(pipeline, info)``)."""
    remote = client.scatter(data, broadcast=True)
    return [client.submit(fit_learned, method, remote, shapes, op, cfg, seed, pure=False)
            for method, shapes, seed in jobs]


def fold_fits(cfg: RecipeConfig, data: Prepared, op: OpDefinition,
              jobs: list[tuple[LearnedMethod, np.ndarray, int]]) -> Iterator[tuple[Fitted, dict[str, Any]]]:
    """``(pipeline, info)`` of each job, in order, fitted as tasks on the cluster of ``cfg.model.dask``.

    Every job is submitted at once (the cluster runs as many as it has worker threads); the
    cluster is closed when the last result has been taken.
    """
    with dask_client(cfg.model.dask) as client:
        futures = submit_fits(client, jobs, data, op, cfg)
        for future in futures:
            pipe, info = future.result()
            info["backend"] = "dask"
            yield pipe, info


def baselines_of(cfg: TrainConfig, op: OpDefinition) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The baselines of ``cfg.baselines`` a partitioned run scores, and ``best_static_by``.

    ``analytical`` is tried only when the op has a GEMM view, as in the in-memory run.
    """
    b = cfg.baselines
    names = tuple(m for m, on in (("best_static", b.best_static),
                                  ("analytical", b.analytical and type(op).gemm_view is not OpDefinition.gemm_view),
                                  ("random", b.random)) if on)
    return names, tuple(ev.best_static_by(b, op))
