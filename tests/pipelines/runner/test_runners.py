"""Runner matrix: the same spec + data give byte-identical artifacts on every runner that runs here.

Reference: DirectRunner in_memory, once per spec (module fixture). Compared with it, file by file
(vocabularies, shards, profiles, dead letters, the tf.Transform output, spec.yaml, manifest.json):

* DirectRunner multi_processing, 2 worker processes;
* PortableRunner, embedded job service (`--job_endpoint=embed`), EXTERNAL SDK workers from a
  `worker_pool_main` started here in its own process (how Flink and Spark deployments run Python);
* DaskRunner on a `distributed.LocalCluster` of 2 worker processes (joined with
  --dask_client_address), and `tpu-embed run --runner dask --dask-workers 2` (starts its own); the cluster's
  workers run in a working directory of their own, and `tpu-embed run --spec spec.yaml --output out` with
  relative paths writes the artifact into the driver's directory;
* the numpy CSR fallback (TPU_EMBED_NATIVE=0), which must also log exactly one warning;
* a wheel installed in a fresh virtual environment that runs the EXTERNAL workers.

The worker pool and the cluster are started once per module and always stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import apache_beam as beam
import pytest

from pipelines import beam_overheads, runner
from pipelines.jobs import JobConfig
from tests.helpers import ROOT
from tpu_embed.artifact.spec import load_spec

SPECS = {"criteo": os.path.join(ROOT, "examples", "criteo", "spec.yaml"),
         "movielens": os.path.join(ROOT, "examples", "movielens", "spec.yaml")}
# Small chunks and files: several chunks, step pieces and shard files, so ordering is exercised.
KW = {"criteo": dict(chunk_rows=50, steps_per_file=3), "movielens": dict(chunk_rows=37, steps_per_file=5)}
VENV_BIN = os.path.dirname(sys.executable)


def _read(path):
    with open(path, "rb") as fh:
        return fh.read()


def _files(d):
    return {os.path.relpath(os.path.join(r, x), d): _read(os.path.join(r, x)) for r, _, xs in os.walk(d) for x in xs}


def _run(name, out, beam_args=()):
    # As `tpu-embed run`: the transform output too.
    runner.run_all(JobConfig(spec=load_spec(SPECS[name]), output=out, transform_output=True, **KW[name]),
                   list(beam_args))
    return _files(out)


def _assert_identical(got, ref):
    assert sorted(got) == sorted(ref)
    assert [p for p in sorted(ref) if got[p] != ref[p]] == []


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = {}
    for name in SPECS:
        files = _run(name, str(tmp_path_factory.mktemp(f"ref-{name}")))
        kinds = {p.split("/")[0] for p in files}
        assert {"vocab", "shards", "profiles", "transform_output", "manifest.json", "spec.yaml"} <= kinds, kinds
        out[name] = files
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def worker_pool(python: str, cwd: str, env: dict):
    """`python -m apache_beam.runners.worker.worker_pool_main` in its own session; yields (port, log path).

    The pool starts each SDK worker as `python -c ...` found on PATH, so `env["PATH"]` must start with
    the bin directory of the environment the workers should use. Stopping kills the session (pool and
    the workers it started).
    """
    port = _free_port()
    log_path = os.path.join(cwd, "worker_pool.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([python, "-m", "apache_beam.runners.worker.worker_pool_main",
                                 f"--service_port={port}"], cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while True:
            assert proc.poll() is None, open(log_path).read()
            with socket.socket() as s:
                if s.connect_ex(("localhost", port)) == 0:
                    break
            assert time.time() < deadline, "worker pool did not start: " + open(log_path).read()
            time.sleep(0.2)
        yield port, log_path
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _external_args(port: int):
    return ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
            f"--environment_config=localhost:{port}"]


def _clean_env(bin_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


@pytest.fixture(scope="module")
def project_worker_pool(tmp_path_factory):
    with worker_pool(sys.executable, str(tmp_path_factory.mktemp("pool")), _clean_env(VENV_BIN)) as pool:
        yield pool


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """Two worker processes started in a directory of their own (`cluster.workers_cwd`), not the driver's."""
    distributed = pytest.importorskip("distributed")
    workers_cwd = str(tmp_path_factory.mktemp("dask-workers-cwd"))
    driver_cwd = os.getcwd()
    os.chdir(workers_cwd)  # the worker processes start in the working directory of this process
    try:
        cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                           dashboard_address=None, env={"TPU_EMBED_THREADS": "1"})
    finally:
        os.chdir(driver_cwd)
    with cluster, distributed.Client(cluster.scheduler_address) as client:
        assert set(client.run(os.getcwd).values()) == {workers_cwd}
        cluster.workers_cwd = workers_cwd
        yield cluster


# ---------------------------------------------------------------- the matrix

@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPECS))
def test_direct_multi_processing(reference, tmp_path, name):
    _assert_identical(_run(name, str(tmp_path), ["--direct_num_workers=2",
                                                 "--direct_running_mode=multi_processing"]), reference[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPECS))
def test_portable_runner_external_worker_pool(reference, project_worker_pool, tmp_path, name):
    port, log = project_worker_pool
    _assert_identical(_run(name, str(tmp_path), _external_args(port)), reference[name])
    assert "Starting worker with command" in open(log).read()  # the pool's processes ran the job


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPECS))
def test_dask_local_cluster(reference, dask_cluster, tmp_path, name):
    args = ["--runner=dask", f"--dask_client_address={dask_cluster.scheduler_address}"]
    _assert_identical(_run(name, str(tmp_path), args), reference[name])


@pytest.mark.slow
def test_relative_paths_mean_the_drivers_files_on_dask_workers_elsewhere(dask_cluster, tmp_path, monkeypatch):
    """`tpu-embed run --spec spec.yaml --output out` from the driver's directory, the workers in another one: the
    paths are made absolute in the driver, so the artifact is the driver's ./out, byte for byte what the
    in-process runner writes, and nothing lands in the workers' directory."""
    from pipelines import cli
    from tests.reliability.artifacts import write_inputs
    write_inputs(str(tmp_path))  # spec.yaml reading in.csv, relative to the spec
    monkeypatch.chdir(tmp_path)
    assert os.getcwd() != dask_cluster.workers_cwd
    args = ["run", "--spec", "spec.yaml", "--steps-per-file", "10"]
    assert cli.main(args + ["--output", "ref"]) == 0
    assert cli.main(args + ["--output", "out", "--runner=dask",
                            f"--dask_client_address={dask_cluster.scheduler_address}"]) == 0
    _assert_identical(_files(str(tmp_path / "out")), _files(str(tmp_path / "ref")))
    assert os.listdir(dask_cluster.workers_cwd) == []


@pytest.mark.slow
def test_cli_dask_workers_starts_a_local_cluster(reference, tmp_path):
    from pipelines import cli
    out = str(tmp_path / "out")
    kw = KW["criteo"]
    assert cli.main(["run", "--spec", SPECS["criteo"], "--output", out, "--chunk-rows", str(kw["chunk_rows"]),
                     "--steps-per-file", str(kw["steps_per_file"]), "--runner", "dask", "--dask-workers", "2"]) == 0
    _assert_identical(_files(out), reference["criteo"])


def test_dask_args():
    full = runner.DASK_RUNNER
    assert runner.dask_args(["--runner=dask", "--dask_workers=3", "--x=1"]) == ([f"--runner={full}", "--x=1"], 3)
    assert runner.dask_args(["--runner", "DaskRunner", "--dask-workers", "2"]) == ([f"--runner={full}"], 2)
    assert runner.dask_args(["--runner=DirectRunner"]) == (["--runner=DirectRunner"], None)
    with pytest.raises(ValueError, match="needs --runner=dask"):
        runner._run(lambda p: None, ["--dask_workers=2"])


# ---------------------------------------------------------------- the native kernel on workers

@pytest.mark.slow
def test_numpy_fallback_warns_once_and_gives_the_same_bytes(reference, tmp_path):
    """TPU_EMBED_NATIVE=0: the CSR kernel is not loaded; one warning, naming the cost; identical bytes."""
    out = str(tmp_path / "out")
    kw = KW["criteo"]
    env = dict(os.environ, TPU_EMBED_NATIVE="0")
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "run", "--spec", SPECS["criteo"], "--output", out,
                        "--chunk-rows", str(kw["chunk_rows"]), "--steps-per-file", str(kw["steps_per_file"])],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if "native CSR kernel is not available" in line]
    assert len(warnings) == 1, r.stderr
    assert "TPU_EMBED_NATIVE=0" in warnings[0] and "5x slower" in warnings[0]
    _assert_identical(_files(out), reference["criteo"])


def test_native_warning_is_logged_once_per_process(monkeypatch, caplog):
    from pipelines.sharding import step_records
    from tpu_embed.sparsecore import csr
    monkeypatch.setattr(csr, "_csr_native", None)
    monkeypatch.setattr(step_records, "_native_checked", False)
    with caplog.at_level("WARNING", logger="tpu_embed.pipelines"):
        assert all(step_records.warn_if_no_native_kernel() for _ in range(3))
    assert len([r for r in caplog.records if "native CSR kernel" in r.getMessage()]) == 1


# ---------------------------------------------------------------- packaging for remote workers

@pytest.mark.slow
def test_wheel_in_a_fresh_venv_runs_the_external_workers(reference, tmp_path):
    """Build the wheel, install it in a new virtual environment, run the workers from there.

    * The wheel is built (`python -m build --wheel --no-isolation`, setuptools from the project venv)
      from a copy of the working tree without `.so` files, so the native kernel in it comes from
      setup.py's build, not from the in-place build of the editable install.
    * The fresh venv is made by the base interpreter of .venv (`venv --without-pip`); the wheel goes
      in with `pip --python <fresh> install --no-deps`.
    * Dependencies: installing the pinned dependencies (TensorFlow, Beam, TFT, ...) again
      is slow, so afterwards a `.pth` *line* appends .venv's site-packages to the fresh
      venv's sys.path. A path line does not run the `.pth` files in that directory, so the editable
      install's import hook (`__editable__.tpu_embed-0.1.0.pth`) is not installed and the source tree
      stays invisible: only third-party packages come from there, at the versions pyproject pins.
      What is tested is our wheel: its packages, the compiled kernel, and that workers need nothing else.
    * Everything in the fresh venv runs from a temporary cwd without PYTHONPATH; the test asserts that
      `tpu_embed`, `pipelines`, `profiles` and the kernel are imported from the fresh venv and that
      `native_available()` is True there.
    * The worker pool runs on the fresh venv's python with its bin first on PATH (the pool starts SDK
      workers as `python` from PATH); the job driver runs here, in the project venv.
    """
    pytest.importorskip("build")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".pytest_cache", ".hypothesis",
        "data", "benchmarks", ".ci"))
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
                       cwd=src, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheels = list(dist.glob("tpu_embed-*.whl"))
    assert len(wheels) == 1 and "linux" in wheels[0].name, wheels  # platform wheel: it carries the kernel

    venv = tmp_path / "fresh"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    fresh_py = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", fresh_py, "install", "-q", "--no-deps", "--no-index",
                    str(wheels[0])], check=True, timeout=300)
    site = subprocess.run([fresh_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    project_site = subprocess.run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "zz_project_dependencies.pth"), "w") as fh:
        fh.write(project_site + "\n")

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = _clean_env(str(venv / "bin"))
    probe = ("import json, sys, tpu_embed, pipelines, profiles; from tpu_embed.sparsecore import csr; "
             "print(json.dumps({'files': [tpu_embed.__file__, pipelines.__file__, profiles.__file__, "
             "csr._csr_native.__file__ if csr._csr_native else None], 'native': csr.native_available(), "
             "'path': sys.path}))")
    r = subprocess.run([fresh_py, "-c", probe], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["native"] is True, info
    for f in info["files"]:
        assert f is not None and f.startswith(str(venv)), info
    assert not any(p.rstrip("/") == ROOT for p in info["path"]), info["path"]

    with worker_pool(fresh_py, str(cwd), env) as (port, log):
        _assert_identical(_run("movielens", str(tmp_path / "out"), _external_args(port)), reference["movielens"])
        assert "Starting worker with command" in open(log).read()


def test_direct_runner_never_tries_prism(tmp_path, monkeypatch):
    """Beam's DirectRunner tries the Prism runner first (downloading its binary) for any pipeline Prism
    supports; the jobs run on the FnApiRunner in process instead, with or without worker processes."""
    from apache_beam.runners.portability import prism_runner
    tried = []
    monkeypatch.setattr(prism_runner.PrismRunner, "run_pipeline", lambda *a, **k: tried.append(a) or 1 / 0)
    spec = load_spec(SPECS["criteo"])
    runner.run_vocab(JobConfig(spec=spec, output=str(tmp_path / "a")))
    assert tried == []
    opts = runner.pipeline_options(["--direct_num_workers=2"])
    local = runner.local_runner(opts)
    assert type(local).__name__ == "FnApiRunner"
    assert opts.get_all_options()["direct_running_mode"] == "multi_processing"



_PERIODS = []  # what the DoFn below saw (a module global: the DoFn is pickled by reference)


class _RecordSamplingPeriod(beam.DoFn):
    def process(self, x):
        from apache_beam.runners.worker import statesampler
        _PERIODS.append(statesampler.get_current_tracker().sampling_period_ms)
        yield x


def test_in_process_bundles_sample_their_state_every_20_ms_during_the_run_only():
    """The end of every bundle joins Beam's state-sampling thread, which sleeps up to its period between
    samples (200 ms by default): the jobs' in-process runs use `STATE_SAMPLING_MS` (`runner._run`)."""
    from apache_beam.runners.worker import statesampler
    _PERIODS.clear()
    runner._run(lambda p: p | beam.Create([1]) | beam.ParDo(_RecordSamplingPeriod()), [])
    assert _PERIODS == [beam_overheads.STATE_SAMPLING_MS] == [20]
    assert statesampler.StateSampler.__init__.__defaults__ == (statesampler.DEFAULT_SAMPLING_PERIOD_MS,) == (200,)


_INTERVALS = []


class _RecordSwitchInterval(beam.DoFn):
    def process(self, x):
        import sys
        _INTERVALS.append(sys.getswitchinterval())
        yield x


def test_in_process_runs_switch_the_gil_every_millisecond_during_the_run_only():
    """`runner._run`'s in-process runs give the GIL up after `GIL_SWITCH_INTERVAL_S` (1 ms), Python's interval
    before and after."""
    import sys
    before = sys.getswitchinterval()
    _INTERVALS.clear()
    runner._run(lambda p: p | beam.Create([1, 2]) | beam.ParDo(_RecordSwitchInterval()), [])
    assert _INTERVALS == [runner.GIL_SWITCH_INTERVAL_S] * 2 and runner.GIL_SWITCH_INTERVAL_S == 0.001
    assert sys.getswitchinterval() == before
    with pytest.raises(Exception, match="boom"):
        runner._run(lambda p: p | beam.Create([1]) | beam.Map(_boom), [])
    assert sys.getswitchinterval() == before


def _boom(x):
    raise ValueError("boom")


class _RecordPickleCompression(beam.DoFn):
    def process(self, x):
        from apache_beam.internal import cloudpickle_pickler
        _INTERVALS.append(type(cloudpickle_pickler.bz2).__name__)
        yield x


def test_in_process_runs_compress_beams_pickles_lightly_during_the_run_only():
    """`runner._run`'s in-process runs have Beam's pickles compressed by zlib (`beam_overheads.
    pickles_compressed_lightly`); bzip2 again after the run, also after a failed one."""
    import bz2

    from apache_beam.internal import cloudpickle_pickler
    _INTERVALS.clear()
    runner._run(lambda p: p | beam.Create([1, 2]) | beam.ParDo(_RecordPickleCompression()), [])
    assert _INTERVALS == ["_LightCompression"] * 2
    assert cloudpickle_pickler.bz2 is bz2
    with pytest.raises(Exception, match="boom"):
        runner._run(lambda p: p | beam.Create([1]) | beam.Map(_boom), [])
    assert cloudpickle_pickler.bz2 is bz2


def test_options_are_parsed_once_per_flags_and_as_beam_parses_them():
    """`runner.option_values` (cached per flags and options classes) is Beam's `get_all_options` of
    `pipeline_options`, whose runner is pinned locally, also after a runner's module defines more options;
    `pipeline_options` gives a new object each time."""
    import apache_beam.runners.dask.dask_runner  # noqa: F401 - its DaskOptions: flags Beam's parse then knows
    for flags in ([], ["--direct_num_workers=2"], ["--runner=DirectRunner", "--direct_running_mode=multi_threading"],
                  ["--runner=DataflowRunner", "--project=p"], ["--experiments=x", "--experiments=y"]):
        opts = runner.pipeline_options(flags)
        assert opts is not runner.pipeline_options(flags)
        assert dict(runner.option_values(flags)) == opts.get_all_options(drop_default=False)
        assert runner.option_values(flags) is runner.option_values(list(flags))
        with pytest.raises(TypeError):
            runner.option_values(flags)["runner"] = "x"  # type: ignore[index]
    assert runner.option_values([])["runner"] == "DirectRunner"
    assert runner.option_values([])["direct_running_mode"] == "in_memory"
    assert runner.option_values(["--direct_num_workers=2"])["direct_running_mode"] == "multi_processing"


def test_option_values_know_the_options_classes_defined_after_a_first_parse():
    from apache_beam.options.pipeline_options import PipelineOptions
    before = runner.option_values(["--tpu_embed_test_option=7"])
    assert "tpu_embed_test_option" not in before

    class _LaterOptions(PipelineOptions):  # as a runner's module imported later defines its own
        @classmethod
        def _add_argparse_args(cls, parser):
            parser.add_argument("--tpu_embed_test_option", type=int, default=0)

    assert runner.option_values(["--tpu_embed_test_option=7"])["tpu_embed_test_option"] == 7
