"""--strategy -> a tf.distribute strategy: TPU, mirrored (GPUs or logical CPUs), multi-worker, one device."""

import json
import os

import tensorflow as tf
from absl import logging
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context

from bert_tf.runtime.io_utils import UsageError

STRATEGIES = ("tpu", "mirrored", "multi_worker_mirrored", "one_device", "default")
# How long a silent worker (dead, frozen or cut off) may keep the others waiting by default. TF's own
# 10 s turns a network hiccup or a long pause of a busy VM into a lost run.
DEFAULT_LOST_WORKER_TIMEOUT = 60


def configure_logical_cpus(num_replicas):
    """Splits the CPU into `num_replicas` logical devices; must run before TensorFlow initializes devices."""
    if num_replicas <= 1:
        return
    cpus = tf.config.list_physical_devices("CPU")
    existing = tf.config.get_logical_device_configuration(cpus[0])
    if existing is not None and len(existing) == num_replicas:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(num_replicas)]
        )
    except RuntimeError as e:
        raise RuntimeError(
            f"cannot split the CPU into {num_replicas} logical devices: TensorFlow has already "
            "initialized its devices. Create the strategy before running any TensorFlow op."
        ) from e


def is_remote_tpu(tpu):
    """Whether --tpu names a TPU other than the one attached to this VM (which reads local files)."""
    return bool(tpu) and tpu != "local"


def check_tpu_paths(tpu, **paths):
    """A remote TPU reads and writes through its own hosts, so every path must be gs://; else UsageError."""
    if not is_remote_tpu(tpu):
        return
    for flag, value in paths.items():
        for path in [value] if isinstance(value, str) else list(value or []):
            for part in path.split(","):
                part = part.strip()
                if part and not part.startswith("gs://"):
                    raise UsageError(
                        f"--{flag}={part} is a local path, but --tpu={tpu} is a remote TPU whose hosts "
                        "cannot see this machine's disk: use a gs:// path (TPUs read and write Cloud "
                        "Storage), or run on the TPU VM itself with --tpu= (empty)."
                    )


def _tpu_strategy(tpu):
    """Resolves, connects to and initializes the TPU system, then returns a TPUStrategy."""
    # An empty --tpu means the TPU attached to this VM, which the resolver calls "local" (an empty
    # name would make it look the TPU up through the Cloud TPU API instead). Connecting is still
    # how TF2 finds the cores.
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "local")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    logging.info("TPU devices: %s", tf.config.list_logical_devices("TPU"))
    return tf.distribute.TPUStrategy(resolver)


def configure_lost_worker_timeout(cluster_spec, seconds):
    """Makes the cluster's coordination service declare a task lost after `seconds` without its
    heartbeat; every other task's collectives then fail (UnavailableError) instead of waiting.

    It must run before MultiWorkerMirroredStrategy is made, which otherwise configures the service
    with TensorFlow's defaults. The settings are TF's internal API (ParameterServerStrategy sets
    them the same way): the public CommunicationOptions(timeout_seconds) bounds every collective
    instead, so a slow checkpoint save on the chief would count as a lost worker.
    """
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
        for job in ("chief", "worker")
        if job in cluster_spec.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=int(seconds * 1000),
        # At exit, a survivor waits this long for the lost task at the shutdown barrier.
        shutdown_barrier_timeout_in_ms=int(seconds * 1000),
    )


def _multi_worker_strategy(lost_worker_timeout):
    """MultiWorkerMirroredStrategy over TF_CONFIG's cluster, which loses a silent worker after
    `lost_worker_timeout` seconds."""
    if "TF_CONFIG" in os.environ:
        try:
            json.loads(os.environ["TF_CONFIG"])
        except json.JSONDecodeError as e:
            raise UsageError(f"TF_CONFIG is not valid JSON: {e}") from e
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster_spec = resolver.cluster_spec()
    if cluster_spec.jobs and resolver.task_type in ("chief", "worker"):
        configure_lost_worker_timeout(cluster_spec, lost_worker_timeout)
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)


def is_multi_worker(strategy):
    """Whether `strategy` spans several processes that must agree (a MultiWorkerMirroredStrategy
    over a cluster of more than one task)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or isinstance(strategy, tf.distribute.TPUStrategy):
        return False
    return sum(len(tasks) for tasks in resolver.cluster_spec().as_dict().values()) > 1


def get_strategy(name, tpu="", num_cpu_replicas=0, lost_worker_timeout=DEFAULT_LOST_WORKER_TIMEOUT):
    """The strategy for --strategy; `num_cpu_replicas` > 1 mirrors over logical CPUs when no GPU
    exists; under multi_worker_mirrored a worker silent for `lost_worker_timeout` seconds is lost."""
    if name not in STRATEGIES:
        raise UsageError(f"--strategy={name} is not one of {', '.join(STRATEGIES)}")
    if name == "tpu":
        return _tpu_strategy(tpu)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        device = "/gpu:0" if tf.config.list_physical_devices("GPU") else "/cpu:0"
        return tf.distribute.OneDeviceStrategy(device)
    if name == "mirrored":
        if num_cpu_replicas > 1 and not tf.config.list_physical_devices("GPU"):
            configure_logical_cpus(num_cpu_replicas)
            devices = [d.name for d in tf.config.list_logical_devices("CPU")][:num_cpu_replicas]
            return tf.distribute.MirroredStrategy(
                devices,
                cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=devices[0]),
            )
        return tf.distribute.MirroredStrategy()
    # multi_worker_mirrored: the cluster comes from TF_CONFIG.
    if num_cpu_replicas > 1:
        logging.warning("--num_cpu_replicas applies to --strategy=mirrored only; ignored")
    return _multi_worker_strategy(lost_worker_timeout)


def make_strategy(
    name,
    tpu="",
    num_cpu_replicas=0,
    batch_sizes=None,
    lost_worker_timeout=DEFAULT_LOST_WORKER_TIMEOUT,
):
    """The strategy `name` (see get_strategy), logged; each global batch size of `batch_sizes`
    ({flag name: size}) must split evenly over its replicas.

    Call it before any other TensorFlow op: splitting the CPU into logical devices must come first.
    """
    strategy = get_strategy(
        name, tpu=tpu, num_cpu_replicas=num_cpu_replicas, lost_worker_timeout=lost_worker_timeout
    )
    replicas = strategy.num_replicas_in_sync
    logging.info("strategy %s with %d replicas", type(strategy).__name__, replicas)
    for flag, size in (batch_sizes or {}).items():
        if size % replicas:
            raise UsageError(f"--{flag}={size} is not divisible by the {replicas} replicas")
    return strategy


def is_chief_task():
    """Whether this process is the chief by TF_CONFIG alone (before any strategy exists): no
    TF_CONFIG, its `chief` task, or worker 0 of a cluster without one."""
    try:
        config = json.loads(os.environ.get("TF_CONFIG") or "{}")
        task = config.get("task") or {}
        task_type, task_id = task.get("type"), int(task.get("index", 0))
        has_chief = "chief" in (config.get("cluster") or {})
    except (ValueError, TypeError, AttributeError):
        return False  # make_strategy refuses it with a usage error; nothing is removed until then
    return task_type in (None, "chief") or (
        task_type == "worker" and task_id == 0 and not has_chief
    )


def is_chief(strategy):
    """Whether this task writes checkpoints, summaries and results (worker 0, or the only task)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or isinstance(strategy, tf.distribute.TPUStrategy):
        return True
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type is None:
        return True
    return task_type == "chief" or (
        task_type == "worker" and task_id == 0 and "chief" not in resolver.cluster_spec().as_dict()
    )
